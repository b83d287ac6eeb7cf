"""App Home: each approver's Home tab lists the gates waiting for their decision.

What a person may decide is what a card click would let them decide: the same check
(:meth:`bot.approvers.Approvers.why_not_decide`) for every pending gate started from Slack.
Approve and Deny on Home are the card's own buttons (same action ids and values), so a click
there takes the card's path: the approver check, the refusal of every requester, the
arguments hash, one decision per gate, the deny-reason form. What the card path would tell
the clicker in the channel is shown at the top of their Home instead (:meth:`HomeFeed.notify`).
The listing takes each viewer as a member of the app's workspace; a Slack Connect guest's
click is judged as a card click is (``*`` covers them only with ALLOW_EXTERNAL_APPROVERS).

Where it reads from, bounded and per shard (one key per command, so Redis Cluster is fine):
the pending gates are each shard's deadlines (the soonest ``PENDING_PER_SHARD`` of each);
a person's decisions are a bot-side record, one sorted set per person and shard, written
from the ``gate.decided`` events. The people who look at Home are recorded when Slack says
they opened it (``app_home_opened``), for ``VIEWER_DAYS``: only their views are refreshed.

Refreshing (``views.publish``) follows the events the notifier reads: a gate opened or
decided marks every viewer who may decide it (and the decider) as due. Publishing is
coalesced: a person's view is published at most once a second across every ``web`` process
(a 1 s lease per person in Redis); a change that comes meanwhile is published once the lease
ends. It is best effort: a view left stale by a failure is published again at the next change
or when the person opens Home.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from agent_core.models import Event, EventType, Gate, GateStatus

from . import quorum_view
from .approvers import Approvers
from .home_view import (
    MAX_DECISIONS_SHOWN,
    MAX_PENDING_SHOWN,
    PendingItem,
    decided_at,
    home_view,
)
from .ports import GatewayLike
from .publisher import is_transient, slack_error
from .store import Store

log = logging.getLogger(__name__)

VIEWERS_NS = "home-viewers"  # sorted set under the deployment's tag: user → last opened
DECIDED_NS = "home-decided"  # per person and shard: gate id → when they decided it
NOTICE_NS = "home-notice"  # per person: what their last click on Home came to
LEASE_NS = "home-lease"  # per person: held for PUBLISH_INTERVAL after each publish
HASH_NS = "home-hash"  # per person: Slack's hash of the Home view last published
VIEWER_DAYS = 30
DECISIONS_DAYS = 400  # a person's decisions record outlives its last write this long
PENDING_PER_SHARD = 100
PUBLISH_INTERVAL = 1.0
NOTICE_SECONDS = 120
RETRY_PAUSE = 0.25  # how often a person whose lease is taken is tried again
PERMALINK_CACHE = 5000
# Home clicks carry no channel: GateActions tells the clicker through this marker.
HOME = "app_home"


class HomeFeed:
    """Publishes each viewer's Home (see the module docstring)."""

    def __init__(
        self,
        gateway: GatewayLike,
        store: Store,
        approvers: Approvers,
        client: AsyncWebClient,
        *,
        interval: float = PUBLISH_INTERVAL,
    ) -> None:
        self.gateway = gateway
        self.store = store
        self.keys = store.keys
        self.redis = store.redis
        self.approvers = approvers
        self.client = client
        self.interval = interval
        self.published = 0
        self._due: dict[str, bool] = {}  # person → forced (publish even if unchanged)
        self._shown: dict[str, str] = {}  # person → digest of the view last published here
        self._conflicts: dict[str, str | None] = {}  # person → the hash that last conflicted
        self._links: dict[str, str] = {}  # gate id → permalink of its card
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closed = False

    # --- who looks, and what changed --------------------------------------------------
    def _viewers_key(self) -> str:
        return self.keys.ext(VIEWERS_NS, "all")

    async def opened(self, user: str) -> None:
        """``user`` opened the Home tab: remember them as a viewer, publish their view."""
        now = time.time()
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(self._viewers_key(), {user: now})
            pipe.zremrangebyscore(self._viewers_key(), "-inf", now - VIEWER_DAYS * 86400)
            await pipe.execute()
        self.touch([user], force=True)

    async def notify(self, user: str, text: str) -> None:
        """Show ``text`` at the top of ``user``'s Home (for NOTICE_SECONDS) and publish it."""
        notice = json.dumps({"text": text, "at": time.time()})
        await self.redis.set(self.keys.ext(NOTICE_NS, user), notice, ex=NOTICE_SECONDS)
        self.touch([user], force=True)

    async def clicked(self, user: str, since: float) -> None:
        """``user`` clicked on their Home at ``since``: publish it again, without a notice
        older than that click (what an earlier click came to)."""
        key = self.keys.ext(NOTICE_NS, user)
        notice = _notice(await self.redis.get(key))
        if notice is not None and notice[1] < since:
            await self.redis.delete(key)
        self.touch([user], force=True)

    def touch(self, users: Iterable[str], *, force: bool = False) -> None:
        """Mark ``users``' views as due for publishing (coalesced, see the module docstring)."""
        for user in users:
            self._due[user] = self._due.get(user, False) or force
        if self._due and not self._closed:
            self._wake.set()
            if self._task is None or self._task.done():
                self._task = asyncio.create_task(self._run(), name="home-feed")

    async def on_event(self, event: Event) -> None:
        """A gate opened, was escalated or was decided: record a person's decision, and mark as due every
        viewer who may decide the gate (and whoever decided it). Never raises."""
        if event.type not in (
            EventType.GATE_OPENED,
            EventType.GATE_DECIDED,
            EventType.GATE_ESCALATED,  # widens who may decide: their Home lists the gate now
            EventType.GATE_APPROVAL,
        ):
            return
        data = event.data
        gate_id = str(data.get("gate_id") or "")
        try:
            due: set[str] = set()
            by = data.get("by")
            viewers: list[str] | None = None
            if event.type is EventType.GATE_DECIDED and isinstance(by, str) and _is_person(by):
                viewers = await self._record_decision(by, gate_id, _float(data.get("decided_at")))
                due.add(by)
            if event.type is EventType.GATE_APPROVAL and isinstance(by, str) and by:
                due.add(by)  # counted: the gate leaves their list (it waits for others)
                if _is_person(by):  # and is among their decisions
                    viewers = await self._record_decision(by, gate_id, _float(data.get("at")))
            if viewers is None:
                viewers = await self._viewers()
            gate = await self.gateway.get_gate(gate_id) if viewers else None
            if gate is not None and _from_slack(gate):
                due.update([u for u in viewers if await self._may(u, gate) is not None])
                # Whoever's approval counted: their decisions show the outcome.
                due.update(a.by for a in gate.approvals)
            # Only the views of people who open Home are kept fresh: a decider who never
            # did gets theirs (with this decision) when they first open it. Rendering a view
            # reads every shard's pending gates, so this is most of a busy web's Home work.
            self.touch(due.intersection(viewers))
        except Exception as exc:  # Home is best effort: the event's own work goes on
            log.warning("Home not refreshed for event %s: %s", event.id, type(exc).__name__)

    async def _viewers(self) -> list[str]:
        found: list[str] = await self.redis.zrangebyscore(*self._viewers_range())
        return found

    def _viewers_range(self) -> tuple[str, float, str]:
        return self._viewers_key(), time.time() - VIEWER_DAYS * 86400, "+inf"

    async def _may(self, user: str, gate: Gate) -> PendingItem | None:
        """What ``user`` may do with ``gate`` (as a card click would be judged), or None."""
        if gate.quorum is not None and any(a.by == user for a in gate.approvals):
            return None  # they approved it already: it waits for others (bot/quorum_view.py)
        approve = await self.approvers.why_not_decide(user, gate, approve=True) is None
        if approve and gate.quorum is not None and gate.quorum.groups:
            groups = await self.approvers.quorum_groups(user, gate)
            approve = quorum_view.may_still_approve(user, gate, groups)
        if approve or await self.approvers.why_not_decide(user, gate, approve=False) is None:
            return PendingItem(gate, approve=approve)
        return None

    def _decided_key(self, user: str, shard: int) -> str:
        return self.keys.ext(DECIDED_NS, user, shard)

    async def _record_decision(self, user: str, gate_id: str, at: float | None) -> list[str]:
        """Record ``user``'s decision of ``gate_id``; the viewers, read in the same round
        trip."""
        if not self.keys.owns(gate_id):
            return await self._viewers()
        key = self._decided_key(user, self.keys.shard_of(gate_id))
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(key, {gate_id: at or time.time()})
            pipe.zremrangebyrank(key, 0, -(MAX_DECISIONS_SHOWN + 1))
            pipe.expire(key, DECISIONS_DAYS * 86400)
            pipe.zrangebyscore(*self._viewers_range())
            replies = await pipe.execute()
        viewers: list[str] = replies[-1]
        return viewers

    # --- reading ----------------------------------------------------------------------
    async def pending_gates(self) -> list[Gate]:
        """The pending gates started from Slack, soonest deadline first (at most
        PENDING_PER_SHARD of each shard)."""
        k = self.keys
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in k.all_shards():
                pipe.zrange(k.deadlines(shard), 0, PENDING_PER_SHARD - 1)
            per_shard = await pipe.execute()
        ids = [g for rows in per_shard for g in rows]
        gates = await self.gateway.gates_by_id(ids)
        pending = [g for g in gates if g.status is GateStatus.PENDING and _from_slack(g)]
        return sorted(pending, key=lambda g: g.deadline)

    async def decisions(self, user: str) -> list[Gate]:
        """The gates ``user`` decided last, newest first."""
        k = self.keys
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in k.all_shards():
                pipe.zrevrange(self._decided_key(user, shard), 0, MAX_DECISIONS_SHOWN - 1)
            per_shard = await pipe.execute()
        gates = await self.gateway.gates_by_id([g for rows in per_shard for g in rows])
        mine = [(at, g) for g in gates if (at := decided_at(g, user)) is not None]
        mine.sort(key=lambda pair: -pair[0])
        return [g for _, g in mine[:MAX_DECISIONS_SHOWN]]

    async def view_for(self, user: str, pending: list[Gate]) -> dict[str, Any]:
        """``user``'s Home view, from the pending gates read for this round."""
        items: list[PendingItem] = []
        more = 0
        for gate in pending:
            item = await self._may(user, gate)
            if item is None:
                continue
            if len(items) >= MAX_PENDING_SHOWN:
                more += 1
                continue
            items.append(PendingItem(gate, item.approve, await self._link(gate)))
        notice = _notice(await self.redis.get(self.keys.ext(NOTICE_NS, user)))
        decided = await self.decisions(user)
        notice_text = notice[0] if notice else None
        return home_view(items, decided, notice=notice_text, more=more, viewer=user)

    async def _link(self, gate: Gate) -> str | None:
        """The permalink of the gate's card (chat.getPermalink, once per process), if any."""
        link = self._links.get(gate.gate_id)
        if link is not None:
            return link or None
        rec = await self.store.card(gate.gate_id)
        if not rec.channel or not rec.ts:
            return None  # not posted yet: asked again next time
        try:
            resp = await self.client.chat_getPermalink(channel=rec.channel, message_ts=rec.ts)
            link = str(resp.get("permalink") or "")
        except Exception as exc:
            log.info("no permalink for the card of %s: %s", gate.gate_id, slack_error(exc))
            link = ""
        if len(self._links) >= PERMALINK_CACHE:
            self._links.clear()
        self._links[gate.gate_id] = link
        return link or None

    # --- publishing -------------------------------------------------------------------
    async def _run(self) -> None:
        failures = 0
        while self._due:
            self._wake.clear()
            due, self._due = self._due, {}
            try:
                leased = await self._take_leases(list(due))
                for user, forced in due.items():
                    if user not in leased:
                        self._due[user] = self._due.get(user, False) or forced
                if leased:
                    # The views' hashes before the gates: a view another replica publishes
                    # after this read (from newer gates) makes this one's publish a
                    # hash_conflict instead of overwriting it with older ones.
                    hashes = await self._hashes(leased)
                    pending = await self.pending_gates()
                    for user in leased:
                        await self._publish(user, pending, hashes[user], force=due[user])
                failures = 0
            except Exception as exc:
                failures += 1
                log.warning("Home views not published (%s); retrying", type(exc).__name__)
                for user, forced in due.items():
                    self._due[user] = self._due.get(user, False) or forced
                if failures >= 5:
                    log.error("Home views dropped after %d failures", failures)
                    self._due.clear()
                    return
                await asyncio.sleep(self.interval)
                continue
            if self._due:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), RETRY_PAUSE)
                await asyncio.sleep(RETRY_PAUSE / 5)

    async def _take_leases(self, users: list[str]) -> list[str]:
        """The users whose view may be published now (nobody published it this second)."""
        ms = int(self.interval * 1000)
        async with self.redis.pipeline(transaction=False) as pipe:
            for user in users:
                pipe.set(self.keys.ext(LEASE_NS, user), "1", nx=True, px=ms)
            got = await pipe.execute()
        return [u for u, ok in zip(users, got, strict=True) if ok]

    async def _hashes(self, users: list[str]) -> dict[str, str | None]:
        """Slack's hash of each user's Home view as last published (by any replica)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for user in users:
                pipe.get(self.keys.ext(HASH_NS, user))
            got = await pipe.execute()
        return {
            u: (h.decode() if isinstance(h, bytes) else h) for u, h in zip(users, got, strict=True)
        }

    async def _publish(
        self, user: str, pending: list[Gate], known: str | None, *, force: bool
    ) -> None:
        """Publish ``user``'s view of ``pending``, if Slack still shows the view whose hash is
        ``known`` (read before ``pending``); else it is read and rendered again."""
        view = await self.view_for(user, pending)
        digest = hashlib.sha256(json.dumps(view, sort_keys=True).encode()).hexdigest()
        if not force and self._shown.get(user) == digest:
            return
        hash_key = self.keys.ext(HASH_NS, user)
        try:
            if known:
                resp = await self.client.views_publish(user_id=user, view=view, hash=known)
            else:
                resp = await self.client.views_publish(user_id=user, view=view)
        except Exception as exc:
            if slack_error(exc) == "hash_conflict":
                # Published meanwhile (by another replica, from newer gates): this view may be
                # older. Read and render again. A hash that conflicts twice is forgotten, so
                # that a view changed outside this deployment does not block its updates.
                if self._conflicts.pop(user, None) == known:
                    await self.redis.delete(hash_key)
                else:
                    self._conflicts[user] = known
                self.touch([user], force=True)
                return
            if is_transient(exc):
                raise
            log.error("Slack refused the Home view of %s: %s", user, slack_error(exc))
            return
        self._conflicts.pop(user, None)
        got = (resp.get("view") or {}).get("hash")
        if isinstance(got, str) and got:
            await self.redis.set(hash_key, got, ex=VIEWER_DAYS * 86400)
        self.published += 1
        self._shown[user] = digest

    async def close(self) -> None:
        """Stop publishing (views still due are left for the next change)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def _from_slack(gate: Gate) -> bool:
    channel = gate.origin.get("channel")
    return isinstance(channel, str) and bool(channel)


def _notice(raw: str | None) -> tuple[str, float] | None:
    """A stored notice: its text and when it was set."""
    try:
        data = json.loads(raw) if raw else None
        return (str(data["text"]), float(data["at"])) if isinstance(data, dict) else None
    except (ValueError, KeyError, TypeError):
        return None


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _is_person(user: str | None) -> bool:
    return bool(user) and user != "system" and not str(user).startswith(("rule:", "grant:"))
