"""The installed commands behave like commands: ``--help`` and ``--version`` without any
setting, ``--check`` that reaches Redis and imports the agents, one line per problem (naming
the variable, never telling a pip user to run ``make``), and a taken port is one line naming
PORT.

Each command runs as a real subprocess (the console script of this environment), with only
PATH, HOME and the variables under test, against the session's private Redis.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_core import __version__
from tests.redis_server import free_port

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["agent-worker", "agent-web", "playground", "agent-audit"]
SLACK = {"SLACK_BOT_TOKEN": "xoxb-test-token", "SLACK_SIGNING_SECRET": "s3cret-signing"}


def command_line(command: str) -> list[str]:
    """The console script; ``agent-audit`` as ``python -m agent_audit`` in an environment
    installed before it existed (its script appears at the next ``make install``)."""
    script = BIN / command
    if script.exists() or command != "agent-audit":
        return [str(script)]
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from agent_audit import main; main()"
    return [sys.executable, "-c", code]


def run(
    command: str,
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 30,
) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        [*command_line(command), *args],
        env={**base, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something else listens on, on every address."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        yield listener.getsockname()[1]


@pytest.mark.parametrize("command", COMMANDS)
def test_version_and_help_need_no_settings(command: str, tmp_path: Path) -> None:
    version = run(command, "--version", cwd=tmp_path)
    assert (version.returncode, version.stdout, version.stderr) == (
        0,
        f"{command} {__version__}\n",
        "",
    )
    helped = run(command, "--help", cwd=tmp_path)
    assert helped.returncode == 0 and helped.stderr == ""
    assert helped.stdout.startswith(f"usage: {command} ")
    assert "--version" in helped.stdout and "REDIS_URL" in helped.stdout
    assert ("--check" in helped.stdout) == (command in ("agent-worker", "agent-web"))


def test_help_lists_each_setting_with_what_it_is_for() -> None:
    out = run("agent-web", "--help").stdout
    for name in ("REDIS_URL", "DECISION_REPLICAS", "SLACK_BOT_TOKEN", "PORT", "APPROVERS"):
        assert f"\n  {name}\n" in out
    assert "OAuth & Permissions" in out  # where to get the bot token
    assert "SLACK_BOT_TOKEN" not in run("agent-worker", "--help").stdout


@pytest.mark.parametrize("command", ["agent-worker", "agent-web"])
def test_check_passes_on_a_valid_deployment(command: str, redis_url: str) -> None:
    env = {"REDIS_URL": redis_url, "OPENAI_API_KEY": "sk-test", "KEY_PREFIX": "chk", **SLACK}
    done = run(command, "--check", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"{command}: ok: settings valid, Redis reached at {redis_url} (KEY_PREFIX chk), "
        "agents imported: ops\n"
    )


@pytest.mark.parametrize("command", ["agent-worker", "agent-web"])
def test_check_names_what_is_wrong_one_line_each(command: str) -> None:
    # Settings first: every invalid one at once, each naming its variable.
    env = {"REDIS_URL": "http://nope", "SHARDS": "0", "OPENAI_API_KEY": "k", **SLACK}
    done = run(command, "--check", env=env)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert [line.split(" is invalid")[0] for line in lines] == [
        "config error: REDIS_URL",
        "config error: SHARDS",
    ]
    # An agent that cannot be imported.
    env = {
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "AGENT": "no_such_module:agent",
        "OPENAI_API_KEY": "k",
        **SLACK,
    }
    [line] = run(command, "--check", env=env).stderr.splitlines()
    assert line.startswith("config error: AGENT is invalid: no module named 'no_such_module'")
    # A Redis that does not answer (its password never shown).
    port = free_port()
    env = {"REDIS_URL": f"redis://:pw-secret@127.0.0.1:{port}/0", "OPENAI_API_KEY": "k", **SLACK}
    done = run(command, "--check", env=env)
    assert (done.returncode, done.stderr) == (
        2,
        f"config error: REDIS_URL: cannot reach Redis at redis://:***@127.0.0.1:{port}/0 "
        "(ConnectionError)\n",
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_no_error_tells_a_pip_user_to_run_make(command: str, tmp_path: Path) -> None:
    args = ["verify"] if command == "agent-audit" else []  # its one required argument
    done = run(command, *args, cwd=tmp_path)  # nothing set at all
    assert done.returncode == 2
    assert "REDIS_URL is not set" in done.stderr
    assert "make" not in done.stderr and "Traceback" not in done.stderr


def test_web_on_a_taken_port_is_one_line_naming_port(redis_url: str, taken_port: int) -> None:
    env = {
        "REDIS_URL": redis_url,
        "PORT": str(taken_port),
        # Slack unreachable: web warns and goes on, as it does when Slack is down.
        "SLACK_API_URL": f"http://127.0.0.1:{free_port()}/api/",
        **SLACK,
    }
    done = run("agent-web", env=env)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"config error: PORT is taken: another process listens on 0.0.0.0:{taken_port}; "
        "set PORT to a free port"
    )


def test_playground_on_a_taken_bot_port_is_one_line_naming_port(
    redis_url: str, taken_port: int, tmp_path: Path
) -> None:
    env = {"REDIS_URL": redis_url, "PORT": str(taken_port), "PLAYGROUND_PORT": str(free_port())}
    done = run("playground", env=env, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (
        2,
        f"config error: PORT {taken_port} is not free (Address already in use); set PORT "
        "(the bot's port, which the playground starts the bot on)\n",
    )
