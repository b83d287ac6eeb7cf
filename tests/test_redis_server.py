"""The private Redis helper: an append-only server keeps acknowledged writes across a crash."""

from __future__ import annotations

import pytest
import redis.asyncio as redis_asyncio

from tests.conftest import RedisServerFactory


async def test_aof_server_keeps_a_key_across_kill_and_start(aof_redis: RedisServerFactory) -> None:
    server = aof_redis()
    port, directory = server.port, server.dir

    client = redis_asyncio.Redis.from_url(server.url, decode_responses=True)
    try:
        await client.set("survivor", "yes")
    finally:
        await client.aclose()

    old_pid = server.pid
    server.kill()
    assert not server.running
    server.start()
    assert server.pid != old_pid
    assert (server.port, server.dir) == (port, directory)

    client = redis_asyncio.Redis.from_url(server.url, decode_responses=True)
    try:
        assert await client.get("survivor") == "yes"
    finally:
        await client.aclose()


@pytest.mark.parametrize("attempt", [1, 2])
async def test_redis_fixture_gets_a_clean_db(redis: redis_asyncio.Redis, attempt: int) -> None:
    assert await redis.dbsize() == 0
    await redis.set("left-behind", "1")
