"""The soak's checks (part of :class:`tests.soak.test_soak.Soak`).

Along the way: every event is read through the soak's own consumer group (``soak-audit``) and
a second ``gate.opened``/``gate.decided`` for a gate, a second ``tool.executed`` for a call or
a second end for a run is a violation; so is a gate seen decided and later pending (or decided
otherwise). Afterwards, :meth:`Verdict.verdict` checks every run, call, gate, card and log
against what the people asked for and what the tools' journal says ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import Counter
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from agent_core import Gateway, Keys, RunStatus
from agent_core.testing import FakeOpenAI
from bot import cards
from tests.soak.chaos import Proc
from tests.soak.config import AUDIT_GROUP
from tests.soak.people import CallPlan, GateRecord, RunPlan, SoakSlack
from tests.soak.soak_agent import IDEMPOTENT


class Verdict:
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
    lost: list[str]
    error_kinds: Counter[str]
    orphans: set[str]
    seen_status: dict[str, tuple[str, float]]
    flipped: set[str]
    audit_violations: list[str]
    opened_events: Counter[str]
    decided_events: Counter[str]
    executed_events: Counter[str]
    end_events: Counter[str]
    audited: set[tuple[str, str]]
    takeovers: dict[str, list[str]]
    workers: list[Proc]
    web: Proc

    if TYPE_CHECKING:

        async def safely(self, coro: Awaitable[Any], default: Any = None) -> Any: ...

        async def gate_status(self, gate_id: str) -> str | None: ...

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
                else:
                    await self.audit_once(">", block=500)
            except (RedisError, OSError):
                backlog = True
                await asyncio.sleep(0.5)

    async def audit_once(self, start: str, block: int | None) -> int:
        streams = {self.keys.events(s): start for s in self.keys.all_shards()}
        reply = await self.redis.xreadgroup(AUDIT_GROUP, "soak", streams, count=500, block=block)
        n = 0
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
        elif kind == "tool.executed":
            key = f"{run_id}/{data.get('call_id')}"
            self.executed_events[key] += 1
            if self.executed_events[key] > 1:
                bad(f"call {key} ({data.get('tool')}): tool.executed twice (event {msg_id})")
        elif kind in ("run.completed", "run.failed", "run.cancelled"):
            self.end_events[run_id] += 1
            if self.end_events[run_id] > 1:
                bad(f"run {run_id}: a second end event, {kind} (event {msg_id})")

    # ------------------------------------------------------------------ verdict
    def journal_starts(self) -> Counter[str]:
        starts: Counter[str] = Counter()
        for line in self.journal.read_text().splitlines():
            event, _tool, op, _pid = line.split()
            if event == "start":
                starts[op] += 1
        return starts

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
            rec = self.gates[gate_id]
            card = await self.safely(
                self.redis.hgetall(
                    self.keys.ext("slack-card", gate_id, self.keys.shard_of(gate_id))
                ),
                {},
            )
            msg = self.slack.message(card.get("channel", ""), card.get("ts", "")) if card else None
            if msg is None:
                problems.append(f"gate {gate_id} ({st}) has no card")
                continue
            word = {
                "approved": "Approved",
                "denied": "Denied",
                "expired": "Expired",
                "cancelled": "Cancelled",
            }.get(st, "Approval needed")
            if not msg.text.startswith(word):
                problems.append(f"card of {st} gate {gate_id} says {msg.text[:40]!r}")
            if st == "approved" and "Running" in json.dumps(msg.blocks):
                if starts[rec.op]:
                    problems.append(f"card of {rec.op} still says Running… (it ran)")
                else:  # fixed in f742387: an approved call of a cancelled run never runs
                    run_status = await self.safely(
                        self.redis.hget(self.keys.run(rec.run_id), "status")
                    )
                    if run_status in ("cancelled", "failed", "completed"):
                        problems.append(f"card of {rec.op} says Running…; it never ran")
        return problems

    async def verdict(self) -> tuple[list[str], Counter[str]]:
        violations: list[str] = []
        # The rest of the events: our own pending entries, then what was never delivered.
        for start in ("0", ">"):
            while await self.audit_once(start, block=None):
                pass
        starts = self.journal_starts()
        gates_by_op = {g.op: g for g in self.gates.values()}
        told_op: dict[str, str] = {}  # op -> what the model was told

        for op, n in starts.items():
            tool = self.ops[op].tool if op in self.ops else "?"
            if n > 1 and tool not in IDEMPOTENT:
                violations.append(f"{tool} {op} ran {n} times")
        runs = [p for p in self.runs.values() if p.run_id is not None]
        self.counts["runs"] = len(runs)
        for plan in runs:
            assert plan.run_id is not None
            run = await self.gateway.get_run(plan.run_id)
            if run is None:
                violations.append(f"run {plan.run_id} vanished")
                continue
            self.counts[f"runs {run.status.value}"] += 1
            if not run.status.finished:
                violations.append(f"run {run.run_id} is still {run.status.value}")
                continue
            if run.status is RunStatus.FAILED:
                if not run.error:
                    violations.append(f"run {run.run_id} failed without a reason")
                self.counts[f"failure: {(run.error or '')[:60]}"] += 1
            history = await self.gateway.history(run.run_id)
            told = {
                m.get("tool_call_id"): str(m.get("content") or "")
                for m in history
                if m.get("role") == "tool"
            }
            calls_by_id = {
                tc["id"]: json.loads(tc["function"]["arguments"]).get("op")
                for m in history
                if m.get("role") == "assistant"
                for tc in m.get("tool_calls") or []
            }
            for call_id, op in calls_by_id.items():
                text = told.get(call_id)
                told_op[op] = text or ""
                if text is None:
                    if run.status is RunStatus.COMPLETED:
                        violations.append(f"{op}: the model never got a tool message")
                    continue
                if text.startswith("did "):
                    if starts[op] == 0:
                        violations.append(f"{op}: the model was told it ran; it never started")
                elif text.startswith("Outcome unknown"):
                    self.counts["calls in doubt"] += 1
                    if starts[op] == 0:
                        # Claimed, then the worker died before the tool's first line: "may or
                        # may not have run" is the truth the worker can tell.
                        self.counts["calls in doubt that had not started"] += 1
                g = gates_by_op.get(op)
                expect = {
                    "denied": "Not executed: the user",
                    "expired": "Not executed: the approval request",
                    "cancelled": "Not executed: the run was cancelled",
                }
                if g is not None:
                    st = await self.gate_status(g.gate_id)
                    if st in expect and not text.startswith(expect[st]):
                        violations.append(f"{op} {st}, but the model was told {text[:50]!r}")
                    if st == "approved" and not text.startswith(("did ", "Outcome unknown")):
                        violations.append(f"{op} approved, but the model was told {text[:50]!r}")
            root = self.slack.message(
                run.origin.get("channel", ""), run.origin.get("thread_ts", "")
            )
            label = cards.status_label(run.status)
            if root is None or label not in json.dumps(root.blocks, ensure_ascii=False):
                violations.append(f"root message of {run.run_id} does not say {label!r}")

        for rec in self.gates.values():
            st = await self.gate_status(rec.gate_id)
            self.counts[f"gates {st}"] += 1
            n = starts[rec.op]
            if self.opened_events[rec.gate_id] != 1:
                n_open = self.opened_events[rec.gate_id]
                violations.append(f"gate {rec.gate_id} ({rec.op}): {n_open} gate.opened events")
            if st != "pending" and self.decided_events[rec.gate_id] != 1:
                n_dec = self.decided_events[rec.gate_id]
                violations.append(
                    f"{st} gate {rec.gate_id} ({rec.op}): {n_dec} gate.decided events"
                )
            if st == "pending":
                violations.append(f"gate {rec.gate_id} ({rec.op}) still pending")
            elif st == "approved":
                if not rec.sent("approve"):
                    violations.append(f"{rec.op} approved but nobody clicked Approve")
                status = await self.safely(self.redis.hget(self.keys.run(rec.run_id), "status"))
                if status == "completed" and n == 0:
                    if not told_op.get(rec.op, "").startswith("Outcome unknown"):
                        violations.append(f"{rec.op} approved in a completed run but never ran")
                if status == "cancelled" and n == 0:
                    self.counts["approved calls of runs cancelled before they ran"] += 1
            elif st == "denied":
                if not rec.sent("deny-submit"):
                    violations.append(f"{rec.op} denied but nobody submitted a denial")
                if n:
                    violations.append(f"{rec.op} ran although denied")
            elif st == "expired":
                if n:
                    violations.append(f"{rec.op} ran although expired")
            elif st == "cancelled":
                same_run = [g for g in self.gates.values() if g.run_id == rec.run_id]
                if not any(g.sent("cancel") for g in same_run):
                    violations.append(f"{rec.op} cancelled but nobody cancelled its run")
                if n:
                    violations.append(f"{rec.op} ran although cancelled")
        self.counts["decisions (gates decided)"] = sum(
            v for k, v in self.counts.items() if k.startswith("gates ") and k != "gates pending"
        )
        violations += await self.card_problems()
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
            plan = self.runs.get(task or "")
            run_id = plan.run_id if plan is not None else None
            where = f" [run {run_id}" if run_id else " [run ?"
            if run_id and run_id in self.takeovers:
                where += "; " + "; ".join(self.takeovers[run_id])
            if len(e) > 400:
                e = e[:400] + "…"
            out.append(f"{e}{where}]")
        return out
