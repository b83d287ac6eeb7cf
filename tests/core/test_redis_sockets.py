"""The clients' connections send without a task per command (agent_core.redis_sockets), and
behave as redis-py's own: replies, a dead server's errors, a send that cannot finish."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from agent_core import create_redis
from agent_core.redis_sockets import TimelyConnection


def test_the_copy_matches_redis_py_s_send() -> None:
    # The timely send is redis-py 8.1's with its wait_for replaced: when redis-py changes
    # its own, this says to look at the copy again.
    own = inspect.getsource(AbstractConnection.send_packed_command)
    assert "asyncio.wait_for(" in own
    assert 'raise TimeoutError("Timeout writing to socket")' in own


async def test_commands_and_scripts_over_timely_connections(redis_url: str) -> None:
    client = create_redis(redis_url)
    try:
        assert client.connection_pool.connection_class is TimelyConnection
        await client.set("t:k", "v")
        assert await client.get("t:k") == "v"
        script = client.register_script("return {KEYS[1], ARGV[1]}")
        assert await script(keys=["t:k"], args=["a"]) == ["t:k", "a"]
        # Many at once: each command its own connection from the pool, replies not mixed.
        got = await asyncio.gather(*(client.echo(str(i)) for i in range(50)))
        assert got == [str(i) for i in range(50)]
    finally:
        await client.delete("t:k")
        await client.aclose()


async def test_a_server_that_is_gone_is_a_connection_error() -> None:
    client = create_redis("redis://127.0.0.1:1", socket_timeout=0.5)
    try:
        with pytest.raises(ConnectionError):
            await client.ping()
    finally:
        await client.aclose()


class _NoHandshake(TimelyConnection):
    """Connected without HELLO and CLIENT SETINFO: the server below never answers."""

    async def on_connect_check_health(self, check_health: bool = True) -> None:
        self._parser.on_connect(self)


async def test_a_send_that_cannot_finish_times_out_and_drops_the_connection() -> None:
    # A server that accepts and never reads: the send fills the socket buffers, then waits.
    over = asyncio.Event()

    async def never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await over.wait()
        writer.close()

    server = await asyncio.start_server(never_read, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conn = _NoHandshake(host="127.0.0.1", port=port, socket_timeout=0.3)
    try:
        await conn.connect()
        with pytest.raises(RedisTimeoutError):
            await conn.send_packed_command(b"x" * (64 << 20), check_health=False)
        assert not conn.is_connected
    finally:
        await conn.disconnect()
        over.set()
        server.close()
        await server.wait_closed()
