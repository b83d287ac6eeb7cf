"""``python -m playground`` beside a real deployment in the same Redis: it keeps to its own key
prefix whatever KEY_PREFIX says, refuses to start when someone else's workers are alive under
that prefix, and everything it starts listens on 127.0.0.1 only.

Each test has a private redis-server (the playground's default prefix is fixed, so tests
sharing one would see each other's workers).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from redis.asyncio import Redis

from agent_core import ConfigError, Gateway, Keys, presence
from playground import people
from playground.guard import TOKEN_HEADER
from playground.launcher import KEY_PREFIX, LaunchSettings
from tests.playground.conftest import ROOT, playground_env, start_playground
from tests.redis_server import RedisServer, free_port

pytestmark = pytest.mark.timeout(90)

DEPLOYMENT = "prod"  # the deployment's KEY_PREFIX, left in the developer's environment


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    (tmp_path / "redis").mkdir()
    with RedisServer(directory=tmp_path / "redis") as server:
        yield server


@pytest.fixture
async def redis(private_redis: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(private_redis.url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


async def snapshot(url: str) -> dict[bytes, bytes | None]:
    """Every key with its serialized value (DUMP): what "untouched" is compared with."""
    raw = Redis.from_url(url)
    try:
        return {key: await raw.dump(key) async for key in raw.scan_iter(count=1000)}
    finally:
        await raw.aclose()


async def a_live_deployment(redis: Redis, prefix: str) -> str:
    """A deployment's worker announcing itself under ``prefix`` (as workers do at start), and
    a run of its own agent queued for it. Returns the run id."""
    keys = Keys(prefix)
    assert await presence.announce(redis, keys, "prod-host-4242-beef", ["billing"], every=600)
    run = await Gateway(redis, keys, agent_name="billing").start_run(
        "refund invoice 7", requested_by="U0PROD"
    )
    return run.run_id


def run_until_exit(env: dict[str, str], timeout: float) -> tuple[int | None, str, str]:
    """``python -m playground`` in a process group of its own: (exit status, stdout, stderr).
    Still running after ``timeout``: SIGKILL for the group (its web and worker too), None."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "playground"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err


def listening(port: int) -> set[str]:
    """The local addresses a TCP socket listens on at ``port`` (from /proc/net/tcp{,6})."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                continue
            if len(address) == 8:  # IPv4, little-endian
                found.add(".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)))
            else:
                found.add("ipv6:" + address)
    return found


async def test_a_live_worker_it_did_not_start_refuses_the_start(
    redis: Redis, private_redis: RedisServer
) -> None:
    # Another playground (or a deployment run with KEY_PREFIX=playground) is alive here.
    await a_live_deployment(redis, KEY_PREFIX)
    before = await snapshot(private_redis.url)
    port = free_port()
    env = playground_env(private_redis.url, port, free_port(), KEY_PREFIX=DEPLOYMENT)
    code, out, err = await asyncio.to_thread(run_until_exit, env, 30)
    assert code == 2, out + err
    [line] = err.splitlines()
    assert line.startswith("config error: 1 worker(s) that this playground did not start")
    assert f"key prefix {KEY_PREFIX} " in line and "prod-host-4242-beef" in line
    assert "PLAYGROUND_KEY_PREFIX" in line
    assert "open http" not in out  # never ready, never listening
    assert listening(port) == set()
    # Nothing was written: not a key, not a consumer.
    assert await snapshot(private_redis.url) == before


async def test_it_keeps_to_its_own_prefix_beside_a_live_deployment(
    redis: Redis, private_redis: RedisServer, tmp_path: Path
) -> None:
    run_id = await a_live_deployment(redis, DEPLOYMENT)
    theirs = await snapshot(private_redis.url)
    # The developer's shell still has the deployment's KEY_PREFIX; the playground ignores it.
    pg = start_playground(private_redis.url, tmp_path, prefix="", KEY_PREFIX=DEPLOYMENT)
    try:
        # Everything it started listens on 127.0.0.1 only: its page, and the bot's
        # /slack/events, /healthz and /metrics.
        assert listening(int(pg.url.rsplit(":", 1)[1])) == {"127.0.0.1"}
        assert listening(pg.web_port) == {"127.0.0.1"}

        # A run in the playground goes through its own bot and worker to the answer.
        answer = await run_in_playground(pg.url, pg.session_token(), "look up user 43", "User 43:")
        assert "Alan Turing" in answer
    finally:
        pg.stop()

    after = await snapshot(private_redis.url)
    # The deployment's keys are untouched: its run still queued for its own workers, no
    # consumer of the playground in its groups.
    assert {k: v for k, v in after.items() if k in theirs} == theirs
    run = await Gateway(redis, Keys(DEPLOYMENT)).get_run(run_id)
    assert run is not None and run.status.value == "queued"
    # Everything the playground wrote is under its own prefix.
    new = sorted(k.decode() for k in after if k not in theirs)
    assert new, "the playground wrote nothing"
    assert all(
        k.startswith("{" + KEY_PREFIX + ":") or k.startswith("{" + KEY_PREFIX + "}") for k in new
    ), new


async def run_in_playground(url: str, token: str, task: str, expect: str) -> str:
    """``/agent <task>`` sent as a local tool would (the session token, no Origin); the text
    of the first reply in the task's thread holding ``expect``, as the page reads it."""
    headers = {TOKEN_HEADER: token}
    who = people.REQUESTER.id
    async with aiohttp.ClientSession(headers=headers) as http:

        async def get(path: str, **params: str) -> Any:
            async with http.get(url + path, params=params) as r:
                assert r.status == 200, await r.text()
                return await r.json()

        async with http.post(url + "/ui/send", json={"as": who, "text": f"/agent {task}"}) as r:
            assert r.status == 200 and (await r.json()) == {"ok": True}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            history = (await get("/ui/history", **{"as": who}))["messages"]
            roots = [m for m in history if task in m["text"] and m.get("reply_count")]
            for root in roots:
                thread = await get("/ui/thread", **{"as": who, "ts": root["ts"]})
                for reply in thread["replies"]:
                    if expect in json.dumps(reply, ensure_ascii=False):
                        return json.dumps(reply, ensure_ascii=False)
            await asyncio.sleep(0.3)
    raise AssertionError(f"no reply with {expect!r} to {task!r} within 30 s")


def test_the_prefix_is_its_own_whatever_key_prefix_says() -> None:
    env = {"REDIS_URL": "redis://127.0.0.1:1"}
    assert LaunchSettings.from_env({**env, "KEY_PREFIX": DEPLOYMENT}).key_prefix == KEY_PREFIX
    assert LaunchSettings.from_env(env).key_prefix == KEY_PREFIX
    # Two playgrounds in one Redis: the second one names its own.
    assert LaunchSettings.from_env({**env, "PLAYGROUND_KEY_PREFIX": "pg2"}).key_prefix == "pg2"


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ({"PLAYGROUND_KEY_PREFIX": "prod", "KEY_PREFIX": "prod"}, "it is the deployment's"),
        ({"PLAYGROUND_KEY_PREFIX": "agw"}, "it is the deployment's KEY_PREFIX (agw)"),
        ({"PLAYGROUND_KEY_PREFIX": "{pg}"}, "letters, digits"),
    ],
)
def test_a_prefix_it_cannot_use(extra: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        LaunchSettings.from_env({"REDIS_URL": "redis://127.0.0.1:1", **extra})
    [line] = str(info.value).splitlines()
    assert line.startswith("PLAYGROUND_KEY_PREFIX is invalid") and problem in line
