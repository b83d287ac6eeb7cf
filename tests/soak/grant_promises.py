"""The verdict's checks of edits, grants and the audit trail (part of
:class:`tests.soak.promises.Promises`, listed in its :data:`~tests.soak.promises.PROMISES`).

- an edited call ran with the edited arguments (its journal hash is the gate's
  ``edited_hash``, which is its ``decided_hash``), never with the original ones;
- an invalid edit decided nothing (it was answered with the field's error, and the gate was
  decided only after that answer, if by that person);
- a gate a grant decided (``decided_by`` = ``grant:<id>``) matches a grant of its thread's top
  run, agent, tool, approvers and constraint that was live when it opened (not revoked or
  expired before), made by someone other than the call's requester; grants are made only by
  approvers, on the gates that record them, and each acknowledged Revoke ended its grant;
- the audit trail: every shard's chain verifies (``agent_core.audit.verify_shard``), every
  gate has one ``opened`` entry, a decided gate exactly one decision entry, an executed gated
  call exactly one outcome entry (a gated sub-agent call's, written with its child run's
  report by ``include/report_child.lua``, once the child has ended), and each grant one ``granted`` entry and, once
  revoked, one ``revoked`` entry.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING

from redis.asyncio import Redis

from agent_core import Keys
from agent_core import audit as trail
from agent_core.grants import Grant, scope_of
from tests.soak.config import APPROVERS, REQUESTER
from tests.soak.editors import NOT_WHOLE, Revoke
from tests.soak.soak_agent import EDITABLE, GATED_SUB_AGENTS, POLICIES

if TYPE_CHECKING:
    from tests.soak.promises import Facts

GRANT_SLACK = 5.0  # s: how much less than allow_for a grant may last from its recording
DECISIONS = ("approved", "denied", "expired", "closed")
OUTCOMES = ("executed", "failed", "in_doubt", "not_run")


class EditGrantPromises:
    """The checks of edits, grants and the audit trail."""

    # Set by Soak.__init__ (tests/soak/test_soak.py).
    keys: Keys
    redis: Redis
    counts: Counter[str]
    revokes: list[Revoke]
    edit_grant_problems: list[str]

    async def grant_record(self, grant_id: str) -> Grant | None:
        scope = scope_of(grant_id)
        if not scope:
            return None
        raw = await self.redis.hget(self.keys.grants(scope), grant_id)
        return Grant.of(raw) if raw else None

    async def check_edits(self, facts: Facts) -> list[str]:
        """An edited call was decided with its edit and ran with it, never as the model
        wrote it; only an approver of an editable tool edited, never the requester."""
        bad: list[str] = []
        ran: dict[str, list[str]] = {}
        for line in facts.journal:
            if line.event == "start":
                ran.setdefault(line.op, []).append(line.digest)
        for view in facts.gates.values():
            h = view.h
            if not h.get("edited_by"):
                continue
            self.counts["edited gates (Edit & approve)"] += 1
            if view.rec.tool not in EDITABLE:
                bad.append(f"{view.where()}: edited, its tool is not editable")
            if h["edited_by"] == REQUESTER or h["edited_by"] != h.get("decided_by"):
                bad.append(f"{view.where()}: edited by {h['edited_by']}, {h.get('decided_by')}")
            if view.status != "approved" or h.get("decided_hash") != h.get("edited_hash"):
                bad.append(
                    f"{view.where()}: edited, decided_hash {h.get('decided_hash', '')[:12]} "
                    f"is not its edited_hash {h.get('edited_hash', '')[:12]}"
                )
            for digest in ran.get(view.rec.op, []):
                self.counts["edited calls that ran, checked against their edit"] += 1
                if digest == h.get("args_hash"):
                    bad.append(f"{view.where()}: ran with the original arguments, not the edit")
                elif digest != h.get("edited_hash"):
                    bad.append(f"{view.where()}: ran with arguments neither edit nor original")
        return bad

    async def check_invalid_edits(self, facts: Facts) -> list[str]:
        """An invalid edit was refused with its field's error (or, sent once the gate had
        ended, closed the form: its sender is told so) and decided nothing: its sender
        decided the gate, if at all, only after that answer."""
        bad: list[str] = []
        for view in facts.gates.values():
            for c in view.rec.clicks:
                if c.kind != "edit-invalid" or c.status != 200:
                    continue
                self.counts["invalid edits answered"] += 1
                try:
                    errors = (json.loads(c.answer or "{}") or {}).get("errors") or {}
                except ValueError:
                    errors = {}
                decided = view.at("decided_at") or view.at("deadline")
                if NOT_WHOLE in errors.values():
                    self.counts["invalid edits refused with the field's error"] += 1
                elif c.answer or decided is None or c.acked_unix is None or decided > c.acked_unix:
                    bad.append(f"{view.where()}: an invalid edit was answered {c.answer[:80]!r}")
                else:  # the form closed, the person told the gate was decided or expired
                    self.counts["invalid edits sent once the gate had ended (form closed)"] += 1
                if (
                    view.h.get("decided_by") == c.user
                    and decided is not None
                    and c.acked_unix is not None
                    and decided <= c.acked_unix
                ):
                    bad.append(f"{view.where()}: decided by {c.user}'s invalid edit")
        return bad

    async def check_grant_decisions(self, facts: Facts) -> list[str]:
        """A gate a grant decided matches a grant of the same thread (top run), agent,
        tool, approvers and constraint, live when the gate opened, not the requester's."""
        bad: list[str] = []
        for view in facts.gates.values():
            by = view.h.get("decided_by", "")
            if not by.startswith("grant:"):
                continue
            self.counts["gates decided by a grant"] += 1
            grant_id = by[len("grant:") :]
            grant = await self.grant_record(grant_id)
            if grant is None:
                bad.append(f"{view.where()}: decided by {by}, no such grant")
                continue
            top = top_run(facts, view.rec.run_id)
            opened = view.at("created_at") or 0.0
            args = json.loads(view.h.get("args") or "{}")
            problems = []
            if grant.scope != top:
                problems.append(f"of thread {grant.scope}, not {top}")
            if grant.agent != view.h.get("agent") or grant.tool != view.rec.tool:
                problems.append(f"of {grant.agent}/{grant.tool}")
            if grant.approvers != json.loads(view.h.get("approvers") or "[]"):
                problems.append(f"for approvers {grant.approvers}")
            if grant.field and args.get(grant.field) != grant.value:
                problems.append(f"only {grant.field}={grant.value!r}, the call has {args}")
            if not grant.created_at <= opened < grant.expires_at:
                problems.append(f"live {grant.created_at}-{grant.expires_at}, opened {opened}")
            if grant.revoked_at is not None and grant.revoked_at <= opened:
                problems.append(f"revoked at {grant.revoked_at}, opened {opened}")
            if grant.granted_by in (REQUESTER, "") or grant.granted_by not in APPROVERS:
                problems.append(f"granted by {grant.granted_by!r}")
            if (view.h.get("grant_id"), view.h.get("granted_by")) != (grant_id, grant.granted_by):
                problems.append("its grant_id or granted_by differs")
            if problems:
                bad.append(f"{view.where()}: its grant {grant_id} " + "; ".join(problems))
            if grant.field:
                self.counts["gates decided by a grant with a constraint"] += 1
        return bad

    async def check_grants_made(self, facts: Facts) -> list[str]:
        """Grants are made by an approver (never the requester) on the gate that records
        them, for ``allow_for``; an acknowledged Revoke ended its grant; the refusals the
        people saw on the spot (a form opened for the requester) are violations."""
        bad = list(self.edit_grant_problems)
        now = max((v.at("decided_at") or 0.0 for v in facts.gates.values()), default=0.0)
        for view in facts.gates.values():
            grant_id = view.h.get("granted", "")
            if not grant_id:
                continue
            self.counts["grants made (Approve & allow)"] += 1
            grant = await self.grant_record(grant_id)
            if grant is None:
                bad.append(f"{view.where()}: granted {grant_id}, no such grant")
                continue
            policy = POLICIES.get(view.rec.tool)
            allow_for = policy.allow_for if policy else 0.0
            if view.status != "approved" or grant.granted_by != view.h.get("decided_by"):
                bad.append(f"{view.where()}: granted {grant_id} by {grant.granted_by}")
            if grant.granted_by == REQUESTER or grant.gate_id != view.rec.gate_id:
                bad.append(f"{view.where()}: grant {grant_id} by {grant.granted_by}")
            # Its expiry is `allow_for` from when the click was handled (the Redis clock
            # read before GRANT_GATE): a little less than that from its recording.
            lasts = grant.expires_at - grant.created_at
            if not allow_for or not allow_for - GRANT_SLACK <= lasts <= allow_for + 0.001:
                bad.append(f"{view.where()}: grant {grant_id} lasts {lasts:.3f} s, not {allow_for}")
            short = "longest shortfall of a grant's time from its recording (ms)"
            self.counts[short] = max(self.counts[short], round((allow_for - lasts) * 1000))
            if grant.field and grant.field != "env":
                bad.append(f"{view.where()}: grant {grant_id} constrains {grant.field}")
            if grant.revoked_at is not None:
                self.counts["grants revoked"] += 1
                if grant.revoked_by not in APPROVERS:
                    bad.append(f"grant {grant_id} revoked by {grant.revoked_by}")
            elif grant.expires_at <= now:
                self.counts["grants expired during the soak"] += 1
        for r in self.revokes:
            if not r.answer.startswith("🔒 Revoked"):
                continue
            self.counts["revokes acknowledged"] += 1
            grant = await self.grant_record(r.grant_id)
            if grant is None or grant.revoked_at is None or grant.revoked_by != r.user:
                bad.append(f"grant {r.grant_id}: {r.user}'s Revoke was acknowledged, not done")
        return bad

    async def check_audit_trail(self, facts: Facts) -> list[str]:
        """Every shard's chain verifies; one ``opened`` per gate, one decision entry per
        decided gate, one outcome entry per executed gated call (a gated sub-agent call's once
        its child ended), one ``granted`` per grant and one ``revoked`` per revoked grant."""
        bad: list[str] = []
        by_gate: dict[str, Counter[str]] = {}
        grants: dict[str, Counter[str]] = {}
        for shard in self.keys.all_shards():
            verified = await trail.verify_shard(self.redis, self.keys, shard)
            self.counts["audit entries verified"] += verified.checked
            bad += verified.problems
            async for e in trail.entries(self.redis, self.keys, shard):
                by_gate.setdefault(e.get("gate_id"), Counter())[e.kind] += 1
                if e.kind in ("granted", "revoked"):
                    grants.setdefault(e.get("grant_id"), Counter())[e.kind] += 1
        starts = Counter(line.op for line in facts.journal if line.event == "start")
        for view in facts.gates.values():
            kinds = by_gate.get(view.rec.gate_id, Counter())
            decisions = sum(kinds[k] for k in DECISIONS)
            outcomes = sum(kinds[k] for k in OUTCOMES)
            if kinds["opened"] != 1:
                bad.append(f"{view.where()}: {kinds['opened']} 'opened' audit entries")
            if view.status != "pending" and decisions != 1:
                bad.append(f"{view.where()}: {dict(kinds)} audit entries, not one decision")
            if outcomes > 1:
                bad.append(f"{view.where()}: {dict(kinds)} audit entries, outcome twice")
            if view.rec.tool in GATED_SUB_AGENTS:
                # Its outcome is written with the child run's report (include/report_child.lua):
                # once the child it started has ended, exactly one.
                ended = [
                    n
                    for n in facts.tree.values()
                    if n.h.get("parent_gate") == view.rec.gate_id
                    and n.status in ("completed", "failed", "cancelled")
                ]
                if ended and outcomes != 1:
                    bad.append(f"{view.where()}: its child ended, {dict(kinds)} audit entries")
                elif ended:
                    self.counts["gated sub-agent calls with one audit outcome"] += 1
            elif starts[view.rec.op] and outcomes != 1:
                bad.append(f"{view.where()}: ran, {dict(kinds)} audit entries, no outcome")
            elif starts[view.rec.op]:
                self.counts["executed gated calls with one audit outcome"] += 1
            grant_id = view.h.get("granted", "")
            if grant_id:
                grant = await self.grant_record(grant_id)
                want = Counter(granted=1, revoked=int(grant is not None and bool(grant.revoked_at)))
                got = grants.get(grant_id, Counter())
                if +got != +want:
                    bad.append(f"grant {grant_id}: audit entries {dict(got)}, not {dict(+want)}")
        return bad


def top_run(facts: Facts, run_id: str) -> str:
    """The top run above ``run_id`` (itself for a top run), by the run tree."""
    seen = 0
    while run_id in facts.tree and facts.tree[run_id].parent and seen < 10:
        run_id = facts.tree[run_id].parent
        seen += 1
    return run_id
