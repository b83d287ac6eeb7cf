"""Bot-owned Redis state: where each card lives, what it last showed, per-name locks.

Every key comes from ``Keys.ext`` so it shares the deployment prefix and hash tag. Any
``web`` replica can update any card because (channel, ts) live here, not in memory.

A card record also holds the intent to post (``posting``: when a process asked Slack to
post the card, written before it asks) and ``others``: every further message that shows
the same gate (a card posted again by a process that never learned where the first one
went). Every update of the gate's card goes to all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from agent_core.keys import Keys

from .cards import ToolResult
from .scripts import BotScripts

log = logging.getLogger(__name__)

CARD_NS = "slack-card"
# The "Approve all" message of a turn with several gates: a record like a card's, named by
# ``turn_ident(run_id, turn)``.
TURN_NS = "slack-turn"
# The compact line in a task's thread for a gate whose card went to an approval channel
# (bot/routing.py): a record like a card's, named by the gate id.
NOTE_NS = "slack-note"
RUN_NS = "slack-run"
# channel + root ts of a run's thread → the run id (a reply there continues the run).
THREAD_NS = "slack-thread"
LOCK_NS = "slack-lock"
# Per channel: the cards (and thread lines, "Approve all" messages) whose update Slack
# refused because the app was out of the channel, shown again once it is back
# (bot/rejoin.py). A sorted set, member "<ns>:<ident>", score the time it was marked.
STALE_NS = "slack-stale"
# The newest marks kept per channel: a card older than these stays as it was until clicked.
STALE_MAX = 1000
# Bot records outlive the runs people still look at, then go away on their own.
RECORD_TTL_SECONDS = 30 * 24 * 3600
# A lock lives LOCK_TTL_MS unless its holder renews it (every third of that while it works):
# a web process killed while holding one blocks that card for seconds, not minutes.
LOCK_TTL_MS = 10_000
LOCK_WAIT_SECONDS = 3.0
# A holder stuck for longer (a call that never returns) is cancelled, and its lock released:
# renewing without a bound turned one stuck holder into a card that never updated again.
LOCK_MAX_HOLD_SECONDS = 60.0


def turn_ident(run_id: str, turn: int) -> str:
    """The record name of a turn's "Approve all" message (in the run's shard)."""
    return f"{run_id}:{turn}"


class LockBusy(Exception):
    """Another process held the lock for longer than we were willing to wait."""


@dataclass(frozen=True)
class CardRecord:
    channel: str | None
    ts: str | None
    digest: str | None
    result: ToolResult | None
    posting: float | None = None  # unix time a post of the card was last attempted
    others: tuple[str, ...] = ()  # further messages showing this gate (same channel)
    shown: str | None = None  # the gate status the card was last updated to show
    # A card routed to an approval channel (bot/routing.py): the permalink of its task's
    # thread, and the error Slack gave for that channel when the card fell back to the thread.
    thread_link: str | None = None
    route_error: str | None = None

    @property
    def all_ts(self) -> list[str]:
        """Every message that shows the gate, the card first."""
        return [t for t in (self.ts, *self.others) if t]


@dataclass(frozen=True)
class RunRecord:
    channel: str | None
    ts: str | None
    digest: str | None


@dataclass
class Held:
    """A lock while held: the hashes read as it was taken, and fields to write at release
    (one round trip each way instead of one per command)."""

    read: list[dict[str, str]]
    writes: dict[str, dict[str, str]]
    # The channels a card of this section was posted or updated in (the app is there).
    landed: set[str] = field(default_factory=set)

    def write_at_release(self, key: str, fields: dict[str, str]) -> None:
        self.writes.setdefault(key, {}).update(fields)


class Store:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        *,
        lock_max_hold: float = LOCK_MAX_HOLD_SECONDS,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.lock_max_hold = lock_max_hold
        self.scripts = BotScripts(redis)

    # --- cards ------------------------------------------------------------------------
    def _shard(self, ident: str) -> int | None:
        """The shard of a run or gate id, or of ``<run id>:<turn>`` (its records live beside
        it), else None."""
        ident = ident.partition(":")[0]
        return self.keys.shard_of(ident) if self.keys.owns(ident) else None

    # Every card method takes ``ns``: CARD_NS for a gate's card (named by the gate id),
    # TURN_NS for a turn's "Approve all" message (named by turn_ident()).
    def card_key(self, gate_id: str, ns: str = CARD_NS) -> str:
        return self.keys.ext(ns, gate_id, self._shard(gate_id))

    async def card(self, gate_id: str, ns: str = CARD_NS) -> CardRecord:
        return card_record(await self._hgetall(self.card_key(gate_id, ns)))

    def card_digest_fields(self, digest: str, shown: str | None = None) -> dict[str, str]:
        """What :meth:`set_card_digest` writes (for :meth:`Held.write_at_release`)."""
        return {"digest": digest} if shown is None else {"digest": digest, "shown": shown}

    async def mark_posting(self, gate_id: str, at: float, ns: str = CARD_NS) -> None:
        """Written before ``chat.postMessage``: a process that dies before :meth:`save_card`
        leaves this behind, and the next one looks for the card instead of posting again."""
        await self._hset(self.card_key(gate_id, ns), {"posting": f"{at:.6f}"})

    async def save_card(
        self, gate_id: str, channel: str, ts: str, digest: str, ns: str = CARD_NS
    ) -> bool:
        """Record a posted card; ``False`` when the gate already had one (``ts`` then joins
        :attr:`CardRecord.others`, and the digest is cleared so that all get updated)."""
        return await self.scripts.save_card(
            self.card_key(gate_id, ns), channel, ts, digest, RECORD_TTL_SECONDS
        )

    async def adopt_cards(
        self, gate_id: str, channel: str, ts: list[str], ns: str = CARD_NS
    ) -> None:
        """The messages found on Slack for a gate whose post was never recorded: the oldest
        becomes its card, the rest its ``others``; none is known to be current."""
        if not ts:
            return
        await self._hset(
            self.card_key(gate_id, ns),
            {"channel": channel, "ts": ts[0], "others": " ".join(ts[1:]), "digest": ""},
        )

    async def drop_other(self, gate_id: str, ts: str, ns: str = CARD_NS) -> None:
        """Forget one of the gate's further messages (deleted on Slack)."""
        rec = await self.card(gate_id, ns)
        await self._hset(
            self.card_key(gate_id, ns), {"others": " ".join(t for t in rec.others if t != ts)}
        )

    async def set_card_digest(
        self, gate_id: str, digest: str, ns: str = CARD_NS, *, shown: str | None = None
    ) -> None:
        """What the card shows now: its digest, and the gate status it shows (if known)."""
        await self._hset(self.card_key(gate_id, ns), self.card_digest_fields(digest, shown))

    async def set_card_fields(self, gate_id: str, fields: dict[str, str]) -> None:
        """More about a gate's card (its ``thread_link``, its ``route_error``: bot/routing.py)."""
        await self._hset(self.card_key(gate_id), fields)

    async def set_result(self, gate_id: str, result: ToolResult) -> None:
        """The call's outcome, replacing whatever is stored (a cancel's guess included)."""
        await self._hset(self.card_key(gate_id), result_fields(result))

    async def set_result_unless_known(self, gate_id: str, result: ToolResult) -> bool:
        """Store ``result`` only if the card has no outcome yet (one script: an outcome
        stored meanwhile by :meth:`set_result` is never overwritten); whether it was."""
        return await self.scripts.set_result_if_none(
            self.card_key(gate_id), RECORD_TTL_SECONDS, result_fields(result)
        )

    async def mark_nudged(self, gate_id: str, step: str, ts: str) -> None:
        """The reply of a gate's reminder or escalation (``step``) was posted (``ts``; or
        refused for good): it is never posted again."""
        await self._hset(self.card_key(gate_id), {f"nudge:{step}": ts})

    # --- stale cards ------------------------------------------------------------------
    def stale_key(self, channel: str) -> str:
        return self.keys.ext(STALE_NS, channel, self.keys.shard_for(channel))

    async def mark_stale(self, channel: str, ident: str, ns: str = CARD_NS) -> None:
        """Slack refused to update this card because the app is out of ``channel``: it is
        shown again once the app is back (bot/rejoin.py)."""
        await self.scripts.mark_stale(
            self.stale_key(channel), f"{ns}:{ident}", time.time(), STALE_MAX, RECORD_TTL_SECONDS
        )

    async def stale_cards(self, channel: str, limit: int = STALE_MAX) -> list[tuple[str, float]]:
        """The channel's stale marks (``"<ns>:<ident>"``, when marked), oldest first."""
        got = await self.redis.zrange(self.stale_key(channel), 0, limit - 1, withscores=True)
        return [(_s(member), float(score)) for member, score in got]

    async def has_stale(self, channel: str) -> bool:
        return bool(await self.redis.exists(self.stale_key(channel)))

    async def clear_stale(self, channel: str, marks: Sequence[tuple[str, float]]) -> int:
        """Forget ``marks`` (cards shown again), except those marked again meanwhile."""
        return await self.scripts.clear_stale(self.stale_key(channel), marks)

    # --- runs -------------------------------------------------------------------------
    def run_key(self, run_id: str) -> str:
        return self.keys.ext(RUN_NS, run_id, self._shard(run_id))

    async def run(self, run_id: str) -> RunRecord:
        return run_record(await self._hgetall(self.run_key(run_id)))

    async def save_run_root(self, run_id: str, channel: str, ts: str) -> None:
        """Where the run's root message is, and the reverse: its thread → the run."""
        await self._hset(self.run_key(run_id), {"channel": channel, "ts": ts})
        await self.redis.set(self.thread_key(channel, ts), run_id, ex=RECORD_TTL_SECONDS)

    def thread_key(self, channel: str, ts: str) -> str:
        ident = f"{channel}:{ts}"
        return self.keys.ext(THREAD_NS, ident, self.keys.shard_for(ident))

    async def run_of_thread(self, channel: str, thread_ts: str) -> str | None:
        """The run whose root message starts this thread, or None."""
        run_id = await self.redis.get(self.thread_key(channel, thread_ts))
        return _s(run_id) if run_id else None

    async def set_run_digest(self, run_id: str, digest: str) -> None:
        await self._hset(self.run_key(run_id), {"digest": digest})

    async def mark_posted(self, run_id: str, marker: str, ts: str) -> None:
        await self._hset(self.run_key(run_id), {f"posted:{marker}": ts})

    async def cards_and_children(
        self, gate_ids: Sequence[str], run_id: str
    ) -> tuple[list[CardRecord], list[str]]:
        """The cards' records of ``gate_ids`` and the run's sub-agent runs (all of them, for
        :meth:`children_since`), in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for gate_id in gate_ids:
                pipe.hgetall(self.card_key(gate_id))
            pipe.smembers(self.keys.children(run_id))
            *raw, kids = await pipe.execute()
        recs = [card_record({_s(k): _s(v) for k, v in h.items()}) for h in raw]
        return recs, [_s(k) for k in kids]

    async def children_since(
        self, run_id: str, turn: int, kids: Sequence[str] | None = None
    ) -> list[str]:
        """The run's sub-agent runs started by its turns after ``turn`` (core keys, read
        only); ``kids``: all its sub-agent runs, when already read."""
        if kids is None:
            kids = await self.redis.smembers(self.keys.children(run_id))
        kids = sorted(kids)
        if not kids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for kid in kids:
                pipe.hget(self.keys.run(kid), "parent_turn")
            turns = await pipe.execute()
        return [k for k, t in zip(kids, turns, strict=True) if t and t.isdigit() and int(t) > turn]

    async def claim(self, namespace: str, ident: str, token: str, lease_seconds: float) -> bool:
        """Claim ``ident`` in ``namespace`` for ``lease_seconds``: True when it was free or is
        already held by ``token`` (the same delivery again, or a reply lost after the SET)."""
        key = self.keys.ext(namespace, ident, self.keys.shard_for(ident))
        if await self.redis.set(key, token, nx=True, px=max(int(lease_seconds * 1000), 1)):
            return True
        holder = await self.redis.get(key)
        return holder is not None and _s(holder) == token

    # --- locks ------------------------------------------------------------------------
    def lock_key(self, name: str) -> str:
        # "gate:<id>", "run:<id>" and "turn:<run id>:<turn>" locks live in that shard.
        return self.keys.ext(LOCK_NS, name, self._shard(name.partition(":")[2]))

    @asynccontextmanager
    async def lock(
        self,
        name: str,
        wait_seconds: float = LOCK_WAIT_SECONDS,
        *,
        read: Sequence[str] = (),
        write_first: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Held]:
        """A short mutual exclusion across replicas (SET NX PX, renewed while held, released
        only by its owner). :class:`LockBusy` if another holder keeps it past ``wait_seconds``.
        The section is cancelled (TimeoutError) once held ``lock_max_hold`` seconds.

        ``read``: hashes (in the lock's shard) read as the lock is taken, in one round trip;
        :meth:`Held.write_at_release` fields are written as it is released, in one more.
        ``write_first``: fields written into ``read[0]`` in that same round trip, before it
        is read (and even if the lock stays busy).
        """
        key = self.lock_key(name)
        token = secrets.token_hex(8)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + wait_seconds
        delay = 0.01
        while True:
            # A script even without hashes to read: a SET NX retried after its reply was
            # lost would find the lock taken, by this very token, and wait for nothing.
            got = await self.scripts.lock_and_read(
                key, token, LOCK_TTL_MS, read, write_first=write_first, write_ttl=RECORD_TTL_SECONDS
            )
            if got is not None:
                held = Held(got, {})
                break
            if loop.time() >= give_up:
                raise LockBusy(name)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)
        done = asyncio.Event()
        until = loop.time() + self.lock_max_hold
        renewer: asyncio.Task[None] | None = None

        def start_renewing() -> None:
            nonlocal renewer
            renewer = asyncio.create_task(self._keep(key, token, done, until))

        # Most sections last a few ms: the renewer task starts only if this one is still held
        # after a third of the TTL (its first renewal would come then anyway).
        first_renewal = loop.call_later(LOCK_TTL_MS / 3000, start_renewing)
        try:
            bound = asyncio.timeout(self.lock_max_hold)
            try:
                async with bound:
                    yield held
            except TimeoutError:
                if bound.expired():
                    log.warning(
                        "lock %s held for over %g s: its holder was cancelled",
                        name,
                        self.lock_max_hold,
                    )
                raise
        finally:
            # Told to stop, not only cancelled, and never waited for without a bound: redis-py
            # can swallow a cancellation that lands inside a command, and a renewer awaited
            # after that kept its lock renewed forever (seen in the Slack bench: cards that
            # never updated again).
            done.set()
            first_renewal.cancel()
            if renewer is not None:
                renewer.cancel()
                await asyncio.wait({renewer}, timeout=1.0)
            if held.writes:
                await self.scripts.release_after_writes(key, token, RECORD_TTL_SECONDS, held.writes)
            else:
                await self.scripts.release_lock(key, token)

    async def _keep(self, key: str, token: str, done: asyncio.Event, until: float) -> None:
        """Renew the lock until ``done`` is set, and never past ``until`` (loop time)."""
        loop = asyncio.get_running_loop()
        while not done.is_set() and loop.time() < until:
            with contextlib.suppress(aioredis.RedisError, OSError):
                await self.scripts.renew_lock(key, token, LOCK_TTL_MS)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), LOCK_TTL_MS / 3000)

    # --- helpers ----------------------------------------------------------------------
    async def _hgetall(self, key: str) -> dict[str, str]:
        raw = await self.redis.hgetall(key)
        return {_s(k): _s(v) for k, v in raw.items()}

    async def _hset(self, key: str, mapping: dict[str, str]) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=mapping)  # type: ignore[arg-type,unused-ignore]
            pipe.expire(key, RECORD_TTL_SECONDS)
            await pipe.execute()


def card_record(h: dict[str, str]) -> CardRecord:
    """A card record from its hash (empty: never posted)."""
    result = None
    if h.get("result_ok") is not None:
        result = ToolResult(
            ok=h["result_ok"] == "1",
            output=h.get("result_output", ""),
            in_doubt=h.get("result_in_doubt") == "1",
            skipped=h.get("result_skipped") or None,
            after_cancel=h.get("result_after_cancel") == "1",
            running_at_cancel=h.get("result_running_at_cancel") == "1",
        )
    try:
        posting = float(h["posting"]) if h.get("posting") else None
    except ValueError:
        posting = None
    others = tuple(t for t in (h.get("others") or "").split() if t != h.get("ts"))
    return CardRecord(
        h.get("channel"),
        h.get("ts"),
        h.get("digest") or None,
        result,
        posting,
        others,
        h.get("shown") or None,
        h.get("thread_link") or None,
        h.get("route_error") or None,
    )


def result_fields(result: ToolResult) -> dict[str, str]:
    return {
        "result_ok": "1" if result.ok else "0",
        "result_output": result.output,
        "result_in_doubt": "1" if result.in_doubt else "0",
        "result_skipped": result.skipped or "",
        "result_after_cancel": "1" if result.after_cancel else "0",
        "result_running_at_cancel": "1" if result.running_at_cancel else "0",
    }


def run_record(h: dict[str, str]) -> RunRecord:
    """A run's record from its hash (empty: no root message known)."""
    return RunRecord(h.get("channel"), h.get("ts"), h.get("digest"))


def _s(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v
