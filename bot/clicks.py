"""What a card's click or a form carries, and how the clicker is told.

Shared by the listeners of ``bot/actions.py`` (a gate's buttons and deny form),
``bot/turn_actions.py`` (a turn's "Approve all N" / "Deny all") and ``bot/edit_view.py``: the
payload's readers (who clicked, the button's value, where the card is, a form's metadata and
reason), what a click that decides nothing is told, and :func:`guard`, which tells the
clicker when the backend fails instead of going silent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable
from typing import Any

from slack_bolt.async_app import AsyncBoltContext

from agent_core.models import Gate, GateStatus

from . import cards, quorum_view
from .context import BotContext
from .home import HOME

log = logging.getLogger(__name__)

UNKNOWN_GATE = "This approval request does not exist (or no longer exists), so nothing was decided."
MALFORMED = "That request was malformed, so nothing was decided."
NO_HASH = (
    "This button does not say which arguments it approves (the card predates an update), "
    "so nothing was decided. The card now shows the current arguments: check them and click "
    "*Approve* again."
)


def mismatch(clicked: str, gate: Gate) -> str:
    return (
        "The arguments on this card do not match this request's (hash "
        f"`{cards.escape(cards.short_hash(clicked))}` on the card, "
        f"`{cards.args_hash_short(gate)}` in the "
        "request), so nothing was decided."
    )


def already_decided(gate: Gate) -> str:
    """What to tell someone who clicks a gate that is no longer pending."""
    s = gate.status
    if s is GateStatus.EXPIRED:
        return (
            f"This request already expired (no decision within {cards.fmt_duration(gate.timeout)}); "
            "the tool call was not executed."
        )
    if cards.closed_by_failure(gate):
        return f"This request was closed — {cards.closed_line(gate)}; it was not executed."
    if s is GateStatus.CANCELLED:
        return f"This request was cancelled with its run (by {cards.user(gate.decided_by)}); nothing was executed."
    verb = "approved" if s is GateStatus.APPROVED else "denied"
    who = cards.user(gate.decided_by)
    if s is GateStatus.APPROVED and gate.approvals:  # more than one approver
        who = quorum_view.approvers_text(gate)
    return f"Already {verb} by {who} at {cards.fmt_date(gate.decided_at)}."


def action_value(body: dict[str, Any]) -> str | None:
    actions = body.get("actions")
    if not isinstance(actions, list) or not actions or not isinstance(actions[0], dict):
        return None
    value = actions[0].get("value")
    return value if isinstance(value, str) and 0 < len(value) <= 200 else None


def user_id_of(body: dict[str, Any]) -> str | None:
    u = body.get("user")
    uid = u.get("id") if isinstance(u, dict) else None
    return uid if isinstance(uid, str) and uid else None


def from_home(body: dict[str, Any]) -> bool:
    """A click on the App Home view (it carries no channel: the clicker is told on Home)."""
    view = body.get("view")
    return isinstance(view, dict) and view.get("type") == "home"


def channel_of(body: dict[str, Any]) -> str | None:
    """Where the clicker can be told: the card's channel, or :data:`HOME`."""
    if from_home(body):
        return HOME
    for holder in (body.get("container"), body.get("channel")):
        if isinstance(holder, dict):
            c = holder.get("channel_id") or holder.get("id")
            if isinstance(c, str) and c:
                return c
    meta = form_metadata(body)  # a deny form carries its card's channel
    c = meta.get("channel") if meta else None
    return c if isinstance(c, str) and c else None


def form_metadata(body: dict[str, Any]) -> dict[str, Any] | None:
    view = body.get("view")
    raw = view.get("private_metadata") if isinstance(view, dict) else None
    try:
        meta = json.loads(raw) if isinstance(raw, str) and raw else None
    except ValueError:
        return None
    return meta if isinstance(meta, dict) else None


def home_team(body: dict[str, Any], context: AsyncBoltContext | None) -> str | None:
    """The workspace the app is installed in: ``auth.test``'s team id, as Bolt learnt it at
    start; ``None`` when it gave none.

    Never the payload's ``team``: in a Slack Connect channel that is the clicker's own
    workspace, and taking it for ours would make every outsider an insider. An org-wide
    (Enterprise Grid) installation has no single workspace, so ``*`` then covers nobody;
    approvers are listed by user ID or user group (as for ``/agent cancel``).
    """
    auth = context.authorize_result if context is not None else None
    if auth is not None and isinstance(auth.team_id, str) and auth.team_id:
        return auth.team_id
    return None


def is_external(body: dict[str, Any], home: str | None) -> bool:
    """The clicker belongs to another workspace (Slack Connect). Fails closed: a payload
    without the user's team, or an unknown home team, counts as external."""
    u = body.get("user")
    team = u.get("team_id") if isinstance(u, dict) else None
    return not (isinstance(team, str) and team and home and team == home)


async def tell(
    ctx: BotContext, user_id: str, text: str, *, channel: str | None = None, respond: Any = None
) -> None:
    """Tell the clicker privately: ephemeral in the card's channel, or at the top of their
    Home when they clicked there (``channel`` is :data:`HOME`)."""
    if channel == HOME:
        if ctx.home is not None:
            await ctx.home.notify(user_id, text)
        return
    await ctx.publisher.tell(user_id, text, channel=channel, respond=respond)


async def home_clicked(ctx: BotContext, body: dict[str, Any], since: float) -> None:
    """After a click on Home at ``since`` (whatever came of it), show the clicker their Home
    again, with what this click came to (not an earlier click's)."""
    user_id = user_id_of(body)
    if ctx.home is not None and user_id and channel_of(body) == HOME:
        await ctx.home.clicked(user_id, since)


def form_reason(view: dict[str, Any]) -> str | None:
    try:
        value = view["state"]["values"][cards.REASON_BLOCK][cards.REASON_ACTION]["value"]
    except (KeyError, TypeError):
        return None
    if not isinstance(value, str) or not value.strip():
        return None
    # JSON may carry lone surrogates (\ud800) that no UTF-8 encoder (nor Redis) accepts.
    clean = value.encode("utf-8", "replace").decode("utf-8")
    return clean.strip()[: cards.REASON_MAX]


def origin_channel(gate: Gate) -> str | None:
    c = gate.origin.get("channel")
    return c if isinstance(c, str) and c else None


UNAVAILABLE = (
    "The approval service is unavailable right now, so nothing was decided. Try again shortly."
)


async def guard(ctx: BotContext, body: dict[str, Any], respond: Any, work: Awaitable[None]) -> None:
    """Run a handler's work; if the backend fails, tell the clicker instead of going silent."""
    try:
        await work
    except Exception as exc:  # never leave a clicker without an answer
        log.error("handling a click failed: %s", type(exc).__name__)
        user_id = user_id_of(body)
        if user_id:
            await tell(ctx, user_id, UNAVAILABLE, channel=channel_of(body), respond=respond)


class CardActions:
    """The base of a card's listeners: tells the clicker, and makes a card tell the truth."""

    def __init__(self, ctx: BotContext) -> None:
        self.ctx = ctx

    async def _tell(
        self, user_id: str, text: str, *, channel: str | None = None, respond: Any = None
    ) -> None:
        await tell(self.ctx, user_id, text, channel=channel, respond=respond)

    async def _refresh(self, gate_id: str) -> Gate | None:
        """Update the card now; the gate as it shows it (None if it failed)."""
        # Best effort: the notifier makes the same update from the gate.decided event.
        try:
            return await self.ctx.publisher.show_gate(gate_id)
        except Exception as exc:
            log.warning("card update for gate %s deferred to the notifier: %s", gate_id, exc)
            return None
