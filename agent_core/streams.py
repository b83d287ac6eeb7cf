"""Consumer-group reading of a Redis stream: at-least-once, with dead consumers' work claimed.

Messages are acknowledged by the caller only after their effect is persisted. A message left
pending by a consumer that died is claimed (XAUTOCLAIM) once it has been idle for
``claim_idle_ms``; a consumer still working on a message calls :meth:`StreamConsumer.touch`
to reset its idle time, so live work is never stolen. A message delivered more than
``max_deliveries`` times is handed back flagged so that the caller can dead-letter it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import ResponseError


@dataclass(frozen=True)
class StreamMessage:
    """One stream entry as delivered to this consumer."""

    id: str
    fields: dict[str, str]
    deliveries: int = 1


class StreamConsumer:
    """One consumer of one consumer group on one stream."""

    def __init__(
        self,
        redis: Redis,
        stream: str,
        group: str,
        consumer: str,
        *,
        dead_stream: str,
        claim_idle_ms: int = 30_000,
        max_deliveries: int = 5,
        delete_acked: bool = False,
    ) -> None:
        self.redis = redis
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.dead_stream = dead_stream
        self.claim_idle_ms = claim_idle_ms
        self.max_deliveries = max_deliveries
        # Only for a stream read by this one group (jobs): an acknowledged entry is then
        # never needed again, so it is deleted instead of growing the stream forever.
        self.delete_acked = delete_acked
        self._group_ready = False
        self._next_claim = 0.0

    async def ensure_group(self) -> None:
        """Create the group (and the stream) if missing; new groups start at the beginning."""
        try:
            await self.redis.xgroup_create(self.stream, self.group, id="0", mkstream=True)
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
                self.group, self.consumer, {self.stream: ">"}, count=count, block=block_ms
            )
        except ResponseError as exc:
            if "NOGROUP" in str(exc):  # stream deleted (or Redis lost it): recreate, read again
                self._group_ready = False
                return []
            raise
        out: list[StreamMessage] = []
        for _stream, entries in reply or []:
            for msg_id, fields in entries:
                if fields is not None:
                    out.append(StreamMessage(msg_id, fields, 1))
        return out

    async def _claim_stale(self, count: int) -> list[StreamMessage]:
        now = time.monotonic()
        if now < self._next_claim:
            return []
        self._next_claim = now + max(self.claim_idle_ms / 4000, 0.05)
        reply = await self.redis.xautoclaim(
            self.stream, self.group, self.consumer, self.claim_idle_ms, "0-0", count=count
        )
        entries = [(i, f) for i, f in reply[1] if f is not None]
        if not entries:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for msg_id, _ in entries:
                pipe.xpending_range(self.stream, self.group, msg_id, msg_id, 1)
            pendings = await pipe.execute()
        out = []
        for (msg_id, fields), pend in zip(entries, pendings, strict=True):
            deliveries = int(pend[0]["times_delivered"]) if pend else 1
            out.append(StreamMessage(msg_id, fields, deliveries))
        self._next_claim = 0.0  # there may be more: look again at the next read
        return out

    async def ack(self, msg_id: str) -> None:
        """Acknowledge a message whose effect is persisted."""
        if not self.delete_acked:
            await self.redis.xack(self.stream, self.group, msg_id)
            return
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xack(self.stream, self.group, msg_id)
            pipe.xdel(self.stream, msg_id)
            await pipe.execute()

    async def touch(self, msg_id: str) -> None:
        """Reset the idle time of a message this consumer is still working on."""
        await self.redis.xclaim(self.stream, self.group, self.consumer, 0, [msg_id], justid=True)

    async def dead_letter(self, msg: StreamMessage, reason: str) -> None:
        """Move a message to the dead-letter stream and acknowledge it, atomically."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.xadd(
                self.dead_stream,
                {**msg.fields, "_id": msg.id, "_group": self.group, "_reason": reason[:2000]},
                maxlen=100_000,
                approximate=True,
            )
            pipe.xack(self.stream, self.group, msg.id)
            if self.delete_acked:
                pipe.xdel(self.stream, msg.id)
            await pipe.execute()
