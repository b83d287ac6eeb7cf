"""Invariant 8 with real processes: a worker paused past its lease writes nothing.

Two ``python -m agent_core.worker`` processes share the jobs (``WORKER_LEASE=2``). The model
asks for an un-gated slow tool and a gated one in one turn. The worker running the slow tool
is frozen past its lease: by ``SIGSTOP`` (a GC or VM pause), or by an async tool that blocks
its event loop. The other worker takes the run over, reports the slow call in doubt and
opens the gate; a person approves; the approved call runs. Then the frozen worker wakes up.
It must write nothing: no gate reopens, nothing asks for approval twice, every call runs at
most once, and the model is told the truth.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from redis.asyncio import Redis

from agent_core import GateStatus, LeaseLost, RunStatus
from agent_core.runner import Runner
from agent_core.script_replies import (
    ClaimOutcome,
    CompleteOutcome,
    FailOutcome,
    LeaseStatus,
    SettleOutcome,
)
from agent_core.scripts import Scripts
from agent_core.testing import FakeOpenAI, calls, reply, tool_messages
from tests.agents import ops, read_journal
from tests.core.harness import Harness
from tests.core.workers import WorkerProcess, wait_journal

pytestmark = pytest.mark.timeout(90)


def told(messages: list[dict[str, Any]]) -> None:
    """The model hears: the slow call is in doubt, the approved call ran."""
    texts = [m["content"] for m in tool_messages(messages)]
    assert len(texts) == 2, texts
    assert texts[0].startswith("Outcome unknown"), texts
    assert texts[1] == "user u7 deleted", texts


async def started_by(journal: Path, tool: str, name: str) -> int:
    """The pid of the worker whose journal line says it started ``tool`` on ``name``."""
    prefix = f"{tool}:start:{name}:"
    for _ in range(500):
        for line in read_journal(str(journal)):
            if line.startswith(prefix):
                return int(line.removeprefix(prefix))
        await asyncio.sleep(0.02)
    raise AssertionError(f"{tool} never started: {read_journal(str(journal))}")


async def check_nothing_written_twice(
    observer: Harness, redis: Redis, run_id: str, gate_id: str, journal: Path, tool: str
) -> None:
    events = [e for e in await observer.events() if e.run_id == run_id]
    opened = [e for e in events if e.type.value == "gate.opened"]
    assert [e.data["gate_id"] for e in opened] == [gate_id], "a gate was opened twice"
    decided = [e for e in events if e.type.value == "gate.decided"]
    assert [(e.data["gate_id"], e.data["status"]) for e in decided] == [(gate_id, "approved")]
    executed = [e for e in events if e.type.value == "tool.executed"]
    # One report per call: the slow one in doubt (from the new owner), the approved one ok.
    assert sorted((e.data["tool"], e.data["ok"], e.data["in_doubt"]) for e in executed) == sorted(
        [("delete_user", True, False), (tool, False, True)]
    )
    gate = await observer.gateway.get_gate(gate_id)
    assert gate is not None and gate.status is GateStatus.APPROVED
    run = await observer.gateway.get_run(run_id)
    assert run is not None and run.status is RunStatus.COMPLETED and run.final == "all done"
    lines = read_journal(str(journal))
    assert sum(line.startswith(f"{tool}:start:") for line in lines) == 1, lines
    assert lines.count("delete_user:u7") == 1, lines


async def run_takeover(
    spawn: Callable[..., WorkerProcess],
    observer: Harness,
    fake_openai: FakeOpenAI,
    redis: Redis,
    redis_url: str,
    journal: Path,
    *,
    tool: str,
    freeze: bool,
) -> None:
    task = f"takeover {tool}"
    fake_openai.script(
        task,
        [
            calls([(tool, {"name": "r1"}), ("delete_user", {"user_id": "u7"})]),
            reply("all done", expect=told),
        ],
    )
    env = {"WORKER_LEASE": "2", "TEST_SLOW_SECONDS": "4" if not freeze else "0.5"}
    workers = [spawn(redis_url, **env), spawn(redis_url, **env)]
    run = await observer.gateway.start_run(task, requested_by="U1")
    pid = await started_by(journal, tool, "r1")
    first = next(w for w in workers if w.proc.pid == pid)
    if freeze:
        first.pause()  # frozen mid-tool, past its lease
    try:
        (opened,) = await observer.opened_gates(run.run_id, 1, timeout=20)
        gate_id = opened.data["gate_id"]
        res = await observer.gateway.decide(gate_id, "approve", by="U2")
        assert res.applied
        await wait_journal(journal, "delete_user:u7", timeout=20)
        finished = await observer.wait_finished(run.run_id, timeout=20)
        assert finished.status is RunStatus.COMPLETED
    finally:
        if freeze:
            first.resume()
    # The stale worker is awake again (or its blocking tool returned): give it time to try.
    await wait_journal(journal, f"{tool}:end:r1:{pid}", timeout=20)
    for _ in range(100):
        if "lost its lease" in first.output() or "lease lost" in first.output():
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    assert "result of " + tool + " discarded" in first.output(), first.output()
    await check_nothing_written_twice(observer, redis, run.run_id, gate_id, journal, tool)
    # No second card could be asked for: the gate was never written back to pending.
    assert (
        await redis.zscore(observer.keys.deadlines(observer.keys.shard_of(gate_id)), gate_id)
        is None
    )


async def test_a_worker_frozen_past_its_lease_writes_nothing_when_it_wakes(
    spawn: Callable[..., WorkerProcess],
    observer: Harness,
    fake_openai: FakeOpenAI,
    redis: Redis,
    redis_url: str,
    journal: Path,
) -> None:
    await run_takeover(
        spawn, observer, fake_openai, redis, redis_url, journal, tool="slow_report", freeze=True
    )


async def test_an_async_tool_blocking_the_loop_past_the_lease_writes_nothing(
    spawn: Callable[..., WorkerProcess],
    observer: Harness,
    fake_openai: FakeOpenAI,
    redis: Redis,
    redis_url: str,
    journal: Path,
) -> None:
    await run_takeover(
        spawn,
        observer,
        fake_openai,
        redis,
        redis_url,
        journal,
        tool="blocking_report",
        freeze=False,
    )


# --------------------------------------------------------------------------- the scripts
async def lease(scripts: Scripts, run_id: str, ms: int = 60_000) -> str:
    res = await scripts.acquire_lease(run_id, lease_ms=ms, worker="test")
    assert res.status is LeaseStatus.OK, res
    return res.fence


async def test_every_advancing_script_refuses_a_stale_fence(
    observer: Harness, redis: Redis
) -> None:
    """A fence from an earlier lease (one taken over once it ran out) moves nothing, script
    by script."""
    gw, k = observer.gateway, observer.keys
    scripts = Scripts(redis, k)
    run = await gw.start_run("fenced", requested_by="U1")
    rid, rk = run.run_id, k.run(run.run_id)
    old = await lease(scripts, rid, ms=50)
    await asyncio.sleep(0.1)  # the lease runs out
    new = await lease(scripts, rid)
    assert new != old
    assert await scripts.renew_lease(rid, old, 1000) is False
    before = await redis.hgetall(rk)
    turn = k.turn(rid, 1)
    await redis.hset(turn, mapping={"state:c1": "ready"})

    replies = [
        (await scripts.begin_run(rid, old, "a", "1")).status,
        (
            await scripts.record_turn(
                {"run_id": rid},
                0,
                old,
                assistant=json.dumps({"role": "assistant", "content": "x"}),
                done=True,
                final="x",
                completed="{}",
                now="1",
                fields=[],
            )
        ).lost,
        (await scripts.claim_call(rid, 1, old, "c1", idempotent=False, attempt="")).outcome,
        await scripts.settle_call(rid, 1, old, "c1", "no"),
        await scripts.complete_call(rid, 1, old, "c1", "x", "{"),
        (await scripts.finish_turn(rid, 0, old, "1", [], read=False)).lost,
        await scripts.fail_run(
            rid,
            {},
            1,
            [],
            fence=old,
            error="boom",
            data="{}",
            now="1",
            retryable=False,
            told="",
            not_run="not run",
            in_doubt="in doubt",
            attempt="",
        ),
        await scripts.finish_job(k.jobs(k.shard_of(rid)), "workers", "1-1", rid, old),
    ]
    assert replies == [
        "lost",
        True,
        ClaimOutcome.LOST,
        SettleOutcome.LOST,
        CompleteOutcome.LOST,
        True,
        FailOutcome.LOST,
        False,
    ]
    assert await redis.hgetall(rk) == before
    assert await redis.hgetall(turn) == {"state:c1": "ready"}
    assert await redis.lrange(k.history(rid), 0, -1) == [
        json.dumps({"role": "user", "content": "fenced"})
    ]
    # Only the holder can release: the stale fence cannot free the new holder's lease.
    assert await scripts.release_lease(rid, old) is False
    assert await scripts.renew_lease(rid, new, 1000) is True


async def test_a_worker_told_its_lease_is_lost_stops_calling_the_model(
    observer: Harness, fake_openai: FakeOpenAI, redis: Redis
) -> None:
    """Rate-limited (the server asks for 20 s), the worker waits to retry; its heartbeat then
    learns the lease is gone. It stops at once instead of paying for the retries."""
    fake_openai.script("limited", [reply("never")])
    fake_openai.rate_limit(20)
    run = await observer.gateway.start_run("limited", requested_by="U1")
    fence = await lease(Scripts(redis, observer.keys), run.run_id)
    client = AsyncOpenAI(api_key="sk-test", base_url=fake_openai.base_url, max_retries=0)
    runner = Runner(redis, observer.keys, ops, client, model="m", approval_timeout=60)
    lost = asyncio.Event()
    try:
        advancing = asyncio.ensure_future(runner.advance(run.run_id, fence, lost))
        for _ in range(100):
            if fake_openai.requests_for("limited"):
                break
            await asyncio.sleep(0.02)
        lost.set()
        with pytest.raises(LeaseLost):  # well before the 20 s the server asked for
            await asyncio.wait_for(advancing, 5)
        assert len(fake_openai.requests_for("limited")) == 1
    finally:
        fake_openai.clear_failures()
        await runner.endpoint.aclose()
        await client.close()


async def test_open_gates_never_touches_an_existing_gate_or_a_call_that_moved_on(
    observer: Harness, redis: Redis
) -> None:
    """Even its lease holder cannot reopen a decided gate: OPEN_GATES is all or nothing, and
    refuses a gate that exists or a call no longer waiting for one."""
    gw, k = observer.gateway, observer.keys
    run = await gw.start_run("reopen", requested_by="U1")
    rk, turn = k.run(run.run_id), k.turn(run.run_id, 1)
    await redis.hset(rk, mapping={"status": "running", "turn": 1, "phase": "tools"})
    await redis.hset(turn, mapping={"state:c1": "needs_gate", "state:c2": "needs_gate"})
    fence = await lease(Scripts(redis, k), run.run_id)
    runner = Runner(redis, k, ops, client=None, model="m", approval_timeout=60)  # type: ignore[arg-type]
    calls = [
        {
            "id": f"c{i}",
            "name": "delete_user",
            "args": {"user_id": str(i)},
            "gate_id": k.new_gate_id(k.shard_of(run.run_id)),
        }
        for i in (1, 2)
    ]
    await runner._open_gates(await redis.hgetall(rk), 1, calls, fence)
    first = calls[0]["gate_id"]
    assert (await gw.decide(first, "approve", by="U2")).applied
    before = {g: await redis.hgetall(k.gate(g)) for g in (first, calls[1]["gate_id"])}
    events = await redis.xlen(k.events(k.shard_of(run.run_id)))
    # A stale view of the turn (as a worker paused before the decision would hold): refused.
    await redis.hset(rk, mapping={"status": "running"})
    await runner._open_gates(await redis.hgetall(rk), 1, calls, fence)
    await redis.hset(turn, "state:c2", "done")
    await runner._open_gates(await redis.hgetall(rk), 1, calls[1:], fence)
    after = {g: await redis.hgetall(k.gate(g)) for g in before}
    assert after == before and after[first]["status"] == "approved"
    assert await redis.xlen(k.events(k.shard_of(run.run_id))) == events  # no second gate.opened
