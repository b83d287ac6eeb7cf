"""Events are trimmed only once every consumer group has read and acknowledged them."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from agent_core import Keys
from agent_core.trimmer import forget_dead_consumers, trim_events


async def fill(redis: Redis, stream: str, n: int) -> list[str]:
    return [await redis.xadd(stream, {"type": "run.started", "run_id": f"r{i}"}) for i in range(n)]


async def test_nothing_is_trimmed_before_a_group_reads_it(redis: Redis) -> None:
    stream = Keys("t").events(0)
    ids = await fill(redis, stream, 10)
    assert await trim_events(redis, stream, hard_cap=1000) == 0  # no group yet: keep all
    await redis.xgroup_create(stream, "bot", id="0")
    await redis.xgroup_create(stream, "audit", id="0")
    # bot reads 6 and acknowledges 4 of them; audit reads 8 and acknowledges all 8.
    got = await redis.xreadgroup("bot", "web-1", {stream: ">"}, count=6)
    bot_ids = [i for i, _ in got[0][1]]
    await redis.xack(stream, "bot", *bot_ids[:2], *bot_ids[3:5])
    got = await redis.xreadgroup("audit", "a-1", {stream: ">"}, count=8)
    await redis.xack(stream, "audit", *[i for i, _ in got[0][1]])
    removed = await trim_events(redis, stream, hard_cap=1000)
    # bot still has ids[2] pending: only what precedes it may go.
    assert removed == 2
    assert [i for i, _ in await redis.xrange(stream)] == ids[2:]
    await redis.xack(stream, "bot", bot_ids[2], bot_ids[5])
    assert await trim_events(redis, stream, hard_cap=1000) == 4
    # ids[6:] : bot has not read them (and audit has not read ids[8:]).
    assert [i for i, _ in await redis.xrange(stream)] == ids[6:]


async def test_the_hard_cap_drops_the_oldest_entries(redis: Redis) -> None:
    stream = Keys("t").events(0)
    await redis.xgroup_create(stream, "bot", id="0", mkstream=True)
    await fill(redis, stream, 30)
    assert await trim_events(redis, stream, hard_cap=20) == 10
    assert await redis.xlen(stream) == 20


async def test_dead_consumers_with_nothing_pending_are_forgotten(redis: Redis) -> None:
    stream = Keys("t").events(0)
    await fill(redis, stream, 2)
    await redis.xgroup_create(stream, "bot", id="0")
    await redis.xreadgroup("bot", "web-dead", {stream: ">"}, count=1)  # left pending
    got = await redis.xreadgroup("bot", "web-gone", {stream: ">"}, count=1)
    await redis.xack(stream, "bot", got[0][1][0][0])
    await asyncio.sleep(0.05)
    assert await forget_dead_consumers(redis, stream, idle_ms=10) == 1
    names = [c["name"] for c in await redis.xinfo_consumers(stream, "bot")]
    assert names == ["web-dead"]  # its pending entry must still be claimable
