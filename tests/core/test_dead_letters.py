"""Jobs that keep failing go to the dead-letter stream and fail their run with a clear error."""

from __future__ import annotations

from redis.asyncio import Redis

from agent_core import RunStatus
from agent_core.testing import FakeOpenAI, call
from tests.agents import ops
from tests.core.conftest import core_settings
from tests.core.harness import Harness


async def test_a_poison_job_is_dead_lettered_and_fails_its_run(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI
) -> None:
    settings = core_settings(redis_url, fake_openai.base_url, JOB_MAX_DELIVERIES=2)
    h = Harness(redis, settings, ops)
    h.start_worker()
    try:
        fake_openai.script("poison", [call("delete_user", {"user_id": "1"})])
        run = await h.gateway.start_run("poison", requested_by="U1")
        [g] = await h.opened_gates(run.run_id, 1)
        # Corrupt the persisted call so that every attempt to resume the run raises.
        turn_key = h.keys.turn(run.run_id, 1)
        call_id = g.data["call_id"]
        await redis.hset(turn_key, f"call:{call_id}", "{not json")
        await h.gateway.decide(g.data["gate_id"], "approve", by="U2")
        failed = await h.wait_finished(run.run_id, timeout=20)
        assert failed.status is RunStatus.FAILED
        assert failed.error is not None and "dead-letter" in failed.error
        shard = h.keys.shard_of(run.run_id)
        dead = await redis.xrange(h.keys.dead_jobs(shard))
        assert [(f["type"], f["run_id"]) for _, f in dead] == [("resume", run.run_id)]
        assert await redis.xpending(h.keys.jobs(shard), "workers") == {
            "pending": 0,
            "min": None,
            "max": None,
            "consumers": [],
        }
    finally:
        await h.close()


async def test_a_malformed_job_is_dead_lettered_at_once(harness: Harness, redis: Redis) -> None:
    jobs, dead_jobs = harness.keys.jobs(0), harness.keys.dead_jobs(0)
    await redis.xadd(jobs, {"type": "start", "run_id": "../../x"})
    await redis.xadd(jobs, {"type": "explode", "run_id": "r-000000000000"})
    # A run id of another shard, in shard 0's stream: no worker may take it as its own.
    await redis.xadd(jobs, {"type": "start", "run_id": "r-01a000000000"})
    for _ in range(200):
        dead = await redis.xrange(dead_jobs)
        if len(dead) == 3:
            break
        await harness.events(block_ms=20)
    assert [f["_reason"] for _, f in dead] == ["malformed job"] * 3


async def test_a_job_for_an_unknown_run_is_acknowledged_and_ignored(
    harness: Harness, redis: Redis, fake_openai: FakeOpenAI
) -> None:
    jobs = harness.keys.jobs(0)
    job_id = await redis.xadd(jobs, {"type": "start", "run_id": "r-000000000000"})
    for _ in range(200):
        # The worker may not have created its group yet (XINFO then answers no groups).
        groups = await redis.xinfo_groups(jobs)
        if groups and groups[0]["last-delivered-id"] == job_id and groups[0]["pending"] == 0:
            break
        await harness.events(block_ms=20)
    else:
        raise AssertionError("the job was never acknowledged")
    assert await redis.xlen(jobs) == 0  # acknowledged jobs are deleted
    assert await redis.xlen(harness.keys.dead_jobs(0)) == 0
    assert fake_openai.requests == []
