"""The audit trail: every gate event, kept for ``AUDIT_RETENTION`` whatever happens to runs.

Each shard has an audit stream (:meth:`Keys.audit`), appended inside the scripts that open,
decide, remind, close and execute gated calls (``lua/include/audit.lua``), so an entry is
written exactly when its event happens, once. An entry's fields are ``kind``, ``gate_id``,
``run_id``, ``call_id``, ``tool``, ``args_hash``, ``by``, ``at``, ``reason``, ``more`` (a JSON
object of the few fields of its kind: ``group``, ``to``, ``after_cancel``; '' for none: every
entry has the same field names, which a stream stores once per node) and last ``prev``: the SHA-1 of the
previous entry's canonical encoding (:func:`encode`). The head hash (:meth:`Keys.audit_head`)
keeps the last entry's ``id`` and ``hash``; trimming records an ``anchor``, the ``prev`` of
the first entry kept. :func:`verify_shard` walks a chain from its anchor to its head: an
entry removed, altered or inserted breaks it. Keeping the heads outside Redis
(:func:`read_heads`, ``agent-audit heads``) detects a chain rewritten as a whole.

Kinds: ``opened``, ``counted`` (an approval towards a quorum), ``approved``, ``denied``,
``expired``, ``closed`` (its run cancelled or failed), ``reminded``, ``escalated``, and a
gated call's outcome: ``executed``, ``failed``, ``in_doubt``, ``not_run``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

from redis.asyncio import Redis

from .keys import Keys
from .scripts import Scripts

KINDS = (
    "opened",
    "counted",
    "approved",
    "denied",
    "expired",
    "closed",
    "reminded",
    "escalated",
    "executed",
    "failed",
    "in_doubt",
    "not_run",
)
PAGE = 1000


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def encode(entry_id: str, fields: Iterable[tuple[str, str]]) -> bytes:
    """An entry's canonical encoding: its id, then each field name and value in order, each
    a netstring (``<length in bytes>:<bytes>,``), as ``include/audit.lua`` hashes it."""
    out = bytearray()
    for part in (entry_id, *(x for kv in fields for x in kv)):
        data = part.encode()
        out += b"%d:%s," % (len(data), data)
    return bytes(out)


@dataclass(frozen=True)
class AuditEntry:
    """One entry of a shard's audit stream."""

    shard: int
    id: str
    fields: tuple[tuple[str, str], ...]

    def get(self, name: str) -> str:
        """A field's value, or one of ``more``'s ('' when absent)."""
        value = next((v for k, v in self.fields if k == name), None)
        if value is None:
            value = self.more().get(name, "")
        return value

    def more(self) -> dict[str, str]:
        """The fields of its kind beyond the common ones (``group``, ``to``, …)."""
        raw = next((v for k, v in self.fields if k == "more"), "")
        try:
            found = json.loads(raw) if raw else {}
        except ValueError:
            return {}
        return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}

    @property
    def kind(self) -> str:
        return self.get("kind")

    @property
    def at(self) -> float:
        """When it happened (unix seconds, the Redis clock)."""
        try:
            return float(self.get("at"))
        except ValueError:
            return int(self.id.split("-")[0]) / 1000

    @property
    def hash(self) -> str:
        """The SHA-1 (hex) of its encoding: what the next entry's ``prev`` must be."""
        return hashlib.sha1(encode(self.id, self.fields)).hexdigest()

    def as_dict(self) -> dict[str, str]:
        """Its fields with ``shard`` and ``id``, for an export."""
        plain = {k: v for k, v in self.fields if k != "more"}
        return {"shard": str(self.shard), "id": self.id, **self.more(), **plain}


async def entries(
    redis: Redis,
    keys: Keys,
    shard: int,
    *,
    start: str = "-",
    end: str = "+",
) -> AsyncIterator[AuditEntry]:
    """A shard's entries from ``start`` to ``end`` (stream ids), oldest first, read a page
    at a time."""
    stream = keys.audit(shard)
    while True:
        page = await redis.xrange(stream, start, end, count=PAGE)
        for entry_id, raw in page:
            pairs = tuple((_text(k), _text(v)) for k, v in raw.items())
            yield AuditEntry(shard, _text(entry_id), pairs)
        if len(page) < PAGE:
            return
        start = "(" + _text(page[-1][0])


async def latest(
    redis: Redis, keys: Keys, count: int, *, tool: str = "", user: str = ""
) -> list[AuditEntry]:
    """The ``count`` newest entries of every shard (newest first), only those of ``tool``
    or whose ``by`` is ``user`` when given."""
    found: list[AuditEntry] = []
    for shard in keys.all_shards():
        stream, end, mine = keys.audit(shard), "+", 0
        while mine < count:
            page = await redis.xrevrange(stream, end, "-", count=PAGE)
            for entry_id, raw in page:
                e = AuditEntry(
                    shard, _text(entry_id), tuple((_text(k), _text(v)) for k, v in raw.items())
                )
                if (not tool or e.get("tool") == tool) and (not user or e.get("by") == user):
                    found.append(e)
                    mine += 1
            if len(page) < PAGE:
                break
            end = "(" + _text(page[-1][0])
    found.sort(key=lambda e: (e.at, e.id), reverse=True)
    return found[:count]


@dataclass(frozen=True)
class Head:
    """A chain's head: the last entry's id and hash (empty for an empty chain)."""

    shard: int
    id: str
    hash: str


async def read_heads(redis: Redis, keys: Keys) -> list[Head]:
    """Every shard's chain head, as Redis keeps it."""
    heads = []
    for shard in keys.all_shards():
        h = await redis.hgetall(keys.audit_head(shard))
        got = {_text(k): _text(v) for k, v in h.items()}
        heads.append(Head(shard, got.get("id", ""), got.get("hash", "")))
    return heads


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass
class Verified:
    """What :func:`verify_shard` found: the entries checked and the breaks, one line each."""

    shard: int
    checked: int = 0
    problems: list[str] = field(default_factory=list)


async def _head(redis: Redis, keys: Keys, shard: int) -> dict[str, str]:
    raw = await redis.hgetall(keys.audit_head(shard))
    return {_text(k): _text(v) for k, v in raw.items()}


async def verify_shard(
    redis: Redis, keys: Keys, shard: int, known: Iterable[Head] = ()
) -> Verified:
    """Check a shard's chain from its anchor to its head, and that each head of ``known``
    (kept outside Redis) is still in it, with the same hash, or was trimmed. Safe on a live
    trail: entries appended or trimmed while it reads are followed."""
    out = Verified(shard)
    head = await _head(redis, keys, shard)
    expected, before = head.get("anchor", ""), head.get("anchor_id", "") or "(start)"
    hashes: dict[str, str] = {}
    last, start = "", "-"
    for _ in range(5):
        async for e in entries(redis, keys, shard, start=start):
            out.checked += 1
            names = [k for k, _ in e.fields]
            if not last and e.get("prev") != expected:  # trimmed meanwhile: its new anchor
                head = await _head(redis, keys, shard)
                expected = head.get("anchor", "")
            if not names or names[0] != "kind" or names[-1] != "prev":
                out.problems.append(f"shard {shard}: entry {e.id} is not an audit entry (forged)")
            elif e.get("prev") != expected:
                out.problems.append(
                    f"shard {shard}: entry {e.id} ({e.kind} {e.get('gate_id')}) does not "
                    f"follow entry {before}: an entry between them was removed or altered, or "
                    "this one was"
                )
            expected, before, last = e.hash, e.id, e.id
            hashes[e.id] = expected
        head = await _head(redis, keys, shard)
        if not last or not head.get("id") or _order(head["id"]) <= _order(last):
            break
        start = "(" + last  # appended while it read: follow them
    if head.get("hash", "") != expected or (last and head.get("id") != last):
        out.problems.append(
            f"shard {shard}: the chain ends at entry {last or '(none)'}, but its head is "
            f"entry {head.get('id') or '(none)'}: entries at the end were removed or added"
        )
    for h in known:
        if h.shard != shard or not h.id:
            continue
        if h.id in hashes:
            if hashes[h.id] != h.hash:
                out.problems.append(
                    f"shard {shard}: entry {h.id} is not the one whose head was kept: the "
                    "chain was rewritten"
                )
        elif not head.get("anchor_id") or _order(h.id) > _order(head["anchor_id"]):
            out.problems.append(
                f"shard {shard}: entry {h.id}, a head kept, is gone (not trimmed): the chain "
                "was truncated or rewritten"
            )
    return out


async def trim(scripts: Scripts, retention: float) -> int:
    """Remove every shard's entries older than ``retention`` seconds, anchoring each chain
    (TRIM_AUDIT); how many went. 0 keeps them forever. The cut is taken on this host's
    clock (a Cluster has no one TIME), close enough for a retention in days."""
    if retention <= 0:
        return 0
    cut = f"{int((time.time() - retention) * 1000)}-0"
    removed = 0
    for shard in scripts.keys.all_shards():
        while True:
            n = await scripts.trim_audit(shard, cut)
            removed += n
            if n < 1000:
                break
    return removed
