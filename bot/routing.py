"""Approval channels: a gate whose tool (or agent, or APPROVAL_ROUTES) names a channel has
its card posted there, and one compact line in the task's thread.

- The card goes to the approval channel as a top-level message, with a link to the task's
  thread (``chat.getPermalink``, asked once and kept in the card's record).
- The thread gets one line (a record of its own, :data:`bot.store.NOTE_NS`), "⏳ `tool`:
  waiting for approval in #channel", which tells the outcome once the gate is decided,
  expires or is closed.
- Both are posted once and updated under the gate's lock, through the publisher's
  post-once/digest machinery, like any card.
- If Slack refuses the channel (``not_in_channel``, ``channel_not_found``, ``is_archived``),
  the refusal is recorded with the card, and the card is posted in the task's thread saying
  why: a gate is never left without a card.
- A turn's "Approve all" message goes where its gates' cards went when they all went to the
  same approval channel, else to the thread (:func:`turn_place`).

A gate whose approval channel is the task's own channel is shown in its thread, as usual.
This module is the publisher's companion: it posts through its post-once machinery.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from agent_core.models import Gate

from . import cards, route_cards
from .store import CARD_NS, NOTE_NS, CardRecord, Held, card_record

if TYPE_CHECKING:
    from .publisher import Publisher

log = logging.getLogger(__name__)

NOTE_EVENT_TYPE = "approval_note"


class ChannelRefused(Exception):
    """Slack refused to post in the approval channel, for a reason that will not pass."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


def note_metadata(gate_id: str) -> dict[str, Any]:
    """The metadata a gate's line in the task's thread is posted with."""
    return {"event_type": NOTE_EVENT_TYPE, "event_payload": {"gate_id": gate_id}}


def routed(gate: Gate) -> bool:
    """Whether the gate's card goes to an approval channel other than its task's."""
    origin = _opt_str(gate.origin.get("channel"))
    return bool(gate.approval_channel and origin and gate.approval_channel != origin)


async def show_routed(
    pub: Publisher, gate: Gate, rec: CardRecord, note_h: dict[str, str], held: Held
) -> None:
    """Post or update a routed gate's card and its line in the task's thread (under the
    gate's lock, ``held``)."""
    from .publisher import card_metadata

    store = pub.store
    origin_channel = _opt_str(gate.origin.get("channel"))
    thread_ts = _opt_str(gate.origin.get("thread_ts"))
    slot = _slot(gate.gate_id, CARD_NS, card_metadata(gate.gate_id))
    note_slot = _slot(gate.gate_id, NOTE_NS, note_metadata(gate.gate_id))
    note = route_cards.thread_note(gate)
    note_rec = card_record(note_h)

    async def show_note() -> None:
        await pub._show(
            note_slot, note_rec, note, lambda: note, origin_channel, thread_ts, held=held
        )

    async def in_thread(line: str) -> None:
        card, smaller = _cards(gate, rec, line)
        await pub._show(
            slot, rec, card, smaller, origin_channel, thread_ts, shown=gate.status.value, held=held
        )

    if rec.route_error:  # refused by the channel: the card lives in the thread
        await in_thread(route_cards.fallback_line(gate.approval_channel, rec.route_error))
        return
    link = rec.thread_link
    if not rec.ts and link is None:
        link = await _thread_link(pub, origin_channel, thread_ts)
        if link:
            await store.set_card_fields(gate.gate_id, {"thread_link": link})
    card, smaller = _cards(gate, rec, route_cards.thread_line(link))
    if rec.ts:
        # The line first: once the card shows an outcome, the notifier leaves both alone.
        await show_note()
    # A first post may be refused by the channel (the bot is not in it, it is archived...);
    # an update of a posted card is not (its failure is the card's, handled by _show).
    refused = frozenset() if rec.ts else frozenset(route_cards.ROUTE_ERRORS)
    try:
        await pub._show(
            slot,
            rec,
            card,
            smaller,
            gate.approval_channel,
            None,
            shown=gate.status.value,
            held=held,
            refused=refused,
        )
    except ChannelRefused as exc:
        log.warning(
            "gate %s: cannot post in %s (%s): its card goes to the task's thread",
            gate.gate_id,
            gate.approval_channel,
            exc.error,
        )
        await store.set_card_fields(gate.gate_id, {"route_error": exc.error})
        await in_thread(route_cards.fallback_line(gate.approval_channel, exc.error))
        return
    if not rec.ts:
        await show_note()


async def turn_place(
    pub: Publisher,
    gates: list[Gate],
    card: cards.Card,
    channel: str | None,
    thread_ts: str | None,
) -> tuple[str | None, str | None, cards.Card]:
    """Where a turn's "Approve all" message goes, and what it shows: in the approval channel,
    with a link to the task's thread, when every gate of the turn has its card there; else
    in the task's thread, as it is."""
    recs = [await pub.store.card(g.gate_id) for g in gates]
    places = {r.channel for r in recs}
    if len(places) != 1 or any(r.route_error for r in recs):
        return channel, thread_ts, card
    (place,) = places
    if not place or place == channel or place != gates[0].approval_channel:
        return channel, thread_ts, card
    line = cards.context(route_cards.thread_line(recs[0].thread_link))
    return place, None, cards.Card(card.text, [*card.blocks, line])


def _cards(gate: Gate, rec: CardRecord, line: str) -> tuple[cards.Card, Any]:
    card = route_cards.with_line(cards.gate_card(gate, rec.result), line)

    def smaller() -> cards.Card:
        return route_cards.with_line(cards.gate_card(gate, rec.result, compact=True), line)

    return card, smaller


async def _thread_link(pub: Publisher, channel: str | None, thread_ts: str | None) -> str:
    """The permalink of the task's thread ("" when Slack gives none)."""
    if not channel or not thread_ts:
        return ""
    resp = await pub._call("chat_getPermalink", channel=channel, message_ts=thread_ts)
    link = resp.get("permalink") if resp is not None else None
    return link if isinstance(link, str) else ""


def _slot(ident: str, ns: str, metadata: dict[str, Any]) -> Any:
    from .publisher import _Slot

    return _Slot(ident, ns, metadata)


def _opt_str(v: object) -> str | None:
    return v if isinstance(v, str) and v else None
