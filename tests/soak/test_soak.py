"""The soak (``make soak``): hundreds of runs through random decisions while everything crashes.

Real processes: one ``web`` (``python -m bot``) and two ``worker`` (``python -m
agent_core.worker``), a ``redis-server`` with its append-only file (``appendfsync always``),
:class:`bot.testing.FakeSlack` and :class:`agent_core.testing.FakeOpenAI` (scripted per task)
in this process. The agent (``tests/soak/soak_agent.py``) has gated tools (one slow, one
idempotent) and an un-gated one; each journals ``start``/``end`` with a unique op id.

Load: runs start through signed ``/agent`` slash commands; each run makes 1-3 model turns of
1-2 tool calls. Every gate gets a seeded random fate: approve, deny (the Deny button, then the
modal's submission), expire (nobody answers; sometimes a click arrives after the deadline), a
double click, an approve/deny race between two approvers, or a cancelled run. One worker opens
gates with ``APPROVAL_TIMEOUT=3`` s, the other with 12 s. Clicks are signed and sent to ``web``
like Slack sends them; a person whose click did not take (``web`` down, Redis down, or the
click acknowledged but lost) clicks again a little later.

Chaos: workers and ``web`` are SIGKILLed at random moments and restarted; Redis is SIGKILLed
and restarted from its append-only file a few times; and a worker is paused (SIGSTOP) for
longer than its lease (``WORKER_LEASE=2`` s, paused 2.5-6 s), then continued (SIGCONT) —
sometimes while one of its tools is running. A paused worker must write nothing when it wakes:
the other worker takes its runs over (the run's ``fence`` moves on while the holder is
stopped: a *takeover*), and the paused one logs "lost its lease" / "result of … discarded".
Pauses and takeovers are counted and printed.

A consumer group of the soak's own (``soak-audit``) reads every event: a second
``gate.opened`` or ``gate.decided`` for one gate id, a second ``tool.executed`` for one call
or a second end for one run is a violation; so is a gate seen decided and later pending (or
decided otherwise) by any of the soak's reads.

Afterwards (chaos stopped, every process up again, the load drained):

- every run is completed (possibly reporting an in-doubt call), failed with a reason, or
  cancelled; the model was told the truth about every call (output, declined, timed out,
  outcome unknown);
- every call ran at most once (the idempotent tool excepted), an approved call of a completed
  run exactly once, a denied/expired/cancelled call never; a gate was approved or denied only
  if someone asked for that;
- every card shows its gate's final outcome and no message anywhere carries live buttons for a
  decided gate; every run's root message shows the run's final status; clicks use the button
  values of the card as posted (``<gate id>:<args hash>``), like Slack sends them;
- no acknowledged click or ``/agent`` was lost to a ``web`` SIGKILL (``web`` acknowledges
  once the decision or the run is in Redis; only a Redis outage longer than that 2 s budget
  excuses it, counted apart).

Known issues (each has a strict xfail test, see KNOWN below) are counted apart and fail the
soak only with ``SOAK_STRICT=1`` — or once their xfail mark is gone from the test that pins
them (the fix landed: from then on they are violations). ``SOAK_SECONDS`` (default 600) is
the length of the chaos phase; ``SOAK_SEED`` reproduces the random choices (the seed is
printed).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import datetime
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from redis.exceptions import RedisError, ResponseError

from agent_core import Gateway, Keys, RunStatus, create_redis
from agent_core.testing import FakeOpenAI, Step, call, calls, reply
from bot import cards
from bot.testing import FakeSlack, HttpResult, SlackCall, SlackClient
from tests.redis_server import RedisServer, free_port
from tests.soak.soak_agent import IDEMPOTENT

SOAK_SECONDS = float(os.environ.get("SOAK_SECONDS") or 600)
SEED = int(os.environ.get("SOAK_SEED") or random.randrange(1 << 32))
STRICT = os.environ.get("SOAK_STRICT") == "1"

REPO = Path(__file__).resolve().parents[2]
SECRET = "soak-signing-secret"
PREFIX = "soak"
CHANNEL = "C0SOAK"
REQUESTER = "U0SOAKREQ"
APPROVER = "U0SOAKAPP"
APPROVER2 = "U0SOAKBOSS"
SHORT_TIMEOUT, LONG_TIMEOUT = 3.0, 12.0
MAX_OPEN_RUNS = 30
DRAIN_SECONDS = 300.0  # runs to finish after the chaos (a killed web's events wait 30 s)
SETTLE_SECONDS = 240.0  # cards to settle after that (a killed web's card lock lives 120 s)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(SOAK_SECONDS + 900))]

FATES = ["approve", "deny", "expire", "double", "race", "cancel"]
FATE_WEIGHTS = [40, 22, 12, 9, 9, 8]

# Chaos: a worker paused (SIGSTOP) for longer than its lease, then continued.
WORKER_LEASE = 2.0
PAUSE_SECONDS = (2.5, 6.0)
AUDIT_GROUP = "soak-audit"  # the soak's own consumer group on the events stream


@dataclass(frozen=True)
class Known:
    """A bug with a strict xfail test of its own: counted apart while that mark is there."""

    why: str
    test_file: str
    test_name: str

    def fixed(self) -> bool:
        """The pinning test lost its xfail mark (or is gone): the fix landed."""
        try:
            tree = ast.parse((REPO / self.test_file).read_text())
        except (OSError, SyntaxError):
            return True
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
                node.name == self.test_name
            ):
                return not any("xfail" in ast.unparse(d) for d in node.decorator_list)
        return True


KNOWN = {
    "orphan_card": Known(
        "a second card posted for a gate after a web process died between posting the first "
        "and recording it: the first keeps live buttons",
        "tests/security/test_crash_windows.py",
        "test_no_card_keeps_live_buttons_after_a_crash_between_post_and_record",
    ),
}


# --------------------------------------------------------------------------- processes
class Proc:
    """A process this test started; signalled by its own PID only."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        if self.alive:  # never two of one: the old one would be lost, and keep running
            return
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.send_signal(signal.SIGCONT)  # a paused one must wake to see the TERM
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def errors(self) -> list[str]:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [line for line in text.splitlines() if " ERROR " in line]


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
                        if action in (cards.APPROVE_ACTION, cards.DENY_ACTION):
                            value = str(el.get("value") or "")
                            gate_id = cards.parse_button_value(value)[0]
                            self.buttons.setdefault(gate_id, {})[action] = value
                            self.card_at[gate_id] = where


# --------------------------------------------------------------------------- the plan
@dataclass
class CallPlan:
    tool: str
    op: str
    args: dict[str, Any]


@dataclass
class RunPlan:
    index: int
    attempt: int
    task: str
    turns: list[list[CallPlan]]
    run_id: str | None = None
    acked_at: float | None = None
    reply_name: str = ""
    abandoned: bool = False  # acknowledged or not, it never became a run (yet)


@dataclass
class Click:
    kind: str  # approve | deny-button | deny-submit | cancel
    user: str
    sent_at: float  # time.monotonic()
    status: int  # HTTP status, 0 when the request failed
    reply_name: str
    sent_unix: float = field(default_factory=time.time)


@dataclass
class GateRecord:
    gate_id: str
    run_id: str
    op: str
    tool: str
    fate: str
    deadline: float  # unix seconds
    clicks: list[Click] = field(default_factory=list)

    def sent(self, kind: str) -> bool:
        return any(c.kind == kind for c in self.clicks)


def plan_run(rng: random.Random, index: int, attempt: int) -> RunPlan:
    task = f"soak {SEED} run {index} try {attempt}"
    turns: list[list[CallPlan]] = []
    for t in range(rng.choice([1, 1, 2, 2, 3])):
        turn = []
        for k in range(rng.choice([1, 1, 1, 2])):
            op = f"{index}.{attempt}.{t}.{k}"
            tool = rng.choices(["act", "slow_act", "resync", "peek"], [55, 15, 10, 20])[0]
            args: dict[str, Any] = {"op": op}
            if tool == "slow_act":
                args["seconds"] = round(rng.uniform(0.2, 1.5), 2)
            turn.append(CallPlan(tool, op, args))
        turns.append(turn)
    return RunPlan(index, attempt, task, turns)


def script_of(plan: RunPlan) -> list[Step]:
    steps: list[Step] = []
    for turn in plan.turns:
        if len(turn) == 1:
            steps.append(call(turn[0].tool, turn[0].args))
        else:
            steps.append(calls([(c.tool, c.args) for c in turn]))
    steps.append(reply(f"final answer of {plan.task}"))
    return steps


# --------------------------------------------------------------------------- the soak
class Soak:
    def __init__(
        self, tmp: Path, redis_server: RedisServer, slack: SoakSlack, model: FakeOpenAI
    ) -> None:
        self.tmp = tmp
        self.rng = random.Random(SEED)
        self.redis_server = redis_server
        self.slack = slack
        self.model = model
        self.keys = Keys(PREFIX)
        self.journal = tmp / "journal.txt"
        self.journal.touch()
        self.port = free_port()
        self.counts: Counter[str] = Counter()
        self.known: Counter[str] = Counter()
        self.runs: dict[str, RunPlan] = {}  # task -> plan
        self.by_run_id: dict[str, RunPlan] = {}
        self.gates: dict[str, GateRecord] = {}
        self.ops: dict[str, CallPlan] = {}
        self.finished: set[str] = set()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.web_kills: list[float] = []
        self.redis_outages: list[tuple[float, float]] = []
        self.lost: list[str] = []  # acknowledged requests whose effect never happened
        self.error_kinds: Counter[str] = Counter()
        self.orphans: set[str] = set()
        # Seen by the soak's own reads and its events audit: violations found along the way.
        # gate id -> (first decided status seen, when the soak learnt it: time.monotonic())
        self.seen_status: dict[str, tuple[str, float]] = {}
        self.flipped: set[str] = set()
        self.audit_violations: list[str] = []
        self.opened_events: Counter[str] = Counter()  # gate id -> gate.opened events
        self.decided_events: Counter[str] = Counter()  # gate id -> gate.decided events
        self.executed_events: Counter[str] = Counter()  # run id/call id -> tool.executed
        self.end_events: Counter[str] = Counter()  # run id -> run.completed/failed/cancelled
        self.audited: set[str] = set()  # event ids already looked at
        self.running_tools: dict[str, tuple[str, int]] = {}  # op -> (tool, pid), not ended
        self._journal_at = 0
        self.paused: subprocess.Popen[bytes] | None = None
        # run id -> "worker1 pid 123 stopped 12:00:00,000-12:00:04,000, fence 3->4" per takeover
        self.takeovers: dict[str, list[str]] = {}
        self.chaos_log = tmp / "chaos.log"  # every fault, timestamped like the process logs
        self.loading = True
        self.chaos = True
        self.redis = create_redis(redis_server.url, socket_timeout=5.0)
        self.gateway = Gateway(self.redis, self.keys, agent_name="soak")
        self.client = SlackClient(f"http://127.0.0.1:{self.port}/slack/events", SECRET, fake=slack)
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", "/tmp"),
            "PYTHONPATH": str(REPO),
            "REDIS_URL": redis_server.url,
            "KEY_PREFIX": PREFIX,
            "AGENT": "tests.soak.soak_agent:agent",
            "OPENAI_API_KEY": "sk-soak-not-a-secret",
            "OPENAI_BASE_URL": model.base_url,
            "OPENAI_MODEL": "fake-model",
            "OPENAI_MAX_RETRIES": "5",
            "WORKER_LEASE": str(WORKER_LEASE),
            "SWEEP_INTERVAL": "0.2",
            "SOAK_JOURNAL": str(self.journal),
            "SLACK_BOT_TOKEN": slack.token,
            "SLACK_SIGNING_SECRET": SECRET,
            "SLACK_API_URL": slack.base_url,
            "APPROVERS": f"{APPROVER},{APPROVER2}",
            "PORT": str(self.port),
            "LOG_LEVEL": "INFO",
        }
        self.workers = [
            Proc(
                f"worker{i}",
                [sys.executable, "-m", "agent_core.worker"],
                env | {"APPROVAL_TIMEOUT": str(timeout)},
                tmp / f"worker{i}.log",
            )
            for i, timeout in enumerate((SHORT_TIMEOUT, LONG_TIMEOUT))
        ]
        self.web = Proc("web", [sys.executable, "-m", "bot"], env, tmp / "web.log")
        self._n = 0

    # ------------------------------------------------------------------ helpers
    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

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

    async def safely(self, coro: Awaitable[Any], default: Any = None) -> Any:
        """A Redis read of the driver's own; ``default`` while Redis is down."""
        try:
            return await coro
        except (RedisError, OSError):
            return default

    def told(self, name: str) -> str:
        """What was posted to the response_url called ``name``."""
        return " | ".join(self.slack.replies.get(name, []))

    def note(self, what: str) -> str:
        """Append a line to chaos.log (timestamps comparable with the processes' logs)."""
        stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
        with self.chaos_log.open("a", encoding="utf-8") as f:
            f.write(f"{stamp} {what}\n")
        return stamp

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
            self.model.script(plan.task, script_of(plan))
            for turn in plan.turns:
                for c in turn:
                    self.ops[c.op] = c
            self.runs[plan.task] = plan
            plan.reply_name = self.reply_name("cmd")
            sent = time.monotonic()
            status = await self.send(
                lambda p=plan: self.client.command(
                    p.task,
                    user_id=REQUESTER,
                    channel_id=CHANNEL,
                    response_url=self.slack.response_url(p.reply_name),
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

    async def watcher(self) -> None:
        """Learns run ids and new gates from Redis, and spawns each gate's fate."""
        known_ids: set[str] = set()
        while True:
            ids = await self.safely(self.redis.zrange(self.keys.user_runs(REQUESTER), 0, -1), [])
            for run_id in [i for i in ids if i not in known_ids]:
                task = await self.safely(self.redis.hget(self.keys.run(run_id), "task"))
                plan = self.runs.get(task or "")
                if plan is None:
                    continue
                known_ids.add(run_id)
                plan.run_id = run_id
                plan.abandoned = False
                self.by_run_id[run_id] = plan
            open_ids = [p.run_id for p in self.by_run_id.values() if p.task not in self.finished]
            for run_id in open_ids:
                assert run_id is not None
                await self.look_at_run(run_id)
            await asyncio.sleep(0.25)

    async def look_at_run(self, run_id: str) -> None:
        run = await self.safely(self.gateway.get_run(run_id))
        if run is None:
            return
        if run.status.finished:
            self.finished.add(self.by_run_id[run_id].task)
            return
        for gate in await self.safely(self.gateway.gates(run_id), []):
            if gate.gate_id in self.gates:
                continue
            op = str(gate.args.get("op"))
            fate = random.Random(f"{SEED}:{op}").choices(FATES, FATE_WEIGHTS)[0]
            rec = GateRecord(gate.gate_id, run_id, op, gate.tool, fate, gate.deadline)
            self.gates[gate.gate_id] = rec
            self.counts[f"fate: {fate}"] += 1
            self.spawn(self.decide(rec))

    # ------------------------------------------------------------------ decisions
    async def gate_status(self, gate_id: str) -> str | None:
        issued = time.monotonic()
        st = await self.safely(self.redis.hget(self.keys.gate(gate_id), "status"))
        if st is not None:
            self.saw(gate_id, str(st), "read from Redis", issued)
        return st

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

    async def button(self, rec: GateRecord, action: str, wait: float) -> str | None:
        """The value of the card's button as a person sees it (waits for the card)."""
        end = time.monotonic() + wait
        while True:
            value = self.slack.buttons.get(rec.gate_id, {}).get(action)
            if value is not None or time.monotonic() >= end:
                return value
            await asyncio.sleep(0.1)

    async def click(
        self, rec: GateRecord, kind: str, user: str, *, wait: float = 5.0, **kw: Any
    ) -> Click:
        """Click Approve or Deny on the gate's card, with the value the card carries."""
        name = self.reply_name("click")
        action = {
            "approve": cards.APPROVE_ACTION,
            "deny-button": cards.DENY_ACTION,
        }[kind]
        value = await self.button(rec, action, wait)
        sent = time.monotonic()
        if value is None:  # no card shown yet: nothing to click (the person looks again)
            self.counts["clicks not made: no card shown yet"] += 1
            return Click(kind, user, sent, 0, name)
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
        c = Click(kind, user, sent, status, name)
        rec.clicks.append(c)
        return c

    async def deny(self, rec: GateRecord, user: str) -> None:
        """The Deny button, then the modal it opens, submitted with a reason."""
        trigger = self.reply_name("trigger")
        c = await self.click(rec, "deny-button", user, trigger_id=trigger)
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
        rec.clicks.append(Click("deny-submit", user, sent, status, name))

    async def cancel(self, rec: GateRecord) -> None:
        name = self.reply_name("cancel")
        sent = time.monotonic()
        status = await self.send(
            lambda: self.client.command(
                f"cancel {rec.run_id}",
                user_id=REQUESTER,
                channel_id=CHANNEL,
                response_url=self.slack.response_url(name),
            )
        )
        rec.clicks.append(Click("cancel", REQUESTER, sent, status, name))

    async def decide(self, rec: GateRecord) -> None:
        rng = random.Random(f"{SEED}:{rec.op}:timing")
        await asyncio.sleep(rng.uniform(0.1, 2.5))
        if rec.fate == "expire":
            if rng.random() < 0.3:  # a click after the deadline: must not run the call
                await asyncio.sleep(max(0.0, rec.deadline - time.time()) + 0.3)
                # On the card as it was shown (a Slack client that has not refreshed yet).
                if (await self.click(rec, "approve", APPROVER, wait=0)).status:
                    self.counts["late clicks (after the deadline)"] += 1
            return
        give_up = time.monotonic() + 90
        attempt = 0
        while time.monotonic() < give_up:
            if await self.gate_status(rec.gate_id) != "pending":
                return
            if attempt:
                self.counts["clicked again (the first did not take)"] += 1
            attempt += 1
            n_before = len(rec.clicks)
            if rec.fate == "approve":
                await self.click(rec, "approve", rng.choice([APPROVER, APPROVER2]))
            elif rec.fate == "deny":
                await self.deny(rec, rng.choice([APPROVER, APPROVER2]))
            elif rec.fate == "double":
                await asyncio.gather(
                    self.click(rec, "approve", APPROVER), self.click(rec, "approve", APPROVER)
                )
            elif rec.fate == "race":
                await asyncio.gather(
                    self.click(rec, "approve", APPROVER), self.deny(rec, APPROVER2)
                )
            elif rec.fate == "cancel":
                await self.cancel(rec)
            # Did it take? Give the web (and a restarting Redis) a moment.
            for _ in range(30):
                await asyncio.sleep(0.1)
                if await self.gate_status(rec.gate_id) != "pending":
                    break
            else:
                self.note_lost(rec, rec.clicks[n_before:])
            await asyncio.sleep(rng.uniform(0.2, 1.0))

    def note_lost(self, rec: GateRecord, clicks: list[Click]) -> None:
        """Clicks that got through but decided nothing within 3 s: why?"""
        deciding = [c for c in clicks if c.status == 200 and c.kind in ("approve", "deny-submit")]
        for c in deciding:
            text = self.told(c.reply_name)
            low = text.lower()
            if any(w in low for w in ("unavailable", "not been recorded", "not answering")):
                self.counts["clicks told 'service unavailable' (Redis down)"] += 1
            elif c.sent_unix >= rec.deadline:
                continue
            elif text:
                if not any(w in low for w in ("already", "expired", "cancelled", "closed")):
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

    def web_killed_between(self, t0: float, t1: float) -> bool:
        return any(t0 <= t <= t1 for t in self.web_kills)

    def redis_down_between(self, t0: float, t1: float) -> bool:
        return any(down <= t1 and up >= t0 for down, up in self.redis_outages)

    # ------------------------------------------------------------------ chaos
    async def kill_workers(self) -> None:
        while self.chaos:
            await asyncio.sleep(self.rng.uniform(3, 8))
            if not self.chaos:
                return
            w = self.rng.choice(self.workers)
            if w.proc is not None and w.proc is self.paused and self.rng.random() < 0.75:
                # Mostly the other one: a paused worker should often live to wake up.
                w = next(x for x in self.workers if x is not w)
            pid = w.proc.pid if w.alive and w.proc is not None else None
            w.kill()
            self.note(f"SIGKILL {w.name} pid {pid}")
            self.counts["worker SIGKILLs"] += 1
            await asyncio.sleep(self.rng.uniform(0, 2))
            w.start()
            self.note(f"started {w.name} pid {w.proc.pid if w.proc else None}")

    async def kill_web(self) -> None:
        while self.chaos:
            await asyncio.sleep(self.rng.uniform(6, 15))
            if not self.chaos:
                return
            self.web.kill()
            self.note("SIGKILL web")
            self.web_kills.append(time.monotonic())
            self.counts["web SIGKILLs"] += 1
            await asyncio.sleep(self.rng.uniform(0.2, 2))
            self.web.start()

    async def restart_redis(self, at: list[float]) -> None:
        for t in at:
            await asyncio.sleep(max(0.0, t - time.monotonic()))
            if not self.chaos:
                return
            self.redis_server.kill()
            self.note("SIGKILL redis-server")
            down = time.monotonic()
            self.counts["Redis SIGKILLs (restarted from the AOF)"] += 1
            await asyncio.sleep(self.rng.uniform(0.3, 2))
            self.redis_server.start()
            self.note("redis-server restarted from its AOF")
            self.redis_outages.append((down, time.monotonic()))

    def tail_journal(self) -> None:
        """Read the journal's new complete lines: which tools are running now, in which pid."""
        with self.journal.open("rb") as f:
            f.seek(self._journal_at)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._journal_at += end
        for line in data[:end].decode(errors="replace").splitlines():
            parts = line.split()
            if len(parts) != 4:
                continue
            event, tool, op, pid = parts
            if event == "start":
                self.running_tools[op] = (tool, int(pid))
            else:
                self.running_tools.pop(op, None)

    def tool_running_in(self, pid: int) -> str | None:
        """A slow or idempotent tool call running in that process right now, if any."""
        self.tail_journal()
        for op, (tool, in_pid) in self.running_tools.items():
            if in_pid == pid and tool in ("slow_act", "resync"):
                return op
        return None

    async def leases_held_by(self, pid: int) -> dict[str, int] | None:
        """The runs whose lease the worker with that pid holds now: run id -> fence.
        None while Redis is down (nothing observed)."""
        for attempt in range(3):  # a connection dropped by a Redis restart fails once
            try:
                ids = await self.redis.zrange(self.keys.active(), 0, -1)
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.time()
                    for run_id in ids:
                        pipe.hmget(self.keys.run(run_id), "fence", "lease_owner", "lease_until")
                    res = await pipe.execute()
                break
            except (RedisError, OSError):
                if attempt == 2:
                    return None
                await asyncio.sleep(0.1)
        secs, micros = res[0]
        now = secs + micros / 1e6
        held: dict[str, int] = {}
        for run_id, (fence, owner, until) in zip(ids, res[1:], strict=True):
            # Worker names are <host>-<pid>-<hex> (agent_core.worker.Worker).
            parts = (owner or "").rsplit("-", 2)
            if len(parts) == 3 and parts[1] == str(pid) and float(until or 0) > now:
                held[run_id] = int(fence or 0)
        return held

    async def fences(self, run_ids: list[str]) -> dict[str, int] | None:
        """The runs' fences now; None when Redis stayed down for 2 s."""
        for _ in range(10):
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    for run_id in run_ids:
                        pipe.hget(self.keys.run(run_id), "fence")
                    res = await pipe.execute()
                return {r: int(f or 0) for r, f in zip(run_ids, res, strict=True)}
            except (RedisError, OSError):
                await asyncio.sleep(0.2)
        return None

    async def pause_workers(self) -> None:
        """SIGSTOP a worker for longer than its lease, then SIGCONT it (its own PID only).
        Sometimes waits for one of its tools to be running, and pauses it mid-call."""
        while self.chaos:
            await asyncio.sleep(self.rng.uniform(4, 10))
            if not self.chaos:
                return
            w = self.rng.choice(self.workers)
            op = None
            if self.rng.random() < 0.4:
                give_up = time.monotonic() + 15
                while self.chaos and time.monotonic() < give_up:
                    proc = w.proc
                    if proc is not None and proc.poll() is None:
                        op = self.tool_running_in(proc.pid)
                        if op is not None:
                            break
                    await asyncio.sleep(0.05)
                if op is None:
                    self.counts["pauses that waited for a tool in vain (paused anyway)"] += 1
            # Not while Redis is down: the leases it holds could not be looked at.
            for _ in range(100):
                if self.redis_server.running or not self.chaos:
                    break
                await asyncio.sleep(0.1)
            proc = w.proc
            if not self.chaos or proc is None or proc.poll() is not None:
                continue
            await self.pause(w, proc, self.rng.uniform(*PAUSE_SECONDS), op)

    async def pause(
        self, w: Proc, proc: subprocess.Popen[bytes], seconds: float, op: str | None
    ) -> None:
        os.kill(proc.pid, signal.SIGSTOP)
        stopped = self.note(f"SIGSTOP {w.name} pid {proc.pid} for {seconds:.1f} s (mid-tool: {op})")
        self.paused = proc
        self.counts["worker pauses (SIGSTOP past the lease)"] += 1
        if op is not None:
            self.counts["worker pauses while a tool ran"] += 1
        log_from = w.log.stat().st_size if w.log.exists() else 0
        held: dict[str, int] | None = None
        now: dict[str, int] | None = None
        try:
            held = await self.leases_held_by(proc.pid)
            self.note(f"{w.name} pid {proc.pid} holds {held} (run id: fence)")
            await asyncio.sleep(seconds)
            if held:
                now = await self.fences(list(held))
        finally:
            if proc.poll() is None:  # still ours and alive (not SIGKILLed meanwhile)
                os.kill(proc.pid, signal.SIGCONT)
                woke = self.note(f"SIGCONT {w.name} pid {proc.pid}; fences now {now}")[11:]
                self.spawn(self.after_pause(w, log_from))
            else:
                woke = "never (SIGKILLed)"
                self.counts["paused workers SIGKILLed while stopped"] += 1
            self.paused = None
        if held is None:
            self.counts["pauses during a Redis outage (leases not observed)"] += 1
            return
        if not held:
            self.counts["pauses of a worker that held no run"] += 1
            return
        self.counts["runs held by a worker when it was paused"] += len(held)
        if now is None:
            self.counts["pauses whose takeovers were not observed (Redis down at SIGCONT)"] += 1
            return
        taken = [r for r, fence in held.items() if now.get(r, 0) > fence]
        for r in taken:
            self.takeovers.setdefault(r, []).append(
                f"taken over from {w.name} pid {proc.pid} stopped {stopped[11:]} to "
                f"{woke}, fence {held[r]}->{now[r]}"
            )
        self.counts["takeovers (fence moved on while the holder was stopped)"] += len(taken)
        if taken:
            self.counts["pauses with a takeover"] += 1
        if op is not None and taken:
            self.counts["pauses mid-tool with a takeover"] += 1

    async def after_pause(self, w: Proc, log_from: int) -> None:
        """What the paused worker logged once awake: it noticed it lost its runs."""
        await asyncio.sleep(8)
        with w.log.open("rb") as f:
            f.seek(log_from)
            text = f.read().decode(errors="replace")
        self.counts["'lost its lease' lines logged by woken workers"] += text.count(
            "lost its lease"
        )
        self.counts["'result of … discarded' lines logged by woken workers"] += len(
            re.findall(r"result of \S+ discarded", text)
        )

    async def supervise(self) -> None:
        """What a process supervisor does: a process that exited by itself (not SIGKILLed by
        the soak) is counted, with its exit code, and started again a second later."""
        seen: set[int] = set()
        while True:
            await asyncio.sleep(0.5)
            for p in (*self.workers, self.web):
                proc = p.proc
                if proc is None or id(proc) in seen or proc.poll() is None:
                    continue
                if proc.returncode == -signal.SIGKILL:
                    continue  # ours: whoever killed it starts it again
                seen.add(id(proc))
                self.note(f"{p.name} pid {proc.pid} exited by itself, code {proc.returncode}")
                name = p.name.rstrip("0123456789")
                self.counts[f"{name} exits by itself (code {proc.returncode}), restarted"] += 1
                await asyncio.sleep(1.0)
                p.start()

    # ------------------------------------------------------------------ events audit
    async def auditor(self) -> None:
        """Reads every event through the soak's own consumer group (nothing is trimmed
        before it has read it) and checks each gate opens and is decided once."""
        stream = self.keys.events()
        backlog = True  # our own pending entries first (a reply lost to a Redis restart)
        while True:
            try:
                if backlog:
                    with contextlib.suppress(ResponseError):
                        await self.redis.xgroup_create(stream, AUDIT_GROUP, id="0", mkstream=True)
                    n = await self.audit_once("0", block=None)
                    backlog = n > 0
                else:
                    await self.audit_once(">", block=500)
            except (RedisError, OSError):
                backlog = True
                await asyncio.sleep(0.5)

    async def audit_once(self, start: str, block: int | None) -> int:
        stream = self.keys.events()
        reply = await self.redis.xreadgroup(
            AUDIT_GROUP, "soak", {stream: start}, count=500, block=block
        )
        ids = []
        for _s, entries in reply or []:
            for msg_id, fields in entries:
                ids.append(msg_id)
                if fields and msg_id not in self.audited:
                    self.audited.add(msg_id)
                    self.audit(msg_id, fields)
        if ids:
            await self.redis.xack(stream, AUDIT_GROUP, *ids)
        return len(ids)

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

    # ------------------------------------------------------------------ phases
    async def run(self) -> None:
        # Before anything is published: no event is trimmed before the audit has read it.
        await self.redis.xgroup_create(self.keys.events(), AUDIT_GROUP, id="0", mkstream=True)
        for p in (*self.workers, self.web):
            p.start()
        await self.wait_web()
        t0 = time.monotonic()
        n_redis = max(2, int(SOAK_SECONDS // 100))
        redis_at = [
            t0 + SOAK_SECONDS * (i + self.rng.uniform(0.3, 0.7)) / n_redis for i in range(n_redis)
        ]
        chaos = [
            asyncio.ensure_future(x)
            for x in (
                self.kill_workers(),
                self.kill_web(),
                self.restart_redis(redis_at),
                self.pause_workers(),
            )
        ]
        background = [
            asyncio.ensure_future(x)
            for x in (self.starter(), self.watcher(), self.auditor(), self.supervise())
        ]
        try:
            await asyncio.sleep(SOAK_SECONDS)
            self.loading = False
            self.chaos = False
            for t in chaos:  # a chaos task may be between a kill and its restart
                t.cancel()
            for t in chaos:
                with contextlib.suppress(BaseException):
                    await t
            for p in (*self.workers, self.web):
                if not p.alive:
                    p.start()
            if not self.redis_server.running:
                self.redis_server.start()
            await self.wait_web()
            drained_at = time.monotonic() + DRAIN_SECONDS
            while time.monotonic() < drained_at:
                started = [p for p in self.runs.values() if p.run_id is not None]
                if all(p.task in self.finished for p in started) and not self.tasks:
                    break
                await asyncio.sleep(0.5)
            self.counts["drain seconds"] = round(time.monotonic() - drained_at + DRAIN_SECONDS)
            settle_from = time.monotonic()
            await self.wait_cards_settled(SETTLE_SECONDS)
            self.counts["card settle seconds"] = round(time.monotonic() - settle_from)
        finally:
            self.loading = self.chaos = False
            for t in [*chaos, *background, *self.tasks]:
                t.cancel()
            for t in [*chaos, *background, *self.tasks]:
                with contextlib.suppress(BaseException):
                    await t

    async def wait_web(self) -> None:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if await self.send(lambda: self.client.command("help")) == 200:
                return
            await asyncio.sleep(0.2)
        raise AssertionError("web did not come up")

    async def wait_cards_settled(self, seconds: float) -> None:
        """Until the bot has handled every event, and every card shows its gate's state."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            groups = await self.safely(self.redis.xinfo_groups(self.keys.events()), [])
            bot = next((g for g in groups if g.get("name") == "bot"), None)
            if bot is not None and bot.get("pending") == 0 and bot.get("lag") == 0:
                if not await self.card_problems():
                    return
            await asyncio.sleep(1.0)

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
            card = await self.safely(self.redis.hgetall(self.keys.ext("slack-card", gate_id)), {})
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
            card = await self.safely(self.redis.hgetall(self.keys.ext("slack-card", gate_id)), {})
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


async def test_soak(tmp_path: Path) -> None:
    print(f"\nsoak: seed {SEED} (SOAK_SEED={SEED} reproduces it), {SOAK_SECONDS:.0f} s of chaos")
    started = time.monotonic()
    redis_server = RedisServer(appendonly=True).start()
    try:
        with SoakSlack() as slack, FakeOpenAI() as model:
            soak = Soak(tmp_path, redis_server, slack, model)
            try:
                await soak.run()
                violations, _starts = await soak.verdict()
            finally:
                for p in (*soak.workers, soak.web):
                    p.stop()
                await soak.redis.aclose()
            model_errors = soak.explain(model)
    finally:
        redis_server.close()
    counts = soak.counts
    print(f"soak: {time.monotonic() - started:.0f} s in all")
    for k in sorted(counts):
        print(f"  {k}: {counts[k]}")
    for k, n in soak.error_kinds.most_common(12):
        print(f"  logged x{n}: {k}")
    for k, known in KNOWN.items():
        fixed = known.fixed()
        state = (
            "its xfail is gone (fixed): counted as violations"
            if fixed
            else "still xfail: counted apart (SOAK_STRICT=1 fails on it)"
        )
        print(
            f"  known issue, {k}: {soak.known[k]} — {known.why} "
            f"({known.test_file}::{known.test_name}; {state})"
        )
        if (STRICT or fixed) and soak.known[k]:
            violations.append(f"{k} x{soak.known[k]}: {known.why}")
    violations += [f"fake model: {e}" for e in model_errors]
    pauses = counts["worker pauses (SIGSTOP past the lease)"]
    takeovers = counts["takeovers (fence moved on while the holder was stopped)"]
    print(
        f"soak summary (seed {SEED}, {SOAK_SECONDS:.0f} s of chaos): runs={counts['runs']}, "
        f"decisions={counts['decisions (gates decided)']}, "
        f"SIGKILLs={counts['worker SIGKILLs'] + counts['web SIGKILLs']} "
        f"(worker {counts['worker SIGKILLs']}, web {counts['web SIGKILLs']}), "
        f"pauses={pauses} ({counts['worker pauses while a tool ran']} mid-tool), "
        f"takeovers={takeovers}, "
        f"Redis restarts={counts['Redis SIGKILLs (restarted from the AOF)']}, "
        f"in-doubt calls={counts['calls in doubt']}, violations={len(violations)}"
    )
    for v in violations[:40]:
        print(f"    {v}")
    print(f"  logs (worker0, worker1, web, journal): {tmp_path}")
    assert counts["runs"] >= 10, "too few runs to mean anything"
    assert counts["worker SIGKILLs"] and counts["Redis SIGKILLs (restarted from the AOF)"] >= 2
    assert pauses, "no worker was paused"
    assert counts["gates approved"] and counts["gates denied"], "no click decided anything"
    if SOAK_SECONDS >= 300:
        assert takeovers, "no paused worker's run was taken over: the pause fault did nothing"
    assert not violations, f"seed {SEED}: {len(violations)} violations (first: {violations[0]})"
