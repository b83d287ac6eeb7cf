"""redis-py's connections, sending a command without a task of its own.

redis-py bounds each command's send with ``asyncio.wait_for(..., socket_timeout)``. On Python
3.11 that wraps the send in a new task, with a timer and a done callback, and the send runs
one turn of the event loop later: per command, on every round trip of every process. The
connections here bound it with ``asyncio.timeout`` instead (a timer, no task, no extra turn);
everything else is redis-py's: the same checks, errors and disconnects.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.exceptions import ConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


async def _send_packed_command(
    self: AbstractConnection,
    command: bytes | str | Iterable[bytes],
    check_health: bool = True,
) -> None:
    # redis-py 8.1's AbstractConnection.send_packed_command, its wait_for replaced.
    if not self.is_connected:
        await self.connect_check_health(check_health=False)
    if check_health:
        await self.check_health()
    try:
        if isinstance(command, str):
            command = command.encode()
        if isinstance(command, bytes):
            command = [command]
        writer = self._writer
        assert writer is not None
        writer.writelines(command)
        if self.socket_timeout:
            async with asyncio.timeout(self.socket_timeout):
                await writer.drain()
        else:
            await writer.drain()
    except TimeoutError:  # asyncio's, i.e. the builtin
        await self.disconnect(nowait=True)
        raise RedisTimeoutError("Timeout writing to socket") from None
    except OSError as e:
        await self.disconnect(nowait=True)
        if len(e.args) == 1:
            err_no, errmsg = "UNKNOWN", e.args[0]
        else:
            err_no = e.args[0]
            errmsg = e.args[1]
        raise ConnectionError(f"Error {err_no} while writing to socket. {errmsg}.") from e
    except BaseException:
        # As redis-py: a send cut short leaves the connection unusable.
        await self.disconnect(nowait=True)
        raise


class TimelyConnection(Connection):
    """:class:`redis.asyncio.Connection`, its sends bounded without a task."""

    send_packed_command = _send_packed_command


class TimelySSLConnection(SSLConnection):
    """:class:`redis.asyncio.SSLConnection`, its sends bounded without a task."""

    send_packed_command = _send_packed_command


class TimelyUnixConnection(UnixDomainSocketConnection):
    """:class:`redis.asyncio.UnixDomainSocketConnection`, its sends bounded without a task."""

    send_packed_command = _send_packed_command


TIMELY: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: TimelyConnection,
    SSLConnection: TimelySSLConnection,
    UnixDomainSocketConnection: TimelyUnixConnection,
}


def timely(connection_class: type[AbstractConnection]) -> type[AbstractConnection]:
    """The timely version of one of redis-py's connection classes (others: unchanged)."""
    return TIMELY.get(connection_class, connection_class)
