"""What DECISION_REPLICAS=1 costs a decision: ``python -m tests.bench.decision_wait``.

Starts a 3 + 3 Redis Cluster on loopback (tests/redis_cluster.py), opens gates with the real
scripts (tests/fuzz/pool.py) and times ``Gateway.decide`` with and without ``WAIT 1``,
alternating twice. Prints medians, p99, min and max per 300 decisions.
"""

from __future__ import annotations

import asyncio
import statistics
import time

from agent_core import Gateway, Keys
from agent_core.connections import connect_redis
from tests.fuzz.pool import GatePool
from tests.redis_cluster import ClusterServer


async def measure(url: str, replicas: int, n: int = 300) -> list[float]:
    redis = await connect_redis(url)
    try:
        gw = Gateway(redis, Keys(f"w{replicas}"), agent_name="ops", decision_replicas=replicas)
        pool = await GatePool(redis, gw, runs=n // 2, per_run=2, threaded=False).fill()
        latencies = []
        for g in pool.gates:
            started = time.perf_counter()
            res = await gw.decide(g.gate_id, "approve", by="U2", run_id=g.run_id)
            latencies.append((time.perf_counter() - started) * 1000)
            assert res.applied
        return sorted(latencies)
    finally:
        await redis.aclose()


async def main() -> None:
    with ClusterServer() as cluster:
        for replicas in (0, 1, 0, 1):
            lat = await measure(cluster.url, replicas)
            p99 = lat[int(len(lat) * 0.99) - 1]
            print(
                f"DECISION_REPLICAS={replicas}: median {statistics.median(lat):.2f} ms, "
                f"p99 {p99:.2f} ms, min {lat[0]:.2f} ms, max {lat[-1]:.2f} ms"
            )


if __name__ == "__main__":
    asyncio.run(main())
