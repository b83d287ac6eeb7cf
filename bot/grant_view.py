"""What Slack shows of "allow for this thread" (agent_core.grants): the card's **Approve &
allow** button, the modal choosing the grant's constraint, the card line of a call a grant
approved ("Allowed by @Avery's grant until 14:05") and of the approval that made a grant, and
``/agent grants``'s list with **Revoke** buttons."""

from __future__ import annotations

import json
from typing import Any

from agent_core.grants import Grant, constraint_ok, is_grant
from agent_core.models import Gate, GateStatus

from . import cards

GRANT_ACTION = "gate_grant"  # Approve & allow (opens the modal)
GRANT_CALLBACK = "gate_grant_modal"
REVOKE_ACTION = "grant_revoke"
SCOPE_BLOCK = "grant_scope"
SCOPE_ACTION = "grant_scope_select"
ANY = "any"
MAX_CHOICES = 20  # simple arguments offered as constraints (Slack allows 100 options)
MAX_LISTED = 40


def offered(gate: Gate) -> bool:
    """Whether the card offers Approve & allow: a pending gate whose tool allows grants,
    needing one approval."""
    return gate.status is GateStatus.PENDING and bool(gate.allow_for) and gate.quorum is None


def label(gate: Gate) -> str:
    """``Approve & allow ship in this thread for 1 h`` (a button's text: 75 characters)."""
    text = (
        f"Approve & allow {gate.tool} in this thread for {cards.fmt_duration(gate.allow_for or 0)}"
    )
    if len(text) > 75:
        text = f"Approve & allow for {cards.fmt_duration(gate.allow_for or 0)}"
    return text


def buttons(gate: Gate) -> list[dict[str, Any]]:
    """The card's Approve & allow button (none unless :func:`offered`)."""
    if not offered(gate):
        return []
    return [cards.button(label(gate), GRANT_ACTION, cards.button_value(gate))]


def choices(gate: Gate) -> list[tuple[str, str]]:
    """The constraints the modal offers: (value, text), ``any arguments`` first, then
    ``only field=value`` for each of the call's simple arguments."""
    out = [(ANY, "any arguments")]
    for name, value in gate.args.items():
        raw = json.dumps([name, value])
        if constraint_ok(name, value, gate.args) is None and len(out) <= MAX_CHOICES:
            if len(raw) <= 150:  # Slack's limit for an option's value
                shown = f"only {name}={json.dumps(value, ensure_ascii=False)}"
                out.append((raw, cards.clip(shown, 75)))
    return out


def chosen(view: dict[str, Any]) -> tuple[str | None, Any]:
    """The constraint a submitted modal chose: (field, value), (None, None) for any
    arguments; ValueError for a value that is not one the modal offered."""
    try:
        raw = view["state"]["values"][SCOPE_BLOCK][SCOPE_ACTION]["selected_option"]["value"]
    except (KeyError, TypeError):
        return None, None
    if raw == ANY or raw is None:
        return None, None
    try:
        field, value = json.loads(raw)
    except (ValueError, TypeError):
        raise ValueError("unreadable constraint") from None
    if not isinstance(field, str):
        raise ValueError("unreadable constraint")
    return field, value


def modal(gate: Gate, private_metadata: str) -> dict[str, Any]:
    """The modal confirming Approve & allow, with the constraint to choose."""
    options = [
        {"text": {"type": "plain_text", "text": text}, "value": value}
        for value, text in choices(gate)
    ]
    tool = cards.clip(cards.escape(gate.tool), 200)
    return {
        "type": "modal",
        "callback_id": GRANT_CALLBACK,
        "private_metadata": private_metadata,
        "title": {"type": "plain_text", "text": "Approve & allow"},
        "submit": {"type": "plain_text", "text": "Approve & allow"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            cards.section(
                f"Approve this call to `{tool}`, and allow the agent "
                f"*{cards.clip_escaped(gate.agent or 'agent', 100)}* to call `{tool}` again in "
                f"this thread for {cards.fmt_duration(gate.allow_for or 0)} without asking. "
                "Later calls are shown as allowed by your grant; `/agent grants` revokes it."
            ),
            {
                "type": "input",
                "block_id": SCOPE_BLOCK,
                "label": {"type": "plain_text", "text": "Allow later calls with"},
                "element": {
                    "type": "static_select",
                    "action_id": SCOPE_ACTION,
                    "initial_option": options[0],
                    "options": options,
                },
            },
        ],
    }


def outcome_line(gate: Gate) -> str | None:
    """The card's outcome line for a call a grant approved, or None to use the usual one."""
    if gate.status is not GateStatus.APPROVED or not is_grant(gate.decided_by):
        return None
    until = cards.fmt_date(gate.grant_until) if gate.grant_until else "its end"
    return (
        f"✅ *Allowed* by {cards.user(gate.granted_by)}'s grant until {until} "
        f"(grant `{cards.escape(gate.grant_id)}`)"
    )


def after_line(gate: Gate) -> str:
    """More for the outcome line of the approval that made a grant ('' for others)."""
    if not gate.granted or gate.status is not GateStatus.APPROVED:
        return ""
    return (
        f"\n🔓 and allowed `{cards.escape(gate.tool)}` in this thread for "
        f"{cards.fmt_duration(gate.allow_for or 0)} (grant `{cards.escape(gate.granted)}`; "
        "`/agent grants` lists and revokes it)"
    )


def list_blocks(grants: list[Grant]) -> list[dict[str, Any]]:
    """``/agent grants``: one section per live grant, with its Revoke button."""
    if not grants:
        return [cards.section("No live grants you can see.")]
    blocks: list[dict[str, Any]] = [cards.section(f"*Live grants* ({len(grants)})")]
    for g in grants[:MAX_LISTED]:
        blocks.append(
            {
                "type": "section",
                "text": cards.mrkdwn(
                    f"`{cards.escape(g.tool)}` of *{cards.clip_escaped(g.agent, 100)}* in thread "
                    f"`{cards.escape(g.scope)}` · {cards.escape(g.constraint)} · by "
                    f"{cards.user(g.granted_by)} · until {cards.fmt_date(g.expires_at)}"
                ),
                "accessory": cards.button("Revoke", REVOKE_ACTION, g.grant_id, style="danger"),
            }
        )
    if len(grants) > MAX_LISTED:
        blocks.append(cards.context(f"and {len(grants) - MAX_LISTED} more"))
    return blocks
