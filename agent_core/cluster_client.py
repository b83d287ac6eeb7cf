"""redis-py's Redis Cluster client, made to ride out a master's failover.

redis-py's asyncio ``RedisCluster`` (8.1, read in its source) turns one dead master into
errors on every master:

* After a connection error it rebuilds its slot table, and then re-reads the command table
  (``COMMAND``) from its default node. Until the replica is promoted, the dead master still
  owns its slots and is often that default node: the rebuild fails, and with it every
  command that needed it, whatever node the command was for.
* ``XREADGROUP`` has "movable keys": to route one, redis-py asks the default node
  (``COMMAND GETKEYS``) first. Every stream read of every shard then fails with it.
* A failed rebuild, a ``CLUSTERDOWN`` answer and a pipeline's retry all close every
  connection of every node, including those other tasks are using that instant. Their
  commands fail half-way (``AttributeError: 'NoneType' object has no attribute
  'writelines'``), possibly after Redis applied them: the reply is lost.
* It retries a command at once, a number of times, with no pause: a failover (seconds)
  outlasts the retries.

:class:`FailoverCluster` keeps redis-py and changes those four things: the command table is
read once; stream reads are routed from their own arguments; a recovery inside a command
drops connections lazily (each one after the command using it ends, as redis-py already does
for a single failed node); and a command or pipeline that fails on what a failover or a
refreshed slot table can fix is retried with a short backoff for up to ``failover_window``
seconds. A retried command may have been applied already: every Lua script recognises its
own earlier effect (see :mod:`agent_core.scripts`).
"""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from redis._parsers import AsyncCommandsParser
from redis.asyncio.cluster import ClusterPipeline, RedisCluster
from redis.commands.core import AsyncScript
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    AuthenticationError,
    AuthorizationError,
    ClusterError,
    ConnectionError,
    MovedError,
    NoScriptError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TimeoutError,
    TryAgainError,
)

T = TypeVar("T")

# Where the first key of a command is (index in the command, its name first) for the
# commands routed without redis-py's generic routing. A command of several keys names them
# all in one slot (or Redis refuses it with CROSSSLOT); redis-py splits DEL, EXISTS, UNLINK
# and TOUCH of several slots before they get here.
_FIRST_KEY: dict[str, int] = {
    name: 1
    for name in (
        "GET SET SETNX SETEX GETDEL INCR INCRBY DECR DEL UNLINK EXISTS EXPIRE PEXPIRE TTL PTTL "
        "TYPE PERSIST HGET HSET HSETNX HMGET HMSET HGETALL HVALS HKEYS HDEL HINCRBY HEXISTS "
        "HLEN HSTRLEN LPUSH RPUSH LPOP RPOP LRANGE LLEN LINDEX LTRIM LREM SADD SREM SMEMBERS "
        "SISMEMBER SCARD ZADD ZREM ZRANGE ZREVRANGE ZRANGEBYSCORE ZREVRANGEBYSCORE ZCARD "
        "ZSCORE ZCOUNT ZREMRANGEBYSCORE ZREMRANGEBYRANK ZPOPMIN ZRANK XADD XACK XDEL XLEN "
        "XRANGE XREVRANGE XTRIM XPENDING XCLAIM XAUTOCLAIM"
    ).split()
} | {"EVALSHA": 3, "EVAL": 3, "EVALSHA_RO": 3, "EVAL_RO": 3}
# Hash tags whose slot is remembered (a deployment has a few: its shards').
_MAX_TAGS = 4096

# Seconds a command is retried through a failover by default (REDIS_FAILOVER_WINDOW): a
# Redis Cluster master is replaced about cluster-node-timeout + 1 s after it dies.
DEFAULT_FAILOVER_WINDOW = 10.0
_FIRST_PAUSE = 0.05
_LONGEST_PAUSE = 0.5
# What redis-py raises when it cannot build a slot table (no node answered, or they disagree).
_TOPOLOGY_ERRORS = (
    "Redis Cluster cannot be connected",
    "startup_nodes could not agree",
    "All slots are not covered",
)
# Set while this task is inside a command of a FailoverCluster: a recovery (aclose) that
# redis-py starts from there refreshes the client instead of closing it.
_IN_COMMAND: ContextVar[bool] = ContextVar("agw_in_cluster_command", default=False)


def transient(exc: BaseException) -> bool:
    """Whether a cluster command that raised ``exc`` may succeed if tried again shortly: a
    node is down or failing over, the slot table is stale, or redis-py closed the connection
    under the command (the ``AttributeError`` of a connection reset meanwhile)."""
    if isinstance(exc, AuthenticationError | AuthorizationError):
        return False
    if isinstance(
        exc,
        ConnectionError
        | TimeoutError
        | ClusterError
        | TryAgainError
        | SlotNotCoveredError
        | ReadOnlyError
        | builtins.ConnectionError,
    ):
        return True
    if isinstance(exc, RedisClusterException):
        return str(exc).startswith(_TOPOLOGY_ERRORS)
    return isinstance(exc, AttributeError) and "'NoneType' object has no attribute" in str(exc)


class _CommandTable(AsyncCommandsParser):
    """The command table, read from the first node that answers and never again: it does
    not change when masters do, and redis-py re-read it at every slot-table rebuild from
    the default node, which is often the dead master during a failover."""

    async def initialize(self, node: Any = None) -> None:
        if node is not None:
            self.node = node
        if not self.commands:
            await super().initialize()


def _stream_keys(args: tuple[Any, ...]) -> list[Any] | None:
    """The keys of ``XREAD``/``XREADGROUP`` arguments (after the command name): the first
    half of what follows ``STREAMS``; None when malformed (redis-py then decides)."""
    words = [a.decode() if isinstance(a, bytes) else a for a in args]
    i = 3 if words[:1] and str(words[0]).upper() == "GROUP" else 0  # GROUP <group> <consumer>
    while i < len(words):
        word = str(words[i]).upper()
        if word == "STREAMS":
            rest = args[i + 1 :]
            return list(rest[: len(rest) // 2]) if rest and len(rest) % 2 == 0 else None
        i += 2 if word in ("COUNT", "BLOCK") else 1
    return None


async def _send(node: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Send ``commands`` to ``node`` on one of its connections, in one write; their raw
    replies (an error reply as its exception, none of redis-py's reply callbacks: a command
    inside MULTI answers QUEUED). A connection error is raised (the connection is then
    dropped, and what was sent may have been applied)."""
    connection = node.acquire_connection()
    try:
        await node.disconnect_if_needed(connection)
        await connection.send_packed_command(connection.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(await connection.read_response())
            except ResponseError as exc:
                replies.append(exc)
        return replies
    finally:
        node.release(connection)


class FailoverCluster(RedisCluster):
    """``RedisCluster`` that rides out a failover (see the module docstring).

    ``failover_window``: how long (seconds) a command that failed on a transient cluster
    error is retried, with a backoff from 50 ms to 0.5 s; 0 retries nothing more than
    redis-py does.
    """

    def __init__(self, *args: Any, failover_window: float = DEFAULT_FAILOVER_WINDOW, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.failover_window = failover_window
        self.commands_parser = _CommandTable()
        self._pool_closers: set[asyncio.Task[None]] = set()
        self._tag_slots: dict[str, int] = {}

    # --- one pool per node ----------------------------------------------------------------
    async def initialize(self, *args: Any, **kwargs: Any) -> FailoverCluster:
        await super().initialize(*args, **kwargs)
        self._one_pool_per_node()
        return self

    def _one_pool_per_node(self) -> None:
        """redis-py keeps the node of the URL as a startup node of its own, with its own
        connections, beside the same node of the slot table: a second pool for one node
        (used again at every slot-table rebuild). Make the startup node the slot table's,
        and close the other's connections (idle once the table is read)."""
        manager = self.nodes_manager
        for name, node in list(manager.startup_nodes.items()):
            same = manager.nodes_cache.get(name)
            if same is not None and same is not node:
                manager.startup_nodes[name] = same
                node.update_active_connections_for_reconnect()  # none, unless reading now
                task = asyncio.create_task(node.disconnect_free_connections())
                self._pool_closers.add(task)
                task.add_done_callback(self._pool_closers.discard)

    # --- routing ------------------------------------------------------------------------
    def keyslot(self, key: Any) -> int:
        """The key's slot, remembered by hash tag: every key of a shard has its tag, so a
        handful of tags cover nearly every command."""
        if isinstance(key, str):
            start = key.find("{")
            if start >= 0:
                end = key.find("}", start + 1)
                if end > start + 1:
                    tag = key[start + 1 : end]
                    slot = self._tag_slots.get(tag)
                    if slot is None:
                        slot = self._tag_slots[tag] = key_slot(tag.encode())
                        if len(self._tag_slots) > _MAX_TAGS:
                            self._tag_slots.clear()
                    return slot
        return int(super().keyslot(key))

    def _slot_of(self, args: tuple[Any, ...]) -> int | None:
        """The slot of a command whose keys are where :data:`_FIRST_KEY` says (the first
        key's: every key of one command is in one slot, or Redis answers CROSSSLOT); None
        for any other command (redis-py's routing then)."""
        command = args[0]
        where = _FIRST_KEY.get(command) if isinstance(command, str) else None
        if where is None or len(args) <= where:
            if isinstance(command, str) and command.upper() in ("XREAD", "XREADGROUP"):
                keys = _stream_keys(args[1:])
                if keys:
                    slots = {self.keyslot(k) for k in keys}
                    if len(slots) == 1:
                        return int(slots.pop())
            return None
        if where == 3:  # EVALSHA / EVAL: sha, number of keys, keys…
            if len(args) < 4 or str(args[2]) == "0":
                return None
        return self.keyslot(args[where])

    async def _determine_slot(self, command: str, *args: Any) -> int:
        slot = self._slot_of((command, *args))
        if slot is not None:
            return slot
        return int(await super()._determine_slot(command, *args))

    # --- recovery -----------------------------------------------------------------------
    async def aclose(self) -> None:
        """Close every connection; from inside one of this client's commands (redis-py's
        own recovery after ``CLUSTERDOWN`` or a failed pipeline), refresh instead."""
        if _IN_COMMAND.get():
            await self.refresh()
            return
        await super().aclose()

    async def refresh(self) -> None:
        """Rebuild the slot table before the next command and drop every connection once
        the command using it ends (free ones now), as redis-py does for one failed node."""
        self._initialize = True
        for node in list(self.nodes_manager.nodes_cache.values()):
            node.update_active_connections_for_reconnect()
            await node.disconnect_free_connections()

    async def retrying(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()``, retried on a transient error (see :func:`transient`) with a backoff,
        for up to ``failover_window`` seconds from the first failure."""
        token = _IN_COMMAND.set(True)
        try:
            pause, deadline = _FIRST_PAUSE, 0.0
            while True:
                try:
                    return await attempt()
                except Exception as exc:
                    if not transient(exc):
                        raise
                    now = time.monotonic()
                    deadline = deadline or now + self.failover_window
                    if now >= deadline:
                        raise
                    if isinstance(exc, ReadOnlyError | SlotNotCoveredError | ClusterError):
                        self._initialize = True  # a stale slot table: rebuild it first
                    await asyncio.sleep(min(pause, deadline - now))
                    pause = min(pause * 2, _LONGEST_PAUSE)
        finally:
            _IN_COMMAND.reset(token)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if "target_nodes" in kwargs:  # a command for a given node: that node or nothing
            return await super().execute_command(*args, **kwargs)
        slot = self._slot_of(args)
        if slot is None:
            return await self.retrying(
                lambda: super(FailoverCluster, self).execute_command(*args, **dict(kwargs))
            )
        return await self.retrying(lambda: self._keyed(slot, args, kwargs))

    async def _keyed(self, slot: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A command of one slot, sent to the slot's master: what redis-py's
        ``execute_command`` does for it (its own immediate retries after a connection
        error, with a new slot table), without its per-command work that changes nothing
        here (policy lookups, the slot computed twice, the keys of a script all hashed):
        that cost the cluster client about 30 µs per command and 50 µs per script call
        over one node's (measured). ``_execute_command`` follows MOVED and ASK as before."""
        attempts = 1 + self.retry.get_retries()
        for left in range(attempts - 1, -1, -1):
            if self._initialize:
                await self.initialize()
            try:
                node = self.nodes_manager.get_node_from_slot(slot)
                return await self._execute_command(node, *args, **kwargs)
            except self.ERRORS_ALLOW_RETRY:
                if not left:
                    raise
        raise AssertionError("unreachable")

    def register_script(self, script: str) -> AsyncScript:
        return _Script(self, script)

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # redis-py's error
        return _FailoverPipeline(self, transaction)

    async def eval_and_wait(
        self, script: str, keys: list[str], args: list[Any], replicas: int, wait_ms: int
    ) -> tuple[Any, int]:
        """``EVAL`` then ``WAIT replicas wait_ms`` on one connection of the master of
        ``keys[0]`` (WAIT counts the writes of its own connection); retried like a command,
        each attempt sending both again to the slot's master of the moment."""
        evaluate = ("EVAL", script, len(keys), *keys, *args)

        async def attempt() -> tuple[Any, int]:
            if self._initialize:
                await self.initialize()
            node, asking = self.get_node_from_key(keys[0]), False
            for _ in range(3):
                # ASKING first when the slot is moving and its key is already on ``node``.
                commands: list[tuple[Any, ...]] = [("ASKING",)] if asking else []
                commands += [evaluate, ("WAIT", replicas, wait_ms)]
                try:
                    *_, result, reached = await _send(node, commands)
                except (ConnectionError, TimeoutError, builtins.ConnectionError):
                    self._initialize = True
                    raise
                if isinstance(result, AskError) and not isinstance(result, MovedError):
                    node, asking = self.get_node(host=result.host, port=result.port), True
                    if node is not None:
                        continue
                if isinstance(result, AskError | ClusterError):
                    self._initialize = True  # moved, or its master is gone: a new table
                    raise TryAgainError(f"{keys[0]!r}: {result}")
                for reply in (result, reached):
                    if isinstance(reply, ConnectionError | TimeoutError):
                        self._initialize = True  # the node died after the command was sent
                    if isinstance(reply, Exception):
                        raise reply
                return result, int(reached)
            raise TryAgainError(f"{keys[0]!r} kept being redirected")

        return await self.retrying(attempt)


class _Script(AsyncScript):
    """A registered script that falls back to EVAL when EVALSHA finds no script: a replica
    just promoted has an empty script cache, and redis-py's one SCRIPT LOAD (to the masters
    of a slot table that may not know of the promotion yet) is not always enough."""

    async def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        try:
            return await super().__call__(keys, args, client)
        except NoScriptError:
            keys, args = list(keys or []), list(args or [])
            target = client if client is not None else self.registered_client
            return await target.eval(self.script, len(keys), *keys, *args)


class _FailoverPipeline(ClusterPipeline):
    """A cluster pipeline retried like a command: on a transient error every command queued
    is queued and sent again (pipelines here read, or write what is safe to write twice).

    A transaction (``transaction=True``: its keys in one slot) is sent as MULTI … EXEC on one
    connection of the slot's master. redis-py's own cluster transactions compute each queued
    command's slot in a new thread with its own event loop, which fails ("bound to a
    different event loop") whenever the slot table is being rebuilt, as in a failover.
    """

    def __init__(self, client: FailoverCluster, transaction: Any = None) -> None:
        super().__init__(client, False)
        self._agw_client = client
        self._agw_transaction = bool(transaction)
        self._agw_queued: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        self._agw_queued.append((args, dict(kwargs)))
        if self._agw_transaction:
            return self
        return super().execute_command(*args, **kwargs)

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        queued, self._agw_queued = self._agw_queued, []
        if not queued:
            return []
        if self._agw_transaction:
            return await self._agw_client.retrying(lambda: self._multi_exec(queued))
        first = True

        async def attempt() -> Any:
            nonlocal first
            if not first:
                for args, kwargs in queued:
                    super(_FailoverPipeline, self).execute_command(*args, **dict(kwargs))
            first = False
            return await super(_FailoverPipeline, self).execute(raise_on_error, allow_redirections)

        return await self._agw_client.retrying(attempt)

    async def _multi_exec(self, queued: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> list[Any]:
        client = self._agw_client
        if client._initialize:
            await client.initialize()
        slot = await client._determine_slot(*queued[0][0])
        node = client.nodes_manager.get_node_from_slot(slot)
        try:
            replies = await _send(node, [("MULTI",), *(args for args, _ in queued), ("EXEC",)])
        except (ConnectionError, TimeoutError, builtins.ConnectionError):
            client._initialize = True
            raise
        for reply in replies:
            if isinstance(reply, AskError | ClusterError):
                client._initialize = True  # the slot moved, or its master is gone
                raise TryAgainError(f"transaction on slot {slot}: {reply}")
            if isinstance(reply, Exception):
                raise reply
        callbacks = node.response_callbacks
        out = []
        for (args, kwargs), reply in zip(queued, replies[-1], strict=True):
            name = str(args[0]).upper()
            out.append(callbacks[name](reply, **kwargs) if name in callbacks else reply)
        return out

    async def reset(self) -> None:
        self._agw_queued = []
        await super().reset()
