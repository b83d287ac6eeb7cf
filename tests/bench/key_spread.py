"""``python -m tests.bench.key_spread [RUNS]``: how evenly runs and keys spread over the masters
of a local 3 + 3 Redis Cluster (``tests.redis_cluster.ClusterServer``), for the shards' old
and balanced hash tags and each way a run's shard is chosen.

Each case starts RUNS runs (12,000 by default; started only, no worker) on the emptied
cluster and prints shards, runs and keys (``DBSIZE``) per master, masters in slot order, with
busiest ÷ least busy. "Before" is the previous behaviour: the old tags and a shard at random.
About a minute; every process it starts is ended by the cluster's own teardown.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
from collections import Counter

from redis.asyncio import Redis

from agent_core import Gateway, Keys, Run
from agent_core.connections import connect_redis
from tests.redis_cluster import ClusterServer


def ratio(values: list[int]) -> str:
    return f"{max(values) / min(values):.2f}x" if min(values) > 0 else "inf"


async def spread(
    cluster: ClusterServer,
    client: Redis,
    keys: Keys,
    runs: int,
    *,
    random_shard: bool = False,
    idempotent: bool = False,
) -> str:
    await asyncio.to_thread(cluster.flushall)
    gateway = Gateway(client, keys, agent_name="bench")
    if random_shard:
        gateway.placement.pick = lambda: secrets.randbelow(keys.shards)  # type: ignore[method-assign]
    room = asyncio.Semaphore(64)

    async def start(i: int) -> Run:
        key = f"trigger-{i}-{secrets.token_hex(4)}" if idempotent else None
        async with room:
            return await gateway.start_run(f"task {i}", requested_by="U1", idempotency_key=key)

    started = await asyncio.gather(*(start(i) for i in range(runs)))
    owner = {s: cluster.node_for_slot(keys.slot(s)) for s in keys.all_shards()}
    masters = cluster.masters()
    shards = Counter(owner.values())
    per_master = Counter(owner[keys.shard_of(r.run_id)] for r in started)
    sizes = [int(str(cluster.command(p, "DBSIZE"))) for p in masters]
    run_counts = [per_master[p] for p in masters]
    return (
        f"shards {' / '.join(str(shards[p]) for p in masters)}; "
        f"runs {' / '.join(map(str, run_counts))} ({ratio(run_counts)}); "
        f"keys {' / '.join(map(str, sizes))} ({ratio(sizes)})"
    )


async def main(cluster: ClusterServer, runs: int) -> None:
    client = await connect_redis(cluster.url)
    cases: list[tuple[str, Keys, dict[str, bool]]] = [
        ("before: old tags, a shard at random", Keys("agw", legacy=True), {"random_shard": True}),
        ("old tags, a master at random then its shard", Keys("agw", legacy=True), {}),
        ("balanced tags, a master at random then its shard", Keys("agw"), {}),
        ("balanced tags, idempotency keys (Slack)", Keys("agw"), {"idempotent": True}),
        ("balanced tags, idempotency keys, SHARDS=48", Keys("agw", 48), {"idempotent": True}),
    ]
    try:
        for name, keys, how in cases:
            print(f"{name}: {await spread(cluster, client, keys, runs, **how)}", flush=True)
    finally:
        await client.aclose()


if __name__ == "__main__":
    with ClusterServer() as c:
        asyncio.run(main(c, int(sys.argv[1]) if len(sys.argv) > 1 else 12_000))
