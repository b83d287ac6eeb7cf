"""One connection pool per node: after a workload on the cluster client (runs started,
paused, decided, finished; the worker's stream reads on every shard), each node has one
pool in the client, and every connection the node sees from us is one of that pool's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
from redis.asyncio import Redis
from redis.crc import key_slot

from agent_core.cluster_client import FailoverCluster
from agent_core.connections import connect_redis
from agent_core.testing import FakeOpenAI
from tests import redis_cluster
from tests.cluster.test_cluster import InProcess, script_deletes, settings
from tests.redis_cluster import ClusterServer

pytestmark = pytest.mark.timeout(180)

cluster_server = redis_cluster.cluster_server
clean_cluster = redis_cluster.clean_cluster


@pytest.fixture
async def client(clean_cluster: ClusterServer) -> AsyncIterator[Redis]:
    redis = await connect_redis(clean_cluster.url)
    try:
        yield redis
    finally:
        await redis.aclose()


def client_connections(port: int) -> int:
    """The clients node ``port`` has (blocked ones too), besides the one asking; not its
    replication links (the cluster bus is not in CLIENT LIST)."""
    with redis.Redis(port=port, decode_responses=True) as r:
        me = r.client_id()
        links = [c for c in r.client_list() if int(c["id"]) != me]
        return sum(1 for c in links if not {"S", "M"} & set(c["flags"]))


def pools(client: Any) -> dict[str, set[int]]:
    """Every node object the client holds (by address): the slot table's, the startup
    nodes' and those of each slot."""
    manager = client.nodes_manager
    found: dict[str, set[int]] = {}
    nodes = [*manager.nodes_cache.values(), *manager.startup_nodes.values()]
    nodes += [n for slot_nodes in manager.slots_cache.values() for n in slot_nodes]
    for n in nodes:
        found.setdefault(n.name, set()).add(id(n))
    return found


async def test_one_connection_pool_per_node(
    client: Redis, clean_cluster: ClusterServer, fake_openai: FakeOpenAI, tmp_path: Any
) -> None:
    tasks = {f"delete {i}": str(i) for i in range(8)}
    script_deletes(fake_openai, tasks)
    node = InProcess(client, settings(clean_cluster.url, fake_openai))
    try:
        gw = node.gateway
        runs = [await gw.start_run(t, requested_by="U1") for t in tasks]
        for r in runs:
            await gw.wait(r.run_id, "awaiting_approval", timeout=30)
            [gate] = await gw.pending_gates(r.run_id)
            assert (await gw.decide(gate, "approve", by="U2")).applied
        for r in runs:
            assert (await gw.wait(r.run_id, timeout=30)).status.value == "completed"
        held = pools(client)
        assert all(len(ids) == 1 for ids in held.values()), held
        manager = client.nodes_manager  # type: ignore[attr-defined]
        for port in clean_cluster.masters():
            name = f"127.0.0.1:{port}"
            mine = manager.nodes_cache[name]
            connected = sum(1 for c in mine._connections if c.is_connected)
            assert connected >= 1
            # Every connection the node sees is one of its pool's (nothing opened per call).
            assert client_connections(port) == connected, name
    finally:
        await node.close()


@pytest.mark.parametrize(
    "key",
    ["{agw:3:04mz}:run:r-1", "plain", "{}x", "a{b", "a}b{c}d", "x{y}{z}", "{é}:k", "{{a}}", ""],
)
async def test_the_remembered_slot_is_redis_own(key: str) -> None:
    """The slot taken from a remembered hash tag is the one Redis computes, edge cases too."""
    client = FailoverCluster(host="127.0.0.1", port=1)  # never connected
    try:
        for _ in range(2):  # computed, then remembered
            assert client.keyslot(key) == key_slot(key.encode())
            assert client._slot_of(("HGET", key, "f")) == key_slot(key.encode())
            assert client._slot_of(("EVALSHA", "sha", 2, key, key, "arg")) == key_slot(key.encode())
        assert client._slot_of(("EVALSHA", "sha", 0, "arg")) is None
        assert client._slot_of(("PING",)) is None
    finally:
        await client.aclose()
