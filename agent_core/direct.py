"""Commands sent straight over a pooled connection of a single-node client: the hot path.

redis-py's ``execute_command`` does much per command besides sending it: each argument
encoded by a Python function, a callback lookup, observability hooks, a timeout scope per
reply. For the scripts of a run (a few EVALSHAs per step, each a round trip) that was about a
third of the worker's CPU per pause-and-resume cycle, measured under cProfile. Here the whole
request is packed in C (``hiredis.pack_command``, byte for byte what redis-py sends) and written
and read on one connection of the client's own pool, with the connection's own retry policy
(a connection or timeout error disconnects, backs off and sends again, as ``execute_command``
does; the scripts are written to be safe to run twice).

Only for a plain :class:`redis.asyncio.Redis`: the cluster client routes by slot and follows
redirections, and keeps redis-py's path (:func:`usable`). Replies are decoded as the client is
configured (``decode_responses``). redis-py's own command metrics (its OpenTelemetry hooks) do
not see these commands.
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any

import hiredis
from redis.asyncio import Redis
from redis.exceptions import DataError, ResponseError

Command = Sequence[Any]


def usable(redis: Redis) -> bool:
    """True for a plain single-node client (a pool, no single connection of its own); the
    cluster client is another class."""
    return type(redis) is Redis and redis.connection is None and not redis.single_connection_client


def pack(*commands: Command) -> bytes:
    """The RESP request for ``commands``, sent as one write."""
    try:
        return b"".join(hiredis.pack_command(tuple(c)) for c in commands)
    except TypeError as exc:  # None, a bool, an object: redis-py raises DataError for these
        raise DataError(f"invalid argument in a Redis command: {exc}") from None


async def execute(redis: Redis, *commands: Command, raw: Container[int] = ()) -> list[Any]:
    """Send ``commands`` in one round trip; their replies in order, an error reply as the
    :class:`~redis.exceptions.ResponseError` it parses to (returned, not raised). The replies
    of the commands at the positions in ``raw`` are read as bytes, never decoded."""
    packed = pack(*commands)
    count = len(commands)
    pool = redis.connection_pool
    conn = await pool.get_connection()

    async def attempt() -> list[Any]:
        await conn.send_packed_command(packed)
        replies: list[Any] = []
        for i in range(count):
            try:
                replies.append(await conn.read_response(disable_decoding=i in raw))
            except ResponseError as exc:  # the reply was read: the next one follows
                replies.append(exc)
        return replies

    async def failed(_error: BaseException) -> None:
        await conn.disconnect()

    try:
        replies: list[Any] = await conn.retry.call_with_retry(attempt, failed)
        return replies
    finally:
        await pool.release(conn)
