"""Approver rules: callbacks that decide a gated call before a person is asked."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent_core import Agent, GateStatus, RunStatus, approve, approver, deny
from agent_core.approvers import ApprovalRequest, Verdict, as_approver, consult
from agent_core.testing import FakeOpenAI, call, reply, tool_messages
from tests.agents import read_journal, ruled
from tests.core.harness import Harness

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def h(agent_harness: Callable[[Agent], Harness]) -> Harness:
    return agent_harness(ruled)


def told(*parts: str) -> Callable[[list[dict[str, Any]]], None]:
    def check(messages: list[dict[str, Any]]) -> None:
        text = tool_messages(messages)[-1]["content"]
        for p in parts:
            assert p in text, text

    return check


async def test_a_rule_approves_without_asking_anyone_and_is_recorded_as_the_decider(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script(
        "read users on staging",
        [
            call("read_table", {"env": "staging", "table": "users"}),
            reply(
                "3 rows",
                expect=told(
                    "users on staging: 3 rows",
                    "Approved by rule staging_reads: reads on staging are fine",
                ),
            ),
        ],
    )
    run = await h.gateway.start_run("read users on staging", requested_by="U1")
    done = await h.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "3 rows")
    assert read_journal(str(journal)) == ["read_table:staging:users"]
    [gate] = await h.gateway.gates(run.run_id)
    assert gate.status is GateStatus.APPROVED
    assert gate.decided_by == "rule:staging_reads"
    assert gate.reason == "reads on staging are fine"
    opened = await h.wait_event(run.run_id, "gate.opened")
    decided = await h.wait_event(run.run_id, "gate.decided")
    assert opened.data["decided_by"] == "rule:staging_reads"
    assert decided.data["status"] == "approved" and decided.data["rule"] == "staging_reads"
    # Decided as it was opened: the run never waited for a person.
    assert gate.decided_at == gate.created_at


async def test_a_rule_denies_with_a_reason_the_model_reads(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script(
        "delete the frozen user",
        [
            call("delete_user", {"user_id": "frozen"}),
            reply(
                "not now",
                expect=told(
                    "the approval rule freeze declined this call to delete_user",
                    "Its reason: change freeze until Monday",
                ),
            ),
        ],
    )
    run = await h.gateway.start_run("delete the frozen user", requested_by="U1")
    done = await h.wait_finished(run.run_id)
    assert done.final == "not now"
    assert read_journal(str(journal)) == []
    [gate] = await h.gateway.gates(run.run_id)
    assert (gate.status, gate.decided_by) == (GateStatus.DENIED, "rule:freeze")


async def test_rules_that_ask_raise_or_time_out_leave_the_call_to_a_person(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script(
        "read users on prod",
        [call("read_table", {"env": "prod", "table": "users"}), reply("read")],
    )
    run = await h.gateway.start_run("read users on prod", requested_by="U1")
    [opened] = await h.opened_gates(run.run_id, 1)
    assert "decided_by" not in opened.data
    assert await h.status(run.run_id) is RunStatus.AWAITING_APPROVAL
    [gate] = await h.gateway.pending_gates(run.run_id)
    assert gate.status is GateStatus.PENDING
    assert read_journal(str(journal)) == []
    await h.gateway.decide(gate.gate_id, "approve", by="U2")
    done = await h.wait_finished(run.run_id)
    assert done.final == "read"
    assert read_journal(str(journal)) == ["read_table:prod:users"]


async def test_one_turn_mixes_rule_decisions_and_a_persons(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    from agent_core.testing import calls

    def both(messages: list[dict[str, Any]]) -> None:
        texts = [m["content"] for m in tool_messages(messages)]
        assert texts[0].startswith("t on staging: 3 rows")
        assert "user 9 deleted" == texts[1]

    fake_openai.script(
        "two things",
        [
            calls(
                [
                    ("read_table", {"env": "staging", "table": "t"}),
                    ("delete_user", {"user_id": "9"}),
                ]
            ),
            reply("both", expect=both),
        ],
    )
    run = await h.gateway.start_run("two things", requested_by="U1")
    await h.opened_gates(run.run_id, 2)
    [pending] = await h.gateway.pending_gates(run.run_id)
    assert pending.tool == "delete_user"
    await h.gateway.decide(pending.gate_id, "approve", by="U2")
    done = await h.wait_finished(run.run_id)
    assert done.final == "both"
    assert sorted(read_journal(str(journal))) == ["delete_user:9", "read_table:staging:t"]


async def test_consult_takes_the_first_rule_with_an_opinion() -> None:
    seen: list[str] = []

    def first(c: ApprovalRequest) -> None:
        seen.append("first")

    async def second(c: ApprovalRequest) -> Verdict:
        seen.append("second")
        return deny("no")

    def third(c: ApprovalRequest) -> Verdict:
        seen.append("third")
        return approve()

    req = ApprovalRequest(tool="t", args={}, agent="a", run_id="r", requested_by="U1")
    got = await consult([as_approver(first), as_approver(second), as_approver(third)], req)
    assert got is not None and got[1] == "second" and got[0].reason == "no"
    assert seen == ["first", "second"]


def test_rules_are_checked_when_the_agent_is_defined() -> None:
    with pytest.raises(ValueError, match="needs a reason"):
        deny("  ")
    with pytest.raises(ValueError, match="must match"):
        approver(name="has spaces")(lambda c: None)
    with pytest.raises(ValueError, match="share a name"):
        Agent(name="x", instructions="", approvers=[approver(name="a")(lambda c: None)] * 2)
