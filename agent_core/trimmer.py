"""Keeping the streams small without losing an unread entry.

Events are appended without MAXLEN. :func:`trim_events` removes only the entries that every
consumer group has read and acknowledged (nothing older than any group's oldest pending
entry, nothing it has not been delivered yet). ``EVENTS_MAXLEN`` is a backstop for a group
that was abandoned: past it the oldest entries go, and the log names the lagging groups.

:func:`forget_dead_consumers` removes consumers (one per process that ever read) that have
nothing pending and have been idle for an hour, so the groups do not grow forever.
"""

from __future__ import annotations

import logging

from redis.asyncio import Redis
from redis.exceptions import ResponseError

log = logging.getLogger(__name__)

DEAD_CONSUMER_IDLE_MS = 3_600_000


def _parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _next_id(entry_id: str) -> str:
    ms, seq = _parse_id(entry_id)
    return f"{ms}-{seq + 1}"


async def trim_events(redis: Redis, stream: str, hard_cap: int) -> int:
    """Trim entries every group has acknowledged; how many were removed."""
    try:
        groups = await redis.xinfo_groups(stream)
    except ResponseError:  # no such stream yet
        return 0
    if not groups:
        return 0  # nobody has read anything yet: keep everything for the first reader
    floor: tuple[int, int] | None = None
    for g in groups:
        if int(g.get("pending") or 0) > 0:
            summary = await redis.xpending(stream, g["name"])
            need = str(summary.get("min") or g["last-delivered-id"])
        else:
            need = _next_id(str(g["last-delivered-id"]))
        parsed = _parse_id(need)
        floor = parsed if floor is None or parsed < floor else floor
    assert floor is not None
    removed = int(await redis.xtrim(stream, minid=f"{floor[0]}-{floor[1]}", approximate=False) or 0)
    length = int(await redis.xlen(stream))
    if length > hard_cap:
        lagging = [
            str(g["name"])
            for g in groups
            if int(g.get("pending") or 0) > 0 or int(g.get("lag") or 0) > 0
        ]
        dropped = int(await redis.xtrim(stream, maxlen=hard_cap, approximate=False) or 0)
        removed += dropped
        log.error(
            "%s: %d unread entries dropped at EVENTS_MAXLEN=%d; lagging groups: %s",
            stream,
            dropped,
            hard_cap,
            ", ".join(lagging) or "?",
        )
    return removed


async def forget_dead_consumers(
    redis: Redis, stream: str, idle_ms: int = DEAD_CONSUMER_IDLE_MS
) -> int:
    """Delete consumers with nothing pending, idle for ``idle_ms``; how many went."""
    try:
        groups = await redis.xinfo_groups(stream)
    except ResponseError:
        return 0
    gone = 0
    for g in groups:
        for c in await redis.xinfo_consumers(stream, g["name"]):
            if int(c.get("pending") or 0) == 0 and int(c.get("idle") or 0) >= idle_ms:
                # XGROUP DELCONSUMER drops the consumer's pending entries too: only ever
                # called for one with none.
                await redis.xgroup_delconsumer(stream, g["name"], c["name"])
                gone += 1
    return gone
