"""Invariants 2 and 3 with real processes: SIGKILL a worker, restart Redis from its AOF."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from agent_core import RunStatus
from agent_core.testing import FakeOpenAI, call, reply, tool_messages
from tests.agents import ops, read_journal
from tests.conftest import RedisServerFactory
from tests.core.conftest import core_settings
from tests.core.harness import Harness
from tests.core.workers import WorkerProcess, wait_journal

pytestmark = pytest.mark.timeout(90)


def last_tool_contains(*parts: str) -> Callable[[list[dict[str, Any]]], None]:
    def check(messages: list[dict[str, Any]]) -> None:
        text = tool_messages(messages)[-1]["content"]
        for p in parts:
            assert p in text, text

    return check


async def test_worker_killed_while_paused_resumes_on_a_fresh_worker(
    spawn: Callable[..., WorkerProcess],
    observer: Harness,
    fake_openai: FakeOpenAI,
    redis_url: str,
    journal: Path,
) -> None:
    fake_openai.script(
        "kill paused",
        [
            call("delete_user", {"user_id": "11"}),
            reply("done", expect=last_tool_contains("user 11 deleted")),
        ],
    )
    first = spawn(redis_url)
    run = await observer.gateway.start_run("kill paused", requested_by="U1")
    [g] = await observer.opened_gates(run.run_id, 1)
    first.kill()
    assert (await observer.gateway.decide(g.data["gate_id"], "approve", by="U2")).applied
    spawn(redis_url)
    done = await observer.wait_finished(run.run_id, timeout=20)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "done")
    assert read_journal(str(journal)) == ["delete_user:11"]


async def test_worker_killed_while_the_tool_runs_reports_in_doubt_and_never_reruns(
    spawn: Callable[..., WorkerProcess],
    observer: Harness,
    fake_openai: FakeOpenAI,
    redis_url: str,
    journal: Path,
) -> None:
    fake_openai.script(
        "kill claimed",
        [
            call("transfer", {"amount": 5}),
            reply("unknown", expect=last_tool_contains("Outcome unknown", "not run again")),
        ],
    )
    first = spawn(redis_url, TEST_SLOW_SECONDS="60")
    run = await observer.gateway.start_run("kill claimed", requested_by="U1")
    [g] = await observer.opened_gates(run.run_id, 1)
    await observer.gateway.decide(g.data["gate_id"], "approve", by="U2")
    await wait_journal(journal, "transfer:start:5")
    first.kill()
    spawn(redis_url)  # claims the dead worker's job once it has been idle for WORKER_LEASE
    done = await observer.wait_finished(run.run_id, timeout=20)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "unknown")
    assert read_journal(str(journal)) == ["transfer:start:5"]  # started once, never re-run
    ev = await observer.wait_event(run.run_id, "tool.executed")
    assert ev.data["in_doubt"] is True and ev.data["ok"] is False


async def test_an_idempotent_tool_left_in_doubt_runs_again(
    spawn: Callable[..., WorkerProcess],
    observer: Harness,
    fake_openai: FakeOpenAI,
    redis_url: str,
    journal: Path,
) -> None:
    fake_openai.script(
        "kill idem",
        [
            call("sync_mirror", {"name": "m1"}),
            reply("synced", expect=last_tool_contains("mirror m1 synced")),
        ],
    )
    first = spawn(redis_url, TEST_SLOW_SECONDS="60")
    run = await observer.gateway.start_run("kill idem", requested_by="U1")
    [g] = await observer.opened_gates(run.run_id, 1)
    await observer.gateway.decide(g.data["gate_id"], "approve", by="U2")
    await wait_journal(journal, "sync_mirror:start:m1")
    first.kill()
    spawn(redis_url)
    done = await observer.wait_finished(run.run_id, timeout=20)
    assert done.status is RunStatus.COMPLETED
    assert read_journal(str(journal)) == [
        "sync_mirror:start:m1",
        "sync_mirror:start:m1",
        "sync_mirror:end:m1",
    ]


async def test_worker_killed_mid_model_call_is_picked_up_by_another(
    spawn: Callable[..., WorkerProcess],
    observer: Harness,
    fake_openai: FakeOpenAI,
    redis_url: str,
) -> None:
    fake_openai.script("kill start", [reply("hello")])
    fake_openai.fail_next(1, status=503, retry_after=30)  # the first worker sits in a retry wait
    first = spawn(redis_url)
    run = await observer.gateway.start_run("kill start", requested_by="U1")
    # A loaded machine may take seconds to start a process: wait for the first worker to be
    # in its retry wait, however long that takes, before killing it.
    for _ in range(3000):
        if fake_openai.failures_served:
            break
        await asyncio.sleep(0.01)
    assert fake_openai.failures_served, "the first worker never called the model"
    first.kill()
    spawn(redis_url)
    done = await observer.wait_finished(run.run_id, timeout=45)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "hello")


async def test_paused_runs_survive_a_redis_crash_with_aof(
    spawn: Callable[..., WorkerProcess],
    aof_redis: RedisServerFactory,
    fake_openai: FakeOpenAI,
    journal: Path,
) -> None:
    server = aof_redis()
    for i in range(3):
        fake_openai.script(
            f"aof {i}", [call("delete_user", {"user_id": f"a{i}"}), reply(f"ok {i}")]
        )
    worker = spawn(server.url)
    client = Redis.from_url(server.url, decode_responses=True)
    h = Harness(client, core_settings(server.url, fake_openai.base_url), ops)
    try:
        runs = [await h.gateway.start_run(f"aof {i}", requested_by="U1") for i in range(3)]
        gate_ids = [(await h.opened_gates(r.run_id, 1))[0].data["gate_id"] for r in runs]
        server.kill()  # SIGKILL: only the append-only file survives
        await asyncio.sleep(0.5)
        server.start()
        await client.aclose()
        client = Redis.from_url(server.url, decode_responses=True)
        h2 = Harness(client, core_settings(server.url, fake_openai.base_url), ops)
        for r in runs:
            assert (await h2.gateway.get_run(r.run_id)).status is RunStatus.AWAITING_APPROVAL  # type: ignore[union-attr]
        for gid in gate_ids:
            assert (await h2.gateway.decide(gid, "approve", by="U2")).applied
        for r in runs:
            done = await h2.wait_finished(r.run_id, timeout=20)
            assert done.status is RunStatus.COMPLETED
        assert sorted(read_journal(str(journal))) == [f"delete_user:a{i}" for i in range(3)]
        assert worker.proc.poll() is None  # the worker rode out the outage
        await h2.close()
    finally:
        await h.close()
        await client.aclose()


async def test_a_run_continues_within_10_s_of_a_worker_crash_by_default(
    spawn: Callable[..., WorkerProcess],
    observer: Harness,
    fake_openai: FakeOpenAI,
    redis_url: str,
    journal: Path,
) -> None:
    """With the default WORKER_LEASE, another worker takes a dead worker's run over fast."""
    fake_openai.script(
        "crash fast",
        [
            call("slow_report", {"name": "q"}),
            reply("reported", expect=last_tool_contains("Outcome unknown")),
        ],
    )
    env = {"WORKER_LEASE": "", "TEST_SLOW_SECONDS": "60"}  # empty: the default lease
    first = spawn(redis_url, **env)
    run = await observer.gateway.start_run("crash fast", requested_by="U1")
    for _ in range(500):
        if any(x.startswith("slow_report:start:q") for x in read_journal(str(journal))):
            break
        await asyncio.sleep(0.02)
    spawn(redis_url, **env)
    await asyncio.sleep(0.5)  # the second worker is up
    loop = asyncio.get_running_loop()
    killed_at = loop.time()
    first.kill()
    ev = await observer.wait_event(run.run_id, "tool.executed", timeout=15)
    took = loop.time() - killed_at
    assert ev.data["in_doubt"] is True
    assert took < 10, f"the run continued {took:.1f} s after the crash"
    done = await observer.wait_finished(run.run_id, timeout=15)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "reported")
