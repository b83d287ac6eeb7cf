"""Merging a key of the old layout into the same key of the new layout, which already exists.

A process of the previous version that ran after the upgrade (even for a moment) writes keys
in the old layout beside the live ones of the new: its consumer groups' streams, the runs it
took, their index entries. The migration never overwrites a key of the new layout; it calls
:func:`merge`, which keeps the new key and adds the old one's contents where that is
well-defined:

- a stream: the old entries that some consumer group of the old stream has not handled yet
  (pending, or not delivered: every entry when the old stream has no group) are appended to
  the new stream, in their order, with new ids. The new stream's entries, ids, consumer groups
  and pending entries stay as they are, and its groups deliver the appended entries as new
  ones (a group created later starts at the beginning and sees them too). Delivery is
  at-least-once anyway: an entry one old group had handled and another had not is delivered
  again to every group. The script that appends an entry records it (old id → new id) in a
  hash beside the new stream, so a run that stops before deleting the old stream appends
  nothing twice when run again; an entry the new stream already holds under the same id with
  the same fields (a whole copy of the key, made by a run that stopped before deleting the
  old one) is not appended either.
- a set: the union. A sorted set: the union, a member in both keeping the lower score (the
  earlier deadline, start or finish time).
- a hash, a string, a list (a run, a gate, a turn, a history, an idempotency key, a Slack
  record): left to a person unless both hold the same contents (then the old key is a
  leftover copy and goes). Two different runs under one id cannot be merged.

Both unions are idempotent, so a crash between a merge and the deletion of the old key is
harmless too. When processes of this version have run, the migration checks every old key
whose new name exists with :func:`conflict` before it changes anything.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from .keys import Keys
from .scripts import Scripts

CHUNK = 500  # members or pending entries per command
STREAM_CHUNK = 100  # stream entries per script call (an event can be a few kB)

MERGEABLE = ("stream", "set", "zset")


class Outcome(enum.Enum):
    MERGED = "merged"  # the old key's contents are in the new one: delete the old one
    GONE = "gone"  # the old key vanished meanwhile: nothing to do
    MOVE = "move"  # the new key vanished meanwhile: move the old one in a later pass
    CONFLICT = "conflict"  # left as it is: a person decides


async def conflict(redis: Redis, old: str, new: str) -> str | None:
    """One line on why ``old`` cannot be merged into ``new``, or None when it can (or when
    either is gone). Reads only."""
    return (await _types(redis, old, new))[2]


async def _types(redis: Redis, old: str, new: str) -> tuple[str, str, str | None]:
    """The two keys' types, and why they cannot be merged (or None)."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.type(old)
        pipe.type(new)
        pipe.pttl(old)
        old_type, new_type, ttl = await pipe.execute()
    if "none" in (old_type, new_type) or (old_type == new_type and old_type in MERGEABLE):
        return old_type, new_type, None
    if old_type == new_type and await _same_contents(redis, old, new, old_type):
        return old_type, new_type, None
    expires = f", expires in {max(int(ttl), 0) / 1000:.0f} s" if int(ttl) >= 0 else ""
    why = f"{old} ({old_type}{expires}) and {new} ({new_type}) " + (
        "differ" if old_type == new_type else "are of different types"
    )
    return old_type, new_type, why


async def _same_contents(redis: Redis, old: str, new: str, kind: str) -> bool:
    if kind not in ("string", "hash", "list"):  # a type this project does not write: never guess
        return False
    return bool(await _contents(redis, old, kind) == await _contents(redis, new, kind))


async def _contents(redis: Redis, name: str, kind: str) -> object:
    if kind == "string":
        return await redis.get(name)
    if kind == "hash":
        return await redis.hgetall(name)
    return await redis.lrange(name, 0, -1)


async def merge(redis: Redis, old: str, new: str, record: str) -> tuple[Outcome, str]:
    """Merge ``old`` into ``new`` (see the module); the outcome, and for a conflict its line.
    ``record``: the hash beside ``new`` (same slot) where appended stream entries are noted;
    delete it after ``old``."""
    old_type, new_type, why = await _types(redis, old, new)
    if why is not None:
        return Outcome.CONFLICT, why
    if old_type == "none":
        return Outcome.GONE, ""
    if new_type == "none":
        return Outcome.MOVE, ""
    if old_type == "stream":
        await _merge_stream(redis, old, new, record)
    elif old_type == "set":
        cursor = 0
        while True:
            cursor, members = await redis.sscan(old, cursor, count=CHUNK)
            if members:
                await redis.sadd(new, *members)
            if not cursor:
                break
    elif old_type == "zset":
        cursor = 0
        while True:
            cursor, scored = await redis.zscan(old, cursor, count=CHUNK)
            if scored:
                await redis.zadd(new, dict(scored), lt=True)
            if not cursor:
                break
    # Any other type: conflict() found both the same, so the old key is a leftover copy.
    return Outcome.MERGED, ""


def _parse_id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


async def _unhandled(redis: Redis, stream: str) -> Callable[[str], bool]:
    """Whether an entry of ``stream`` is still to be handled by one of its consumer groups
    (pending in it, or after its last delivered id); every entry when it has no group."""
    try:
        groups = await redis.xinfo_groups(stream)
    except ResponseError:  # gone meanwhile
        return lambda _: False
    if not groups:
        return lambda _: True
    floor = min(_parse_id(str(g["last-delivered-id"])) for g in groups)
    pending: set[str] = set()
    for g in groups:
        if not int(g.get("pending") or 0):
            continue
        start = "-"
        while True:
            page = await redis.xpending_range(stream, g["name"], start, "+", CHUNK)
            pending.update(str(p["message_id"]) for p in page)
            if len(page) < CHUNK:
                break
            start = "(" + str(page[-1]["message_id"])
    return lambda entry_id: _parse_id(entry_id) > floor or entry_id in pending


async def _merge_stream(redis: Redis, old: str, new: str, record: str) -> None:
    keep = await _unhandled(redis, old)
    scripts = Scripts(redis, Keys())
    start = "-"
    while True:
        entries = await redis.xrange(old, start, "+", count=STREAM_CHUNK)
        args: list[str] = []
        for entry_id, fields in entries:
            if fields and keep(entry_id):
                flat = [x for kv in fields.items() for x in kv]
                args += [entry_id, str(len(flat)), *flat]
        if args:
            await scripts.merge_stream(new, record, args)
        if len(entries) < STREAM_CHUNK:
            break
        start = "(" + entries[-1][0]
