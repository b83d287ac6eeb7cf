"""The Redis Cluster test harness, driven through redis-py's real asyncio cluster client.

One 3 + 3 cluster serves the whole module (``cluster_server``); ``clean_cluster`` heals and
empties it before each test. Timings are printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
import redis.exceptions as redis_errors
from redis.asyncio.cluster import RedisCluster

from tests import redis_cluster
from tests.redis_cluster import ClusterServer, SlotMigration, key_slot, keys_in_slots

# The fixtures: one cluster for this module, healed and emptied before each test, a client.
cluster_server = redis_cluster.cluster_server
clean_cluster = redis_cluster.clean_cluster
cluster_client = redis_cluster.cluster_client

T = TypeVar("T")

# A two-key script: both keys must share one slot (a hash tag), as every multi-key command.
TWO_KEYS = (
    "redis.call('SET', KEYS[1], ARGV[1]) redis.call('SET', KEYS[2], ARGV[1]) "
    "return {redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])}"
)

# What the async cluster client lets escape while a master is dead and not yet replaced.
FAILOVER_ERRORS = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ClusterDownError,
)


async def set_and_wait(client: RedisCluster, key: str, value: str, replicas: int = 1) -> int:
    """SET then ``WAIT replicas 1000`` on the same connection; the replicas that acknowledged.

    ``client.wait()`` cannot do this: the cluster client sends WAIT to every primary on
    pooled connections, not on the connection that wrote. A non-transactional cluster
    pipeline sends all of one node's commands on one connection, in order.
    """
    node = client.get_node_from_key(key)
    pipe = client.pipeline(transaction=False)
    pipe.set(key, value)
    pipe.execute_command("WAIT", replicas, 1000, target_nodes=node)
    written, acknowledged = await pipe.execute()
    assert written is True
    return int(acknowledged)


async def retry_through_failover(
    op: Callable[[], Awaitable[T]], seen: Counter[str], deadline: float = 15.0
) -> T:
    """Run ``op``, retrying FAILOVER_ERRORS every 0.1 s for up to ``deadline`` seconds."""
    end = time.monotonic() + deadline
    while True:
        try:
            return await op()
        except FAILOVER_ERRORS as exc:
            seen[type(exc).__name__] += 1
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.1)


def tags_on_distinct_masters(cluster: ClusterServer, count: int) -> list[str]:
    """``count`` hash tags ``{s<n>}`` whose slots are served by ``count`` different masters."""
    by_master: dict[int, str] = {}
    n = 0
    while len(by_master) < count:
        by_master.setdefault(cluster.master_of_key(f"{{s{n}}}"), f"{{s{n}}}")
        n += 1
    return list(by_master.values())


def port_is_closed(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return False
    except OSError:
        return True


# --------------------------------------------------------------------------- topology
def test_cluster_has_three_masters_with_one_synced_replica_each(
    clean_cluster: ClusterServer,
) -> None:
    cluster = clean_cluster
    masters, replicas = cluster.masters(), cluster.replicas()
    assert len(masters) == 3 and len(replicas) == 3
    assert set(masters) | set(replicas) == set(cluster.ports)
    assert 6379 not in cluster.ports
    for master in masters:
        assert len(cluster.replicas(master)) == 1
    assert sum(len(cluster.slots_of(m)) for m in masters) == 16384
    assert cluster.url == f"redis://127.0.0.1:{masters[0]}/0"
    assert cluster.startup_nodes == [("127.0.0.1", p) for p in cluster.ports]
    assert len(cluster.pids()) == 6
    assert cluster.health_problems() == []
    for port in cluster.ports:
        info = cluster.cluster_info(port)
        assert info["cluster_state"] == "ok"
        assert info["cluster_known_nodes"] == "6"
    for replica in replicas:
        assert cluster.command(replica, "INFO", "replication")["master_link_status"] == "up"
    # Our slot function, the server's and the owner lookups agree.
    for key in ("{s3}:a", "plain", "{}x", "a{b}c"):
        assert key_slot(key) == cluster.command(masters[0], "CLUSTER", "KEYSLOT", key)
        assert cluster.master_of_key(key) == cluster.node_for_slot(key_slot(key))
    # Bounded waits fail with every node's log tail.
    with pytest.raises(AssertionError, match="--- node"):
        cluster._wait(lambda: ["never"], 0.1, "nothing")


async def test_hash_tags_spread_over_masters_and_scripts_need_one_slot(
    clean_cluster: ClusterServer, cluster_client: RedisCluster
) -> None:
    cluster, client = clean_cluster, cluster_client
    tags = tags_on_distinct_masters(cluster, 3)
    for tag in tags:
        await client.set(f"{tag}:k", tag)
    for tag in tags:  # each key sits on its own master (a plain GET there answers, no MOVED)
        assert cluster.command(cluster.master_of_key(tag), "GET", f"{tag}:k") == tag
    assert len({cluster.master_of_key(tag) for tag in tags}) == 3

    assert await client.eval(TWO_KEYS, 2, "{s3}:a", "{s3}:b", "v") == ["v", "v"]
    assert await client.mget("{s3}:a", "{s3}:b") == ["v", "v"]
    # Cross-slot: redis-py refuses before sending ...
    with pytest.raises(redis_errors.RedisClusterException, match="same key slot"):
        await client.eval(TWO_KEYS, 2, "{s3}:a", "{s4}:b", "v")
    # ... and the server answers CROSSSLOT when the script is sent to a node anyway.
    with pytest.raises(redis_errors.ClusterCrossSlotError):
        await client.execute_command(
            "EVAL", TWO_KEYS, 2, "{s3}:a", "{s4}:b", "v",
            target_nodes=client.get_node_from_key("{s3}:a"),
        )  # fmt: skip
    # A key on another master through a plain connection: MOVED (the client follows it).
    other = next(m for m in cluster.masters() if m != cluster.master_of_key("{s3}:a"))
    with pytest.raises(redis_errors.MovedError) as moved:
        cluster.command(other, "GET", "{s3}:a")
    assert (moved.value.slot_id, moved.value.port) == (
        key_slot("{s3}:a"),
        cluster.master_of_key("{s3}:a"),
    )


def test_pause_and_resume_a_replica(clean_cluster: ClusterServer) -> None:
    cluster = clean_cluster
    replica = cluster.replicas()[0]
    pid = cluster.pid(replica)
    cluster.pause(replica)
    try:
        with pytest.raises(redis_errors.TimeoutError):
            cluster.command(replica, "PING", timeout=0.2)
    finally:
        cluster.resume(replica)
    assert cluster.command(replica, "PING") is True
    assert cluster.pid(replica) == pid
    cluster.wait_healthy(10)


# --------------------------------------------------------------------------- failover
@pytest.mark.timeout(120)
async def test_failover_promotes_the_replica_and_keeps_waited_writes(
    clean_cluster: ClusterServer, cluster_client: RedisCluster
) -> None:
    cluster, client = clean_cluster, cluster_client
    keys = [f"{{fo}}:{i}" for i in range(50)]
    for key in keys:
        assert await set_and_wait(client, key, f"v-{key}") >= 1
    old_master = cluster.master_of_key(keys[0])
    (replica,) = cluster.replicas(old_master)

    # A reader keeps going through the failover; what the client lets escape is counted.
    escaped: Counter[str] = Counter()
    reads = 0
    stop = asyncio.Event()

    async def reader() -> None:
        nonlocal reads
        while not stop.is_set():
            value = await retry_through_failover(lambda: client.get(keys[0]), escaped)
            assert value == f"v-{keys[0]}"
            reads += 1
            await asyncio.sleep(0.01)

    task = asyncio.create_task(reader())
    await asyncio.sleep(0.1)
    failover = await asyncio.to_thread(cluster.failover_master, old_master, 20.0)
    await asyncio.sleep(0.2)
    stop.set()
    await asyncio.wait_for(task, 20)
    print(
        f"\nfailover of {old_master}: replica {failover.new_port} promoted after"
        f" {failover.promoted_after:.2f} s, cluster ok after {failover.seconds:.2f} s;"
        f" reader: {reads} reads, errors escaping the client: {dict(escaped)}"
    )
    assert failover.new_port == replica
    assert failover.seconds < 10
    assert cluster.master_of_key(keys[0]) == replica
    assert set(escaped) <= {"ConnectionError", "TimeoutError", "ClusterDownError"}

    # The same client object, without any retry of ours: every waited write is there.
    assert [await client.get(key) for key in keys] == [f"v-{key}" for key in keys]
    assert await set_and_wait(client, keys[0], "after", replicas=0) == 0
    assert await client.get(keys[0]) == "after"

    # The old master comes back from its AOF and nodes.conf as a replica of its successor.
    seconds = await asyncio.to_thread(cluster.restart, old_master, 20.0)
    print(f"restart of {old_master}: rejoined as a synced replica in {seconds:.2f} s")
    # Another node may still flag it failing for a moment: its view catches up by gossip.
    for _ in range(50):
        if cluster.replicas(replica) == [old_master]:
            break
        await asyncio.sleep(0.1)
    assert cluster.replicas(replica) == [old_master]
    assert old_master not in cluster.masters()
    assert await set_and_wait(client, keys[1], "synced") >= 1
    assert cluster.command(old_master, "DBSIZE") == cluster.command(replica, "DBSIZE") == 50
    assert len(cluster.masters()) == 3


# --------------------------------------------------------------------------- resharding
@pytest.mark.timeout(120)
async def test_resharding_a_slot_range_under_load(
    clean_cluster: ClusterServer, cluster_client: RedisCluster
) -> None:
    cluster, client = clean_cluster, cluster_client
    source, target = cluster.masters()[:2]
    slots = cluster.slots_of(source)[100:108]
    keys = keys_in_slots(slots, 200)
    for key in keys:
        await client.set(key, "0")

    latest: dict[str, str] = dict.fromkeys(keys, "0")
    errors: list[BaseException] = []
    operations = 0
    stop = asyncio.Event()

    async def worker() -> None:
        nonlocal operations
        i = 0
        while not stop.is_set():
            key = keys[i % len(keys)]
            try:
                await client.set(key, str(i))
                latest[key] = str(i)
                assert await client.get(key) == str(i)
                assert await client.incr(f"{key}:n") >= 1
            except Exception as exc:
                errors.append(exc)
            operations += 1
            i += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(worker())
    await asyncio.sleep(0.05)
    migration = await asyncio.to_thread(
        cluster.migrate_slots, slots, target, batch=5, between_batches=lambda: time.sleep(0.005)
    )
    await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 10)
    print(
        f"\nresharding of {len(slots)} slots ({migration.keys_moved} keys moved) from"
        f" {source} to {target}: {migration.seconds:.2f} s, {operations} client operations"
    )
    assert errors == []
    assert operations >= 20
    assert migration.keys_moved >= 200
    assert all(cluster.node_for_slot(slot) == target for slot in slots)
    assert await client.mget(keys[:1]) == [latest[keys[0]]]
    for key in keys:  # every write landed, and on the target itself
        assert await client.get(key) == latest[key]
        assert cluster.command(target, "GET", key) == latest[key]
    assert sum(cluster.command(source, "CLUSTER", "COUNTKEYSINSLOT", s) for s in slots) == 0
    cluster.wait_healthy(10)
    # Put the slots back, so the module's topology stays the starting one.
    await asyncio.to_thread(cluster.migrate_slots, slots, source)


async def test_a_half_migrated_slot_asks_single_keys_and_refuses_split_scripts(
    clean_cluster: ClusterServer, cluster_client: RedisCluster
) -> None:
    cluster, client = clean_cluster, cluster_client
    await client.eval(TWO_KEYS, 2, "{s3}:a", "{s3}:b", "before")
    slot = key_slot("{s3}:a")
    source = cluster.node_for_slot(slot)
    target = next(m for m in cluster.masters() if m != source)
    migration = SlotMigration(cluster, [slot], target)
    migration.begin()
    try:
        assert migration.move_keys(1) == 1  # one of the two keys is on the target now
        # Single keys: ASK redirections, followed by the client; new keys go to the target.
        assert await client.get("{s3}:a") == "before"
        assert await client.get("{s3}:b") == "before"
        assert await client.set("{s3}:new", "n") is True
        assert cluster.command(source, "CLUSTER", "COUNTKEYSINSLOT", slot) == 1
        # Both keys in one script while they are split: TRYAGAIN, retried by redis-py
        # until its redirection budget runs out.
        started = time.monotonic()
        with pytest.raises(redis_errors.ClusterError, match="TTL exhausted"):
            await client.eval(TWO_KEYS, 2, "{s3}:a", "{s3}:b", "during")
        print(f"\nsplit two-key script: TRYAGAIN for {time.monotonic() - started:.2f} s")
    finally:
        migration.finish()
    assert cluster.node_for_slot(slot) == target
    assert await client.eval(TWO_KEYS, 2, "{s3}:a", "{s3}:b", "after") == ["after", "after"]
    assert await client.get("{s3}:new") == "n"
    await asyncio.to_thread(cluster.migrate_slots, [slot], source)


# --------------------------------------------------------------------------- stop
def test_stop_leaves_no_process_behind() -> None:
    cluster = ClusterServer(replicas_per_master=0)
    with cluster:
        ports, pids, directory = cluster.ports, cluster.pids(), cluster.dir
        assert len(pids) == 3 and cluster.health_problems() == []
        cluster.pause(ports[0])  # a stopped process must still be ended
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert all(port_is_closed(port) for port in ports)
    assert cluster.pids() == []
    assert not directory.exists()
