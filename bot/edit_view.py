"""Edit, then approve, in Slack (see :mod:`agent_core.editing`).

A pending gate whose tool allows edits (and that needs one approval) gets **Edit & approve**
on its card. The click is authorized as an Approve is (``Approvers.why_not_decide``), then
opens a modal prefilled with the validated arguments: one input per simple field (text,
number, checkbox, a select for enums and literals), a JSON editor for the rest; fields the
tool does not let a person edit are shown, not offered. The submission is authorized again
(a forged one included), checked against the gate's schema (an error keeps the modal open,
on its field) and decided through the core's DECIDE_GATE. The decided card shows what
changed: ``amount_cents: 4900 → 2500``.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from slack_bolt.async_app import AsyncApp, AsyncBoltContext

from agent_core.editing import approve_edited, changes, check_edit
from agent_core.exceptions import ArgsHashMismatch, GateNotFound, InvalidEdit
from agent_core.gateway import Gateway
from agent_core.models import DecideResult, Gate, GateStatus

from . import cards, quorum_view
from .acking import FormAnswer, answer_form, at_ack
from .clicks import (
    UNKNOWN_GATE,
    already_decided,
    channel_of,
    form_metadata,
    guard,
    home_team,
    is_external,
    mismatch,
)
from .context import BotContext
from .durable_acks import told_late
from .publisher import slack_error

if TYPE_CHECKING:
    from .actions import GateActions

log = logging.getLogger(__name__)

EDIT_ACTION = "gate_edit"
EDIT_CALLBACK = "gate_edit_submit"
ARG_BLOCK = "arg:"  # + the field's name: one input block per editable field
VALUE = "value"  # every input's action_id
MAX_TEXT = 3000  # plain_text_input's max_length
MAX_OPTIONS = 100  # static_select's
NOT_EDITABLE = "This request cannot be edited, so nothing was decided."
NOT_RECORDED = (
    "⚠️ Not recorded yet: the approval service is not answering. You are told privately "
    "once it is; submit again if not within a minute."
)
UNAVAILABLE = "The approval service is unavailable; nothing was decided. Try again."


def offered(gate: Gate) -> bool:
    """Whether the card offers Edit & approve: an editable pending gate that one approval
    decides (a quorum's gate never: each approver would approve other arguments)."""
    return (
        gate.status is GateStatus.PENDING
        and bool(gate.editable)
        and gate.args_schema is not None
        and gate.quorum is None
    )


def buttons(gate: Gate) -> list[dict[str, Any]]:
    """The card's Edit & approve button, when offered."""
    if not offered(gate):
        return []
    return [cards.button("Edit & approve", EDIT_ACTION, cards.button_value(gate))]


def changed_blocks(gate: Gate) -> list[dict[str, Any]]:
    """On a card approved with edits: who edited what, ``field: before → after``."""
    diff = changes(gate)
    if not diff:
        return []
    lines = [
        f"`{cards.clip(cards.escape(n), 100)}`: {cards.clip(cards.escape(a or '(none)'), 300)}"
        f" → {cards.clip(cards.escape(b or '(none)'), 300)}"
        for n, a, b in diff[:10]
    ]
    if len(diff) > 10:
        lines.append(f"and {len(diff) - 10} more")
    head = f"✏️ *Edited* by {cards.user(gate.edited_by)} before approving:"
    return [cards.section(cards.clip(head + "\n" + "\n".join(lines), 3000))]


# --------------------------------------------------------------------------- the modal
def _resolve(prop: dict[str, Any], root: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """A field's schema with a local ``$ref`` followed and ``Optional`` unwrapped:
    (schema, whether null is allowed)."""
    ref = prop.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        merged = {**(node if isinstance(node, dict) else {}), **prop}
        merged.pop("$ref", None)
        return _resolve(merged, root)
    options = prop.get("anyOf")
    if isinstance(options, list):
        rest = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
        if len(rest) == 1 and len(options) == 2 and isinstance(rest[0], dict):
            inner, _ = _resolve(rest[0], root)
            return {**inner, "description": prop.get("description")}, True
    return prop, False


def _kind(schema: dict[str, Any]) -> str:
    """text | integer | number | boolean | select | json: the input a field gets."""
    choices = schema.get("enum")
    if choices is None and "const" in schema:
        choices = [schema["const"]]
    if (
        isinstance(choices, list)
        and 0 < len(choices) <= MAX_OPTIONS
        and all(len(json.dumps(c)) <= 150 for c in choices)  # an option's value: 150 chars
    ):
        return "select"
    kind = schema.get("type")
    return kind if kind in ("string", "integer", "number", "boolean") else "json"


def _option(value: Any) -> dict[str, Any]:
    shown = value if isinstance(value, str) else json.dumps(value)
    return {
        "text": {"type": "plain_text", "text": cards.clip(shown or " ", 75)},
        "value": json.dumps(value)[:150],
    }


def _element(kind: str, schema: dict[str, Any], value: Any, present: bool) -> dict[str, Any]:
    el: dict[str, Any]
    if kind == "string":
        el = {"type": "plain_text_input", "max_length": MAX_TEXT}
        if isinstance(value, str) and value:
            el["initial_value"] = value[:MAX_TEXT]
    elif kind in ("integer", "number"):
        el = {"type": "number_input", "is_decimal_allowed": kind == "number"}
        if isinstance(value, int | float) and not isinstance(value, bool):
            el["initial_value"] = str(value)
        for key, slack in (("minimum", "min_value"), ("maximum", "max_value")):
            if isinstance(schema.get(key), int | float):
                el[slack] = str(schema[key])
    elif kind == "boolean":
        el = {"type": "checkboxes", "options": [_option(True) | _yes()]}
        if value is True:
            el["initial_options"] = [_option(True) | _yes()]
    elif kind == "select":
        choices = schema.get("enum") or [schema.get("const")]
        el = {"type": "static_select", "options": [_option(c) for c in choices]}
        if present and value in choices:
            el["initial_option"] = _option(value)
    else:
        el = {"type": "plain_text_input", "multiline": True, "max_length": MAX_TEXT}
        if present:
            el["initial_value"] = json.dumps(value, indent=2, ensure_ascii=False)[:MAX_TEXT]
    return {**el, "action_id": VALUE}


def _yes() -> dict[str, Any]:
    return {"text": {"type": "plain_text", "text": "Yes"}}


def fields(gate: Gate) -> list[tuple[str, str, dict[str, Any], bool]]:
    """The editable fields as (name, kind, schema, nullable), in the schema's order."""
    root = gate.args_schema or {}
    props = root.get("properties") or {}
    out = []
    for name in props:
        if name in gate.editable and isinstance(props[name], dict):
            schema, nullable = _resolve(props[name], root)
            out.append((name, _kind(schema), schema, nullable))
    return out


def edit_modal(gate: Gate, private_metadata: str) -> dict[str, Any]:
    """The Edit & approve modal, prefilled with the gate's arguments."""
    fixed = [n for n in gate.args if n not in gate.editable]
    blocks: list[dict[str, Any]] = [
        cards.section(
            f"Edit `{cards.clip(cards.escape(gate.tool), 200)}` for run "
            f"`{cards.clip(cards.escape(gate.run_id), 100)}`, then approve. The call runs "
            "with your arguments; the agent is told them and its original request."
        )
    ]
    if fixed:
        shown = ", ".join(
            f"`{cards.escape(n)}` = {cards.escape(json.dumps(gate.args[n], ensure_ascii=False))}"
            for n in fixed
        )
        blocks.append(cards.context(cards.clip("Not editable: " + shown, 3000)))
    for name, kind, schema, nullable in fields(gate):
        present = name in gate.args
        value = gate.args.get(name)
        block: dict[str, Any] = {
            "type": "input",
            "block_id": cards.clip(ARG_BLOCK + name, 255),
            "label": {"type": "plain_text", "text": cards.clip(name, 2000)},
            "element": _element(kind, schema, value, present),
            "optional": nullable or kind in ("boolean", "string"),
        }
        hint = schema.get("description")
        if kind == "json":
            hint = ((hint or "") + " (JSON)").strip()
        if hint:
            block["hint"] = {"type": "plain_text", "text": cards.clip(str(hint), 2000)}
        blocks.append(block)
    return {
        "type": "modal",
        "callback_id": EDIT_CALLBACK,
        "private_metadata": private_metadata,
        "title": {"type": "plain_text", "text": "Edit & approve"},
        "submit": {"type": "plain_text", "text": "Approve"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": blocks[:100],
    }


def _number(raw: str, kind: str) -> int | float:
    if kind == "integer":
        return int(raw)
    value = float(raw)
    return int(value) if value.is_integer() and "." not in raw and "e" not in raw.lower() else value


def parse(gate: Gate, values: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The edited arguments from a submission's ``view.state.values`` (fields not offered
    keep the gate's values), and the errors by block_id."""
    args = dict(gate.args)
    errors: dict[str, str] = {}
    values = values if isinstance(values, dict) else {}
    for name, kind, _schema, nullable in fields(gate):
        block = cards.clip(ARG_BLOCK + name, 255)
        state = values.get(block, {}).get(VALUE) if isinstance(values.get(block), dict) else None
        state = state if isinstance(state, dict) else {}
        try:
            if kind == "boolean":
                args[name] = bool(state.get("selected_options"))
            elif kind == "select":
                picked = state.get("selected_option")
                if isinstance(picked, dict):
                    args[name] = json.loads(str(picked.get("value")))
                elif nullable:
                    args[name] = None
                else:
                    errors[block] = "Pick one."
            else:
                raw = state.get("value")
                raw = raw if isinstance(raw, str) else ""
                if kind == "string":
                    args[name] = None if (nullable and raw == "") else raw
                elif raw.strip() == "":
                    if nullable:
                        args[name] = None
                    else:
                        errors[block] = "Required."
                elif kind in ("integer", "number"):
                    args[name] = _number(raw.strip(), kind)
                else:
                    args[name] = json.loads(raw)
        except ValueError:
            errors[block] = (
                "Not a whole number."
                if kind == "integer"
                else ("Not a number." if kind == "number" else "Not valid JSON.")
            )
    return args, errors


def _errors_on_blocks(gate: Gate, problems: dict[str, str]) -> dict[str, str]:
    """The core's field errors on the modal's blocks (a field without an input, or the
    arguments as a whole, on the first input)."""
    offered_fields = [name for name, *_ in fields(gate)]
    first = cards.clip(ARG_BLOCK + offered_fields[0], 255) if offered_fields else ""
    out: dict[str, str] = {}
    for name, problem in problems.items():
        block = cards.clip(ARG_BLOCK + name, 255) if name in offered_fields else first
        text = problem if name in offered_fields else f"{name or 'The arguments'}: {problem}"
        out[block] = (out[block] + "; " + text) if block in out else text
    return out


# --------------------------------------------------------------------------- the handlers
def _meta(body: dict[str, Any]) -> tuple[str, str | None, str | None] | None:
    meta = form_metadata(body)
    if meta is None or not isinstance(meta.get("gate_id"), str):
        return None
    channel = meta.get("channel")
    clicked = meta.get("args_hash")
    return (
        meta["gate_id"],
        channel if isinstance(channel, str) and channel else None,
        clicked if isinstance(clicked, str) and clicked else None,
    )


def refused_text(result: DecideResult) -> str:
    if result.refused in ("not_editable", "edit"):
        return NOT_EDITABLE
    if result.refused == "quorum":
        return "This request needs several approvals, so it cannot be edited; nothing was decided."
    return quorum_view.refused_message(result)


class EditActions:
    """Edit & approve: the click (opens the modal) and the submission (decides)."""

    def __init__(self, ctx: BotContext, actions: GateActions) -> None:
        self.ctx, self.actions = ctx, actions

    async def clicked(self, body: dict[str, Any], respond: Any, *, external: bool) -> None:
        loaded = await self.actions._load(body, respond, approve=True, external=external)
        if loaded is None:
            return
        user_id, gate, clicked_hash = loaded
        channel = channel_of(body)
        if not offered(gate):
            await self.actions._tell(user_id, NOT_EDITABLE, channel=channel, respond=respond)
            return
        meta = {"gate_id": gate.gate_id, "channel": channel or "", "args_hash": clicked_hash}
        try:
            await self.ctx.client.views_open(
                trigger_id=str(body.get("trigger_id") or ""),
                view=edit_modal(gate, json.dumps(meta)),
            )
        except Exception as exc:
            log.warning("views.open failed: %s", slack_error(exc))
            await self.actions._tell(
                user_id,
                "I could not open the edit form in time; nothing was decided. Click "
                "*Edit & approve* again.",
                channel=channel,
                respond=respond,
            )

    async def submitted(self, answer: FormAnswer, body: dict[str, Any], *, external: bool) -> None:
        """Validate and decide; ``answer`` keeps the modal open with errors, or closes it
        (once the decision is durable, or there is nothing to decide)."""
        user = body.get("user")
        user_id = user.get("id") if isinstance(user, dict) else None
        meta = _meta(body)
        if not isinstance(user_id, str) or not user_id or meta is None:
            log.warning("edit form without a user or usable private_metadata ignored")
            return
        gate_id, channel, clicked_hash = meta
        tell = self.actions._tell
        gate = await self.ctx.gateway.get_gate(gate_id)
        if gate is None:
            await answer()
            await tell(user_id, UNKNOWN_GATE, channel=channel)
            return
        if gate.status is not GateStatus.PENDING:
            await answer()
            await tell(user_id, already_decided(gate), channel=channel)
            await self.actions._refresh(gate_id)
            return
        why = await self.ctx.approvers.why_not_decide(
            user_id, gate, approve=True, external=external
        )
        if why is not None:  # a forged submission is refused as a click would be
            await answer()
            await tell(user_id, why, channel=channel)
            return
        if not offered(gate) or clicked_hash is None:
            await answer()
            await tell(user_id, NOT_EDITABLE, channel=channel)
            return
        view = body.get("view")
        state = view.get("state") if isinstance(view, dict) else None
        args, errors = parse(gate, state.get("values") if isinstance(state, dict) else None)
        problems = check_edit(gate, args)
        errors = {**_errors_on_blocks(gate, problems), **errors}
        if errors:
            await answer(errors)
            return
        approvers, gateway = self.ctx.approvers, self.ctx.gateway
        if not isinstance(gateway, Gateway):  # edits need the core's own gateway
            await answer()
            await tell(user_id, NOT_EDITABLE, channel=channel)
            return
        try:
            result = await approve_edited(
                gateway,
                gate,  # as just read and checked: its run is known
                user_id,
                args,
                args_hash=clicked_hash,
                allow_self_approval=approvers.allow_self_approval,
            )
        except InvalidEdit as exc:  # checked above; only a change meanwhile gets here
            await answer(_errors_on_blocks(gate, exc.errors))
            return
        except GateNotFound:
            await answer()
            await tell(user_id, UNKNOWN_GATE, channel=channel)
            return
        except ArgsHashMismatch:
            await answer()
            await tell(user_id, mismatch(clicked_hash, gate), channel=channel)
            await self.actions._refresh(gate_id)
            return
        await answer()  # durable in Redis: the modal may close now
        if result.refused:
            await tell(user_id, refused_text(result), channel=channel)
        elif not result.applied or result.gate.status is not GateStatus.APPROVED:
            await tell(user_id, already_decided(result.gate), channel=channel)
        else:
            answer.applied = True
        await self.actions._refresh(gate_id)


def _first_input(body: dict[str, Any]) -> str:
    """The block id of the submitted modal's first input (where a note on the whole form
    shows): ``view.state.values``' first key."""
    view = body.get("view")
    state = view.get("state") if isinstance(view, dict) else None
    values = state.get("values") if isinstance(state, dict) else None
    return next(iter(values), "") if isinstance(values, dict) else ""


def register(app: AsyncApp, ctx: BotContext, actions: GateActions) -> None:
    """Listen for Edit & approve's click and its modal's submission."""
    edits = EditActions(ctx, actions)

    @app.block_action(EDIT_ACTION)
    @at_ack(ctx)
    async def on_edit(
        ack: Any, body: dict[str, Any], respond: Any, context: AsyncBoltContext
    ) -> None:
        await ack()
        external = is_external(body, home_team(body, context))
        async with ctx.busy():
            await guard(ctx, body, respond, edits.clicked(body, respond, external=external))

    @app.view(EDIT_CALLBACK)
    @at_ack(ctx)
    async def on_edit_submitted(ack: Any, body: dict[str, Any], context: AsyncBoltContext) -> None:
        external = is_external(body, home_team(body, context))
        first = _first_input(body)
        async with ctx.busy():
            answer = await answer_form(
                ack,
                lambda answer: edits.submitted(answer, body, external=external),
                late={first: NOT_RECORDED},
                failed={first: UNAVAILABLE},
            )
            await told_late(ctx, body, answer, "approval")
