"""Decisions beyond one click per call: gate order, approval reasons, decide by call id,
decide_many."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from agent_core import ArgsHashMismatch, Decision, GateNotFound, GateStatus, RunNotFound, RunStatus
from agent_core.testing import FakeOpenAI, calls, reply
from tests.agents import read_journal
from tests.core.harness import Harness, tool_contents


async def test_pending_gates_come_in_the_order_of_their_calls(
    harness: Harness, fake_openai: FakeOpenAI, redis: Redis
) -> None:
    fake_openai.script(
        "three",
        [
            calls(
                [
                    ("delete_user", {"user_id": "c"}),
                    ("lookup", {"key": "k"}),  # not gated: the gates' positions skip it
                    ("delete_user", {"user_id": "a"}),
                    ("delete_user", {"user_id": "b"}),
                ]
            )
        ],
    )
    run = await harness.gateway.start_run("three", requested_by="U1")
    opened = await harness.opened_gates(run.run_id, 3)
    assert [e.data["index"] for e in opened] == [0, 2, 3]
    assert {e.data["turn_gates"] for e in opened} == {3}
    # All three share one created_at: only the stored position orders them.
    for _ in range(5):
        pending = await harness.gateway.pending_gates(run.run_id)
        assert [g.args["user_id"] for g in pending] == ["c", "a", "b"]
        assert [g.index for g in pending] == [0, 2, 3]
        assert [g.gate_id for g in await harness.gateway.gates(run.run_id)] == [
            g.gate_id for g in pending
        ]
    # A gate opened by an older core has no position: it comes after the others.
    first = pending[0]
    await redis.hdel(harness.keys.gate(first.gate_id), "index")
    again = await harness.gateway.pending_gates(run.run_id)
    assert [g.args["user_id"] for g in again] == ["a", "b", "c"]
    assert again[-1].index is None
    await harness.gateway.cancel_run(run.run_id, by="U1")


async def test_an_approval_reason_reaches_the_model(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    told: list[str] = []

    def saw_reason(messages: list[dict[str, Any]]) -> None:
        told.extend(tool_contents(messages))

    fake_openai.script(
        "approve with reason",
        [
            calls([("delete_user", {"user_id": "42"}), ("delete_user", {"user_id": "43"})]),
            reply("done", expect=saw_reason),
        ],
    )
    run = await harness.gateway.start_run("approve with reason", requested_by="U1")
    await harness.opened_gates(run.run_id, 2)
    g42, g43 = await harness.gateway.pending_gates(run.run_id)
    res = await harness.gateway.decide(
        g42.gate_id, Decision.APPROVE, by="U2", reason="  checked with the owner  "
    )
    assert res.applied and res.gate.status is GateStatus.APPROVED
    await harness.gateway.decide(g43.gate_id, Decision.APPROVE, by="U3")
    assert (await harness.wait_finished(run.run_id)).status is RunStatus.COMPLETED
    assert told == [
        "user 42 deleted\n\nApproved by U2: checked with the owner",
        "user 43 deleted",  # no reason, no extra line
    ]
    executed = [e for e in await harness.events() if e.type.value == "tool.executed"]
    assert [e.data["output"] for e in executed] == ["user 42 deleted", "user 43 deleted"]
    assert read_journal(str(journal)) == ["delete_user:42", "delete_user:43"]


async def test_decide_by_call_id(harness: Harness, fake_openai: FakeOpenAI, journal: Path) -> None:
    fake_openai.script(
        "by call",
        [
            calls(
                [
                    ("delete_user", {"user_id": "1"}, "call_a"),
                    ("lookup", {"key": "x"}, "call_b"),
                    ("delete_user", {"user_id": "2"}, "call_c"),
                ]
            ),
            reply("done"),
        ],
    )
    gw = harness.gateway
    run = await gw.start_run("by call", requested_by="U1")
    await harness.opened_gates(run.run_id, 2)
    with pytest.raises(GateNotFound, match="needed no approval"):
        await gw.decide_call(run.run_id, "call_b", Decision.APPROVE, by="U2")
    with pytest.raises(GateNotFound, match="no call"):
        await gw.decide_call(run.run_id, "call_zz", Decision.APPROVE, by="U2")
    with pytest.raises(GateNotFound):
        await gw.decide_call(run.run_id, "", Decision.APPROVE, by="U2")
    with pytest.raises(RunNotFound):
        await gw.decide_call("r-000000000000", "call_a", Decision.APPROVE, by="U2")
    with pytest.raises(RunNotFound):
        await gw.decide_call("not a run", "call_a", Decision.APPROVE, by="U2")

    c = await gw.decide_call(run.run_id, "call_c", "deny", by="U2", reason="not this one")
    assert c.applied and c.gate.call_id == "call_c" and c.gate.status is GateStatus.DENIED
    [first] = await gw.pending_gates(run.run_id)
    with pytest.raises(ArgsHashMismatch):
        await gw.decide_call(run.run_id, "call_a", "approve", by="U3", args_hash="0" * 64)
    a = await gw.decide_call(
        run.run_id, "call_a", Decision.APPROVE, by="U3", args_hash=first.args_hash
    )
    assert a.applied and a.gate.gate_id == first.gate_id and a.gate.call_id == "call_a"
    again = await gw.decide_call(run.run_id, "call_c", Decision.APPROVE, by="U4")
    assert not again.applied and again.gate.decided_by == "U2"
    assert (await harness.wait_finished(run.run_id)).status is RunStatus.COMPLETED
    # The un-gated lookup ran as the turn began; the approved call once, after its decision.
    assert read_journal(str(journal)) == ["lookup:x", "delete_user:1"]


async def test_decide_many_leaves_what_others_decided(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path, redis: Redis
) -> None:
    told: list[str] = []
    fake_openai.script(
        "many",
        [
            calls([("delete_user", {"user_id": str(i)}) for i in (1, 2, 3)]),
            reply("done", expect=lambda messages: told.extend(tool_contents(messages))),
        ],
    )
    gw = harness.gateway
    run = await gw.start_run("many", requested_by="U1")
    await harness.opened_gates(run.run_id, 3)
    gates = await gw.pending_gates(run.run_id)
    ids = [g.gate_id for g in gates]

    with pytest.raises(GateNotFound, match="nothing was decided"):
        await gw.decide_many([ids[0], "00" + "x" * 22], Decision.APPROVE, by="U2")
    assert len(await gw.pending_gates(run.run_id)) == 3

    await gw.decide(ids[1], Decision.DENY, by="U9", reason="keep user 2")
    results = await gw.decide_many(ids, Decision.APPROVE, by="U2", reason="all fine")
    assert [(r.applied, r.status, r.gate.decided_by) for r in results] == [
        (True, GateStatus.APPROVED, "U2"),
        (False, GateStatus.DENIED, "U9"),
        (True, GateStatus.APPROVED, "U2"),
    ]
    assert [r.gate.gate_id for r in results] == ids
    assert results[1].gate.reason == "keep user 2"  # not overwritten
    assert await gw.decide_many([], Decision.APPROVE, by="U2") == []

    assert (await harness.wait_finished(run.run_id)).status is RunStatus.COMPLETED
    assert sorted(read_journal(str(journal))) == ["delete_user:1", "delete_user:3"]
    # One start job and one resume: the run resumed once, after the last decision.
    jobs = harness.keys.jobs(harness.keys.shard_of(run.run_id))
    assert (await redis.xinfo_stream(jobs))["entries-added"] == 2
    assert told[0] == "user 1 deleted\n\nApproved by U2: all fine"
    assert told[1].startswith("Not executed: the user U9 declined this call to delete_user.")
    assert "keep user 2" in told[1]
    assert told[2] == "user 3 deleted\n\nApproved by U2: all fine"
    again = await gw.decide_many(ids, Decision.DENY, by="U3")
    assert [r.applied for r in again] == [False, False, False]
