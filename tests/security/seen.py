"""What a person sees on the fake Slack: the buttons of a gate's cards, and what they send.

A click sends the value of the button that was clicked, whatever it holds (the gate id, and
since cards carry it, the arguments hash too): tests that click a gate's button read that
value from the card, as Slack does, instead of building it.
"""

from __future__ import annotations

from typing import Any

from bot import cards
from tests.slack_fake import FakeSlack, SlackMessage


def gate_buttons(
    message: SlackMessage, gate_id: str, action_id: str = cards.APPROVE_ACTION
) -> list[dict[str, Any]]:
    """The message's buttons ``action_id`` for the gate (their value is the gate id, or starts
    with it followed by ":")."""
    return [
        e
        for b in message.blocks
        if b.get("type") == "actions"
        for e in b.get("elements", [])
        if e.get("action_id") == action_id and str(e.get("value", "")).split(":", 1)[0] == gate_id
    ]


def live_buttons(fake: FakeSlack, gate_id: str) -> list[str]:
    """The ts of every message that still offers Approve for the gate."""
    return [m.ts for m in fake.messages if gate_buttons(m, gate_id)]


async def button_value(
    fake: FakeSlack, gate_id: str, action_id: str = cards.APPROVE_ACTION, timeout: float = 15.0
) -> str:
    """What clicking the gate's ``action_id`` button sends, once a card shows it."""

    def values(f: FakeSlack) -> list[str]:
        return [str(e["value"]) for m in f.messages for e in gate_buttons(m, gate_id, action_id)]

    found: list[str] = await fake.wait_for(values, timeout=timeout, what=f"a card of {gate_id}")
    return found[0]
