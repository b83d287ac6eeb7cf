"""agent_core.direct: the scripts' hot path, on a real Redis. It must send what redis-py
sends, keep a connection usable after an error reply, honour the client's retries when the
server drops the connection, refuse what redis-py refuses, and leave the cluster client to
redis-py."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import DataError, ResponseError

from agent_core import direct
from agent_core.connections import create_redis
from agent_core.script_loader import ScriptSet


async def call(redis: Redis, *command: object) -> object:
    """One command through ``direct.execute``: its reply, or its error reply raised."""
    (reply,) = await direct.execute(redis, command)
    if isinstance(reply, ResponseError):
        raise reply
    return reply


async def test_it_packs_byte_for_byte_what_redis_py_packs(redis: Redis) -> None:
    command = ("EVALSHA", "f" * 40, 2, "k1", "ключ", 0.1, 1e-7, 2**70, -3, 1.5, b"\x00raw", "")
    conn = redis.connection_pool.make_connection()
    assert direct.pack(command) == b"".join(conn.pack_command(*command))


async def test_replies_come_in_order_and_an_error_reply_is_returned_not_raised(
    redis_url: str,
) -> None:
    client = create_redis(redis_url, max_connections=1)  # every command on one connection
    try:
        await client.rpush("list", "a", "b")
        replies = await direct.execute(
            client, ("SET", "s", "v"), ("LPUSH", "s", "x"), ("LRANGE", "list", 0, -1)
        )
        assert replies[0] == "OK"  # no response callbacks: the raw reply
        assert isinstance(replies[1], ResponseError) and "WRONGTYPE" in str(replies[1])
        assert replies[2] == ["a", "b"]  # decoded, as the client is configured
        # The connection read every reply: the next command gets its own.
        assert await call(client, "GET", "s") == "v"
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await call(client, "LPUSH", "s", "x")
        assert await client.get("s") == "v"
    finally:
        await client.aclose()


async def test_a_refused_argument_raises_data_error_and_sends_nothing(redis: Redis) -> None:
    for bad in (None, True, object()):
        with pytest.raises(DataError, match="invalid argument"):
            await call(redis, "SET", "k", bad)
    assert await redis.exists("k") == 0


async def test_a_dropped_connection_is_retried_on_a_new_one(redis_url: str, redis: Redis) -> None:
    client = create_redis(redis_url, max_connections=1)
    try:
        await call(client, "CLIENT", "SETNAME", "direct-test")
        killed = await redis.execute_command("CLIENT", "KILL", "SKIPME", "yes", "TYPE", "normal")
        assert killed >= 1  # the pooled connection is gone; the client does not know yet
        assert await call(client, "INCR", "n") == 1  # sent again once, on a new one
        assert await redis.get("n") == "1"
    finally:
        await client.aclose()


async def test_scripts_take_it_on_one_node_and_fall_back_to_eval_after_a_flush(
    redis: Redis,
) -> None:
    class Probe(ScriptSet):
        package = "agent_core"

    scripts = Probe(redis)
    assert scripts._direct
    run_key = "run:direct"
    await redis.hset(run_key, mapping={"fence": "7", "lease_until": "1"})
    assert await scripts._run("release_lease", [run_key], ["7"]) == 1
    await redis.script_flush()  # as after a restart without its script cache
    await redis.hset(run_key, "lease_until", "1")
    assert await scripts._run("release_lease", [run_key], ["7"]) == 1
    assert await redis.hget(run_key, "lease_until") == "0"


def test_the_cluster_client_and_single_connection_clients_keep_redis_pys_path() -> None:
    assert direct.usable(Redis())
    assert not direct.usable(Redis(single_connection_client=True))
    assert not direct.usable(RedisCluster(host="127.0.0.1", port=1))
