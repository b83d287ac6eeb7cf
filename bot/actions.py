"""Button clicks and the deny-reason modal.

Every handler acknowledges within Slack's 3 s. A decision is one atomic call into the core
(Redis), made before any card update, so a Slack failure afterwards never loses it; Approve
and the deny form are acknowledged once that call is durable, or after ACK_BUDGET_SECONDS
with the clicker told that nothing is recorded yet. Approve and Deny carry
``<gate id>:<arguments hash>``: the core decides only when the hash is the gate's.

A turn that opened several gates also has "Approve all N" / "Deny all" (``<run id>:<turn>:
<digest of its gates>``): each click is authorized as one click on every pending gate of the
turn, and decides them with ``decide_many`` (each gate atomically; a gate decided meanwhile
is left as it is).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from slack_bolt.async_app import AsyncApp, AsyncBoltContext

from agent_core.exceptions import ArgsHashMismatch, GateNotFound
from agent_core.models import Decision, Gate, GateStatus

from . import cards, edit_view, quorum_view
from .acking import FormAnswer, at_ack
from .context import BotContext
from .home import HOME
from .publisher import slack_error

log = logging.getLogger(__name__)

ACK_BUDGET_SECONDS = 2.0
UNKNOWN_GATE = "This approval request does not exist (or no longer exists), so nothing was decided."
MALFORMED = "That request was malformed, so nothing was decided."
NO_HASH = (
    "This button does not say which arguments it approves (the card predates an update), "
    "so nothing was decided. The card now shows the current arguments: check them and click "
    "*Approve* again."
)
NOT_RECORDED_YET = (
    "⚠️ Your {what} has not been recorded yet: the approval service is not answering. The card "
    "shows the outcome once it is; if it still shows the buttons in a minute, click again."
)
NOT_RECORDED_FORM = (
    "⚠️ Your denial could not be recorded yet: the approval service is not answering. "
    "Try again in a moment."
)
RECORDED_NOW = "✅ Your {what} is recorded now."
UNKNOWN_TURN = (
    "That button does not match any approval requests I know of (it may be forged or out of "
    "date), so nothing was decided."
)


@dataclass
class Outcome:
    """What became of one click, for the handler that must acknowledge it in time."""

    durable: asyncio.Event = field(default_factory=asyncio.Event)  # decision stored in Redis
    applied: bool = False  # this click's decision is the gate's
    channel: str | None = None  # where the clicker can be told


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


def from_home(body: dict[str, Any]) -> bool:
    """A click on the App Home view (it carries no channel: the clicker is told on Home)."""
    view = body.get("view")
    return isinstance(view, dict) and view.get("type") == "home"


def _channel(body: dict[str, Any]) -> str | None:
    """Where the clicker can be told: the card's channel, or :data:`HOME`."""
    if from_home(body):
        return HOME
    for holder in (body.get("container"), body.get("channel")):
        if isinstance(holder, dict):
            c = holder.get("channel_id") or holder.get("id")
            if isinstance(c, str) and c:
                return c
    meta = _metadata(body)  # a deny form carries its card's channel
    c = meta.get("channel") if meta else None
    return c if isinstance(c, str) and c else None


def _metadata(body: dict[str, Any]) -> dict[str, Any] | None:
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
    user_id = _user_id(body)
    if ctx.home is not None and user_id and _channel(body) == HOME:
        await ctx.home.clicked(user_id, since)


class GateActions:
    def __init__(self, ctx: BotContext) -> None:
        self.ctx = ctx

    async def _tell(
        self, user_id: str, text: str, *, channel: str | None = None, respond: Any = None
    ) -> None:
        await tell(self.ctx, user_id, text, channel=channel, respond=respond)

    async def _load(
        self, body: dict[str, Any], respond: Any, *, approve: bool, external: bool
    ) -> tuple[str, Gate, str | None] | None:
        """The clicker, the gate and the hash on the button, if they may decide it now;
        otherwise tell them why."""
        user_id, value, channel = _user_id(body), _action_value(body), _channel(body)
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
            user_id, gate, Decision.APPROVE, None, clicked_hash, _channel(body), respond, outcome
        )

    async def deny_clicked(
        self, body: dict[str, Any], respond: Any, *, external: bool = True
    ) -> None:
        loaded = await self._load(body, respond, approve=False, external=external)
        if loaded is None:
            return
        user_id, gate, clicked_hash = loaded
        channel = _channel(body)
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
        user_id = _user_id(body)
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
        reason = _reason(view)
        tell = self._tell
        gate = await self.ctx.gateway.get_gate(gate_id)
        if gate is None:
            await tell(user_id, UNKNOWN_GATE, channel=channel)
            return
        channel = channel or _origin_channel(gate)
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
        user_id, value = _user_id(body), _action_value(body)
        if user_id is None:
            return
        gate_id = cards.parse_button_value(value)[0] if value else None
        gate = await self.ctx.gateway.get_gate(gate_id) if gate_id else None
        if gate is None:
            await self._tell(user_id, UNKNOWN_GATE, channel=_channel(body), respond=respond)
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
            await self._refresh(gate.gate_id)
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
        # Not applied: someone was first. Applied but not what was asked: the deadline had
        # passed, so the click expired the gate instead.
        elif not result.applied or result.gate.status is not decision.status:
            await tell(user_id, already_decided(result.gate), channel=channel, respond=respond)
        elif outcome is not None:
            outcome.applied = True
        # Shown at once, not after the notifier's queue (which then finds the card showing
        # this decision and leaves it: Notifier.handle); a stale card is made to tell the truth.
        await self._refresh(gate.gate_id)

    # --- every pending gate of a turn at once ------------------------------------------
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
        user_id, channel = _user_id(body), _channel(body)
        if user_id is None:
            return
        gates = await self._load_turn(
            user_id, _action_value(body), channel, respond, approve=True, external=external
        )
        if gates is not None:
            await self._decide_turn(
                user_id, gates, Decision.APPROVE, None, channel, respond, outcome
            )

    async def deny_all_clicked(
        self, body: dict[str, Any], respond: Any, *, external: bool = True
    ) -> None:
        user_id, value, channel = _user_id(body), _action_value(body), _channel(body)
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
        user_id, meta = _user_id(body), _metadata(body) or {}
        value, channel = meta.get("turn"), str(meta.get("channel") or "") or None
        if user_id is None:
            return
        raw_view = body.get("view")
        reason = _reason(raw_view if isinstance(raw_view, dict) else {})
        gates = await self._load_turn(
            user_id,
            value if isinstance(value, str) else None,
            channel,
            None,
            approve=False,
            external=external,
        )
        if gates is not None:
            channel = channel or _origin_channel(gates[0])
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
            await tell(ctx, user_id, UNAVAILABLE, channel=_channel(body), respond=respond)


async def told_late(ctx: BotContext, body: dict[str, Any], answer: FormAnswer, what: str) -> None:
    """After a modal answered late (it says nothing is recorded yet): tell the person
    privately what it could not show (its errors), or that their ``what`` is recorded now."""
    user_id = _user_id(body)
    if not answer.late or not user_id:
        return
    channel = (_metadata(body) or {}).get("channel") or None
    if answer.errors:
        text = " ".join(answer.errors.values())
    elif answer.applied:
        text = RECORDED_NOW.format(what=what) + " You can close the form."
    else:
        return
    await tell(ctx, user_id, text, channel=channel if isinstance(channel, str) else None)


async def _settled_in_time(task: asyncio.Future[None], outcome: Outcome) -> bool:
    """Wait until the click's decision is durable in Redis or its handler is done, for at
    most ACK_BUDGET_SECONDS (Slack's limit is 3 s); ``False`` if neither happened."""
    waiter = asyncio.ensure_future(outcome.durable.wait())
    either: set[asyncio.Future[Any]] = {task, waiter}
    await asyncio.wait(either, timeout=ACK_BUDGET_SECONDS, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    return task.done() or outcome.durable.is_set()


def register(app: AsyncApp, ctx: BotContext) -> None:
    actions = GateActions(ctx)

    async def say(
        user_id: str, text: str, *, channel: str | None = None, respond: Any = None
    ) -> None:
        await tell(ctx, user_id, text, channel=channel, respond=respond)

    # A decision is acknowledged once it is durable in Redis (one script, ~1 ms), so a web
    # process dying right after Slack showed the click as received cannot lose it. When Redis
    # does not answer within the budget, the ack still goes out, and the clicker is told
    # that nothing is recorded yet, instead of an ack that looks like success.

    async def ack_when_durable(
        ack: Any,
        body: dict[str, Any],
        respond: Any,
        what: str,
        work: Callable[[Outcome], Awaitable[None]],
    ) -> None:
        outcome = Outcome()
        user_id, channel = _user_id(body), _channel(body)
        since = time.time()
        async with ctx.busy():
            task = asyncio.ensure_future(_guard(ctx, body, respond, work(outcome)))
            settled = await _settled_in_time(task, outcome)
            await ack()
            if not settled and user_id:
                late = NOT_RECORDED_YET.format(what=what)
                await say(user_id, late, channel=channel, respond=respond)
            await task
            await home_clicked(ctx, body, since)
            if not settled and outcome.applied and user_id:
                now = RECORDED_NOW.format(what=what)
                await say(user_id, now, channel=channel, respond=respond)

    async def submit_when_durable(
        ack: Any, body: dict[str, Any], work: Callable[[Outcome], Awaitable[None]]
    ) -> None:
        outcome = Outcome()
        since = time.time()
        async with ctx.busy():
            task = asyncio.ensure_future(_guard(ctx, body, None, work(outcome)))
            settled = await _settled_in_time(task, outcome)
            if settled:
                await ack()
            else:  # the form stays open, saying so
                await ack(response_action="errors", errors={cards.REASON_BLOCK: NOT_RECORDED_FORM})
            await task
            await home_clicked(ctx, body, since)
            user_id = _user_id(body)
            if not settled and outcome.applied and user_id:
                now = RECORDED_NOW.format(what="denial") + " You can close the form."
                await say(user_id, now, channel=outcome.channel)

    @app.block_action(cards.APPROVE_ACTION)
    @at_ack(ctx)
    async def on_approve(
        ack: Any, body: dict[str, Any], respond: Any, context: AsyncBoltContext
    ) -> None:
        external = is_external(body, home_team(body, context))
        await ack_when_durable(
            ack,
            body,
            respond,
            "approval",
            lambda outcome: actions.approve(body, respond, outcome, external=external),
        )

    @app.block_action(cards.TURN_APPROVE_ACTION)
    @at_ack(ctx)
    async def on_approve_all(
        ack: Any, body: dict[str, Any], respond: Any, context: AsyncBoltContext
    ) -> None:
        external = is_external(body, home_team(body, context))
        await ack_when_durable(
            ack,
            body,
            respond,
            "*Approve all*",
            lambda outcome: actions.approve_all(body, respond, outcome, external=external),
        )

    @app.block_action(cards.TURN_DENY_ACTION)
    @at_ack(ctx)
    async def on_deny_all(
        ack: Any, body: dict[str, Any], respond: Any, context: AsyncBoltContext
    ) -> None:
        await ack()
        external = is_external(body, home_team(body, context))
        async with ctx.busy():
            work = actions.deny_all_clicked(body, respond, external=external)
            await _guard(ctx, body, respond, work)

    @app.block_action(cards.DENY_ACTION)
    @at_ack(ctx)
    async def on_deny(
        ack: Any, body: dict[str, Any], respond: Any, context: AsyncBoltContext
    ) -> None:
        await ack()
        since = time.time()
        external = is_external(body, home_team(body, context))
        async with ctx.busy():
            await _guard(ctx, body, respond, actions.deny_clicked(body, respond, external=external))
            await home_clicked(ctx, body, since)

    @app.block_action(cards.ARGS_ACTION)
    @at_ack(ctx)
    async def on_args(ack: Any, body: dict[str, Any], respond: Any) -> None:
        await ack()
        async with ctx.busy():
            await _guard(ctx, body, respond, actions.show_args(body, respond))

    @app.view(cards.DENY_CALLBACK)
    @at_ack(ctx)
    async def on_deny_reason(ack: Any, body: dict[str, Any], context: AsyncBoltContext) -> None:
        external = is_external(body, home_team(body, context))
        await submit_when_durable(
            ack, body, lambda outcome: actions.deny_submitted(body, outcome, external=external)
        )

    @app.view(cards.TURN_DENY_CALLBACK)
    @at_ack(ctx)
    async def on_deny_all_reason(ack: Any, body: dict[str, Any], context: AsyncBoltContext) -> None:
        external = is_external(body, home_team(body, context))
        await submit_when_durable(
            ack, body, lambda outcome: actions.deny_all_submitted(body, outcome, external=external)
        )

    edit_view.register(app, ctx, actions)  # Edit & approve (bot/edit_view.py)

    # Registered last: Bolt tries listeners in order, so this only catches the rest. Only
    # block_actions: legacy payloads are answered quietly (bot/quiet.py).
    @app.block_action(re.compile(r".*", re.DOTALL))
    @at_ack(ctx)
    async def on_unknown_action(ack: Any, body: dict[str, Any], respond: Any) -> None:
        await ack()
        user_id = _user_id(body)
        if user_id:
            async with ctx.busy():
                await say(
                    user_id,
                    "I don't know that button, so nothing happened.",
                    channel=_channel(body),
                    respond=respond,
                )
