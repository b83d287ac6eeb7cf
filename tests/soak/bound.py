"""The failover bound (part of :class:`tests.soak.test_soak.Soak`; Redis Cluster only).

Issue 17 (2): after a master is SIGKILLed right after approvals were acknowledged, every
decision's effect must show within :data:`BOUND` seconds of the click. Every other master kill
of the cluster soak is timed so (:meth:`Bound.kill_after_ack`): the other faults are held, and
the first Approve acknowledged (HTTP 200) for a gate whose run's shard a master serves has that
master SIGKILLed at once, from a thread of its own (the time from the acknowledgement to the
kill is counted). The faults stay held until the bound has passed, so that it measures the
failover alone.

The check (:meth:`Bound.failover_bound`) takes every Approve acknowledged within 1 s before a
master kill (timed or not), on the killed master or another one, whose gate ended approved.
From the acknowledgement (or, when its turn had other gates, the last of their decisions: the
run resumes only then) to the first sign that the run went on: the call's ``tool.executed``
event, its child run created (a gated sub-agent call), a later gate of the run opened, or the
run's end. Over the bound is a violation, unless a worker was SIGKILLed or paused in that
window (counted apart). Times are the events' stream entry ids and the gates' and runs'
recorded times, all this machine's clock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import statistics
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

from agent_core import Gateway, Keys
from tests.redis_cluster import ClusterServer, Failover
from tests.soak.people import ChildRun, Click, GateRecord, SoakSlack
from tests.soak.soak_agent import SUB_AGENTS

BOUND = 15.0  # seconds from an acknowledged Approve to its effect, across a master kill
WINDOW = 1.0  # clicks acknowledged this long before a kill are measured
QUIET_AFTER = BOUND + 5.0  # the other faults stay held this long after a timed kill
ACK_WAIT = 30.0  # a timed kill waits this long for an Approve; then it kills at random


@dataclass
class MasterKill:
    """One master SIGKILL: which master, the shards it served, when (unix seconds), and the
    acknowledged click it followed (a timed kill)."""

    port: int
    shards: frozenset[int]
    at: float
    click: Click | None = None
    gate_id: str = ""
    run_id: str = ""


Killing = concurrent.futures.Future[tuple[Failover, float]]  # a failover in its thread


@dataclass
class Armed:
    """A timed kill waiting for an acknowledged Approve."""

    got: asyncio.Future[tuple[MasterKill, Killing]]
    shard_ports: dict[int, int]  # shard -> the port of the master serving it


class Bound:
    """Timed master kills and the check of the failover bound."""

    # Set by Soak.__init__ (tests/soak/test_soak.py).
    cluster: ClusterServer | None
    redis: Redis
    slack: SoakSlack
    keys: Keys
    gateway: Gateway
    counts: Counter[str]
    gates: dict[str, GateRecord]
    children: dict[str, ChildRun]
    chaos: bool
    paused: Any
    workers: list[Any]
    web: Any
    master_kills: list[MasterKill]
    worker_faults: list[tuple[float, float]]  # unix seconds: SIGKILL to restart, SIGSTOP to CONT
    executed_at: dict[tuple[str, str], float]  # (run id, call id) -> first tool.executed
    opened_at: dict[str, list[float]]  # run id -> its gate.opened events' times
    ended_at: dict[str, float]  # run id -> its end event's time
    bound_summary: str
    quiet: bool
    quiet_until: float  # time.monotonic()
    armed: Armed | None
    killer: concurrent.futures.ThreadPoolExecutor

    if TYPE_CHECKING:

        def note(self, what: str) -> str: ...

        async def safely(self, coro: Awaitable[Any], default: Any = None) -> Any: ...

    # ------------------------------------------------------------------ the kills
    async def hold_faults(self) -> None:
        """Wait while a timed kill holds the other faults."""
        while self.chaos and (self.quiet or time.monotonic() < self.quiet_until):
            await asyncio.sleep(0.2)

    def shard_ports(self, masters: list[int]) -> dict[int, int]:
        """Shard -> the port of the master serving its slot, for ``masters`` (blocking)."""
        cluster = self.cluster
        assert cluster is not None
        nodes = [n for n in cluster.cluster_nodes() if n.port in masters]
        out: dict[int, int] = {}
        for shard in self.keys.all_shards():
            slot = self.keys.slot(shard)
            port = next((n.port for n in nodes if slot in n.slots), None)
            if port is not None:
                out[shard] = port
        return out

    def fail_over(self, port: int) -> tuple[Failover, float]:
        """SIGKILL master ``port`` and wait for its replica's promotion (blocking: run in a
        thread). Returns what the cluster saw and when the kill was (unix seconds)."""
        cluster = self.cluster
        assert cluster is not None
        f = cluster.failover_master(port, 60.0)
        return f, time.time() - f.seconds

    async def kill_after_ack(self, masters: list[int]) -> tuple[MasterKill, Killing] | None:
        """Hold the other faults, wait until no worker is paused or down, then arm: the next
        acknowledged Approve of a gate on one of ``masters`` fails that master over at once
        (:meth:`clicked`). None when no such click came within :data:`ACK_WAIT` seconds."""
        self.quiet = True
        give_up = time.monotonic() + ACK_WAIT
        while self.chaos and time.monotonic() < give_up:
            if self.paused is None and all(p.alive for p in (*self.workers, self.web)):
                break
            await asyncio.sleep(0.1)
        shard_ports = await asyncio.to_thread(self.shard_ports, masters)
        await asyncio.sleep(WINDOW + 0.5)  # the clicks measured come after the faults held
        if not self.chaos:
            return None
        armed = self.armed = Armed(asyncio.get_running_loop().create_future(), shard_ports)
        try:
            return await asyncio.wait_for(asyncio.shield(armed.got), ACK_WAIT)
        except TimeoutError:
            self.counts["timed master kills with no Approve acknowledged (killed at random)"] += 1
            return None
        finally:
            self.armed = None

    def clicked(self, rec: GateRecord, c: Click) -> None:
        """A click was answered: an acknowledged Approve fires an armed kill, at once."""
        armed = self.armed
        if (
            armed is None
            or armed.got.done()
            or c.kind != "approve"
            or c.status != 200
            or c.sent_unix >= rec.deadline
        ):
            return
        port = armed.shard_ports.get(self.keys.shard_of(rec.run_id))
        if port is None:
            return
        self.armed = None
        killing = self.killer.submit(self.fail_over, port)
        shards = frozenset(s for s, p in armed.shard_ports.items() if p == port)
        kill = MasterKill(port, shards, time.time(), c, rec.gate_id, rec.run_id)
        armed.got.set_result((kill, killing))

    def kill_held(self) -> None:
        """A timed kill was made: the other faults stay held until the bound has passed."""
        self.quiet_until = time.monotonic() + QUIET_AFTER
        self.quiet = False

    # ------------------------------------------------------------------ the check
    def worker_fault_between(self, t0: float, t1: float) -> bool:
        return any(a <= t1 and b >= t0 for a, b in self.worker_faults)

    async def effect_at(self, rec: GateRecord, call_id: str, due: float) -> float | None:
        """When the approved call's effect showed (unix seconds): the first of its
        ``tool.executed``, its child run created, a later gate of its run opened, the run's
        end. None: never."""
        run_id = rec.run_id
        seen = [
            self.executed_at.get((run_id, call_id)),
            self.ended_at.get(run_id),
            *(t for t in self.opened_at.get(run_id, []) if t > due),
        ]
        for child in self.children.values():
            if child.parent == run_id and child.parent_call == call_id:
                created = await self.safely(
                    self.redis.hget(self.keys.run(child.run_id), "created_at")
                )
                if created:
                    seen.append(float(created))
        times = [t for t in seen if t is not None]
        return min(times) if times else None

    def card_answered_at(self, rec: GateRecord, due: float) -> float | None:
        """When the gate's card first showed the approved call's outcome (not "Running…")
        after ``due``, as Slack received it (unix seconds); None: never."""
        where = self.slack.card_at.get(rec.gate_id)
        if where is None:
            return None
        for call in self.slack.calls_to("chat.update"):
            args = call.args
            if (
                call.ok
                and call.at >= due
                and (str(args.get("channel")), str(args.get("ts"))) == where
                and str(args.get("text", "")).startswith("Approved")
                and "Running…" not in json.dumps(args.get("blocks") or [], ensure_ascii=False)
            ):
                return call.at
        return None

    async def failover_bound(self) -> list[str]:
        """The violations of the bound, and a summary line (:attr:`bound_summary`)."""
        violations: list[str] = []
        delays: list[float] = []
        where_count: Counter[str] = Counter()
        never = 0
        card_delays: list[float] = []  # to the card showing the outcome: reported, not checked
        for kill in self.master_kills:
            for rec in self.gates.values():
                acked = [
                    c
                    for c in rec.clicks
                    if c.kind == "approve"
                    and c.status == 200
                    and c.acked_unix is not None
                    and kill.at - WINDOW <= c.acked_unix <= kill.at
                    and c.sent_unix < rec.deadline
                ]
                if not acked:
                    continue
                click = min(acked, key=lambda c: c.acked_unix or 0.0)
                assert click.acked_unix is not None
                gate = await self.gateway.get_gate(rec.gate_id)
                if gate is None or gate.status.value != "approved":
                    self.counts["failover bound: acked Approves whose gate ended otherwise"] += 1
                    continue
                turn = [g for g in await self.gateway.gates(rec.run_id) if g.turn == gate.turn]
                decided = [g.decided_at for g in turn]
                if any(d is None for d in decided):
                    self.counts["failover bound: acked Approves with a gate of the turn open"] += 1
                    continue
                due = max([click.acked_unix, *(d for d in decided if d is not None)])
                effect = await self.effect_at(rec, gate.call_id, due)
                on = (
                    "the killed master"
                    if self.keys.shard_of(rec.run_id) in kill.shards
                    else ("another master")
                )
                where_count[on] += 1
                what = (
                    f"{rec.op} (gate {rec.gate_id}, run {rec.run_id} on {on}, "
                    f"{'timed ' if kill.click is not None else ''}kill of {kill.port})"
                )
                if effect is None:
                    seconds = float("inf")
                else:
                    seconds = max(0.0, effect - due)
                    delays.append(seconds)
                if due > click.acked_unix + 0.001:
                    self.counts["failover bound: measured from a later decision of the turn"] += 1
                took = "never" if effect is None else f"{seconds:.1f} s"
                card = "-"
                if rec.tool not in SUB_AGENTS:  # a sub-agent's card runs until its child ends
                    shown = self.card_answered_at(rec, due)
                    card = "never" if shown is None else f"{max(0.0, shown - due):.1f} s"
                    card_delays.append(float("inf") if shown is None else max(0.0, shown - due))
                self.note(f"failover bound: {what}: its effect after {took}, its card after {card}")
                if seconds <= BOUND:
                    continue
                if self.worker_fault_between(due - WINDOW, due + BOUND):
                    self.counts["failover bound: over, excused (a worker fault too)"] += 1
                    continue
                if effect is None:
                    never += 1
                violations.append(
                    f"failover bound: {what}: its effect {took} after the click (> {BOUND:.0f} s)"
                )
        timed = [k for k in self.master_kills if k.click is not None]
        ack_ms = [
            (k.at - k.click.acked_unix) * 1000
            for k in timed
            if k.click is not None and k.click.acked_unix is not None
        ]
        n = sum(where_count.values())
        self.counts["failover bound: clicks measured"] = n
        self.counts["failover bound: violations"] = len(violations)
        self.counts["master kills right after an acknowledged Approve"] = len(timed)
        self.bound_summary = (
            f"failover bound ({BOUND:.0f} s, Approves acked within {WINDOW:.0f} s before a "
            f"master kill): kills={len(self.master_kills)} (timed after an ack {len(timed)}, "
            f"ack to kill max {max(ack_ms, default=0):.0f} ms), clicks measured={n} "
            f"(on the killed master {where_count['the killed master']}, on others "
            f"{where_count['another master']}), over {BOUND:.0f} s={len(violations)}, "
            f"never={never}, "
            f"max={max(delays, default=0):.1f} s, "
            f"p50={statistics.median(delays) if delays else 0:.1f} s; cards showing the "
            f"outcome (not checked): {len(card_delays)}, over {BOUND:.0f} s "
            f"{sum(1 for d in card_delays if d > BOUND)}, "
            f"max={max(card_delays, default=0):.1f} s, "
            f"p50={statistics.median(card_delays) if card_delays else 0:.1f} s"
        )
        return violations
