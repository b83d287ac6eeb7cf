"""Which workers are alive, and which agents they serve.

Every worker announces itself at start and then from its housekeeping (every
``HOUSEKEEPING_INTERVAL`` seconds, or STUCK_RUN_AFTER when shorter): one field per worker in
one hash per deployment, under the deployment's own hash tag (``{agw}:ext:presence:workers``).
A field's value is JSON: ``{"agents": [...], "shards": 16, "every": 10.0, "started_at": …,
"seen_at": …}``. Times are the Redis clock of the node holding the hash, read inside the
scripts, so the web and the workers need not agree on theirs. An entry not refreshed for
:data:`STALE_AFTER` of its intervals is ignored, and removed at the next announcement; the
hash expires when no worker is left to refresh it.

The web process reads it for ``/healthz`` and to refuse a task of an agent no live worker
serves; anyone holding a Redis client can call :func:`check` (e.g. beside a
:class:`~agent_core.Gateway`) to learn that runs would stay queued: no worker, workers under
another KEY_PREFIX, or a SHARDS that differs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

from .keys import Keys
from .script_replies import WorkerRecords
from .scripts import Scripts
from .streams import is_cluster

if TYPE_CHECKING:
    from .worker import Worker

log = logging.getLogger(__name__)

STALE_AFTER = 3  # intervals without a refresh after which a worker counts as gone
SCAN_COUNT = 1000  # keys examined per SCAN call when looking for other deployments
SCAN_CALLS = 20  # SCAN calls at most per look (a bounded look, not an exhaustive one)
_NS = "presence"
_ID = "workers"
_PATTERN = "{*}:ext:" + _NS + ":" + _ID


def presence_key(keys: Keys) -> str:
    """The hash of a deployment's live workers."""
    return keys.ext(_NS, _ID)


def prefix_of(key: str) -> str | None:
    """The KEY_PREFIX of a presence hash's key, or None when it is not one."""
    if not (key.startswith("{") and key.endswith("}:ext:" + _NS + ":" + _ID)):
        return None
    prefix = key[1 : key.index("}")]
    return prefix if prefix and ":" not in prefix else None


@dataclass(frozen=True)
class WorkerPresence:
    """One live worker as it announced itself."""

    name: str
    agents: tuple[str, ...]
    shards: int
    every: float
    started_at: float
    seen_at: float


@dataclass
class WorkersReport:
    """What the live workers of a deployment mean for runs started from here."""

    workers: list[WorkerPresence]
    key_prefix: str
    shards: int
    expected_agents: list[str] = field(default_factory=list)
    other_prefixes: list[str] = field(default_factory=list)

    @property
    def alive(self) -> int:
        return len(self.workers)

    @property
    def agents(self) -> list[str]:
        """Every agent some live worker serves, sorted."""
        return sorted({a for w in self.workers for a in w.agents})

    @property
    def missing_agents(self) -> list[str]:
        """The expected agents no live worker serves (all of them when none is alive)."""
        served = set(self.agents)
        return [a for a in self.expected_agents if a not in served]

    @property
    def other_shards(self) -> list[int]:
        """The SHARDS of live workers that differ from this process's."""
        return sorted({w.shards for w in self.workers if w.shards != self.shards})

    def serves(self, agent: str) -> bool:
        """Whether some live worker serves ``agent``."""
        return any(agent in w.agents for w in self.workers)

    @property
    def problem(self) -> str | None:
        """Why runs started from here would not run as expected, or None."""
        prefix = self.key_prefix
        if not self.workers:
            text = (
                f"no worker is alive under KEY_PREFIX={prefix}: runs stay queued until one "
                "starts. Check that the workers run, and that they and this process use the "
                "same KEY_PREFIX and REDIS_URL"
            )
            if self.other_prefixes:
                found = ", ".join(f"KEY_PREFIX={p}" for p in self.other_prefixes)
                text += f" (workers found under {found}; this process uses KEY_PREFIX={prefix})"
            return text
        lines: list[str] = []
        if self.other_shards:
            theirs = ", ".join(str(s) for s in self.other_shards)
            lines.append(
                f"workers use SHARDS={theirs} but this process uses SHARDS={self.shards}: runs "
                "in shards they do not read stay queued. Every process must use the same SHARDS"
            )
        missing = self.missing_agents
        if missing:
            names = ", ".join(missing)
            lines.append(
                f"no live worker serves the agent{'s' if len(missing) > 1 else ''} {names}: "
                f"its runs fail. Add {'them' if len(missing) > 1 else 'it'} to AGENTS on the "
                "workers"
            )
        return "; ".join(lines) or None

    def as_dict(self) -> dict[str, Any]:
        """The ``workers`` field of the web process's ``/healthz``."""
        out: dict[str, Any] = {
            "alive": self.alive,
            "agents": self.agents,
            "missing_agents": self.missing_agents,
            "problem": self.problem,
        }
        if self.other_shards:
            out["shards"] = self.other_shards
        if self.other_prefixes:
            out["other_prefixes"] = self.other_prefixes
        return out


async def announce(
    redis: Redis, keys: Keys, name: str, agents: Iterable[str], *, every: float
) -> bool:
    """Record that worker ``name`` is alive, serving ``agents``, and will say so again
    within ``every`` seconds; prune workers gone quiet. False (logged) when Redis failed:
    announcing never stops a worker."""
    record = json.dumps({"agents": sorted(agents), "shards": keys.shards, "every": float(every)})
    try:
        await Scripts(redis, keys).announce_worker(presence_key(keys), name, record, STALE_AFTER)
    except Exception as exc:
        log.warning("presence: could not announce worker %s (%s)", name, type(exc).__name__)
        return False
    return True


async def announce_worker(worker: Worker) -> bool:
    """:func:`announce` for a :class:`~agent_core.worker.Worker` (every agent it serves,
    its housekeeping interval)."""
    from .worker import HOUSEKEEPING_INTERVAL

    every = min(HOUSEKEEPING_INTERVAL, worker.settings.stuck_run_after)
    return await announce(worker.redis, worker.keys, worker.name, worker.agents, every=every)


async def withdraw(redis: Redis, keys: Keys, name: str) -> None:
    """Remove worker ``name``'s record (it is stopping), so that it stops counting as alive
    at once rather than after STALE_AFTER intervals. Never raises: a record left behind is
    pruned as stale."""
    try:
        await asyncio.wait_for(redis.hdel(presence_key(keys), name), timeout=2)
    except Exception as exc:
        log.warning("presence: could not withdraw worker %s (%s)", name, type(exc).__name__)


async def live_workers(redis: Redis, keys: Keys) -> list[WorkerPresence]:
    """The workers alive under ``keys``' prefix (stale and unreadable records skipped)."""
    return _parse(await Scripts(redis, keys).read_workers(presence_key(keys)))


def _parse(read: WorkerRecords) -> list[WorkerPresence]:
    now = float(read.now)
    found: list[WorkerPresence] = []
    for name, record in read.records:
        try:
            r = json.loads(record)
            w = WorkerPresence(
                name=name,
                agents=tuple(str(a) for a in r["agents"]),
                shards=int(r["shards"]),
                every=float(r["every"]),
                started_at=float(r["started_at"]),
                seen_at=float(r["seen_at"]),
            )
        except (ValueError, KeyError, TypeError):
            continue
        if math.isfinite(w.seen_at) and now - w.seen_at <= STALE_AFTER * w.every:
            found.append(w)
    return sorted(found, key=lambda w: w.name)


async def other_prefixes(redis: Redis, keys: Keys) -> list[str]:
    """Other KEY_PREFIXes with live workers in the same Redis (a bounded SCAN: at most
    ``SCAN_CALLS * SCAN_COUNT`` keys examined). Not looked for on Redis Cluster: empty."""
    if is_cluster(redis):
        return []
    found: set[str] = set()
    cursor: int = 0
    for _ in range(SCAN_CALLS):
        cursor, batch = await redis.scan(cursor, match=_PATTERN, count=SCAN_COUNT)
        for key in batch:
            prefix = prefix_of(key.decode() if isinstance(key, bytes) else str(key))
            if prefix and prefix != keys.prefix:
                found.add(prefix)
        if not cursor:
            break
    alive = []
    for prefix in sorted(found):
        try:
            theirs = Keys(prefix, keys.shards)
        except ValueError:  # not a prefix this project writes
            continue
        if await live_workers(redis, theirs):
            alive.append(prefix)
    return alive


async def check(
    redis: Redis, keys: Keys, agents: Sequence[str] = (), *, look_elsewhere: bool = True
) -> WorkersReport:
    """The live workers under ``keys``' prefix, and what they mean for runs started with
    these keys (``report.problem``): none alive (then, with ``look_elsewhere``, the other
    prefixes that have workers in this Redis), another SHARDS, or ``agents`` no worker
    serves. Raises what Redis raises."""
    report = WorkersReport(await live_workers(redis, keys), keys.prefix, keys.shards, list(agents))
    if not report.workers and look_elsewhere:
        report.other_prefixes = await other_prefixes(redis, keys)
    return report
