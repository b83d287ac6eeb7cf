"""Slack's side of "allow for this thread" (agent_core.grants): **Approve & allow** (a modal
choosing the constraint, then GRANT_GATE), ``/agent grants`` and its **Revoke** buttons.

Every way in checks the same approver rules as Approve (bot/approvers.py), and fails closed:
the grant's approval is refused to a requester (unless self-approval is on) and to whoever
may decide the call only because it was escalated to them (a grant outlives the
escalation); the list shows a grant only to an approver of the call that made it, and
Revoke is checked like Deny on that call.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from slack_bolt.async_app import AsyncApp, AsyncBoltContext

from agent_core.exceptions import ArgsHashMismatch, GateNotFound
from agent_core.grants import Grant
from agent_core.models import Gate, GateStatus
from agent_core.script_replies import RevokeOutcome

from . import cards, grant_view
from .acking import FormAnswer, answer_form, at_ack
from .actions import GateActions
from .clicks import (
    UNKNOWN_GATE,
    action_value,
    already_decided,
    channel_of,
    guard,
    home_team,
    is_external,
    mismatch,
    tell,
    user_id_of,
)
from .context import BotContext
from .durable_acks import told_late
from .publisher import slack_error

log = logging.getLogger(__name__)

NOT_OFFERED = "This call's tool cannot be allowed in the thread, so nothing was decided."
REFUSED = {
    "requester": (
        "You asked for this run (or spoke in its thread), so you cannot approve its calls, "
        "nor allow them (self-approval is off: ALLOW_SELF_APPROVAL). Nothing was decided."
    ),
    "not_allowed": NOT_OFFERED,
    "too_many": "This thread has too many grants already; approve the call alone instead.",
    "bad_until": "The grant's end could not be set; nothing was decided. Try again.",
}
UNKNOWN_GRANT = "That grant does not exist (or no longer exists)."
CANNOT_CHECK = "I could not check that you may revoke this grant, so nothing was revoked."
NOT_RECORDED = (
    "⚠️ Not recorded yet: the approval service is not answering. You are told privately "
    "once it is; submit again if not within a minute."
)
UNAVAILABLE_FORM = "The approval service is unavailable; nothing was decided. Try again."


def without_escalation(gate: Gate) -> Gate:
    """The gate as its own approvers see it: a grant outlives an escalation, so only who may
    decide without it may grant."""
    return gate.model_copy(update={"escalated_at": None})


class GrantActions:
    def __init__(self, ctx: BotContext) -> None:
        self.ctx = ctx
        self.gates = GateActions(ctx)

    async def clicked(self, body: dict[str, Any], respond: Any, *, external: bool) -> None:
        """Approve & allow: check the clicker as for Approve, then open the modal."""
        loaded = await self.gates._load(body, respond, approve=True, external=external)
        if loaded is None:
            return
        user_id, gate, clicked_hash = loaded
        channel = channel_of(body)
        why = await self._why_not(user_id, gate, external)
        if why is not None:
            await tell(self.ctx, user_id, why, channel=channel, respond=respond)
            return
        meta = {"gate_id": gate.gate_id, "args_hash": clicked_hash, "channel": channel or ""}
        try:
            await self.ctx.client.views_open(
                trigger_id=str(body.get("trigger_id") or ""),
                view=grant_view.modal(gate, json.dumps(meta)),
            )
        except Exception as exc:
            log.warning("views.open failed: %s", slack_error(exc))
            await tell(
                self.ctx,
                user_id,
                "I could not open the form in time; nothing was decided. Click again.",
                channel=channel,
                respond=respond,
            )

    async def _why_not(self, user_id: str, gate: Gate, external: bool) -> str | None:
        if not grant_view.offered(gate):
            return NOT_OFFERED
        return await self.ctx.approvers.why_not_decide(
            user_id, without_escalation(gate), approve=True, external=external
        )

    async def submitted(
        self, body: dict[str, Any], answer: FormAnswer, *, external: bool, team: str
    ) -> None:
        """The modal's submission: ``answer`` closes the modal (the decision is durable, or
        there is nothing to decide: the person is told privately) or shows its errors."""
        user_id = user_id_of(body)
        view = body.get("view") if isinstance(body.get("view"), dict) else {}
        assert isinstance(view, dict)
        try:
            meta = json.loads(view.get("private_metadata") or "")
            gate_id, clicked_hash = str(meta["gate_id"]), str(meta["args_hash"])
            channel = str(meta.get("channel") or "") or None
        except (ValueError, KeyError, TypeError):
            log.warning("grant form without usable private_metadata ignored")
            return
        if user_id is None:
            return
        try:
            field, value = grant_view.chosen(view)
        except ValueError:
            await answer({grant_view.SCOPE_BLOCK: "Choose one of the options."})
            return
        gate = await self.ctx.gateway.get_gate(gate_id)
        if gate is None:
            await answer()
            await tell(self.ctx, user_id, UNKNOWN_GATE, channel=channel)
            return
        if gate.status is not GateStatus.PENDING:
            await answer()
            await tell(self.ctx, user_id, already_decided(gate), channel=channel)
            return
        why = await self._why_not(user_id, gate, external)
        if why is not None:
            await answer()
            await tell(self.ctx, user_id, why, channel=channel)
            return
        try:
            res = await self.ctx.gateway.grants.approve_and_allow(
                gate,  # as just read: its run is known
                user_id,
                args_hash=clicked_hash,
                field=field,
                value=value,
                allow_self_approval=self.ctx.approvers.allow_self_approval,
                team=team,
            )
        except GateNotFound:
            await answer()
            await tell(self.ctx, user_id, UNKNOWN_GATE, channel=channel)
            return
        except ArgsHashMismatch:
            await answer()
            await tell(self.ctx, user_id, mismatch(clicked_hash, gate), channel=channel)
            await self.gates._refresh(gate_id)
            return
        except ValueError as exc:
            await answer({grant_view.SCOPE_BLOCK: str(exc)[:150]})
            return
        await answer()  # durable in Redis: the modal may close now
        if res.grant is not None:
            answer.applied = True
            g = res.grant
            text = (
                f"✅ Approved, and `{cards.escape(g.tool)}` is allowed in this thread until "
                f"{cards.fmt_date(g.expires_at)} ({cards.escape(g.constraint)}). "
                "`/agent grants` lists and revokes it."
            )
        elif res.decision is not None and not res.decision.applied and not res.refused:
            text = already_decided(res.decision.gate)
        else:
            text = REFUSED.get(res.refused or "", "Nothing was decided.")
        await tell(self.ctx, user_id, text, channel=channel)
        await self.gates._refresh(gate_id)

    async def visible(self, user_id: str, *, external: bool) -> list[Grant]:
        """The live grants ``user_id`` may see: those whose call they may decide."""
        grants = await self.ctx.gateway.grants.live()
        gates = await self.ctx.gateway.gates_by_id(g.gate_id for g in grants)
        by_id = {g.gate_id: g for g in gates}
        shown = []
        for grant in grants:
            gate = by_id.get(grant.gate_id)
            if gate is None:  # fails closed: nothing to judge by
                continue
            if await self.ctx.approvers.why_not(user_id, external=external, gate=gate) is None:
                shown.append(grant)
        return shown

    async def list(self, user_id: str, respond: Any, *, external: bool) -> None:
        """``/agent grants``: the live grants the person may see, each with Revoke."""
        grants = await self.visible(user_id, external=external)
        text = f"{len(grants)} live grant(s)" if grants else "No live grants you can see."
        if respond is not None:
            await respond(
                text=text, blocks=grant_view.list_blocks(grants), response_type="ephemeral"
            )

    async def revoke(self, body: dict[str, Any], respond: Any, *, external: bool) -> None:
        """Revoke: checked like Deny on the call that made the grant."""
        user_id, grant_id, channel = user_id_of(body), action_value(body), channel_of(body)
        if user_id is None or not grant_id:
            return
        grant = await self.ctx.gateway.grants.get(grant_id)
        if grant is None:
            await tell(self.ctx, user_id, UNKNOWN_GRANT, channel=channel, respond=respond)
            return
        gate = await self.ctx.gateway.get_gate(grant.gate_id)
        if gate is None:
            await tell(self.ctx, user_id, CANNOT_CHECK, channel=channel, respond=respond)
            return
        why = await self.ctx.approvers.why_not_decide(
            user_id, without_escalation(gate), approve=False, external=external
        )
        if why is not None:
            await tell(self.ctx, user_id, why, channel=channel, respond=respond)
            return
        res = await self.ctx.gateway.grants.revoke(grant_id, user_id)
        if res is RevokeOutcome.REVOKED:
            text = (
                f"🔒 Revoked the grant for `{cards.escape(grant.tool)}` in thread "
                f"`{cards.escape(grant.scope)}`: its later calls ask a person again."
            )
        elif res is RevokeOutcome.ENDED:
            text = "That grant had already ended (revoked or expired)."
        else:
            text = UNKNOWN_GRANT
        await tell(self.ctx, user_id, text, channel=channel, respond=respond)


def register(app: AsyncApp, ctx: BotContext) -> None:
    """The grant listeners (before bot/actions.py's, whose last one takes any button)."""
    grants = GrantActions(ctx)

    @app.block_action(grant_view.GRANT_ACTION)
    @at_ack(ctx)
    async def on_grant(
        ack: Any, body: dict[str, Any], respond: Any, context: AsyncBoltContext
    ) -> None:
        await ack()
        external = is_external(body, home_team(body, context))
        async with ctx.busy():
            await guard(ctx, body, respond, grants.clicked(body, respond, external=external))

    @app.view(grant_view.GRANT_CALLBACK)
    @at_ack(ctx)
    async def on_grant_submitted(ack: Any, body: dict[str, Any], context: AsyncBoltContext) -> None:
        team = home_team(body, context) or ""
        external = is_external(body, team or None)
        async with ctx.busy():
            answer = await answer_form(
                ack,
                lambda answer: grants.submitted(body, answer, external=external, team=team),
                late={grant_view.SCOPE_BLOCK: NOT_RECORDED},
                failed={grant_view.SCOPE_BLOCK: UNAVAILABLE_FORM},
            )
            await told_late(ctx, body, answer, "approval")

    @app.block_action(grant_view.REVOKE_ACTION)
    @at_ack(ctx)
    async def on_revoke(
        ack: Any, body: dict[str, Any], respond: Any, context: AsyncBoltContext
    ) -> None:
        await ack()
        external = is_external(body, home_team(body, context))
        async with ctx.busy():
            await guard(ctx, body, respond, grants.revoke(body, respond, external=external))
