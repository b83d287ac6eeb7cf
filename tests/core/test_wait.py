"""Gateway.wait: blocks on the events stream until the run gets where the caller waits for."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from agent_core import Decision, Gateway, Run, RunNotFound, RunStatus
from agent_core.testing import FakeOpenAI, call, reply
from tests.core.harness import Harness


async def command_calls(redis: Redis, command: str) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_wait_returns_on_completion(harness: Harness, fake_openai: FakeOpenAI) -> None:
    fake_openai.script("look k1", [call("lookup", {"key": "k1"}), reply("k1 found")])
    run = await harness.gateway.start_run("look k1", requested_by="U1")
    done = await harness.gateway.wait(run.run_id, timeout=10)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "k1 found")


async def test_wait_returns_on_awaiting_approval_then_on_the_end(
    harness: Harness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script("delete 42", [call("delete_user", {"user_id": "42"}), reply("gone")])
    gw = harness.gateway
    run = await gw.start_run("delete 42", requested_by="U1")
    paused = await gw.wait(run.run_id, until="awaiting_approval", timeout=10)
    assert paused.status is RunStatus.AWAITING_APPROVAL
    [gate] = await gw.pending_gates(run.run_id)
    assert gate.tool == "delete_user"
    # Already there: returned at once.
    again = await gw.wait(run.run_id, until={RunStatus.AWAITING_APPROVAL}, timeout=0)
    assert again.status is RunStatus.AWAITING_APPROVAL
    await gw.decide(gate.gate_id, Decision.APPROVE, by="U2", args_hash=gate.args_hash)
    done = await gw.wait(run.run_id, timeout=10)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "gone")


async def test_wait_times_out_when_nothing_happens_without_polling(
    observer: Harness, redis: Redis
) -> None:
    run = await observer.gateway.start_run("nobody works on this", requested_by="U1")
    xreads, hgetalls = await command_calls(redis, "xread"), await command_calls(redis, "hgetall")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"is still queued after 1\.5 s"):
        await observer.gateway.wait(run.run_id, timeout=1.5)
    assert 1.5 <= time.monotonic() - started < 3
    # Blocking reads of about a second each, and one read of the run: no polling loop.
    assert await command_calls(redis, "xread") - xreads <= 3
    assert await command_calls(redis, "hgetall") - hgetalls == 1


async def test_wait_returns_at_once_for_a_finished_run(
    harness: Harness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script("hello", [reply("hi")])
    run = await harness.gateway.start_run("hello", requested_by="U1")
    await harness.wait_finished(run.run_id)
    started = time.monotonic()
    done = await harness.gateway.wait(run.run_id, timeout=0)
    assert done.status is RunStatus.COMPLETED
    assert time.monotonic() - started < 0.5
    # Finished is final: waiting for a pause it will never reach returns it too.
    paused = await harness.gateway.wait(run.run_id, until="awaiting_approval", timeout=0)
    assert paused.status is RunStatus.COMPLETED


async def test_wait_wakes_on_a_cancel_and_ignores_other_runs(observer: Harness) -> None:
    gw = observer.gateway
    run = await gw.start_run("to be cancelled", requested_by="U1")
    other = await gw.start_run("another run", requested_by="U1")
    waiter = asyncio.create_task(gw.wait(run.run_id, timeout=10))
    await asyncio.sleep(0.2)
    await gw.cancel_run(other.run_id, by="U1")
    await asyncio.sleep(0.2)
    assert not waiter.done(), "another run's event must not end the wait"
    await gw.cancel_run(run.run_id, by="U1", reason="wrong ticket")
    done = await asyncio.wait_for(waiter, 5)
    assert (done.status, done.cancelled_by) == (RunStatus.CANCELLED, "U1")


class RacingGateway(Gateway):
    """Cancels the run right after wait() read it, before wait() starts to block."""

    async def get_run(self, run_id: str) -> Run | None:
        run = await super().get_run(run_id)
        if run is not None and not run.status.finished:
            await self.cancel_run(run_id, by="racer")
        return run  # as read before the cancel


async def test_a_transition_between_reading_the_run_and_blocking_is_not_missed(
    observer: Harness, redis: Redis
) -> None:
    run = await observer.gateway.start_run("racy", requested_by="U1")
    racing = RacingGateway(redis, observer.keys)
    done = await racing.wait(run.run_id, timeout=5)
    assert (done.status, done.cancelled_by) == (RunStatus.CANCELLED, "racer")


async def test_wait_refuses_states_no_event_announces_and_unknown_runs(
    observer: Harness,
) -> None:
    run = await observer.gateway.start_run("idle", requested_by="U1")
    for until in ("running", "queued", [], "bogus"):
        with pytest.raises(ValueError):
            await observer.gateway.wait(run.run_id, until=until, timeout=0)
    with pytest.raises(RunNotFound):
        await observer.gateway.wait("r-000000000000", timeout=1)
