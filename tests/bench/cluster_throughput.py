"""Item 3 on Redis Cluster: the throughput measurement of ``tests.bench.throughput`` on a local
cluster of 3 masters + 3 replicas (``tests.redis_cluster.ClusterServer``), side by side with
one redis-server.

The work is the same closed loop (:class:`tests.bench.throughput.Driver`, the same bench agent,
the same bounds); only where Redis is changes. The workers get the URL of one master in
REDIS_URL and nothing else, as a user would configure them: ``agent_core`` detects the cluster
(``connect_redis``) and uses redis-py's cluster client, with one blocked job reader per shard.
The driver makes its clients the same way, so it runs the bot's code on the cluster client,
and reads the events streams with one reader per shard (a read cannot span slots).

The nodes run without persistence, like the one-node server of the same part (ClusterServer
starts them with ``appendfsync always``: turned off with ``CONFIG SET appendonly no``).
``DECISION_REPLICAS`` stays 0 (no ``WAIT`` per decision), as on one node. Every process is
started here and ended by its PID; the cluster by its own teardown.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.bench.common import median, p99
from tests.bench.procs import FakeModelProcess
from tests.bench.throughput import (
    KEYS,
    RUN_HEADER,
    OneNode,
    ThroughputResult,
    ThroughputResults,
    cpu_components,
    cpu_row,
    measure,
    run_row,
)
from tests.redis_cluster import ClusterServer
from tests.redis_server import RedisServer

SPREAD_TARGET = 1.2  # issue 9: keys on the busiest master ≤ 1.2x the least busy
CPU_TARGET = 1.3  # issue 21: all processes' CPU per run on the cluster ≤ 1.3x one node's
OURS = ("worker", "driver", "redis-server")  # the fake model is the control: not ours

Table = tuple[str, list[str], list[list[str]]]


class ClusterTarget:
    """A running :class:`ClusterServer` as a :class:`tests.bench.throughput.Target`."""

    def __init__(self, cluster: ClusterServer) -> None:
        self.cluster = cluster
        self.masters = cluster.masters()  # in slot order; no failover happens here
        self.replicas = cluster.replicas()
        self._url = cluster.url
        self.readers_per_worker = KEYS.shards  # one blocked XREADGROUP per shard

    @property
    def url(self) -> str:
        return self._url

    def _cmd(self, port: int, *args: object) -> object:
        return self.cluster.command(port, *args, timeout=10.0)

    async def prepare(self) -> None:
        """No persistence, like the one-node server (ClusterServer fsyncs every write)."""
        for port in self.cluster.ports:
            await asyncio.to_thread(self._cmd, port, "CONFIG", "SET", "appendonly", "no")

    def redis_pids(self) -> dict[str, int]:
        pids = {f"redis-server master {p}": self.cluster.pid(p) for p in self.masters}
        pids |= {f"redis-server replica {p}": self.cluster.pid(p) for p in self.replicas}
        return {k: v or 0 for k, v in pids.items()}

    async def flush(self) -> None:
        """FLUSHALL on every master, then until every replica is empty too (at most 10 s)."""
        await asyncio.to_thread(self.cluster.flushall)
        for _ in range(100):
            sizes = [await asyncio.to_thread(self._cmd, p, "DBSIZE") for p in self.replicas]
            if not any(sizes):
                return
            await asyncio.sleep(0.1)
        raise TimeoutError("the replicas still hold keys 10 s after FLUSHALL")

    async def blocked_readers(self) -> int:
        total = 0
        for port in self.cluster.ports:
            text = str(await asyncio.to_thread(self._cmd, port, "CLIENT", "LIST"))
            total += sum(1 for line in text.splitlines() if " cmd=xreadgroup " in f"{line} ")
        return total

    async def used_memory(self) -> int:
        total = 0
        for port in self.masters:
            info = await asyncio.to_thread(self._cmd, port, "INFO", "memory")
            assert isinstance(info, dict)
            total += int(info["used_memory"])
        return total

    async def key_spread(self) -> dict[int, int]:
        return {p: int(str(await asyncio.to_thread(self._cmd, p, "DBSIZE"))) for p in self.masters}

    def shards_per_master(self) -> dict[int, int]:
        """How many of the shards' hash tags fall in each master's slots."""
        count = dict.fromkeys(self.masters, 0)
        for shard in KEYS.all_shards():
            count[self.cluster.master_of_key(KEYS.events(shard))] += 1
        return count


@dataclass
class ClusterThroughput:
    concurrency: int
    masters: int = 0
    replicas: int = 0
    shards_per_master: dict[int, int] = field(default_factory=dict)
    results: list[ThroughputResult] = field(default_factory=list)
    # The same offered load on both: (one node, cluster) per worker count, at `rate` runs/s.
    rate: float = 0.0
    paced: list[tuple[ThroughputResult, ThroughputResult]] = field(default_factory=list)


async def run_cluster_throughput_bench(
    workers: list[int],
    *,
    total: int,
    seconds: float,
    concurrency: int,
    log: Callable[[str], None],
    paced_workers: tuple[int, ...] = (1, 2),
) -> ClusterThroughput:
    """Each worker count on a fresh (flushed) 3 + 3 cluster, bounded like the one-node runs.

    Then, for ``paced_workers``, one node and the cluster alternately at the same offered
    rate (three quarters of the cluster's slowest closed-loop rate above): the closed loop
    compares two saturated machines doing different amounts of work per second, whose CPU
    per run also differs by how much each batches; at one rate both do the same work."""
    out = ClusterThroughput(concurrency)
    logdir = Path(tempfile.mkdtemp(prefix="bench-cluster-workers-"))
    fake = FakeModelProcess()
    try:
        cluster = ClusterServer()
        await asyncio.to_thread(cluster.start)  # stops what it started if it fails
        try:
            target = ClusterTarget(cluster)
            await target.prepare()
            out.masters, out.replicas = len(target.masters), len(target.replicas)
            out.shards_per_master = await asyncio.to_thread(target.shards_per_master)
            log(
                f"  cluster: {out.masters} masters + {out.replicas} replicas, "
                f"{KEYS.shards} shards per master: {list(out.shards_per_master.values())}"
            )
            for n in workers:
                r = await measure(
                    target,
                    fake,
                    n,
                    total=total,
                    seconds=seconds,
                    concurrency=concurrency,
                    logdir=logdir,
                )
                out.results.append(r)
                log(
                    f"  cluster, {n} worker(s): {r.stats.completed} runs in "
                    f"{r.stats.seconds:.1f} s = {r.runs_per_s:.0f} runs/s; keys per master "
                    f"{list(r.key_spread.values())}"
                )
            if paced_workers and out.results:
                out.rate = max(10.0, round(min(r.runs_per_s for r in out.results) * 0.75 / 10) * 10)
                await _paced(out, target, fake, paced_workers, seconds, concurrency, logdir, log)
        finally:
            await asyncio.to_thread(cluster.close)
    finally:
        fake.stop()
    shutil.rmtree(logdir, ignore_errors=True)
    return out


async def _paced(
    out: ClusterThroughput,
    cluster: ClusterTarget,
    fake: FakeModelProcess,
    workers: tuple[int, ...],
    seconds: float,
    concurrency: int,
    logdir: Path,
    log: Callable[[str], None],
) -> None:
    """One node, then the cluster, at ``out.rate`` runs/s, for each worker count."""
    total = int(out.rate * seconds)
    with RedisServer() as server:
        one = OneNode(server)

        async def at_rate(target: OneNode | ClusterTarget, n: int) -> ThroughputResult:
            return await measure(
                target,
                fake,
                n,
                total=total,
                seconds=seconds + 5,
                concurrency=concurrency,
                logdir=logdir,
                rate=out.rate,
            )

        for n in workers:
            o = await at_rate(one, n)
            c = await at_rate(cluster, n)
            out.paced.append((o, c))
            log(
                f"  at {out.rate:.0f} runs/s, {n} worker(s): CPU per run "
                f"{_cpu_ms(o):.2f} ms on one node, {_cpu_ms(c):.2f} ms on the cluster"
            )


def _cpu_ms(r: ThroughputResult, parts: tuple[str, ...] | None = None) -> float:
    """CPU per completed run (ms) of every process, or of those whose label starts with
    one of ``parts``."""
    cpu = sum(v for k, v in r.cpu.items() if parts is None or k.startswith(parts))
    return cpu / max(r.stats.completed, 1) * 1000


FAKE = ("fake model",)


def _ratio(o: ThroughputResult, c: ThroughputResult, parts: tuple[str, ...] | None = None) -> float:
    """The cluster's CPU per run ÷ one node's (of ``parts``, as :func:`_cpu_ms`); NaN for none."""
    base = _cpu_ms(o, parts)
    return _cpu_ms(c, parts) / base if base else float("nan")


def _controls(pairs: list[tuple[ThroughputResult, ThroughputResult]]) -> list[float]:
    """The fake model's ratios (its work per run is the same on both: a control)."""
    return [r for r in (_ratio(o, c, FAKE) for o, c in pairs) if r == r]


# --------------------------------------------------------------------------- report
METHOD_CLUSTER = """\
**The same work on Redis Cluster.** After the one-node rows, the same configurations (1, 2
and 4 workers, {concurrency} runs in flight, {total:,} runs or {seconds:.0f} s each after a
warm-up, on emptied data with fresh workers) run on a local Redis Cluster of
{masters} masters + {replicas} replicas (`tests/redis_cluster.py`: `redis-server
--cluster-enabled yes` processes joined by `redis-cli --cluster create`, the default even
split of the 16384 slots). The workers get one master's URL in `REDIS_URL` and nothing else:
they detect the cluster and use redis-py's cluster client, with one blocked job reader per
shard ({shards} shards). The driver makes its clients the same way (`connect_redis`) and reads
the events streams with one reader per shard. Like the one-node server, the nodes keep no
AOF or RDB (turned off with `CONFIG SET appendonly no`), and decisions do not `WAIT` for a
replica (`DECISION_REPLICAS=0`; the cost of `WAIT` is measured in the decision part). The
replicas do replicate everything: their CPU is in "redis-server" (all {nodes} processes
summed) and shown again on its own. Memory per run is the masters' `used_memory`, summed.
Keys per master is `DBSIZE` on each master at the end of the window (the warm-up's runs
included; finished runs are kept).

**What a 2-core machine means here.** The {nodes} redis-server processes, the workers, the
fake model and the driver all share this machine's {cores} cores, and every command now
crosses more processes and sockets (and the replicas' work is on the same cores). So the
cluster is expected to be slower *here*, and these rows measure the overhead of the cluster
path, not its capacity. What a cluster is for on a real deployment is Redis capacity beyond
one node's CPU and memory, with masters on separate hosts: that is not measured here (one
node's redis-server was not the bottleneck in the rows above).
"""


def cluster_tables(one: ThroughputResults, cl: ClusterThroughput) -> list[Table]:
    """Throughput, CPU and key spread on the cluster, and the cluster ÷ one node comparison."""
    if not cl.results:
        return []
    base = cl.results[0].runs_per_s
    components = cpu_components(cl.results)
    nodes = cl.masters + cl.replicas
    cpu_header = ["workers", "all workers"]
    for c in components:
        if c.startswith("worker"):
            continue
        if c == "redis-server":
            cpu_header += [f"redis-server (all {nodes})", f"of which the {cl.replicas} replicas"]
        else:
            cpu_header.append(c)
    cpu_header += ["cores busy: benchmark", "cores busy: other processes"]
    spread_rows = []
    for r in cl.results:
        keys = list(r.key_spread.values())
        ratio = max(keys) / min(keys) if keys and min(keys) > 0 else float("inf")
        spread_rows.append(
            [
                str(r.workers),
                " / ".join(f"{k:,}" for k in keys),
                f"{ratio:.2f}x",
                "yes" if ratio <= SPREAD_TARGET else "no",
            ]
        )
    shards = " / ".join(str(v) for v in cl.shards_per_master.values())
    where = f"Redis Cluster, {cl.masters} masters + {cl.replicas} replicas"
    return [
        (
            f"Throughput on {where}: the same runs, {cl.concurrency} runs in flight",
            [*RUN_HEADER[:-1], "Redis memory per finished run (masters)"],
            [run_row(r, base) for r in cl.results],
        ),
        (
            f"CPU per completed run (ms) on {where}, all processes on the same 2 cores",
            cpu_header,
            [cpu_row(r, components, replicas=True) for r in cl.results],
        ),
        (
            f"Keys per master at the end (DBSIZE, masters in slot order; the {KEYS.shards} "
            f"shards' hash tags fall {shards} on them)",
            [
                "workers",
                "keys per master",
                "busiest ÷ least busy",
                f"≤ {SPREAD_TARGET}x (issue 9)",
            ],
            spread_rows,
        ),
        (
            "Cluster ÷ one node, same work, same machine",
            [
                "workers",
                "runs/s one node / cluster",
                "cluster ÷ one node",
                "run latency p50 ms one node / cluster",
                "p99 ms one node / cluster",
                "CPU per run ms, all processes: one node / cluster",
                "of which redis-server",
            ],
            _compare_rows(one, cl),
        ),
        *_paced_tables(cl),
    ]


def _paced_tables(cl: ClusterThroughput) -> list[Table]:
    if not cl.paced:
        return []
    rows = []
    for o, c in cl.paced:
        rows.append(
            [
                str(o.workers),
                f"{o.runs_per_s:.0f} / {c.runs_per_s:.0f}",
                f"{_cpu_ms(o):.2f} / {_cpu_ms(c):.2f}",
                f"**{_ratio(o, c):.2f}x**",
                f"{_ratio(o, c, OURS):.2f}x",
                f"{_cpu_ms(o, ('redis-server',)):.2f} / {_cpu_ms(c, ('redis-server',)):.2f}",
                f"{_ratio(o, c, FAKE):.2f}x",
            ]
        )
    return [
        (
            f"Cluster ÷ one node at the same offered load: {cl.rate:.0f} runs/s started on "
            "both (open loop), one after the other",
            [
                "workers",
                "runs/s one node / cluster",
                "CPU per run ms, all processes: one node / cluster",
                f"cluster ÷ one node (target ≤ {CPU_TARGET}x)",
                "the same, without the fake model",
                "of which redis-server ms",
                "fake model: cluster ÷ one node (the same work: a control)",
            ],
            rows,
        )
    ]


def _compare_rows(one: ThroughputResults, cl: ClusterThroughput) -> list[list[str]]:
    rows = []
    for c in cl.results:
        o = next((r for r in one.results if r.workers == c.workers and not r.whatif), None)
        if o is None:
            continue
        on, cn = max(o.stats.completed, 1), max(c.stats.completed, 1)
        rows.append(
            [
                str(c.workers),
                f"{o.runs_per_s:.0f} / {c.runs_per_s:.0f}",
                f"{c.runs_per_s / o.runs_per_s:.2f}x" if o.runs_per_s else "n/a",
                f"{median(o.stats.latencies) * 1000:.0f} / {median(c.stats.latencies) * 1000:.0f}",
                f"{p99(o.stats.latencies) * 1000:.0f} / {p99(c.stats.latencies) * 1000:.0f}",
                f"{sum(o.cpu.values()) / on * 1000:.2f} / {sum(c.cpu.values()) / cn * 1000:.2f}",
                f"{o.cpu.get('redis-server', 0.0) / on * 1000:.2f} / "
                f"{c.cpu.get('redis-server', 0.0) / cn * 1000:.2f}",
            ]
        )
    return rows


def cluster_lines(one: ThroughputResults, cl: ClusterThroughput) -> list[str]:
    """What the cluster rows say, in words (only what was measured)."""
    if not cl.results:
        return []
    lines = []
    pairs = [
        (o, c)
        for c in cl.results
        for o in one.results
        if o.workers == c.workers and not o.whatif and o.runs_per_s
    ]
    if pairs:
        ratios = [c.runs_per_s / o.runs_per_s for o, c in pairs]
        lines.append(
            f"- On this machine the cluster ran {min(ratios):.2f}x to {max(ratios):.2f}x one "
            f"node's runs/s with the same workers (best: {max(c.runs_per_s for c in cl.results):.0f} "
            f"runs/s on the cluster, {max(o.runs_per_s for o, _ in pairs):.0f} on one node). "
            "All processes share the same cores, so this is the cost of the cluster path "
            "here, not what a cluster on separate hosts would do."
        )
    if pairs:
        closed = [_ratio(o, c) for o, c in pairs]
        control = _controls(pairs)
        line = (
            f"- CPU per run, all processes, each at its own full speed (closed loop): the "
            f"cluster {min(closed):.2f}x to {max(closed):.2f}x one node's (target ≤ "
            f"{CPU_TARGET}x: {'met' if max(closed) <= CPU_TARGET else '**not met**'})."
        )
        if control:
            line += (
                f" The fake model, whose work per run is the same on both, took "
                f"{min(control):.2f}x to {max(control):.2f}x"
                + (
                    ": at full speed the cluster runs fewer runs a second, so every process "
                    "batches less per wake-up, and its 6 redis-servers crowd the 2 cores."
                    if max(control) > 1.05
                    else "."
                )
            )
        lines.append(line)
    if cl.paced:
        ratios = [_ratio(o, c) for o, c in cl.paced]
        control = _controls(cl.paced)
        lines.append(
            f"- At the same offered load ({cl.rate:.0f} runs/s on both), the cluster's CPU per "
            f"run, all processes, was {min(ratios):.2f}x to {max(ratios):.2f}x one node's "
            f"(target ≤ {CPU_TARGET}x: {'met' if max(ratios) <= CPU_TARGET else '**not met**'}); "
            + (f"the fake model's {min(control):.2f}x to {max(control):.2f}x." if control else "")
        )
    worst = [
        max(r.key_spread.values()) / min(r.key_spread.values())
        for r in cl.results
        if r.key_spread and min(r.key_spread.values()) > 0
    ]
    if worst:
        met = max(worst) <= SPREAD_TARGET
        shards = list(cl.shards_per_master.values())
        lines.append(
            f"- Key spread: busiest ÷ least busy master {min(worst):.2f}x to {max(worst):.2f}x "
            f"(target ≤ {SPREAD_TARGET}x: {'met' if met else '**not met**'}). A new run "
            "goes to a master at random, then to one of its shards, so every master gets the "
            f"same share whatever its shards; the {KEYS.shards} shards' hash tags fall "
            f"{' / '.join(map(str, shards))} on the {cl.masters} masters' slot ranges"
            + (
                f" ({max(shards) / min(shards):.2f}x), which bounds runs started with an "
                "idempotency key (Slack commands and mentions: their shard is the key's)."
                if shards and min(shards) > 0
                else "."
            )
        )
    return lines
