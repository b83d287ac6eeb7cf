"""The deployment's key layout: keys left in the old one, and moving them to the new one.

Shards' hash tags were ``{agw:3}`` and are now ``{agw:3:04mz}`` (balanced over the cluster's
slots: :mod:`agent_core.keys`). A process of this version does not see keys under the old
tags, so ``web`` and ``worker`` refuse to start while any is found (:func:`refuse_old_layout`:
one EXISTS per shard's streams and indexes, pipelined), and ``/healthz`` reports them.

:func:`migrate` (``python -m agent_core.migrate_layout``, ``make migrate-layout``) moves every
key of the old layout to its new name: the tag changes, the rest of the name does not, and
neither do run ids and gate ids (they encode only the shard), so Slack buttons already posted
keep working. It never overwrites a key of the new layout. On one node a key moves with
RENAMENX (atomic; it fails if the new name exists). On Redis Cluster the two names are in
different slots: DUMP, RESTORE (with the key's TTL; no REPLACE, so it fails if the new name
exists), then DEL the old name. An old key whose new name exists (a process of the previous
version ran after the upgrade, or a crash came between a RESTORE and its DEL) is merged into
it: streams, sets and sorted sets by :mod:`agent_core.layout_merge`, other keys only if both
hold the same (the old one is then a leftover copy). Any other such key is a conflict: when
processes of this version have run, every old key is checked before anything changes, and the
migration refuses, naming each conflicting key. A marker key (set before the first key moves,
deleted after the last) makes ``web`` and ``worker`` refuse to start meanwhile; running it
again after a crash finishes, and merges nothing twice.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from . import layout_merge, presence
from .exceptions import ConfigError, InvalidState
from .keys import Keys
from .layout_merge import Outcome
from .streams import is_cluster

FIX = "stop every web and worker, run `python -m agent_core.migrate_layout`"
SCAN_COUNT = 1000
MAX_PASSES = 5  # scans of the whole keyspace at most, while keys written meanwhile turn up
MAX_LISTED = 20  # conflicting keys named in a refusal
MERGED = "merged:"  # the merge records' namespace (:func:`merge_record`)


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

    moved: Counter[int] = field(default_factory=Counter)  # shard -> keys (merged ones too)
    merged: Counter[int] = field(default_factory=Counter)  # shard -> keys the new layout had
    left: set[str] = field(default_factory=set)  # old-layout keys of shards >= SHARDS
    conflicts: dict[str, str] = field(default_factory=dict)  # old name -> why it stayed
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.moved.values())


Checkpoint = Callable[[int], Awaitable[None]]
Batch = list[tuple[str, str, int]]  # (old name, new name, shard)


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
    old layout's jobs streams are those of another SHARDS, unless ``force``. Never overwrites
    a key of the new layout: an old key whose new name exists is merged into it
    (:mod:`agent_core.layout_merge`), and when one cannot be, it refuses before changing
    anything, naming every such key. Idempotent: a second run finds nothing to move.
    ``checkpoint(moved)`` is awaited after each batch is copied or merged, before the old
    names are deleted: an exception there stops the migration as a crash would, and running
    it again finishes, merging nothing twice.
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
    if await _new_layout_in_use(redis, keys):
        conflicts = await _conflicts(redis, keys, report, batch)
        if conflicts:
            raise InvalidState(_refusal(keys, conflicts, moved_others=False))
    marker = marker_key(keys)
    if not dry_run:
        await redis.set(marker, str(time.time()))
    for _ in range(MAX_PASSES):
        found = 0
        records: list[str] = []  # merge records seen: stale once no old key is left
        async for pending in _batches(redis, keys, report, batch, records):
            found += len(pending)
            await _move(redis, keys, pending, report, dry_run, checkpoint)
        if not found or dry_run:
            break
    else:
        raise InvalidState(
            f"keys of the old layout kept appearing after {MAX_PASSES} passes: a process of the "
            f"previous version still writes them; stop it and run this again"
        )
    if report.conflicts:  # written meanwhile: the marker stays, processes keep refusing
        raise InvalidState(_refusal(keys, list(report.conflicts.values()), moved_others=True))
    if not dry_run:
        if records:
            await _delete(redis, records)
        await redis.delete(marker)
    report.seconds = time.monotonic() - started
    return report


def merge_record(keys: Keys, new: str, shard: int) -> str:
    """Hash beside a new-layout stream (same slot): the old entries merged into it, while the
    old stream is still there."""
    return keys.ext("layout", MERGED + new[len(keys.tag(shard)) + 1 :], shard)


async def _new_layout_in_use(redis: Redis, keys: Keys) -> bool:
    """Whether processes of this version ran (their streams and indexes exist), or a
    migration stopped midway: only then can an old key's new name exist."""
    async with redis.pipeline(transaction=False) as pipe:
        for name in (marker_key(keys), *_probes(keys)):
            pipe.exists(name)
        return any(await pipe.execute())


async def _batches(
    redis: Redis, keys: Keys, report: Migration, size: int, records: list[str] | None = None
) -> AsyncIterator[Batch]:
    """The old layout's keys with their new names, ``size`` at a time (but those already
    found in conflict); the merge records seen go to ``records``."""
    pending: Batch = []
    async for name in redis.scan_iter(match=_glob(keys.prefix) + ":*", count=SCAN_COUNT):
        target = _new_name(keys, name, report)
        if target is None:
            if records is not None and f":ext:layout:{MERGED}" in name:
                records.append(name)
            continue
        if name in report.conflicts:
            continue
        pending.append((name, target[0], target[1]))
        if len(pending) >= size:
            yield pending
            pending = []
    if pending:
        yield pending


async def _conflicts(redis: Redis, keys: Keys, report: Migration, size: int) -> list[str]:
    """Why each old key whose new name exists cannot be merged into it (reads only)."""
    found: list[str] = []
    async for pending in _batches(redis, keys, report, size):
        async with redis.pipeline(transaction=False) as pipe:
            for _, new, _ in pending:
                pipe.exists(new)
            there = await pipe.execute()
        for (old, new, _), exists in zip(pending, there, strict=True):
            why = await layout_merge.conflict(redis, old, new) if exists else None
            if why is not None:
                found.append(why)
    return found


def _refusal(keys: Keys, lines: list[str], *, moved_others: bool) -> str:
    """The error naming every key that could not be merged, one line each."""
    shown = [f"  {line}" for line in sorted(lines)[:MAX_LISTED]]
    if len(lines) > MAX_LISTED:
        shown.append(f"  … and {len(lines) - MAX_LISTED} more")
    done = (
        "every other key was moved; these stay under their old names"
        if moved_others
        else "nothing was moved"
    )
    return "\n".join(
        [
            f"{len(lines)} key(s) of KEY_PREFIX={keys.prefix} exist in both layouts with "
            f"different contents, which cannot be merged; {done}:",
            *shown,
            "keep one name of each pair (DEL the other; a key that expires soon can be waited "
            "for), then run this again",
        ]
    )


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
    keys: Keys,
    pending: Batch,
    report: Migration,
    dry_run: bool,
    checkpoint: Checkpoint | None,
) -> None:
    """Move a batch: a key whose new name is free is renamed (copied on Redis Cluster),
    never over another; one whose new name exists is merged into it."""
    async with redis.pipeline(transaction=False) as pipe:
        for _, new, _ in pending:
            pipe.exists(new)
        there = await pipe.execute()
    taken = [item for item, exists in zip(pending, there, strict=True) if exists]
    free = [item for item, exists in zip(pending, there, strict=True) if not exists]
    if dry_run:
        report.moved.update(shard for _, _, shard in pending)
        report.merged.update(shard for _, _, shard in taken)
        return
    copied: Batch = []
    if is_cluster(redis):
        copied, busy = await _copy(redis, free)
        moved = copied
    else:
        moved, busy = await _rename(redis, free)
    merged: Batch = []
    for old, new, shard in taken + busy:
        outcome, why = await layout_merge.merge(redis, old, new, merge_record(keys, new, shard))
        if outcome is Outcome.CONFLICT:
            report.conflicts[old] = why
        elif outcome is Outcome.MERGED:
            merged.append((old, new, shard))
        # GONE: nothing left to do; MOVE: the new name vanished, the next pass moves it.
    report.moved.update(shard for _, _, shard in moved + merged)
    report.merged.update(shard for _, _, shard in merged)
    if checkpoint is not None:
        await checkpoint(report.total)
    await _delete(redis, [old for old, _, _ in copied + merged])
    # After the old names: a record outlives its old stream, never the reverse.
    await _delete(redis, [merge_record(keys, new, shard) for _, new, shard in merged])


async def _delete(redis: Redis, names: list[str]) -> None:
    if names:
        async with redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.delete(name)
            await pipe.execute()


async def _rename(redis: Redis, pending: Batch) -> tuple[Batch, Batch]:
    """RENAMENX each old key (one node): the ones renamed, and the ones whose new name
    exists (created meanwhile). A key gone meanwhile is in neither."""
    if not pending:
        return [], []
    async with redis.pipeline(transaction=False) as pipe:
        for old, new, _ in pending:
            pipe.renamenx(old, new)
        replies = await pipe.execute(raise_on_error=False)
    renamed, busy = [], []
    for item, reply in zip(pending, replies, strict=True):
        if isinstance(reply, ResponseError):
            if "no such key" not in str(reply).lower():
                raise reply
        elif reply:
            renamed.append(item)
        else:
            busy.append(item)
    return renamed, busy


async def _copy(redis: Redis, pending: Batch) -> tuple[Batch, Batch]:
    """DUMP and RESTORE (TTL kept, never REPLACE) each old key under its new name: the ones
    copied, and the ones whose new name exists (created meanwhile). A key gone meanwhile is
    in neither."""
    if not pending:
        return [], []
    async with redis.pipeline(transaction=False) as pipe:
        for old, _, _ in pending:
            pipe.pttl(old)
            pipe.dump(old)
        replies = await pipe.execute()
    tried = []
    async with redis.pipeline(transaction=False) as pipe:
        for i, item in enumerate(pending):
            ttl, data = replies[2 * i], replies[2 * i + 1]
            if data is None or ttl == -2:
                continue
            # PTTL -1: no TTL (RESTORE's 0); 0: due now, kept for 1 ms rather than forever.
            pipe.restore(item[1], 0 if ttl == -1 else max(int(ttl), 1), data)
            tried.append(item)
        restored = await pipe.execute(raise_on_error=False) if tried else []
    copied, busy = [], []
    for item, reply in zip(tried, restored, strict=True):
        if isinstance(reply, ResponseError):
            if "busykey" not in str(reply).lower():
                raise reply
            busy.append(item)
        else:
            copied.append(item)
    return copied, busy
