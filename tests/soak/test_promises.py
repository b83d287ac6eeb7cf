"""The soak's own checks of the newer promises (``promises.py``) catch what they claim to:
each is fed a gate that breaks it, and one that keeps it. No Redis, no processes (not part
of ``make soak``'s run: ``pytest tests/soak/test_promises.py``)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

from redis.asyncio import Redis

from agent_core import Keys
from agent_core.audit import encode
from agent_core.grants import Grant
from tests.soak.config import APPROVER, APPROVER2, ESCALATE_TO, FIN_GROUP, REQUESTER
from tests.soak.editors import NOT_WHOLE, Revoke
from tests.soak.people import Click, GateRecord
from tests.soak.promises import Facts, GateView, JournalLine, Promises

OP = "1.0.0.0"


class Checks(Promises):
    def __init__(self) -> None:
        self.counts = Counter()
        self.nudge_events = {}
        self.approval_events = Counter()
        self.bot_out = []
        self.orphans = set()
        self.revokes = []
        self.edit_grant_problems = []


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


async def test_an_edited_call_run_as_the_model_wrote_it_or_decided_without_its_edit_is_a_violation() -> (
    None
):
    c = Checks()
    edited = {"edited_by": APPROVER, "decided_by": APPROVER, "edited_hash": "E"}
    keeps = gate("adjust", **edited, decided_hash="E")
    assert not await c.check_edits(facts(keeps, [JournalLine("start", "adjust", OP, 1, "E")]))
    assert await c.check_edits(facts(keeps, [JournalLine("start", "adjust", OP, 1, "H")]))
    assert await c.check_edits(facts(gate("adjust", **edited)))  # decided_hash is the original's
    assert await c.check_edits(facts(gate("act", **edited, decided_hash="E")))  # not editable


async def test_an_invalid_edit_that_decided_or_was_not_refused_is_a_violation() -> None:
    c = Checks()
    refused = json.dumps({"response_action": "errors", "errors": {"arg:amount": NOT_WHOLE}})

    def invalid(answer: str, decided_at: str) -> GateView:
        view = gate("adjust", decided_by=APPROVER, decided_at=decided_at)
        view.rec.clicks.append(
            Click("edit-invalid", APPROVER, 0.0, 200, "", 0.0, acked_unix=9.0, answer=answer)
        )
        return view

    assert not await c.check_invalid_edits(facts(invalid(refused, "10.0")))
    assert await c.check_invalid_edits(facts(invalid(refused, "8.0")))  # decided before the answer
    assert await c.check_invalid_edits(facts(invalid("", "10.0")))  # accepted while pending
    ended = invalid("", "8.0")  # sent once the gate had ended: the form closes, nothing decided
    ended.h["decided_by"] = ""  # it expired
    assert not await c.check_invalid_edits(facts(ended))


class Grants(Checks):
    def __init__(self, grants: dict[str, Grant]) -> None:
        super().__init__()
        self.grants = grants

    async def grant_record(self, grant_id: str) -> Grant | None:
        return self.grants.get(grant_id)


def a_grant(**kw: Any) -> Grant:
    base: dict[str, Any] = {
        "grant_id": "r1.abc",
        "scope": "r1",
        "agent": "soak",
        "tool": "ship",
        "approvers": [],
        "field": "env",
        "value": "staging",
        "expires_at": 20.0,
        "granted_by": APPROVER,
        "gate_id": "g0",
        "created_at": 10.0,
        "note": "",
    }
    return Grant(**(base | kw))


async def test_a_gate_decided_by_a_grant_of_another_thread_constraint_or_time_is_a_violation() -> (
    None
):
    by = {"decided_by": "grant:r1.abc", "grant_id": "r1.abc", "granted_by": APPROVER}
    call = {"agent": "soak", "args": {"op": OP, "env": "staging"}, "created_at": "12.0"}
    view = gate("ship", **by, **call)
    assert not await Grants({"r1.abc": a_grant()}).check_grant_decisions(facts(view))
    for wrong in (
        {"scope": "r2"},
        {"value": "prod"},
        {"tool": "act"},
        {"expires_at": 11.0},
        {"revoked_at": 11.5, "revoked_by": APPROVER2},
        {"granted_by": REQUESTER},
    ):
        got = await Grants({"r1.abc": a_grant(**wrong)}).check_grant_decisions(facts(view))
        assert got, wrong
    assert await Grants({}).check_grant_decisions(facts(view))


async def test_check_deciders_accepts_a_grant_and_a_rule_as_deciders() -> None:
    c = Checks()
    assert not await c.check_deciders(facts(gate("ship", decided_by="grant:r1.abc")))
    assert not await c.check_deciders(facts(gate("act", decided_by="rule:readonly")))


async def test_a_grant_by_the_requester_or_a_revoke_not_done_is_a_violation() -> None:
    made = gate("ship", decided_by=APPROVER, granted="r1.abc")
    made.rec.gate_id = "g0"
    assert not await Grants({"r1.abc": a_grant()}).check_grants_made(facts(made))
    by_requester = gate("ship", decided_by=REQUESTER, granted="r1.abc")
    by_requester.rec.gate_id = "g0"
    bad = Grants({"r1.abc": a_grant(granted_by=REQUESTER)})
    assert await bad.check_grants_made(facts(by_requester))
    c = Grants({"r1.abc": a_grant()})
    c.revokes = [Revoke("r1.abc", APPROVER2, 11.0, 200, "🔒 Revoked the grant for `ship`")]
    assert await c.check_grants_made(facts(made))
    c = Grants({"r1.abc": a_grant(revoked_at=11.0, revoked_by=APPROVER2)})
    c.revokes = [Revoke("r1.abc", APPROVER2, 11.0, 200, "🔒 Revoked the grant for `ship`")]
    assert not await c.check_grants_made(facts(made))


async def append(
    redis: Redis, keys: Keys, shard: int, kind: str, gate_id: str, **more: str
) -> None:
    """An audit entry chained as include/audit.lua chains it."""
    head = await redis.hgetall(keys.audit_head(shard))
    fields = [("kind", kind), ("gate_id", gate_id)]
    fields += [(k, "") for k in ("run_id", "call_id", "tool", "args_hash", "by", "at", "reason")]
    fields += [("more", json.dumps(more) if more else ""), ("prev", head.get("hash", ""))]
    entry_id = await redis.xadd(keys.audit(shard), dict(fields))
    digest = hashlib.sha1(encode(entry_id, fields)).hexdigest()
    await redis.hset(keys.audit_head(shard), mapping={"id": entry_id, "hash": digest})


async def test_an_audit_trail_altered_or_missing_an_outcome_or_a_decision_is_a_violation(
    redis: Redis,
) -> None:
    c = Checks()
    c.keys, c.redis = Keys("soakaudit", shards=1), redis
    (shard,) = c.keys.all_shards()
    ran = [JournalLine("start", "act", OP, 1, "H")]
    for kind in ("opened", "approved", "executed"):
        await append(redis, c.keys, shard, kind, "g1")
    assert not await c.check_audit_trail(facts(gate("act"), ran))
    assert c.counts["audit entries verified"] == 3
    assert await c.check_audit_trail(facts(gate("act", status="denied"), ran)) == []
    await append(redis, c.keys, shard, "executed", "g1")  # an outcome twice
    assert await c.check_audit_trail(facts(gate("act"), ran))
    await redis.delete(c.keys.audit(shard), c.keys.audit_head(shard))
    for kind in ("opened", "executed"):  # no decision
        await append(redis, c.keys, shard, kind, "g1")
    assert await c.check_audit_trail(facts(gate("act"), ran))
    await redis.delete(c.keys.audit(shard), c.keys.audit_head(shard))
    for kind in ("opened", "approved"):  # ran, no outcome
        await append(redis, c.keys, shard, kind, "g1")
    assert await c.check_audit_trail(facts(gate("act"), ran))
    # A sub-agent call whose child run has not ended has no outcome yet.
    assert not await c.check_audit_trail(facts(gate("helper_gated"), ran))
    # An entry altered in Redis breaks the chain.
    await append(redis, c.keys, shard, "executed", "g1")
    assert not await c.check_audit_trail(facts(gate("act"), ran))
    first = (await redis.xrange(c.keys.audit(shard)))[0][0]
    await redis.xdel(c.keys.audit(shard), first)
    await append(redis, c.keys, shard, "opened", "g1")
    problems = await c.check_audit_trail(facts(gate("act"), ran))
    assert any("does not follow" in p for p in problems), problems
