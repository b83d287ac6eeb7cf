"""A parent run that fails while its sub-agent's run is still working.

FAIL_RUN counts none of the turn's sub-agent calls pending any more and leaves each to be
settled by its child run's cancel, which the failing worker starts right after. A crash in
between left the call waiting on a live child with nothing counted: a later thread reply
continued the run into its tools turn, which found the call waiting, was told no child was
pending, and looped. The continued run now finishes the cancel itself, and the parent's
model is told the sub-agent was cancelled because the run failed.

The crash window is reproduced with the real scripts: FAIL_RUN applied alone under the
run's lease, as a worker killed right after it leaves things.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from agent_core import Agent, RunStatus
from agent_core.script_replies import FailOutcome
from agent_core.scripts import Scripts
from agent_core.testing import FakeOpenAI, call, reply, tool_messages
from agent_core.worker import Worker
from tests.agents import desk, read_journal
from tests.core.harness import Harness
from tests.core.test_promises import take_lease

pytestmark = pytest.mark.timeout(60)

CANCELLED_AT_FAILURE = "Not finished: the sub-agent billing was cancelled because this run failed"
LOST = "Outcome unknown: the run of the sub-agent billing ended without its answer"


@pytest.fixture
async def h(agent_harness: Callable[[Agent], Harness]) -> Harness:
    return agent_harness(desk)


def told(prefix: str) -> Any:
    """The model gets one tool message, the sub-agent call's, starting with ``prefix``."""

    def check(messages: list[dict[str, Any]]) -> None:
        texts = [str(m["content"]) for m in tool_messages(messages)]
        assert len(texts) == 1 and texts[0].startswith(prefix), texts
        assert [m["role"] for m in messages[1:]] == ["user", "assistant", "tool", "user"]

    return check


async def paused_on_child(h: Harness, task: str) -> tuple[str, str, str, str]:
    """Start ``task``; once the sub-agent's refund waits for approval and the parent waits
    for the sub-agent (lease released): (parent run, child run, the child's gate, the
    parent's call id)."""
    run = await h.gateway.start_run(task, requested_by="U1")
    rk = h.keys.run(run.run_id)
    for _ in range(200):
        children = await h.redis.smembers(h.keys.children(run.run_id))
        status, until = await h.redis.hmget(rk, ["status", "lease_until"])
        if children and status == "awaiting_approval" and float(until or 0) == 0:
            [child] = children
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the parent never waited on its sub-agent")
    [gate] = await h.opened_gates(child, 1)
    cid = await h.redis.hget(h.keys.run(child), "parent_call")
    assert cid is not None
    return run.run_id, child, gate.data["gate_id"], cid


async def fail_and_crash(h: Harness, run_id: str) -> None:
    """FAIL_RUN alone, as the worker holding the run applies it; the worker then dies before
    it cancels the run's children (its lease runs out)."""
    k, redis = h.keys, h.redis
    rk = k.run(run_id)
    fence = await take_lease(redis, k, run_id)
    turn = await redis.hget(rk, "turn")
    assert turn is not None
    data = json.dumps({"run_id": run_id, "error": "the job kept crashing", "retryable": False})
    failed = await Scripts(redis, k).fail_run(
        run_id,
        {},
        int(turn),
        [],
        fence=fence,
        error="the job kept crashing",
        data=data,
        now="1",
        retryable=False,
        told="",
        not_run="not run",
        in_doubt="?",
        attempt="a1",
    )
    assert failed is FailOutcome.FAILED
    await redis.hset(rk, "lease_until", "0")


async def test_a_reply_after_a_crash_between_failure_and_cascade_cancels_the_sub_agent_once(
    h: Harness, fake_openai: FakeOpenAI, journal: Path, redis: Redis
) -> None:
    fake_openai.script(
        "refund 7 through billing",
        [
            call("billing", {"task": "refund order 7"}),
            reply("Billing was stopped when the run failed.", expect=told(CANCELLED_AT_FAILURE)),
        ],
    )
    fake_openai.script("refund order 7", [call("refund", {"order": 7}), reply("refunded")])
    run_id, child, gate_id, cid = await paused_on_child(h, "refund 7 through billing")
    await fail_and_crash(h, run_id)
    # The window: the parent failed, its call still waits on a child that still runs.
    assert (await h.gateway.get_run(child)).status is RunStatus.AWAITING_APPROVAL  # type: ignore[union-attr]
    assert await redis.hget(h.keys.turn(run_id, 1), f"state:{cid}") == "child"
    assert await redis.hget(h.keys.run(run_id), "children_pending") == "0"

    assert await h.gateway.continue_run(run_id, "what happened?", by="U1") == "started"
    done = await h.gateway.wait(run_id, timeout=15)
    assert (done.status, done.final) == (
        RunStatus.COMPLETED,
        "Billing was stopped when the run failed.",
    )
    sub = await h.gateway.get_run(child)
    assert sub is not None and sub.status is RunStatus.CANCELLED
    assert sub.cancelled_by is None  # by no one: its parent failed
    gate = await h.gateway.get_gate(gate_id)
    assert gate is not None and gate.status.value == "cancelled"
    await asyncio.sleep(0.3)
    events = await h.events()
    assert [e.type.value for e in events if e.run_id == child].count("run.cancelled") == 1
    closed = [e for e in events if e.type.value == "gate.decided" and e.data["gate_id"] == gate_id]
    assert [e.data["status"] for e in closed] == ["cancelled"]
    assert read_journal(str(journal)) == [], "the refund never ran"
    assert len(fake_openai.requests_for("refund order 7")) == 1
    assert len(fake_openai.requests_for("refund 7 through billing")) == 2
    assert fake_openai.errors == []


async def test_a_failure_that_cancels_its_sub_agent_tells_the_model_why_on_continuation(
    h: Harness, fake_openai: FakeOpenAI, journal: Path, redis: Redis
) -> None:
    """Without a crash: the failing worker cancels the sub-agent itself. The parent's model,
    reading the call's result when the run is continued, is told the sub-agent was
    cancelled because this run failed (not "by a user")."""
    fake_openai.script(
        "refund 8 through billing",
        [
            call("billing", {"task": "refund order 8"}),
            reply("It was stopped.", expect=told(CANCELLED_AT_FAILURE)),
        ],
    )
    fake_openai.script("refund order 8", [call("refund", {"order": 8}), reply("refunded")])
    run_id, child, _gate, _cid = await paused_on_child(h, "refund 8 through billing")
    fence = await take_lease(redis, h.keys, run_id)
    runner = Worker(redis, h.agent, h.client, h.settings).runner
    assert await runner.fail(run_id, "the job kept crashing", fence)
    await redis.hset(h.keys.run(run_id), "lease_until", "0")
    sub = await h.wait_finished(child)
    assert sub.status is RunStatus.CANCELLED

    assert await h.gateway.continue_run(run_id, "why?", by="U1") == "started"
    done = await h.gateway.wait(run_id, timeout=15)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "It was stopped.")
    assert read_journal(str(journal)) == []
    assert fake_openai.errors == []


async def test_a_call_whose_sub_agent_run_is_gone_is_settled_and_the_run_goes_on(
    h: Harness, fake_openai: FakeOpenAI, journal: Path, redis: Redis
) -> None:
    """The same window, but the child run is gone too (purged by hand): nothing can report
    to the call. The continued run settles it as unknown instead of waiting for nobody."""
    fake_openai.script(
        "refund 9 through billing",
        [
            call("billing", {"task": "refund order 9"}),
            reply("Billing's outcome is unknown.", expect=told(LOST)),
        ],
    )
    fake_openai.script("refund order 9", [call("refund", {"order": 9}), reply("refunded")])
    run_id, child, gate_id, _cid = await paused_on_child(h, "refund 9 through billing")
    await fail_and_crash(h, run_id)
    await redis.delete(h.keys.run(child), h.keys.run_gates(child), h.keys.gate(gate_id))

    assert await h.gateway.continue_run(run_id, "and?", by="U1") == "started"
    done = await h.gateway.wait(run_id, timeout=15)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "Billing's outcome is unknown.")
    assert read_journal(str(journal)) == []
    assert fake_openai.errors == []
