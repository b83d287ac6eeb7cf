"""run_worker: a worker inside the caller's event loop, stopped by an asyncio.Event."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from redis.asyncio import Redis

import agent_core
from agent_core import ConfigError, Decision, Gateway, Keys, RunStatus, Settings, run_worker
from agent_core.testing import FakeOpenAI, call, reply
from tests.agents import read_journal
from tests.core.conftest import core_settings


async def test_run_worker_in_process_completes_a_run_and_stops(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    settings = core_settings(redis_url, fake_openai.base_url, AGENT="tests.agents:ops")
    fake_openai.script("delete 42", [call("delete_user", {"user_id": "42"}), reply("gone")])
    stop = asyncio.Event()
    worker = asyncio.create_task(run_worker(settings, stop=stop))
    gw = Gateway(redis, Keys(settings.key_prefix))
    run = await gw.start_run("delete 42", requested_by="U1")
    paused = await gw.wait(run.run_id, until="awaiting_approval", timeout=10)
    [gate] = await gw.pending_gates(paused.run_id)
    await gw.decide(gate.gate_id, Decision.APPROVE, by="U2", args_hash=gate.args_hash)
    done = await gw.wait(run.run_id, timeout=10)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "gone")
    assert read_journal(str(journal)) == ["delete_user:42"]
    stop.set()
    await asyncio.wait_for(worker, 10)  # returns, closing its clients
    assert worker.exception() is None


async def test_run_worker_takes_an_agent_object_and_can_be_cancelled(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    from tests.agents import ops

    settings = core_settings(redis_url, fake_openai.base_url, AGENT="no_such_module:agent")
    fake_openai.script("look k1", [call("lookup", {"key": "k1"}), reply("found")])
    worker = asyncio.create_task(run_worker(settings, agent=ops))
    gw = Gateway(redis, Keys(settings.key_prefix))
    run = await gw.start_run("look k1", requested_by="U1")
    assert (await gw.wait(run.run_id, timeout=10)).final == "found"
    worker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(worker, 10)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_run_worker_config_errors(redis_url: str, fake_openai: FakeOpenAI) -> None:
    no_key = Settings.from_env(REDIS_URL=redis_url, OPENAI_API_KEY="")
    with pytest.raises(ConfigError, match=r"^OPENAI_API_KEY is not set"):
        await run_worker(no_key)
    bad_agent = core_settings(redis_url, fake_openai.base_url, AGENT="no_such_module:agent")
    with pytest.raises(ConfigError, match=r"^AGENT is invalid: no module named 'no_such_module'"):
        await run_worker(bad_agent)
    dead = core_settings(f"redis://127.0.0.1:{closed_port()}/0", fake_openai.base_url)
    with pytest.raises(ConfigError, match=r"^REDIS_URL: cannot reach Redis"):
        await run_worker(dead)


def test_worker_and_run_worker_are_exported() -> None:
    from agent_core import worker

    assert agent_core.run_worker is worker.run_worker
    assert agent_core.Worker is worker.Worker
