"""A gate card's buttons and the deny-reason modal, and the registration of every card
listener.

Every handler acknowledges within Slack's 3 s. A decision is one atomic call into the core
(Redis), made before any card update, so a Slack failure afterwards never loses it; Approve
and the deny form are acknowledged once that call is durable, or after ACK_BUDGET_SECONDS
with the clicker told that nothing is recorded yet (``bot/durable_acks.py``). Approve and
Deny carry ``<gate id>:<arguments hash>``: the core decides only when the hash is the gate's.

A turn that opened several gates also has "Approve all N" / "Deny all"
(``bot/turn_actions.py``). What a click carries and what the clicker is told when it decides
nothing are in ``bot/clicks.py``.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

from slack_bolt.async_app import AsyncApp, AsyncBoltContext

from agent_core.exceptions import ArgsHashMismatch, GateNotFound
from agent_core.models import Decision, Gate, GateStatus

from . import cards, edit_view, quorum_view
from .acking import at_ack
from .clicks import (
    MALFORMED,
    NO_HASH,
    UNKNOWN_GATE,
    CardActions,
    action_value,
    already_decided,
    channel_of,
    form_reason,
    guard,
    home_clicked,
    home_team,
    is_external,
    mismatch,
    origin_channel,
    tell,
    user_id_of,
)
from .context import BotContext
from .durable_acks import Outcome, ack_when_durable, submit_when_durable
from .publisher import slack_error
from .turn_actions import TurnActions

log = logging.getLogger(__name__)


class GateActions(CardActions):
    """A gate's card: Approve, Deny (its click and its form) and the arguments' view."""

    async def _load(
        self, body: dict[str, Any], respond: Any, *, approve: bool, external: bool
    ) -> tuple[str, Gate, str | None] | None:
        """The clicker, the gate and the hash on the button, if they may decide it now;
        otherwise tell them why."""
        user_id, value, channel = user_id_of(body), action_value(body), channel_of(body)
        tell = self._tell
        if user_id is None:
            log.warning("click without a user id ignored")
            return None
        if value is None:
            await tell(user_id, MALFORMED, channel=channel, respond=respond)
            return None
        gate_id, clicked_hash = cards.parse_button_value(value)
        gate = await self.ctx.gateway.get_gate(gate_id)
        if gate is None:
            await tell(user_id, UNKNOWN_GATE, channel=channel, respond=respond)
            return None
        if gate.status is not GateStatus.PENDING:
            await tell(user_id, already_decided(gate), channel=channel, respond=respond)
            await self._refresh(gate.gate_id)  # the card may be stale: make it tell the truth
            return None
        why = await self.ctx.approvers.why_not_decide(
            user_id, gate, approve=approve, external=external
        )
        if why is not None:
            await tell(user_id, why, channel=channel, respond=respond)
            return None
        if approve and clicked_hash is None:
            # A card posted before buttons carried the hash: re-render it with hashed buttons.
            await tell(user_id, NO_HASH, channel=channel, respond=respond)
            await self._refresh(gate.gate_id)
            return None
        return user_id, gate, clicked_hash

    async def approve(
        self,
        body: dict[str, Any],
        respond: Any,
        outcome: Outcome | None = None,
        *,
        external: bool = True,
    ) -> None:
        loaded = await self._load(body, respond, approve=True, external=external)
        if loaded is None:
            return
        user_id, gate, clicked_hash = loaded
        await self._decide(
            user_id, gate, Decision.APPROVE, None, clicked_hash, channel_of(body), respond, outcome
        )

    async def deny_clicked(
        self, body: dict[str, Any], respond: Any, *, external: bool = True
    ) -> None:
        loaded = await self._load(body, respond, approve=False, external=external)
        if loaded is None:
            return
        user_id, gate, clicked_hash = loaded
        channel = channel_of(body)
        meta = {"gate_id": gate.gate_id, "channel": channel or ""}
        if clicked_hash is not None:
            meta["args_hash"] = clicked_hash
        try:
            await self.ctx.client.views_open(
                trigger_id=str(body.get("trigger_id") or ""),
                view=cards.deny_modal(gate, json.dumps(meta)),
            )
        except Exception as exc:
            log.warning("views.open failed: %s", slack_error(exc))
            await self._tell(
                user_id,
                "I could not open the deny form in time; nothing was decided. Click *Deny* again.",
                channel=channel,
                respond=respond,
            )

    async def deny_submitted(
        self, body: dict[str, Any], outcome: Outcome | None = None, *, external: bool = True
    ) -> None:
        user_id = user_id_of(body)
        raw_view = body.get("view")
        view: dict[str, Any] = raw_view if isinstance(raw_view, dict) else {}
        try:
            meta = json.loads(view.get("private_metadata") or "")
            gate_id = str(meta["gate_id"])
            channel = str(meta.get("channel") or "") or None
            clicked_hash = meta.get("args_hash")
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("deny form without usable private_metadata ignored")
            return
        if user_id is None:
            return
        if not isinstance(clicked_hash, str) or not clicked_hash:
            clicked_hash = None  # a form opened before buttons carried the hash
        reason = form_reason(view)
        tell = self._tell
        gate = await self.ctx.gateway.get_gate(gate_id)
        if gate is None:
            await tell(user_id, UNKNOWN_GATE, channel=channel)
            return
        channel = channel or origin_channel(gate)
        if gate.status is not GateStatus.PENDING:
            await tell(user_id, already_decided(gate), channel=channel)
            await self._refresh(gate_id)
            return
        why = await self.ctx.approvers.why_not_decide(
            user_id, gate, approve=False, external=external
        )
        if why is not None:
            await tell(user_id, why, channel=channel)
            return
        await self._decide(
            user_id, gate, Decision.DENY, reason, clicked_hash, channel, None, outcome
        )

    async def show_args(self, body: dict[str, Any], respond: Any) -> None:
        user_id, value = user_id_of(body), action_value(body)
        if user_id is None:
            return
        gate_id = cards.parse_button_value(value)[0] if value else None
        gate = await self.ctx.gateway.get_gate(gate_id) if gate_id else None
        if gate is None:
            await self._tell(user_id, UNKNOWN_GATE, channel=channel_of(body), respond=respond)
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
        clicked_hash: str | None,
        channel: str | None,
        respond: Any,
        outcome: Outcome | None = None,
    ) -> None:
        tell = self._tell
        approvers = self.ctx.approvers
        approving = decision is Decision.APPROVE
        # Registered before deciding: this process's notifier, handed the decision's event
        # while the card update below is on its way, waits for it (bot/refreshing.py).
        async with self.ctx.publisher.refreshes.making(gate.gate_id) as refresh:
            try:
                result = await self.ctx.gateway.decide(
                    gate.gate_id,
                    decision,
                    by=user_id,
                    reason=reason,
                    args_hash=clicked_hash,
                    run_id=gate.run_id,
                    groups=await approvers.quorum_groups(user_id, gate) if approving else [],
                    allow_self_approval=approvers.allow_self_approval,
                )
            except GateNotFound:
                await tell(user_id, UNKNOWN_GATE, channel=channel, respond=respond)
                return
            except ArgsHashMismatch:
                await tell(
                    user_id, mismatch(clicked_hash or "", gate), channel=channel, respond=respond
                )
                refresh.shown(await self._refresh(gate.gate_id))
                return
            if outcome is not None:
                outcome.channel = channel
                outcome.durable.set()  # durable in Redis: the click may be acknowledged now
            if result.counted or result.refused:  # a quorum's approval (bot/quorum_view.py)
                outcome = outcome or Outcome()
                outcome.applied = result.counted
                text = quorum_view.counted_message(result.gate) if result.counted else ""
                text = text or quorum_view.refused_message(result)
                await tell(user_id, text, channel=channel, respond=respond)
            # Not applied: someone was first. Applied but not what was asked: the deadline
            # had passed, so the click expired the gate instead.
            elif not result.applied or result.gate.status is not decision.status:
                await tell(user_id, already_decided(result.gate), channel=channel, respond=respond)
            elif outcome is not None:
                outcome.applied = True
            # Shown at once, not after the notifier's queue (which then finds the card
            # showing this decision and leaves it); a stale card is made to tell the truth.
            refresh.shown(await self._refresh(gate.gate_id))


def register(app: AsyncApp, ctx: BotContext) -> None:
    actions = GateActions(ctx)
    turns = TurnActions(ctx)

    @app.block_action(cards.APPROVE_ACTION)
    async def on_approve(
        ack: Any, body: dict[str, Any], respond: Any, context: AsyncBoltContext
    ) -> None:
        external = is_external(body, home_team(body, context))
        await ack_when_durable(
            ctx,
            ack,
            body,
            respond,
            "approval",
            lambda outcome: actions.approve(body, respond, outcome, external=external),
        )

    @app.block_action(cards.TURN_APPROVE_ACTION)
    async def on_approve_all(
        ack: Any, body: dict[str, Any], respond: Any, context: AsyncBoltContext
    ) -> None:
        external = is_external(body, home_team(body, context))
        await ack_when_durable(
            ctx,
            ack,
            body,
            respond,
            "*Approve all*",
            lambda outcome: turns.approve_all(body, respond, outcome, external=external),
        )

    @app.block_action(cards.TURN_DENY_ACTION)
    @at_ack(ctx)
    async def on_deny_all(
        ack: Any, body: dict[str, Any], respond: Any, context: AsyncBoltContext
    ) -> None:
        await ack()
        external = is_external(body, home_team(body, context))
        async with ctx.busy():
            work = turns.deny_all_clicked(body, respond, external=external)
            await guard(ctx, body, respond, work)

    @app.block_action(cards.DENY_ACTION)
    @at_ack(ctx)
    async def on_deny(
        ack: Any, body: dict[str, Any], respond: Any, context: AsyncBoltContext
    ) -> None:
        await ack()
        since = time.time()
        external = is_external(body, home_team(body, context))
        async with ctx.busy():
            await guard(ctx, body, respond, actions.deny_clicked(body, respond, external=external))
            await home_clicked(ctx, body, since)

    @app.block_action(cards.ARGS_ACTION)
    @at_ack(ctx)
    async def on_args(ack: Any, body: dict[str, Any], respond: Any) -> None:
        await ack()
        async with ctx.busy():
            await guard(ctx, body, respond, actions.show_args(body, respond))

    @app.view(cards.DENY_CALLBACK)
    async def on_deny_reason(ack: Any, body: dict[str, Any], context: AsyncBoltContext) -> None:
        external = is_external(body, home_team(body, context))
        await submit_when_durable(
            ctx, ack, body, lambda outcome: actions.deny_submitted(body, outcome, external=external)
        )

    @app.view(cards.TURN_DENY_CALLBACK)
    async def on_deny_all_reason(ack: Any, body: dict[str, Any], context: AsyncBoltContext) -> None:
        external = is_external(body, home_team(body, context))
        await submit_when_durable(
            ctx,
            ack,
            body,
            lambda outcome: turns.deny_all_submitted(body, outcome, external=external),
        )

    edit_view.register(app, ctx, actions)  # Edit & approve (bot/edit_view.py)


def register_fallback(app: AsyncApp, ctx: BotContext) -> None:
    """The listener of any other button: registered after every other listener."""

    # Registered last: Bolt tries listeners in order, so this only catches the rest. Only
    # block_actions: legacy payloads are answered quietly (bot/quiet.py).
    @app.block_action(re.compile(r".*", re.DOTALL))
    @at_ack(ctx)
    async def on_unknown_action(ack: Any, body: dict[str, Any], respond: Any) -> None:
        await ack()
        user_id = user_id_of(body)
        if user_id:
            async with ctx.busy():
                await tell(
                    ctx,
                    user_id,
                    "I don't know that button, so nothing happened.",
                    channel=channel_of(body),
                    respond=respond,
                )
