"""A run that fails in its tools phase: the calls of that turn that did not run are closed
with the failure, so the events (and the cards) tell the truth, and a later continuation
never runs an approval given before the failure without asking again.

The trigger reproduced first is the one seen in production: a resume job reaches a worker
that does not serve the run's agent, and the run fails with the approved call unclaimed.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from agent_core import Agent, RunStatus
from agent_core.testing import FakeOpenAI, call, calls, reply, tool_messages
from agent_core.worker import Worker
from tests.agents import read_journal, strict
from tests.core.harness import Harness
from tests.core.test_promises import take_lease

NOT_RUN = "Not executed: the run failed before this call ran"
IN_DOUBT = "Outcome unknown: this call was running when the run failed"


async def stop(h: Harness, worker: Worker) -> None:
    """Stop one of the harness's workers and wait until it has."""
    for i, (w, task) in enumerate(h.workers):
        if w is worker:
            w.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 10)
            del h.workers[i]
            return
    raise AssertionError("not a worker of this harness")


def start(h: Harness, agent: Agent) -> Worker:
    w = Worker(h.redis, agent, h.client, h.settings)
    h.workers.append((w, asyncio.create_task(w.run())))
    return w


def told(*expected: str) -> Any:
    """An expectation on the tool messages the model receives, in order (prefixes)."""

    def check(messages: list[dict[str, Any]]) -> None:
        texts = [str(m["content"]) for m in tool_messages(messages)]
        assert len(texts) == len(expected), texts
        for text, prefix in zip(texts, expected, strict=True):
            assert text.startswith(prefix), texts

    return check


async def test_an_approved_call_of_a_run_failed_at_resume_never_runs_and_a_reply_says_so(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    h = harness
    fake_openai.script(
        "delete 42 please",
        [
            call("delete_user", {"user_id": "42"}),
            reply("It did not run; shall I ask again?", expect=told(NOT_RUN)),
        ],
    )
    run = await h.gateway.start_run("delete 42 please", requested_by="U1")
    [opened] = await h.opened_gates(run.run_id, 1)
    gid = opened.data["gate_id"]
    # The worker that served the run's agent goes; one serving another agent only takes
    # the resume job.
    await stop(h, h.workers[0][0])
    other = start(h, strict)
    assert (await h.gateway.decide(gid, "approve", by="U2")).applied
    failed = await h.wait_finished(run.run_id)
    assert failed.status is RunStatus.FAILED
    assert "no agent named 'test-ops'" in (failed.error or "")
    ev = await h.wait_event(run.run_id, "run.failed")
    # The bot turns these lists into the cards' outcome (instead of "Running…").
    assert (ev.data["never_ran"], ev.data["in_doubt"]) == ([gid], [])
    result = await h.redis.hget(h.keys.turn(run.run_id, 1), f"result:{opened.data['call_id']}")
    assert result is not None and result.startswith(NOT_RUN), result
    assert "no agent named 'test-ops'" in result

    # Someone asks what happened: the run continues, and the old approval does not run.
    await stop(h, other)
    h.start_worker()
    assert await h.gateway.continue_run(run.run_id, "what happened?", by="U3") == "started"
    done = await h.gateway.wait(run.run_id, timeout=10)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "It did not run; shall I ask again?")
    await asyncio.sleep(0.3)
    assert read_journal(str(journal)) == []
    assert not [e for e in await h.events() if e.type.value == "tool.executed"]
    last = fake_openai.requests_for("delete 42 please")[-1]["messages"]
    assert [m["role"] for m in last[1:]] == ["user", "assistant", "tool", "user"]
    assert fake_openai.errors == []


async def test_a_failure_in_the_tools_phase_closes_every_call_that_did_not_run(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path, redis: Redis
) -> None:
    """One turn, four gated calls: an idempotent call a dead worker had claimed, an approved
    call not started, a denied one and one still pending. The failure (the dead-letter path
    fails a run this way) settles the claimed call as in doubt and the two others as not
    run; the denial stays, and the model is told each on the next turn."""
    h = harness
    fake_openai.script(
        "four calls",
        [
            calls(
                [
                    ("sync_mirror", {"name": "m1"}),
                    ("delete_user", {"user_id": "a"}),
                    ("delete_user", {"user_id": "b"}),
                    ("delete_user", {"user_id": "c"}),
                ]
            ),
            reply(
                "reported",
                expect=told(IN_DOUBT, NOT_RUN, "Not executed: the user U2 declined", NOT_RUN),
            ),
        ],
    )
    run = await h.gateway.start_run("four calls", requested_by="U1")
    opened = await h.opened_gates(run.run_id, 4)
    await stop(h, h.workers[0][0])  # the decisions' resume job waits in the stream
    sync, a, b, c = (e.data for e in opened)
    await h.gateway.decide(sync["gate_id"], "approve", by="U2")
    await h.gateway.decide(a["gate_id"], "approve", by="U2")
    await h.gateway.decide(b["gate_id"], "deny", by="U2")
    rk, tk = h.keys.run(run.run_id), h.keys.turn(run.run_id, 1)
    fence = await take_lease(redis, h.keys, run.run_id)
    await redis.hset(rk, "status", "running")  # as the resume's BEGIN_RUN leaves it
    await redis.hset(tk, f"state:{sync['call_id']}", "claimed")  # its worker died mid-call
    runner = Worker(redis, h.agent, h.client, h.settings).runner
    assert await runner.fail(run.run_id, "the job kept crashing", fence)
    ev = await h.wait_event(run.run_id, "run.failed")
    assert ev.data["never_ran"] == [a["gate_id"]]
    assert ev.data["in_doubt"] == [sync["gate_id"]]
    turn = await redis.hgetall(tk)
    states = [turn[f"state:{g['call_id']}"] for g in (sync, a, b, c)]
    assert states == ["done", "done", "gated", "done"]
    await redis.hset(rk, "lease_until", "0")

    h.start_worker()
    assert await h.gateway.continue_run(run.run_id, "what happened?", by="U1") == "started"
    done = await h.gateway.wait(run.run_id, timeout=10)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "reported")
    await asyncio.sleep(0.3)
    # Neither the idempotent call nor the approved one ran after the failure.
    assert read_journal(str(journal)) == []
    assert fake_openai.errors == []
