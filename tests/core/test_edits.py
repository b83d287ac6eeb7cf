"""Edit, then approve (agent_core.editing): the edited call is what runs and what the model
reads; an invalid or unallowed edit decides nothing; a crash never runs the original."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent_core import (
    Agent,
    GateStatus,
    InvalidEdit,
    RunStatus,
    ToolDefinitionError,
    approve_edited,
    tool,
)
from agent_core.audit import entries
from agent_core.editing import changes, check_args
from agent_core.gating import args_hash
from agent_core.testing import FakeOpenAI, call, reply, tool_messages
from tests.agents import editing, read_journal, told_exactly
from tests.core.harness import Harness
from tests.core.workers import WorkerProcess, wait_journal

pytestmark = pytest.mark.timeout(60)

ORIGINAL = {
    "order_id": "A-7",
    "amount_cents": 4900,
    "reason": "other",
    "notify": True,
    "tags": None,
}


@pytest.fixture
async def h(agent_harness: Callable[[Agent], Harness]) -> Harness:
    return agent_harness(editing)


def canon(args: dict[str, Any]) -> str:
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


async def _open(h: Harness, fake_openai: FakeOpenAI, task: str, *steps: Any) -> tuple[str, str]:
    fake_openai.script(task, list(steps))
    run = await h.gateway.start_run(task, requested_by="U1")
    [g] = await h.opened_gates(run.run_id, 1)
    return run.run_id, g.data["gate_id"]


async def test_an_edit_changes_what_runs_and_what_the_model_reads(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    edited = {**ORIGINAL, "amount_cents": 2500, "reason": "late"}
    expected = (
        "refunded 2500 on A-7 (late)\n\nApproved by U2 with edited arguments: "
        f"{canon(edited)}; the original request was {canon(ORIGINAL)}."
    )
    run_id, gid = await _open(
        h,
        fake_openai,
        "refund A-7",
        call("refund_order", {"order_id": "A-7", "amount_cents": 4900}),
        reply("refunded", expect=told_exactly(expected)),
    )
    gate = await h.gateway.get_gate(gid)
    assert gate is not None
    assert gate.editable == ["amount_cents", "reason", "notify", "tags"]
    assert gate.args_schema is not None and gate.args_schema["additionalProperties"] is False
    res = await approve_edited(h.gateway, gid, "U2", edited, args_hash=gate.args_hash)
    assert res.applied and res.status is GateStatus.APPROVED
    g = res.gate
    assert (g.args, g.args_hash) == (ORIGINAL, gate.args_hash)  # the original is kept
    assert (g.edited_args, g.edited_by) == (edited, "U2")
    assert g.edited_hash == args_hash(edited) == g.decided_hash != g.args_hash
    assert changes(g) == [("amount_cents", "4900", "2500"), ("reason", '"other"', '"late"')]
    ev = await h.wait_event(run_id, "gate.decided")
    assert ev.data["edited"] is True
    assert (ev.data["args_hash"], ev.data["edited_hash"]) == (g.args_hash, g.edited_hash)
    done = await h.wait_finished(run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "refunded")
    assert read_journal(str(journal)) == ["refund_order:A-7:2500:late:True"]
    # The audit trail records the approval with both hashes.
    shard = h.keys.shard_of(gid)
    trail = [e async for e in entries(h.redis, h.keys, shard) if e.get("gate_id") == gid]
    assert [e.kind for e in trail] == ["opened", "approved", "executed"]
    approved = trail[1]
    assert (approved.get("by"), approved.get("args_hash")) == ("U2", g.args_hash)
    assert approved.get("edited_hash") == g.edited_hash


async def test_an_invalid_edit_is_refused_per_field_and_decides_nothing(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    run_id, gid = await _open(
        h,
        fake_openai,
        "refund A-7 again",
        call("refund_order", {"order_id": "A-7", "amount_cents": 4900}),
        reply("ok"),
    )
    bad = [
        ({**ORIGINAL, "amount_cents": "2500"}, {"amount_cents": "must be integer"}),
        ({**ORIGINAL, "amount_cents": True}, {"amount_cents": "must be integer"}),
        ({**ORIGINAL, "reason": "whim"}, {"reason": 'must be one of "damaged", "late", "other"'}),
        ({**ORIGINAL, "order_id": "B-1"}, {"order_id": "cannot be edited"}),
        ({**ORIGINAL, "extra": 1}, {"extra": "cannot be edited"}),
        ({k: v for k, v in ORIGINAL.items() if k != "notify"}, {"notify": "is required"}),
        (
            {**ORIGINAL, "tags": ["\ud800"]},
            {"": "the arguments must be JSON text that is valid Unicode"},
        ),
        ({**ORIGINAL, "tags": ["x" * 70_000]}, {"": "the edited arguments are over 64,000 bytes"}),
    ]
    for edit, errors in bad:
        with pytest.raises(InvalidEdit) as caught:
            await approve_edited(h.gateway, gid, "U2", edit)
        assert caught.value.errors == errors
    gate = await h.gateway.get_gate(gid)
    assert gate is not None and gate.status is GateStatus.PENDING and gate.edited_args is None
    assert await h.status(run_id) is RunStatus.AWAITING_APPROVAL
    assert read_journal(str(journal)) == []


async def test_a_tool_without_editable_and_a_quorum_gate_refuse_edits(
    h: Harness, fake_openai: FakeOpenAI
) -> None:
    _, gid = await _open(
        h, fake_openai, "delete 5", call("delete_user", {"user_id": "5"}), reply("ok")
    )
    gate = await h.gateway.get_gate(gid)
    assert gate is not None and gate.editable == [] and gate.args_schema is None
    with pytest.raises(InvalidEdit, match="delete_user does not allow edits"):
        await approve_edited(h.gateway, gid, "U2", {"user_id": "6"})
    # The script refuses too, whatever a caller sends it.
    res, _ = await h.gateway.scripts.decide_gate(
        gid,
        gate.run_id,
        "approved",
        by="U2",
        reason="",
        attempt="a1",
        seen_hash="",
        edit=(canon({"user_id": "6"}), args_hash({"user_id": "6"})),
    )
    assert (res.outcome.value, res.why) == ("refused", "not_editable")
    _, qid = await _open(h, fake_openai, "wire 9", call("big_wire", {"amount": 9}), reply("ok"))
    quorum_gate = await h.gateway.get_gate(qid)
    assert quorum_gate is not None and quorum_gate.editable == ["amount"]
    with pytest.raises(InvalidEdit, match="several approvals"):
        await approve_edited(h.gateway, qid, "U2", {"amount": 1})
    res, _ = await h.gateway.scripts.decide_gate(
        qid,
        quorum_gate.run_id,
        "approved",
        by="U2",
        reason="",
        attempt="a2",
        seen_hash="",
        edit=(canon({"amount": 1}), args_hash({"amount": 1})),
    )
    assert (res.outcome.value, res.why) == ("refused", "quorum")
    for g in (gid, qid):
        after = await h.gateway.get_gate(g)
        assert after is not None and after.status is GateStatus.PENDING and not after.approvals


async def test_a_requester_cannot_approve_an_edit_when_self_approval_is_off(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    _, gid = await _open(
        h,
        fake_openai,
        "refund A-9",
        call("refund_order", {"order_id": "A-9", "amount_cents": 4900}),
        reply("ok"),
    )
    edit = {**ORIGINAL, "order_id": "A-9", "amount_cents": 100}
    res = await approve_edited(h.gateway, gid, "U1", edit, allow_self_approval=False)
    assert (res.applied, res.refused) == (False, "requester")
    assert res.gate.status is GateStatus.PENDING and res.gate.edited_args is None


async def test_an_edit_after_the_decision_is_not_applied(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    run_id, gid = await _open(
        h,
        fake_openai,
        "refund A-10",
        call("refund_order", {"order_id": "A-10", "amount_cents": 4900}),
        reply("ok"),
    )
    assert (await h.gateway.decide(gid, "approve", by="U2")).applied
    late = await approve_edited(
        h.gateway, gid, "U3", {**ORIGINAL, "order_id": "A-10", "amount_cents": 1}
    )
    assert not late.applied and late.gate.edited_args is None
    await h.wait_finished(run_id)
    assert read_journal(str(journal)) == ["refund_order:A-10:4900:other:True"]


async def test_a_sub_agents_task_can_be_edited(h: Harness, fake_openai: FakeOpenAI) -> None:
    fake_openai.script(
        "ask the researcher",
        [
            call("researcher", {"task": "find the CEO of Acme"}),
            reply(
                "done",
                expect=told_exactly(
                    "The CFO of Acme is Ada.\n\nApproved by U2 with edited arguments: "
                    '{"task":"find the CFO of Acme"}; the original request was '
                    '{"task":"find the CEO of Acme"}.'
                ),
            ),
        ],
    )
    # Only the edited task is scripted: the original one would fail the child's model call.
    fake_openai.script("find the CFO of Acme", [reply("The CFO of Acme is Ada.")])
    run = await h.gateway.start_run("ask the researcher", requested_by="U1")
    [g] = await h.opened_gates(run.run_id, 1)
    res = await approve_edited(h.gateway, g.data["gate_id"], "U2", {"task": "find the CFO of Acme"})
    assert res.applied and res.gate.edited_args == {"task": "find the CFO of Acme"}
    done = await h.wait_finished(run.run_id, timeout=20)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "done")


def test_editable_names_must_be_parameters() -> None:
    with pytest.raises(ToolDefinitionError, match=r"editable names \['amount'\]"):

        @tool(requires_approval=True, editable=["amount"])
        def pay(amount_cents: int) -> str:
            return ""

    @tool(requires_approval=True, editable=True)
    def pay2(to: str, amount_cents: int = 0) -> str:
        return ""

    assert pay2.editable == ("to", "amount_cents")

    @tool(requires_approval=True)
    def pay3(to: str) -> str:
        return ""

    assert pay3.editable == ()


def test_the_schema_check_is_strict() -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 1, "maximum": 10},
            "x": {"type": "number", "exclusiveMaximum": 1},
            "s": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]},
            "k": {"$ref": "#/$defs/Kind"},
            "items": {"type": "array", "items": {"type": "integer"}},
        },
        "$defs": {"Kind": {"enum": ["a", "b"], "type": "string"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    assert check_args(schema, {"n": 3, "x": 0.5, "s": None, "k": "a", "items": [1]}) == {}
    assert check_args(schema, {"n": 0}) == {"n": "must be at least 1"}
    assert check_args(schema, {"n": 2.0}) == {"n": "must be integer"}
    assert check_args(schema, {"n": 1, "x": True}) == {"x": "must be number"}
    assert check_args(schema, {"n": 1, "x": 1}) == {"x": "must be less than 1"}
    assert check_args(schema, {"n": 1, "s": "long"}) == {"s": "must have at most 3 characters"}
    assert check_args(schema, {"n": 1, "s": 5}) == {"s": "must be string or null"}
    assert check_args(schema, {"n": 1, "k": "c"}) == {"k": 'must be one of "a", "b"'}
    assert check_args(schema, {"n": 1, "items": [1, "2"]}) == {"items": "item 1: must be integer"}
    assert check_args(schema, {"z": 1}) == {
        "n": "is required",
        "z": "is not a parameter of this tool",
    }
    assert check_args(schema, []) == {"": "the arguments must be a JSON object"}


async def test_worker_killed_between_an_edited_approval_and_the_claim_runs_the_edit_once(
    spawn: Callable[..., WorkerProcess],
    observer: Harness,
    fake_openai: FakeOpenAI,
    redis_url: str,
    journal: Path,
) -> None:
    fake_openai.script(
        "kill resize",
        [
            call("resize_disk", {"disk": "d1", "size_gb": 500}),
            reply(
                "resized", expect=lambda m: "disk d1 is 50 GB" in tool_messages(m)[-1]["content"]
            ),
        ],
    )
    first = spawn(redis_url, AGENT="tests.agents:editing")
    run2 = await observer.gateway.start_run("kill resize", requested_by="U1", agent="editing")
    [g2] = await observer.opened_gates(run2.run_id, 1)
    first.pause()  # frozen before it can take the resume job: killed between decision and claim
    res = await approve_edited(
        observer.gateway, g2.data["gate_id"], "U2", {"disk": "d1", "size_gb": 50}
    )
    assert res.applied
    first.kill()
    spawn(redis_url, AGENT="tests.agents:editing")
    done = await observer.wait_finished(run2.run_id, timeout=20)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "resized")
    assert read_journal(str(journal)) == ["resize_disk:start:d1:50", "resize_disk:end:d1:50"]


async def test_an_edited_idempotent_call_left_in_doubt_runs_the_edit_again_never_the_original(
    spawn: Callable[..., WorkerProcess],
    observer: Harness,
    fake_openai: FakeOpenAI,
    redis_url: str,
    journal: Path,
) -> None:
    fake_openai.script(
        "kill resize mid-run",
        [
            call("resize_disk", {"disk": "d2", "size_gb": 900}),
            reply("ok", expect=lambda m: "disk d2 is 90 GB" in tool_messages(m)[-1]["content"]),
        ],
    )
    first = spawn(redis_url, AGENT="tests.agents:editing", TEST_SLOW_SECONDS="60")
    run = await observer.gateway.start_run(
        "kill resize mid-run", requested_by="U1", agent="editing"
    )
    [g] = await observer.opened_gates(run.run_id, 1)
    edit = {"disk": "d2", "size_gb": 90}
    assert (await approve_edited(observer.gateway, g.data["gate_id"], "U2", edit)).applied
    await wait_journal(journal, "resize_disk:start:d2:90")
    first.kill()
    spawn(redis_url, AGENT="tests.agents:editing")
    done = await observer.wait_finished(run.run_id, timeout=20)
    assert done.status is RunStatus.COMPLETED
    assert read_journal(str(journal)) == [
        "resize_disk:start:d2:90",
        "resize_disk:start:d2:90",
        "resize_disk:end:d2:90",
    ]


async def test_edited_arguments_changed_after_the_decision_never_run(
    spawn: Callable[..., WorkerProcess],
    observer: Harness,
    fake_openai: FakeOpenAI,
    redis_url: str,
    journal: Path,
) -> None:
    fake_openai.script(
        "tampered",
        [
            call("resize_disk", {"disk": "d3", "size_gb": 500}),
            reply(
                "not run",
                expect=told_exactly(
                    "Not executed: the approver edited the arguments of this call to "
                    "resize_disk, and the edited arguments are not valid (they do not hash to "
                    "the approved arguments), so nothing ran."
                ),
            ),
        ],
    )
    first = spawn(redis_url, AGENT="tests.agents:editing")
    run = await observer.gateway.start_run("tampered", requested_by="U1", agent="editing")
    [g] = await observer.opened_gates(run.run_id, 1)
    first.pause()
    gid = g.data["gate_id"]
    res = await approve_edited(observer.gateway, gid, "U2", {"disk": "d3", "size_gb": 50})
    assert res.applied
    # Someone with write access to Redis changes the edit after the decision: it must not run.
    key = observer.gateway.keys.gate(gid)
    await observer.redis.hset(key, "edited_args", canon({"disk": "d3", "size_gb": 5000}))
    first.kill()
    spawn(redis_url, AGENT="tests.agents:editing")
    done = await observer.wait_finished(run.run_id, timeout=20)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "not run")
    assert read_journal(str(journal)) == []
