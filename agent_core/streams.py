"""Consumer-group reading of Redis streams: at-least-once, with dead consumers' work claimed.

One :class:`StreamConsumer` reads one group on one or more streams (the shards' streams: on
one Redis node a single XREADGROUP reads them all, and COUNT applies to each stream, so no
shard starves; on Redis Cluster, where one command cannot span slots, a process runs one
consumer per shard). Messages are acknowledged by the caller only after their effect is
persisted. A message left pending by a consumer that died is claimed (XAUTOCLAIM) once it has
been idle for ``claim_idle_ms``; a consumer still working on a message calls
:meth:`StreamConsumer.touch` to reset its idle time, so live work is never stolen. A message
delivered more than ``max_deliveries`` times is handed back flagged so that the caller can
dead-letter it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import ResponseError


@dataclass(frozen=True)
class StreamMessage:
    """One stream entry as delivered to this consumer."""

    id: str
    fields: dict[str, str]
    deliveries: int = 1
    stream: str = ""


def is_cluster(redis: Redis) -> bool:
    """Whether ``redis`` is redis-py's cluster client (no command may span two slots)."""
    return hasattr(redis, "get_nodes")


def stream_groups(redis: Redis, streams: Sequence[str]) -> list[list[str]]:
    """How to split ``streams`` between readers: all in one on a single node, one per
    stream on Redis Cluster."""
    if is_cluster(redis):
        return [[s] for s in streams]
    return [list(streams)]


class StreamConsumer:
    """One consumer of one consumer group on one or more streams."""

    def __init__(
        self,
        redis: Redis,
        streams: Sequence[str],
        group: str,
        consumer: str,
        *,
        dead_stream: Callable[[str], str],
        claim_idle_ms: int = 30_000,
        max_deliveries: int = 5,
        delete_acked: bool = False,
    ) -> None:
        if not streams:
            raise ValueError("no stream to read")
        self.redis = redis
        self.streams = list(streams)
        self.group = group
        self.consumer = consumer
        self.dead_stream = dead_stream
        self.claim_idle_ms = claim_idle_ms
        self.max_deliveries = max_deliveries
        # Only for streams read by this one group (jobs): an acknowledged entry is then
        # never needed again, so it is deleted instead of growing the stream forever.
        self.delete_acked = delete_acked
        self._group_ready = False
        self._next_claim = 0.0
        self._claim_from = 0  # the stream the next claim pass starts with (round robin)

    async def ensure_group(self) -> None:
        """Create the group (and the streams) if missing; new groups start at the beginning."""
        for stream in self.streams:
            try:
                await self.redis.xgroup_create(stream, self.group, id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._group_ready = True

    async def read(self, count: int = 10, block_ms: int = 1000) -> list[StreamMessage]:
        """Stale messages of dead consumers first, then new ones (blocking up to block_ms)."""
        if not self._group_ready:
            await self.ensure_group()
        try:
            claimed = await self._claim_stale(count)
            if claimed:
                return claimed
            reply = await self.redis.xreadgroup(
                self.group,
                self.consumer,
                dict.fromkeys(self.streams, ">"),
                count=count,
                block=block_ms,
            )
        except ResponseError as exc:
            if "NOGROUP" in str(exc):  # a stream deleted (or Redis lost it): recreate, read again
                self._group_ready = False
                return []
            raise
        out: list[StreamMessage] = []
        for stream, entries in reply or []:
            for msg_id, fields in entries:
                if fields is not None:
                    out.append(StreamMessage(msg_id, fields, 1, stream))
        return out

    async def _claim_stale(self, count: int) -> list[StreamMessage]:
        now = time.monotonic()
        if now < self._next_claim:
            return []
        self._next_claim = now + max(self.claim_idle_ms / 4000, 0.05)
        n = len(self.streams)
        for i in range(n):
            stream = self.streams[(self._claim_from + i) % n]
            found = await self._claim_from_stream(stream, count)
            if found:
                self._claim_from = (self._claim_from + i + 1) % n
                self._next_claim = 0.0  # there may be more: look again at the next read
                return found
        return []

    async def _claim_from_stream(self, stream: str, count: int) -> list[StreamMessage]:
        reply = await self.redis.xautoclaim(
            stream, self.group, self.consumer, self.claim_idle_ms, "0-0", count=count
        )
        entries = [(i, f) for i, f in reply[1] if f is not None]
        if not entries:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for msg_id, _ in entries:
                pipe.xpending_range(stream, self.group, msg_id, msg_id, 1)
            pendings = await pipe.execute()
        out = []
        for (msg_id, fields), pend in zip(entries, pendings, strict=True):
            deliveries = int(pend[0]["times_delivered"]) if pend else 1
            out.append(StreamMessage(msg_id, fields, deliveries, stream))
        return out

    def _stream_of(self, msg: StreamMessage) -> str:
        return msg.stream or self.streams[0]

    async def ack(self, msg: StreamMessage) -> None:
        """Acknowledge a message whose effect is persisted."""
        stream = self._stream_of(msg)
        if not self.delete_acked:
            await self.redis.xack(stream, self.group, msg.id)
            return
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xack(stream, self.group, msg.id)
            pipe.xdel(stream, msg.id)
            await pipe.execute()

    async def ack_many(self, msgs: list[StreamMessage]) -> None:
        """Acknowledge several messages: one XACK (and XDEL) per stream, in one round trip on
        a single node."""
        by_stream: dict[str, list[str]] = {}
        for msg in msgs:
            by_stream.setdefault(self._stream_of(msg), []).append(msg.id)
        if not by_stream:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream, ids in by_stream.items():
                pipe.xack(stream, self.group, *ids)
                if self.delete_acked:
                    pipe.xdel(stream, *ids)
            await pipe.execute()

    async def touch(self, msg: StreamMessage) -> None:
        """Reset the idle time of a message this consumer is still working on."""
        await self.redis.xclaim(
            self._stream_of(msg), self.group, self.consumer, 0, [msg.id], justid=True
        )

    async def touch_many(self, msgs: list[StreamMessage]) -> None:
        """:meth:`touch` for several messages: one XCLAIM per stream, in one round trip on a
        single node."""
        by_stream: dict[str, list[str]] = {}
        for msg in msgs:
            by_stream.setdefault(self._stream_of(msg), []).append(msg.id)
        if not by_stream:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for stream, ids in by_stream.items():
                pipe.xclaim(stream, self.group, self.consumer, 0, ids, justid=True)
            await pipe.execute()

    async def dead_letter(self, msg: StreamMessage, reason: str) -> None:
        """Move a message to its stream's dead-letter stream and acknowledge it, atomically
        (the two streams share the shard's hash tag)."""
        stream = self._stream_of(msg)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(
                self.dead_stream(stream),
                {**msg.fields, "_id": msg.id, "_group": self.group, "_reason": reason[:2000]},
                maxlen=100_000,
                approximate=True,
            )
            pipe.xack(stream, self.group, msg.id)
            if self.delete_acked:
                pipe.xdel(stream, msg.id)
            await pipe.execute()
