"""Configuration: every missing or invalid setting stops the process, one line each naming it.

The worker tests run ``python -m agent_core.worker`` for real, with nothing in its environment
but ``PATH``, ``HOME`` and the variables under test, all at once so the module stays fast.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent_core import Agent, ConfigError, GatewayError, Settings
from agent_core.agent import load_agent
from agent_core.settings import DEFAULT_AGENT
from tests.redis_server import ExternalRedis, RedisServer

REPO = Path(__file__).resolve().parents[2]
SECRET = "sk-supersecret-123"
PASSWORD = "pa55-w0rd-xyz"
ALIASES = {
    str(f.validation_alias).upper()
    for f in Settings.model_fields.values()
    if f.validation_alias is not None
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No setting leaks in from the environment the tests run in (``make test`` sets some)."""
    for name in list(os.environ):
        if name.upper() in ALIASES:
            monkeypatch.delenv(name)


# --------------------------------------------------------------------------- Settings.from_env
def test_aliases_cover_the_documented_variables() -> None:
    documented = {
        "REDIS_URL",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "OPENAI_MODEL",
        "AGENT",
        "APPROVAL_TIMEOUT",
    }
    assert documented <= ALIASES


def test_redis_url_missing() -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env()
    assert str(info.value) == (
        "REDIS_URL is not set: the Redis every process shares, e.g. redis://127.0.0.1:6379/0 "
        "(or rediss://, unix://)"
    )


def test_every_problem_at_once_one_line_each(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPROVAL_TIMEOUT", SECRET)
    monkeypatch.setenv("WORKER_LEASE", "0.1")
    monkeypatch.setenv("OPENAI_API_KEY", "")  # empty counts as not set
    with pytest.raises(ConfigError) as info:
        Settings.from_env(require_openai=True)
    lines = str(info.value).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "REDIS_URL is not set",
        "OPENAI_API_KEY is not set",
        "APPROVAL_TIMEOUT is invalid",
        "WORKER_LEASE is invalid",
    ]
    assert "platform.openai.com/api-keys" in lines[1] and "Ollama" in lines[1]
    assert "— the seconds a worker's lease on a run lasts, at least 0.5" in lines[3]
    assert SECRET not in str(info.value)


def test_the_worker_requires_the_api_key_even_as_an_empty_override() -> None:
    with pytest.raises(ConfigError, match=r"^OPENAI_API_KEY is not set: "):
        Settings.from_env(require_openai=True, REDIS_URL="redis://h:6379/0", OPENAI_API_KEY="")
    s = Settings.from_env(require_openai=True, REDIS_URL="redis://h:6379/0", OPENAI_API_KEY="k")
    assert isinstance(s, Settings) and s.openai_api_key is not None


def test_config_error_is_a_gateway_error() -> None:
    assert issubclass(ConfigError, GatewayError)


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    s = Settings.from_env()
    assert s.redis_url == "redis://127.0.0.1:6379/0"
    assert s.approval_timeout == 300.0
    assert s.agent == DEFAULT_AGENT
    assert s.openai_api_key is None
    assert s.openai_base_url is None


def test_values_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "rediss://cache.internal:6380/2")
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1")
    monkeypatch.setenv("OPENAI_MODEL", "llama3.1")
    monkeypatch.setenv("AGENT", "tests.agents:ops")
    monkeypatch.setenv("APPROVAL_TIMEOUT", "12.5")
    s = Settings.from_env()
    assert s.redis_url == "rediss://cache.internal:6380/2"
    assert s.openai_api_key is not None
    assert s.openai_api_key.get_secret_value() == SECRET
    assert s.openai_base_url == "http://127.0.0.1:11434/v1"
    assert s.openai_model == "llama3.1"
    assert s.agent == "tests.agents:ops"
    assert s.approval_timeout == 12.5


def test_overrides_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://env:6379/0")
    s = Settings.from_env(REDIS_URL="redis://override:6379/0", APPROVAL_TIMEOUT=7)
    assert s.redis_url == "redis://override:6379/0"
    assert s.approval_timeout == 7.0


def test_the_api_key_never_shows_in_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    s = Settings.from_env()
    assert SECRET not in repr(s)
    assert SECRET not in str(s)
    assert SECRET not in s.model_dump_json()


@pytest.mark.parametrize("value", ["abc", "-1", "-37.5", "0", "nan", "inf", SECRET])
def test_invalid_approval_timeout_names_the_variable(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("APPROVAL_TIMEOUT", value)
    with pytest.raises(ConfigError) as info:
        Settings.from_env()
    message = str(info.value)
    assert message.startswith("APPROVAL_TIMEOUT is invalid"), message
    assert "\n" not in message


@pytest.mark.parametrize("value", ["abc", "-1", "-37.5", SECRET])
def test_invalid_approval_timeout_is_not_echoed(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("APPROVAL_TIMEOUT", value)
    with pytest.raises(ConfigError) as info:
        Settings.from_env()
    assert value not in str(info.value)


@pytest.mark.parametrize(
    "url",
    [f"http://admin:{PASSWORD}@127.0.0.1:6379/0", f"{PASSWORD}", f"127.0.0.1:6379?pw={PASSWORD}"],
)
def test_invalid_redis_url_names_the_variable_not_the_password(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", url)
    with pytest.raises(ConfigError) as info:
        Settings.from_env()
    message = str(info.value)
    assert message.startswith("REDIS_URL is invalid"), message
    assert PASSWORD not in message


@pytest.mark.parametrize("value", ["not a path", "no_colon", ":attr", "pkg.mod:"])
def test_malformed_agent_path_names_agent(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("AGENT", value)
    with pytest.raises(ConfigError) as info:
        Settings.from_env()
    assert str(info.value).startswith("AGENT is invalid"), str(info.value)


def test_unimportable_agent_names_agent() -> None:
    with pytest.raises(ConfigError) as info:
        load_agent("nope.mod:x")
    message = str(info.value)
    assert message.startswith("AGENT is invalid: no module named 'nope.mod' (AGENT=nope.mod:x)")
    assert "sys.path" in message and "PYTHONPATH" in message
    assert "\n" not in message


def test_an_agent_module_that_fails_to_import_names_agent_and_the_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_agents.py").write_text("import no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as info:
        load_agent("broken_agents:agent")
    message = str(info.value)
    assert message.startswith(
        "AGENT is invalid: importing module 'broken_agents' failed (ModuleNotFoundError: "
        "No module named 'no_such_dependency')"
    ), message
    assert "python -c 'import broken_agents'" in message
    assert "\n" not in message


def test_an_agent_module_in_the_working_directory_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``make run`` relies on: a module next to where the process starts."""
    (tmp_path / "cwd_agents.py").write_text(
        "from agent_core import Agent\nagent = Agent(name='cwd', instructions='hi')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_agent("cwd_agents:agent").name == "cwd"


def test_missing_agent_attribute_names_agent() -> None:
    with pytest.raises(ConfigError, match=r"^AGENT is invalid.*no_such_agent"):
        load_agent("agent_core.examples.ops:no_such_agent")


def test_agent_path_to_something_that_is_not_an_agent() -> None:
    with pytest.raises(ConfigError, match=r"^AGENT is invalid.*not an Agent"):
        load_agent("agent_core.settings:DEFAULT_AGENT")


def test_the_default_agent_loads() -> None:
    assert isinstance(load_agent(DEFAULT_AGENT), Agent)


@pytest.mark.parametrize("key", [None, ""])
def test_require_openai_names_the_key(key: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    if key is not None:
        monkeypatch.setenv("OPENAI_API_KEY", key)
    s = Settings.from_env()
    with pytest.raises(ConfigError, match=r"^OPENAI_API_KEY is not set"):
        s.require_openai()


def test_require_openai_accepts_any_non_empty_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("OPENAI_API_KEY", "ollama")
    Settings.from_env().require_openai()


# --------------------------------------------------------------------------- the worker process
@dataclass(frozen=True)
class Exit:
    returncode: int
    stdout: str
    stderr: str


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture(scope="module")
def worker_exits(redis_server: RedisServer | ExternalRedis) -> Iterator[dict[str, Exit]]:
    """Start every misconfigured worker at once; their exits, by case name."""
    redis_url = redis_server.url
    cases: dict[str, dict[str, str]] = {
        "nothing_set": {},
        "openai_key_unset": {"REDIS_URL": redis_url},
        # The two invalid settings run with a real-looking key that must never be printed.
        "approval_timeout_abc": {
            "REDIS_URL": redis_url,
            "OPENAI_API_KEY": SECRET,
            "APPROVAL_TIMEOUT": "abc",
        },
        "event_loop_tokio": {
            "REDIS_URL": redis_url,
            "OPENAI_API_KEY": SECRET,
            "EVENT_LOOP": "tokio",
        },
        "agent_unimportable": {
            "REDIS_URL": redis_url,
            "OPENAI_API_KEY": SECRET,
            "AGENT": "nope.mod:x",
        },
        # A module in the working directory is found, as with `make run` from the repo root.
        "agent_in_cwd": {
            "REDIS_URL": redis_url,
            "OPENAI_API_KEY": SECRET,
            "AGENT": "tests.agents:not_an_agent_attribute",
        },
        "redis_unreachable": {
            "REDIS_URL": f"redis://admin:{PASSWORD}@127.0.0.1:{closed_port()}/0",
            "OPENAI_API_KEY": "sk-test",
        },
    }
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for name, extra in cases.items():
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home())}
            env.update(extra)
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "agent_core.worker"],
                env=env,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        exits: dict[str, Exit] = {}
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=30)
            exits[name] = Exit(proc.returncode, out, err)
        yield exits
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def one_line(result: Exit) -> str:
    assert result.returncode == 2, result
    assert result.stdout == "", result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("case", "variable", "expected"),
    [
        ("openai_key_unset", "OPENAI_API_KEY", "OPENAI_API_KEY is not set"),
        ("approval_timeout_abc", "APPROVAL_TIMEOUT", "APPROVAL_TIMEOUT is invalid"),
        ("event_loop_tokio", "EVENT_LOOP", "EVENT_LOOP is invalid"),
        ("agent_unimportable", "AGENT", "AGENT is invalid: no module named 'nope.mod'"),
        ("agent_in_cwd", "AGENT", "has no attribute 'not_an_agent_attribute'"),
        ("redis_unreachable", "REDIS_URL", "REDIS_URL"),
    ],
)
def test_worker_stops_with_one_line_naming_the_variable(
    worker_exits: dict[str, Exit], case: str, variable: str, expected: str
) -> None:
    line = one_line(worker_exits[case])
    assert variable in line
    assert expected in line


def test_worker_reports_every_missing_variable_at_once(worker_exits: dict[str, Exit]) -> None:
    result = worker_exits["nothing_set"]
    assert result.returncode == 2, result
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert [line.split(":")[:2] for line in lines] == [
        ["config error", " REDIS_URL is not set"],
        ["config error", " OPENAI_API_KEY is not set"],
    ]


def test_worker_does_not_echo_an_invalid_value(worker_exits: dict[str, Exit]) -> None:
    line = one_line(worker_exits["approval_timeout_abc"])
    assert "abc" not in line


@pytest.mark.parametrize("case", ["approval_timeout_abc", "agent_unimportable"])
def test_worker_never_prints_the_api_key(worker_exits: dict[str, Exit], case: str) -> None:
    result = worker_exits[case]
    one_line(result)
    assert SECRET not in result.stdout
    assert SECRET not in result.stderr


def test_worker_never_prints_the_redis_password(worker_exits: dict[str, Exit]) -> None:
    result = worker_exits["redis_unreachable"]
    line = one_line(result)
    assert "REDIS_URL" in line
    assert PASSWORD not in result.stdout
    assert PASSWORD not in result.stderr
