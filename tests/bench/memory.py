"""Item 4: memory with 10,000 paused runs.

Real worker processes (``python -m agent_core.worker``, the bench agent) and the fake model
process; the driver starts runs (``Gateway.start_run``, task ``tests.bench.agent.TASK``) and
never decides, so every run stops at its gate. Figures:

* each worker's RSS (``/proc/<pid>/status`` VmRSS) after a warm-up of 200 paused runs and then
  at every quarter up to 10,000: it must stay flat, since no process holds a paused run;
* Redis ``used_memory`` growth divided by the number of paused runs, and ``MEMORY USAGE`` of one
  run's own keys plus each shared key's size divided by the runs (streams, sorted sets).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from agent_core import Gateway, Keys, create_redis
from tests.bench.agent import TASK
from tests.bench.common import each_shard, kb
from tests.bench.procs import FakeModelProcess, Workers, rss_bytes
from tests.bench.throughput import Driver
from tests.redis_server import RedisServer

KEYS = Keys("bench")


@dataclass
class MemoryResult:
    runs: int
    workers: int
    seconds: float
    points: list[tuple[int, list[int], int]] = field(default_factory=list)  # runs, RSS, used
    base_used: int = 0
    per_run_keys: list[tuple[str, int]] = field(default_factory=list)
    shared_keys: list[tuple[str, int]] = field(default_factory=list)


async def _start(gateway: Gateway, n: int, concurrency: int = 64) -> None:
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            await gateway.start_run(TASK, requested_by="U-bench", origin={"channel": "C-bench"})

    await asyncio.gather(*(one() for _ in range(n)))


async def _wait_paused(redis: Redis, n: int, timeout: float) -> None:
    """Until n gates are pending and no job is waiting or in progress."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        gates = sum([await redis.zcard(k) for k in each_shard(KEYS, "deadlines")])
        if gates >= n:
            info = []
            for stream in each_shard(KEYS, "jobs"):
                with contextlib.suppress(ResponseError):  # a shard's stream not made yet
                    info += await redis.xinfo_groups(stream)
            if all(int(g.get("pending", 0)) == 0 and int(g.get("lag") or 0) == 0 for g in info):
                return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"{n} runs did not all pause within {timeout} s")


async def _used(redis: Redis) -> int:
    return int((await redis.info("memory"))["used_memory"])


async def run_memory_bench(
    runs: int, n_workers: int, log: Callable[[str], None], warmup: int = 200
) -> MemoryResult:
    logdir = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    with RedisServer() as server:
        fake = FakeModelProcess()
        redis = create_redis(server.url)
        gateway = Gateway(redis, KEYS, agent_name="bench")
        try:
            with Workers(n_workers, server.url, fake.base_url, logdir) as workers:
                driver = Driver(server.url)
                await driver.wait_consumers(n_workers)
                await driver.aclose()
                res = MemoryResult(runs, n_workers, 0.0)
                res.base_used = await _used(redis)
                t0 = time.perf_counter()
                done = 0
                marks = [warmup] + [runs * q // 4 for q in (1, 2, 3, 4)]
                for mark in marks:
                    await _start(gateway, mark - done)
                    await _wait_paused(redis, mark, timeout=300)
                    done = mark
                    rss = [rss_bytes(p.pid) for p in workers.procs]
                    res.points.append((done, rss, await _used(redis)))
                    log(
                        f"  {done:,} paused: worker RSS "
                        + ", ".join(f"{r / 2**20:.1f} MiB" for r in rss)
                    )
                res.seconds = time.perf_counter() - t0
                if not workers.alive():
                    raise RuntimeError(f"a worker died; see {logdir}")
                await _breakdown(redis, res)
        finally:
            await redis.aclose()
            fake.stop()
    return res


async def _breakdown(redis: Redis, res: MemoryResult) -> None:
    user_runs = each_shard(KEYS, "user_runs", "U-bench")
    run_id = next(iter([r for k in user_runs for r in await redis.zrange(k, 0, 0)]))
    gate_ids = list(await redis.smembers(KEYS.run_gates(run_id)))
    own = [
        ("run hash", KEYS.run(run_id)),
        ("history list (task + assistant call)", KEYS.history(run_id)),
        ("turn hash", KEYS.turn(run_id, 1)),
        ("gate hash", KEYS.gate(gate_ids[0])),
        ("run's gate set", KEYS.run_gates(run_id)),
    ]
    for label, key in own:
        res.per_run_keys.append((label, int(await redis.memory_usage(key, samples=0) or 0)))
    shared = [  # one key per shard (summed), or one key on a layout without shards
        ("events stream (run.started, gate.opened)", each_shard(KEYS, "events")),
        ("jobs stream (start jobs, acknowledged)", each_shard(KEYS, "jobs")),
        ("deadlines sorted set", each_shard(KEYS, "deadlines")),
        ("user's runs sorted set", user_runs),
    ]
    for label, keys in shared:
        size = sum([int(await redis.memory_usage(k, samples=0) or 0) for k in keys])
        res.shared_keys.append((label, size // res.runs))


def memory_tables(res: MemoryResult) -> list[tuple[str, list[str], list[list[str]]]]:
    rss_rows = []
    first = res.points[0]
    for runs, rss, used in res.points:
        rss_rows.append(
            [
                f"{runs:,}",
                *(f"{r / 2**20:.1f} MiB" for r in rss),
                " / ".join(f"{(r - r0) / 2**20:+.1f}" for r, r0 in zip(rss, first[1], strict=True)),
                f"{used / 2**20:.1f} MiB",
                kb((used - res.base_used) / runs),
            ]
        )
    own_total = sum(v for _, v in res.per_run_keys)
    shared_total = sum(v for _, v in res.shared_keys)
    key_rows = [[label, kb(v)] for label, v in res.per_run_keys]
    key_rows.append(["**the run's own keys**", f"**{kb(own_total)}**"])
    key_rows += [[f"{label} ÷ runs", kb(v)] for label, v in res.shared_keys]
    key_rows.append(["**total from MEMORY USAGE**", f"**{kb(own_total + shared_total)}**"])
    last = res.points[-1]
    key_rows.append(
        [
            "used_memory growth ÷ runs (INFO)",
            kb((last[2] - res.base_used) / last[0]),
        ]
    )
    return [
        (
            f"Memory with paused runs ({res.workers} worker processes; "
            f"{res.runs:,} runs paused in {res.seconds:.0f} s)",
            [
                "paused runs",
                *(f"worker {i + 1} RSS" for i in range(res.workers)),
                "RSS change since 200 (MiB)",
                "Redis used_memory",
                "Redis per paused run",
            ],
            rss_rows,
        ),
        ("Redis memory of one paused run (MEMORY USAGE)", ["key", "bytes"], key_rows),
    ]
