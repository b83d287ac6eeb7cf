"""Finished runs are deleted after RUN_RETENTION; paused and running ones never are."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from agent_core import RunStatus
from agent_core.testing import FakeOpenAI, call, reply
from tests.agents import ops
from tests.core.conftest import core_settings
from tests.core.harness import Harness


async def keys_of(redis: Redis, run_id: str) -> list[str]:
    return sorted([k async for k in redis.scan_iter(match=f"*{run_id}*")])


async def test_finished_runs_are_purged_after_the_retention(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI
) -> None:
    h = Harness(redis, core_settings(redis_url, fake_openai.base_url, RUN_RETENTION=1), ops)
    h.start_worker()
    try:
        fake_openai.script("done", [call("delete_user", {"user_id": "1"}), reply("ok")])
        fake_openai.script("cancelled", [call("delete_user", {"user_id": "2"})])
        fake_openai.script("paused", [call("delete_user", {"user_id": "3"}), reply("denied")])
        done = await h.gateway.start_run("done", requested_by="U1")
        cancelled = await h.gateway.start_run("cancelled", requested_by="U1")
        paused = await h.gateway.start_run("paused", requested_by="U1")
        [g] = await h.opened_gates(done.run_id, 1)
        await h.gateway.decide(g.data["gate_id"], "approve", by="U2")
        await h.opened_gates(cancelled.run_id, 1)
        await h.gateway.cancel_run(cancelled.run_id, by="U1")
        [pg] = await h.opened_gates(paused.run_id, 1)
        assert (await h.wait_finished(done.run_id)).status is RunStatus.COMPLETED
        assert len(await keys_of(redis, done.run_id)) >= 4  # run, history, turns, gates set
        for _ in range(100):
            if not await keys_of(redis, done.run_id) and not await keys_of(redis, cancelled.run_id):
                break
            await asyncio.sleep(0.05)
        assert await keys_of(redis, done.run_id) == []
        assert await keys_of(redis, cancelled.run_id) == []
        assert await h.gateway.get_gate(g.data["gate_id"]) is None
        assert [r.run_id for r in await h.gateway.runs_for_user("U1")] == [paused.run_id]
        assert all([await redis.zcard(h.keys.finished(s)) == 0 for s in h.keys.all_shards()])
        # The paused run is untouched and still decidable.
        assert (await h.gateway.decide(pg.data["gate_id"], "deny", by="U2")).applied
        await h.wait_finished(paused.run_id)
    finally:
        await h.close()
