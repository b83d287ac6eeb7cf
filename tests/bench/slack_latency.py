"""Benchmark 2: Slack-side latency under load (``python -m tests.bench.slack_latency``).

Everything is real but Slack and the model: a private ``redis-server``, the ``web`` process
(``python -m bot``) and ``worker`` process(es) (``python -m agent_core.worker``) as
subprocesses, with :class:`tests.slack_fake.FakeSlack` and :class:`agent_core.testing.FakeOpenAI`
in a process of their own (``tests.bench.slack_fakes``). This process is only the load
generator: it sends signed requests to ``web`` exactly as Slack does, over loopback.

1. **Opening gates.** ``/agent slack-bench {i}`` slash commands, paced at ``--open-rate``/s;
   each run calls the gated ``delete_user`` and its card is posted. Their acks are measured
   too. Then the system is left to go quiet (no pending jobs or events).
2. **(a) Paced clicks**, open loop: click ``k`` is *scheduled* at ``t0 + k / rate`` and sent
   then, whatever happened to the earlier ones; every latency is measured from the scheduled
   time (no coordinated omission). 5 % of the clicks are double clicks on a gate clicked
   5-100 ms earlier, by the same approver or the other one.
   - ack: scheduled time → the HTTP response (Slack's 3 s limit applies to it);
   - click → tool start: scheduled time → the tool's first line (``time.monotonic()``, one
     clock for every process on the machine, written to a journal by
     ``tests.bench.slack_agent``);
   - click → card updated: scheduled time → the fake Slack's first ``chat.update`` showing
     the decision.
3. **(b) Bursts**: 100 and 500 clicks (5 % double clicks) all scheduled at the same instant,
   on fresh connections; then bursts of 100 and 500 slash commands.

Afterwards it checks that every clicked gate was decided once and its tool ran exactly once.
It prints the tables and writes ``tests/bench/SLACK_RESULTS.md``. ``--profile`` also samples
the web and worker processes with py-spy during the paced phase (it slows them down: its
latency figures are not the benchmark's).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import redis.asyncio as aioredis

from agent_core import Keys
from tests.bench.slack_fakes import command_task, gate_task
from tests.redis_server import RedisServer
from tests.slack_fake import SlackClient, sign

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SECRET = "slack-bench-signing-secret"
PREFIX = "sbench"
REQUESTER = "U0BENCHREQ"
APPROVER_A = "U0BENCHA"
APPROVER_B = "U0BENCHB"
CHANNEL = "C0BENCH"
DOUBLE_SHARE = 0.05


# --------------------------------------------------------------------------- statistics
def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no samples."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(0, min(len(s) - 1, -(-int(q * len(s)) // 100) - 1))
    return s[k]


def fmt_ms(x: float) -> str:
    if x != x:
        return "n/a"
    v = x * 1000
    return f"{v:.1f}" if v < 100 else f"{v:.0f}"


# --------------------------------------------------------------------------- processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A subprocess this benchmark started; stopped by its own PID only."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        self._out = open(log, "ab")
        self.proc = subprocess.Popen(
            args,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._out.close()


class Fakes:
    """``python -m tests.bench.slack_fakes`` (FakeSlack + FakeOpenAI) and its stdin/stdout."""

    def __init__(self, gates: int, commands: int, log: Path) -> None:
        self._err = open(log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.bench.slack_fakes", str(gates), str(commands)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "READY":
            self.stop()
            raise RuntimeError(f"the fake servers did not start; see {log}")
        self.slack_api, self.openai_url = line[1], line[2]
        self.slack_url = self.slack_api.removesuffix("/api/")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stats(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        out: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()


def base_env(redis_url: str, fakes: Fakes, journal: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": str(REPO),
        "REDIS_URL": redis_url,
        "KEY_PREFIX": PREFIX,
        "AGENT": "tests.bench.slack_agent:agent",
        "LOG_LEVEL": "WARNING",
        "OPENAI_API_KEY": "sk-bench-not-a-secret",
        "OPENAI_BASE_URL": fakes.openai_url,
        "OPENAI_MODEL": "fake-model",
        "APPROVAL_TIMEOUT": "3600",
        "SLACK_BENCH_JOURNAL": str(journal),
        "SLACK_BENCH_TASK_DUMP": str(journal.parent / "tasks.txt"),
    }


# --------------------------------------------------------------------------- requests
@dataclass
class Sample:
    kind: str  # "first" | "double" | "command" | "warmup"
    index: int  # gate index (u{index}) or command index
    sched: float
    started: float = 0.0
    done: float = 0.0
    status: int = 0

    @property
    def latency(self) -> float:
        return self.done - self.sched


@dataclass
class Request:
    kind: str
    index: int
    body: bytes


class Loader:
    """Sends pre-built, signed requests to /slack/events on a pool of keep-alive connections."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=30),
        )

    async def close(self) -> None:
        await self.session.close()

    @staticmethod
    def headers(body: bytes, timestamp: str) -> dict[str, str]:
        return {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": sign(SECRET, timestamp, body.decode()),
        }

    async def _one(self, req: Request, headers: dict[str, str], sched: float) -> Sample:
        s = Sample(req.kind, req.index, sched, started=time.monotonic())
        try:
            async with self.session.post(self.url, data=req.body, headers=headers) as resp:
                await resp.read()
                s.status = resp.status
        except (aiohttp.ClientError, TimeoutError):
            s.status = 0
        s.done = time.monotonic()
        return s

    def _signed(self, reqs: Sequence[Request]) -> list[dict[str, str]]:
        ts = str(int(time.time()))
        return [self.headers(r.body, ts) for r in reqs]

    async def paced(self, reqs: Sequence[Request], rate: float) -> list[Sample]:
        """Open loop: request k is sent at t0 + k / rate, whatever became of the others."""
        signed = self._signed(reqs)
        tasks: list[asyncio.Task[Sample]] = []
        t0 = time.monotonic() + 0.1
        for k, (req, headers) in enumerate(zip(reqs, signed, strict=True)):
            sched = t0 + k / rate
            delay = sched - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self._one(req, headers, sched)))
        return list(await asyncio.gather(*tasks))

    async def burst(self, reqs: Sequence[Request]) -> list[Sample]:
        """Every request scheduled at the same instant, each on a connection of its own."""
        signed = self._signed(reqs)
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            timeout=aiohttp.ClientTimeout(total=30),
        ) as session:
            own, self.session = self.session, session
            try:
                sched = time.monotonic()
                tasks = [
                    asyncio.create_task(self._one(r, h, sched))
                    for r, h in zip(reqs, signed, strict=True)
                ]
                return list(await asyncio.gather(*tasks))
            finally:
                self.session = own


# --------------------------------------------------------------------------- the bench
@dataclass
class Gate:
    index: int
    gate_id: str
    card_ts: str
    args_hash: str = ""

    @property
    def button_value(self) -> str:
        """What the card's Approve button carries (``<gate id>:<args hash>``)."""
        return f"{self.gate_id}:{self.args_hash}"


@dataclass
class Config:
    rate: float = 200.0
    paced: int = 2000
    # Lower rates, ``sweep_clicks`` clicks each, after the main paced phase: where is the knee?
    sweep: tuple[float, ...] = (50.0, 100.0, 150.0)
    sweep_clicks: int = 1000
    repeat: int = 3  # runs of the main paced phase (each on fresh gates)
    bursts: tuple[int, ...] = (100, 500)
    command_bursts: tuple[int, ...] = (100, 500)
    open_rate: float = 50.0
    workers: int = 1
    warmup: int = 40
    seed: int = 1
    profile: bool = False
    label: str = "as shipped"
    out: Path = HERE / "SLACK_RESULTS.md"

    def doubles(self, n: int) -> int:
        return round(n * DOUBLE_SHARE)

    @property
    def paced_phases(self) -> list[tuple[float, int]]:
        main = [(self.rate, self.paced)] * self.repeat
        return main + [(r, self.sweep_clicks) for r in self.sweep]

    @property
    def gates_needed(self) -> int:
        firsts = sum(n - self.doubles(n) for _, n in self.paced_phases)
        firsts += sum(b - self.doubles(b) for b in self.bursts)
        return self.warmup + firsts


@dataclass
class Results:
    config: Config
    phases: dict[str, list[Sample]] = field(default_factory=dict)
    tool_start: dict[str, list[float]] = field(default_factory=dict)
    card_shown: dict[str, list[float]] = field(default_factory=dict)
    decided: dict[str, list[float]] = field(default_factory=dict)
    decided_to_tool: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)
    cpu_per_click: dict[str, dict[str, float]] = field(default_factory=dict)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    profiles: dict[str, str] = field(default_factory=dict)
    errors: dict[str, dict[str, int]] = field(default_factory=dict)
    started: dict[str, tuple[int, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    bolt_floor: dict[str, tuple[float, float]] = field(default_factory=dict)
    code: str = ""  # the commit measured


def click_body(client: SlackClient, slack_url: str, gate: Gate, user: str, n: int) -> bytes:
    payload = client.action_payload(
        "gate_approve",
        gate.button_value,
        user_id=user,
        channel_id=CHANNEL,
        message_ts=gate.card_ts,
        response_url=f"{slack_url}/respond/click{n}",
    )
    return urlencode({"payload": json.dumps(payload)}).encode()


def command_body(client: SlackClient, slack_url: str, task: str, n: int) -> bytes:
    return client.command_body(
        task,
        user_id=REQUESTER,
        channel_id=CHANNEL,
        response_url=f"{slack_url}/respond/cmd{n}",
    ).encode()


def clicks_with_doubles(
    client: SlackClient,
    slack_url: str,
    gates: Sequence[Gate],
    n_doubles: int,
    rng: random.Random,
    *,
    spread: int,
) -> list[Request]:
    """One first click per gate, plus ``n_doubles`` repeat clicks at most ``spread`` slots later."""
    total = len(gates) + n_doubles
    double_slots = set(rng.sample(range(1, total), n_doubles))
    out: list[Request] = []
    firsts: list[Gate] = []
    it = iter(gates)
    for k in range(total):
        if k in double_slots and firsts:
            target = rng.choice(firsts[-spread:])
            user = rng.choice([APPROVER_A, APPROVER_B])
            out.append(
                Request("double", target.index, click_body(client, slack_url, target, user, k))
            )
            continue
        g = next(it)
        firsts.append(g)
        out.append(Request("first", g.index, click_body(client, slack_url, g, APPROVER_A, k)))
    assert len(firsts) == len(gates)
    return out


async def wait_quiet(
    r: aioredis.Redis,
    keys: Keys,
    timeout: float,
    stuck: Callable[[], Awaitable[None]] | None = None,
) -> float:
    """Until no job and no event is waiting or being handled (three checks in a row); the
    seconds it took. After ``timeout``: ``stuck()`` and -1 when given, else TimeoutError."""
    start = time.monotonic()
    quiet_in_a_row = 0
    while time.monotonic() - start < timeout:
        busy = 0
        for stream in [f(s) for s in keys.all_shards() for f in (keys.jobs, keys.events)]:
            try:
                for g in await r.xinfo_groups(stream):
                    busy += int(g.get("pending") or 0) + int(g.get("lag") or 0)
            except aioredis.ResponseError:
                busy += 1
        quiet_in_a_row = quiet_in_a_row + 1 if busy == 0 else 0
        if quiet_in_a_row >= 3:
            return time.monotonic() - start
        await asyncio.sleep(0.2)
    if stuck is not None:
        await stuck()
        return -1.0
    raise TimeoutError(f"the system did not go quiet within {timeout} s")


async def stuck_report(
    res: Results, name: str, r: aioredis.Redis, keys: Keys, procs: Sequence[Proc], dump: Path
) -> None:
    """The system did not go quiet: record what is pending, and each process's asyncio tasks
    (SIGUSR1: tests/bench/slack_agent.py writes them to ``dump``)."""
    pending: list[str] = []
    streams = [(keys.jobs(s), "workers") for s in keys.all_shards()]
    streams += [(keys.events(s), "bot") for s in keys.all_shards()]
    for stream, group in streams:
        with contextlib.suppress(aioredis.ResponseError):
            for p in await r.xpending_range(stream, group, "-", "+", 5):
                entry = await r.xrange(stream, p["message_id"], p["message_id"])
                kind = entry[0][1].get("type") if entry else "?"
                pending.append(f"{group}: {kind} delivered {p['times_delivered']} times")
    locks = await r.keys("{" + keys.prefix + "*:ext:slack-lock:*")
    res.checks.append(
        (
            f"the system went quiet after {name} (no job or event left pending)",
            False,
            "; ".join(pending) + f"; card locks held: {len(locks)}",
        )
    )
    for p in procs:
        with contextlib.suppress(OSError):
            os.kill(p.pid, signal.SIGUSR1)
    await asyncio.sleep(2)
    kept = _keep_dump(dump)
    print(f"  STUCK after {name}: {'; '.join(pending)}; asyncio tasks: {kept}")


def _keep_dump(dump: Path) -> Path | None:
    """Copy the task dump out of the work directory (which is removed at the end)."""
    if not dump.exists():
        return None
    keep = Path(tempfile.gettempdir()) / f"slack_stuck_tasks_{int(time.time())}.txt"
    keep.write_text(dump.read_text(errors="replace"))
    return keep


def read_journal(path: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = collections.defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            name, _, t = line.partition(" ")
            if t:
                out[name].append(float(t))
    return out


async def wait_journal(path: Path, names: set[str], timeout: float) -> dict[str, list[float]]:
    end = time.monotonic() + timeout
    while True:
        j = read_journal(path)
        if names <= j.keys() or time.monotonic() > end:
            return j
        await asyncio.sleep(0.2)


async def load_gates(r: aioredis.Redis, keys: Keys) -> dict[int, Gate]:
    """Every pending gate with its card, by the index in its ``delete_user`` argument."""
    ids = [g for s in keys.all_shards() for g in await r.zrange(keys.deadlines(s), 0, -1)]
    async with r.pipeline(transaction=False) as pipe:
        for gid in ids:
            pipe.hmget(keys.gate(gid), ["args", "args_hash"])
            pipe.hget(keys.ext("slack-card", gid, keys.shard_of(gid)), "ts")
        replies = await pipe.execute()
    out: dict[int, Gate] = {}
    for gid, (args, digest), ts in zip(ids, replies[0::2], replies[1::2], strict=True):
        user_id = json.loads(args or "{}").get("user_id", "")
        if user_id.startswith("u") and ts:
            out[int(user_id[1:])] = Gate(int(user_id[1:]), gid, ts, digest or "")
    return out


class Profiler:
    """py-spy sampling the web and worker processes (raw collapsed stacks)."""

    def __init__(self, targets: dict[str, int], duration: float, outdir: Path) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.files: dict[str, Path] = {}
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        for name, pid in targets.items():
            out = outdir / f"{name}.txt"
            self.files[name] = out
            cmd = [exe, "record", "--pid", str(pid), "--rate", "200", "--format", "raw"]
            cmd += ["--duration", str(int(duration) + 1), "--output", str(out)]
            self.procs[name] = subprocess.Popen(
                cmd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    def wait(self) -> dict[str, Path]:
        for p in self.procs.values():
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)
        return {n: f for n, f in self.files.items() if f.exists()}


def summarize_profile(path: Path, top: int = 14) -> str:
    """Share of samples by innermost frame of our code / library, and by inclusive frame."""
    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f.split(" (")[0] + " (" + _short(f) + ")" for f in stack.split(";")]
        if any("select" in f or "epoll" in f for f in frames[-2:]):
            self_time["(idle: waiting in the event loop's poll)"] += n
            total += n
            continue
        total += n
        self_time[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    lines = [f"samples: {total}", "", "self (innermost frame):"]
    lines += [f"  {100 * c / total:5.1f}%  {f}" for f, c in self_time.most_common(top)]
    lines += ["", "inclusive (frame anywhere on the stack):"]
    interesting = [
        (f, c)
        for f, c in inclusive.most_common(400)
        if any(
            k in f
            for k in (
                "bot/",
                "agent_core/",
                "slack_bolt",
                "slack_sdk",
                "aiohttp",
                "redis",
                "openai",
                "pydantic",
                "httpx",
                "json",
            )
        )
    ]
    lines += [f"  {100 * c / total:5.1f}%  {f}" for f, c in interesting[: top * 2]]
    return "\n".join(lines)


def _short(frame: str) -> str:
    inside = frame.split(" (", 1)[1].rstrip(")") if " (" in frame else ""
    for marker in ("site-packages/", "/work/main/", "lib/python3.11/"):
        if marker in inside:
            return inside.split(marker, 1)[1]
    return inside


async def bench(cfg: Config, workdir: Path) -> Results:
    res = Results(cfg, code=code_version())
    rng = random.Random(cfg.seed)
    started = time.monotonic()
    total_commands = sum(cfg.command_bursts)
    journal = workdir / "tools.journal"
    keys = Keys(PREFIX)
    procs: list[Proc] = []
    with RedisServer() as redis_server:
        fakes = Fakes(cfg.gates_needed, total_commands, workdir / "fakes.log")
        r = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        loader: Loader | None = None
        try:
            env = base_env(redis_server.url, fakes, journal)
            for i in range(cfg.workers):
                procs.append(
                    Proc(
                        f"worker{i}",
                        [sys.executable, "-m", "agent_core.worker"],
                        env,
                        workdir / f"worker{i}.log",
                    )
                )
            port = free_port()
            web_env = env | {
                "SLACK_BOT_TOKEN": "xoxb-test-token",
                "SLACK_SIGNING_SECRET": SECRET,
                "SLACK_API_URL": fakes.slack_api,
                "APPROVERS": f"{APPROVER_A},{APPROVER_B}",
                "PORT": str(port),
            }
            web = Proc("web", [sys.executable, "-m", "bot"], web_env, workdir / "web.log")
            procs.append(web)
            url = f"http://127.0.0.1:{port}"
            await wait_healthy(url, web)
            client = SlackClient(url + "/slack/events", SECRET)
            loader = Loader(client.url)

            def stuck_of(phase: str) -> Callable[[], Awaitable[None]]:
                dump = Path(env["SLACK_BENCH_TASK_DUMP"])
                return lambda: stuck_report(res, phase, r, keys, procs, dump)

            # 1. open the gates through the real slash command, paced

            async def started_runs() -> int:
                return sum(
                    [int(await r.zcard(keys.user_runs(REQUESTER, s))) for s in keys.all_shards()]
                )

            print(f"opening {cfg.gates_needed} gates with /agent at {cfg.open_rate:.0f}/s …")
            opening = [
                Request("command", i, command_body(client, fakes.slack_url, gate_task(i), i))
                for i in range(cfg.gates_needed)
            ]
            name = f"/agent, paced {cfg.open_rate:.0f}/s (opening the gates)"
            mark = errors_logged(procs)
            res.phases[name] = await loader.paced(opening, cfg.open_rate)
            quiet = await wait_quiet(r, keys, timeout=300)
            res.errors[name] = errors_logged(procs, mark)
            res.started[name] = (await started_runs(), len(opening))
            gates = await load_gates(r, keys)
            for _ in range(5):  # set-up must complete: send what did not start again
                missing = [i for i in range(cfg.gates_needed) if i not in gates]
                if not missing:
                    break
                print(f"  {len(missing)} runs did not start; sending them again at 10/s")
                again = [
                    Request("command", i, command_body(client, fakes.slack_url, gate_task(i), i))
                    for i in missing
                ]
                await loader.paced(again, 10)
                await wait_quiet(r, keys, timeout=300)
                gates = await load_gates(r, keys)
            missing = [i for i in range(cfg.gates_needed) if i not in gates]
            if missing:
                raise RuntimeError(f"{len(missing)} gates never opened (first: u{missing[0]})")
            print(f"  all open and carded; quiet {quiet:.1f} s after the last command")
            order = list(range(cfg.gates_needed))
            cursor = 0

            def take(n: int) -> list[Gate]:
                nonlocal cursor
                chunk = [gates[i] for i in order[cursor : cursor + n]]
                cursor += n
                return chunk

            # warm-up: Bolt's first request calls auth.test, connections open, code paths warm
            warm = [
                Request("warmup", g.index, click_body(client, fakes.slack_url, g, APPROVER_A, -1))
                for g in take(cfg.warmup)
            ]
            await loader.paced(warm, 20)
            await wait_quiet(r, keys, timeout=60)

            clicked: list[int] = []
            warmed = {int(w.index) for w in warm}
            # 2a. paced clicks (the main phase, then the sweep of lower rates)
            pids = {p.name: p.pid for p in procs} | {
                "fakes": fakes.pid,
                "redis": redis_server.pid or 0,
                "load generator": os.getpid(),
            }
            for phase_no, (rate, n_clicks) in enumerate(cfg.paced_phases):
                n_dbl = cfg.doubles(n_clicks)
                paced_gates = take(n_clicks - n_dbl)
                reqs = clicks_with_doubles(
                    client, fakes.slack_url, paced_gates, n_dbl, rng, spread=20
                )
                name = f"(a) clicks, paced {rate:.0f}/s"
                if phase_no < cfg.repeat and cfg.repeat > 1:
                    name += f", run {phase_no + 1}/{cfg.repeat}"
                print(f"{name}: {len(reqs)} clicks ({n_dbl} double) …")
                profiler: Profiler | None = None
                if cfg.profile and phase_no == 0:
                    targets = {p.name: p.pid for p in procs}
                    profiler = Profiler(targets, len(reqs) / rate, workdir)
                    await asyncio.sleep(1.0)  # py-spy attaches
                mark = errors_logged(procs)
                meter = CpuMeter(pids)
                samples = await loader.paced(reqs, rate)
                res.cpu[name] = meter.lap()
                res.phases[name] = samples
                clicked += [g.index for g in paced_gates]
                if profiler is not None:
                    for pname, path in profiler.wait().items():
                        res.profiles[pname] = summarize_profile(path)
                await collect_downstream(
                    res, name, samples, paced_gates, journal, fakes, r, keys, stuck_of(name)
                )
                res.cpu_per_click[name] = meter.per(len(reqs))
                res.errors[name] = errors_logged(procs, mark)

            # 2b. bursts of clicks
            for size in cfg.bursts:
                n_dbl = cfg.doubles(size)
                burst_gates = take(size - n_dbl)
                reqs = clicks_with_doubles(
                    client, fakes.slack_url, burst_gates, n_dbl, rng, spread=size
                )
                rng.shuffle(reqs)
                name = f"(b) clicks, burst of {size}"
                print(f"{name} ({n_dbl} double) …")
                mark = errors_logged(procs)
                samples = await loader.burst(reqs)
                res.phases[name] = samples
                clicked += [g.index for g in burst_gates]
                await collect_downstream(
                    res, name, samples, burst_gates, journal, fakes, r, keys, stuck_of(name)
                )
                res.errors[name] = errors_logged(procs, mark)

            # 2b. bursts of slash commands
            first_cmd = 0
            for size in cfg.command_bursts:
                reqs = [
                    Request(
                        "command",
                        i,
                        command_body(client, fakes.slack_url, command_task(i), 100_000 + i),
                    )
                    for i in range(first_cmd, first_cmd + size)
                ]
                first_cmd += size
                name = f"(b) /agent, burst of {size}"
                print(f"{name} …")
                mark = errors_logged(procs)
                before = await started_runs()
                res.phases[name] = await loader.burst(reqs)
                await wait_quiet(r, keys, timeout=300)
                res.errors[name] = errors_logged(procs, mark)
                res.started[name] = (await started_runs() - before, size)

            # checks: every clicked gate decided once, its tool ran exactly once
            j = read_journal(journal)
            once = [i for i in clicked if len(j.get(f"u{i}", [])) == 1]
            res.checks.append(
                (
                    "every clicked gate's tool ran exactly once",
                    len(once) == len(clicked),
                    f"{len(once)}/{len(clicked)}",
                )
            )
            touched = set(clicked) | warmed
            untouched = [i for i in range(cfg.gates_needed) if i not in touched and f"u{i}" in j]
            res.checks.append(
                ("no unclicked gate's tool ran", not untouched, f"{len(untouched)} ran")
            )
            statuses = await gate_statuses(r, keys, [gates[i].gate_id for i in clicked])
            res.checks.append(
                (
                    "every clicked gate is approved, by one of the approvers",
                    all(s == "approved" for s in statuses),
                    dict(collections.Counter(statuses)).__repr__(),
                )
            )
            stats = fakes.stats()
            doubles = sum(1 for s in res.phases.values() for x in s if x.kind == "double")
            res.checks.append(
                (
                    "every double click told 'Already approved by …'",
                    stats["already_decided_replies"] == doubles,
                    f"{stats['already_decided_replies']}/{doubles}",
                )
            )
            bad = [(n, x.status) for n, s in res.phases.items() for x in s if x.status != 200]
            res.checks.append(("every request answered 200", not bad, f"{len(bad)} not 200"))
            res.notes.append(
                "fake Slack calls: "
                + ", ".join(f"{m} {n}" for m, n in sorted(stats["calls"].items()))
            )
            if stats["failed"]:
                res.notes.append(f"failed Slack calls: {stats['failed']}")
            if stats["model_errors"]:
                res.notes.append(f"fake model errors: {stats['model_errors']}")
        finally:
            if loader is not None:
                await loader.close()
            await r.aclose()
            for p in reversed(procs):
                p.stop()
            fakes.stop()
    res.bolt_floor = await bolt_ack_floor()
    res.elapsed = time.monotonic() - started
    return res


def errors_logged(procs: Sequence[Proc], since: dict[str, int] | None = None) -> dict[str, int]:
    """ERROR lines in each process's log (minus ``since``)."""
    out: dict[str, int] = {}
    for p in procs:
        n = sum(1 for line in p.log.read_text(errors="replace").splitlines() if " ERROR " in line)
        out[p.name] = n - (since or {}).get(p.name, 0)
    return out


async def bolt_ack_floor(n: int = 300) -> dict[str, tuple[float, float]]:
    """Bolt's own time to answer a click whose listener does nothing but ack(), both ways.

    With ``process_before_response=False`` (what bot/app.py uses) Bolt runs the listener as a
    task and polls ``ack.response`` every 10 ms (slack_bolt/listener/asyncio_runner.py), so
    the answer waits for the next poll even when ack() was called at once.
    """
    from slack_bolt.async_app import AsyncApp
    from slack_bolt.request.async_request import AsyncBoltRequest
    from slack_sdk.web.async_client import AsyncWebClient

    from tests.slack_fake import FakeSlack

    payload = {
        "type": "block_actions",
        "user": {"id": APPROVER_A},
        "team": {"id": "T0TEST"},
        "channel": {"id": CHANNEL},
        "container": {"channel_id": CHANNEL},
        "actions": [{"action_id": "gate_approve", "block_id": "b", "value": "x"}],
    }
    body = urlencode({"payload": json.dumps(payload)})
    headers = {"content-type": ["application/x-www-form-urlencoded"]}
    out: dict[str, tuple[float, float]] = {}
    with FakeSlack() as fake:  # answers Bolt's one auth.test
        for before in (False, True):
            app = AsyncApp(
                client=AsyncWebClient(token=fake.token, base_url=fake.base_url),
                signing_secret=SECRET,
                request_verification_enabled=False,
                process_before_response=before,
            )

            @app.action("gate_approve")
            async def approve(ack: Any) -> None:
                await ack()

            times: list[float] = []
            for _ in range(n + 5):
                t0 = time.perf_counter()
                resp = await app.async_dispatch(AsyncBoltRequest(body=body, headers=headers))
                times.append(time.perf_counter() - t0)
                assert resp.status == 200
            times = times[5:]  # the first one also runs auth.test
            name = f"process_before_response={before}" + (" (bot/app.py)" if not before else "")
            out[name] = (percentile(times, 50), percentile(times, 99))
    return out


async def gate_statuses(r: aioredis.Redis, keys: Keys, gate_ids: list[str]) -> list[str]:
    async with r.pipeline(transaction=False) as pipe:
        for gid in gate_ids:
            pipe.hget(keys.gate(gid), "status")
        return [str(s) for s in await pipe.execute()]


async def collect_downstream(
    res: Results,
    name: str,
    samples: list[Sample],
    gates: Sequence[Gate],
    journal: Path,
    fakes: Fakes,
    r: aioredis.Redis,
    keys: Keys,
    stuck: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Click → tool start and click → card updated, for the first click of each gate."""
    firsts = {s.index: s for s in samples if s.kind == "first"}
    # Quiet = no job or event waiting or in flight: every tool that will run has run.
    if await wait_quiet(r, keys, timeout=120, stuck=stuck) >= 0:
        await wait_journal(journal, {f"u{i}" for i in firsts}, timeout=5)
        await wait_quiet(r, keys, timeout=120, stuck=stuck)
    j = read_journal(journal)
    decided = fakes.stats()["decided_at"]
    by_index = {g.index: g for g in gates}
    # The gate's decided_at is Redis' clock (TIME, unix seconds): move it to ours.
    offset = time.time() - time.monotonic()
    async with r.pipeline(transaction=False) as pipe:
        for i in firsts:
            pipe.hget(keys.gate(by_index[i].gate_id), "decided_at")
        decided_unix = dict(zip(firsts, await pipe.execute(), strict=True))
    tool: list[float] = []
    card: list[float] = []
    dec: list[float] = []
    dec_tool: list[float] = []
    for i in firsts:
        # The first click of a double click may lose the race to the second: take the
        # earliest scheduled click on that gate.
        sched = min(x.sched for x in samples if x.index == i)
        at = float(decided_unix[i]) - offset if decided_unix.get(i) else None
        if at is not None:
            dec.append(at - sched)
        if f"u{i}" in j:
            tool.append(min(j[f"u{i}"]) - sched)
            if at is not None:
                dec_tool.append(min(j[f"u{i}"]) - at)
        t = decided.get(f"{CHANNEL}|{by_index[i].card_ts}")
        if t is not None:
            card.append(t - sched)
    res.tool_start[name] = tool
    res.card_shown[name] = card
    res.decided[name] = dec
    res.decided_to_tool[name] = dec_tool


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (not idle, not waiting on I/O)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / _TICK


class CpuMeter:
    """CPU time of each process from the meter's creation on; "other" is everything else
    on the machine (anything not started by this benchmark disturbs its figures)."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.t0 = time.monotonic()
        self.c0 = {n: cpu_seconds(p) for n, p in pids.items()}
        self.m0 = machine_busy_seconds()

    def _used(self) -> dict[str, float]:
        used = {n: cpu_seconds(p) - self.c0[n] for n, p in self.pids.items()}
        used["other"] = max(0.0, machine_busy_seconds() - self.m0 - sum(used.values()))
        return used

    def lap(self) -> dict[str, float]:
        """CPU-seconds per wall second of each process so far."""
        wall = time.monotonic() - self.t0
        return {n: v / wall for n, v in self._used().items()}

    def per(self, n: int) -> dict[str, float]:
        """CPU milliseconds of each process so far, per request."""
        return {name: 1000 * v / n for name, v in self._used().items()}


async def wait_healthy(url: str, web: Proc, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < end:
            if web.proc.poll() is not None:
                raise RuntimeError(f"web exited: {web.log.read_text()[-2000:]}")
            with contextlib.suppress(aiohttp.ClientError):
                async with s.get(url + "/healthz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise TimeoutError("web did not become healthy")


# --------------------------------------------------------------------------- report
def code_version() -> str:
    """The commit of the code under test, and whether agent_core/ or bot/ differ from it."""

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "agent_core", "bot")
    return commit + (" with uncommitted changes in agent_core/ or bot/" if dirty else "")


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    redis_v = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True, check=False
    ).stdout.split()
    version = next((w.split("=", 1)[1] for w in redis_v if w.startswith("v=")), "?")
    pkgs = ", ".join(
        f"{p} {metadata.version(p)}" for p in ("slack_bolt", "slack_sdk", "aiohttp", "redis")
    )
    return (
        f"{os.cpu_count()} x {cpu} (nproc {len(os.sched_getaffinity(0))}); "
        f"{platform.platform()}; Python {platform.python_version()}; Redis {version}; {pkgs}"
    )


Table = tuple[list[str], list[list[str]]]


def with_pooled(per_phase: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The phases, with "…, all N runs" (their samples pooled) after the runs of one phase."""
    out: dict[str, list[Any]] = {}
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for name in per_phase:
        if ", run " in name:
            groups[name.split(", run ")[0]].append(name)
    for name, xs in per_phase.items():
        out[name] = xs
        base = name.split(", run ")[0]
        if ", run " in name and groups[base][-1] == name and len(groups[base]) > 1:
            out[f"{base}, all {len(groups[base])} runs"] = [
                x for n in groups[base] for x in per_phase[n]
            ]
    return out


def tables(res: Results) -> list[tuple[str, Table]]:
    ack_rows: list[list[str]] = []
    for name, samples in with_pooled(res.phases).items():
        lat = [s.latency for s in samples]
        ok = sum(1 for s in samples if s.status == 200)
        burst = "burst" in name
        target = 3.0 if burst or "opening" in name else 0.050
        worst = max(lat) if lat else float("nan")
        p99 = percentile(lat, 99)
        verdict = (worst if burst else p99) < target
        errs = res.errors.get(name, {})
        started = res.started.get(name)
        ack_rows.append(
            [
                name,
                str(len(samples)),
                f"{ok}/{len(samples)}",
                f"{started[0]}/{started[1]}" if started else "—",
                " / ".join(f"{n}" for n in errs.values()) if errs else "—",
                fmt_ms(percentile(lat, 50)),
                fmt_ms(p99),
                fmt_ms(worst),
                ("max" if burst else "p99") + f" < {fmt_ms(target)}",
                "yes" if verdict else "**no**",
            ]
        )
    down_rows: list[list[str]] = []
    decided, decided_to_tool = with_pooled(res.decided), with_pooled(res.decided_to_tool)
    card_shown = with_pooled(res.card_shown)
    for name, xs in with_pooled(res.tool_start).items():
        p99 = percentile(xs, 99)
        paced = "paced" in name
        down_rows.append(
            [
                name,
                "click → tool start",
                str(len(xs)),
                fmt_ms(percentile(xs, 50)),
                fmt_ms(p99),
                fmt_ms(max(xs) if xs else float("nan")),
                "p99 < 100" if paced else "—",
                ("yes" if p99 < 0.1 else "**no**") if paced else "—",
            ]
        )
        for what, xs2 in (
            ("click → decision written (web)", decided.get(name, [])),
            ("decision written → tool start (worker)", decided_to_tool.get(name, [])),
        ):
            down_rows.append(
                [
                    name,
                    what,
                    str(len(xs2)),
                    fmt_ms(percentile(xs2, 50)),
                    fmt_ms(percentile(xs2, 99)),
                    fmt_ms(max(xs2) if xs2 else float("nan")),
                    "—",
                    "—",
                ]
            )
        cs = card_shown.get(name, [])
        down_rows.append(
            [
                name,
                "click → card shows the decision",
                str(len(cs)),
                fmt_ms(percentile(cs, 50)),
                fmt_ms(percentile(cs, 99)),
                fmt_ms(max(cs) if cs else float("nan")),
                "—",
                "—",
            ]
        )
    check_rows = [[what, "yes" if ok else "**no**", detail] for what, ok, detail in res.checks]
    floor_rows = [[k, fmt_ms(p50), fmt_ms(p99)] for k, (p50, p99) in res.bolt_floor.items()]
    floor_tables = (
        [
            (
                "(c) Where an ack's time goes: Bolt alone, in-process (AsyncApp.async_dispatch of "
                "a block_actions request whose listener only calls ack()), ms",
                (["Bolt setting", "p50", "p99"], floor_rows),
            )
        ]
        if floor_rows
        else []
    )
    ncpu = len(os.sched_getaffinity(0))
    cpu_rows: list[list[str]] = []
    cpu_header: list[str] = ["phase"]
    for name, use in res.cpu.items():
        per = res.cpu_per_click.get(name, {})
        cpu_header = ["phase", "what", *use]
        cpu_rows.append(
            [name, "CPU-s per s, during the clicks", *(f"{v:.2f}" for v in use.values())]
        )
        cpu_rows.append(
            [name, "CPU-ms per click, until all done", *(f"{v:.1f}" for v in per.values())]
        )
    cpu_tables = (
        [(f"CPU use (the machine has {ncpu} CPUs)", (cpu_header, cpu_rows))] if cpu_rows else []
    )
    return [
        (
            "Acknowledgement latency (scheduled send → HTTP response), ms",
            (
                [
                    "phase",
                    "requests",
                    "200",
                    "runs started",
                    "ERROR lines ("
                    + "/".join(n for n in next(iter(res.errors.values()), {}))
                    + ")",
                    "p50",
                    "p99",
                    "max",
                    "target",
                    "met",
                ],
                ack_rows,
            ),
        ),
        (
            "Downstream latency of the first click on each gate, ms",
            (["phase", "what", "n", "p50", "p99", "max", "target", "met"], down_rows),
        ),
        *cpu_tables,
        *floor_tables,
        ("Checks", (["check", "ok", "detail"], check_rows)),
    ]


def text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def write_markdown(runs: list[Results], command: str, out: Path, analysis: str) -> None:
    cfg = runs[0].config
    minutes = sum(r.elapsed for r in runs) / 60
    parts = [
        "# Benchmark 2: Slack-side latency under load",
        "",
        f"Produced by `{command}` on {datetime.date.today().isoformat()}, "
        f"in {minutes:.1f} minutes (seed {cfg.seed}).",
        "",
        f"**Code:** commit {runs[0].code}. **Machine:** {machine()}.",
        "",
        "**Set-up:** one private `redis-server` (no persistence), one `web` process "
        f"(`python -m bot`, HTTP mode) and {cfg.workers} `worker` process(es) "
        "(`python -m agent_core.worker`, `WORKER_CONCURRENCY=16`), `LOG_LEVEL=WARNING`; "
        "`tests.slack_fake.FakeSlack` (Block Kit validation off) and `agent_core.testing.FakeOpenAI` "
        "in one process of their own; this process sends the requests. All of them share the "
        "machine's CPUs, over loopback. Requests are signed and form-encoded exactly as Slack "
        "sends them; gates were opened by the real `/agent <task>` path (paced at "
        f"{cfg.open_rate:.0f}/s) and their cards posted before the clicks. {cfg.warmup} warm-up "
        f"clicks are not counted. Double clicks: {DOUBLE_SHARE:.0%} of the clicks of each phase "
        "hit a gate already clicked (paced: 5-100 ms later; bursts: in the same burst), by the "
        "same approver or the other one.",
        "",
        "**Measured:** open loop. Each request has a scheduled send time (paced: t0 + k/rate; "
        "burst: one instant for all, each on a new connection) and every latency is measured "
        "from it, so a slow server cannot slow the arrivals down. *Tool start* is the first line "
        "of the gated tool (`time.monotonic()`, written by `tests/bench/slack_agent.py` in the "
        "worker); *card shows the decision* is the fake Slack's first `chat.update` of the "
        "card with the decided text (`tests/bench/slack_fakes.py`). *ERROR lines* counts the "
        "lines logged at ERROR by each process during the phase; *runs started* compares the "
        "runs created with the slash commands sent.",
        "",
    ]
    for res in runs:
        label = res.config.label
        if len(runs) > 1:
            parts += [f"## {label}", ""]
        for title, (header, rows) in tables(res):
            parts += [f"{'###' if len(runs) > 1 else '##'} {title}", "", md_table(header, rows), ""]
        if res.notes:
            parts += ["Notes:", ""] + [f"- {n}" for n in res.notes] + [""]
        if res.profiles:
            parts += [
                f"### Profile of the paced phase ({label}; py-spy, 200 Hz)",
                "",
                "Sampling slows the processes down: the latencies of a `--profile` run are not "
                "the benchmark's.",
                "",
            ]
            for name, summary in res.profiles.items():
                parts += [f"#### {name}", "", "```", summary, "```", ""]
    if analysis:
        parts += [analysis.strip(), ""]
    out.write_text("\n".join(parts))


def print_report(res: Results) -> None:
    print(f"\n=== {res.config.label} ===")
    for title, (header, rows) in tables(res):
        print(title)
        print(text_table(header, rows))
        print()
    for n in res.notes:
        print("note:", n)
    for name, summary in res.profiles.items():
        print(f"\nprofile of {name}:\n{summary}")


ANALYSIS_FILE = HERE / "slack_analysis.md"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--paced", type=int, default=2000)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--open-rate", type=float, default=50.0, help="slash commands/s opening gates")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3, help="runs of the main paced phase")
    p.add_argument("--no-bursts", action="store_true", help="only the paced phases")
    p.add_argument(
        "--sweep",
        default="50,100,150",
        help="lower paced rates (clicks/s, comma-separated; '' for none), 1,000 clicks each",
    )
    p.add_argument("--profile", action="store_true", help="sample web/worker with py-spy")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="markdown file (default tests/bench/SLACK_RESULTS.md)",
    )
    p.add_argument("--keep", action="store_true", help="keep the logs directory")
    p.add_argument("--save-raw", type=Path, default=None, help="also save every sample (JSON)")
    p.add_argument(
        "--render", type=Path, default=None, help="write the markdown from a --save-raw file"
    )
    args = p.parse_args(argv)
    cfg = Config(
        rate=args.rate,
        paced=args.paced,
        workers=args.workers,
        seed=args.seed,
        open_rate=args.open_rate,
        profile=args.profile,
        sweep=tuple(float(x) for x in args.sweep.split(",") if x.strip()),
        repeat=args.repeat,
    )
    if args.quick:
        cfg.paced, cfg.bursts, cfg.command_bursts, cfg.warmup = 400, (50, 100), (50, 100), 20
        cfg.sweep, cfg.sweep_clicks, cfg.repeat = (100.0,), 200, 1
    if args.no_bursts:
        cfg.bursts, cfg.command_bursts = (), ()
    if cfg.workers != 1:
        cfg.label += f", {cfg.workers} workers"
    configs = [cfg]
    skip = (args.quick or args.profile or args.no_bursts) and args.render is None
    out = args.out or (None if skip else cfg.out)
    if args.render is not None:
        runs, command = load_raw(args.render)
    else:
        runs = []
        for c in configs:
            print(f"=== {c.label} ===")
            workdir = Path(tempfile.mkdtemp(prefix="slack-bench-"))
            try:
                runs.append(asyncio.run(bench(c, workdir)))
            finally:
                if args.keep:
                    print(f"logs kept in {workdir}")
                else:
                    shutil.rmtree(workdir, ignore_errors=True)
        shown = list(argv if argv is not None else sys.argv[1:])
        if "--save-raw" in shown:  # where the raw data went is not part of the recipe
            i = shown.index("--save-raw")
            del shown[i : i + 2]
        command = " ".join([".venv/bin/python -m tests.bench.slack_latency", *shown])
        if args.save_raw is not None:
            save_raw(runs, command.strip(), args.save_raw)
    for res in runs:
        print_report(res)
    if out is not None:
        analysis = ANALYSIS_FILE.read_text() if ANALYSIS_FILE.exists() else ""
        write_markdown(runs, command.strip(), out, analysis)
        print(f"wrote {out}")
    failed = [c for res in runs for c in res.checks if not c[1]]
    return 1 if failed else 0


def save_raw(runs: list[Results], command: str, path: Path) -> None:
    """Every sample and figure, to render the markdown again (``--render``) without a run."""

    def enc(o: Any) -> Any:
        return str(o) if isinstance(o, Path) else o

    data = {"command": command, "date": datetime.date.today().isoformat()}
    data["runs"] = [dataclasses.asdict(r) for r in runs]  # type: ignore[assignment]
    path.write_text(json.dumps(data, default=enc))


def load_raw(path: Path) -> tuple[list[Results], str]:
    data = json.loads(path.read_text())
    runs = []
    for r in data["runs"]:
        known = {f.name for f in dataclasses.fields(Config)}
        cfg = Config(**{k: v for k, v in r.pop("config").items() if k in known})
        cfg.out = Path(cfg.out)
        cfg.bursts, cfg.command_bursts = tuple(cfg.bursts), tuple(cfg.command_bursts)
        cfg.sweep = tuple(cfg.sweep)
        r["phases"] = {n: [Sample(**x) for x in xs] for n, xs in r["phases"].items()}
        r["checks"] = [tuple(c) for c in r["checks"]]
        r["started"] = {n: tuple(v) for n, v in r["started"].items()}
        r["bolt_floor"] = {n: tuple(v) for n, v in r["bolt_floor"].items()}
        fields = {f.name for f in dataclasses.fields(Results)}
        runs.append(Results(config=cfg, **{k: v for k, v in r.items() if k in fields}))
    return runs, str(data["command"])


if __name__ == "__main__":
    raise SystemExit(main())
