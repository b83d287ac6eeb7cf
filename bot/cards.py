"""Pure Block Kit builders: gate cards, modals, thread messages.

Nothing here talks to Slack or Redis. Every builder keeps within Slack's limits (section
text 3,000, header 150, button text 75 / value 2,000, 50 blocks a message, 100 a modal,
~13 k characters of blocks a message) and always returns a ``text`` fallback. Text from the
model, tools or users is escaped (``& < >``) so it cannot mention ``@channel`` or fake links.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from agent_core.models import Gate, GateStatus

SECTION_LIMIT = 3000
HEADER_LIMIT = 150
FIELD_LIMIT = 2000
BUTTON_TEXT_LIMIT = 75
MODAL_BLOCK_LIMIT = 100
# Characters of code per section: the fences take 8 and Slack may count some characters twice.
CODE_CHUNK = 2800
CARD_ARG_CHUNKS = 3
MODAL_ARG_CHUNKS = 40
RESULT_LIMIT = 1000
DESCRIPTION_LIMIT = 1000
TASK_LIMIT = 2500

APPROVE_ACTION = "gate_approve"
DENY_ACTION = "gate_deny"
ARGS_ACTION = "gate_args"
DENY_CALLBACK = "gate_deny_reason"
TURN_APPROVE_ACTION = "turn_approve_all"
TURN_DENY_ACTION = "turn_deny_all"
TURN_DENY_CALLBACK = "turn_deny_reason"
CONFIRM_TEXT_LIMIT = 300  # a confirm dialog's text
MIN_CALL_WIDTH = 24  # the fewest characters a call gets in a confirm dialog's list
TURN_LIST_LIMIT = 15  # calls listed with their arguments in a turn's "Approve all" message
TURN_LINE_LIMIT = 150
REASON_BLOCK = "reason"
REASON_ACTION = "reason_input"
REASON_MAX = 500

_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_ESC_LEN = {k: len(v) for k, v in _ESCAPES.items()}


@dataclass(frozen=True)
class Card:
    """A message: fallback text plus blocks."""

    text: str
    blocks: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class ToolResult:
    """What the bot learnt about an approved call: its ``tool.executed`` event, or from the
    ``run.cancelled`` event, that it never ran or was still running at the cancel."""

    ok: bool
    output: str = ""
    in_doubt: bool = False
    skipped: str | None = None  # why an approved call never ran (e.g. its run was cancelled)
    after_cancel: bool = False  # the call finished after its run was cancelled
    # No outcome yet: the call was running when its run was cancelled (its tool.executed
    # replaces this result when it comes).
    running_at_cancel: bool = False


# --------------------------------------------------------------------------- text helpers
def escape(text: str) -> str:
    """Escape the three characters Slack treats as control characters in mrkdwn."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def clip(text: str, limit: int, marker: str = "…") -> str:
    """Cut plain text to ``limit`` characters, marking the cut."""
    return text if len(text) <= limit else text[: max(0, limit - len(marker))] + marker


def clip_escaped(text: str, limit: int) -> str:
    """Escape ``text`` and keep the result within ``limit`` characters, marking any cut."""
    out = escape(text)
    if len(out) <= limit:
        return out
    cut = split_escaped(text, limit - 1, max_chunks=1)[0]
    return escape(cut) + "…"


def fmt_date(ts: float | None) -> str:
    """A date Slack renders in each reader's own time zone."""
    if ts is None:
        return "an unknown time"
    when = datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{int(ts)}^{{date_short_pretty}} at {{time}}|{when}>"


def fmt_duration(seconds: float) -> str:
    """300 → "5 min", 45 → "45 s", 7200 → "2 h"."""
    s = max(0, round(seconds))
    if s % 3600 == 0 and s >= 3600:
        return f"{s // 3600} h"
    if s % 60 == 0 and s >= 60:
        return f"{s // 60} min"
    return f"{s} s"


def user(user_id: str | None) -> str:
    if not user_id or user_id == "system":
        return "the system"
    if user_id.startswith("rule:"):  # an approver rule decided (agent_core.approvers)
        return f"the rule `{escape(user_id[5:])}`"
    if user_id.startswith("grant:"):  # a grant decided (agent_core.grants, bot/grant_view.py)
        return f"the grant `{escape(user_id[6:])}`"
    return f"<@{escape(user_id)}>"


def requesters(gate: Gate, limit: int = 8) -> str:
    """``<@A> (thread: <@B>, <@C>)``: the primary requester, then whoever else spoke to the
    agent before it asked for the call (each a requester who may not approve it)."""
    primary = gate.requested_by or (gate.requesters[0] if gate.requesters else "")
    others = [u for u in gate.requesters if u != primary]
    if not others:
        return user(primary)
    shown = ", ".join(user(u) for u in others[:limit])
    more = f" and {len(others) - limit} more" if len(others) > limit else ""
    return f"{user(primary)} (thread: {shown}{more})"


def pretty_args(args: dict[str, Any]) -> str:
    return json.dumps(args, indent=2, ensure_ascii=False, default=str)


def split_escaped(raw: str, limit: int, max_chunks: int | None = None) -> list[str]:
    """Split ``raw`` into pieces whose *escaped* length is at most ``limit``.

    Cuts prefer a line break in the second half of a piece. Stops after ``max_chunks``.
    """
    out: list[str] = []
    start, n = 0, len(raw)
    while start < n and (max_chunks is None or len(out) < max_chunks):
        size, i, last_nl = 0, start, -1
        while i < n:
            w = _ESC_LEN.get(raw[i], 1)
            if size + w > limit:
                break
            size += w
            if raw[i] == "\n":
                last_nl = i
            i += 1
        if i < n and last_nl > start + (i - start) // 2:
            i = last_nl + 1
        if i == start:  # limit smaller than one escaped character
            i += 1
        out.append(raw[start:i])
        start = i
    return out


def code_block(raw: str) -> str:
    # A literal ``` would close the fence early; a zero-width space keeps it visible but inert.
    return "```\n" + escape(raw.replace("```", "`\u200b``")) + "\n```"


def args_hash_short(gate: Gate) -> str:
    h = gate.args_hash or hashlib.sha256(pretty_args(gate.args).encode()).hexdigest()
    return short_hash(h)


def short_hash(h: str) -> str:
    """The first 12 characters of an arguments hash, as cards show it."""
    return h.removeprefix("sha256:")[:12]


def button_value(gate: Gate) -> str:
    """What Approve and Deny carry: ``<gate id>:<args hash>``, so a click decides only the
    arguments its card showed (the core refuses any other hash)."""
    return f"{gate.gate_id}:{gate.args_hash}"


def parse_button_value(value: str) -> tuple[str, str | None]:
    """``"<gate id>:<hash>"`` → ``(gate id, hash)``; a value without a hash → ``(value, None)``."""
    gate_id, sep, h = value.partition(":")
    return gate_id, (h if sep and h else None)


def closed_by_failure(gate: Gate) -> bool:
    """A gate the core closed because its run failed (not cancelled by anyone)."""
    return gate.status is GateStatus.CANCELLED and gate.closed_by_failure


def closed_line(gate: Gate) -> str:
    """``the run failed: <error>`` for a gate closed by its run's failure (escaped)."""
    return clip_escaped(gate.reason or "the run failed", REASON_MAX + 100)


# --------------------------------------------------------------------------- gate card
_HEADERS = {
    GateStatus.PENDING: "🔐 Approval needed",
    GateStatus.APPROVED: "✅ Approved",
    GateStatus.DENIED: "🚫 Denied",
    GateStatus.EXPIRED: "⌛ Expired",
    GateStatus.CANCELLED: "✖️ Cancelled",
}


def outcome_line(gate: Gate) -> str:
    """One mrkdwn line telling what happened to the gate."""
    s = gate.status
    if s is GateStatus.PENDING:
        return f"⏳ Waiting for a decision · expires {fmt_date(gate.deadline)}"
    if s is GateStatus.APPROVED:
        line = f"✅ *Approved* by {user(gate.decided_by)} at {fmt_date(gate.decided_at)}"
        if gate.reason:
            line += "\n*Reason:* " + clip_escaped(gate.reason, REASON_MAX + 100)
        return line
    if s is GateStatus.DENIED:
        line = (
            f"🚫 *Denied* by {user(gate.decided_by)} at {fmt_date(gate.decided_at)} — not executed"
        )
        if gate.reason:
            line += "\n*Reason:* " + clip_escaped(gate.reason, REASON_MAX + 100)
        return line
    if s is GateStatus.EXPIRED:
        return f"⌛ *Expired* — no decision within {fmt_duration(gate.timeout)}, not executed"
    if closed_by_failure(gate):
        return f"✖️ *Closed* — {closed_line(gate)}; not executed"
    by = f" by {user(gate.decided_by)}" if gate.decided_by else ""
    line = f"✖️ *Cancelled* — the run was cancelled{by} at {fmt_date(gate.decided_at)}; not executed"
    if gate.reason:
        line += "\n*Reason:* " + clip_escaped(gate.reason, REASON_MAX + 100)
    return line


def result_blocks(
    gate: Gate, result: ToolResult | None, limit: int = RESULT_LIMIT
) -> list[dict[str, Any]]:
    if gate.status is not GateStatus.APPROVED:
        return []
    if result is None:
        return [context("⚙️ Running…")]
    if result.skipped:
        return [section(f"⏹️ *Never ran* — {escape(clip(result.skipped, 500))}; not executed")]
    if result.running_at_cancel:
        return [section("⚙️ *Was running when the run was cancelled*; its outcome will appear here")]
    if result.in_doubt:
        after = " (after the run was cancelled)" if result.after_cancel else ""
        return [
            section(
                f"⚠️ *In doubt* — the worker stopped while this call was running{after}. It was "
                "not run again automatically; check whether it took effect."
            )
        ]
    if result.after_cancel:
        label = (
            "▶️ *Finished after the run was cancelled*"
            if result.ok
            else "⚠️ *The tool failed after the run was cancelled*"
        )
    else:
        label = "▶️ *Executed*" if result.ok else "⚠️ *The tool failed*"
    out = result.output or ""
    if not out.strip():
        return [section(label + " (no output)")]
    shown = split_escaped(out, limit, max_chunks=1)[0]
    blocks = [section(label + "\n" + code_block(shown))]
    if len(shown) < len(out):
        blocks.append(
            context(f"Output truncated: first {len(shown):,} of {len(out):,} characters.")
        )
    return blocks


def gate_card(gate: Gate, result: ToolResult | None = None, *, compact: bool = False) -> Card:
    """The approval card of a gate in its current state (buttons only while pending).

    ``compact`` shrinks every long part, for when Slack refused the full card.
    """
    arg_chunks, code_chunk = (1, 1500) if compact else (CARD_ARG_CHUNKS, CODE_CHUNK)
    text_limit = 300 if compact else DESCRIPTION_LIMIT
    pending = gate.status is GateStatus.PENDING
    tool = escape(gate.tool)
    head = "✖️ Closed" if closed_by_failure(gate) else _HEADERS[gate.status]
    header = clip(f"{head}: {gate.tool}", HEADER_LIMIT)
    fields = [
        mrkdwn(f"*Agent*\n{clip_escaped(gate.agent or 'agent', 200)}"),
        mrkdwn(f"*Requested by*\n{requesters(gate)}"),
        mrkdwn(f"*Tool*\n`{clip(tool, 200)}`"),
        mrkdwn(f"*Run*\n`{clip_escaped(gate.run_id, 100)}`"),
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": header, "emoji": True}},
        {"type": "section", "fields": fields},
    ]
    if gate.description:
        blocks.append(section(clip_escaped(gate.description, text_limit)))
    raw = pretty_args(gate.args) if gate.args else ""
    chunks = split_escaped(raw, code_chunk, max_chunks=arg_chunks) if raw else []
    shown = sum(len(c) for c in chunks)
    if not raw:
        blocks.append(section("*Arguments:* none"))
    for i, chunk in enumerate(chunks):
        blocks.append(section(("*Arguments*\n" if i == 0 else "") + code_block(chunk)))
    notes = [f"Arguments hash `{args_hash_short(gate)}`"]
    if gate.nested:
        notes.insert(0, f"🧩 Asked by a sub-agent: {escape(call_path(gate))}")
    if shown < len(raw):
        # The button (and so the advice) only while a decision can still be made.
        advice = " Use *View all arguments* before deciding." if pending else ""
        notes.insert(
            0,
            f"⚠️ *Arguments truncated*: showing the first {shown:,} of {len(raw):,} "
            f"characters.{advice}",
        )
    blocks.append(context(" · ".join(notes)))
    # More than one approver (bot/quorum_view.py): progress while pending, every approver after.
    from . import grant_view, quorum_view  # they build on this module's helpers

    line = quorum_view.outcome_line(gate) or outcome_line(gate) + quorum_view.after_line(gate)
    line = grant_view.outcome_line(gate) or line + grant_view.after_line(gate)
    blocks.append(section(line))
    from . import edit_view  # Edit & approve: what an edit changed, and the button

    blocks.extend(edit_view.changed_blocks(gate))
    blocks.extend(nudge_blocks(gate))
    blocks.extend(result_blocks(gate, result, limit=text_limit if compact else RESULT_LIMIT))
    if pending:
        buttons = [
            button("Approve", APPROVE_ACTION, button_value(gate), style="primary"),
            *grant_view.buttons(gate),  # Approve & allow (bot/grant_view.py)
            button("Deny", DENY_ACTION, button_value(gate), style="danger"),
            *edit_view.buttons(gate),
        ]
        if shown < len(raw):
            buttons.append(button("View all arguments", ARGS_ACTION, gate.gate_id))
        blocks.append(
            {"type": "actions", "block_id": clip(f"gate:{gate.gate_id}", 255), "elements": buttons}
        )
    verb = "Approval needed" if pending else head.split(" ", 1)[1]
    text = (
        f"{verb}: {clip(tool, 100)} (run {clip_escaped(gate.run_id, 100)}, "
        f"requested by {requesters(gate, limit=3)})"
    )
    return Card(text=text, blocks=blocks)


def nudge_blocks(gate: Gate) -> list[dict[str, Any]]:
    """The card's line about the gate's reminder and escalation, if it has any."""
    from .nudges import nudge_line  # it renders with this module's helpers

    line = nudge_line(gate)
    return [context(line)] if line else []


def call_path(gate: Gate) -> str:
    """``ops → billing → refund(order=7)``: the agents from the top run down to the call."""
    args = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in gate.args.items())
    return " → ".join([*gate.path, f"{gate.tool}({clip(args, 80)})"])


def args_modal(gate: Gate) -> dict[str, Any]:
    """A read-only modal with the complete arguments (as much as a modal can hold)."""
    raw = pretty_args(gate.args)
    chunks = split_escaped(raw, CODE_CHUNK, max_chunks=MODAL_ARG_CHUNKS)
    shown = sum(len(c) for c in chunks)
    blocks: list[dict[str, Any]] = [
        section(f"`{clip(escape(gate.tool), 200)}` · arguments hash `{args_hash_short(gate)}`")
    ]
    blocks.extend(section(code_block(c)) for c in chunks)
    if shown < len(raw):
        blocks.append(
            context(f"⚠️ Still truncated: the first {shown:,} of {len(raw):,} characters fit here.")
        )
    return {
        "type": "modal",
        "title": {"type": "plain_text", "text": "Tool call arguments"},
        "close": {"type": "plain_text", "text": "Close"},
        "blocks": blocks,
    }


def _reason_input() -> dict[str, Any]:
    """The deny forms' optional reason (Slack adds "(optional)" to the label itself)."""
    return {
        "type": "input",
        "block_id": REASON_BLOCK,
        "optional": True,
        "label": {"type": "plain_text", "text": "Reason"},
        "element": {
            "type": "plain_text_input",
            "action_id": REASON_ACTION,
            "multiline": True,
            "max_length": REASON_MAX,
        },
    }


def deny_modal(gate: Gate, private_metadata: str) -> dict[str, Any]:
    """The modal asking for an optional reason before denying."""
    return {
        "type": "modal",
        "callback_id": DENY_CALLBACK,
        "private_metadata": private_metadata,
        "title": {"type": "plain_text", "text": "Deny tool call"},
        "submit": {"type": "plain_text", "text": "Deny"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            section(
                f"Deny `{clip(escape(gate.tool), 200)}` for run `{clip_escaped(gate.run_id, 100)}`? "
                "The agent is told who declined it and why, and not to retry."
            ),
            _reason_input(),
        ],
    }


# --------------------------------------------------------------------------- several gates
# A turn that opens two or more gates gets one more message in the thread: "Approve all N" /
# "Deny all". Its buttons carry ``<run id>:<turn>:<digest>``; the digest covers every gate
# of the turn and its arguments hash, so a forged or stale value decides nothing.
_VERBS = {
    GateStatus.APPROVED: "approved",
    GateStatus.DENIED: "denied",
    GateStatus.EXPIRED: "expired",
    GateStatus.CANCELLED: "cancelled",
}
_ALL_EMOJI = {
    GateStatus.APPROVED: "✅",
    GateStatus.DENIED: "🚫",
    GateStatus.EXPIRED: "⌛",
    GateStatus.CANCELLED: "✖️",
}


def turn_digest(gates: list[Gate]) -> str:
    """What the turn's buttons vouch for: its gates and their arguments (16 hex digits)."""
    raw = "|".join(f"{g.gate_id}:{g.args_hash}" for g in sorted(gates, key=lambda g: g.gate_id))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def turn_value(gates: list[Gate]) -> str:
    """What "Approve all" and "Deny all" carry: ``<run id>:<turn>:<digest>``."""
    g = gates[0]
    return f"{g.run_id}:{g.turn}:{turn_digest(gates)}"


def parse_turn_value(value: str) -> tuple[str, int, str] | None:
    """``"<run id>:<turn>:<digest>"`` → ``(run id, turn, digest)``; None if malformed."""
    parts = value.split(":")
    if len(parts) != 3 or not parts[1].isdigit() or len(parts[1]) > 6:
        return None
    return parts[0], int(parts[1]), parts[2]


def call_summary(gate: Gate, limit: int) -> str:
    """``tool(name="value", …)``: a call and its arguments in mrkdwn (escaped), within
    ``limit`` characters, a cut marked "…"; in a code span unless a backtick would end it."""
    args = ", ".join(
        f"{k}={json.dumps(v, ensure_ascii=False, default=str)}" for k, v in gate.args.items()
    )
    raw = f"{gate.tool}({args})"
    if "`" in raw:
        return clip_escaped(raw, limit)
    return f"`{clip_escaped(raw, max(limit - 2, 1))}`"


def confirm_list(header: str, gates: list[Gate], limit: int = CONFIRM_TEXT_LIMIT) -> str:
    """``header`` and a line per call with its arguments, within ``limit`` characters (a
    confirm dialog's text): as many calls as fit at :data:`MIN_CALL_WIDTH` characters or
    more, each cut as little as the room allows, then "…and N more"."""
    n = len(gates)
    for shown in range(n, 0, -1):
        more = "" if shown == n else f"\n…and {n - shown} more: see their cards."
        room = limit - len(header) - len(more) - 3 * shown  # "\n• " per line
        full = [len(call_summary(g, limit)) for g in gates[:shown]]
        width = _fair_width(full, room)
        if width >= MIN_CALL_WIDTH or shown == 1:
            lines = "".join(f"\n• {call_summary(g, max(width, 1))}" for g in gates[:shown])
            return clip(header + lines + more, limit)
    return clip(header, limit)


def _fair_width(lengths: list[int], room: int) -> int:
    """The largest cap ``c`` with ``sum(min(x, c) for x in lengths) <= room``."""
    lo, hi = 0, max(lengths, default=0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(x, mid) for x in lengths) <= room:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _names(gates: list[Gate], limit: int = 10) -> str:
    shown = ", ".join(f"`{clip(escape(g.tool), 60)}`" for g in gates[:limit])
    return shown + (f" and {len(gates) - limit} more" if len(gates) > limit else "")


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def _outcome_group(g: Gate) -> tuple[GateStatus, str | None, bool]:
    by = g.decided_by if g.status in (GateStatus.APPROVED, GateStatus.DENIED) else None
    if g.status is GateStatus.APPROVED and g.approvals:  # more than one approver: all of them
        by = " ".join(a.by for a in g.approvals)
    return g.status, by, closed_by_failure(g)


def _users(by: str | None) -> str:
    """``<@A>``, or ``<@A> and <@B>`` for the space-separated approvers of a quorum."""
    names = [user(u) for u in (by or "").split()] or [user(by)]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _group_phrase(key: tuple[GateStatus, str | None, bool], n: int, already: bool) -> str:
    status, by, failed = key
    if failed:
        return f"{n} closed: the run failed"
    if status is GateStatus.CANCELLED:
        return f"{n} cancelled with the run"
    if status is GateStatus.EXPIRED:
        return f"{n} had already expired" if already else f"{n} expired"
    was = (_plural(n, "was", "were") + " already ") if already else ""
    return f"{n} {was}{_VERBS[status]} by {_users(by)}"


def turn_summary(gates: list[Gate]) -> str:
    """What became of a turn's gates, once none is pending: "✅ All 3 approved by @x", or
    "☑️ 2 approved by @x; 1 was already denied by @y" (the latest decision first)."""
    groups: dict[tuple[GateStatus, str | None, bool], list[Gate]] = {}
    for g in gates:
        groups.setdefault(_outcome_group(g), []).append(g)
    keys = list(groups)
    by_person = [k for k in keys if k[0] in (GateStatus.APPROVED, GateStatus.DENIED)]
    lead = max(by_person or keys, key=lambda k: max(g.decided_at or 0 for g in groups[k]))
    lead_gates = groups[lead]
    reasons = {g.reason for g in lead_gates}
    why = ""
    if lead[1] and len(reasons) == 1 and (reason := reasons.pop()):
        why = "\n*Reason:* " + clip_escaped(reason, REASON_MAX + 100)
    if len(keys) == 1:
        status, _, failed = lead
        what = _group_phrase(lead, len(gates), False).split(" ", 1)[1]
        emoji = "✖️" if failed else _ALL_EMOJI.get(status, "☑️")
        return f"{emoji} All {len(gates)} {what}{why}"
    start = min(g.decided_at or 0 for g in lead_gates)
    parts = [_group_phrase(lead, len(lead_gates), False)]
    for k in keys:
        if k != lead:
            done = max(g.decided_at or 0 for g in groups[k])
            parts.append(_group_phrase(k, len(groups[k]), done <= start))
    return "☑️ " + "; ".join(parts) + why


def turn_card(gates: list[Gate]) -> Card:
    """The "Approve all N" / "Deny all" message of a turn's gates (in call order): buttons
    while any is pending, then what became of them."""
    total = len(gates)
    rid = clip_escaped(gates[0].run_id, 100)
    pending = [g for g in gates if g.status is GateStatus.PENDING]
    if not pending:
        summary = turn_summary(gates)
        blocks = [section(summary), context(f"Run `{rid}` · each card shows its call's outcome")]
        return Card(text=clip(summary.split("\n", 1)[0], 300), blocks=blocks)
    n = len(pending)
    head = f"🔐 *{total} approval requests* in this turn:"
    for g in gates[:TURN_LIST_LIMIT]:
        done = "" if g.status is GateStatus.PENDING else f" — {_was_decided(g)}"
        head += f"\n• {call_summary(g, TURN_LINE_LIMIT)}{done}"
    if total > TURN_LIST_LIMIT:
        head += f"\n…and {total - TURN_LIST_LIMIT} more: see their cards."
    if n < total:
        head += f"\n{n} still {_plural(n, 'waits', 'wait')} for a decision."
    head += "\nDecide each on its card, or all of them at once."
    every = "all" if n == total else "the remaining"
    header = f"This approves {every} {n} tool {_plural(n, 'call', 'calls')} of run `{rid}`:"
    approve = button(
        f"Approve all {n}" if n == total else f"Approve remaining {n}",
        TURN_APPROVE_ACTION,
        turn_value(gates),
        style="primary",
    )
    approve["confirm"] = {
        "title": {
            "type": "plain_text",
            "text": clip(f"Approve {n} tool {_plural(n, 'call', 'calls')}?", 100),
        },
        "text": {"type": "mrkdwn", "text": confirm_list(header, pending)},
        "confirm": {"type": "plain_text", "text": clip(f"Approve {n}", 30)},
        "deny": {"type": "plain_text", "text": "Cancel"},
        "style": "primary",
    }
    deny = button(
        "Deny all" if n == total else f"Deny remaining {n}",
        TURN_DENY_ACTION,
        turn_value(gates),
        style="danger",
    )
    block_id = clip(f"turn:{gates[0].run_id}:{gates[0].turn}", 255)
    blocks = [
        section(head),
        {"type": "actions", "block_id": block_id, "elements": [approve, deny]},
    ]
    return Card(
        text=f"{total} approval requests in this turn: approve or deny them all", blocks=blocks
    )


def deny_all_modal(pending: list[Gate], private_metadata: str) -> dict[str, Any]:
    """The modal asking for one optional reason before denying every pending gate of a turn."""
    n = len(pending)
    return {
        "type": "modal",
        "callback_id": TURN_DENY_CALLBACK,
        "private_metadata": private_metadata,
        "title": {"type": "plain_text", "text": "Deny tool calls"},
        "submit": {"type": "plain_text", "text": "Deny all"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "blocks": [
            section(
                f"Deny the {n} pending {_plural(n, 'call', 'calls')} of run "
                f"`{clip_escaped(pending[0].run_id, 100)}`: {_names(pending, 20)}? The agent is "
                "told who declined them and why, and not to retry. The reason goes to each."
            ),
            _reason_input(),
        ],
    }


def _was_decided(g: Gate) -> str:
    """A gate decided before a click, in a few words: "denied by @y", "expired"."""
    if closed_by_failure(g):
        return "closed: the run failed"
    if g.status is GateStatus.CANCELLED:
        return "cancelled with the run"
    if g.status is GateStatus.EXPIRED:
        return "expired"
    return f"{_VERBS[g.status]} by {user(g.decided_by)}"


def decided_many_message(
    approve: bool, mine: list[Gate], late: list[Gate], others: list[Gate]
) -> str:
    """What the clicker of "Approve all" / "Deny all" is told: the gates their click decided
    (``mine``), those that had expired by then (``late``) and those decided before it
    (``others``)."""
    verb = "approved" if approve else "denied"
    n = len(mine)
    if mine:
        text = f"{'✅' if approve else '🚫'} You {verb} {n} {_plural(n, 'call', 'calls')}: {_names(mine, 20)}."
    else:
        text = f"Nothing was {verb} by your click."
    if late:
        text += f"\nExpired before your click, not executed: {_names(late, 20)}."
    if others:
        items = ", ".join(f"`{clip(escape(g.tool), 60)}` ({_was_decided(g)})" for g in others[:20])
        if len(others) > 20:
            items += f" and {len(others) - 20} more"
        left = _plural(len(others), "left as it was", "left as they were")
        text += f"\nAlready decided before your click, {left}: {items}."
    return text


# --------------------------------------------------------------------------- block helpers
def mrkdwn(text: str) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": text}


def section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": mrkdwn(clip(text, SECTION_LIMIT))}


def context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [mrkdwn(clip(text, SECTION_LIMIT))]}


def button(label: str, action_id: str, value: str, style: str | None = None) -> dict[str, Any]:
    b: dict[str, Any] = {
        "type": "button",
        "text": {"type": "plain_text", "text": clip(label, BUTTON_TEXT_LIMIT), "emoji": True},
        "action_id": action_id,
        "value": value[:2000],
    }
    if style:
        b["style"] = style
    return b
