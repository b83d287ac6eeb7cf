"""The soak's checks (part of :class:`tests.soak.test_soak.Soak`).

Along the way: every event is read through the soak's own consumer group (``soak-audit``) and
a second ``gate.opened``/``gate.decided`` for a gate, a second ``tool.executed`` for a call or
a second end for a run is a violation; so is a gate seen decided and later pending (or decided
otherwise). Afterwards, :meth:`Verdict.verdict` checks every run at every depth (read from
Redis: the top runs and their children sets), call, gate, card and log against what the people
asked for and what the tools' journal says ran; and that every sub-agent call's result is its
child's outcome, that cancelled parents leave no child running, and that no parent waits with
nothing left to wait for. The sub-agent invariants are numbered (1)-(4) in the violations.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from agent_core import Gateway, Keys, RunStatus, messages
from agent_core.streams import stream_groups
from agent_core.testing import FakeOpenAI
from bot import cards, run_cards
from tests.soak.chaos import Proc
from tests.soak.config import AUDIT_GROUP, FIN_CHANNEL, redis_failed
from tests.soak.people import CallPlan, ChildRun, GateRecord, RunPlan, SoakSlack, op_depth
from tests.soak.promises import Promises
from tests.soak.soak_agent import GATED_SUB_AGENTS, IDEMPOTENT, SUB_AGENTS


@dataclass
class RunNode:
    """A run at any depth as the verdict reads it from Redis at the end."""

    run_id: str
    h: dict[str, str]  # its hash
    depth: int
    plan: RunPlan | None
    parent: str  # "" for a top run
    kids: list[str]  # its child runs' ids

    @property
    def status(self) -> str:
        return self.h.get("status", "")

    @property
    def task(self) -> str:
        return self.h.get("task", "")


class Verdict(Promises):
    """The events audit (while the soak runs) and the verdict (once it has drained)."""

    # Set by Soak.__init__ (tests/soak/test_soak.py).
    slack: SoakSlack
    redis: Redis
    keys: Keys
    gateway: Gateway
    journal: Path
    counts: Counter[str]
    known: Counter[str]
    runs: dict[str, RunPlan]
    gates: dict[str, GateRecord]
    ops: dict[str, CallPlan]
    child_plans: dict[str, RunPlan]
    children: dict[str, ChildRun]
    finished_children: set[str]
    lost: list[str]
    error_kinds: Counter[str]
    orphans: set[str]
    # Cards in the approval channel whose update Slack refused while the soak had the bot out
    # of it (not_in_channel): counted, and each must show its gate's state once the bot is
    # back like any card (bot/rejoin.py shows them again).
    stale_in_channel: set[str]
    seen_status: dict[str, tuple[str, float]]
    flipped: set[str]
    audit_violations: list[str]
    opened_events: Counter[str]
    decided_events: Counter[str]
    executed_events: Counter[str]
    end_events: Counter[str]
    cancelled_events: dict[str, dict[str, Any]]
    executed_at: dict[tuple[str, str], float]  # (run id, call id) -> first tool.executed
    opened_at: dict[str, list[float]]  # run id -> its gate.opened events' times
    ended_at: dict[str, float]  # run id -> its end event's time
    audited: set[tuple[str, str]]
    nudge_events: dict[str, list[tuple[str, float, str]]]  # gate id -> (kind, at, event id)
    approval_events: Counter[str]  # gate id -> gate.approval events
    takeovers: dict[str, list[str]]
    workers: list[Proc]
    web: Proc

    if TYPE_CHECKING:

        async def safely(self, coro: Awaitable[Any], default: Any = None) -> Any: ...

        async def gate_status(self, gate_id: str) -> str | None: ...

        def op_of(self, args: dict[str, Any]) -> str: ...

    # ------------------------------------------------------------------ events audit
    def saw(self, gate_id: str, status: str, how: str, issued: float) -> None:
        """A gate leaves `pending` once, for good. A read sent after the soak knew the gate
        was decided must see that decision: pending again, or another decision, is a
        violation. (A read sent earlier may be answered after the decision's event was
        handled: concurrent reads finish in any order.)"""
        first = self.seen_status.get(gate_id)
        if first is None:
            if status != "pending":
                self.seen_status[gate_id] = (status, time.monotonic())
            return
        decided, known_at = first
        if status != decided and issued > known_at and gate_id not in self.flipped:
            self.flipped.add(gate_id)
            self.audit_violations.append(
                f"gate {gate_id} was {decided}, then {status} ({how}): decided twice or reopened"
            )

    async def auditor(self) -> None:
        """Reads every event through the soak's own consumer group (nothing is trimmed
        before it has read it) and checks each gate opens and is decided once."""
        streams = [self.keys.events(s) for s in self.keys.all_shards()]
        backlog = True  # our own pending entries first (a reply lost to a Redis restart)
        while True:
            try:
                if backlog:
                    for stream in streams:
                        with contextlib.suppress(ResponseError):
                            await self.redis.xgroup_create(
                                stream, AUDIT_GROUP, id="0", mkstream=True
                            )
                    n = await self.audit_once("0", block=None)
                    backlog = n > 0
                elif not await self.audit_once(">", block=500):
                    await asyncio.sleep(0.25)  # on a cluster the reads do not block
            except Exception as exc:
                if not redis_failed(exc):
                    raise
                backlog = True
                await asyncio.sleep(0.5)

    async def audit_once(self, start: str, block: int | None) -> int:
        """One read of every shard's events: one XREADGROUP on one node, one per shard on
        Redis Cluster (a read cannot span slots; those do not block, each in turn)."""
        groups = stream_groups(self.redis, [self.keys.events(s) for s in self.keys.all_shards()])
        n = 0
        for group in groups:
            reply = await self.redis.xreadgroup(
                AUDIT_GROUP,
                "soak",
                dict.fromkeys(group, start),
                count=500,
                block=block if len(groups) == 1 else None,
            )
            for stream, entries in reply or []:
                ids = []
                for msg_id, fields in entries:
                    ids.append(msg_id)
                    if fields and (stream, msg_id) not in self.audited:
                        self.audited.add((stream, msg_id))
                        self.audit(msg_id, fields)
                if ids:
                    await self.redis.xack(stream, AUDIT_GROUP, *ids)
                n += len(ids)
        return n

    def audit(self, msg_id: str, fields: dict[str, str]) -> None:
        kind, run_id = fields.get("type", ""), fields.get("run_id", "")
        at = int(msg_id.split("-", 1)[0]) / 1000  # when the event was added (unix seconds)
        try:
            data = json.loads(fields.get("data") or "{}")
        except ValueError:
            self.audit_violations.append(f"event {msg_id} ({kind}) has malformed data")
            return
        self.counts["events audited"] += 1
        bad = self.audit_violations.append
        if kind == "gate.opened":
            gid = str(data.get("gate_id"))
            self.opened_events[gid] += 1
            self.opened_at.setdefault(run_id, []).append(at)
            if self.opened_events[gid] > 1:
                bad(f"gate {gid}: gate.opened #{self.opened_events[gid]} (event {msg_id})")
            if self.decided_events[gid]:
                bad(f"gate {gid} opened again after it was decided (event {msg_id})")
        elif kind == "gate.decided":
            gid = str(data.get("gate_id"))
            self.decided_events[gid] += 1
            if self.decided_events[gid] > 1:
                bad(
                    f"gate {gid}: gate.decided #{self.decided_events[gid]} "
                    f"({data.get('status')}, event {msg_id})"
                )
            self.saw(gid, str(data.get("status")), f"gate.decided event {msg_id}", time.monotonic())
        elif kind in ("gate.reminded", "gate.escalated"):
            gid = str(data.get("gate_id"))
            fired = float(data.get("at") or at)
            self.nudge_events.setdefault(gid, []).append((kind, fired, msg_id))
            if self.decided_events[gid]:
                bad(f"gate {gid}: {kind} after its gate.decided (event {msg_id})")
        elif kind == "gate.approval":
            gid = str(data.get("gate_id"))
            self.approval_events[gid] += 1
            if self.decided_events[gid]:
                bad(f"gate {gid}: an approval counted after its gate.decided (event {msg_id})")
        elif kind == "tool.executed":
            key = f"{run_id}/{data.get('call_id')}"
            self.executed_events[key] += 1
            self.executed_at.setdefault((run_id, str(data.get("call_id"))), at)
            if self.executed_events[key] > 1:
                bad(f"call {key} ({data.get('tool')}): tool.executed twice (event {msg_id})")
        elif kind in ("run.completed", "run.failed", "run.cancelled"):
            self.end_events[run_id] += 1
            self.ended_at.setdefault(run_id, at)
            if kind == "run.cancelled":
                self.cancelled_events[run_id] = {
                    k: data.get(k) for k in ("by", "never_ran", "running")
                } | {"event": msg_id, "parent_run": (data.get("origin") or {}).get("parent_run")}
            if self.end_events[run_id] > 1:
                bad(f"run {run_id}: a second end event, {kind} (event {msg_id})")

    # ------------------------------------------------------------------ verdict
    def journal_starts(self) -> Counter[str]:
        starts: Counter[str] = Counter()
        for line in self.journal.read_text().splitlines():
            event, _tool, op = line.split()[:3]
            if event == "start":
                starts[op] += 1
        return starts

    def update_refused(self, channel: str, ts: str) -> bool:
        """Whether Slack refused to update that message because the bot was out of its
        channel (the approval channel, while the soak had removed the bot)."""
        return any(
            not c.ok
            and str(c.args.get("channel")) == channel
            and str(c.args.get("ts")) == ts
            and c.response.get("error") in ("not_in_channel", "channel_not_found")
            for c in self.slack.calls_to("chat.update")
        )

    async def card_problems(self) -> list[str]:
        """What the cards get wrong now: live buttons on decided gates, stale outcomes."""
        problems: list[str] = []
        starts = self.journal_starts()
        statuses: dict[str, str] = {}
        for gate_id in self.gates:
            statuses[gate_id] = await self.gate_status(gate_id) or "?"
        recorded: dict[str, str] = {}
        for gate_id in self.gates:
            card = await self.safely(
                self.redis.hgetall(
                    self.keys.ext("slack-card", gate_id, self.keys.shard_of(gate_id))
                ),
                {},
            )
            recorded[gate_id] = card.get("ts", "")
        self.orphans = set()
        self.stale_in_channel = set()
        for msg in self.slack.messages:
            for block in msg.blocks:
                if block.get("type") != "actions":
                    continue
                for el in block.get("elements", []):
                    gid = cards.parse_button_value(str(el.get("value") or ""))[0]
                    if el.get("action_id") not in (cards.APPROVE_ACTION, cards.DENY_ACTION):
                        continue
                    st = statuses.get(gid) or await self.gate_status(gid) or "?"
                    if st == "pending":
                        continue
                    if gid in recorded and recorded[gid] != msg.ts:
                        self.orphans.add(msg.ts)  # a duplicate card: a known issue
                    else:
                        problems.append(f"message {msg.ts} has live buttons for {st} {gid}")
        for gate_id, st in statuses.items():
            found, shown = await self.gate_card_problems(gate_id, st, starts)
            if shown is not None and self.stale_in_channel_card(shown):
                self.stale_in_channel.add(shown.ts)  # see stale_in_channel: judged like any
            problems += found
        return problems

    def stale_in_channel_card(self, shown: Any) -> bool:
        """A card in the approval channel whose update Slack refused while the bot was out of
        it (shown again once the bot is back: bot/rejoin.py)."""
        return shown.channel == FIN_CHANNEL and self.update_refused(shown.channel, shown.ts)

    async def gate_card_problems(
        self, gate_id: str, st: str, starts: Counter[str]
    ) -> tuple[list[str], Any]:
        """What the gate's card gets wrong now (its outcome, "Running…"), and the card."""
        found: list[str] = []
        rec = self.gates[gate_id]
        card = await self.safely(
            self.redis.hgetall(self.keys.ext("slack-card", gate_id, self.keys.shard_of(gate_id))),
            {},
        )
        shown = self.slack.message(card.get("channel", ""), card.get("ts", "")) if card else None
        if shown is None:
            found.append(f"gate {gate_id} ({st}) has no card")
            return found, None
        word = {
            "approved": "Approved",
            "denied": "Denied",
            "expired": "Expired",
            "cancelled": "Cancelled",
        }.get(st, "Approval needed")
        if not shown.text.startswith(word):
            found.append(f"card of {st} gate {gate_id} says {shown.text[:40]!r}")
        if st == "approved" and "Running" in json.dumps(shown.blocks):
            if self.is_sub_call(rec.op):
                kids = [
                    c.run_id
                    for c in self.children.values()
                    if c.plan is not None and c.plan.parent_op == rec.op
                ]
                if any(k in self.finished_children for k in kids):
                    found.append(f"card of {rec.op} still says Running… (its child ended)")
                    return found, shown
                if kids:
                    return found, shown  # the child runs: its outcome comes when it ends
            if starts[rec.op]:
                found.append(f"card of {rec.op} still says Running… (it ran)")
            else:  # fixed in f742387: an approved call of a cancelled run never runs
                run_status = await self.safely(self.redis.hget(self.keys.run(rec.run_id), "status"))
                if run_status in ("cancelled", "failed", "completed"):
                    found.append(
                        f"card of {rec.op} says Running…; it never ran "
                        f"[{self.where_gate(rec)}, run {run_status}, "
                        f"run.cancelled {self.cancelled_events.get(rec.run_id)}]"
                    )
        return found, shown

    async def run_tree(self) -> dict[str, RunNode]:
        """Every run at every depth, read from Redis: the top runs of the plans, then their
        children (each parent's children set), breadth first."""
        tree: dict[str, RunNode] = {}
        queue: list[tuple[str, RunPlan | None, str, int]] = [
            (p.run_id, p, "", 0) for p in self.runs.values() if p.run_id is not None
        ]
        while queue:
            run_id, plan, parent, depth = queue.pop(0)
            if run_id in tree:
                continue
            h = await self.redis.hgetall(self.keys.run(run_id))
            kids = sorted(await self.redis.smembers(self.keys.children(run_id)))
            tree[run_id] = RunNode(run_id, h, depth, plan, parent, kids)
            for kid in kids:
                task = await self.redis.hget(self.keys.run(kid), "task")
                queue.append((kid, self.child_plans.get(task or ""), run_id, depth + 1))
        return tree

    @staticmethod
    def outcome(node: RunNode) -> str | None:
        """What a finished child run tells its parent's call (None while it runs)."""
        agent = node.h.get("agent", "")
        if node.status == "completed":
            return node.h.get("final", "")
        if node.status == "failed":
            return messages.sub_agent_failed(agent, node.h.get("error", ""))
        if node.status == "cancelled":
            return messages.sub_agent_cancelled(agent, node.h.get("cancelled_by", ""))
        return None

    def ancestry(self, tree: dict[str, RunNode], run_id: str) -> list[str]:
        """The run, its parent, …, its top run."""
        out = [run_id]
        while (node := tree.get(out[-1])) is not None and node.parent:
            out.append(node.parent)
        return out

    async def verdict(self) -> tuple[list[str], Counter[str]]:
        violations: list[str] = []
        bad = violations.append
        # The rest of the events: our own pending entries, then what was never delivered.
        for start in ("0", ">"):
            while await self.audit_once(start, block=None):
                pass
        starts = self.journal_starts()
        tree = await self.run_tree()
        finished = ("completed", "failed", "cancelled")

        # Gates the people never saw (opened and closed between two looks): checked too.
        for node in tree.values():
            for gate in await self.gateway.gates(node.run_id):
                if gate.gate_id not in self.gates:
                    op = self.op_of(gate.args)
                    rec = GateRecord(
                        gate.gate_id, node.run_id, op, gate.tool, "unseen", gate.deadline
                    )
                    rec.depth = node.depth
                    self.gates[gate.gate_id] = rec
                    self.counts["gates the people never saw (no fate given)"] += 1
        gates_by_op = {g.op: g for g in self.gates.values()}
        gate_status = {gid: await self.gate_status(gid) for gid in self.gates}
        told_op: dict[str, str] = {}  # op -> what the model was told

        # Sub-agent calls: the child runs each started (at most one: invariant 1).
        spawned: dict[str, list[str]] = {}  # op of the sub-agent call -> child run ids
        for node in tree.values():
            if not node.parent:
                continue
            if node.plan is None:
                bad(f"child run {node.run_id} has a task no plan names: {node.task!r}")
                continue
            spawned.setdefault(node.plan.parent_op, []).append(node.run_id)
            if node.h.get("depth") != str(node.depth) or node.h.get("parent") != node.parent:
                bad(
                    f"child run {node.run_id}: depth {node.h.get('depth')} parent "
                    f"{node.h.get('parent')}, found at depth {node.depth} under {node.parent}"
                )
        for op, ids in spawned.items():
            if len(ids) > 1:
                bad(f"(1) sub-agent call {op} started {len(ids)} child runs: {ids}")

        def ran(op: str) -> int:
            """How many times the call ran: its tool's starts, or its child runs."""
            return len(spawned.get(op, [])) if self.is_sub_call(op) else starts[op]

        for op, n in starts.items():
            tool = self.ops[op].tool if op in self.ops else "?"
            if n > 1 and tool not in IDEMPOTENT:
                depth = op_depth(op)
                bad(f"{tool} {op} ran {n} times" + (f" (in a depth-{depth} run)" if depth else ""))
        self.counts["runs"] = sum(1 for n in tree.values() if not n.parent)
        self.counts["child runs"] = sum(1 for n in tree.values() if n.parent)
        self.counts["runs whose model called a sub-agent"] = sum(
            1 for n in tree.values() if not n.parent and n.kids
        )

        for node in tree.values():
            run = await self.gateway.get_run(node.run_id)
            where = f"run {node.run_id}" + (f" (depth {node.depth})" if node.depth else "")
            if run is None:
                bad(f"{where} vanished")
                continue
            if node.parent:
                self.counts[f"child runs at depth {node.depth}"] += 1
                self.counts[f"child runs {run.status.value}"] += 1
            else:
                self.counts[f"runs {run.status.value}"] += 1
            kids = [tree[k] for k in node.kids if k in tree]
            if not run.status.finished:
                detail = ""
                if kids and run.status is RunStatus.AWAITING_APPROVAL:
                    open_gates = [
                        g
                        for g in self.gates.values()
                        if g.run_id == node.run_id and gate_status.get(g.gate_id) == "pending"
                    ]
                    if not open_gates and all(k.status in finished for k in kids):
                        detail = (
                            f" (4): no gate pending and all {len(kids)} children finished "
                            f"({', '.join(f'{k.run_id} {k.status}' for k in kids)}; "
                            f"children_pending={node.h.get('children_pending')}, "
                            f"pending={node.h.get('pending')})"
                        )
                bad(f"{where} is still {run.status.value}{detail}")
            if int(node.h.get("children_pending") or 0) < 0:
                # A cancel zeroes it, then each child's cancel reports (and counts down).
                self.counts[f"{run.status.value} parents left with children_pending < 0"] += 1
            if run.status in (RunStatus.CANCELLED, RunStatus.FAILED):
                for k in kids:  # (3): the cascade (or the orphan check) reached them all
                    if k.status not in finished:
                        bad(
                            f"(3) {run.status.value} {where} has child run {k.run_id} still "
                            f"{k.status}"
                        )
            if not run.status.finished:
                continue
            if run.status is RunStatus.FAILED:
                if not run.error:
                    bad(f"{where} failed without a reason")
                self.counts[f"failure: {(run.error or '')[:60]}"] += 1
            history = await self.gateway.history(run.run_id)
            answers: Counter[str] = Counter()
            told: dict[str, str] = {}
            for m in history:
                if m.get("role") == "tool":
                    answers[str(m.get("tool_call_id"))] += 1
                    told[str(m.get("tool_call_id"))] = str(m.get("content") or "")
            calls_by_id: dict[str, tuple[str, str]] = {
                tc["id"]: (
                    tc["function"]["name"],
                    self.op_of(json.loads(tc["function"]["arguments"])),
                )
                for m in history
                if m.get("role") == "assistant"
                for tc in m.get("tool_calls") or []
            }
            for call_id, (name, op) in calls_by_id.items():
                if answers[call_id] > 1:
                    bad(f"{op} ({name}, {where}): {answers[call_id]} tool messages")
                text = told.get(call_id)
                told_op[op] = text or ""
                if text is None:
                    if run.status is RunStatus.COMPLETED:
                        bad(f"{op} ({name}, {where}): the model never got a tool message")
                    continue
                g = gates_by_op.get(op)
                st = gate_status.get(g.gate_id) if g is not None else None
                if name in SUB_AGENTS:
                    violations += self.check_sub_call(tree, node, call_id, name, op, text, st)
                elif text.startswith("did "):
                    if starts[op] == 0:
                        bad(f"{op}: the model was told it ran; it never started")
                elif text.startswith("Outcome unknown"):
                    self.counts["calls in doubt"] += 1
                    if node.depth:
                        self.counts["calls in doubt in child runs"] += 1
                    if starts[op] == 0:
                        # Claimed, then the worker died before the tool's first line: "may or
                        # may not have run" is the truth the worker can tell.
                        self.counts["calls in doubt that had not started"] += 1
                expect = {
                    "denied": "Not executed: the user",
                    "expired": "Not executed: the approval request",
                    "cancelled": "Not executed: the run was cancelled",
                }
                if st in expect and not text.startswith(expect[st]):
                    bad(f"{op} {st}, but the model was told {text[:50]!r}")
                if (
                    st == "approved"
                    and name not in SUB_AGENTS
                    and not text.startswith(("did ", "Outcome unknown"))
                ):
                    bad(f"{op} approved, but the model was told {text[:50]!r}")
            if node.parent:
                continue  # a child run has no root message: its outcome is its parent's
            root = self.slack.message(
                run.origin.get("channel", ""), run.origin.get("thread_ts", "")
            )
            label = run_cards.status_label(run.status)
            if root is None or label not in json.dumps(root.blocks, ensure_ascii=False):
                bad(f"root message of {run.run_id} does not say {label!r}")

        # (2), seen from the child: a finished child's outcome is its parent call's result.
        for node in tree.values():
            if not node.parent:
                continue
            want = self.outcome(node)
            call_id = node.h.get("parent_call", "")
            turn = node.h.get("parent_turn", "0")
            state, result = await self.redis.hmget(
                self.keys.turn(node.parent, int(turn)), [f"state:{call_id}", f"result:{call_id}"]
            )
            if want is None:
                continue  # still running: reported above
            self.counts["child outcomes checked in the parent's turn"] += 1
            if state != "done" or result != want:
                bad(
                    f"(2) child run {node.run_id} {node.status}, but its parent "
                    f"{node.parent}'s call {call_id} (turn {turn}) is {state} with result "
                    f"{(result or '')[:60]!r}, not {want[:60]!r}"
                )

        # Cancels sent, by the run they named: a gate may be cancelled by its run's or an
        # ancestor's cancel (the cascade), or when an ancestor failed (the orphan check).
        cancel_sent = {
            c.target or g.run_id
            for g in self.gates.values()
            for c in g.clicks
            if c.kind == "cancel"
        }
        for rec in self.gates.values():
            st = gate_status.get(rec.gate_id)
            nested = "nested " if rec.depth else ""
            self.counts[f"gates {st}"] += 1
            if rec.depth:
                self.counts["nested gates"] += 1
                self.counts[f"nested gates {st}"] += 1
            n = ran(rec.op)
            if self.opened_events[rec.gate_id] != 1:
                n_open = self.opened_events[rec.gate_id]
                bad(f"{nested}gate {rec.gate_id} ({rec.op}): {n_open} gate.opened events")
            if st != "pending" and self.decided_events[rec.gate_id] != 1:
                n_dec = self.decided_events[rec.gate_id]
                bad(f"{st} {nested}gate {rec.gate_id} ({rec.op}): {n_dec} gate.decided events")
            if st == "pending":
                bad(f"{nested}gate {rec.gate_id} ({rec.op}) still pending")
            elif st == "approved":
                by = await self.safely(self.redis.hget(self.keys.gate(rec.gate_id), "decided_by"))
                # A grant's decision: promises.check_grant_decisions judges it.
                if not (by or "").startswith("grant:") and not rec.sent("approve", by or ""):
                    bad(f"{rec.op} approved but nobody clicked Approve")
                status = await self.safely(self.redis.hget(self.keys.run(rec.run_id), "status"))
                if status == "completed" and n == 0:
                    if not told_op.get(rec.op, "").startswith("Outcome unknown"):
                        bad(f"{rec.op} approved in a completed run but never ran")
                if status == "cancelled" and n == 0:
                    self.counts["approved calls of runs cancelled before they ran"] += 1
            elif st == "denied":
                by = await self.safely(self.redis.hget(self.keys.gate(rec.gate_id), "decided_by"))
                if not rec.sent("deny-submit", by or ""):
                    bad(f"{rec.op} denied but nobody submitted a denial")
                if n:
                    bad(f"{rec.op} ran although denied")
            elif st == "expired":
                if n:
                    bad(f"{rec.op} ran although expired")
            elif st == "cancelled":
                chain = self.ancestry(tree, rec.run_id)
                if not any(r in cancel_sent for r in chain) and not any(
                    tree[r].status == "failed" for r in chain if r in tree
                ):
                    bad(f"{rec.op} cancelled but nobody cancelled its run (or one above it)")
                if n:
                    bad(f"{rec.op} ran although cancelled")
        self.counts["decisions (gates decided)"] = sum(
            v for k, v in self.counts.items() if k.startswith("gates ") and k != "gates pending"
        )
        self.counts["nested decisions (nested gates decided)"] = sum(
            v
            for k, v in self.counts.items()
            if k.startswith("nested gates ") and k != "nested gates pending"
        )
        violations += await self.card_problems()
        self.counts["cards in the approval channel refused an update while the bot was out"] = len(
            self.stale_in_channel
        )
        violations += await self.promises(tree)
        violations += self.lost
        violations += self.audit_violations
        self.known["orphan_card"] = len(self.orphans)
        for p in (*self.workers, self.web):
            errors = p.errors()
            self.counts[f"ERROR lines logged by {p.name}"] = len(errors)
            for line in errors:
                # "2026-01-01 00:00:00,000 ERROR logger: message": keep logger and message
                self.error_kinds[f"{p.name}: {line.split(' ERROR ', 1)[1][:110]}"] += 1
        return violations, starts

    def where_gate(self, rec: GateRecord) -> str:
        """The gate and its run, for a violation's message (a nested gate's parent too)."""
        child = self.children.get(rec.run_id)
        where = f"gate {rec.gate_id} of run {rec.run_id}"
        if child is not None:
            where += f" (depth {child.depth}, parent {child.parent}, top {child.top})"
        return where

    def is_sub_call(self, op: str) -> bool:
        plan = self.ops.get(op)
        return plan is not None and plan.tool in SUB_AGENTS

    def check_sub_call(
        self,
        tree: dict[str, RunNode],
        node: RunNode,
        call_id: str,
        name: str,
        op: str,
        text: str,
        gate: str | None,
    ) -> list[str]:
        """(2), seen from the parent: the tool result of a sub-agent call is exactly its
        child's outcome (final answer, failure or cancel text); a gated call not approved
        started no child (what it was told is checked with the other gated calls)."""
        where = f"{op} ({name} in run {node.run_id}, depth {node.depth})"
        mine = [k for k in node.kids if k in tree and tree[k].h.get("parent_call") == call_id]
        if name in GATED_SUB_AGENTS and gate != "approved":
            if mine:
                return [f"{where}: its gate is {gate}, but child run {mine[0]} started"]
            return []
        if not text.strip():
            return [f"(2) {where}: an empty tool result"]
        if not mine:
            return [f"(2) {where}: no child run, and the model was told {text[:60]!r}"]
        want = self.outcome(tree[mine[0]])
        self.counts["sub-agent results checked (parent call = child outcome)"] += 1
        if want is None or text != want:
            child = tree[mine[0]]
            return [
                f"(2) {where}: told {text[:60]!r}, but child run {child.run_id} is "
                f"{child.status} with {(want or '')[:60]!r}"
            ]
        return []

    def explain(self, model: FakeOpenAI) -> list[str]:
        """The fake model's complaints (requests its scripts did not expect), each with its
        run and, when the run was taken over from a paused worker, when and from whom."""
        out = []
        requests = model.requests
        for e in model.errors:
            m = re.search(r"task '([^']+)'", e)
            task = m.group(1) if m else None
            ids = re.findall(r"call_\w+", e)
            if task is None and ids:  # a malformed conversation: find the request it was
                for body in reversed(requests):
                    text = json.dumps(body.get("messages"))
                    if all(f'"{i}"' in text for i in ids):
                        users = [x for x in body["messages"] if x.get("role") == "user"]
                        task = str(users[0].get("content")) if users else None
                        break
            plan = self.runs.get(task or "") or self.child_plans.get(task or "")
            run_id = plan.run_id if plan is not None else None
            where = f" [run {run_id}" if run_id else " [run ?"
            if plan is not None and plan.depth:
                where += f" (a depth-{plan.depth} child run)"
            if run_id and run_id in self.takeovers:
                where += "; " + "; ".join(self.takeovers[run_id])
            if len(e) > 400:
                e = e[:400] + "…"
            out.append(f"{e}{where}]")
        return out
