"""The gateway on a real Redis Cluster (3 masters + 3 replicas on loopback).

Runs spread over the masters by shard; the gate's promises hold on the cluster as on one node
(a gate decided once, an approved call run once, expiry by the sweeper, the per-user index
across shards); a master killed while runs on its shards are paused loses no acknowledged
decision (each waited for a replica); a slot moved while clicks arrive loses nothing; and the
Slack flow works with every process on the cluster client.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
import redis.exceptions as redis_errors
from openai import AsyncOpenAI
from redis.asyncio import Redis

from agent_core import Gateway, Keys, Run, RunStatus, Settings, audit
from agent_core.connections import connect_redis
from agent_core.streams import is_cluster
from agent_core.testing import FakeOpenAI, call, reply
from agent_core.worker import Worker
from tests import redis_cluster
from tests.agents import ops, read_journal
from tests.redis_cluster import ClusterServer, SlotMigration, key_slot

pytestmark = pytest.mark.timeout(180)

cluster_server = redis_cluster.cluster_server
clean_cluster = redis_cluster.clean_cluster

T = TypeVar("T")
# What a client may see while a master is failing over or a slot is moving.
TRANSIENT = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ClusterDownError,
    redis_errors.ClusterError,
    redis_errors.TryAgainError,
)


def settings(url: str, fake: FakeOpenAI, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "REDIS_URL": url,
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_API_KEY": "sk-test-not-a-secret",
        "OPENAI_MODEL": "fake-model",
        "OPENAI_MAX_RETRIES": 2,
        "KEY_PREFIX": "c",
        "APPROVAL_TIMEOUT": 60,
        "WORKER_LEASE": 1.0,
        "SWEEP_INTERVAL": 0.05,
    }
    values.update(overrides)
    return Settings.from_env(**values)


async def retrying(op: Callable[[], Awaitable[T]], seen: Counter[str], deadline: float = 20) -> T:
    """``op``, retried through a failover or a slot move, as a person clicks again."""
    end = time.monotonic() + deadline
    while True:
        try:
            return await op()
        except TRANSIENT as exc:
            seen[type(exc).__name__] += 1
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.1)


@pytest.fixture
async def client(clean_cluster: ClusterServer) -> AsyncIterator[Redis]:
    redis = await connect_redis(clean_cluster.url)  # detects the cluster by itself
    assert is_cluster(redis)
    try:
        yield redis
    finally:
        await redis.aclose()


class InProcess:
    """A Gateway and a Worker on the cluster client, in the test's event loop."""

    def __init__(self, redis: Redis, s: Settings) -> None:
        self.keys = Keys(s.key_prefix, s.shards)
        self.gateway = Gateway(
            redis, self.keys, agent_name=ops.name, decision_replicas=s.decision_replicas
        )
        self.openai = AsyncOpenAI(api_key="sk-test", base_url=s.openai_base_url, max_retries=0)
        self.worker = Worker(redis, ops, self.openai, s)
        self.task = asyncio.create_task(self.worker.run())

    async def close(self) -> None:
        self.worker.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, 15)
        await self.openai.close()


@pytest.fixture
async def node(
    client: Redis, clean_cluster: ClusterServer, fake_openai: FakeOpenAI, journal: Path
) -> AsyncIterator[InProcess]:
    p = InProcess(client, settings(clean_cluster.url, fake_openai, DECISION_REPLICAS=1))
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "journal.txt"
    monkeypatch.setenv("TEST_JOURNAL", str(path))
    return path


def script_deletes(fake: FakeOpenAI, tasks: dict[str, str]) -> None:
    for task, user in tasks.items():
        fake.script(task, [call("delete_user", {"user_id": user}), reply(f"done {user}")])


async def test_runs_spread_over_the_masters(
    client: Redis, clean_cluster: ClusterServer, fake_openai: FakeOpenAI
) -> None:
    keys = Keys("c")
    # The shards' tags hash to the first slot of their slices: 16 over 3 masters is 6 / 5 / 5.
    shards = Counter(clean_cluster.master_of_key(keys.jobs(s)) for s in keys.all_shards())
    assert sorted(shards.values()) == [5, 5, 6], shards
    gw = Gateway(client, keys, agent_name=ops.name)
    # A master at random, then one of its shards: the same share of runs on each master
    # although one has a shard more (4,800 runs: 1.2x is more than 4 standard deviations).
    room = asyncio.Semaphore(64)

    async def start(i: int) -> Run:
        async with room:
            return await gw.start_run(f"task {i}", requested_by="U1" if i >= 48 else "U2")

    runs = await asyncio.gather(*(start(i) for i in range(4800)))
    owner = {s: clean_cluster.node_for_slot(keys.slot(s)) for s in keys.all_shards()}
    masters = Counter(owner[keys.shard_of(r.run_id)] for r in runs)
    assert len(masters) == 3 and max(masters.values()) <= 1.2 * min(masters.values()), masters
    sizes = [int(clean_cluster.command(p, "DBSIZE")) for p in clean_cluster.masters()]
    assert max(sizes) <= 1.2 * min(sizes), sizes
    # Every key of a run is in its shard's slot, with that shard's jobs stream.
    for r in runs[:5]:
        slot = key_slot(keys.run(r.run_id))
        shard = keys.shard_of(r.run_id)
        assert {key_slot(k) for k in (keys.history(r.run_id), keys.jobs(shard))} == {slot}
    # The per-user index reads every shard.
    mine = await gw.runs_for_user("U2", limit=100)
    assert sorted(r.run_id for r in mine) == sorted(r.run_id for r in runs[:48])
    # Idempotent starts land in the key's shard, on whichever master has it.
    again = await gw.start_run("task x", requested_by="U1", idempotency_key="trigger-7")
    assert (await gw.start_run("task x", requested_by="U1", idempotency_key="trigger-7")) == again
    assert keys.shard_of(again.run_id) == keys.shard_for("trigger-7")


async def test_new_runs_follow_the_shards_moved_between_masters(
    client: Redis, clean_cluster: ClusterServer
) -> None:
    keys = Keys("c")
    gw = Gateway(client, keys, agent_name=ops.name)
    gw.placement.refresh = 0  # read the client's slot table at every start
    # Every shard of one master moves to another: that master has none left.
    emptied, target = clean_cluster.masters()[:2]
    slots = [
        keys.slot(s)
        for s in keys.all_shards()
        if clean_cluster.node_for_slot(keys.slot(s)) == emptied
    ]
    await asyncio.to_thread(clean_cluster.migrate_slots, slots, target)
    try:
        for shard in keys.all_shards():  # traffic teaches the client the new owners (MOVED)
            await client.exists(keys.jobs(shard))
        groups = gw.placement.shards_by_master()
        assert len(groups) == 2 and sorted(s for g in groups for s in g) == list(range(16))
        room = asyncio.Semaphore(32)

        async def start(i: int) -> Run:
            async with room:
                return await gw.start_run(f"task {i}", requested_by="U1")

        runs = await asyncio.gather(*(start(i) for i in range(1000)))
        owner = {s: clean_cluster.node_for_slot(keys.slot(s)) for s in keys.all_shards()}
        masters = Counter(owner[keys.shard_of(r.run_id)] for r in runs)
        assert emptied not in masters and len(masters) == 2, masters
        assert max(masters.values()) <= 1.35 * min(masters.values()), masters
    finally:
        await asyncio.to_thread(clean_cluster.migrate_slots, slots, emptied)


async def test_the_gate_promises_hold_on_the_cluster(
    node: InProcess, clean_cluster: ClusterServer, fake_openai: FakeOpenAI, journal: Path
) -> None:
    tasks = {f"delete {i}": str(i) for i in range(12)}
    script_deletes(fake_openai, tasks)
    gw = node.gateway
    runs = [await gw.start_run(t, requested_by="U1") for t in tasks]
    assert len({clean_cluster.master_of_key(node.keys.run(r.run_id)) for r in runs}) >= 2
    for r in runs:
        assert (await gw.wait(r.run_id, "awaiting_approval", timeout=30)).status is (
            RunStatus.AWAITING_APPROVAL
        )
    gates = [(await gw.pending_gates(r.run_id))[0] for r in runs]
    # Two approvers race on every gate: one decision each.
    results = await asyncio.gather(
        *(gw.decide(g.gate_id, "approve", by="U2") for g in gates),
        *(gw.decide(g.gate_id, "deny", by="U3", reason="no") for g in gates),
    )
    applied = Counter(g.gate_id for g in (r.gate for r in results if r.applied))
    assert set(applied.values()) == {1} and len(applied) == len(gates)
    approved = {r.gate.run_id for r in results if r.applied and r.gate.decided_by == "U2"}
    for r in runs:
        done = await gw.wait(r.run_id, timeout=30)
        assert done.status is RunStatus.COMPLETED, done
    # Each approved call ran exactly once; denied ones never.
    ran = Counter(read_journal(str(journal)))
    expected = {f"delete_user:{tasks[r.task]}" for r in runs if r.run_id in approved}
    assert set(ran) == expected and set(ran.values()) <= {1}
    # The audit trail, one stream per shard over the masters: one decision per gate, one
    # outcome per approved call, every chain whole.
    kinds: Counter[tuple[str, str]] = Counter()
    for shard in node.keys.all_shards():
        async for e in audit.entries(gw.redis, node.keys, shard):
            kinds[(e.get("gate_id"), e.kind)] += 1
    for g in gates:
        ran_here = g.run_id in approved
        decided = "approved" if ran_here else "denied"
        assert kinds[(g.gate_id, decided)] == 1 and kinds[(g.gate_id, "opened")] == 1
        assert kinds[(g.gate_id, "executed")] == (1 if ran_here else 0)
    for shard in node.keys.all_shards():
        assert (await audit.verify_shard(gw.redis, node.keys, shard)).problems == []


async def test_gates_expire_on_every_shard(
    client: Redis, clean_cluster: ClusterServer, fake_openai: FakeOpenAI, journal: Path
) -> None:
    p = InProcess(client, settings(clean_cluster.url, fake_openai, APPROVAL_TIMEOUT=1))
    try:
        tasks = {f"expire {i}": str(i) for i in range(6)}
        script_deletes(fake_openai, tasks)
        runs = [await p.gateway.start_run(t, requested_by="U1") for t in tasks]
        for r in runs:
            await p.gateway.wait(r.run_id, timeout=30)
            [gate] = await p.gateway.gates(r.run_id)
            assert gate.status.value == "expired"
        assert read_journal(str(journal)) == []
    finally:
        await p.close()


async def test_a_master_failover_loses_no_acknowledged_decision(
    node: InProcess, clean_cluster: ClusterServer, fake_openai: FakeOpenAI, journal: Path
) -> None:
    tasks = {f"failover {i}": str(i) for i in range(12)}
    script_deletes(fake_openai, tasks)
    gw, keys = node.gateway, node.keys
    runs = [await gw.start_run(t, requested_by="U1") for t in tasks]
    for r in runs:
        await gw.wait(r.run_id, "awaiting_approval", timeout=30)
    # The master with the most of these paused runs.
    by_master = Counter(clean_cluster.master_of_key(keys.run(r.run_id)) for r in runs)
    victim = by_master.most_common(1)[0][0]
    on_victim = [r for r in runs if clean_cluster.master_of_key(keys.run(r.run_id)) == victim]
    gates = {r.run_id: (await gw.pending_gates(r.run_id))[0] for r in runs}
    # Every decision is acknowledged (returned) only once a replica has it (WAIT 1)...
    started = time.perf_counter()
    for r in on_victim:
        assert (await gw.decide(gates[r.run_id].gate_id, "approve", by="U2")).applied
    per_decision_ms = (time.perf_counter() - started) * 1000 / len(on_victim)
    # ...so killing the master right after loses none of them.
    failover = await asyncio.to_thread(clean_cluster.failover_master, victim)
    seen: Counter[str] = Counter()
    for r in runs:
        if r in on_victim:
            continue
        res = await retrying(
            lambda r=r: gw.decide(gates[r.run_id].gate_id, "approve", by="U2"), seen
        )
        assert res.applied
    for r in on_victim:
        gate = await retrying(lambda r=r: gw.get_gate(gates[r.run_id].gate_id), seen)
        assert gate is not None and gate.status.value == "approved", gate
    for r in runs:
        done = await retrying(lambda r=r: gw.wait(r.run_id, timeout=60), seen, deadline=60)
        assert done.status is RunStatus.COMPLETED, done
    ran = Counter(read_journal(str(journal)))
    assert ran == Counter(f"delete_user:{tasks[r.task]}" for r in runs), ran
    print(
        f"\nfailover: replica promoted in {failover.seconds:.2f} s; {len(on_victim)} paused runs "
        f"on the killed master; decision with WAIT 1: {per_decision_ms:.2f} ms each; "
        f"transient errors seen: {dict(seen)}"
    )


async def test_a_slot_moved_while_clicks_arrive_loses_nothing(
    node: InProcess, clean_cluster: ClusterServer, fake_openai: FakeOpenAI, journal: Path
) -> None:
    gw, keys = node.gateway, node.keys
    shard = 3
    tasks = {f"moving {i}": str(i) for i in range(8)}
    script_deletes(fake_openai, tasks)
    # Runs in one shard (idempotency keys chosen to land there), so its slot carries them all.
    runs = []
    for i, task in enumerate(tasks):
        key = next(f"k{i}-{n}" for n in range(10_000) if keys.shard_for(f"k{i}-{n}") == shard)
        runs.append(await gw.start_run(task, requested_by="U1", idempotency_key=key))
    for r in runs:
        await gw.wait(r.run_id, "awaiting_approval", timeout=30)
    gates = [(await gw.pending_gates(r.run_id))[0] for r in runs]
    slot = key_slot(keys.tag(shard))
    source = clean_cluster.node_for_slot(slot)
    target = next(m for m in clean_cluster.masters() if m != source)
    migration = SlotMigration(clean_cluster, [slot], target)

    def migrate() -> None:
        """The operator's resharding, a few keys at a time, as clicks keep arriving."""
        migration.begin()
        while migration.move_keys(3):
            time.sleep(0.05)
        migration.finish()

    moving = asyncio.create_task(asyncio.to_thread(migrate))
    seen: Counter[str] = Counter()
    for g in gates:  # while the slot's keys are split between two masters
        await asyncio.sleep(0.05)
        res = await retrying(lambda g=g: gw.decide(g.gate_id, "approve", by="U2"), seen)
        assert res.applied
    await moving
    assert clean_cluster.node_for_slot(slot) == target
    for r in runs:
        done = await retrying(lambda r=r: gw.wait(r.run_id, timeout=60), seen, deadline=60)
        assert done.status is RunStatus.COMPLETED, done
    assert Counter(read_journal(str(journal))) == Counter(
        f"delete_user:{tasks[r.task]}" for r in runs
    )
    print(f"\nresharding: transient errors the clickers saw (and retried): {dict(seen)}")
    # Move it back: the module's other tests expect the cluster as it was.
    await asyncio.to_thread(clean_cluster.migrate_slots, [slot], source)


async def test_an_approved_tool_starts_only_once_a_replica_has_its_claim(
    node: InProcess, clean_cluster: ClusterServer, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """With DECISION_REPLICAS=1 the claim written before a tool starts waits for a replica
    too: a master killed right after an unreplicated claim would let the promoted replica's
    next owner run the call again."""
    script_deletes(fake_openai, {"claim waits": "42"})
    gw, keys = node.gateway, node.keys
    run = await gw.start_run("claim waits", requested_by="U1")
    await gw.wait(run.run_id, "awaiting_approval", timeout=30)
    [gate] = await gw.pending_gates(run.run_id)
    master = clean_cluster.master_of_key(keys.run(run.run_id))
    [replica] = clean_cluster.replicas(master)
    clean_cluster.pause(replica)
    try:
        deciding = asyncio.create_task(gw.decide(gate.gate_id, "approve", by="U2"))
        # The resume job is queued by the decision itself (its WAIT, on the paused replica,
        # runs out after 1 s): the worker claims the call at once, and waits.
        await asyncio.sleep(0.5)
        assert read_journal(str(journal)) == [], "the tool started before a replica had it"
    finally:
        clean_cluster.resume(replica)
    assert (await deciding).applied
    done = await gw.wait(run.run_id, timeout=30)
    assert done.status is RunStatus.COMPLETED
    assert read_journal(str(journal)) == ["delete_user:42"]
