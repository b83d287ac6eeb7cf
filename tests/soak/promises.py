"""The verdict's checks of the newer promises (part of :class:`tests.soak.test_soak.Soak`):
approval channels and per-tool approvers, reminders and escalation, quorums, and that every
call that ran ran with the arguments its decider saw.

One method per promise, each ``async def check_<promise>(self, ctx) -> list[str]`` returning
its violations; :data:`PROMISES` lists them in the order they run. To add a promise, write a
method reading what it needs from :class:`Facts` (every gate's final hash, the run tree, the
tools' journal, the Slack messages) and add its name to :data:`PROMISES`.

What the people did and what the events audit saw along the way are on the soak itself:
``self.gates`` (each gate's fate and clicks), ``self.nudge_events`` (every ``gate.reminded``
and ``gate.escalated``), ``self.approval_events`` (``gate.approval``: a quorum's approval
counted), ``self.bot_out`` (when the bot was out of the approval channel).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

from agent_core import Keys
from agent_core.gating import args_hash
from agent_core.quorum import Approval, approvals_of
from bot import route_cards
from tests.soak.config import APPROVERS, GROUPS, REQUESTER
from tests.soak.grant_promises import EditGrantPromises
from tests.soak.people import GateRecord, RunPlan, SoakSlack
from tests.soak.soak_agent import GATED_SUB_AGENTS, POLICIES, QUORUM, ROUTED, Policy

if TYPE_CHECKING:
    from tests.soak.verdict import RunNode

# What a routed gate's line in the task's thread starts with, by the gate's final status.
NOTE_MARK = {
    "pending": "⏳",
    "approved": "✅",
    "denied": "🚫",
    "expired": "⌛",
    "cancelled": "✖️",
}
REMINDER = "⏰ Reminder"
ESCALATION = "⏫ Escalated to"


@dataclass
class JournalLine:
    """One line of the tools' journal: ``start|end <tool> <op> <pid> <args hash>``."""

    event: str
    tool: str
    op: str
    pid: int
    digest: str


@dataclass
class GateView:
    """A gate as the verdict sees it at the end: what the people did, and its hash."""

    rec: GateRecord
    h: dict[str, str]

    @property
    def status(self) -> str:
        return self.h.get("status", "")

    @property
    def policy(self) -> Policy | None:
        return POLICIES.get(self.rec.tool)

    def at(self, name: str) -> float | None:
        raw = self.h.get(name)
        return float(raw) if raw else None

    @property
    def approvals(self) -> list[Approval]:
        return approvals_of(self.h.get("approvals"))

    def approvers(self) -> list[str]:
        try:
            got = json.loads(self.h.get("approvers") or "[]")
        except ValueError:
            return ["<unreadable>"]
        return [str(x) for x in got] if isinstance(got, list) else ["<unreadable>"]

    def escalate_to(self) -> list[str]:
        try:
            got = json.loads(self.h.get("escalate_to") or "[]")
        except ValueError:
            return []
        return [str(x) for x in got] if isinstance(got, list) else []

    def may_decide(self, user: str, at: float | None) -> bool:
        """Whether ``user`` was on the gate's list at ``at`` (Redis clock): its approvers
        (user groups expanded; none: APPROVERS), and its ``escalate_to`` once escalated."""
        listed = self.approvers() or list(APPROVERS)
        people = {u for a in listed for u in GROUPS.get(a, (a,))}
        if user in people or "*" in people:
            return True
        escalated = self.at("escalated_at")
        return (
            escalated is not None
            and at is not None
            and at >= escalated
            and user in self.escalate_to()
        )

    def where(self) -> str:
        return f"{self.rec.tool} {self.rec.op} (gate {self.rec.gate_id}, {self.status})"


@dataclass
class Facts:
    """What every check may read."""

    gates: dict[str, GateView]  # gate id -> view
    tree: dict[str, RunNode]
    journal: list[JournalLine]
    messages: list[Any]  # every Slack message (the fake's), not the ephemeral ones
    by_op: dict[str, GateView] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_op = {v.rec.op: v for v in self.gates.values()}


PROMISES = (
    "check_executed_hash",
    "check_deciders",
    "check_routes_recorded",
    "check_routed_cards",
    "check_nudges",
    "check_nudge_replies",
    "check_quorums",
    "check_edits",
    "check_invalid_edits",
    "check_grant_decisions",
    "check_grants_made",
    "check_audit_trail",
)


class Promises(EditGrantPromises):
    """The checks of :data:`PROMISES`."""

    # Set by Soak.__init__ (tests/soak/test_soak.py).
    slack: SoakSlack
    keys: Keys
    counts: Counter[str]
    gates: dict[str, GateRecord]
    child_plans: dict[str, RunPlan]
    journal: Path
    redis: Redis
    nudge_events: dict[str, list[tuple[str, float, str]]]
    approval_events: Counter[str]
    bot_out: list[tuple[float, float]]
    orphans: set[str]

    if TYPE_CHECKING:

        async def safely(self, coro: Any, default: Any = None) -> Any: ...

    def journal_lines(self) -> list[JournalLine]:
        out = []
        for line in self.journal.read_text().splitlines():
            parts = line.split()
            if len(parts) == 5:
                event, tool, op, pid, digest = parts
                out.append(JournalLine(event, tool, op, int(pid), digest))
        return out

    async def promises(self, tree: dict[str, RunNode]) -> list[str]:
        """Every check of :data:`PROMISES`, in order: their violations."""
        views: dict[str, GateView] = {}
        for gate_id, rec in self.gates.items():
            h = await self.safely(self.redis.hgetall(self.keys.gate(gate_id)), {})
            views[gate_id] = GateView(rec, h or {})
        facts = Facts(views, tree, self.journal_lines(), self.slack.messages)
        violations: list[str] = []
        for name in PROMISES:
            violations += await getattr(self, name)(facts)
        return violations

    # ------------------------------------------------------------------ the promises
    async def check_executed_hash(self, facts: Facts) -> list[str]:
        """Every call that ran ran with the arguments whose hash its gate recorded as decided
        (``decided_hash``): the tool's own hash of what it received (the journal), and a gated
        sub-agent call's child run started with the task its decider saw."""
        bad: list[str] = []
        for line in facts.journal:
            if line.event != "start":
                continue
            view = facts.by_op.get(line.op)
            if view is None:
                continue  # an un-gated call (peek)
            self.counts["executed calls whose arguments hash was checked"] += 1
            if view.status != "approved":
                continue  # "ran although …": the main verdict's
            if line.digest != view.h.get("decided_hash"):
                bad.append(
                    f"{view.where()} ran with arguments hashing to {line.digest[:12]}, not the "
                    f"decided {str(view.h.get('decided_hash'))[:12]}"
                )
        for node in facts.tree.values():
            if not node.parent or node.plan is None:
                continue
            view = facts.by_op.get(node.plan.parent_op)
            if view is None or view.rec.tool not in GATED_SUB_AGENTS:
                continue
            self.counts["child runs whose task hash was checked against their gate"] += 1
            if args_hash({"task": node.task}) != view.h.get("decided_hash"):
                bad.append(f"{view.where()}: child run {node.run_id} started with another task")
        return bad

    async def check_deciders(self, facts: Facts) -> list[str]:
        """Nobody off a gate's list decided it or counted towards it: its own approvers (its
        tool's; else APPROVERS), and whom it was escalated to only after the escalation. The
        requester never approves (the starter may deny)."""
        bad: list[str] = []
        for view in facts.gates.values():
            st = view.status
            by = view.h.get("decided_by", "") if st in ("approved", "denied") else ""
            at = view.at("decided_at")
            counted = {a.by for a in view.approvals}
            for a in view.approvals:  # whatever the gate's end: an approval counted
                if a.by == REQUESTER or not view.may_decide(a.by, a.at):
                    bad.append(f"{view.where()}: an approval by {a.by} counted, off its list")
            for c in view.rec.clicks:  # refused, unless its sender may decide by then
                if c.outsider and c.status == 200 and c.user not in (by, *counted):
                    self.counts["outsider clicks acknowledged and refused"] += 1
            if not by or by.startswith(("rule:", "grant:")) or (st == "denied" and by == REQUESTER):
                continue
            if by == REQUESTER or not view.may_decide(by, at):
                bad.append(f"{view.where()} decided by {by}, who may not decide it then")
            elif by in view.escalate_to():
                self.counts["gates decided by whom they were escalated to (after it)"] += 1
        return bad

    async def check_routes_recorded(self, facts: Facts) -> list[str]:
        """Each gate recorded its tool's route and quorum when it opened."""
        bad: list[str] = []
        for view in facts.gates.values():
            policy = view.policy
            if policy is None:
                if view.approvers() or view.h.get("approval_channel"):
                    bad.append(f"{view.where()} has a route its tool does not set")
                continue
            if sorted(view.approvers()) != sorted(policy.approvers):
                bad.append(f"{view.where()}: approvers {view.approvers()}, not {policy.approvers}")
            if (view.h.get("approval_channel") or "") != policy.channel:
                bad.append(f"{view.where()}: approval channel {view.h.get('approval_channel')!r}")
            quorum = json.loads(view.h.get("quorum") or "null") or {}
            if int(quorum.get("count") or 1) != policy.approvals:
                bad.append(f"{view.where()}: quorum {quorum}, not {policy.approvals}")
        return bad

    async def check_routed_cards(self, facts: Facts) -> list[str]:
        """A routed gate got exactly one card: in its approval channel (with exactly one line in
        the task's thread, which shows the gate's final outcome), or, when Slack refused the
        channel while the bot was out of it, in the task's thread saying why."""
        bad: list[str] = []
        cards: dict[str, list[Any]] = {}
        notes: dict[str, list[Any]] = {}
        for msg in facts.messages:
            meta = msg.metadata or {}
            gid = str((meta.get("event_payload") or {}).get("gate_id") or "")
            if meta.get("event_type") == "approval_gate":
                cards.setdefault(gid, []).append(msg)
            elif meta.get("event_type") == "approval_note":
                notes.setdefault(gid, []).append(msg)
        for gid, view in facts.gates.items():
            if view.rec.tool not in ROUTED:
                if notes.get(gid):
                    bad.append(f"{view.where()}: a thread line, but its card is not routed")
                continue
            policy = view.policy
            assert policy is not None
            self.counts["routed gates"] += 1
            card = await self.safely(
                self.redis.hgetall(self.keys.ext("slack-card", gid, self.keys.shard_of(gid))),
                {},
            )
            mine = [m for m in cards.get(gid, []) if m.ts not in self.orphans]
            if len(mine) != 1:
                where = [f"{m.channel}/{m.ts}" for m in cards.get(gid, [])]
                bad.append(f"{view.where()}: {len(mine)} cards ({where})")
                continue
            shown = mine[0]
            if card.get("ts") != shown.ts:
                bad.append(
                    f"{view.where()}: its card record names {card.get('ts')}, not {shown.ts}"
                )
            error = card.get("route_error") or ""
            origin = json.loads(view.h.get("origin") or "{}")
            note = notes.get(gid, [])
            if error:
                self.counts["routed cards fallen back to the task's thread"] += 1
                if error not in route_cards.ROUTE_ERRORS:
                    bad.append(f"{view.where()}: fell back to the thread for {error!r}")
                if shown.channel != origin.get("channel") or "Could not post in" not in json.dumps(
                    shown.blocks, ensure_ascii=False
                ):
                    bad.append(f"{view.where()}: fell back ({error}), but its card does not say so")
                if not self.bot_out_between(view.at("created_at") or 0.0, float("inf")):
                    bad.append(f"{view.where()}: fell back ({error}) while the bot was in")
                if note:
                    bad.append(f"{view.where()}: fell back to the thread, and has a thread line")
                continue
            self.counts["routed cards posted in the approval channel"] += 1
            if shown.channel != policy.channel:
                bad.append(f"{view.where()}: its card is in {shown.channel}, no reason given")
            if len(note) != 1:
                bad.append(f"{view.where()}: {len(note)} lines in the task's thread")
                continue
            line = note[0]
            if line.channel != origin.get("channel") or line.thread_ts != origin.get("thread_ts"):
                bad.append(f"{view.where()}: its thread line is not in the task's thread")
            mark = NOTE_MARK.get(view.status, "?")
            if not line.text.startswith(mark):
                bad.append(f"{view.where()}: its thread line says {line.text[:60]!r}")
        return bad

    def bot_out_between(self, t0: float, t1: float) -> bool:
        return any(a <= t1 and b >= t0 for a, b in self.bot_out)

    async def check_nudges(self, facts: Facts) -> list[str]:
        """Each reminder and escalation fired at most once per gate, only for a tool that asks
        for it, and never after the gate's decision (the events' times, and the gate's own
        ``reminded_at`` / ``escalated_at`` against its ``decided_at``, all Redis's clock)."""
        bad: list[str] = []
        for gid, view in facts.gates.items():
            events = self.nudge_events.get(gid, [])
            kinds = Counter(kind for kind, _, _ in events)
            policy = view.policy
            for kind, n in kinds.items():
                self.counts[f"{kind} events"] += n
                if n > 1:
                    bad.append(f"{view.where()}: {n} {kind} events")
            if kinds["gate.reminded"] and not (policy and policy.remind):
                bad.append(f"{view.where()}: reminded, its tool sets no reminder")
            if kinds["gate.escalated"] and not (policy and policy.escalate_to):
                bad.append(f"{view.where()}: escalated, its tool sets no escalation")
            decided = view.at("decided_at")
            for kind, at, event in events:
                if decided is not None and at >= decided:
                    bad.append(f"{view.where()}: {kind} at {at:.3f}, after its decision ({event})")
            for name in ("reminded_at", "escalated_at"):
                fired = view.at(name)
                if fired is not None and decided is not None and fired >= decided:
                    bad.append(f"{view.where()}: {name} {fired:.3f} after decided_at {decided:.3f}")
        return bad

    async def check_nudge_replies(self, facts: Facts) -> list[str]:
        """Slack was told of each fired step at most once: the replies mentioning a run's tool
        are no more than the steps that fired for that tool's gates in that run."""
        bad: list[str] = []
        fired: Counter[tuple[str, str, str]] = Counter()
        for view in facts.gates.values():
            for kind, _, _ in self.nudge_events.get(view.rec.gate_id, []):
                step = REMINDER if kind == "gate.reminded" else ESCALATION
                fired[(view.rec.run_id, view.rec.tool, step)] += 1
        posted: Counter[tuple[str, str, str]] = Counter()
        for msg in facts.messages:
            for step in (REMINDER, ESCALATION):
                if not msg.text.startswith(step):
                    continue
                for view in facts.gates.values():
                    key = (view.rec.run_id, view.rec.tool, step)
                    if f"`{view.rec.tool}` (run `{view.rec.run_id}`)" in msg.text:
                        posted[key] += 1
                        break
        for key, n in posted.items():
            self.counts[f"{key[2]} replies posted"] += n
            if n > fired[key]:
                bad.append(f"run {key[0]}, {key[1]}: {n} {key[2]!r} replies, {fired[key]} fired")
        return bad

    async def check_quorums(self, facts: Facts) -> list[str]:
        """A gate that needs two approvals: approved only with two distinct approvers, none
        the requester, all before the decision, decided once and run at most once; a denial
        ends it; one that ended otherwise never had its quorum met."""
        bad: list[str] = []
        starts = Counter(line.op for line in facts.journal if line.event == "start")
        for view in facts.gates.values():
            if view.rec.tool not in QUORUM:
                continue
            policy = view.policy
            assert policy is not None
            st = view.status
            people = [a.by for a in view.approvals]
            distinct = set(people)
            self.counts[f"quorum gates {st}"] += 1
            if len(people) != len(distinct):
                bad.append(f"{view.where()}: someone counted twice: {people}")
            decided = view.at("decided_at")
            if st == "approved":
                if len(distinct) < policy.approvals or REQUESTER in distinct:
                    bad.append(f"{view.where()}: approved with approvals {people}")
                if view.h.get("decided_by") not in distinct:
                    bad.append(
                        f"{view.where()}: decided by {view.h.get('decided_by')}, "
                        f"not one of its approvals {people}"
                    )
                late = [a.by for a in view.approvals if decided is not None and a.at > decided]
                stale = [a.by for a in view.approvals if a.hash != view.h.get("args_hash")]
                if stale:
                    bad.append(f"{view.where()}: approvals of other arguments: {stale}")
                if late:
                    bad.append(f"{view.where()}: approvals after its decision: {late}")
                if starts[view.rec.op] > 1:
                    bad.append(f"{view.where()}: ran {starts[view.rec.op]} times")
                if view.rec.fate in ("quorum-race", "quorum"):
                    self.counts["quorum gates approved by racing approvers"] += 1
            else:
                if len(distinct) >= policy.approvals:
                    bad.append(f"{view.where()}: its quorum was met ({people}), yet {st}")
                if starts[view.rec.op]:
                    bad.append(f"{view.where()}: ran although {st}")
                if st == "denied" and distinct:
                    self.counts["quorum gates denied after an approval (one deny ends it)"] += 1
            self.counts["gate.approval events (quorum approvals counted)"] += self.approval_events[
                view.rec.gate_id
            ]
        return bad
