"""The App Home view of one approver: what waits for their decision, and what they decided.

Pure rendering (Block Kit), within Slack's limits for a Home view: at most 100 blocks.
Approve and Deny carry the same action ids and values as a card's buttons, so a click on Home
goes through the very handlers a card click goes through (:mod:`bot.actions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_core.models import Gate, GateStatus

from . import cards, quorum_view

HOME_THREAD_ACTION = "home_open_thread"
MAX_VIEW_BLOCKS = 100
# Each pending gate takes 4 blocks (section, context, actions, divider): 20 of them and the
# rest of the view stay well under MAX_VIEW_BLOCKS.
MAX_PENDING_SHOWN = 20
MAX_DECISIONS_SHOWN = 20
LINES_PER_SECTION = 7  # decision lines (each under ~330 characters) per 3,000-character section

_DONE = {
    GateStatus.APPROVED: "✅ Approved",
    GateStatus.DENIED: "🚫 Denied",
    GateStatus.EXPIRED: "⌛ Expired",
    GateStatus.CANCELLED: "✖️ Cancelled",
}


@dataclass(frozen=True)
class PendingItem:
    """A pending gate as one person may decide it (``approve``: they may approve it, not
    only deny it); ``thread``: a link to its card, when known."""

    gate: Gate
    approve: bool
    thread: str | None = None


def home_view(
    pending: list[PendingItem],
    decided: list[Gate],
    *,
    notice: str | None = None,
    more: int = 0,
    viewer: str = "",
) -> dict[str, Any]:
    """The Home view: ``pending`` (soonest deadline first; ``more`` not shown), the last
    gates ``viewer`` decided or approved towards a quorum (newest first), and a ``notice``
    for what their last click did."""
    blocks: list[dict[str, Any]] = []
    if notice:
        blocks.append(cards.section(notice))
    shown = pending[:MAX_PENDING_SHOWN]
    more += len(pending) - len(shown)
    title = f"Waiting for your decision ({len(shown) + more})"
    blocks.append(_header(title))
    if not shown:
        blocks.append(cards.context("Nothing waits for you right now."))
    for item in shown:
        blocks.extend(_pending_blocks(item))
    if more:
        blocks.append(cards.context(f"…and {more} more, expiring later."))
    blocks.append(_header("Your last decisions"))
    lines = [_decided_line(g, viewer) for g in decided[:MAX_DECISIONS_SHOWN]]
    if not lines:
        blocks.append(cards.context("You have not decided anything yet."))
    for i in range(0, len(lines), LINES_PER_SECTION):
        blocks.append(cards.section("\n".join(lines[i : i + LINES_PER_SECTION])))
    assert len(blocks) <= MAX_VIEW_BLOCKS
    return {"type": "home", "blocks": blocks}


def _header(text: str) -> dict[str, Any]:
    return {"type": "header", "text": {"type": "plain_text", "text": text, "emoji": True}}


def _pending_blocks(item: PendingItem) -> list[dict[str, Any]]:
    gate = item.gate
    summary = cards.call_summary(gate, 600)
    head = f"*{cards.escape(cards.clip(gate.agent or 'agent', 80))}* asks to run {summary}"
    facts = f"Run `{cards.clip_escaped(gate.run_id, 100)}` · requested by {cards.requesters(gate)}"
    when = (
        f"asked {_ago(gate.created_at)} · expires {cards.fmt_date(gate.deadline)}"
        f" · arguments hash `{cards.args_hash_short(gate)}`"
    )
    if gate.quorum is not None:  # more than one approver (bot/quorum_view.py)
        when += f" · {quorum_view.progress(gate)}"
    if not item.approve:
        when += (
            " · you may deny it, not approve it"
            if gate.quorum is not None and gate.quorum.groups
            else " · you are one of its requesters: you may deny it, not approve it"
        )
    buttons: list[dict[str, Any]] = []
    if item.approve:
        value = cards.button_value(gate)
        buttons.append(cards.button("Approve", cards.APPROVE_ACTION, value, style="primary"))
        from .edit_view import buttons as edit_buttons  # Edit & approve, when offered

        buttons.extend(edit_buttons(gate))
    buttons.append(
        cards.button("Deny", cards.DENY_ACTION, cards.button_value(gate), style="danger")
    )
    if item.thread:
        link = cards.button("Open thread", HOME_THREAD_ACTION, gate.gate_id)
        link["url"] = item.thread[:3000]
        buttons.append(link)
    return [
        cards.section(f"{head}\n{facts}"),
        cards.context(when),
        {"type": "actions", "block_id": f"home:{gate.gate_id}", "elements": buttons},
        {"type": "divider"},
    ]


def decided_at(gate: Gate, viewer: str) -> float | None:
    """When ``viewer`` decided ``gate``: the decision, or their approval counted towards its
    quorum (the gate then decided by whoever completed it, or still waiting); None if
    neither."""
    if gate.decided_by == viewer:
        return gate.decided_at or 0.0
    for approval in gate.approvals:
        if approval.by == viewer:
            return approval.at
    return None


def _decided_line(gate: Gate, viewer: str = "") -> str:
    head = _DONE.get(gate.status, gate.status.value)
    at = gate.decided_at
    approved_at = decided_at(gate, viewer) if viewer and gate.decided_by != viewer else None
    if approved_at is not None:
        # Their approval counted towards a quorum someone else completed, or still open.
        at = approved_at
        head = "👍 You approved" + (
            f" ({len(gate.approvals)} of {gate.quorum.count}; it waits for more)"
            if gate.status is GateStatus.PENDING and gate.quorum is not None
            else f"; then {head}"
        )
    line = (
        f"{head} {cards.call_summary(gate, 120)} · run `{cards.clip_escaped(gate.run_id, 40)}`"
        f" · {cards.fmt_date(at)}"
    )
    if gate.reason and gate.status is GateStatus.DENIED:
        line += f" · “{cards.clip_escaped(gate.reason, 60)}”"
    return line


def _ago(ts: float) -> str:
    """How long ago, as Slack renders it for each reader (``{ago}``)."""
    return f"<!date^{int(ts)}^{{ago}}|{cards.fmt_date(ts).split('|', 1)[-1][:-1]}>"
