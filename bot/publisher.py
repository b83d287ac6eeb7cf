"""Puts the truth on Slack: posts and updates gate cards and run messages.

Every method renders from the current state in Redis (the gate record, the stored tool
result), under a per-gate or per-run lock, so events delivered twice, out of order or to
two replicas at once all converge on one card showing the latest state. An unchanged
rendering is not sent again.

A card is posted at most once even when the process posting it dies before it records where
the card went: the intent is recorded first, the card carries the gate id as message
metadata, and a process that finds an intent without a card looks for the message on Slack
(``conversations.replies``/``conversations.history`` with ``include_all_metadata``) and
adopts it instead of posting another. Every message found for a gate is kept, and every
update goes to all of them, so none keeps live buttons after the gate is decided.

Rate limits: by default the Web API client waits out a 429 (``Retry-After``) and tries again.
Within :func:`raising_rate_limits` (the notifier's tasks) a 429 raises :class:`RateLimited`
at once instead, so that the caller can wait without holding up other work: the notifier
lets the other Slack threads go on meanwhile.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.web.async_client import AsyncWebClient

from agent_core import metrics
from agent_core.gateway import valid_gate_id, valid_run_id
from agent_core.models import Gate, GateStatus, Run

from . import cards, rejoin, routing, run_cards
from .answers import Attachment, no_file_message
from .ports import GatewayLike
from .refreshing import Refreshes
from .store import (
    CARD_NS,
    NOTE_NS,
    RUN_NS,
    TURN_NS,
    CardRecord,
    Held,
    Store,
    card_record,
    result_fields,
    run_record,
    turn_ident,
)

log = logging.getLogger(__name__)

# Slack refused the size or shape of the blocks: a smaller card may still go through.
TOO_BIG = frozenset({"invalid_blocks", "msg_blocks_too_long", "msg_too_long"})
# An update refused because the app is out of the card's channel (removed, the channel
# archived): the card is marked stale, and shown again once the app is back (bot/rejoin.py).
STALE_ERRORS = frozenset({"not_in_channel", "channel_not_found", "is_archived"})
# Errors worth trying again later; any other Slack error will not fix itself.
TRANSIENT_SLACK_ERRORS = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)
# The message metadata every card carries (Slack's ``metadata`` on chat.postMessage), and
# every "Approve all" message of a turn.
CARD_EVENT_TYPE = "approval_gate"
TURN_EVENT_TYPE = "approval_turn"
# Looking for a card whose post was never recorded: from this long before the attempt (clocks
# differ), at most this many pages of this many messages.
SEARCH_MARGIN_SECONDS = 600.0
SEARCH_PAGES = 10
SEARCH_PAGE_SIZE = 200
# How many parents up a sub-agent's run is followed to its top run (deeper than any
# MAX_DEPTH; a loop in the data cannot hang).
MAX_RUN_DEPTH = 32


class TransientSlackError(Exception):
    """Slack could not be reached or asked us to come back later."""


class RateLimited(TransientSlackError):
    """Slack answered 429: try again in ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


# Set in a task whose Web API calls should raise RateLimited on a 429 instead of waiting.
_RAISE_RATE_LIMITS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "raise_rate_limits", default=False
)


@contextlib.contextmanager
def raising_rate_limits() -> Iterator[None]:
    """Within this block (in this task), a 429 raises :class:`RateLimited` at once."""
    token = _RAISE_RATE_LIMITS.set(True)
    try:
        yield
    finally:
        _RAISE_RATE_LIMITS.reset(token)


def retry_after(exc: BaseException) -> float | None:
    """The seconds a 429 asks us to wait (at least 1), or None if ``exc`` is not one."""
    if not isinstance(exc, SlackApiError) or exc.response is None:
        return None
    if exc.response.status_code != 429:
        return None
    headers = exc.response.headers or {}
    raw = headers.get("Retry-After") or headers.get("retry-after") or "1"
    if isinstance(raw, list):
        raw = raw[0] if raw else "1"
    try:
        return max(1.0, float(raw))
    except (TypeError, ValueError):
        return 1.0


def slack_error(exc: BaseException) -> str:
    """A short, secret-free description of a Web API failure."""
    if isinstance(exc, SlackApiError):
        err = exc.response.get("error") if exc.response is not None else None
        return str(err or "error")
    return type(exc).__name__


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, SlackApiError):
        return slack_error(exc) in TRANSIENT_SLACK_ERRORS or exc.response.status_code >= 500
    return True


def can_respond(respond: Any) -> bool:
    """Whether Bolt's ``respond`` has somewhere to post: modal submissions, clicks in modals
    or App Home, and some shortcuts carry no ``response_url`` (Bolt's ``respond`` then
    raises). That is normal, not a failure worth a warning."""
    if respond is None:
        return False
    url = getattr(respond, "response_url", _NO_ATTRIBUTE)
    return url is _NO_ATTRIBUTE or (isinstance(url, str) and bool(url))


_NO_ATTRIBUTE = object()


def digest(card: cards.Card) -> str:
    raw = json.dumps([card.text, card.blocks], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def card_metadata(gate_id: str) -> dict[str, Any]:
    """The metadata a gate's card is posted with, by which it is found again."""
    return {"event_type": CARD_EVENT_TYPE, "event_payload": {"gate_id": gate_id}}


def turn_metadata(run_id: str, turn: int) -> dict[str, Any]:
    """The metadata a turn's "Approve all" message is posted with."""
    return {"event_type": TURN_EVENT_TYPE, "event_payload": {"run_id": run_id, "turn": str(turn)}}


def shows(message: Any, metadata: dict[str, Any], bot_id: str | None) -> bool:
    """Whether a message returned by conversations.* is one we posted with ``metadata``."""
    if not isinstance(message, dict):
        return False
    meta = message.get("metadata")
    if not isinstance(meta, dict) or meta.get("event_type") != metadata["event_type"]:
        return False
    if meta.get("event_payload") != metadata["event_payload"]:
        return False
    return bot_id is None or message.get("bot_id") == bot_id


def shows_gate(message: Any, gate_id: str, bot_id: str | None) -> bool:
    """Whether a message returned by conversations.* is a card of ``gate_id`` that we posted."""
    return shows(message, card_metadata(gate_id), bot_id)


@dataclass(frozen=True)
class _Slot:
    """Where a card's record lives (its name and the store namespace) and the metadata its
    message carries."""

    ident: str
    ns: str
    metadata: dict[str, Any]


class Publisher:
    def __init__(
        self, gateway: GatewayLike, store: Store, client: AsyncWebClient, command: str = "/agent"
    ) -> None:
        self.gateway = gateway
        self.store = store
        self.client = client
        self.command = command
        self._bot_id: str | None = None
        self._clients: dict[tuple[bool, bool], AsyncWebClient] = {}
        # When this process last looked for stale cards of each channel (bot/rejoin.py).
        self.stale_checked = rejoin.Checked()
        # Card updates clicks are making in this process (bot/refreshing.py).
        self.refreshes = Refreshes()

    def _client(self, post: bool = False) -> AsyncWebClient:
        """The client for a call. ``post``: without the retry on connection errors (cards and
        messages: a post Slack carried out whose answer was lost would be posted twice, and
        a first card would keep live buttons; the event is retried instead, and the retry
        adopts the card, see the "posting" mark). Within :func:`raising_rate_limits`, also
        without the wait on 429. Made when first needed, with the client's session then."""
        raising = _RAISE_RATE_LIMITS.get()
        if not post and not raising:
            return self.client
        made = self._clients.get((post, raising))
        if made is None or made.session is not self.client.session:
            dropped: tuple[type, ...] = ()
            if post:
                dropped += (AsyncConnectionErrorRetryHandler,)
            if raising:
                dropped += (AsyncRateLimitErrorRetryHandler,)
            client = self.client
            made = type(client)(
                token=client.token,
                base_url=client.base_url,
                timeout=client.timeout,
                session=client.session,
                headers=client.headers,
                retry_handlers=[h for h in client.retry_handlers if not isinstance(h, dropped)],
            )
            self._clients[(post, raising)] = made
        return made

    async def show_gate(
        self, gate_id: str, *, result: cards.ToolResult | None = None
    ) -> Gate | None:
        """Post the gate's card, or update it (and any other message showing the gate) to the
        gate's current state; the gate as shown (None if there is none). ``result``: the
        call's outcome, stored first (as :meth:`Store.set_result` does) in the same round
        trip as the lock is taken.

        Raises :class:`TransientSlackError` when Slack should be tried again later.
        """
        store = self.store
        if not valid_gate_id(gate_id, store.keys):
            if result is not None:
                await store.set_result(gate_id, result)
            return None
        # The gate and its card's record are read as the lock is taken, and what the card
        # shows now is recorded as it is released: two round trips instead of five (a
        # click's card update is most of what web does per click).
        read = [store.card_key(gate_id), store.keys.gate(gate_id), store.card_key(gate_id, NOTE_NS)]
        first = result_fields(result) if result is not None else None
        async with store.lock(f"gate:{gate_id}", read=read, write_first=first) as held:
            card_h, h, note_h = held.read
            if not h:
                return None
            gate = Gate.from_hash(h)
            rec = card_record(card_h)
            if routing.routed(gate):  # its card goes to an approval channel
                await routing.show_routed(self, gate, rec, note_h, held)
            else:
                await self._show_in_thread(gate, rec, held)
        # An update went through: the app is in that channel, and cards refused while it
        # was out are shown again (after the lock: they take their own).
        for channel in held.landed:
            await rejoin.refresh_lazily(self, channel)
        return gate

    async def _show_in_thread(self, gate: Gate, rec: CardRecord, held: Held) -> None:
        gate_id = gate.gate_id
        await self._show(
            _Slot(gate_id, CARD_NS, card_metadata(gate_id)),
            rec,
            cards.gate_card(gate, rec.result),
            lambda: cards.gate_card(gate, rec.result, compact=True),
            _opt_str(gate.origin.get("channel")),
            _opt_str(gate.origin.get("thread_ts")),
            shown=gate.status.value,
            held=held,
        )

    async def turn_gates(self, run_id: str, turn: int) -> list[Gate]:
        """The gates a turn of the run opened, in the order of their calls."""
        return [g for g in await self.gateway.gates(run_id) if g.turn == turn]

    async def show_turn(self, run_id: str, turn: int, *, post_for: str | None = None) -> None:
        """Update the "Approve all" message of a turn with two or more gates to their state.

        It is posted only for ``post_for``, the turn's last gate (its card comes before it),
        and only while a gate is pending. Raises :class:`TransientSlackError` as
        :meth:`show_gate` does.
        """
        ident = turn_ident(run_id, turn)
        async with self.store.lock(f"turn:{ident}"):
            rec = await self.store.card(ident, TURN_NS)
            known = rec.ts is not None or rec.posting is not None
            if not known and post_for is None:
                return  # never posted: nothing to update
            gates = await self.turn_gates(run_id, turn)
            if len(gates) < 2:
                return
            waiting = any(g.status is GateStatus.PENDING for g in gates)
            if not known and (gates[-1].gate_id != post_for or not waiting):
                return
            card = cards.turn_card(gates)
            origin = gates[0].origin
            channel, thread_ts = _opt_str(origin.get("channel")), _opt_str(origin.get("thread_ts"))
            if any(g.approval_channel for g in gates):
                # Where its gates' cards went: their approval channel, or the thread.
                channel, thread_ts, card = await routing.turn_place(
                    self, gates, card, channel, thread_ts
                )
            await self._show(
                _Slot(ident, TURN_NS, turn_metadata(run_id, turn)),
                rec,
                card,
                lambda: card,
                channel,
                thread_ts,
            )

    async def _show(
        self,
        slot: _Slot,
        rec: CardRecord,
        card: cards.Card,
        smaller: Callable[[], cards.Card],
        channel: str | None,
        thread_ts: str | None,
        *,
        shown: str | None = None,
        held: Held | None = None,
        refused: frozenset[str] = frozenset(),
    ) -> None:
        """Post a card (a gate's, a turn's) once, or update every message showing it
        (``shown``: the gate status it shows, kept with the card's digest; written as
        ``held``, the card's lock, is released, when given). A post that Slack refuses with
        an error in ``refused`` raises :class:`~bot.routing.ChannelRefused`."""
        d = digest(card)
        if not rec.ts and rec.posting is not None and channel:
            # A process asked Slack to post this card and died (or lost the answer)
            # before recording where it went: adopt that card rather than post another.
            found = await self._find_cards(slot.metadata, channel, thread_ts, rec.posting)
            if found:
                log.warning("adopting %d message(s) of %s posted before", len(found), slot.ident)
                await self.store.adopt_cards(slot.ident, channel, found, slot.ns)
                rec = await self.store.card(slot.ident, slot.ns)
        if rec.channel and rec.ts:
            await self._update_cards(slot, rec, card, smaller, d, shown, held)
            return
        if not channel:
            return  # a run started outside Slack: no card
        await self.store.mark_posting(slot.ident, time.time(), slot.ns)
        resp = await self._send_card(
            "chat_postMessage",
            card,
            smaller,
            channel=channel,
            thread_ts=thread_ts,
            metadata=slot.metadata,
            refused=refused,
        )
        if resp is None:
            return
        posted = str(resp.get("channel") or channel)
        if held is not None:
            held.landed.add(posted)
        if not await self.store.save_card(slot.ident, posted, str(resp["ts"]), d, slot.ns):
            # Another process posted a card for this gate meanwhile (we were paused past
            # the lock): both now get the current state.
            rec = await self.store.card(slot.ident, slot.ns)
            await self._update_cards(slot, rec, card, smaller, d, shown)

    async def _update_cards(
        self,
        slot: _Slot,
        rec: CardRecord,
        card: cards.Card,
        smaller: Callable[[], cards.Card],
        d: str,
        shown: str | None = None,
        held: Held | None = None,
    ) -> None:
        """Show the current state on every message of the card; the digest only when the
        card itself took it."""
        if rec.digest == d or not rec.channel or not rec.ts:
            return
        channel = rec.channel
        try:
            for ts in rec.others:
                resp = await self._send_card(
                    "chat_update", card, smaller, channel=channel, ts=ts, refused=STALE_ERRORS
                )
                if resp is None:  # deleted, or refused for good: stop trying it
                    await self.store.drop_other(slot.ident, ts, slot.ns)
            ok = await self._send_card(
                "chat_update", card, smaller, channel=channel, ts=rec.ts, refused=STALE_ERRORS
            )
        except routing.ChannelRefused as exc:
            await self._mark_stale(channel, slot.ident, slot.ns, exc.error)
            return
        if ok is None:
            return
        if held is not None:
            held.landed.add(channel)
        if held is None:
            await self.store.set_card_digest(slot.ident, d, slot.ns, shown=shown)
        else:
            fields = self.store.card_digest_fields(d, shown)
            held.write_at_release(self.store.card_key(slot.ident, slot.ns), fields)

    async def _find_cards(
        self, metadata: dict[str, Any], channel: str, thread_ts: str | None, since: float
    ) -> list[str]:
        """The ts of every message we posted with ``metadata`` (oldest first), from Slack.

        ``[]`` when there is none, or when Slack will not let us look (e.g. a workspace
        that has not granted the history scopes): the card is then posted again.
        """
        bot_id = await self._own_bot_id()
        args: dict[str, Any] = {
            "channel": channel,
            "include_all_metadata": True,
            "limit": SEARCH_PAGE_SIZE,
            "oldest": f"{max(since - SEARCH_MARGIN_SECONDS, 0):.6f}",
        }
        method = "conversations_history"
        if thread_ts:
            method = "conversations_replies"
            args["ts"] = thread_ts
        found: list[str] = []
        cursor = ""
        for _ in range(SEARCH_PAGES):
            try:
                resp = await getattr(self._client(), method)(**args, cursor=cursor or None)
            except Exception as exc:
                if is_transient(exc):
                    raise _transient(method, exc) from exc
                log.warning(
                    "cannot look for the %s message %s posted before (%s): posting it again;"
                    " the earlier one, if any, will not be updated",
                    metadata["event_type"],
                    metadata["event_payload"],
                    slack_error(exc),
                )
                return []
            messages = resp.get("messages")
            for m in messages if isinstance(messages, list) else []:
                if shows(m, metadata, bot_id) and isinstance(m.get("ts"), str):
                    found.append(m["ts"])
            meta = resp.get("response_metadata")
            cursor = _opt_str(meta.get("next_cursor") if isinstance(meta, dict) else None) or ""
            if not cursor or not resp.get("has_more", True):
                break
        return sorted(set(found), key=_ts_order)

    async def _own_bot_id(self) -> str | None:
        """Our bot id (auth.test, once), so that a look-up adopts only our own messages."""
        if self._bot_id is None:
            try:
                resp = await self._client().auth_test()
            except Exception as exc:
                raise _transient("auth.test", exc) from exc
            self._bot_id = _opt_str(resp.get("bot_id")) or ""
        return self._bot_id or None

    async def show_run(self, run_id: str) -> None:
        """Update the run's root message ("Task started by …") to its current status.

        A thread's root message shows its top run, never a sub-agent's: for a sub-agent's
        run (which shares its parent's thread) the run above it is shown instead."""
        for _ in range(MAX_RUN_DEPTH):
            if not valid_run_id(run_id, self.store.keys):
                return
            async with self.store.lock(f"run:{run_id}", read=self._run_reads(run_id)) as held:
                parent = await self._show_root(run_id, held)
            if parent is None:
                return
            run_id = parent

    def _run_reads(self, run_id: str) -> list[str]:
        # Read as the run's lock is taken (see show_gate): the run, and our record of it.
        return [self.store.keys.run(run_id), self.store.run_key(run_id)]

    async def _show_root(self, run_id: str, held: Held) -> str | None:
        """Show the run on its root message; for a sub-agent's run, show nothing and return
        its parent's id (the caller shows that one, under its own lock)."""
        h, rec_h = held.read
        if not h:
            return None
        if h.get("parent"):
            return str(h["parent"])
        run = Run.from_hash(h)
        rec = run_record(rec_h)
        # Only the bot's own root message: the recorded one, else the one `/agent` posted
        # before starting the run (origin's root_ts; its web process may have died before
        # recording it). A mention's or DM's thread starts with the person's own message,
        # which is not ours to update: its root message is shown once recorded.
        channel = rec.channel or _opt_str(run.origin.get("channel"))
        ts = rec.ts or _opt_str(run.origin.get("root_ts"))
        if not channel or not ts:
            return None
        # A finished run names its calls that never ran (one more read, once it finished).
        gates = await self.gateway.gates(run_id) if run.status.finished else []
        card = run_cards.root_message(run.task, run.requested_by, run, self.command, gates)
        d = digest(card)
        if rec.digest == d:
            return None
        try:
            resp = await self._call(
                "chat_update",
                channel=channel,
                ts=ts,
                text=card.text,
                blocks=card.blocks,
                refused=STALE_ERRORS,
            )
        except routing.ChannelRefused as exc:
            # Else the root message would say the run is still waiting, for good.
            await self._mark_stale(channel, run_id, RUN_NS, exc.error)
            return None
        if resp is not None:
            held.write_at_release(self.store.run_key(run_id), {"digest": d})
        return None

    async def post_in_thread(
        self,
        run_id: str,
        origin: dict[str, Any],
        marker: str,
        texts: list[str],
        *,
        show_run: bool = False,
        file: Attachment | None = None,
    ) -> None:
        """Post ``texts`` in the run's thread, each at most once (``marker`` names them), then
        share ``file`` there once (when Slack refuses it for good, say so instead); then,
        with ``show_run``, update its root message as :meth:`show_run` does, under the same
        lock."""
        channel = _opt_str(origin.get("channel"))
        if not channel or not valid_run_id(run_id, self.store.keys):
            if show_run:
                await self.show_run(run_id)
            return
        parent = None
        async with self.store.lock(f"run:{run_id}", read=self._run_reads(run_id)) as held:
            posted = held.read[1]
            thread_ts = _opt_str(origin.get("thread_ts"))
            done = True
            for i, text in enumerate(texts):
                part = f"{marker}:{i}"
                if f"posted:{part}" in posted:
                    continue
                resp = await self._call(
                    "chat_postMessage", post=True, channel=channel, thread_ts=thread_ts, text=text
                )
                if resp is None:
                    done = False
                    break
                # At once, not at the release: a part posted is never posted again.
                await self.store.mark_posted(run_id, part, str(resp.get("ts", "")))
            if file is not None and done and f"posted:{marker}:file" not in posted:
                await self._share_file(run_id, marker, posted, channel, thread_ts, file)
            if show_run:
                parent = await self._show_root(run_id, held)
        if parent is not None:
            await self.show_run(parent)

    async def _share_file(
        self,
        run_id: str,
        marker: str,
        posted: dict[str, str],
        channel: str,
        thread_ts: str | None,
        file: Attachment,
    ) -> None:
        """Upload ``file`` into the thread (files.uploadV2), once; if Slack refuses it for
        good (no ``files:write`` scope, say), tell the thread instead, once."""
        try:
            resp = await self._client(post=True).files_upload_v2(
                channel=channel,
                thread_ts=thread_ts,
                filename=file.filename,
                title=file.title,
                content=file.content,
            )
        except Exception as exc:
            if is_transient(exc):
                raise _transient("files.uploadV2", exc) from exc
            error = slack_error(exc)
            log.error("Slack refused the answer's file: %s", error)
            if f"posted:{marker}:nofile" not in posted:
                resp = await self._call(
                    "chat_postMessage",
                    post=True,
                    channel=channel,
                    thread_ts=thread_ts,
                    text=no_file_message(file.content, error),
                )
                if resp is not None:
                    await self.store.mark_posted(run_id, f"{marker}:nofile", str(resp.get("ts")))
            await self.store.mark_posted(run_id, f"{marker}:file", f"refused:{error}")
            return
        shared = resp.get("file")
        file_id = shared.get("id") if isinstance(shared, dict) else None
        await self.store.mark_posted(run_id, f"{marker}:file", str(file_id or "shared"))

    async def post_message(self, channel: str, thread_ts: str | None, text: str) -> str | None:
        """Post ``text`` (in ``thread_ts``'s thread): its ts, or None when Slack refused for
        good (logged). Raises :class:`TransientSlackError` as :meth:`show_gate` does."""
        resp = await self._call(
            "chat_postMessage", post=True, channel=channel, thread_ts=thread_ts, text=text
        )
        return None if resp is None else str(resp.get("ts") or "")

    async def tell(
        self,
        user_id: str,
        text: str,
        *,
        channel: str | None = None,
        respond: Any = None,
    ) -> None:
        """An ephemeral message to one user: via the payload's response_url when it has one,
        else with chat.postEphemeral in ``channel``; with neither (a click in a modal, say),
        nothing is said."""
        if can_respond(respond):
            try:
                await respond(text=text, response_type="ephemeral", replace_original=False)
                return
            except Exception as exc:
                log.warning("response_url failed (%s); trying chat.postEphemeral", slack_error(exc))
        if channel:
            try:
                await self.client.chat_postEphemeral(channel=channel, user=user_id, text=text)
            except Exception as exc:
                log.warning("could not tell %s: %s", user_id, slack_error(exc))

    async def _send_card(
        self,
        method: str,
        card: cards.Card,
        smaller: Callable[[], cards.Card],
        *,
        refused: frozenset[str] = frozenset(),
        **kwargs: Any,
    ) -> Any:
        """Send a card; if Slack refuses its size or shape, send the compact one instead
        (rendered only then). An error in ``refused`` raises ChannelRefused."""
        client = self._client(post=method == "chat_postMessage")
        try:
            return await getattr(client, method)(text=card.text, blocks=card.blocks, **kwargs)
        except Exception as exc:
            if isinstance(exc, SlackApiError) and slack_error(exc) in refused:
                raise routing.ChannelRefused(slack_error(exc)) from exc
            if not isinstance(exc, SlackApiError) or slack_error(exc) not in TOO_BIG:
                return self._failed(method, exc)
            log.warning("Slack refused a card (%s); sending the compact one", slack_error(exc))
        compact = smaller()
        try:
            return await getattr(client, method)(text=compact.text, blocks=compact.blocks, **kwargs)
        except Exception as exc:
            return self._failed(method, exc)

    async def _call(
        self,
        method: str,
        *,
        post: bool = False,
        refused: frozenset[str] = frozenset(),
        **kwargs: Any,
    ) -> Any:
        """Call the Web API; ``None`` for a permanent failure (logged), raise if transient;
        an error in ``refused`` raises ChannelRefused.

        Rate limits and connection errors were already retried by the client's handlers
        (except as :meth:`_client` says).
        """
        try:
            return await getattr(self._client(post), method)(**kwargs)
        except Exception as exc:
            if isinstance(exc, SlackApiError) and slack_error(exc) in refused:
                raise routing.ChannelRefused(slack_error(exc)) from exc
            return self._failed(method, exc)

    async def _mark_stale(self, channel: str, ident: str, ns: str, error: str) -> None:
        """Slack refused to update a message because the app is out of ``channel``: it is
        shown again once the app is back (bot/rejoin.py)."""
        log.warning(
            "%s %s in %s: Slack refused its update (%s); it is shown again once the app is"
            " back in the channel",
            ns,
            ident,
            channel,
            error,
        )
        await self.store.mark_stale(channel, ident, ns)
        self.stale_checked.at.pop(channel, None)  # the next update there looks at once

    def _failed(self, method: str, exc: Exception) -> None:
        if is_transient(exc):
            raise _transient(method, exc) from exc
        log.error("Slack refused %s: %s", method, slack_error(exc))
        return None


def _transient(method: str, exc: BaseException) -> TransientSlackError:
    """The error to raise for a transient failure: :class:`RateLimited` for a 429."""
    wait = retry_after(exc)
    if wait is None:
        return TransientSlackError(f"{method}: {slack_error(exc)}")
    if _RAISE_RATE_LIMITS.get():  # not counted by the client's handler, which is left out
        metrics.SLACK_RATE_LIMITED.labels(metrics.label(method.replace("_", "."))).inc()
    return RateLimited(f"{method}: {slack_error(exc)} (retry after {wait:.0f} s)", wait)


def _ts_order(ts: str) -> tuple[float, str]:
    try:
        return float(ts), ts
    except ValueError:
        return float("inf"), ts


def _opt_str(v: object) -> str | None:
    return v if isinstance(v, str) and v else None
