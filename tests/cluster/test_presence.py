"""The workers' presence on Redis Cluster: one hash under the deployment's own tag."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from redis.asyncio import Redis

from agent_core import Keys
from agent_core.presence import check, other_prefixes, presence_key
from agent_core.testing import FakeOpenAI
from tests import redis_cluster
from tests.cluster.test_cluster import InProcess, client, journal, settings
from tests.redis_cluster import ClusterServer, key_slot

pytestmark = pytest.mark.timeout(180)
__all__ = ["client", "journal"]  # fixtures, registered by import
cluster_server = redis_cluster.cluster_server
clean_cluster = redis_cluster.clean_cluster


async def test_a_worker_on_the_cluster_announces_itself(
    client: Redis, clean_cluster: ClusterServer, fake_openai: FakeOpenAI, journal: Path
) -> None:
    p = InProcess(client, settings(clean_cluster.url, fake_openai))
    try:
        keys = Keys("c")
        for _ in range(200):
            report = await check(client, keys, ["test-ops"])
            if report.alive:
                break
            await asyncio.sleep(0.05)
        assert (report.alive, report.agents, report.problem) == (1, ["test-ops"], None)
        assert key_slot(presence_key(keys)) == key_slot("{c}:anything"), "the deployment's tag"
        assert await other_prefixes(client, Keys("other")) == [], "not looked for on a cluster"
        assert (await check(client, Keys("other"))).problem is not None
    finally:
        await p.close()
