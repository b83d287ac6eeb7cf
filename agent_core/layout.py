"""The deployment's key layout: keys left in the old one, and moving them to the new one.

Shards' hash tags were ``{agw:3}`` and are now ``{agw:3:04mz}`` (balanced over the cluster's
slots: :mod:`agent_core.keys`). A process of this version does not see keys under the old
tags, so ``web`` and ``worker`` refuse to start while any is found (:func:`refuse_old_layout`:
one EXISTS per shard's streams and indexes, pipelined), and ``/healthz`` reports them.

:func:`migrate` (``python -m agent_core.migrate_layout``, ``make migrate-layout``) moves every
key of the old layout to its new name: the tag changes, the rest of the name does not, and
neither do run ids and gate ids (they encode only the shard), so Slack buttons already posted
keep working. On one node a key moves with RENAME (atomic). On Redis Cluster the two names
are in different slots: DUMP, RESTORE (with the key's TTL; REPLACE), then DEL the old name.
A crash between RESTORE and DEL leaves both names; running it again copies the old one over
the new once more and deletes it, which is safe because no process writes under the new
names until the move has finished: a marker key (set before the first key moves, deleted
after the last) makes ``web`` and ``worker`` refuse to start meanwhile.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from . import presence
from .exceptions import ConfigError, InvalidState
from .keys import Keys
from .streams import is_cluster

FIX = "stop every web and worker, run `python -m agent_core.migrate_layout` (`make migrate-layout`)"
SCAN_COUNT = 1000
MAX_PASSES = 5  # scans of the whole keyspace at most, while keys written meanwhile turn up


def old_keys(keys: Keys) -> Keys:
    """The same deployment's keys in the old layout (``{prefix:N}`` tags)."""
    return Keys(keys.prefix, keys.shards, legacy=True)


def marker_key(keys: Keys) -> str:
    """String: set while a migration of the deployment's keys has not finished."""
    return keys.ext("layout", "migrating")


def _probes(old: Keys) -> list[str]:
    """The keys every deployment with runs has in each shard."""
    return [
        name
        for shard in old.all_shards()
        for name in (
            old.jobs(shard),
            old.events(shard),
            old.active(shard),
            old.finished(shard),
            old.deadlines(shard),
        )
    ]


async def old_layout_problem(redis: Redis, keys: Keys) -> str | None:
    """One line when Redis holds this deployment's keys in the old layout, or a migration
    of them has not finished; None otherwise (and for keys of the old layout themselves, which
    is the oldest). Raises what Redis raises."""
    if keys.legacy:
        return None
    probes = [marker_key(keys), *_probes(old_keys(keys))]
    async with redis.pipeline(transaction=False) as pipe:
        for name in probes:
            pipe.exists(name)
        found = await pipe.execute()
    prefix = keys.prefix
    if found[0]:
        return (
            f"KEY_PREFIX={prefix}: moving the keys to the new layout did not finish; {FIX} "
            "again, then start them"
        )
    if any(found[1:]):
        return (
            f"KEY_PREFIX={prefix}: Redis holds runs in the old key layout ({{{prefix}:N}} "
            f"hash tags), which this version would not see; {FIX} once, then start them again"
        )
    return None


async def refuse_old_layout(redis: Redis, keys: Keys) -> None:
    """Raise :class:`ConfigError` (one line naming the fix) when :func:`old_layout_problem`
    finds something."""
    problem = await old_layout_problem(redis, keys)
    if problem is not None:
        raise ConfigError(problem)


@dataclass
class Migration:
    """What :func:`migrate` moved (or, dry, would move)."""

    moved: Counter[int] = field(default_factory=Counter)  # shard -> keys
    left: set[str] = field(default_factory=set)  # old-layout keys of shards >= SHARDS
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.moved.values())


Checkpoint = Callable[[int], Awaitable[None]]


async def migrate(
    redis: Redis,
    keys: Keys,
    *,
    force: bool = False,
    dry_run: bool = False,
    batch: int = 200,
    checkpoint: Checkpoint | None = None,
) -> Migration:
    """Move every key of ``keys``' deployment from the old layout to the new one.

    Refuses (:class:`InvalidState`) while workers are alive under this prefix, or when the
    old layout's jobs streams are those of another SHARDS, unless ``force``. Idempotent: a second run finds nothing to move. ``checkpoint(moved)`` is
    awaited after each batch is copied (on Redis Cluster, before the old names are deleted):
    an exception there stops the migration as a crash would, and running it again finishes.
    """
    started = time.monotonic()
    if not force:
        alive = await presence.live_workers(redis, keys)
        if alive:
            names = ", ".join(w.name for w in alive[:5]) + (" …" if len(alive) > 5 else "")
            grace = max(w.every for w in alive) * presence.STALE_AFTER
            raise InvalidState(
                f"{len(alive)} worker(s) alive under KEY_PREFIX={keys.prefix} ({names}): stop "
                f"every web and worker first (a stopped worker counts as alive for up to "
                f"{grace:.0f} s), or pass --force"
            )
        other = await _other_shards(redis, keys)
        if other is not None:
            raise InvalidState(other)
    report = Migration()
    marker = marker_key(keys)
    if not dry_run:
        await redis.set(marker, str(time.time()))
    for _ in range(MAX_PASSES):
        found = 0
        pending: list[tuple[str, str, int]] = []
        async for name in redis.scan_iter(match=_glob(keys.prefix) + ":*", count=SCAN_COUNT):
            target = _new_name(keys, name, report)
            if target is None:
                continue
            found += 1
            pending.append((name, target[0], target[1]))
            if len(pending) >= batch:
                await _move(redis, pending, report, dry_run, checkpoint)
                pending = []
        await _move(redis, pending, report, dry_run, checkpoint)
        if not found or dry_run:
            break
    else:
        raise InvalidState(
            f"keys of the old layout kept appearing after {MAX_PASSES} passes: a process of the "
            f"previous version still writes them; stop it and run this again"
        )
    if not dry_run:
        await redis.delete(marker)
    report.seconds = time.monotonic() - started
    return report


async def _other_shards(redis: Redis, keys: Keys) -> str | None:
    """Why the deployment looks like it ran with another SHARDS, or None. Its workers create
    every shard's jobs stream; the new tags depend on SHARDS, so keys moved with a wrong one
    would be out of sight of the deployment's processes."""
    old, beyond = old_keys(keys), Keys(keys.prefix, keys.shards + 1, legacy=True)
    async with redis.pipeline(transaction=False) as pipe:
        for shard in keys.all_shards():
            pipe.exists(old.jobs(shard))
            pipe.exists(keys.jobs(shard))  # moved already, by a run that stopped midway
        pipe.exists(beyond.jobs(keys.shards))
        found = await pipe.execute()
    present = sum(1 for i in range(keys.shards) if found[2 * i] or found[2 * i + 1])
    if found[-1] or 0 < present < keys.shards:
        seen = f"{keys.shards} shards and more" if found[-1] else f"{present} shards"
        return (
            f"the jobs streams of KEY_PREFIX={keys.prefix} are those of {seen}, not of "
            f"SHARDS={keys.shards}: run this with the SHARDS the deployment runs with (the new "
            "tags depend on it), or pass --force"
        )
    return None


def _glob(prefix: str) -> str:
    """``{prefix`` as a SCAN pattern (glob characters escaped)."""
    return "{" + "".join("\\" + c if c in "*?[]\\" else c for c in prefix)


def _new_name(keys: Keys, name: str, report: Migration) -> tuple[str, int] | None:
    """The new name of an old-layout key and its shard; None for any other key."""
    head = "{" + keys.prefix + ":"
    end = name.find("}")
    number = name[len(head) : end]
    if not name.startswith(head) or not (number.isascii() and number.isdigit()):
        return None  # the new layout's tags (a ':' after the number), the playground's, …
    shard = int(number)
    if str(shard) != number:
        return None
    if shard >= keys.shards:
        report.left.add(name)
        return None
    return keys.tag(shard) + name[end + 1 :], shard


async def _move(
    redis: Redis,
    pending: list[tuple[str, str, int]],
    report: Migration,
    dry_run: bool,
    checkpoint: Checkpoint | None,
) -> None:
    if not pending:
        return
    if dry_run:
        report.moved.update(shard for _, _, shard in pending)
        return
    if is_cluster(redis):
        moved = await _copy(redis, pending)
    else:
        async with redis.pipeline(transaction=False) as pipe:
            for old, new, _ in pending:
                pipe.rename(old, new)
            replies = await pipe.execute(raise_on_error=False)
        moved = []
        for item, reply in zip(pending, replies, strict=True):
            if isinstance(reply, ResponseError) and "no such key" not in str(reply).lower():
                raise reply
            if not isinstance(reply, Exception):
                moved.append(item)
    report.moved.update(shard for _, _, shard in moved)
    if checkpoint is not None:
        await checkpoint(report.total)
    if is_cluster(redis) and moved:
        async with redis.pipeline(transaction=False) as pipe:
            for old, _, _ in moved:
                pipe.delete(old)
            await pipe.execute()


async def _copy(redis: Redis, pending: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """DUMP and RESTORE (TTL kept, REPLACE) each old key under its new name; the ones
    copied (a key gone meanwhile is not)."""
    async with redis.pipeline(transaction=False) as pipe:
        for old, _, _ in pending:
            pipe.pttl(old)
            pipe.dump(old)
        replies = await pipe.execute()
    copied = []
    async with redis.pipeline(transaction=False) as pipe:
        for i, item in enumerate(pending):
            ttl, data = replies[2 * i], replies[2 * i + 1]
            if data is None or ttl == -2:
                continue
            # PTTL -1: no TTL (RESTORE's 0); 0: due now, kept for 1 ms rather than forever.
            pipe.restore(item[1], 0 if ttl == -1 else max(int(ttl), 1), data, replace=True)
            copied.append(item)
        if copied:
            await pipe.execute()
    return copied
