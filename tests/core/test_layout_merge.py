"""Merging a key of the old layout into the existing key of the new layout
(:mod:`agent_core.layout_merge`), on a real Redis: what a worker reading the new stream
gets, what sorted sets and sets keep, and which keys are left to a person."""

from __future__ import annotations

from redis.asyncio import Redis

from agent_core import Keys, layout
from agent_core.layout_merge import Outcome, conflict, merge

KEYS = Keys("t")
OLD = Keys("t", legacy=True)


async def test_a_stream_merge_keeps_the_new_streams_work_and_adds_the_old_ones_unhandled(
    redis: Redis,
) -> None:
    old, new = OLD.jobs(0), KEYS.jobs(0)
    record = layout.merge_record(KEYS, new, 0)
    # The old stream: "a" handled, "b" pending at a worker that stopped, "c" never delivered.
    ids = {r: await redis.xadd(old, {"type": "start", "run_id": r}) for r in "abc"}
    await redis.xgroup_create(old, "workers", id="0")
    await redis.xreadgroup("workers", "old-worker", {old: ">"}, count=2)
    await redis.xack(old, "workers", ids["a"])
    # The new stream: "x" pending at a worker that died (to be claimed), "y" not delivered yet.
    live = {r: await redis.xadd(new, {"type": "resume", "run_id": r, "turn": "1"}) for r in "xy"}
    await redis.xgroup_create(new, "workers", id="0")
    await redis.xreadgroup("workers", "dead-worker", {new: ">"}, count=1)

    assert await merge(redis, old, new, record) == (Outcome.MERGED, "")
    # Run again (a crash came before the old stream was deleted): nothing is appended twice.
    assert await merge(redis, old, new, record) == (Outcome.MERGED, "")

    entries = await redis.xrange(new)
    assert [f["run_id"] for _, f in entries] == ["x", "y", "b", "c"]
    assert [i for i, _ in entries[:2]] == [live["x"], live["y"]], "the live entries keep their ids"
    pending = await redis.xpending_range(new, "workers", "-", "+", 10)
    assert [(p["message_id"], p["consumer"]) for p in pending] == [(live["x"], "dead-worker")]
    got = await redis.xreadgroup("workers", "new-worker", {new: ">"}, count=10)
    assert [f["run_id"] for _, f in got[0][1]] == ["y", "b", "c"]
    claimed = await redis.xautoclaim(new, "workers", "new-worker", 0, "0-0")
    assert [f["run_id"] for _, f in claimed[1]] == ["x", "y", "b", "c"]


async def test_a_stream_with_no_group_is_merged_whole_and_two_groups_need_both(
    redis: Redis,
) -> None:
    dead_old, dead_new = OLD.dead_jobs(1), KEYS.dead_jobs(1)
    await redis.xadd(dead_old, {"type": "start", "run_id": "d", "_reason": "boom"})
    await redis.xadd(dead_new, {"type": "start", "run_id": "e", "_reason": "boom"})
    await merge(redis, dead_old, dead_new, layout.merge_record(KEYS, dead_new, 1))
    assert [f["run_id"] for _, f in await redis.xrange(dead_new)] == ["e", "d"]

    # Events read by two groups: an entry one of them has not handled is carried.
    old, new = OLD.events(1), KEYS.events(1)
    for r in "fgh":
        await redis.xadd(old, {"type": "run.started", "run_id": r})
    await redis.xgroup_create(old, "bot", id="0")
    await redis.xgroup_create(old, "audit", id="0")
    for _, msgs in await redis.xreadgroup("bot", "b", {old: ">"}):
        await redis.xack(old, "bot", *[i for i, _ in msgs])
    read = await redis.xreadgroup("audit", "a", {old: ">"}, count=1)
    await redis.xack(old, "audit", read[0][1][0][0])
    await redis.xadd(new, {"type": "run.started", "run_id": "i"})
    await merge(redis, old, new, layout.merge_record(KEYS, new, 1))
    assert [f["run_id"] for _, f in await redis.xrange(new)] == ["i", "g", "h"]


async def test_sorted_sets_and_sets_are_unions_and_other_keys_must_be_the_same(
    redis: Redis,
) -> None:
    old, new = OLD.deadlines(2), KEYS.deadlines(2)
    await redis.zadd(old, {"g1": 100, "g2": 50})
    await redis.zadd(new, {"g1": 80, "g3": 10})
    assert (await merge(redis, old, new, "unused"))[0] is Outcome.MERGED
    assert await redis.zrange(new, 0, -1, withscores=True) == [
        ("g3", 10.0),
        ("g2", 50.0),
        ("g1", 80.0),
    ], "a member in both keeps the earlier deadline"
    await redis.zadd(old, {"g1": 70})
    await merge(redis, old, new, "unused")
    assert await redis.zscore(new, "g1") == 70.0

    old_gates, new_gates = OLD.run_gates("r-02a"), KEYS.run_gates("r-02a")
    await redis.sadd(old_gates, "g1", "g2")
    await redis.sadd(new_gates, "g2", "g3")
    await merge(redis, old_gates, new_gates, "unused")
    assert await redis.smembers(new_gates) == {"g1", "g2", "g3"}

    # The same hash under both names (a copy made before a crash): the old one may go.
    old_run, new_run = OLD.run("r-02a"), KEYS.run("r-02a")
    await redis.hset(old_run, mapping={"status": "awaiting_approval", "turn": "1"})
    await redis.hset(new_run, mapping={"status": "awaiting_approval", "turn": "1"})
    assert await conflict(redis, old_run, new_run) is None
    assert await merge(redis, old_run, new_run, "unused") == (Outcome.MERGED, "")
    # Different contents, or different types: a conflict, and nothing is written.
    await redis.hset(old_run, "status", "completed")
    why = f"{old_run} (hash) and {new_run} (hash) differ"
    assert await merge(redis, old_run, new_run, "unused") == (Outcome.CONFLICT, why)
    assert await redis.hget(new_run, "status") == "awaiting_approval"
    old_start, new_start = OLD.start_key("k"), KEYS.start_key("k")
    await redis.set(old_start, "r-02a", ex=60)
    await redis.hset(new_start, "x", "1")
    assert await conflict(redis, old_start, new_start) == (
        f"{old_start} (string, expires in 60 s) and {new_start} (hash) are of different types"
    )
