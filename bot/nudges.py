"""Reminders and escalation in Slack (the core fires them: :mod:`agent_core.nudges`).

On ``gate.reminded`` the bot posts one reply in the card's thread (wherever the card is: its
stored location) mentioning the approvers: user IDs as ``<@U…>``, user groups as
``<!subteam^S…>``. ``*`` is not mentioned (``<!here>`` would ping a whole channel once per
gate): list people or a group to have them pinged. On ``gate.escalated`` the reply mentions
``escalate_to``, who may decide the gate from then on (:meth:`bot.approvers.Approvers.
why_not_decide` counts them). Each reply is posted once (a marker in the card's record,
written under the card's lock right after the post) and only while the gate is pending:
nothing is posted after the decision.

The card shows the steps in a context line (:func:`nudge_line`). Before a step fires it names
nobody: a mention in a posted message notifies, and the card is posted when the gate opens,
so naming the escalation group there would ping it before anything was escalated. Card
updates (``chat.update``) notify nobody, so once a step fired the line names whom it reached.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from agent_core.gateway import valid_gate_id
from agent_core.models import Gate, GateStatus

from .cards import clip_escaped, escape, fmt_duration
from .publisher import Publisher
from .store import CardRecord, Store, card_record

REMIND = "remind"
ESCALATE = "escalate"


def fmt_time(ts: float) -> str:
    """A time of day Slack renders in each reader's own time zone (``14:07``)."""
    when = datetime.fromtimestamp(ts, UTC).strftime("%H:%M UTC")
    return f"<!date^{int(ts)}^{{time}}|{when}>"


def mention(ident: str) -> str:
    """``<@U…>`` for a user, ``<!subteam^S…>`` for a user group; any other id is named, in
    a code span, not mentioned."""
    if ident[:1] == "S":
        return f"<!subteam^{escape(ident)}>"
    if ident[:1] in ("U", "W"):
        return f"<@{escape(ident)}>"
    return f"`{escape(ident)}`"


def mentions(ids: Sequence[str]) -> str:
    """Everyone of ``ids`` mentioned, ``*`` left out (see the module docstring)."""
    return ", ".join(mention(i) for i in dict.fromkeys(ids) if i and i != "*")


def _call(gate: Gate) -> str:
    return f"`{clip_escaped(gate.tool, 100)}` (run `{clip_escaped(gate.run_id, 100)}`)"


def reminder_message(gate: Gate, approvers: Sequence[str]) -> str:
    """The reply posted when a gate is reminded, mentioning ``approvers`` (and whoever it
    was escalated to already)."""
    who = mentions([*approvers, *gate.extra_approvers()])
    waited = fmt_duration((gate.remind_at or gate.created_at) - gate.created_at)
    return (
        f"⏰ Reminder{f' for {who}' if who else ''}: {_call(gate)} has waited {waited} for a "
        f"decision. It expires at {fmt_time(gate.deadline)}."
    )


def escalation_message(gate: Gate) -> str:
    """The reply posted when a gate is escalated, mentioning its ``escalate_to``."""
    waited = fmt_duration((gate.escalate_at or gate.created_at) - gate.created_at)
    return (
        f"⏫ Escalated to {mentions(gate.escalate_to) or 'nobody'}: {_call(gate)} got no "
        f"decision in {waited}. You may now approve or deny it on its card. It expires at "
        f"{fmt_time(gate.deadline)}."
    )


def nudge_line(gate: Gate) -> str | None:
    """The card's context line about reminders and escalation: what fired, and while the
    gate is pending what comes next; None when the gate has neither."""
    pending = gate.status is GateStatus.PENDING
    done: list[str] = []
    upcoming: list[tuple[float, str]] = []
    if gate.reminded_at is not None:
        done.append(f"⏰ Reminded the approvers at {fmt_time(gate.reminded_at)}")
    elif gate.remind_at is not None and pending:
        upcoming.append((gate.remind_at, f"reminding the approvers at {fmt_time(gate.remind_at)}"))
    if gate.escalated_at is not None:
        done.append(
            f"⏫ Escalated to {mentions(gate.escalate_to)} at {fmt_time(gate.escalated_at)}"
            + (": they may decide too" if pending else "")
        )
    elif gate.escalate_at is not None and pending:
        upcoming.append((gate.escalate_at, f"escalating at {fmt_time(gate.escalate_at)}"))
    if upcoming:
        done.append("⏰ Next: " + ", ".join(text for _, text in sorted(upcoming)))
    return " · ".join(done) or None


def card_thread(gate: Gate, rec: CardRecord) -> tuple[str | None, str | None]:
    """Where a reply about the gate goes: the card's thread (the task's thread when the card
    is a reply there, else the thread under the card); the task's thread when no card was
    ever recorded."""
    channel = gate.origin.get("channel")
    thread = gate.origin.get("thread_ts")
    channel = channel if isinstance(channel, str) and channel else None
    thread = thread if isinstance(thread, str) and thread else None
    if rec.channel and rec.ts:
        if rec.channel == channel and thread:
            return channel, thread
        return rec.channel, rec.ts
    return channel, thread


class Nudger:
    """Posts the reply of each reminder and escalation, once, while the gate is pending."""

    def __init__(self, publisher: Publisher, store: Store, approvers: Sequence[str]) -> None:
        """``approvers``: whom a reminder mentions (APPROVERS) when the gate has no approvers of
        its own (its tool's or agent's, :mod:`agent_core.routes`)."""
        self.publisher = publisher
        self.store = store
        self.approvers = list(approvers)

    async def announce(self, gate_id: str, step: str) -> None:
        """Post ``step``'s reply (``"remind"`` or ``"escalate"``) in the card's thread, unless
        it was posted already or the gate is no longer pending. Raises
        :class:`~bot.publisher.TransientSlackError` when Slack should be tried again."""
        store = self.store
        if step not in (REMIND, ESCALATE) or not valid_gate_id(gate_id, store.keys):
            return
        read = [store.keys.gate(gate_id), store.card_key(gate_id)]
        async with store.lock(f"gate:{gate_id}", read=read) as held:
            h, card_h = held.read
            if not h or card_h.get(f"nudge:{step}"):
                return
            gate = Gate.from_hash(h)
            if gate.status is not GateStatus.PENDING:
                return  # decided meanwhile: nothing is posted after the decision
            channel, thread_ts = card_thread(gate, card_record(card_h))
            if not channel:
                return  # not started from Slack
            if step == REMIND:
                text = reminder_message(gate, gate.approvers or self.approvers)
            else:
                text = escalation_message(gate)
            ts = await self.publisher.post_message(channel, thread_ts, text)
            await store.mark_nudged(gate_id, step, ts if ts is not None else "refused")
