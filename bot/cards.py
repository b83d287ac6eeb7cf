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

from agent_core.models import Gate, GateStatus, Run, RunStatus

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
MESSAGE_LIMIT = 3500

APPROVE_ACTION = "gate_approve"
DENY_ACTION = "gate_deny"
ARGS_ACTION = "gate_args"
DENY_CALLBACK = "gate_deny_reason"
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
    return "".join(_ESCAPES.get(c, c) for c in text)


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
    return f"<@{escape(user_id)}>"


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
        return f"✅ *Approved* by {user(gate.decided_by)} at {fmt_date(gate.decided_at)}"
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
        return [_context("⚙️ Running…")]
    if result.skipped:
        return [_section(f"⏹️ *Never ran* — {escape(clip(result.skipped, 500))}; not executed")]
    if result.running_at_cancel:
        return [
            _section("⚙️ *Was running when the run was cancelled*; its outcome will appear here")
        ]
    if result.in_doubt:
        after = " (after the run was cancelled)" if result.after_cancel else ""
        return [
            _section(
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
        return [_section(label + " (no output)")]
    shown = split_escaped(out, limit, max_chunks=1)[0]
    blocks = [_section(label + "\n" + code_block(shown))]
    if len(shown) < len(out):
        blocks.append(
            _context(f"Output truncated: first {len(shown):,} of {len(out):,} characters.")
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
        _mrkdwn(f"*Agent*\n{clip_escaped(gate.agent or 'agent', 200)}"),
        _mrkdwn(f"*Requested by*\n{user(gate.requested_by)}"),
        _mrkdwn(f"*Tool*\n`{clip(tool, 200)}`"),
        _mrkdwn(f"*Run*\n`{clip_escaped(gate.run_id, 100)}`"),
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": header, "emoji": True}},
        {"type": "section", "fields": fields},
    ]
    if gate.description:
        blocks.append(_section(clip_escaped(gate.description, text_limit)))
    raw = pretty_args(gate.args) if gate.args else ""
    chunks = split_escaped(raw, code_chunk, max_chunks=arg_chunks) if raw else []
    shown = sum(len(c) for c in chunks)
    if not raw:
        blocks.append(_section("*Arguments:* none"))
    for i, chunk in enumerate(chunks):
        blocks.append(_section(("*Arguments*\n" if i == 0 else "") + code_block(chunk)))
    notes = [f"Arguments hash `{args_hash_short(gate)}`"]
    if gate.nested:
        notes.append("nested call")
    if shown < len(raw):
        notes.insert(
            0,
            f"⚠️ *Arguments truncated*: showing the first {shown:,} of {len(raw):,} characters. "
            "Use *View all arguments* before deciding.",
        )
    blocks.append(_context(" · ".join(notes)))
    blocks.append(_section(outcome_line(gate)))
    blocks.extend(result_blocks(gate, result, limit=text_limit if compact else RESULT_LIMIT))
    if pending:
        buttons = [
            _button("Approve", APPROVE_ACTION, button_value(gate), style="primary"),
            _button("Deny", DENY_ACTION, button_value(gate), style="danger"),
        ]
        if shown < len(raw):
            buttons.append(_button("View all arguments", ARGS_ACTION, gate.gate_id))
        blocks.append(
            {"type": "actions", "block_id": clip(f"gate:{gate.gate_id}", 255), "elements": buttons}
        )
    verb = "Approval needed" if pending else head.split(" ", 1)[1]
    text = (
        f"{verb}: {clip(tool, 100)} (run {clip_escaped(gate.run_id, 100)}, "
        f"requested by {user(gate.requested_by)})"
    )
    return Card(text=text, blocks=blocks)


def args_modal(gate: Gate) -> dict[str, Any]:
    """A read-only modal with the complete arguments (as much as a modal can hold)."""
    raw = pretty_args(gate.args)
    chunks = split_escaped(raw, CODE_CHUNK, max_chunks=MODAL_ARG_CHUNKS)
    shown = sum(len(c) for c in chunks)
    blocks: list[dict[str, Any]] = [
        _section(f"`{clip(escape(gate.tool), 200)}` · arguments hash `{args_hash_short(gate)}`")
    ]
    blocks.extend(_section(code_block(c)) for c in chunks)
    if shown < len(raw):
        blocks.append(
            _context(f"⚠️ Still truncated: the first {shown:,} of {len(raw):,} characters fit here.")
        )
    return {
        "type": "modal",
        "title": {"type": "plain_text", "text": "Tool call arguments"},
        "close": {"type": "plain_text", "text": "Close"},
        "blocks": blocks,
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
            _section(
                f"Deny `{clip(escape(gate.tool), 200)}` for run `{clip_escaped(gate.run_id, 100)}`? "
                "The agent is told who declined it and why, and not to retry."
            ),
            {
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
            },
        ],
    }


# --------------------------------------------------------------------------- run messages
_RUN_STATUS = {
    RunStatus.QUEUED: "⏳ queued",
    RunStatus.RUNNING: "⚙️ running",
    RunStatus.AWAITING_APPROVAL: "🔐 awaiting approval",
    RunStatus.COMPLETED: "✅ completed",
    RunStatus.FAILED: "❌ failed",
    RunStatus.CANCELLED: "✖️ cancelled",
}


def status_label(status: RunStatus) -> str:
    return _RUN_STATUS.get(status, status.value)


def root_message(task: str, user_id: str, run: Run | None, command: str = "/agent") -> Card:
    """The channel message a run's thread hangs from."""
    intro = f"🤖 Task started by {user(user_id)}: {clip_escaped(task, TASK_LIMIT)}"
    blocks: list[dict[str, Any]] = [_section(intro)]
    if run is None:
        blocks.append(_context("⏳ starting…"))
    else:
        rid = clip_escaped(run.run_id, 100)
        line = f"Run `{rid}` · {status_label(run.status)}"
        if not run.status.finished:
            line += f" · cancel with `{command} cancel {rid}`"
        elif run.retryable:
            line += f" · retry with `{command} retry {rid}`"
        blocks.append(_context(line))
    return Card(text=f"Task started by {user(user_id)}: {clip_escaped(task, 300)}", blocks=blocks)


def root_not_started(task: str, user_id: str) -> Card:
    card = root_message(task, user_id, None)
    blocks = [*card.blocks[:1], _context("❌ not started: the agent backend is unavailable")]
    return Card(text="The task could not be started.", blocks=blocks)


def split_message(text: str, limit: int = MESSAGE_LIMIT) -> list[str]:
    """Split escaped text into messages of at most ``limit`` characters, never dropping any.

    Cuts prefer paragraph breaks, then line breaks, then spaces; a code fence open at a cut
    is closed and reopened in the next part.
    """
    body = escape(text.strip()) or "(empty)"
    budget = limit - 8  # room to close and reopen a fence
    parts: list[str] = []
    reopen = False
    while body:
        prefix = "```\n" if reopen else ""
        room = budget - len(prefix)
        if len(body) <= room:
            piece, body = body, ""
        else:
            cut = _cut_point(body, room)
            piece, body = body[:cut], body[cut:].lstrip("\n")
        piece = prefix + piece
        reopen = piece.count("```") % 2 == 1
        parts.append(piece + ("\n```" if reopen else ""))
    return parts


def _cut_point(text: str, room: int) -> int:
    window = text[:room]
    for sep in ("\n\n", "\n", " "):
        i = window.rfind(sep)
        if i > room // 2:
            return i + len(sep)
    cut = room
    amp = window.rfind("&", max(0, room - 5))
    if amp != -1 and ";" not in window[amp:]:
        cut = amp  # never split an &amp; entity
    return max(cut, 1)


def answer_messages(final: str) -> list[str]:
    parts = split_message(final)
    if len(parts) == 1:
        return ["✅ *Answer*\n" + parts[0]]
    n = len(parts)
    return [
        ("✅ *Answer*\n" if i == 0 else "") + p + f"\n_({i + 1}/{n})_" for i, p in enumerate(parts)
    ]


def run_failed_message(error: str, retry: str | None = None) -> str:
    """The thread's failure message; ``retry``: the command that continues the run, when a
    retry can fix its failure."""
    text = "❌ *The run failed:* " + clip_escaped(error or "unknown error", SECTION_LIMIT)
    if retry:
        text += (
            f"\nIt can be continued from where it stopped with `{retry}` "
            "(its requester or an approver); nothing that already ran runs again."
        )
    return text


def run_retried_message(by: str | None) -> str:
    return f"🔁 *Retried* by {user(by)}: continuing from the last completed step."


def run_cancelled_message(by: str | None, reason: str | None) -> str:
    line = f"✖️ *Run cancelled* by {user(by)}."
    if reason:
        line += " Reason: " + clip_escaped(reason, REASON_MAX + 100)
    return line


def tool_message(tool: str, ok: bool, in_doubt: bool) -> str:
    """A progress line for a tool call that needed no approval."""
    name = f"`{clip(escape(tool), 200)}`"
    if in_doubt:
        return f"⚠️ {name} is *in doubt*: the worker stopped while it ran; it was not retried."
    return f"▶️ Ran {name}" if ok else f"⚠️ {name} failed"


def status_message(
    runs: list[Run], pending: dict[str, list[Gate]], command: str = "/agent"
) -> Card:
    """``/agent status``: the user's recent runs and their pending approvals."""
    if not runs:
        return Card(text=f"You have no runs yet. Start one with `{command} <task>`.")
    blocks: list[dict[str, Any]] = [_section("*Your recent runs*")]
    for run in runs[:15]:
        line = (
            f"`{clip_escaped(run.run_id, 100)}` · {status_label(run.status)} · "
            f"{fmt_date(run.created_at)}\n{clip_escaped(run.task, 200)}"
        )
        if run.retryable:
            line += f"\n  🔁 can be retried: `{command} retry {clip_escaped(run.run_id, 100)}`"
        gates = pending.get(run.run_id, [])
        for g in gates[:5]:
            line += (
                f"\n  🔐 waiting: `{clip(escape(g.tool), 100)}` · expires {fmt_date(g.deadline)}"
            )
        if len(gates) > 5:
            line += f"\n  …and {len(gates) - 5} more pending approvals"
        blocks.append(_section(line))
    waiting = sum(len(v) for v in pending.values())
    blocks.append(_context(f"{len(runs)} runs shown · {waiting} pending approvals"))
    return Card(text=f"Your recent runs: {len(runs)}, pending approvals: {waiting}", blocks=blocks)


def usage(command: str = "/agent") -> str:
    return (
        f"*Usage*\n"
        f"• `{command} <task>` — start the agent on a task; it works in a thread and asks "
        "for approval before sensitive tool calls\n"
        f"• `{command} status` — your recent runs and their pending approvals\n"
        f"• `{command} cancel <run id>` — cancel a run (its requester or an approver)\n"
        f"• `{command} retry <run id>` — continue a failed run from its last completed step; "
        "calls that already ran are not run again (its requester or an approver)\n"
        f"• `{command} help` — this message"
    )


# --------------------------------------------------------------------------- block helpers
def _mrkdwn(text: str) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": text}


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": _mrkdwn(clip(text, SECTION_LIMIT))}


def _context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [_mrkdwn(clip(text, SECTION_LIMIT))]}


def _button(label: str, action_id: str, value: str, style: str | None = None) -> dict[str, Any]:
    b: dict[str, Any] = {
        "type": "button",
        "text": {"type": "plain_text", "text": clip(label, BUTTON_TEXT_LIMIT), "emoji": True},
        "action_id": action_id,
        "value": value[:2000],
    }
    if style:
        b["style"] = style
    return b
