"""Cards Slack refused to update while the app was out of their channel, shown again once
it is back.

When someone removes the app from a channel (or archives it), Slack refuses ``chat.update``
there (``not_in_channel``, ``channel_not_found``, ``is_archived``). The publisher then
remembers the card as stale for that channel (:meth:`bot.store.Store.mark_stale`) and lets
the event go: nothing can show it meanwhile. Once the app is back, each stale card is shown
again from the gate's current state, through the publisher's normal path, under the card's
own lock, and its mark is cleared:

- at once when Slack tells the app it joined the channel (the ``member_joined_channel``
  event, for the app's own bot user; signed like any request, verified before Bolt sees it);
- lazily when any later update or post in that channel goes through (at most
  :data:`LAZY_BATCH` cards at a time, the channel looked at once per
  :data:`LAZY_CHECK_SECONDS` per process).

Showing a card again is idempotent (an unchanged rendering is not sent): an event delivered
twice, or a join of another user, changes nothing.
"""

from __future__ import annotations

import contextvars
import logging
import re
import time
from typing import TYPE_CHECKING, Any

from slack_bolt.async_app import AsyncApp
from slack_bolt.context.async_context import AsyncBoltContext

from .store import CARD_NS, NOTE_NS, RUN_NS, STALE_MAX, TURN_NS

if TYPE_CHECKING:
    from .context import BotContext
    from .publisher import Publisher

log = logging.getLogger(__name__)

# A later update in a channel shows at most this many of its stale cards again (the rest at
# the next one), so that a click's card update is never held up by a long backlog.
LAZY_BATCH = 20
# A process looks whether a channel has stale cards at most this often (one EXISTS).
LAZY_CHECK_SECONDS = 10.0
CHANNEL_ID = re.compile(r"^[CGD][A-Z0-9]{2,40}$")

# Set while stale cards are being shown again: their own updates do not start another round.
_REFRESHING: contextvars.ContextVar[bool] = contextvars.ContextVar("refreshing", default=False)


async def refresh_channel(pub: Publisher, channel: str, limit: int | None = None) -> int:
    """Show every stale card of ``channel`` again (at most ``limit``) and clear their marks;
    how many were shown. A card Slack still refuses is marked again (it stays stale).

    Raises what :meth:`Publisher.show_gate` raises (the marks not yet cleared are kept)."""
    marks = await pub.store.stale_cards(channel, limit or STALE_MAX)
    if not marks:
        return 0
    token = _REFRESHING.set(True)
    done: list[tuple[str, float]] = []
    try:
        for member, score in marks:
            ns, _, ident = member.partition(":")
            if ns in (CARD_NS, NOTE_NS):
                await pub.show_gate(ident)
            elif ns == RUN_NS:
                await pub.show_run(ident)
            elif ns == TURN_NS:
                run_id, _, turn = ident.rpartition(":")
                if turn.isdigit():
                    await pub.show_turn(run_id, int(turn))
            done.append((member, score))
    finally:
        _REFRESHING.reset(token)
        if done:
            await pub.store.clear_stale(channel, done)
    log.info("showed %d stale card(s) of %s again", len(done), channel)
    return len(done)


class Checked:
    """When this process last looked for stale cards of each channel (monotonic time)."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}

    def due(self, channel: str) -> bool:
        now = time.monotonic()
        if now - self.at.get(channel, -LAZY_CHECK_SECONDS) < LAZY_CHECK_SECONDS:
            return False
        if len(self.at) > 10_000:
            self.at.clear()
        self.at[channel] = now
        return True


async def refresh_lazily(pub: Publisher, channel: str) -> None:
    """An update in ``channel`` went through: show a few of its stale cards again, if it has
    any. Never fails the update that called it (a failure is logged and left for later)."""
    if _REFRESHING.get():
        return
    checked = pub.stale_checked
    if not checked.due(channel):
        return
    try:
        if not await pub.store.has_stale(channel):
            return
        shown = await refresh_channel(pub, channel, LAZY_BATCH)
        if shown >= LAZY_BATCH:
            checked.at.pop(channel, None)  # more to do: look again at the next update
    except Exception as exc:  # Slack, Redis or a busy lock: the next update tries again
        log.warning("stale cards of %s left for later: %s", channel, type(exc).__name__)
        checked.at.pop(channel, None)


def joined_channel(event: dict[str, Any], bot_user_id: str | None) -> str | None:
    """The channel the app's own bot user joined, from a ``member_joined_channel`` event;
    None for anyone else's join (or a malformed event)."""
    user, channel = event.get("user"), event.get("channel")
    if not bot_user_id or not isinstance(user, str) or user != bot_user_id:
        return None
    if not isinstance(channel, str) or not CHANNEL_ID.match(channel):
        return None
    return channel


def register(app: AsyncApp, ctx: BotContext) -> None:
    """Listen to ``member_joined_channel``: when the app itself joins, its stale cards there
    are shown again (after the ack)."""
    from .acking import at_ack

    @app.event("member_joined_channel")
    @at_ack(ctx)
    async def on_member_joined(ack: Any, event: dict[str, Any], context: AsyncBoltContext) -> None:
        await ack()
        channel = joined_channel(event, context.bot_user_id)
        if channel is None:
            return
        log.info("the app joined %s: showing its stale cards there again", channel)
        try:
            await refresh_channel(ctx.publisher, channel)
        except Exception as exc:  # left marked: the next update there shows them
            log.warning("stale cards of %s left for later: %s", channel, type(exc).__name__)
