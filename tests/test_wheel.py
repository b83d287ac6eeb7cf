"""The distribution, as a new user gets it: ``python -m build`` makes an sdist and a wheel
(from the sdist), and the wheel, installed with pip into an empty venv, works from a directory
that is not this repository.

Checked there: the public API imports without a web server or prometheus_client, agent_mcp
says which extra it needs, every command answers ``--version`` and ``--help``, a typed user
file passes ``mypy --strict`` (``py.typed``), and the ``playground`` command serves its page
and continues a run from a thread reply (its manifest and static files are package data).

Slow (a build and a pip install, from pip's cache): one module-scoped venv for every check.
The venv gets the wheel and its dependencies only; mypy is this environment's, pointed at
the venv's interpreter.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from redis.asyncio import Redis

from agent_core import Keys, __version__, presence
from playground import people
from playground.guard import TOKEN_HEADER
from playground.launcher import KEY_PREFIX
from tests.redis_server import RedisServer, free_port

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["agent-audit", "agent-web", "agent-worker", "playground"]
READY = re.compile(r"open (http://127\.0\.0\.1:\d+) in your browser")
TOKEN_META = re.compile(r'<meta name="playground-token" content="([^"]+)">')

# A user's module, typed as a user would type it: mypy --strict must pass on it.
TYPED_USER = '''
"""An agent with a tool, and a program that starts a run through the gateway."""

import asyncio

from agent_core import Agent, Gateway, RunStatus, Settings, tool


@tool(requires_approval=True)
async def delete_user(user_id: str) -> str:
    """Delete a user account."""
    return f"deleted {user_id}"


agent = Agent(name="ops", instructions="You run operations.", tools=[delete_user])


async def start(task: str) -> RunStatus:
    gw = await Gateway.from_settings(Settings.from_env(), agent_name=agent.name)
    try:
        run = await gw.start_run(task, requested_by="U1")
        return run.status
    finally:
        await gw.aclose()


# Types are read, not guessed: without them this ignore would be unused (an error).
wrong: int = agent.name  # type: ignore[assignment]

if __name__ == "__main__":
    print(asyncio.run(start("look up user 42")))
'''


@dataclass(frozen=True)
class Installed:
    venv: Path
    workdir: Path  # an empty directory outside the repository
    wheel: Path
    sdist: Path
    seconds: float

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)

    def env(self, **extra: str) -> dict[str, str]:
        # Nothing of this repository: no PYTHONPATH, and the venv first on PATH.
        return {
            "PATH": f"{self.venv / 'bin'}:{os.environ.get('PATH', '')}",
            "HOME": os.environ.get("HOME", "/tmp"),
            **extra,
        }

    def run(self, *cmd: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            cmd,
            cwd=self.workdir,
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def _run(cmd: list[str], cwd: Path, timeout: float) -> None:
    # Without PYTHONPATH: with this checkout on it, pip would take the egg-info that the build
    # leaves here for the installed package ("already satisfied") and install nothing.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd[:4]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    started = time.monotonic()
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], base, 180)
    [wheel] = dist.glob("*.whl")
    [sdist] = dist.glob("*.tar.gz")
    venv = base / "venv"
    # An empty venv (not even pip: this environment's pip installs into it, with --python),
    # and the wheel with every dependency that pip resolves for it. Not byte-compiled: the
    # checks import a small part of it (compiling all of it took most of the install).
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base, 60)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
    _run([*pip, "install", "-q", "--no-compile", str(wheel)], base, 240)
    workdir = base / "elsewhere"
    workdir.mkdir()
    return Installed(venv, workdir, wheel, sdist, time.monotonic() - started)


def test_the_distribution_holds_what_users_need(installed: Installed) -> None:
    assert installed.wheel.name == f"slack_approval_gateway-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(installed.wheel) as whl:
        names = set(whl.namelist())
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = whl.read(meta_name).decode()
    for package in ("agent_core", "agent_audit", "agent_mcp", "bot", "playground"):
        assert f"{package}/py.typed" in names
    assert {"bot/manifest.yml", "playground/static/index.html", "playground/static/app.js"} <= names
    # The one fake Slack Web API ships (the playground serves it); the tests' doubles do not.
    assert {"playground/slack_api.py", "playground/state.py", "playground/workspace.py"} <= names
    assert not any(n.startswith(("tests/", "bot/testing")) for n in names)
    # Every Lua script and include (read with importlib.resources) is package data.
    lua = {str(p.relative_to(ROOT)) for p in ROOT.glob("*/lua/**/*.lua")}
    assert {"agent_core/lua/include/lease.lua", "bot/lua/lock_and_read.lua"} <= lua <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert f"Version: {__version__}\n" in meta and "License-Expression: MIT\n" in meta
    assert "Provides-Extra: mcp\n" in meta and 'Requires-Dist: mcp>=2.3; extra == "mcp"' in meta
    assert "Description-Content-Type: text/markdown" in meta
    with tarfile.open(installed.sdist) as sdist:
        members = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
    assert {
        "LICENSE",
        "README.md",
        "CHANGELOG.md",
        "pyproject.toml",
        "bot/manifest.yml",
        "slack/manifest.yml",
        *lua,
    } <= members
    assert not any(n.startswith(("tests/", "bot/testing")) for n in members)
    print(f"\nbuild + venv + pip install: {installed.seconds:.1f} s")


def test_the_public_api_imports_without_a_web_server(installed: Installed) -> None:
    code = textwrap.dedent(
        """
        import sys
        import agent_core
        from agent_core import Agent, Gateway, Settings, tool, __version__
        heavy = sorted(m for m in sys.modules if m.startswith(("aiohttp.web", "prometheus_client", "mcp", "slack_bolt")))
        print(__version__, agent_core.__file__, heavy)
        try:
            import agent_mcp
        except ModuleNotFoundError as exc:
            print(exc)
        """
    )
    done = installed.run(installed.bin("python"), "-c", code)
    assert done.returncode == 0, done.stderr
    first, mcp_error = done.stdout.splitlines()
    version, where, heavy = first.split(" ", 2)
    assert version == __version__
    assert where.startswith(str(installed.venv))  # the installed copy, not this repository's
    assert heavy == "[]"
    assert mcp_error == "agent_mcp needs the mcp extra: pip install 'slack-approval-gateway[mcp]'"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_answers_version_and_help(installed: Installed, command: str) -> None:
    version = installed.run(installed.bin(command), "--version")
    assert (version.returncode, version.stdout) == (0, f"{command} {__version__}\n")
    helped = installed.run(installed.bin(command), "--help")
    assert helped.returncode == 0 and helped.stdout.startswith(f"usage: {command}")
    assert "REDIS_URL" in helped.stdout


def test_a_typed_user_file_passes_mypy_strict(installed: Installed) -> None:
    (installed.workdir / "my_agents.py").write_text(TYPED_USER)
    # This environment's mypy, reading the packages installed in the venv (not a second
    # copy of mypy installed there): without their py.typed it would find them untyped.
    done = installed.run(
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--no-incremental",
        "--python-executable",
        installed.bin("python"),
        "my_agents.py",
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("Success: no issues found in 1 source file")


async def _playground_thread_reply(url: str, token: str) -> None:
    """``/agent look up user 43``, then ``look up user 44`` replied in the run's thread: the
    bot continues the run there (only if the playground delivers the thread's message event,
    which it does for the events its packaged manifest subscribes to)."""
    who = people.REQUESTER.id
    async with aiohttp.ClientSession(headers={TOKEN_HEADER: token}) as http:

        async def get(path: str, **params: str) -> Any:
            async with http.get(url + path, params=params) as r:
                assert r.status == 200, await r.text()
                return await r.json()

        async def send(text: str, thread_ts: str | None = None) -> None:
            body = {"as": who, "text": text, **({"thread_ts": thread_ts} if thread_ts else {})}
            async with http.post(url + "/ui/send", json=body) as r:
                assert r.status == 200 and (await r.json()) == {"ok": True}, await r.text()

        async def bot_reply(ts: str, needle: str) -> bool:
            thread = await get("/ui/thread", **{"as": who, "ts": ts})
            return any(
                r.get("user") != who and needle in json.dumps(r, ensure_ascii=False)
                for r in thread["replies"]
            )

        await send("/agent look up user 43")
        root = ""
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not root:
            for m in (await get("/ui/history", **{"as": who}))["messages"]:
                if "look up user 43" in m["text"] and m.get("reply_count"):
                    if await bot_reply(m["ts"], "43"):
                        root = m["ts"]
            await asyncio.sleep(0.3)
        assert root, "no answer to /agent look up user 43 within 40 s"
        await send("look up user 44", thread_ts=root)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            if await bot_reply(root, "44"):
                return
            await asyncio.sleep(0.3)
        raise AssertionError("the thread reply did not continue the run within 40 s")


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    (tmp_path / "redis").mkdir()
    with RedisServer(directory=tmp_path / "redis") as server:
        yield server


async def test_the_installed_playground_serves_and_continues_a_run(
    installed: Installed, private_redis: RedisServer, tmp_path: Path
) -> None:
    log = tmp_path / "playground.log"
    env = installed.env(
        REDIS_URL=private_redis.url, PLAYGROUND_PORT=str(free_port()), PORT=str(free_port())
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [installed.bin("playground")],
            cwd=installed.workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not url and proc.poll() is None:
            if found := READY.search(log.read_text(errors="replace")):
                url = found.group(1)
            await asyncio.sleep(0.1)
        assert url, f"the playground did not start:\n{log.read_text(errors='replace')[-3000:]}"
        # The URL comes once the worker is ready: it has announced itself.
        redis = Redis.from_url(private_redis.url, decode_responses=True)
        try:
            assert await presence.live_workers(redis, Keys(KEY_PREFIX))
        finally:
            await redis.aclose()
        async with aiohttp.ClientSession() as http, http.get(url + "/") as page:
            html = await page.text()
            assert page.status == 200 and "<title>" in html
            async with http.get(url + "/static/app.js") as js:
                assert js.status == 200
        token = TOKEN_META.search(html)
        assert token is not None
        await _playground_thread_reply(url, token.group(1))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
