"""Reading the events stream (run and gate events) as a consumer group."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from pydantic import ValidationError
from redis.asyncio import Redis

from .keys import Keys
from .models import Event, EventType
from .streams import StreamConsumer, StreamMessage

log = logging.getLogger(__name__)


def parse_event(msg: StreamMessage) -> Event:
    """Turn a stream entry into an :class:`Event`; raises ValueError if malformed."""
    try:
        return Event(
            id=msg.id,
            stream=msg.stream,
            type=EventType(msg.fields["type"]),
            run_id=msg.fields["run_id"],
            data=json.loads(msg.fields.get("data") or "{}"),
        )
    except (KeyError, ValueError, ValidationError) as exc:
        raise ValueError(f"malformed event {msg.id}: {exc}") from exc


class EventConsumer:
    """A member of a consumer group on the events streams (e.g. one Slack ``web`` replica):
    every shard's, or those of ``shards`` (on Redis Cluster, one consumer per shard).

    Each event is delivered to one member of the group; events left unacknowledged by a member
    that died are claimed by another after ``claim_idle_ms``. Handlers must be idempotent:
    delivery is at least once.
    """

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        group: str,
        consumer: str,
        *,
        shards: Sequence[int] | None = None,
        claim_idle_ms: int = 30_000,
        max_deliveries: int = 10,
    ) -> None:
        chosen = keys.all_shards() if shards is None else shards
        self._stream = StreamConsumer(
            redis,
            [keys.events(s) for s in chosen],
            group,
            consumer,
            dead_stream=lambda stream: keys.dead_events(keys.shard_of_stream(stream)),
            claim_idle_ms=claim_idle_ms,
            max_deliveries=max_deliveries,
        )

    async def read(self, count: int = 50, block_ms: int = 1000) -> list[Event]:
        """The next events for this consumer; malformed or poison entries are dead-lettered."""
        out: list[Event] = []
        for msg in await self._stream.read(count, block_ms):
            if msg.deliveries > self._stream.max_deliveries:
                log.error("event %s failed %d times; dead-lettered", msg.id, msg.deliveries - 1)
                await self._stream.dead_letter(msg, "too many deliveries")
                continue
            try:
                out.append(parse_event(msg))
            except ValueError as exc:
                log.error("%s; dead-lettered", exc)
                await self._stream.dead_letter(msg, str(exc))
        return out

    async def ack(self, event: Event) -> None:
        """Acknowledge an event once it has been handled."""
        await self._stream.ack(StreamMessage(event.id, {}, 1, event.stream))

    async def ack_many(self, events: list[Event]) -> None:
        """Acknowledge several handled events at once."""
        await self._stream.ack_many([StreamMessage(e.id, {}, 1, e.stream) for e in events])

    async def touch(self, event: Event) -> None:
        """Keep a slow event from being claimed by another member."""
        await self._stream.touch(StreamMessage(event.id, {}, 1, event.stream))

    async def touch_many(self, events: list[Event]) -> None:
        """Keep events this member still holds from being claimed (one round trip)."""
        await self._stream.touch_many([StreamMessage(e.id, {}, 1, e.stream) for e in events])
