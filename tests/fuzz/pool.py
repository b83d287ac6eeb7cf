"""Pending gates for fuzzing, opened directly by the core's own script, and a judge of changes.

A :class:`GatePool` keeps a few runs paused on real gates (``Runner._open_gates``, the script
the worker uses; no worker runs, so nothing moves but what the requests move). After each
request, :meth:`GatePool.changes` lists the gates that left ``pending``; a change is allowed
only when the request named the gate (its id) or its run (its id, for ``cancel``), and when
the user in the request may make it.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from slack_sdk.web.async_client import AsyncWebClient

from agent_core import Gateway
from agent_core.runner import Runner
from agent_core.scripts import Scripts
from tests.agents import ops
from tests.bot.conftest import APPROVER, APPROVER2, CHANNEL, GROUP_MEMBER, REQUESTER, BotHarness

APPROVERS = frozenset({APPROVER, APPROVER2, GROUP_MEMBER})


@dataclass(frozen=True)
class PoolGate:
    gate_id: str
    run_id: str
    requested_by: str


class GatePool:
    def __init__(
        self,
        redis: Redis,
        gateway: Gateway,
        *,
        runs: int = 2,
        per_run: int = 2,
        slack: AsyncWebClient | None = None,
        threaded: bool = True,
    ) -> None:
        self.redis = redis
        self.gateway = gateway
        self.slack = slack
        self.threaded = threaded  # False: runs started outside a thread (no thread_ts)
        self.runs = runs
        self.per_run = per_run
        self.gates: list[PoolGate] = []
        self._runner = Runner(
            redis,
            gateway.keys,
            ops,
            client=None,  # type: ignore[arg-type]
            model="m",
            approval_timeout=3600,
        )

    async def fill(self) -> GatePool:
        """Open runs until every run of the pool has ``per_run`` pending gates."""
        by_run: dict[str, int] = {}
        for g in self.gates:
            by_run[g.run_id] = by_run.get(g.run_id, 0) + 1
        while len(by_run) < self.runs:
            run_id = await self._open_run()
            by_run[run_id] = self.per_run
        return self

    async def _open_run(self) -> str:
        gw = self.gateway
        thread_ts = "1700000000.000001"
        if (
            self.slack is not None and self.threaded
        ):  # a root message, as /agent posts it, for the run's updates
            thread_ts = str((await self.slack.chat_postMessage(channel=CHANNEL, text="task"))["ts"])
        # As /agent's: the thread starts with the bot's own root message (not recorded here,
        # as when web dies before recording it: the notifier updates it all the same).
        origin = (
            {"channel": CHANNEL, "thread_ts": thread_ts, "root_ts": thread_ts}
            if self.threaded
            else {"channel": CHANNEL}
        )
        run = await gw.start_run(
            f"fuzz {secrets.token_hex(4)}", requested_by=REQUESTER, origin=origin
        )
        k = gw.keys
        await self.redis.hset(
            k.run(run.run_id), mapping={"status": "running", "turn": 1, "phase": "tools"}
        )
        calls: list[dict[str, Any]] = [
            {
                "id": f"c{i}",
                "name": "delete_user",
                "args": {"user_id": str(i)},
                "gate_id": k.new_gate_id(k.shard_of(run.run_id)),
            }
            for i in range(self.per_run)
        ]
        await self.redis.hset(
            k.turn(run.run_id, 1), mapping={f"state:{c['id']}": "needs_gate" for c in calls}
        )
        # Opened as a worker opens them: under the run's lease, then the lease is released.
        scripts = Scripts(self.redis, k)
        lease = await scripts.acquire_lease(run.run_id, lease_ms=60_000, worker="pool")
        fields = await self.redis.hgetall(k.run(run.run_id))
        await self._runner._open_gates(fields, 1, calls, lease.fence)
        await scripts.release_lease(run.run_id, lease.fence)
        self.gates += [PoolGate(c["gate_id"], run.run_id, REQUESTER) for c in calls]
        return run.run_id

    async def carded(self, timeout: float = 10.0) -> None:
        """Until the notifier has posted every gate's card, updated every root message it
        can (posted with ``slack``) to "awaiting approval", and released its locks."""
        k = self.gateway.keys

        async def done() -> bool:
            cards = [
                await self.redis.hget(k.ext("slack-card", g.gate_id, k.shard_of(g.gate_id)), "ts")
                for g in self.gates
            ]
            roots = [
                await self.redis.hget(k.ext("slack-run", r, k.shard_of(r)), "digest")
                for r in (self.run_ids if self.slack is not None and self.threaded else [])
            ]
            locks = await self.redis.keys("{" + k.prefix + "*:ext:slack-lock:*")
            return all(cards) and all(roots) and not locks

        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not await done():
            if loop.time() > end:
                raise AssertionError("the gates' cards were not posted")
            await asyncio.sleep(0.01)

    @property
    def gate_ids(self) -> list[str]:
        return [g.gate_id for g in self.gates]

    @property
    def run_ids(self) -> list[str]:
        return sorted({g.run_id for g in self.gates})

    async def changes(self) -> dict[PoolGate, tuple[str, str]]:
        """Gates no longer pending: ``{gate: (status, decided_by)}``."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for g in self.gates:
                pipe.hmget(self.gateway.keys.gate(g.gate_id), ["status", "decided_by"])
            replies = await pipe.execute()
        return {
            g: (str(st), str(by or ""))
            for g, (st, by) in zip(self.gates, replies, strict=True)
            if st != "pending"
        }

    async def judge(self, raw_request: str, user: str | None) -> list[str]:
        """Problems with the changes the request made; the changed gates leave the pool.

        A run with a changed gate leaves the pool whole (a cancel moves all its gates).
        """
        problems: list[str] = []
        changed = await self.changes()
        for g, (status, by) in changed.items():
            named = g.gate_id in raw_request or (status == "cancelled" and g.run_id in raw_request)
            if not named:
                problems.append(f"gate {g.gate_id} became {status} but the request never named it")
            if status == "approved" and (by not in APPROVERS or by == g.requested_by):
                problems.append(f"gate {g.gate_id} approved by {by!r}, who may not approve it")
            if status == "denied" and by not in APPROVERS | {g.requested_by}:
                problems.append(f"gate {g.gate_id} denied by {by!r}, who may not deny it")
            if status in ("approved", "denied") and by != user:
                problems.append(f"gate {g.gate_id} decided by {by!r}, not the sender {user!r}")
            if status == "expired":
                problems.append(f"gate {g.gate_id} expired an hour early")
        gone = {g.run_id for g in changed}
        self.gates = [g for g in self.gates if g.run_id not in gone]
        if gone:
            await self.fill()
        return problems


async def settle(bot: BotHarness, timeout: float = 10.0) -> None:
    """Until the work the bot does after its ``ack()`` is finished."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    idle = 0
    while loop.time() < end:
        busy = [t for t in bot.server.context.inflight if not t.done()]
        idle = idle + 1 if not busy else 0
        if idle >= 2:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the bot's handlers did not finish")
