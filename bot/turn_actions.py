"""A turn's "Approve all N" / "Deny all": every pending gate of a turn at once.

The buttons carry ``<run id>:<turn>:<digest of its gates>``. Each click is authorized as one
click on every pending gate of the turn (one refusal refuses the lot), and decides them with
``decide_many`` (each gate atomically; a gate decided meanwhile is left as it is).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from agent_core.exceptions import GateNotFound
from agent_core.models import Decision, Gate, GateStatus

from . import cards, quorum_view
from .clicks import (
    CardActions,
    action_value,
    channel_of,
    form_metadata,
    form_reason,
    origin_channel,
    user_id_of,
)
from .durable_acks import Outcome
from .publisher import slack_error

log = logging.getLogger(__name__)

UNKNOWN_TURN = (
    "That button does not match any approval requests I know of (it may be forged or out of "
    "date), so nothing was decided."
)


class TurnActions(CardActions):
    """Approve all and Deny all (its click and its form)."""

    async def _load_turn(
        self,
        user_id: str,
        value: str | None,
        channel: str | None,
        respond: Any,
        *,
        approve: bool,
        external: bool,
    ) -> list[Gate] | None:
        """The gates of the turn a button names (in call order), if the clicker may decide
        every pending one of them; otherwise tell them why and return None."""
        tell = self._tell
        parsed = cards.parse_turn_value(value) if value else None
        gates = await self.ctx.publisher.turn_gates(*parsed[:2]) if parsed else []
        if parsed is None or len(gates) < 2 or cards.turn_digest(gates) != parsed[2]:
            await tell(user_id, UNKNOWN_TURN, channel=channel, respond=respond)
            return None
        pending = [g for g in gates if g.status is GateStatus.PENDING]
        if not pending:
            text = cards.decided_many_message(approve, [], [], gates)
            await tell(user_id, text, channel=channel, respond=respond)
            await self._refresh_turn(gates[0])
            return None
        for gate in pending:  # one refusal refuses the lot: nothing is decided
            why = await self.ctx.approvers.why_not_decide(
                user_id, gate, approve=approve, external=external
            )
            if why is not None:
                await tell(user_id, why, channel=channel, respond=respond)
                return None
        return gates

    async def approve_all(
        self, body: dict[str, Any], respond: Any, outcome: Outcome, *, external: bool = True
    ) -> None:
        user_id, channel = user_id_of(body), channel_of(body)
        if user_id is None:
            return
        gates = await self._load_turn(
            user_id, action_value(body), channel, respond, approve=True, external=external
        )
        if gates is not None:
            await self._decide_turn(
                user_id, gates, Decision.APPROVE, None, channel, respond, outcome
            )

    async def deny_all_clicked(
        self, body: dict[str, Any], respond: Any, *, external: bool = True
    ) -> None:
        user_id, value, channel = user_id_of(body), action_value(body), channel_of(body)
        if user_id is None:
            return
        gates = await self._load_turn(
            user_id, value, channel, respond, approve=False, external=external
        )
        if gates is None:
            return
        pending = [g for g in gates if g.status is GateStatus.PENDING]
        meta = json.dumps({"turn": value, "channel": channel or ""})
        try:
            await self.ctx.client.views_open(
                trigger_id=str(body.get("trigger_id") or ""),
                view=cards.deny_all_modal(pending, meta),
            )
        except Exception as exc:
            log.warning("views.open failed: %s", slack_error(exc))
            await self._tell(
                user_id,
                "I could not open the deny form in time; nothing was decided. Click *Deny all* "
                "again.",
                channel=channel,
                respond=respond,
            )

    async def deny_all_submitted(
        self, body: dict[str, Any], outcome: Outcome, *, external: bool = True
    ) -> None:
        user_id, meta = user_id_of(body), form_metadata(body) or {}
        value, channel = meta.get("turn"), str(meta.get("channel") or "") or None
        if user_id is None:
            return
        raw_view = body.get("view")
        reason = form_reason(raw_view if isinstance(raw_view, dict) else {})
        gates = await self._load_turn(
            user_id,
            value if isinstance(value, str) else None,
            channel,
            None,
            approve=False,
            external=external,
        )
        if gates is not None:
            channel = channel or origin_channel(gates[0])
            await self._decide_turn(user_id, gates, Decision.DENY, reason, channel, None, outcome)

    async def _decide_turn(
        self,
        user_id: str,
        gates: list[Gate],
        decision: Decision,
        reason: str | None,
        channel: str | None,
        respond: Any,
        outcome: Outcome,
    ) -> None:
        pending = [g for g in gates if g.status is GateStatus.PENDING]  # each names its run
        tell = self._tell
        approvers = self.ctx.approvers
        groups: set[str] = set()
        for gate in gates if decision is Decision.APPROVE else []:
            groups.update(await approvers.quorum_groups(user_id, gate))
        try:
            results = await self.ctx.gateway.decide_many(
                pending,
                decision,
                user_id,
                reason,
                groups=sorted(groups),
                allow_self_approval=approvers.allow_self_approval,
            )
        except GateNotFound:
            await tell(user_id, UNKNOWN_TURN, channel=channel, respond=respond)
            return
        outcome.channel = channel
        outcome.durable.set()  # durable in Redis: the click may be acknowledged now
        decided = {r.gate.gate_id: r for r in results}
        mine: list[Gate] = []
        late: list[Gate] = []  # expired before the click (the deadline had passed)
        others: list[Gate] = []  # decided before the click
        counted = [r.gate for r in results if r.counted]  # a quorum's approval, counted
        refused = [r for r in results if r.refused]
        for gate in gates:
            r = decided.get(gate.gate_id)
            if r is not None and (r.counted or r.refused):
                continue
            if r is None or not r.applied:
                others.append(r.gate if r is not None else gate)
            elif r.gate.status is decision.status:
                mine.append(r.gate)
            else:
                late.append(r.gate)
        outcome.applied = bool(mine or counted)
        text = cards.decided_many_message(decision is Decision.APPROVE, mine, late, others)
        if counted or refused:
            if not mine:
                text = text.removeprefix(cards.decided_many_message(True, [], [], []))
            text = (text.strip() + "\n" + quorum_view.many_line(counted, refused)).strip()
        await tell(user_id, text, channel=channel, respond=respond)
        for gate in mine + late + counted:
            await self._refresh(gate.gate_id)
        await self._refresh_turn(gates[0])

    async def _refresh_turn(self, gate: Gate) -> None:
        try:
            await self.ctx.publisher.show_turn(gate.run_id, gate.turn)
        except Exception as exc:
            log.warning("update of turn %s of %s deferred: %s", gate.turn, gate.run_id, exc)
