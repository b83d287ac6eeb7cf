"""What a run's thread and its commands show: the root message a run's thread hangs from
(its status, and for a finished run the gated calls that never ran), the thread's progress
and failure lines, ``/agent status`` and ``/agent help``.

Nothing here talks to Slack or Redis; the gate cards themselves are :mod:`bot.cards`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent_core.models import Gate, GateStatus, Run, RunStatus

from .cards import (
    REASON_MAX,
    SECTION_LIMIT,
    TASK_LIMIT,
    Card,
    clip,
    clip_escaped,
    context,
    escape,
    fmt_date,
    section,
    user,
)

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


def run_status(run: Run) -> str:
    """A run's status as shown: a run paused only on its sub-agents says so (they may be
    working or asking for approval themselves: their cards tell which); one whose gates are
    all decided is running again (its resume job is on its way to a worker)."""
    if run.status is RunStatus.AWAITING_APPROVAL and not run.pending:
        n = run.children_pending
        if not n:
            return status_label(RunStatus.RUNNING)
        return "🧩 waiting for " + ("its sub-agent" if n == 1 else f"{n} sub-agents")
    return status_label(run.status)


# How a finished run's calls that did not run are counted on its root message.
_NOT_RUN = (
    (GateStatus.DENIED, "denied"),
    (GateStatus.EXPIRED, "expired"),
    (GateStatus.CANCELLED, "closed unanswered"),
)


def calls_not_run(gates: Sequence[Gate]) -> str:
    """``"1 call denied"``, ``"3 calls not run: 1 denied, 2 expired"``: a finished run's gated
    calls that never ran (empty when none): "completed" alone reads as if they all ran."""
    counts = [(sum(1 for g in gates if g.status is st), label) for st, label in _NOT_RUN]
    counts = [(n, label) for n, label in counts if n]
    total = sum(n for n, _ in counts)
    calls = "call" if total == 1 else "calls"
    if not counts:
        return ""
    if len(counts) == 1:
        return f"{total} {calls} {counts[0][1]}"
    return f"{total} {calls} not run: " + ", ".join(f"{n} {label}" for n, label in counts)


def root_message(
    task: str,
    user_id: str,
    run: Run | None,
    command: str = "/agent",
    gates: Sequence[Gate] = (),
) -> Card:
    """The channel message a run's thread hangs from; ``gates``: the run's own gates, whose
    calls that never ran a finished run names."""
    intro = f"🤖 Task started by {user(user_id)}: {clip_escaped(task, TASK_LIMIT)}"
    blocks: list[dict[str, Any]] = [section(intro)]
    if run is None:
        blocks.append(context("⏳ starting…"))
    else:
        rid = clip_escaped(run.run_id, 100)
        line = f"Run `{rid}` · {run_status(run)}"
        not_run = calls_not_run(gates) if run.status.finished else ""
        if not_run:
            line += f" · {not_run}"
        if not run.status.finished:
            line += f" · cancel with `{command} cancel {rid}`"
        elif run.retryable:
            line += f" · retry with `{command} retry {rid}`"
        blocks.append(context(line))
    return Card(text=f"Task started by {user(user_id)}: {clip_escaped(task, 300)}", blocks=blocks)


def root_not_started(task: str, user_id: str) -> Card:
    card = root_message(task, user_id, None)
    blocks = [*card.blocks[:1], context("❌ not started: the agent backend is unavailable")]
    return Card(text="The task could not be started.", blocks=blocks)


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
        return Card(text=f"You have no runs yet. Start one with `{command} &lt;task&gt;`.")
    blocks: list[dict[str, Any]] = [section("*Your recent runs*")]
    for run in runs[:15]:
        line = (
            f"`{clip_escaped(run.run_id, 100)}` · {run_status(run)} · "
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
            line += f"\n  …and {_count(len(gates) - 5, 'more pending approval')}"
        blocks.append(section(line))
    waiting = sum(len(v) for v in pending.values())
    shown = _count(min(len(runs), 15), "run")
    blocks.append(context(f"{shown} shown · {_count(waiting, 'pending approval')}"))
    return Card(text=f"Your recent runs: {len(runs)}, pending approvals: {waiting}", blocks=blocks)


def _count(n: int, noun: str) -> str:
    """``1 pending approval``, ``2 pending approvals``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def usage(command: str = "/agent") -> str:
    """``/agent help``, in mrkdwn: a placeholder is written ``&lt;run id&gt;``, since Slack
    takes ``<run id>`` for a link or a mention and shows ``run id``."""
    return (
        f"*Usage*\n"
        f"• `{command} &lt;task&gt;` — start the agent on a task; it works in a thread and asks "
        "for approval before sensitive tool calls\n"
        f"• `{command} status` — your recent runs and their pending approvals\n"
        f"• `{command} cancel &lt;run id&gt;` — cancel a run (its requester or an approver)\n"
        f"• `{command} retry &lt;run id&gt;` — continue a failed run from its last completed step; "
        "calls that already ran are not run again (its requester or an approver)\n"
        f"• `{command} audit [tool|@user]` — the last entries of the audit trail (approvers "
        "only, shown to you alone)\n"
        f"• `{command} grants` — the live grants you may revoke (approvers)\n"
        f"• `{command} help` — this message"
    )
