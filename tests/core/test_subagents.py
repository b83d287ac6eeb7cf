"""Sub-agents: a call to an agent-as-tool runs as a child run whose gates bubble up to the
parent's thread, whose outcome is the parent call's result, at every depth."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from agent_core import Agent, RunStatus
from agent_core.testing import FakeOpenAI, call, calls, filtered, reply, tool_messages
from tests.agents import desk, read_journal
from tests.core.conftest import core_settings
from tests.core.harness import Harness
from tests.core.workers import WorkerProcess, wait_journal

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def h(agent_harness: Callable[[Agent], Harness]) -> Harness:
    return agent_harness(desk)


def told(*parts: str) -> Callable[[list[dict[str, Any]]], None]:
    """An expectation on the last tool message the model receives."""

    def check(messages: list[dict[str, Any]]) -> None:
        text = tool_messages(messages)[-1]["content"]
        for p in parts:
            assert p in text, text

    return check


async def child_gate(h: Harness, parent_id: str, timeout: float = 20) -> tuple[str, dict[str, Any]]:
    """The first gate opened by a child run of ``parent_id``: (child run id, event data)."""
    for _ in range(int(timeout * 10)):
        for e in await h.events(block_ms=100):
            origin = e.data.get("origin") or {}
            if e.type.value == "gate.opened" and origin.get("parent_run") == parent_id:
                return e.run_id, e.data
    raise AssertionError(f"no nested gate for {parent_id}")


async def test_a_sub_agents_approval_bubbles_up_and_its_answer_is_the_tool_result(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script(
        "refund order 7 please",
        [
            call("billing", {"task": "refund order 7"}),
            reply("Billing says: refunded.", expect=told("Order 7 is refunded.")),
        ],
    )
    fake_openai.script(
        "refund order 7",
        [
            call("refund", {"order": 7}),
            reply("Order 7 is refunded.", expect=told("order 7 refunded")),
        ],
    )
    run = await h.gateway.start_run(
        "refund order 7 please", requested_by="U1", origin={"channel": "C1", "thread_ts": "1.0"}
    )
    child_id, gate = await child_gate(h, run.run_id)
    # Shown on the parent's thread, marked nested, with the path from the top.
    assert gate["nested"] is True
    assert gate["path"] == ["desk", "billing"]
    assert gate["tool"] == "refund" and gate["args"] == {"order": 7}
    assert gate["origin"]["channel"] == "C1" and gate["origin"]["thread_ts"] == "1.0"
    # The self-approval rule applies to the person who asked the parent.
    assert gate["requested_by"] == "U1"
    child = await h.gateway.get_run(child_id)
    assert child is not None and child.status is RunStatus.AWAITING_APPROVAL
    assert h.keys.shard_of(child_id) == h.keys.shard_of(run.run_id)
    parent = await h.gateway.get_run(run.run_id)
    assert parent is not None and parent.status is RunStatus.AWAITING_APPROVAL

    assert (await h.gateway.decide(gate["gate_id"], "approve", by="U2")).applied
    done = await h.wait_finished(run.run_id, timeout=15)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "Billing says: refunded.")
    assert read_journal(str(journal)) == ["refund:7"]
    history = await h.history(run.run_id)
    assert tool_messages(history)[-1]["content"] == "Order 7 is refunded."
    child = await h.gateway.get_run(child_id)
    assert child is not None and child.status is RunStatus.COMPLETED
    # The parent's call is announced as executed, with the sub-agent's answer.
    executed = await h.wait_event(run.run_id, "tool.executed", tool="billing")
    assert executed.data["output"] == "Order 7 is refunded."
    assert executed.data["child_run"] == child_id


async def test_a_denial_goes_to_the_child_and_the_childs_answer_to_the_parent(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script(
        "refund 8 for me",
        [
            call("billing", {"task": "refund order 8"}),
            reply("billing refused", expect=told("I could not refund order 8")),
        ],
    )
    fake_openai.script(
        "refund order 8",
        [
            call("refund", {"order": 8}),
            reply(
                "I could not refund order 8: it was declined.",
                expect=told("declined", "Their reason: fraud check first"),
            ),
        ],
    )
    run = await h.gateway.start_run("refund 8 for me", requested_by="U1")
    _child, gate = await child_gate(h, run.run_id)
    await h.gateway.decide(gate["gate_id"], "deny", by="U2", reason="fraud check first")
    done = await h.wait_finished(run.run_id, timeout=15)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "billing refused")
    assert read_journal(str(journal)) == []


async def test_an_expiry_inside_the_child_is_reported_as_an_expiry(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    h = Harness(redis, core_settings(redis_url, fake_openai.base_url), desk)
    h.start_worker()
    h.workers[0][0].runners["billing"].approval_timeout = 0.5
    try:
        fake_openai.script(
            "refund 9 for me",
            [call("billing", {"task": "refund order 9"}), reply("nobody answered billing")],
        )
        fake_openai.script(
            "refund order 9",
            [
                call("refund", {"order": 9}),
                reply(
                    "The refund request timed out.",
                    expect=told("timed out", "Nobody declined it"),
                ),
            ],
        )
        run = await h.gateway.start_run("refund 9 for me", requested_by="U1")
        done = await h.wait_finished(run.run_id, timeout=15)
        assert done.final == "nobody answered billing"
        history = await h.history(run.run_id)
        assert tool_messages(history)[-1]["content"] == "The refund request timed out."
        assert read_journal(str(journal)) == []
    finally:
        await h.close()


async def test_the_parent_resumes_only_when_its_own_and_its_childs_gates_are_settled(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    def both(messages: list[dict[str, Any]]) -> None:
        assert [m["content"] for m in tool_messages(messages)] == [
            "user 5 deleted",
            "Refunded order 3.",
        ]

    fake_openai.script(
        "clean up 5 and refund 3",
        [
            calls([("delete_user", {"user_id": "5"}), ("billing", {"task": "refund order 3"})]),
            reply("all done", expect=both),
        ],
    )
    fake_openai.script("refund order 3", [call("refund", {"order": 3}), reply("Refunded order 3.")])
    run = await h.gateway.start_run("clean up 5 and refund 3", requested_by="U1")
    [own] = await h.opened_gates(run.run_id, 1)
    _child, nested = await child_gate(h, run.run_id)
    assert own.data["nested"] is False and own.data["path"] == ["desk"]
    await h.gateway.decide(own.data["gate_id"], "approve", by="U2")
    await asyncio.sleep(0.5)
    # Still paused: the approved call runs when the whole turn is settled.
    parent = await h.gateway.get_run(run.run_id)
    assert parent is not None and parent.status is RunStatus.AWAITING_APPROVAL
    assert read_journal(str(journal)) == []
    assert len(fake_openai.requests_for("clean up 5 and refund 3")) == 1
    await h.gateway.decide(nested["gate_id"], "approve", by="U2")
    done = await h.wait_finished(run.run_id, timeout=15)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "all done")
    assert sorted(read_journal(str(journal))) == ["delete_user:5", "refund:3"]


async def test_cancelling_the_parent_cancels_its_children_and_their_gates(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script("refund 4 for me", [call("billing", {"task": "refund order 4"})])
    fake_openai.script("refund order 4", [call("refund", {"order": 4})])
    run = await h.gateway.start_run("refund 4 for me", requested_by="U1")
    child_id, gate = await child_gate(h, run.run_id)
    await h.gateway.cancel_run(run.run_id, by="U1", reason="changed my mind")
    child = await h.wait_finished(child_id)
    assert child.status is RunStatus.CANCELLED
    # The child's report found its parent finished: the count stays at 0, never below.
    assert await h.redis.hget(h.keys.run(run.run_id), "children_pending") == "0"
    closed = await h.wait_event(child_id, "gate.decided", status="cancelled")
    assert closed.data["gate_id"] == gate["gate_id"]
    # A late click finds the gate closed; nothing runs.
    res = await h.gateway.decide(gate["gate_id"], "approve", by="U2")
    assert not res.applied
    await asyncio.sleep(0.3)
    assert read_journal(str(journal)) == []


async def test_a_failed_child_is_a_tool_error_for_the_parent(
    h: Harness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script(
        "ask billing something bad",
        [
            call("billing", {"task": "say something filtered"}),
            reply("billing failed", expect=told("sub-agent billing failed", "content filter")),
        ],
    )
    fake_openai.script("say something filtered", [filtered()])
    run = await h.gateway.start_run("ask billing something bad", requested_by="U1")
    done = await h.wait_finished(run.run_id, timeout=15)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "billing failed")


async def test_nesting_is_capped_with_a_clear_tool_error(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    for r in h.workers[0][0].runners.values():
        r.max_depth = 1
    fake_openai.script("book it", [call("billing", {"task": "book 5"}), reply("desk done")])
    fake_openai.script(
        "book 5",
        [
            call("ledger", {"task": "write off 5"}),
            reply("could not", expect=told("nest at most 1 deep", "Nothing ran")),
        ],
    )
    run = await h.gateway.start_run("book it", requested_by="U1")
    done = await h.wait_finished(run.run_id, timeout=15)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "desk done")
    assert read_journal(str(journal)) == []


async def test_three_levels_show_the_whole_path(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script("close the books", [call("billing", {"task": "book 6"}), reply("closed")])
    fake_openai.script("book 6", [call("ledger", {"task": "write off 6"}), reply("booked")])
    fake_openai.script("write off 6", [call("write_off", {"amount": 6}), reply("written")])
    run = await h.gateway.start_run("close the books", requested_by="U1")
    for _ in range(100):
        found = [
            e
            for e in await h.events(block_ms=100)
            if e.type.value == "gate.opened" and e.data["tool"] == "write_off"
        ]
        if found:
            break
    [gate] = found
    assert gate.data["path"] == ["desk", "billing", "ledger"]
    assert gate.data["origin"]["path"] == ["desk", "billing", "ledger"]
    await h.gateway.decide(gate.data["gate_id"], "approve", by="U2")
    done = await h.wait_finished(run.run_id, timeout=15)
    assert done.final == "closed"
    assert read_journal(str(journal)) == ["write_off:6"]
    history = await h.history(run.run_id)
    assert json.dumps(tool_messages(history)[-1]["content"]) == '"booked"'


async def test_a_worker_killed_while_the_childs_tool_runs_never_reruns_it(
    spawn: Callable[..., WorkerProcess],
    observer: Harness,
    fake_openai: FakeOpenAI,
    redis_url: str,
    journal: Path,
) -> None:
    fake_openai.script(
        "move 5 via billing",
        [
            call("billing", {"task": "transfer 5"}),
            reply("outcome unknown", expect=told("may not have gone through")),
        ],
    )
    fake_openai.script(
        "transfer 5",
        [
            call("transfer", {"amount": 5}),
            reply("The transfer may not have gone through.", expect=told("Outcome unknown")),
        ],
    )
    first = spawn(redis_url, AGENT="tests.agents:desk", TEST_SLOW_SECONDS="60")
    run = await observer.gateway.start_run("move 5 via billing", requested_by="U1", agent="desk")
    _child, gate = await child_gate(observer, run.run_id)
    await observer.gateway.decide(gate["gate_id"], "approve", by="U2")
    await wait_journal(journal, "transfer:start:5")
    first.kill()
    spawn(redis_url, AGENT="tests.agents:desk")
    done = await observer.wait_finished(run.run_id, timeout=30)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "outcome unknown")
    assert read_journal(str(journal)) == ["transfer:start:5"]


async def test_a_worker_killed_while_the_parent_waits_loses_nothing(
    spawn: Callable[..., WorkerProcess],
    observer: Harness,
    fake_openai: FakeOpenAI,
    redis_url: str,
    journal: Path,
) -> None:
    fake_openai.script(
        "refund 2 via billing",
        [call("billing", {"task": "refund order 2"}), reply("parent done")],
    )
    fake_openai.script("refund order 2", [call("refund", {"order": 2}), reply("refunded 2")])
    first = spawn(redis_url, AGENT="tests.agents:desk")
    run = await observer.gateway.start_run("refund 2 via billing", requested_by="U1", agent="desk")
    _child, gate = await child_gate(observer, run.run_id)
    first.kill()
    await observer.gateway.decide(gate["gate_id"], "approve", by="U2")
    spawn(redis_url, AGENT="tests.agents:desk")
    done = await observer.wait_finished(run.run_id, timeout=30)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "parent done")
    assert read_journal(str(journal)) == ["refund:2"]


async def test_a_child_whose_parent_was_cancelled_without_it_is_cancelled_before_acting(
    h: Harness, fake_openai: FakeOpenAI, journal: Path, redis: Redis
) -> None:
    """The state a crash between the parent's cancel and the cascade leaves: the parent is
    cancelled, its child still waits. The child's next step cancels it instead."""
    fake_openai.script("refund 11 for me", [call("billing", {"task": "refund order 11"})])
    fake_openai.script("refund order 11", [call("refund", {"order": 11}), reply("refunded")])
    run = await h.gateway.start_run("refund 11 for me", requested_by="U1")
    child_id, gate = await child_gate(h, run.run_id)
    await redis.hset(h.keys.run(run.run_id), mapping={"status": "cancelled", "cancelled_by": "U1"})
    await h.gateway.decide(gate["gate_id"], "approve", by="U2")
    child = await h.wait_finished(child_id)
    assert child.status is RunStatus.CANCELLED
    await asyncio.sleep(0.3)
    assert read_journal(str(journal)) == []
    # Never started, so never claimed: nobody is told it may have run.
    turn = await redis.hgetall(h.keys.turn(child_id, 1))
    states = {k: v for k, v in turn.items() if k.startswith("state:")}
    assert "claimed" not in states.values(), states


async def test_a_worker_frozen_past_its_lease_in_a_child_run_writes_nothing_when_it_wakes(
    spawn: Callable[..., WorkerProcess],
    observer: Harness,
    fake_openai: FakeOpenAI,
    redis: Redis,
    redis_url: str,
    journal: Path,
) -> None:
    """SIGSTOP a worker mid-tool in a sub-agent's run, past its lease: another worker takes
    the child over (the call in doubt, never rerun), the parent finishes, and the frozen one,
    woken, writes nothing."""
    fake_openai.script(
        "move 6 via billing",
        [call("billing", {"task": "transfer 6"}), reply("parent done")],
    )
    fake_openai.script(
        "transfer 6",
        [call("transfer", {"amount": 6}), reply("child done", expect=told("Outcome unknown"))],
    )
    env = {"AGENT": "tests.agents:desk", "WORKER_LEASE": "2", "TEST_SLOW_SECONDS": "4"}
    workers = [spawn(redis_url, **env), spawn(redis_url, **env)]
    run = await observer.gateway.start_run("move 6 via billing", requested_by="U1", agent="desk")
    child_id, gate = await child_gate(observer, run.run_id)
    await observer.gateway.decide(gate["gate_id"], "approve", by="U2")
    await wait_journal(journal, "transfer:start:6")
    owner = await redis.hget(observer.keys.run(child_id), "lease_owner") or ""
    frozen = next(w for w in workers if f"-{w.proc.pid}-" in owner)
    frozen.pause()
    try:
        done = await observer.wait_finished(run.run_id, timeout=30)
        assert (done.status, done.final) == (RunStatus.COMPLETED, "parent done")
    finally:
        frozen.resume()
    for _ in range(200):  # woken, its tool ends; its result must be refused
        if "discarded" in frozen.output():
            break
        await asyncio.sleep(0.05)
    assert "result of transfer discarded" in frozen.output(), frozen.output()
    assert read_journal(str(journal)).count("transfer:start:6") == 1
    history = await observer.history(run.run_id)
    assert tool_messages(history)[-1]["content"] == "child done"
