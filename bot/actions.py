"""Button clicks and the deny-reason modal.

Every handler calls ``ack()`` first. The decision itself is one atomic call into the core
(Redis), made before any card update, so a Slack failure afterwards never loses it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable
from typing import Any

from slack_bolt.async_app import AsyncApp

from agent_core.exceptions import GateNotFound
from agent_core.models import Decision, Gate, GateStatus

from . import cards
from .context import BotContext
from .publisher import slack_error

log = logging.getLogger(__name__)

ACK_BUDGET_SECONDS = 2.0
UNKNOWN_GATE = "This approval request does not exist (or no longer exists), so nothing was decided."
MALFORMED = "That request was malformed, so nothing was decided."


def already_decided(gate: Gate) -> str:
    """What to tell someone who clicks a gate that is no longer pending."""
    s = gate.status
    if s is GateStatus.EXPIRED:
        return (
            f"This request already expired (no decision within {cards.fmt_duration(gate.timeout)}); "
            "the tool call was not executed."
        )
    if s is GateStatus.CANCELLED:
        return f"This request was cancelled with its run (by {cards.user(gate.decided_by)}); nothing was executed."
    verb = "approved" if s is GateStatus.APPROVED else "denied"
    return f"Already {verb} by {cards.user(gate.decided_by)} at {cards.fmt_date(gate.decided_at)}."


def _action_value(body: dict[str, Any]) -> str | None:
    actions = body.get("actions")
    if not isinstance(actions, list) or not actions or not isinstance(actions[0], dict):
        return None
    value = actions[0].get("value")
    return value if isinstance(value, str) and 0 < len(value) <= 200 else None


def _user_id(body: dict[str, Any]) -> str | None:
    u = body.get("user")
    uid = u.get("id") if isinstance(u, dict) else None
    return uid if isinstance(uid, str) and uid else None


def _channel(body: dict[str, Any]) -> str | None:
    for holder in (body.get("container"), body.get("channel")):
        if isinstance(holder, dict):
            c = holder.get("channel_id") or holder.get("id")
            if isinstance(c, str) and c:
                return c
    return None


class GateActions:
    def __init__(self, ctx: BotContext) -> None:
        self.ctx = ctx

    async def _load(
        self, body: dict[str, Any], respond: Any, *, approve: bool
    ) -> tuple[str, Gate] | None:
        """The clicker and the gate, if they may decide it now; otherwise tell them why."""
        user_id, gate_id, channel = _user_id(body), _action_value(body), _channel(body)
        tell = self.ctx.publisher.tell
        if user_id is None:
            log.warning("click without a user id ignored")
            return None
        if gate_id is None:
            await tell(user_id, MALFORMED, channel=channel, respond=respond)
            return None
        gate = await self.ctx.gateway.get_gate(gate_id)
        if gate is None:
            await tell(user_id, UNKNOWN_GATE, channel=channel, respond=respond)
            return None
        if gate.status is not GateStatus.PENDING:
            await tell(user_id, already_decided(gate), channel=channel, respond=respond)
            await self._refresh(gate.gate_id)  # the card may be stale: make it tell the truth
            return None
        why = await self.ctx.approvers.why_not_decide(user_id, gate, approve=approve)
        if why is not None:
            await tell(user_id, why, channel=channel, respond=respond)
            return None
        return user_id, gate

    async def approve(
        self, body: dict[str, Any], respond: Any, decided: asyncio.Event | None = None
    ) -> None:
        loaded = await self._load(body, respond, approve=True)
        if loaded is None:
            return
        user_id, gate = loaded
        await self._decide(user_id, gate, Decision.APPROVE, None, _channel(body), respond, decided)

    async def deny_clicked(self, body: dict[str, Any], respond: Any) -> None:
        loaded = await self._load(body, respond, approve=False)
        if loaded is None:
            return
        user_id, gate = loaded
        channel = _channel(body)
        meta = json.dumps({"gate_id": gate.gate_id, "channel": channel or ""})
        try:
            await self.ctx.client.views_open(
                trigger_id=str(body.get("trigger_id") or ""), view=cards.deny_modal(gate, meta)
            )
        except Exception as exc:
            log.warning("views.open failed: %s", slack_error(exc))
            await self.ctx.publisher.tell(
                user_id,
                "I could not open the deny form in time; nothing was decided. Click *Deny* again.",
                channel=channel,
                respond=respond,
            )

    async def deny_submitted(
        self, body: dict[str, Any], decided: asyncio.Event | None = None
    ) -> None:
        user_id = _user_id(body)
        raw_view = body.get("view")
        view: dict[str, Any] = raw_view if isinstance(raw_view, dict) else {}
        try:
            meta = json.loads(view.get("private_metadata") or "")
            gate_id = str(meta["gate_id"])
            channel = str(meta.get("channel") or "") or None
        except (ValueError, KeyError, TypeError):
            log.warning("deny form without usable private_metadata ignored")
            return
        if user_id is None:
            return
        reason = _reason(view)
        tell = self.ctx.publisher.tell
        gate = await self.ctx.gateway.get_gate(gate_id)
        if gate is None:
            await tell(user_id, UNKNOWN_GATE, channel=channel)
            return
        channel = channel or _origin_channel(gate)
        if gate.status is not GateStatus.PENDING:
            await tell(user_id, already_decided(gate), channel=channel)
            await self._refresh(gate_id)
            return
        why = await self.ctx.approvers.why_not_decide(user_id, gate, approve=False)
        if why is not None:
            await tell(user_id, why, channel=channel)
            return
        await self._decide(user_id, gate, Decision.DENY, reason, channel, None, decided)

    async def show_args(self, body: dict[str, Any], respond: Any) -> None:
        user_id, gate_id = _user_id(body), _action_value(body)
        if user_id is None:
            return
        gate = await self.ctx.gateway.get_gate(gate_id) if gate_id else None
        if gate is None:
            await self.ctx.publisher.tell(
                user_id, UNKNOWN_GATE, channel=_channel(body), respond=respond
            )
            return
        try:
            await self.ctx.client.views_open(
                trigger_id=str(body.get("trigger_id") or ""), view=cards.args_modal(gate)
            )
        except Exception as exc:
            log.warning("views.open failed: %s", slack_error(exc))

    async def _decide(
        self,
        user_id: str,
        gate: Gate,
        decision: Decision,
        reason: str | None,
        channel: str | None,
        respond: Any,
        decided: asyncio.Event | None = None,
    ) -> None:
        try:
            result = await self.ctx.gateway.decide(
                gate.gate_id, decision, by=user_id, reason=reason
            )
            if decided is not None:
                decided.set()  # durable in Redis: the click may be acknowledged now
        except GateNotFound:
            await self.ctx.publisher.tell(user_id, UNKNOWN_GATE, channel=channel, respond=respond)
            return
        # Not applied: someone was first. Applied but not what was asked: the deadline had
        # passed, so the click expired the gate instead.
        if not result.applied or result.gate.status is not decision.status:
            await self.ctx.publisher.tell(
                user_id, already_decided(result.gate), channel=channel, respond=respond
            )
        await self._refresh(gate.gate_id)

    async def _refresh(self, gate_id: str) -> None:
        # Best effort: the notifier makes the same update from the gate.decided event.
        try:
            await self.ctx.publisher.show_gate(gate_id)
        except Exception as exc:
            log.warning("card update for gate %s deferred to the notifier: %s", gate_id, exc)


def _reason(view: dict[str, Any]) -> str | None:
    try:
        value = view["state"]["values"][cards.REASON_BLOCK][cards.REASON_ACTION]["value"]
    except (KeyError, TypeError):
        return None
    if not isinstance(value, str) or not value.strip():
        return None
    # JSON may carry lone surrogates (\ud800) that no UTF-8 encoder (nor Redis) accepts.
    clean = value.encode("utf-8", "replace").decode("utf-8")
    return clean.strip()[: cards.REASON_MAX]


def _origin_channel(gate: Gate) -> str | None:
    c = gate.origin.get("channel")
    return c if isinstance(c, str) and c else None


UNAVAILABLE = (
    "The approval service is unavailable right now, so nothing was decided. Try again shortly."
)


async def _guard(
    ctx: BotContext, body: dict[str, Any], respond: Any, work: Awaitable[None]
) -> None:
    """Run a handler's work; if the backend fails, tell the clicker instead of going silent."""
    try:
        await work
    except Exception as exc:  # never leave a clicker without an answer
        log.error("handling a click failed: %s", type(exc).__name__)
        user_id = _user_id(body)
        if user_id:
            await ctx.publisher.tell(user_id, UNAVAILABLE, channel=_channel(body), respond=respond)


def register(app: AsyncApp, ctx: BotContext) -> None:
    actions = GateActions(ctx)

    async def decide_then_ack(ack: Any, work: Any, decided: asyncio.Event) -> None:
        # A decision is acknowledged once it is durable in Redis (one script, ~1 ms), so a
        # web process dying right after Slack showed the click as received cannot lose it.
        # Never later than ACK_BUDGET_SECONDS: Slack's limit is 3 s.
        async with ctx.busy():
            task = asyncio.ensure_future(work)
            waiter = asyncio.ensure_future(decided.wait())
            await asyncio.wait(
                {task, waiter}, timeout=ACK_BUDGET_SECONDS, return_when=asyncio.FIRST_COMPLETED
            )
            waiter.cancel()
            await ack()
            await task

    @app.action(cards.APPROVE_ACTION)
    async def on_approve(ack: Any, body: dict[str, Any], respond: Any) -> None:
        decided = asyncio.Event()
        work = _guard(ctx, body, respond, actions.approve(body, respond, decided))
        await decide_then_ack(ack, work, decided)

    @app.action(cards.DENY_ACTION)
    async def on_deny(ack: Any, body: dict[str, Any], respond: Any) -> None:
        await ack()
        async with ctx.busy():
            await _guard(ctx, body, respond, actions.deny_clicked(body, respond))

    @app.action(cards.ARGS_ACTION)
    async def on_args(ack: Any, body: dict[str, Any], respond: Any) -> None:
        await ack()
        async with ctx.busy():
            await _guard(ctx, body, respond, actions.show_args(body, respond))

    @app.view(cards.DENY_CALLBACK)
    async def on_deny_reason(ack: Any, body: dict[str, Any]) -> None:
        decided = asyncio.Event()
        work = _guard(ctx, body, None, actions.deny_submitted(body, decided))
        await decide_then_ack(ack, work, decided)

    # Registered last: Bolt tries listeners in order, so this only catches the rest.
    @app.action(re.compile(r".*"))
    async def on_unknown_action(ack: Any, body: dict[str, Any], respond: Any) -> None:
        await ack()
        user_id = _user_id(body)
        if user_id:
            async with ctx.busy():
                await ctx.publisher.tell(
                    user_id,
                    "I don't know that button, so nothing happened.",
                    channel=_channel(body),
                    respond=respond,
                )
