"""A run's answer in its thread: at most a few messages, headed by what became of its calls.

An answer that fits in :data:`MAX_ANSWER_MESSAGES` messages is posted as messages (numbered
when there are several). A longer one is not spread over dozens of messages (Slack posts
about one a second per channel, and a 1 MB answer once took 287): the thread gets one message
with its start, and the whole answer as a file (``files.uploadV2``).

The heading tells the outcome: "✅ *Answer*" only when every call the model asked for in this
leg of the run, its sub-agents' included, ran as asked; otherwise it says how many were
denied, expired, cancelled, failed or are in doubt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_core.models import Gate, GateStatus

from .cards import closed_by_failure, escape
from .ports import GatewayLike
from .store import Store

MESSAGE_LIMIT = 3500
MAX_ANSWER_MESSAGES = 3
PREVIEW_LIMIT = 1200  # characters of a long answer shown in the thread, above its file
OK_HEADING = "✅ *Answer*"
MAX_DEPTH = 5  # sub-agents below a run (agent_core.children.DEFAULT_MAX_DEPTH)


@dataclass(frozen=True)
class Attachment:
    """A file to share in the thread."""

    filename: str
    title: str
    content: str


@dataclass(frozen=True)
class AnswerPost:
    """What the thread gets for an answer: messages, then perhaps a file."""

    texts: list[str]
    file: Attachment | None = None


@dataclass
class Outcomes:
    """What became of the gated calls of one leg of a run (its sub-agents' included), beyond
    "approved and ran"."""

    denied: int = 0
    expired: int = 0
    cancelled: int = 0
    failed: int = 0
    in_doubt: int = 0

    def add(self, gate: Gate, result: Any) -> None:
        """Count ``gate``; ``result``: the stored :class:`bot.cards.ToolResult` of an approved
        call, if any."""
        s = gate.status
        if s is GateStatus.DENIED:
            self.denied += 1
        elif s is GateStatus.EXPIRED:
            self.expired += 1
        elif s is GateStatus.CANCELLED or closed_by_failure(gate):
            self.cancelled += 1
        elif s is GateStatus.APPROVED and result is not None:
            if result.in_doubt or result.running_at_cancel:
                self.in_doubt += 1
            elif result.skipped:
                self.cancelled += 1
            elif not result.ok:
                self.failed += 1


_KINDS = (
    ("denied", "🚫", "denied, not run"),
    ("expired", "⌛", "expired, not run"),
    ("cancelled", "✖️", "cancelled, not run"),
    ("failed", "⚠️", "failed"),
    ("in_doubt", "⚠️", "in doubt"),
)


def heading(outcomes: Outcomes | None = None) -> str:
    """ "✅ *Answer*" when every call ran as asked; else, e.g., "🚫 *Answer* — 1 call
    denied, not run"."""
    if outcomes is None:
        return OK_HEADING
    found = [(emoji, n, what) for name, emoji, what in _KINDS if (n := getattr(outcomes, name))]
    if not found:
        return OK_HEADING
    emojis = {emoji for emoji, _, _ in found}
    emoji = emojis.pop() if len(emojis) == 1 else "⚠️"
    parts = [f"{n} {'call' if n == 1 else 'calls'} {what}" for _, n, what in found]
    return f"{emoji} *Answer* — " + "; ".join(parts)


def answer_post(final: str, run_id: str, head: str = OK_HEADING) -> AnswerPost:
    """The messages (and file) that show ``final`` in the thread, headed by ``head``."""
    parts = split_message(final, max_parts=MAX_ANSWER_MESSAGES + 1)
    if len(parts) == 1:
        return AnswerPost([f"{head}\n{parts[0]}"])
    n = len(parts)
    if n <= MAX_ANSWER_MESSAGES:
        return AnswerPost(
            [
                (f"{head}\n" if i == 0 else "") + p + f"\n_({i + 1}/{n})_"
                for i, p in enumerate(parts)
            ]
        )
    preview = split_message(final, PREVIEW_LIMIT, max_parts=1)[0]
    name = f"answer-{_safe(run_id)}.md"
    note = (
        f"_The answer is {len(final):,} characters long, too long for the thread: above is its "
        f"start; the whole answer is in the file `{escape(name)}` below._"
    )
    title = f"Answer of run {run_id}"
    return AnswerPost([f"{head}\n{preview}\n{note}"], Attachment(name, title, final))


def no_file_message(final: str, error: str) -> str:
    """Said in the thread when Slack refused the answer's file for good."""
    return (
        f"⚠️ The rest of the answer ({len(final):,} characters in all) could not be attached: "
        f"Slack refused the file (`{escape(error)}`). The app needs the `files:write` scope."
    )


def split_message(text: str, limit: int = MESSAGE_LIMIT, max_parts: int | None = None) -> list[str]:
    """Split escaped text into messages of at most ``limit`` characters, never dropping any
    (up to ``max_parts``, when given: the rest is not split).

    Cuts prefer paragraph breaks, then line breaks, then spaces; a code fence open at a cut
    is closed and reopened in the next part.
    """
    raw = text.strip()
    if max_parts is not None:
        raw = raw[: max_parts * limit + 1]  # enough for max_parts parts (escaping only grows)
    body = escape(raw) or "(empty)"
    budget = limit - 8  # room to close and reopen a fence
    parts: list[str] = []
    reopen = False
    start = 0
    while start < len(body) and (max_parts is None or len(parts) < max_parts):
        prefix = "```\n" if reopen else ""
        room = budget - len(prefix)
        if len(body) - start <= room:
            piece, start = body[start:], len(body)
        else:
            cut = _cut_point(body[start : start + room], room)
            piece, start = body[start : start + cut], start + cut
            while start < len(body) and body[start] == "\n":
                start += 1
        piece = prefix + piece
        reopen = piece.count("```") % 2 == 1
        parts.append(piece + ("\n```" if reopen else ""))
    return parts


def _cut_point(window: str, room: int) -> int:
    for sep in ("\n\n", "\n", " "):
        i = window.rfind(sep)
        if i > room // 2:
            return i + len(sep)
    cut = room
    amp = window.rfind("&", max(0, room - 5))
    if amp != -1 and ";" not in window[amp:]:
        cut = amp  # never split an &amp; entity
    return max(cut, 1)


def _safe(run_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in run_id)[:100] or "run"


async def leg_outcomes(
    gateway: GatewayLike, store: Store, run_id: str, turns_from: int = 0
) -> Outcomes:
    """What became of the calls gated since the run's latest continuation (``turns_from``):
    its own gates of later turns, and those of the sub-agents those turns started."""
    out = Outcomes()
    runs = [(run_id, turns_from)]
    for _ in range(MAX_DEPTH + 1):
        children: list[tuple[str, int]] = []
        for rid, since in runs:
            later = [g for g in await gateway.gates(rid) if g.turn > since]
            approved = [g.gate_id for g in later if g.status is GateStatus.APPROVED]
            recs, kids = await store.cards_and_children(approved, rid)
            results = {g: rec.result for g, rec in zip(approved, recs, strict=True)}
            for gate in later:
                out.add(gate, results.get(gate.gate_id))
            children += [(c, 0) for c in await store.children_since(rid, since, kids)]
        if not children:
            break
        runs = children
    return out
