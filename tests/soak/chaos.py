"""The soak's processes and its faults (part of :class:`tests.soak.test_soak.Soak`).

:class:`Proc` is a ``web`` or ``worker`` process the soak started (signalled by its own PID
only). :class:`Chaos` SIGKILLs workers and ``web`` and restarts them, SIGKILLs ``redis-server``
and restarts it from its append-only file (on Redis Cluster: SIGKILLs a master, waits for its
replica's promotion, then restarts the killed node from its files, a replica of its successor,
so that the next kill finds a replica too), pauses a worker (SIGSTOP) past its lease and
continues it (sometimes mid-tool, found through the tools' journal), counting the takeovers,
and restarts a process that exited by itself, like a supervisor. Every fault is written to
``chaos.log``; a fault that hits while a child run (a sub-agent's) is active is counted apart,
and so is a killed or paused worker that held a child run's lease.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import os
import random
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from redis.asyncio import Redis

from agent_core import Keys
from tests.redis_cluster import ClusterServer
from tests.redis_server import RedisServer
from tests.slack_fake import HttpResult, SlackClient
from tests.soak.bound import Bound, MasterKill
from tests.soak.config import FIN_CHANNEL, PAUSE_SECONDS, REPO, SEED, redis_failed
from tests.soak.people import op_depth

T = TypeVar("T")

# The Redis faults, as counted (one kind per soak).
REDIS_RESTARTS = "Redis SIGKILLs (restarted from the AOF)"
FAILOVERS = "master failovers (master SIGKILLed, replica promoted, node rejoined as a replica)"


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a thread (the cluster's calls sleep while they wait), waited for even
    when the calling task is cancelled meanwhile: a failover or a restart is never left
    half-way while the end of the soak heals the cluster."""
    return await waited(asyncio.ensure_future(asyncio.to_thread(fn, *args)))


async def waited(fut: asyncio.Future[T]) -> T:
    """``fut``'s result, waited for even when the calling task is cancelled meanwhile."""
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await fut
        raise


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


class Chaos(Bound):
    """The faults, and the records of them the rest of the soak consults."""

    # Set by Soak.__init__ (tests/soak/test_soak.py).
    rng: random.Random
    redis_server: RedisServer | None  # one redis-server ...
    cluster: ClusterServer | None  # ... or a Redis Cluster
    redis_down: bool  # a Redis fault is under way (the server, or a master, is down)
    redis: Redis
    keys: Keys
    counts: Counter[str]
    journal: Path
    _journal_at: int
    running_tools: dict[str, tuple[str, int]]
    paused: subprocess.Popen[bytes] | None
    takeovers: dict[str, list[str]]
    chaos_log: Path
    chaos: bool
    web_kills: list[float]
    redis_outages: list[tuple[float, float]]
    workers: list[Proc]
    web: Proc
    bot_out: list[tuple[float, float]]  # unix times the bot was out of the approval channel
    client: SlackClient

    if TYPE_CHECKING:

        def spawn(self, coro: Awaitable[Any]) -> None: ...

        async def send(self, make: Callable[[], Awaitable[HttpResult]]) -> int: ...

        def open_children(self) -> list[str]: ...

    def note(self, what: str) -> str:
        """Append a line to chaos.log (timestamps comparable with the processes' logs)."""
        stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
        with self.chaos_log.open("a", encoding="utf-8") as f:
            f.write(f"{stamp} {what}\n")
        return stamp

    def fault_hit(self, what: str) -> None:
        """Count a fault that hit while a child run was active (as the watcher last saw)."""
        if self.open_children():
            self.counts[f"faults while a child run was active: {what}"] += 1

    async def child_runs_among(self, run_ids: list[str]) -> list[str]:
        """Those of ``run_ids`` that are child runs (a sub-agent's); [] while Redis is down."""
        if not run_ids:
            return []
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for run_id in run_ids:
                    pipe.hget(self.keys.run(run_id), "parent")
                parents = await pipe.execute()
        except Exception as exc:
            if not redis_failed(exc):
                raise
            return []
        return [r for r, parent in zip(run_ids, parents, strict=True) if parent]

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
            await self.hold_faults()
            if not self.chaos:
                return
            pid = w.proc.pid if w.alive and w.proc is not None else None
            held = await self.leases_held_by(pid) if pid is not None else None
            w.kill()
            killed = time.time()
            self.note(f"SIGKILL {w.name} pid {pid}")
            self.counts["worker SIGKILLs"] += 1
            self.fault_hit("worker SIGKILL")
            if held:
                self.counts["worker SIGKILLs while it held a run lease"] += 1
                if await self.child_runs_among(list(held)):
                    self.counts["worker SIGKILLs while it held a child run lease"] += 1
            await asyncio.sleep(self.rng.uniform(0, 2))
            w.start()
            self.worker_faults.append((killed, time.time()))
            self.note(f"started {w.name} pid {w.proc.pid if w.proc else None}")

    async def kill_web(self) -> None:
        while self.chaos:
            await asyncio.sleep(self.rng.uniform(6, 15))
            await self.hold_faults()
            if not self.chaos:
                return
            self.web.kill()
            self.note("SIGKILL web")
            self.web_kills.append(time.monotonic())
            self.counts["web SIGKILLs"] += 1
            self.fault_hit("web SIGKILL")
            await asyncio.sleep(self.rng.uniform(0.2, 2))
            self.web.start()

    async def at_times(self, at: list[float]) -> AsyncIterator[float]:
        """Each of ``at`` (monotonic times) when it comes, while the chaos lasts."""
        for t in at:
            await asyncio.sleep(max(0.0, t - time.monotonic()))
            if not self.chaos:
                return
            yield t

    async def restart_redis(self, at: list[float]) -> None:
        server = self.redis_server
        assert server is not None
        async for _ in self.at_times(at):
            self.redis_down = True
            server.kill()
            self.note("SIGKILL redis-server")
            down = time.monotonic()
            self.counts[REDIS_RESTARTS] += 1
            self.fault_hit("Redis SIGKILL")
            await asyncio.sleep(self.rng.uniform(0.3, 2))
            server.start()
            self.redis_down = False
            self.note("redis-server restarted from its AOF")
            self.redis_outages.append((down, time.monotonic()))

    def masters_with_a_replica(self) -> list[int]:
        """The ports of the cluster's masters that have a replica (blocking: in a thread)."""
        cluster = self.cluster
        assert cluster is not None
        return [m for m in cluster.masters() if cluster.replicas(m)]

    async def fail_over_masters(self, at: list[float]) -> None:
        """At each of ``at``: SIGKILL a master, wait until its replica serves its slots and
        the cluster is ok (an outage for that master's shards), then start the killed node
        again from its AOF and ``nodes.conf``: it rejoins as a replica of its successor.
        Every other kill (the first, the third, …) is timed right after an acknowledged
        Approve (:meth:`tests.soak.bound.Bound.kill_after_ack`)."""
        cluster = self.cluster
        assert cluster is not None
        self.killer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="soak-kill")
        try:
            n = 0
            async for _ in self.at_times(at):
                n += 1
                await self.fail_over_one(timed=n % 2 == 1)
        finally:
            self.quiet = False
            self.killer.shutdown(wait=False)

    async def fail_over_one(self, *, timed: bool) -> None:
        cluster = self.cluster
        assert cluster is not None
        masters = await in_thread(self.masters_with_a_replica)
        if not masters:
            self.note("no master has a replica: no failover this time")
            self.counts["failovers skipped (no master had a replica)"] += 1
            return
        got = await self.kill_after_ack(masters) if timed else None
        if got is None:
            if not self.chaos:
                return
            victim = self.rng.choice(masters)
            shard_ports = await in_thread(self.shard_ports, masters)
            shards = frozenset(s for s, p in shard_ports.items() if p == victim)
            kill = MasterKill(victim, shards, time.time())
            killing = self.killer.submit(self.fail_over, victim)
        else:
            kill, killing = got
            assert kill.click is not None and kill.click.acked_unix is not None
            self.kill_held()
        self.master_kills.append(kill)
        self.redis_down = True
        down = time.monotonic()
        pid = cluster.pid(kill.port)
        after = ""
        if kill.click is not None and kill.click.acked_unix is not None:
            after = (
                f" right after the Approve of gate {kill.gate_id} (run {kill.run_id}) "
                f"acknowledged at {kill.click.acked_unix:.3f}"
            )
        self.note(f"SIGKILL master {kill.port} pid {pid}{after} (its replica is to take over)")
        self.fault_hit("master SIGKILL")
        try:
            f, kill.at = await waited(asyncio.wrap_future(killing))
        except AssertionError as exc:  # not ok within 60 s: healed at the end
            self.note(f"the failover of {kill.port} did not complete: {str(exc)[:300]}")
            self.counts["failovers not complete within 60 s"] += 1
            return
        finally:
            self.redis_down = False
            self.redis_outages.append((down, time.monotonic()))
        self.counts[FAILOVERS] += 1
        if kill.click is not None and kill.click.acked_unix is not None:
            ms = (kill.at - kill.click.acked_unix) * 1000
            self.note(f"killed {ms:.0f} ms after the acknowledgement")
            key = "timed master kills more than 50 ms after the acknowledgement"
            self.counts[key] += int(ms > 50)
        self.note(
            f"replica {f.new_port} promoted {f.promoted_after:.2f} s after the kill; "
            f"cluster ok after {f.seconds:.2f} s"
        )
        key = "longest failover, kill to cluster ok (ms)"
        self.counts[key] = max(self.counts[key], round(f.seconds * 1000))
        await asyncio.sleep(self.rng.uniform(0.3, 2))
        took = await in_thread(cluster.restart, kill.port, 60.0)
        self.note(f"node {kill.port} restarted from its AOF: a synced replica after {took:.2f} s")
        key = "longest rejoin of a killed master as a replica (ms)"
        self.counts[key] = max(self.counts[key], round(took * 1000))

    def tail_journal(self) -> None:
        """Read the journal's new complete lines: which tools are running now, in which pid."""
        with self.journal.open("rb") as f:
            f.seek(self._journal_at)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self._journal_at += end
        for line in data[:end].decode(errors="replace").splitlines():
            parts = line.split()
            if len(parts) < 4:
                continue
            event, tool, op, pid = parts[:4]
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
                ids = [
                    r
                    for s in self.keys.all_shards()
                    for r in await self.redis.zrange(self.keys.active(s), 0, -1)
                ]
                # TIME on its own: a cluster pipeline cannot carry a keyless command.
                secs, micros = await self.redis.time()
                async with self.redis.pipeline(transaction=False) as pipe:
                    for run_id in ids:
                        pipe.hmget(self.keys.run(run_id), "fence", "lease_owner", "lease_until")
                    res = await pipe.execute()
                break
            except Exception as exc:
                if not redis_failed(exc):
                    raise
                if attempt == 2:
                    return None
                await asyncio.sleep(0.1)
        now = secs + micros / 1e6
        held: dict[str, int] = {}
        for run_id, (fence, owner, until) in zip(ids, res, strict=True):
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
            except Exception as exc:
                if not redis_failed(exc):
                    raise
                await asyncio.sleep(0.2)
        return None

    async def leave_channel(self) -> None:
        """The bot is removed from the approval channel (FIN_CHANNEL) now and then, for a few
        seconds, and invited back: a card posted meanwhile falls back to the task's thread
        (saying why), a card there cannot be updated meanwhile."""
        rng = random.Random(f"{SEED}:channel")
        while self.chaos:
            await asyncio.sleep(rng.uniform(15, 40))
            if not self.chaos:
                return
            start = time.time()
            self.slack.remove_bot(FIN_CHANNEL)
            self.bot_out.append((start, float("inf")))
            self.note(f"bot removed from {FIN_CHANNEL}")
            self.counts["bot removed from the approval channel (and invited back)"] += 1
            try:
                await asyncio.sleep(rng.uniform(2, 8))
            finally:
                self.slack.invite_bot(FIN_CHANNEL)
                self.bot_out[-1] = (start, time.time())
                self.note(f"bot invited back to {FIN_CHANNEL}")
                self.spawn(self.tell_joined())

    async def tell_joined(self) -> None:
        """Slack's ``member_joined_channel`` event for the bot back in FIN_CHANNEL, delivered
        again (as Slack retries) while web does not answer; lost after the last try."""
        for attempt, pause in enumerate((0.0, 1.0, 5.0, 15.0)):
            await asyncio.sleep(pause)
            sent = await self.send(
                lambda n=attempt: self.client.member_joined(
                    FIN_CHANNEL, self.slack.bot_user_id, retry=n
                )
            )
            if sent == 200:
                return

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
                if not self.redis_down or not self.chaos:
                    break
                await asyncio.sleep(0.1)
            await self.hold_faults()
            proc = w.proc
            if not self.chaos or proc is None or proc.poll() is not None:
                continue
            await self.pause(w, proc, self.rng.uniform(*PAUSE_SECONDS), op)

    async def pause(
        self, w: Proc, proc: subprocess.Popen[bytes], seconds: float, op: str | None
    ) -> None:
        os.kill(proc.pid, signal.SIGSTOP)
        stopped_unix = time.time()
        stopped = self.note(f"SIGSTOP {w.name} pid {proc.pid} for {seconds:.1f} s (mid-tool: {op})")
        self.paused = proc
        self.counts["worker pauses (SIGSTOP past the lease)"] += 1
        self.fault_hit("worker pause")
        if op is not None:
            self.counts["worker pauses while a tool ran"] += 1
            if op_depth(op) > 0:
                self.counts["worker pauses while a child run's tool ran"] += 1
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
            self.worker_faults.append((stopped_unix, time.time()))
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
        held_children = await self.child_runs_among(list(held))
        if held_children:
            self.counts["pauses of a worker that held a child run lease"] += 1
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
        self.counts["takeovers of child runs"] += len(set(taken) & set(held_children))
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
