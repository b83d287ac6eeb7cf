"""The lossy TCP proxy helper: a lost answer is a request the server applied while the client
never heard back; redis-py's retry sends it again (the hazard every script must survive)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import redis.asyncio as redis_asyncio
from redis.exceptions import ConnectionError as RedisConnectionError

from agent_core.connections import create_redis
from tests.tcp_proxy import TcpProxy


async def test_a_lost_answer_is_applied_and_the_retry_applies_it_again(
    redis: redis_asyncio.Redis, redis_url: str
) -> None:
    port = urlsplit(redis_url).port
    assert port is not None
    with TcpProxy(port) as proxy:
        client = create_redis(proxy.url_for(redis_url))
        try:
            assert await client.incr("counter") == 1  # passes through
            proxy.lose_reply(b"INCR", b"counter")
            # The first INCR was applied and its answer lost; redis-py sent it again.
            assert await client.incr("counter") == 3
            assert (proxy.lost, proxy.armed) == (1, 0)
            assert await client.get("counter") == "3"
        finally:
            await client.aclose()

        plain = redis_asyncio.Redis.from_url(proxy.url_for(redis_url), retry_on_error=[])
        try:
            proxy.lose_reply(b"SET", b"flag")
            with pytest.raises(RedisConnectionError):
                await plain.set("flag", "1")
            assert await redis.get("flag") == "1"  # applied all the same
        finally:
            await plain.aclose()
