"""Reminders and escalation of a pending gate: the options, and the sweeper's part.

``remind_after`` (seconds or a timedelta): if the gate is still pending then, the front end
reminds its approvers once. ``escalate_after`` with ``escalate_to`` (ids of people or
groups): if still pending then, ``escalate_to`` may decide the gate too, and is told once.
Each option is set on a tool (``@tool``), on its :class:`~agent_core.Agent`, or in the
settings (REMIND_AFTER, ESCALATE_AFTER, ESCALATE_TO), the most specific one winning; ``0``
turns a step off at that level. A step must come before the gate expires: one that would not
is a configuration error, reported when the worker starts.

Both steps are durable deadlines like expiry: OPEN_GATES writes ``remind_at`` and
``escalate_at`` into the gate and schedules them in the shard's nudges sorted set
(:meth:`agent_core.keys.Keys.nudges`); the workers' sweeper fires each one with FIRE_NUDGE,
which sets ``reminded_at`` / ``escalated_at`` and appends ``gate.reminded`` /
``gate.escalated`` to the shard's events stream atomically, only while the gate is pending,
and removes the entry: several workers sweeping at once fire it once, and a worker restarted
loses nothing (the sorted set is the truth). A decision (DECIDE_GATE, expiry included)
removes the gate's entries; a gate closed with its run keeps them until they come due, and
FIRE_NUDGE then drops them without firing.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from redis.asyncio import Redis

from .exceptions import ConfigError
from .keys import Keys
from .script_replies import NudgeOutcome
from .scripts import Scripts

if TYPE_CHECKING:
    from .agent import Agent

log = logging.getLogger(__name__)

Seconds = float | int | timedelta
STEPS = ("remind", "escalate")
MAX_ESCALATE_TO = 20
# An id of a person or a group as the front end knows them (Slack: U…, W…, S…).
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def seconds(value: Seconds | None, what: str) -> float | None:
    """``value`` in seconds (None stays None); ValueError naming ``what`` unless it is a
    finite number (or a timedelta) of 0 or more."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{what} must be a number of seconds (or a timedelta), 0 or more")
    return float(value)


def ids(value: str | Iterable[str] | None, what: str) -> tuple[str, ...] | None:
    """``"S1, U2"`` or ``["S1", "U2"]`` → ``("S1", "U2")`` (None stays None); ValueError
    naming ``what`` and the entry's position (never its text) for an entry that is no id."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    found: list[str] = []
    for i, item in enumerate(items, 1):
        if not isinstance(item, str) or not _ID.match(item.strip()):
            raise ValueError(f"{what}: entry {i} is not a user or group id (e.g. U0123, S0123)")
        found.append(item.strip())
    found = list(dict.fromkeys(found))
    if len(found) > MAX_ESCALATE_TO:
        raise ValueError(f"{what} lists more than {MAX_ESCALATE_TO} ids")
    return tuple(found)


def _fmt(value: float) -> str:
    return f"{value:g}"


@dataclass(frozen=True)
class Nudges:
    """When a pending gate is reminded and escalated, at one level (a tool, an agent, the
    settings). ``None``: not set here (the next level decides); ``0``: off."""

    remind_after: float | None = None
    escalate_after: float | None = None
    escalate_to: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        remind_after: Seconds | None = None,
        escalate_after: Seconds | None = None,
        escalate_to: str | Iterable[str] | None = None,
        *,
        names: Sequence[str] = ("remind_after", "escalate_after", "escalate_to"),
    ) -> Nudges:
        """Checked options (ValueError, one line naming the option as ``names`` spell it).
        ``escalate_after`` and ``escalate_to`` go together: one without the other is an
        error (``escalate_after=0`` needs none)."""
        remind = seconds(remind_after, names[0])
        escalate = seconds(escalate_after, names[1])
        to = ids(escalate_to, names[2])
        if escalate and not to:
            raise ValueError(f"{names[1]} needs {names[2]}: whom to escalate to")
        if to and escalate is None:
            raise ValueError(f"{names[2]} needs {names[1]}: when to escalate")
        return cls(remind, escalate, (to or ()) if escalate else ())

    def over(self, fallback: Nudges) -> Nudges:
        """These options, with ``fallback``'s where these say nothing."""
        remind = self.remind_after if self.remind_after is not None else fallback.remind_after
        if self.escalate_after is not None:
            return Nudges(remind, self.escalate_after, self.escalate_to)
        return Nudges(remind, fallback.escalate_after, fallback.escalate_to)

    def check(
        self, timeout: float, where: str, names: Sequence[str] = ("remind_after", "escalate_after")
    ) -> None:
        """:class:`ConfigError` when a step would come at or after the gate's expiry
        (``timeout`` seconds): it could never fire."""
        for name, value in zip(names, (self.remind_after, self.escalate_after), strict=True):
            if value and value >= timeout:
                raise ConfigError(
                    f"{where}: {name} ({_fmt(value)} s) is not shorter than the approval "
                    f"timeout ({_fmt(timeout)} s), so it would never fire; make it shorter, or "
                    "0 for none"
                )

    def gate_fields(self) -> dict[str, str]:
        """What OPEN_GATES reads from the gate's fields (it writes remind_at/escalate_at)."""
        escalate = bool(self.escalate_after and self.escalate_to)
        return {
            "remind_after": _fmt(self.remind_after) if self.remind_after else "",
            "escalate_after": _fmt(self.escalate_after or 0) if escalate else "",
            "escalate_to": json.dumps(list(self.escalate_to) if escalate else []),
        }


def check_agent(agent: Agent, timeout: float, defaults: Nudges) -> None:
    """:class:`ConfigError` (one line naming the agent, the tool and the option) when a
    reminder or escalation of ``agent``'s gates, resolved from its tools, itself and the
    settings (``defaults``), would come at or after their expiry (``timeout`` seconds)."""
    own = agent.nudges
    names = (
        "remind_after" if own.remind_after is not None else "REMIND_AFTER",
        "escalate_after" if own.escalate_after is not None else "ESCALATE_AFTER",
    )
    base = own.over(defaults)
    base.check(timeout, f"agent {agent.name!r}", names)
    for t in agent.tools:  # Tools, once the agent is built
        mine = getattr(t, "nudges", None)
        if isinstance(mine, Nudges):
            tool_names = (
                "remind_after" if mine.remind_after is not None else names[0],
                "escalate_after" if mine.escalate_after is not None else names[1],
            )
            where = f"agent {agent.name!r}, tool {getattr(t, 'name', '?')}"
            mine.over(base).check(timeout, where, tool_names)


class NudgeSweeper:
    """The sweeper's part: fire the reminders and escalations that are due."""

    def __init__(self, redis: Redis, keys: Keys, scripts: Scripts | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.scripts = scripts or Scripts(redis, keys)

    async def due(
        self, limit: int = 100, shards: Iterable[int] | None = None
    ) -> tuple[list[tuple[str, str]], float | None]:
        """The (step, gate id) due now (Redis clock), in ``shards`` (default all), and the
        seconds until the next one after them."""
        k = self.keys
        chosen = list(k.all_shards() if shards is None else shards)
        sec, usec = await self.redis.time()  # on its own: a cluster pipeline has no keyless command
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in chosen:
                pipe.zrange(k.nudges(shard), 0, limit, withscores=True)
            per_shard = await pipe.execute()
        now = sec + usec / 1e6
        entries = sorted(
            ((m, s, shard) for shard, rows in zip(chosen, per_shard, strict=True) for m, s in rows),
            key=lambda e: e[1],
        )
        due: list[tuple[str, str]] = []
        for member, score, shard in entries:
            if score > now or len(due) >= limit:
                break
            step, _, gate_id = member.partition(":")
            if step in STEPS and k.owns(gate_id) and k.shard_of(gate_id) == shard:
                due.append((step, gate_id))
            else:  # not an entry OPEN_GATES writes
                await self.redis.zrem(k.nudges(shard), member)
        later = [score for _, score, _ in entries if score > now]
        return due, (later[0] - now if later else None)

    async def sweep(self, limit: int = 100) -> tuple[int, bool, float | None]:
        """One pass: (steps fired, whether more may be due, seconds to the next one)."""
        due, next_in = await self.due(limit)
        fired = 0
        for step, gate_id in due:
            res = await self.scripts.fire_nudge(gate_id, step)
            if res.outcome is NudgeOutcome.FIRED:
                fired += 1
                log.info("gate %s: %s", gate_id, "reminded" if step == "remind" else "escalated")
        return fired, len(due) >= limit, next_in
