"""DECISION_REPLICAS on the grant path: **Approve & allow** (GRANT_GATE) is acknowledged only
once a replica has the approval and the grant, as a plain decision is (WAIT), on one
primary with one replica."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from agent_core.testing import FakeOpenAI, call, reply
from tests.agents import read_journal, shipping
from tests.conftest import RedisServerFactory
from tests.core.conftest import core_settings
from tests.core.harness import Harness
from tests.redis_server import RedisServer

pytestmark = pytest.mark.timeout(60)


async def _replicating(primary: Redis, replica: Redis, port: int) -> None:
    await replica.execute_command("REPLICAOF", "127.0.0.1", str(port))
    for _ in range(200):
        if (await replica.info("replication")).get("master_link_status") == "up" and (
            await primary.info("replication")
        ).get("connected_slaves") == 1:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the replica never caught up with its primary")


@pytest.fixture
async def pair(
    aof_redis: RedisServerFactory,
) -> AsyncIterator[tuple[Redis, Redis, RedisServer, RedisServer]]:
    """A primary, its replica (replicating) and their servers."""
    p_server, r_server = aof_redis(appendonly=False), aof_redis(appendonly=False)
    primary = Redis.from_url(p_server.url, decode_responses=True)
    replica = Redis.from_url(r_server.url, decode_responses=True)
    try:
        await _replicating(primary, replica, p_server.port)
        yield primary, replica, p_server, r_server
    finally:
        await primary.aclose()
        await replica.aclose()


async def _gate(h: Harness, fake_openai: FakeOpenAI, task: str) -> tuple[str, str]:
    fake_openai.script(
        task,
        [call("ship", {"env": "staging", "version": 1}), reply("shipped")],
    )
    run = await h.gateway.start_run(task, requested_by="U1")
    [g] = await h.opened_gates(run.run_id, 1)
    return run.run_id, g.data["gate_id"]


async def test_approve_and_allow_waits_for_a_replica(
    pair: tuple[Redis, Redis, RedisServer, RedisServer],
    fake_openai: FakeOpenAI,
    journal: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    primary, replica, p_server, r_server = pair
    h = Harness(primary, core_settings(p_server.url, fake_openai.base_url), shipping)
    h.gateway.decision_replicas, h.gateway.decision_wait_ms = 1, 500
    h.start_worker()
    try:
        # A replica that keeps up: once the grant is acknowledged, the replica has it.
        run_id, gid = await _gate(h, fake_openai, "ship with a replica")
        gate = await h.gateway.get_gate(gid)
        assert gate is not None
        with caplog.at_level(logging.ERROR, logger="agent_core.deciding"):
            made = await h.gateway.grants.approve_and_allow(gid, "U2", args_hash=gate.args_hash)
        assert made.grant is not None and made.decision is not None and made.decision.applied
        assert await replica.hget(h.keys.gate(gid), "status") == "approved"
        assert await replica.hget(h.keys.grants(run_id), made.grant.grant_id)
        assert not [r for r in caplog.records if "replicas" in r.getMessage()]

        # A replica that does not answer: the grant waits DECISION_WAIT for it, is still
        # applied (the primary has it), and says that a failover now could lose it.
        run2, gid2 = await _gate(h, fake_openai, "ship without a replica")
        gate2 = await h.gateway.get_gate(gid2)
        assert gate2 is not None
        assert r_server.pid is not None
        os.kill(r_server.pid, signal.SIGSTOP)
        try:
            with caplog.at_level(logging.ERROR, logger="agent_core.deciding"):
                late = await h.gateway.grants.approve_and_allow(
                    gid2, "U2", args_hash=gate2.args_hash
                )
        finally:
            os.kill(r_server.pid, signal.SIGCONT)
        assert late.grant is not None and late.decision is not None and late.decision.applied
        [warned] = [r for r in caplog.records if "replicas" in r.getMessage()]
        assert f"gate {gid2}: the decision reached 0 of 1 replicas" in warned.getMessage()
        for r in (run_id, run2):
            await h.wait_finished(r)
        assert read_journal(str(journal)) == ["ship:staging:1", "ship:staging:1"]
    finally:
        await h.close()
