"""The soak's own checks of the newer promises (``promises.py``) catch what they claim to:
each is fed a gate that breaks it, and one that keeps it. No Redis, no processes (not part
of ``make soak``'s run: ``pytest tests/soak/test_promises.py``)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from tests.soak.config import APPROVER, APPROVER2, ESCALATE_TO, FIN_GROUP, REQUESTER
from tests.soak.people import GateRecord
from tests.soak.promises import Facts, GateView, JournalLine, Promises

OP = "1.0.0.0"


class Checks(Promises):
    def __init__(self) -> None:
        self.counts = Counter()
        self.nudge_events = {}
        self.approval_events = Counter()
        self.bot_out = []
        self.orphans = set()


def gate(tool: str, **h: Any) -> GateView:
    base = {"status": "approved", "decided_at": "10.0", "args_hash": "H", "decided_hash": "H"}
    base |= {k: v if isinstance(v, str) else json.dumps(v) for k, v in h.items()}
    return GateView(GateRecord("g1", "r1", OP, tool, "approve", 0.0), base)


def facts(view: GateView, journal: list[JournalLine] | None = None) -> Facts:
    return Facts({"g1": view}, {}, journal or [], [])


async def test_a_call_run_with_other_arguments_than_decided_is_a_violation() -> None:
    c = Checks()
    ran = [JournalLine("start", "act", OP, 1, "X")]
    assert await c.check_executed_hash(facts(gate("act"), ran))
    ran = [JournalLine("start", "act", OP, 1, "H")]
    assert not await c.check_executed_hash(facts(gate("act"), ran))


async def test_a_decision_off_the_gate_list_or_before_the_escalation_is_a_violation() -> None:
    c = Checks()
    pay = {"approvers": [FIN_GROUP], "escalate_to": [ESCALATE_TO]}
    assert await c.check_deciders(facts(gate("pay", decided_by=APPROVER2, **pay)))
    early = gate("pay", decided_by=ESCALATE_TO, escalated_at="11.0", **pay)
    assert await c.check_deciders(facts(early))
    after = gate("pay", decided_by=ESCALATE_TO, escalated_at="9.0", **pay)
    assert not await c.check_deciders(facts(after))
    assert await c.check_deciders(facts(gate("act", decided_by=REQUESTER)))
    outsider = [{"by": ESCALATE_TO, "at": "9", "hash": "H"}]
    assert await c.check_deciders(facts(gate("vote", approvals=outsider, status="expired")))


async def test_a_quorum_gate_approved_by_one_or_ended_with_its_quorum_met_is_a_violation() -> None:
    c = Checks()
    one = [{"by": APPROVER, "at": "9", "hash": "H"}]
    two = [*one, {"by": APPROVER2, "at": "10", "hash": "H"}]
    assert await c.check_quorums(facts(gate("vote", approvals=one, decided_by=APPROVER)))
    assert await c.check_quorums(facts(gate("vote", approvals=two, status="expired")))
    assert not await c.check_quorums(facts(gate("vote", approvals=two, decided_by=APPROVER2)))


async def test_a_second_reminder_or_one_after_the_decision_is_a_violation() -> None:
    c = Checks()
    c.nudge_events = {"g1": [("gate.reminded", 5.0, "e1")]}
    assert not await c.check_nudges(facts(gate("wire")))
    c.nudge_events = {"g1": [("gate.reminded", 11.0, "e1")]}
    assert await c.check_nudges(facts(gate("wire")))
    c.nudge_events = {"g1": [("gate.reminded", 5.0, "e1"), ("gate.reminded", 6.0, "e2")]}
    assert await c.check_nudges(facts(gate("wire")))
