"""Block Kit for gates routed to an approval channel (see :mod:`bot.routing`).

The card in the approval channel carries one more line, a link to the task's thread; a card
that could not be posted there (and is in the thread instead) says why. The task's thread
gets one compact line per routed gate, which follows the gate to its outcome. Pure
builders, like :mod:`bot.cards`.
"""

from __future__ import annotations

from agent_core.models import Gate, GateStatus

from .cards import (
    REASON_MAX,
    Card,
    clip_escaped,
    closed_by_failure,
    context,
    escape,
    fmt_duration,
    user,
)

# What each error of chat.postMessage means for a card that cannot go to its channel.
ROUTE_ERRORS = {
    "not_in_channel": "the app is not in that channel",
    "channel_not_found": "that channel does not exist, or is private and the app is not in it",
    "is_archived": "that channel is archived",
}


def channel(channel_id: str) -> str:
    """A channel mention, which Slack shows as ``#name`` to whoever may see it."""
    return f"<#{escape(channel_id)}>"


def thread_line(link: str | None) -> str:
    """The line a routed card shows: where the task was asked."""
    if link and link.startswith(("https://", "http://")):
        return f"🧵 Asked in <{escape(link)}|this task's thread>"
    return "🧵 Asked in a task's thread (no link: Slack did not give one)"


def fallback_line(channel_id: str, error: str) -> str:
    """Why a card meant for ``channel_id`` is in the task's thread instead."""
    why = ROUTE_ERRORS.get(error, f"Slack answered `{escape(error)}`")
    return f"⚠️ Could not post in {channel(channel_id)}: {why}. The card is here instead."


def with_line(card: Card, line: str) -> Card:
    """``card`` with ``line`` as a context block after its header and fields."""
    blocks = list(card.blocks)
    blocks.insert(min(2, len(blocks)), context(line))
    return Card(card.text, blocks)


def thread_note(gate: Gate) -> Card:
    """The one line in the task's thread for a gate whose card is in its approval channel."""
    where = channel(gate.approval_channel)
    tool = f"`{clip_escaped(gate.tool, 100)}`"
    s = gate.status
    if s is GateStatus.PENDING:
        line = f"⏳ {tool}: waiting for approval in {where}"
    elif s is GateStatus.APPROVED:
        line = f"✅ {tool}: approved by {user(gate.decided_by)} in {where}"
    elif s is GateStatus.DENIED:
        line = f"🚫 {tool}: denied by {user(gate.decided_by)} in {where}, not executed"
        if gate.reason:
            line += " — " + clip_escaped(gate.reason, REASON_MAX)
    elif s is GateStatus.EXPIRED:
        line = (
            f"⌛ {tool}: expired in {where}, no decision within {fmt_duration(gate.timeout)}; "
            "not executed"
        )
    elif closed_by_failure(gate):
        line = f"✖️ {tool}: closed in {where}, the run failed; not executed"
    else:
        line = f"✖️ {tool}: cancelled in {where}, the run was cancelled; not executed"
    return Card(text=line, blocks=[context(line)])
