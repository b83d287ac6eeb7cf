"""The key-layout migration on Redis Cluster: old and new names of a key are in different
slots (often on different masters), so keys move by DUMP + RESTORE (TTL kept) + DEL; a crash
between the RESTORE and the DEL leaves both names, and running it again finishes. A RESTORE
never replaces a key of the new layout: an old key written beside live runs is merged in."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai import AsyncOpenAI
from redis.asyncio import Redis

from agent_core import ConfigError, Keys, layout
from agent_core.testing import FakeOpenAI
from agent_core.worker import Worker
from tests import redis_cluster
from tests.agents import ops
from tests.cluster.test_cluster import InProcess, client, journal, settings
from tests.old_layout import (
    approve_and_finish,
    assert_live_state_kept,
    finish_live_state,
    live_state_and_old_writes,
    paused_old_deployment,
)
from tests.redis_cluster import ClusterServer

pytestmark = pytest.mark.timeout(180)
__all__ = ["client", "journal"]  # fixtures, registered by import
cluster_server = redis_cluster.cluster_server
clean_cluster = redis_cluster.clean_cluster


class Crash(Exception):
    """The migration process dying between a batch's RESTOREs and its DELs."""


async def names(redis: Redis, prefix: str) -> list[str]:
    return sorted([k async for k in redis.scan_iter(match="{" + prefix + ":*", count=1000)])


async def test_an_old_layout_deployment_is_migrated_on_the_cluster(
    client: Redis,
    clean_cluster: ClusterServer,
    fake_openai: FakeOpenAI,
    journal: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = settings(clean_cluster.url, fake_openai)
    keys = Keys(s.key_prefix, s.shards)
    old = await paused_old_deployment(client, ops, s, fake_openai, monkeypatch)
    before = await names(client, "c")
    assert before and all(k.split("}")[0].count(":") == 1 for k in before)

    openai = AsyncOpenAI(api_key="sk-test", base_url=s.openai_base_url)
    with pytest.raises(ConfigError, match=r"^KEY_PREFIX=c: Redis holds runs in the old key"):
        await Worker(client, ops, openai, s).run()

    copied: list[int] = []

    async def crash_after_8(moved: int) -> None:
        copied.append(moved)
        if moved >= 8:
            raise Crash

    with pytest.raises(Crash):
        await layout.migrate(client, keys, force=True, batch=4, checkpoint=crash_after_8)
    assert copied == [4, 8]
    after_crash = await names(client, "c")
    # The first batch moved; the second is under both names, its old ones not deleted yet.
    assert len(after_crash) == len(before) + 4
    with pytest.raises(ConfigError, match="did not finish"):
        await Worker(client, ops, openai, s).run()
    await openai.close()

    rest = await layout.migrate(client, keys, force=True)
    assert rest.total == len(before) - 4, "the crashed batch is copied again, then deleted"
    assert (await layout.migrate(client, keys, force=True)).total == 0
    assert await layout.old_layout_problem(client, keys) is None
    moved = await names(client, "c")
    assert len(moved) == len(before)
    for name in moved:
        shard = int(name[len("{c:") :].split(":")[0])
        assert name.startswith(keys.tag(shard))
        assert clean_cluster.node_for_slot(keys.slot(shard)) == clean_cluster.master_of_key(name)
        if ":start:" in name:
            assert await client.pttl(name) > 0, "the start keys keep their TTL"

    node = InProcess(client, s)
    try:
        await approve_and_finish(node.gateway, old, journal)
    finally:
        await node.close()


async def test_old_keys_written_after_the_upgrade_are_merged_on_the_cluster(
    client: Redis,
    clean_cluster: ClusterServer,
    fake_openai: FakeOpenAI,
    journal: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As on one node (tests/core/test_layout.py): an old worker ran for a moment after the
    upgrade. A RESTORE never replaces a key of the new layout: the old key is merged into
    it; a crash after the copies and merges leaves both names, and running it again merges
    nothing twice."""
    s = settings(clean_cluster.url, fake_openai, APPROVAL_TIMEOUT=30)
    live = await live_state_and_old_writes(client, ops, s, fake_openai, monkeypatch)
    keys = live.keys

    async def crash(moved: int) -> None:
        raise Crash

    with pytest.raises(Crash):
        await layout.migrate(client, keys, force=True, checkpoint=crash)
    report = await layout.migrate(client, keys, force=True)
    assert report.merged[live.shard] >= 4, report  # jobs, events, active runs, deadlines…
    assert (await layout.migrate(client, keys, force=True)).total == 0
    assert await layout.old_layout_problem(client, keys) is None
    assert not await names(client, "c:*:ext:layout"), "no merge record left"
    await assert_live_state_kept(client, live)

    node = InProcess(client, s)
    try:
        await finish_live_state(node.gateway, live, journal)
    finally:
        await node.close()
