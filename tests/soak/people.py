"""The people of the soak (part of :class:`tests.soak.test_soak.Soak`).

:class:`SoakSlack` is the fake Slack, indexing what the people see: the replies to each
response_url, the forms opened, the buttons each gate's card shows. The plans
(``tests/soak/plans.py``) are the runs the requester asks for (each with a scripted model
conversation, and one for each child run its sub-agent calls start). :class:`People` starts runs through signed ``/agent`` commands, watches
Redis for runs, their child runs (each parent's children set) and gates, and gives every gate its
seeded fate: approve, deny (button then modal), expire (sometimes a late click), a double
click, an approve/deny race, or a cancel (and the edit and grant fates of
``tests/soak/editors.py``). A person whose click did not take clicks again; a
click acknowledged and then lost is noted.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

from agent_core import Gateway, Keys
from agent_core.testing import FakeOpenAI
from bot import cards, edit_view, grant_view
from tests.slack_fake import FakeSlack, HttpResult, SlackCall, SlackClient
from tests.soak.config import (
    APPROVERS,
    CHANNEL,
    EDIT_FATES,
    EDIT_WEIGHTS,
    ESCALATE_TO,
    FATE_WEIGHTS,
    FATES,
    GRANT_FATES,
    GRANT_WEIGHTS,
    GROUPS,
    MAX_OPEN_RUNS,
    QUORUM_FATES,
    QUORUM_WEIGHTS,
    REQUESTER,
    ROUTED_FATES,
    ROUTED_WEIGHTS,
    SEED,
    STRANGER,
)
from tests.soak.plans import CallPlan, RunPlan, final_answer, op_depth, plan_run, script_of
from tests.soak.soak_agent import EDITABLE, GRANTABLE, POLICIES, QUORUM, ROUTED

__all__ = ["CallPlan", "RunPlan", "final_answer", "op_depth"]  # the plans, as before


class SoakSlack(FakeSlack):
    """A :class:`FakeSlack` that also indexes what the soak looks up often: the replies to
    each response_url, the forms opened per trigger_id, and the Approve/Deny buttons each
    gate's card showed (``calls`` copies every call)."""

    def __init__(self) -> None:
        super().__init__()
        self.replies: dict[str, list[str]] = {}
        self.opened: dict[str, dict[str, Any]] = {}
        # gate id -> {action id: button value} as last shown, and where that card is. Kept
        # once the card loses its buttons: a person's Slack may still show them (late clicks).
        self.buttons: dict[str, dict[str, str]] = {}
        self.card_at: dict[str, tuple[str, str]] = {}

    def _record(self, call: SlackCall) -> None:
        super()._record(call)
        with self._lock:
            if call.method.startswith("response_url:"):
                name = call.method.split(":", 1)[1]
                self.replies.setdefault(name, []).append(str(call.args.get("text", "")))
            elif call.method == "views.open" and call.ok:
                self.opened[str(call.args.get("trigger_id"))] = call.args["view"]
            elif call.method in ("chat.postMessage", "chat.update") and call.ok:
                where = (str(call.response.get("channel", "")), str(call.response.get("ts", "")))
                for block in call.args.get("blocks") or []:
                    if not isinstance(block, dict) or block.get("type") != "actions":
                        continue
                    for el in block.get("elements") or []:
                        action = el.get("action_id")
                        if action in BUTTONS.values():
                            value = str(el.get("value") or "")
                            gate_id = cards.parse_button_value(value)[0]
                            self.buttons.setdefault(gate_id, {})[action] = value
                            self.card_at[gate_id] = where


# --------------------------------------------------------------------------- the people
BUTTONS = {
    "approve": cards.APPROVE_ACTION,
    "deny-button": cards.DENY_ACTION,
    "edit-button": edit_view.EDIT_ACTION,
    "grant-button": grant_view.GRANT_ACTION,
}


@dataclass
class ChildRun:
    """A child run found in Redis (a member of its parent's children set)."""

    run_id: str
    parent: str  # the parent run's id
    parent_call: str  # the parent's tool-call id
    task: str
    depth: int
    top: str  # the run id of the top-level run above it
    plan: RunPlan | None  # None: a task no plan of the soak names (a violation)


@dataclass
class Click:
    kind: str  # approve | deny-button | deny-submit | cancel
    user: str
    sent_at: float  # time.monotonic()
    status: int  # HTTP status, 0 when the request failed
    reply_name: str
    sent_unix: float = field(default_factory=time.time)
    target: str = ""  # a cancel's: the run it cancels
    acked_unix: float | None = None  # when its HTTP 200 came (time.time())
    outsider: bool = False  # by someone who may not decide the gate (then): must be refused
    answer: str = ""  # a modal submission's HTTP answer (its errors, if any)


@dataclass
class GateRecord:
    gate_id: str
    run_id: str
    op: str
    tool: str
    fate: str
    deadline: float  # unix seconds
    clicks: list[Click] = field(default_factory=list)
    depth: int = 0  # of its run: > 0 for a nested gate (a sub-agent's)
    cancel_run: str = ""  # the run a "cancel" fate cancels (default: the gate's own)

    def sent(self, kind: str, by: str = "") -> bool:
        """Whether someone who may decide the gate sent a click of that kind, or ``by`` did
        (the decider: a click sent as an outsider's may arrive once it may decide, e.g. after
        the escalation; verdict's check_deciders judges that). An approval may also be an
        edit's or a grant's submission."""
        kinds = {kind, "edit-submit", "grant-submit"} if kind == "approve" else {kind}
        return any(c.kind in kinds and (not c.outsider or c.user == by) for c in self.clicks)


def fate_of(op: str, tool: str) -> str:
    """The seeded fate of the gate of call ``op``, from the fates of its tool's kind."""
    rng = random.Random(f"{SEED}:{op}")
    if tool in QUORUM:
        fate = rng.choices(QUORUM_FATES, QUORUM_WEIGHTS)[0]
        if fate == "escalated" and not POLICIES[tool].escalate_to:
            fate = "quorum"
        return fate
    if tool in ROUTED:
        return rng.choices(ROUTED_FATES, ROUTED_WEIGHTS)[0]
    if tool in EDITABLE:
        return rng.choices(EDIT_FATES, EDIT_WEIGHTS)[0]
    if tool in GRANTABLE:
        return rng.choices(GRANT_FATES, GRANT_WEIGHTS)[0]
    return rng.choices(FATES, FATE_WEIGHTS)[0]


def deciders(tool: str) -> tuple[str, ...]:
    """Who may decide the tool's gates (before any escalation): its approvers, user groups
    expanded, else APPROVERS."""
    policy = POLICIES.get(tool)
    if policy is None or not policy.approvers:
        return APPROVERS
    return tuple(u for a in policy.approvers for u in GROUPS.get(a, (a,)))


def outsiders(tool: str) -> tuple[str, ...]:
    """People who may not decide the tool's gates (before an escalation): the requester, a
    stranger, the other approvers, whom it escalates to."""
    allowed = deciders(tool)
    policy = POLICIES.get(tool)
    others = [REQUESTER, STRANGER, *APPROVERS, *(policy.escalate_to if policy else ())]
    return tuple(dict.fromkeys(u for u in others if u not in allowed))


class People:
    """The requester and the approvers: the load, and a decision (or none) for every gate."""

    # Set by Soak.__init__ (tests/soak/test_soak.py).
    rng: random.Random
    slack: SoakSlack
    model: FakeOpenAI
    client: SlackClient
    redis: Redis
    keys: Keys
    gateway: Gateway
    counts: Counter[str]
    runs: dict[str, RunPlan]  # task -> plan
    by_run_id: dict[str, RunPlan]
    gates: dict[str, GateRecord]
    ops: dict[str, CallPlan]
    finished: set[str]
    child_plans: dict[str, RunPlan]  # a child run's task -> its plan
    children: dict[str, ChildRun]  # child run id -> what the soak learnt of it
    finished_children: set[str]  # child run ids seen finished
    parent_waits: dict[str, float]  # run id -> since when it waits with no reason to
    lost: list[str]  # acknowledged requests whose effect never happened
    runs_log: Path
    loading: bool
    _n: int

    if TYPE_CHECKING:

        def spawn(self, coro: Awaitable[Any]) -> None: ...

        async def safely(self, coro: Awaitable[Any], default: Any = None) -> Any: ...

        def saw(self, gate_id: str, status: str, how: str, issued: float) -> None: ...

        def web_killed_between(self, t0: float, t1: float) -> bool: ...

        def redis_down_between(self, t0: float, t1: float) -> bool: ...

        def clicked(self, rec: GateRecord, c: Click) -> None: ...

        async def act_more(self, rec: GateRecord, rng: random.Random, a: str) -> None: ...

    # ------------------------------------------------------------------ helpers
    def reply_name(self, what: str) -> str:
        self._n += 1
        return f"{what}{self._n}"

    async def send(self, make: Callable[[], Awaitable[HttpResult]]) -> int:
        """One request to web; 0 when it did not get through (web down or killed)."""
        try:
            return (await asyncio.wait_for(make(), timeout=10)).status
        except Exception:
            self.counts["requests not answered (web down)"] += 1
            return 0

    def told(self, name: str) -> str:
        """What was posted to the response_url called ``name``."""
        return " | ".join(self.slack.replies.get(name, []))

    # ------------------------------------------------------------------ load
    def open_runs(self) -> int:
        return sum(1 for p in self.runs.values() if p.task not in self.finished and not p.abandoned)

    async def starter(self) -> None:
        index = 0
        while self.loading:
            if self.open_runs() < MAX_OPEN_RUNS:
                self.spawn(self.start_run(index))
                index += 1
            await asyncio.sleep(self.rng.uniform(0.05, 0.4))

    async def start_run(self, index: int) -> None:
        rng = random.Random(f"{SEED}:start:{index}")
        for attempt in range(30):
            if not self.loading:
                return
            plan = plan_run(rng, index, attempt)
            # The children's scripts first: a child can start as soon as the run does.
            for child in plan.descendants():
                self.model.script(child.task, script_of(child))
                self.child_plans[child.task] = child
            self.model.script(plan.task, script_of(plan))
            for c in plan.calls():
                self.ops[c.op] = c
            self.runs[plan.task] = plan
            plan.reply_name = self.reply_name("cmd")
            sent = time.monotonic()
            status = await self.send(
                functools.partial(
                    self.client.command,
                    plan.task,
                    user_id=REQUESTER,
                    channel_id=CHANNEL,
                    response_url=self.slack.response_url(plan.reply_name),
                )
            )
            if status == 200:
                plan.acked_at = time.monotonic()
                self.counts["slash commands acknowledged"] += 1
                if await self.wait_started(plan, 20.0):
                    return
                if "unavailable" in self.told(plan.reply_name):
                    self.counts["slash commands told 'backend unavailable'"] += 1
                elif self.web_killed_between(sent, sent + 3):
                    # Acknowledged only once the run is in Redis (09da2b7), unless Redis was
                    # down for the whole 2 s budget.
                    if self.redis_down_between(sent, sent + 3):
                        self.counts["slash commands acked during a Redis outage, web killed"] += 1
                    else:
                        self.lost.append(f"/agent {plan.task!r} acknowledged, then no run")
                else:
                    self.counts["slash commands acknowledged, no run after 20 s"] += 1
            plan.abandoned = True  # a person tries again (a run may still show up: it counts)
            await asyncio.sleep(0.5)

    async def wait_started(self, plan: RunPlan, seconds: float) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if plan.run_id is not None:
                return True
            await asyncio.sleep(0.2)
        return plan.run_id is not None

    def log_run(self, line: str) -> None:
        with self.runs_log.open("a", encoding="utf-8") as f:
            f.write(line + "\n")

    def open_children(self) -> list[str]:
        """The child runs found and not yet seen finished."""
        return [c for c in self.children if c not in self.finished_children]

    def op_of(self, args: dict[str, Any]) -> str:
        """The op of a call by its arguments: its ``op``, or for a sub-agent call the op the
        plan gave it (its ``task`` names the child plan)."""
        if "op" in args:
            return str(args["op"])
        plan = self.child_plans.get(str(args.get("task")))
        return plan.parent_op if plan is not None else f"?{args}"

    async def watcher(self) -> None:
        """Learns run ids (child runs too) and new gates from Redis, and spawns each gate's
        fate."""
        known_ids: set[str] = set()
        while True:
            ids = []
            for shard in self.keys.all_shards():
                ids += await self.safely(
                    self.redis.zrange(self.keys.user_runs(REQUESTER, shard), 0, -1), []
                )
            for run_id in [i for i in ids if i not in known_ids]:
                task = await self.safely(self.redis.hget(self.keys.run(run_id), "task"))
                plan = self.runs.get(task or "")
                if plan is None:
                    continue
                known_ids.add(run_id)
                plan.run_id = run_id
                plan.abandoned = False
                self.by_run_id[run_id] = plan
                self.log_run(f"run {run_id}: {task}")
            open_ids = [p.run_id for p in self.by_run_id.values() if p.task not in self.finished]
            for run_id in [*open_ids, *self.open_children()]:
                assert run_id is not None
                await self.look_at_run(run_id)
            await asyncio.sleep(0.25)

    async def find_children(self, run_id: str) -> list[str] | None:
        """The run's child runs (recording the new ones); None while Redis is down."""
        members = await self.safely(self.redis.smembers(self.keys.children(run_id)))
        if members is None:
            return None
        for cid in sorted(members):
            if cid in self.children:
                continue
            got = await self.safely(
                self.redis.hmget(self.keys.run(cid), ["task", "parent_call", "depth"])
            )
            if got is None or got[0] is None:
                return None
            task, parent_call, depth = got
            parent = self.children.get(run_id)
            plan = self.child_plans.get(task)
            if plan is not None and plan.run_id is None:
                plan.run_id = cid
            self.log_run(f"run {cid}: {task} (depth {depth}, parent {run_id}, call {parent_call})")
            self.children[cid] = ChildRun(
                cid,
                run_id,
                parent_call or "",
                task,
                int(depth or 0),
                parent.top if parent is not None else run_id,
                plan,
            )
        return sorted(members)

    async def look_at_run(self, run_id: str) -> None:
        run = await self.safely(self.gateway.get_run(run_id))
        if run is None:
            return
        child = self.children.get(run_id)
        if run.status.finished:
            # Read after the status: a finished run starts no more children.
            if await self.find_children(run_id) is None:
                return
            if child is not None:
                self.finished_children.add(run_id)
            else:
                self.finished.add(self.by_run_id[run_id].task)
            self.parent_waits.pop(run_id, None)
            return
        gates = await self.safely(self.gateway.gates(run_id))
        if gates is None:
            return
        for gate in gates:
            if gate.gate_id in self.gates:
                continue
            op = self.op_of(gate.args)
            fate = fate_of(op, gate.tool)
            if (gate.decided_by or "").startswith("grant:"):
                fate = "by-grant"  # opened approved: a grant of the thread decided it
            rec = GateRecord(gate.gate_id, run_id, op, gate.tool, fate, gate.deadline)
            if child is not None:
                rec.depth = child.depth
                # Cancel the top run (its cascade reaches this one), the gate's own run's
                # parent, or the gate's own run (its parent is told it was cancelled).
                r = random.Random(f"{SEED}:{op}:cancel").random()
                rec.cancel_run = child.top if r < 0.6 else child.parent if r < 0.8 else run_id
            self.gates[gate.gate_id] = rec
            self.counts[f"fate: {fate}"] += 1
            if child is not None:
                self.counts[f"nested fate: {fate}"] += 1
            self.spawn(self.decide(rec))
        kids = await self.find_children(run_id)
        if kids:
            await self.watch_wait(run_id, run.status.value, gates, kids)

    async def watch_wait(self, run_id: str, status: str, gates: list[Any], kids: list[str]) -> None:
        """How long a parent waits for approval with none of its gates pending and every
        child finished (the last child's report should have resumed it): the longest such
        wait is counted. A parent still waiting so at the end is a violation (verdict)."""
        waiting = status == "awaiting_approval" and not any(
            g.status.value == "pending" for g in gates
        )
        if waiting:
            for kid in kids:
                st = await self.safely(self.redis.hget(self.keys.run(kid), "status"))
                if st not in ("completed", "failed", "cancelled"):
                    waiting = False
                    break
        if not waiting:
            self.parent_waits.pop(run_id, None)
            return
        since = self.parent_waits.setdefault(run_id, time.monotonic())
        key = "longest wait of a parent whose children had all finished (s)"
        self.counts[key] = max(self.counts[key], round(time.monotonic() - since))

    # ------------------------------------------------------------------ decisions
    async def gate_status(self, gate_id: str) -> str | None:
        issued = time.monotonic()
        st = await self.safely(self.redis.hget(self.keys.gate(gate_id), "status"))
        if st is None:
            return None
        self.saw(gate_id, str(st), "read from Redis", issued)
        return str(st)

    async def button(self, rec: GateRecord, action: str, wait: float) -> str | None:
        """The value of the card's button as a person sees it (waits for the card)."""
        end = time.monotonic() + wait
        while True:
            value = self.slack.buttons.get(rec.gate_id, {}).get(action)
            if value is not None or time.monotonic() >= end:
                return value
            await asyncio.sleep(0.1)

    async def click(
        self,
        rec: GateRecord,
        kind: str,
        user: str,
        *,
        wait: float = 5.0,
        outsider: bool = False,
        **kw: Any,
    ) -> Click:
        """Click Approve or Deny on the gate's card, with the value the card carries."""
        name = self.reply_name("click")
        action = BUTTONS[kind]
        value = await self.button(rec, action, wait)
        sent = time.monotonic()
        if value is None:  # no card shown yet: nothing to click (the person looks again)
            self.counts["clicks not made: no card shown yet"] += 1
            return Click(kind, user, sent, 0, name, outsider=outsider)
        channel, ts = self.slack.card_at.get(rec.gate_id, (CHANNEL, "1700000000.000100"))
        status = await self.send(
            lambda: self.client.action(
                action,
                value,
                user_id=user,
                channel_id=channel,
                message_ts=ts,
                response_url=self.slack.response_url(name),
                **kw,
            )
        )
        c = Click(kind, user, sent, status, name, outsider=outsider)
        if status == 200:
            c.acked_unix = time.time()
        rec.clicks.append(c)
        if outsider and status == 200:
            self.counts[f"outsider clicks acknowledged ({kind})"] += 1
        if not outsider:
            self.clicked(rec, c)
        return c

    async def deny(self, rec: GateRecord, user: str, *, outsider: bool = False) -> None:
        """The Deny button, then the modal it opens, submitted with a reason."""
        trigger = self.reply_name("trigger")
        c = await self.click(rec, "deny-button", user, trigger_id=trigger, outsider=outsider)
        if c.status != 200:
            return
        end = time.monotonic() + 3
        while time.monotonic() < end and trigger not in self.slack.opened:
            await asyncio.sleep(0.05)
        view = self.slack.opened.get(trigger)
        if view is None:
            return  # the web died before opening the form: the person clicks again
        values = {cards.REASON_BLOCK: {cards.REASON_ACTION: {"value": f"soak says no to {rec.op}"}}}
        name = self.reply_name("submit")
        sent = time.monotonic()
        status = await self.send(
            lambda: self.client.view_submission(
                view["callback_id"], view["private_metadata"], values=values, user_id=user
            )
        )
        rec.clicks.append(Click("deny-submit", user, sent, status, name, outsider=outsider))
        if outsider:
            self.counts["outsiders' deny forms opened (the submission must be refused)"] += 1

    async def cancel(self, rec: GateRecord) -> None:
        name = self.reply_name("cancel")
        target = rec.cancel_run or rec.run_id
        sent = time.monotonic()
        status = await self.send(
            lambda: self.client.command(
                f"cancel {target}",
                user_id=REQUESTER,
                channel_id=CHANNEL,
                response_url=self.slack.response_url(name),
            )
        )
        rec.clicks.append(Click("cancel", REQUESTER, sent, status, name, target=target))
        if rec.depth:
            whose = (
                "its own (child) run"
                if target == rec.run_id
                else "its parent (a child run)"
                if target in self.children
                else "the top run"
            )
            self.counts[f"cancels sent for a nested gate: {whose}"] += 1

    async def decide(self, rec: GateRecord) -> None:
        rng = random.Random(f"{SEED}:{rec.op}:timing")
        await asyncio.sleep(rng.uniform(0.1, 2.5))
        if rec.fate in ("expire", "half"):
            if rec.fate == "half":  # one approval of the two needed, then nobody: it expires
                await self.click(rec, "approve", rng.choice(deciders(rec.tool)))
            if rng.random() < 0.3:  # a click after the deadline: must not run the call
                await asyncio.sleep(max(0.0, rec.deadline - time.time()) + 0.3)
                # On the card as it was shown (a Slack client that has not refreshed yet).
                user = rng.choice(deciders(rec.tool))
                if (await self.click(rec, "approve", user, wait=0)).status:
                    self.counts["late clicks (after the deadline)"] += 1
            return
        if rec.fate == "escalated" and not await self.wait_escalated(rec, rng):
            return  # decided meanwhile, expired or gone: nothing more to click
        give_up = time.monotonic() + 90
        attempt = 0
        while time.monotonic() < give_up:
            if await self.gate_status(rec.gate_id) != "pending":
                return
            if attempt:
                self.counts["clicked again (the first did not take)"] += 1
            attempt += 1
            n_before = len(rec.clicks)
            await self.act(rec, rng)
            # Did it take? Give the web (and a restarting Redis) a moment.
            for _ in range(30):
                await asyncio.sleep(0.1)
                if await self.gate_status(rec.gate_id) != "pending":
                    break
            else:
                self.note_lost(rec, rec.clicks[n_before:])
            await asyncio.sleep(rng.uniform(0.2, 1.0))

    async def act(self, rec: GateRecord, rng: random.Random) -> None:
        """One try at the gate's fate: the clicks (or the cancel) that should decide it."""
        fate = rec.fate
        who = list(deciders(rec.tool))
        rng.shuffle(who)
        a, b = who[0], who[1 % len(who)]
        c = who[2 % len(who)]
        if fate == "approve":
            await self.click(rec, "approve", a)
        elif fate == "deny":
            await self.deny(rec, a)
        elif fate == "double":
            await asyncio.gather(self.click(rec, "approve", a), self.click(rec, "approve", a))
        elif fate == "race":
            await asyncio.gather(self.click(rec, "approve", a), self.deny(rec, b))
        elif fate == "cancel":
            await self.cancel(rec)
        elif fate in ("outsider-approve", "outsider-deny"):
            who_not = await self.outsiders_now(rec)
            if fate == "outsider-deny":  # the starter may deny their own run's call
                who_not = [u for u in who_not if u != REQUESTER]
            if who_not:
                if fate == "outsider-approve":
                    await self.click(rec, "approve", rng.choice(who_not), outsider=True)
                else:
                    await self.deny(rec, rng.choice(who_not), outsider=True)
            await self.click(rec, "approve", a)
        elif fate == "escalated":  # the escalated person approves (with one more, for a quorum)
            if rec.tool in QUORUM:
                await asyncio.gather(
                    self.click(rec, "approve", a), self.click(rec, "approve", ESCALATE_TO)
                )
            else:
                await self.click(rec, "approve", ESCALATE_TO)
        elif fate == "quorum":
            await asyncio.gather(self.click(rec, "approve", a), self.click(rec, "approve", b))
        elif fate == "quorum-race":  # three at once: two approvals and a denial
            await asyncio.gather(
                self.click(rec, "approve", a), self.click(rec, "approve", b), self.deny(rec, c)
            )
        elif fate == "quorum-deny":
            await self.click(rec, "approve", a)
            await self.deny(rec, b)
        elif fate == "quorum-again":  # the same person twice counts once; then a second
            await asyncio.gather(self.click(rec, "approve", a), self.click(rec, "approve", a))
            await self.click(rec, "approve", b)
        elif fate == "requester":  # the requester's approval never counts
            await self.click(rec, "approve", REQUESTER, outsider=True)
            await asyncio.gather(self.click(rec, "approve", a), self.click(rec, "approve", b))
        else:
            await self.act_more(rec, rng, a)  # edits and grants (tests/soak/editors.py)

    async def gate_fields(self, gate_id: str, *fields: str) -> list[str | None] | None:
        """Fields of the gate's hash (None while Redis is down)."""
        got = await self.safely(self.redis.hmget(self.keys.gate(gate_id), list(fields)))
        return None if got is None else list(got)

    async def outsiders_now(self, rec: GateRecord) -> list[str]:
        """Who may not decide the gate now (its escalation, if it fired, let more in)."""
        got = await self.gate_fields(rec.gate_id, "escalated_at")
        if got is None:
            return []
        escalated = bool(got[0])
        return [u for u in outsiders(rec.tool) if not (escalated and u == ESCALATE_TO)]

    async def wait_escalated(self, rec: GateRecord, rng: random.Random) -> bool:
        """The escalated fate: whom the gate escalates to clicks too early once (refused, when
        well before the escalation), then waits for it. False: the gate left pending (or
        could not be read) before it escalated."""
        early = True
        end = rec.deadline + 1
        while time.time() < end:
            got = await self.gate_fields(rec.gate_id, "status", "escalate_at", "escalated_at")
            if got is not None:
                status, at, fired = got
                if status != "pending":
                    return False
                if fired:
                    self.counts["escalated fates: the escalation seen"] += 1
                    return True
                if early and at and time.time() < float(at) - 0.7:
                    early = False
                    await self.click(rec, "approve", ESCALATE_TO, outsider=True)
                    self.counts["escalated fates: a click before the escalation"] += 1
            await asyncio.sleep(0.2)
        return False

    def note_lost(self, rec: GateRecord, clicks: list[Click]) -> None:
        """Clicks that got through but decided nothing within 3 s: why?"""
        deciding = [
            c
            for c in clicks
            if c.status == 200 and c.kind in ("approve", "deny-submit") and not c.outsider
        ]
        for c in deciding:
            text = self.told(c.reply_name)
            low = text.lower()
            if any(w in low for w in ("unavailable", "not been recorded", "not answering")):
                self.counts["clicks told 'service unavailable' (Redis down)"] += 1
            elif c.sent_unix >= rec.deadline:
                continue
            elif text:
                # "counted": a quorum's approval, waiting for the others (a pending gate with
                # its quorum met is a violation of its own: verdict.check_quorums).
                if not any(
                    w in low for w in ("already", "expired", "cancelled", "closed", "counted")
                ):
                    # An approver clicked the card's own button in time and was refused.
                    self.lost.append(f"{c.kind} of {rec.op} refused: {text[:120]!r}")
                continue
            elif self.web_killed_between(c.sent_at, c.sent_at + 3):
                # Acknowledged only once the decision is in Redis (adc56f9), unless Redis was
                # down for the whole 2 s budget.
                if self.redis_down_between(c.sent_at, c.sent_at + 3):
                    self.counts["clicks acked during a Redis outage, web killed"] += 1
                else:
                    self.lost.append(f"{c.kind} of {rec.op} acknowledged, then lost")
            else:
                self.counts["clicks that took more than 3 s"] += 1
