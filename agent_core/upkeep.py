"""The workers' upkeep of every shard: gates past their deadline, finished runs to purge, and
stuck runs to repair. :class:`Gateway` delegates :meth:`Gateway.due_gates`,
:meth:`Gateway.purge_finished` and :meth:`Gateway.repair_stuck` here.
"""

from __future__ import annotations

from collections.abc import Iterable

from redis.asyncio import Redis

from .ids import valid_run_id
from .keys import Keys
from .script_replies import RepairOutcome
from .scripts import Scripts


class Upkeep:
    """Finds due gates, purges finished runs and repairs stuck ones, shard by shard."""

    def __init__(self, redis: Redis, keys: Keys, scripts: Scripts) -> None:
        self.redis = redis
        self.keys = keys
        self.scripts = scripts
        self._check_cursor = (0, 0)  # (shard, start) of repair_stuck's walk

    async def due_gates(
        self, limit: int, shards: Iterable[int] | None
    ) -> tuple[list[str], float | None]:
        """Pending gate ids past their deadline; see :meth:`Gateway.due_gates`."""
        k = self.keys
        chosen = list(k.all_shards() if shards is None else shards)
        # TIME on its own: a cluster pipeline cannot carry a keyless command.
        sec, usec = await self.redis.time()
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in chosen:
                pipe.zrange(k.deadlines(shard), 0, limit, withscores=True)
            per_shard = await pipe.execute()
        now = sec + usec / 1e6
        entries = sorted((e for rows in per_shard for e in rows), key=lambda e: e[1])
        due = [g for g, score in entries if score <= now][:limit]
        later = [score for _, score in entries if score > now]
        return due, (later[0] - now if later else None)

    async def purge_finished(self, older_than: float, limit: int) -> int:
        """Delete the keys of long-finished runs; see :meth:`Gateway.purge_finished`."""
        k = self.keys
        sec, usec = await self.redis.time()
        cutoff = sec + usec / 1e6 - older_than
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in k.all_shards():
                pipe.zrangebyscore(k.finished(shard), "-inf", cutoff, start=0, num=limit)
            per_shard = await pipe.execute()
        run_ids = [r for rows in per_shard for r in rows if valid_run_id(r, k)][:limit]
        if not run_ids:
            return 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.hmget(k.run(run_id), ["turn", "requested_by"])
                pipe.smembers(k.run_gates(run_id))
                pipe.hvals(k.authors(run_id))  # whoever continued it has it in their index
            replies = await pipe.execute()
        async with self.redis.pipeline(transaction=False) as pipe:
            for i, run_id in enumerate(run_ids):
                (turn, requested_by), gate_ids = replies[3 * i], replies[3 * i + 1]
                authors = {a for a in replies[3 * i + 2] if a} | {requested_by or ""}
                doomed = [k.run(run_id), k.history(run_id), k.run_gates(run_id)]
                doomed += [k.run_inbox(run_id), k.authors(run_id), k.children(run_id)]
                doomed.append(k.grants(run_id))  # its thread's grants die with it
                doomed += [k.turn(run_id, n) for n in range(1, int(turn or 0) + 1)]
                doomed += [k.gate(g) for g in gate_ids]
                pipe.unlink(*doomed)
                shard = k.shard_of(run_id)
                for author in sorted(authors - {""}):
                    pipe.zrem(k.user_runs(author, shard), run_id)
                pipe.zrem(k.finished(shard), run_id)
                pipe.zrem(k.active(shard), run_id)
            await pipe.execute()
        return len(run_ids)

    async def repair_stuck(self, stuck_after: float, limit: int) -> list[str]:
        """Repair the runs nothing will move on; see :meth:`Gateway.repair_stuck`."""
        k = self.keys
        # Walk every shard's set across calls, `limit` runs at a time.
        shard, start = self._check_cursor
        run_ids = await self.redis.zrange(k.active(shard), start, start + limit - 1)
        if len(run_ids) < limit:
            self._check_cursor = ((shard + 1) % k.shards, 0)
        else:
            self._check_cursor = (shard, start + limit)
        run_ids = [r for r in run_ids if valid_run_id(r, k)]
        if not run_ids:
            return []
        sec, usec = await self.redis.time()
        async with self.redis.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.hmget(k.run(run_id), ["status", "updated_at", "lease_until"])
            rows = await pipe.execute()
        now = sec + usec / 1e6
        suspects = [
            run_id
            for run_id, (status, updated, lease) in zip(run_ids, rows, strict=True)
            if status is None
            or status in ("completed", "failed", "cancelled")
            or (float(lease or 0) <= now and float(updated or 0) <= now - stuck_after)
        ]
        repaired: list[str] = []
        for run_id in suspects:
            for _ in range(3):
                gate_ids = sorted(await self.redis.smembers(k.run_gates(run_id)))
                res = await self.scripts.repair_run(run_id, stuck_after, gate_ids, shard=shard)
                if res is not RepairOutcome.RETRY:
                    break
            if res is RepairOutcome.REPAIRED:
                repaired.append(run_id)
        return repaired
