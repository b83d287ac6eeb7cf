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
and restarted from its append-only file a few times.

Afterwards (chaos stopped, every process up again, the load drained):

- every run is completed (possibly reporting an in-doubt call), failed with a reason, or
  cancelled; the model was told the truth about every call (output, declined, timed out,
  outcome unknown);
- every call ran at most once (the idempotent tool excepted), an approved call of a completed
  run exactly once, a denied/expired/cancelled call never; a gate was approved or denied only
  if someone asked for that;
- every card shows its gate's final outcome and no message anywhere carries live buttons for a
  decided gate; every run's root message shows the run's final status.

Known issues (each has a strict xfail test, see KNOWN below) are counted apart and fail the
soak only with ``SOAK_STRICT=1``. ``SOAK_SECONDS`` (default 600) is the length of the chaos
phase; ``SOAK_SEED`` reproduces the random choices (the seed is printed).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
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
from redis.exceptions import RedisError

from agent_core import Gateway, Keys, RunStatus, create_redis
from agent_core.testing import FakeOpenAI, Step, call, calls, reply
from bot import cards
from bot.testing import FakeSlack, HttpResult, SlackClient
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

# Outcomes that are bugs with a strict xfail test of their own: counted, not violations.
KNOWN = {
    "acked_click_lost": (
        "a click acknowledged (HTTP 200) by a web process SIGKILLed before it wrote the "
        "decision: nothing tells the clicker (tests/bot/test_soak_findings.py::"
        "test_an_acknowledged_click_survives_a_web_crash)"
    ),
    "acked_command_lost": (
        "a slash command acknowledged by a web process SIGKILLed before it started the run "
        "(same cause: ack() before the work)"
    ),
    "approved_never_ran_card": (
        "an approved call whose run was cancelled before it ran: its card says 'Running…' "
        "forever (tests/bot/test_soak_findings.py::"
        "test_an_approved_call_of_a_cancelled_run_does_not_show_running)"
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
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def errors(self) -> list[str]:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [line for line in text.splitlines() if " ERROR " in line]


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
    def __init__(self, tmp: Path, redis_server: RedisServer, slack: FakeSlack, model: FakeOpenAI):
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
            "WORKER_LEASE": "2",
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
        return " | ".join(str(c.args.get("text", "")) for c in self.slack.responses(name))

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
                    self.known["acked_command_lost"] += 1
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
        return await self.safely(self.redis.hget(self.keys.gate(gate_id), "status"))

    async def click(self, rec: GateRecord, kind: str, user: str, **kw: Any) -> Click:
        name = self.reply_name("click")
        sent = time.monotonic()
        action = {
            "approve": cards.APPROVE_ACTION,
            "deny-button": cards.DENY_ACTION,
        }[kind]
        status = await self.send(
            lambda: self.client.action(
                action,
                rec.gate_id,
                user_id=user,
                channel_id=CHANNEL,
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
        opened = []
        while time.monotonic() < end and not opened:
            opened = [
                x for x in self.slack.calls_to("views.open") if x.args.get("trigger_id") == trigger
            ]
            await asyncio.sleep(0.05)
        if not opened:
            return  # the web died before opening the form: the person clicks again
        view = opened[0].args["view"]
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
                await self.click(rec, "approve", APPROVER)
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
            if "unavailable" in text:
                self.counts["clicks told 'service unavailable' (Redis down)"] += 1
            elif c.sent_unix >= rec.deadline or text:
                continue
            elif self.web_killed_between(c.sent_at, c.sent_at + 3):
                self.known["acked_click_lost"] += 1
            else:
                self.counts["clicks that took more than 3 s"] += 1

    def web_killed_between(self, t0: float, t1: float) -> bool:
        return any(t0 <= t <= t1 for t in self.web_kills)

    # ------------------------------------------------------------------ chaos
    async def kill_workers(self) -> None:
        while self.chaos:
            await asyncio.sleep(self.rng.uniform(3, 8))
            if not self.chaos:
                return
            w = self.rng.choice(self.workers)
            w.kill()
            self.counts["worker SIGKILLs"] += 1
            await asyncio.sleep(self.rng.uniform(0, 2))
            w.start()

    async def kill_web(self) -> None:
        while self.chaos:
            await asyncio.sleep(self.rng.uniform(6, 15))
            if not self.chaos:
                return
            self.web.kill()
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
            self.counts["Redis SIGKILLs (restarted from the AOF)"] += 1
            await asyncio.sleep(self.rng.uniform(0.3, 2))
            self.redis_server.start()

    # ------------------------------------------------------------------ phases
    async def run(self) -> None:
        for p in (*self.workers, self.web):
            p.start()
        await self.wait_web()
        t0 = time.monotonic()
        n_redis = max(2, int(SOAK_SECONDS // 100))
        redis_at = [
            t0 + SOAK_SECONDS * (i + self.rng.uniform(0.3, 0.7)) / n_redis for i in range(n_redis)
        ]
        background = [
            asyncio.ensure_future(x)
            for x in (
                self.starter(),
                self.watcher(),
                self.kill_workers(),
                self.kill_web(),
                self.restart_redis(redis_at),
            )
        ]
        try:
            await asyncio.sleep(SOAK_SECONDS)
            self.loading = False
            self.chaos = False
            await asyncio.sleep(0.1)
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
            for t in [*background, *self.tasks]:
                t.cancel()
            for t in [*background, *self.tasks]:
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
        for msg in self.slack.messages:
            for block in msg.blocks:
                if block.get("type") != "actions":
                    continue
                for el in block.get("elements", []):
                    gid = str(el.get("value"))
                    if el.get("action_id") in (cards.APPROVE_ACTION, cards.DENY_ACTION):
                        st = statuses.get(gid) or await self.gate_status(gid) or "?"
                        if st != "pending":
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
            if st == "approved" and "Running" in json.dumps(msg.blocks) and starts[rec.op]:
                problems.append(f"card of {rec.op} still says Running… (it ran)")
        return problems

    async def verdict(self) -> tuple[list[str], Counter[str]]:
        violations: list[str] = []
        starts = self.journal_starts()
        gates_by_op = {g.op: g for g in self.gates.values()}

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
                        violations.append(f"{op}: reported in doubt but never started")
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
            if root is None or label not in json.dumps(root.blocks):
                violations.append(f"root message of {run.run_id} does not say {label!r}")

        for rec in self.gates.values():
            st = await self.gate_status(rec.gate_id)
            self.counts[f"gates {st}"] += 1
            n = starts[rec.op]
            if st == "pending":
                violations.append(f"gate {rec.gate_id} ({rec.op}) still pending")
            elif st == "approved":
                if not rec.sent("approve"):
                    violations.append(f"{rec.op} approved but nobody clicked Approve")
                status = await self.safely(self.redis.hget(self.keys.run(rec.run_id), "status"))
                if status == "completed" and n == 0:
                    violations.append(f"{rec.op} approved in a completed run but never ran")
                if status == "cancelled" and n == 0:
                    self.known["approved_never_ran_card"] += 1
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
        for p in (*self.workers, self.web):
            self.counts[f"ERROR lines logged by {p.name}"] = len(p.errors())
        return violations, starts


async def test_soak(tmp_path: Path) -> None:
    print(f"\nsoak: seed {SEED} (SOAK_SEED={SEED} reproduces it), {SOAK_SECONDS:.0f} s of chaos")
    started = time.monotonic()
    redis_server = RedisServer(appendonly=True).start()
    try:
        with FakeSlack() as slack, FakeOpenAI() as model:
            soak = Soak(tmp_path, redis_server, slack, model)
            try:
                await soak.run()
                violations, _starts = await soak.verdict()
            finally:
                for p in (*soak.workers, soak.web):
                    p.stop()
                await soak.redis.aclose()
            model_errors = model.errors
    finally:
        redis_server.close()
    counts = soak.counts
    print(f"soak: {time.monotonic() - started:.0f} s in all")
    for k in sorted(counts):
        print(f"  {k}: {counts[k]}")
    for k, why in KNOWN.items():
        print(f"  known issue, {k}: {soak.known[k]} — {why}")
    if model_errors:
        violations += [f"fake model: {e[:200]}" for e in model_errors]
    if STRICT:
        violations += [f"known issue {k} x{n}" for k, n in soak.known.items() if n]
    print(f"  violations: {len(violations)}")
    for v in violations[:40]:
        print(f"    {v}")
    assert counts["runs"] >= 10, "too few runs to mean anything"
    assert counts["worker SIGKILLs"] and counts["Redis SIGKILLs (restarted from the AOF)"] >= 2
    assert not violations, f"seed {SEED}: {len(violations)} violations (first: {violations[0]})"
