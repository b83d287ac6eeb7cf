"""What the model is told about each outcome. Expiry and refusal never read alike."""

from __future__ import annotations


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s % 60 == 0 and s >= 60:
        m = s // 60
        return f"{m} minute{'s' if m != 1 else ''} ({s} s)"
    return f"{s} s"


def _who(by: str) -> str:
    """``the user U123``, or ``the approval rule x`` for a decision by ``rule:x``."""
    if by.startswith("rule:"):
        return f"the approval rule {by[5:]}"
    return f"the user {by}"


def denied(tool: str, by: str, reason: str | None) -> str:
    rule = by.startswith("rule:")
    why = (
        f" {'Its' if rule else 'Their'} reason: {reason.strip()}"
        if reason and reason.strip()
        else f" {'It' if rule else 'They'} gave no reason."
    )
    return (
        f"Not executed: {_who(by)} declined this call to {tool}.{why} "
        "Do not retry this call (or an equivalent one) unless the user asks you to."
    )


def with_approval(output: str, approvals: list[tuple[str, str | None]]) -> str:
    """An approved call's output, followed by who approved it: the approver's reason when
    one approver gave one; every approver (with their reasons) when it took several."""
    if len(approvals) > 1:
        named = [
            _approver(by) + (f" (reason: {r.strip()})" if r and r.strip() else "")
            for by, r in approvals
        ]
        both = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
        return f"{output}\n\nApproved by {both}."
    by, reason = approvals[0] if approvals else ("", None)
    if by.startswith("grant:") and reason:  # reason: agent_core.grants.grant_note
        return f"{output}\n\nApproved by {reason.strip()}."
    if not reason or not reason.strip():
        return output
    return f"{output}\n\nApproved by {_approver(by)}: {reason.strip()}"


def edited(by: str, edited_args: str, original: str) -> str:
    """Appended to an edited call's output (agent_core.editing): exactly what ran."""
    return (
        f"\n\nApproved by {_approver(by)} with edited arguments: {edited_args}; "
        f"the original request was {original}."
    )


def edit_not_run(tool: str, why: str) -> str:
    return (
        f"Not executed: the approver edited the arguments of this call to {tool}, and the "
        f"edited arguments are not valid ({why}), so nothing ran."
    )


def _approver(by: str) -> str:
    return f"rule {by[5:]}" if by.startswith("rule:") else (by or "someone")


def expired(tool: str, timeout: float) -> str:
    return (
        f"Not executed: the approval request for this call to {tool} timed out. No decision "
        f"arrived within {_duration(timeout)}, so the call was not executed. Nobody declined it; "
        "no one answered in time. Tell the user it timed out rather than retrying on your own."
    )


def cancelled(tool: str, by: str) -> str:
    return (
        f"Not executed: the run was cancelled by {by or 'a user'} before this call to {tool} ran."
    )


def in_doubt(tool: str) -> str:
    return (
        f"Outcome unknown: the worker running {tool} stopped before it reported a result, so the "
        "call may or may not have taken effect. It was not run again. Tell the user the outcome "
        "is in doubt and that it should be checked before any retry."
    )


def not_run_at_failure(error: str) -> str:
    """A call of a turn whose run failed before the call started (approved or not)."""
    return (
        f"Not executed: the run failed before this call ran ({_clip(error, 300)}), so it had "
        "no effect, and any approval it had no longer holds. If it is still needed, call it "
        "again: a call that needs approval is asked for again."
    )


def in_doubt_at_failure() -> str:
    """A call that was running (claimed, never reported) when its run failed."""
    return (
        "Outcome unknown: this call was running when the run failed, and its worker never "
        "reported a result, so it may or may not have taken effect. It was not run again. "
        "Tell the user the outcome is in doubt and that it should be checked before any retry."
    )


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tool_raised(tool: str, exc: BaseException) -> str:
    return f"Error: the tool {tool} failed: {type(exc).__name__}: {exc}"


def invalid_arguments(tool: str, problem: str) -> str:
    return (
        f"Error: the call to {tool} was rejected before any approval or execution: {problem}. "
        "Nothing ran. Correct the arguments and call again if still needed."
    )


def unknown_tool(name: str, available: list[str]) -> str:
    names = ", ".join(available) or "none"
    return f"Error: there is no tool named {name!r}. Nothing ran. Available tools: {names}."


def args_changed(tool: str) -> str:
    return (
        f"Not executed: the arguments of this call to {tool} no longer match what the approver "
        "saw (hash mismatch), so the approval was not applied."
    )


def too_many_calls(n: int, limit: int) -> str:
    return (
        f"Error: this turn asked for {n} tool calls, more than the {limit} allowed in one turn "
        f"(MAX_CALLS_PER_TURN). None of them ran. Make at most {limit} calls per turn."
    )


def sub_agent_failed(agent: str, error: str) -> str:
    return f"Error: the sub-agent {agent} failed and gave no answer: {error}"


def sub_agent_cancelled(agent: str, by: str) -> str:
    return (
        f"Not finished: the sub-agent {agent} was cancelled by {by or 'a user'} before it "
        "answered. Whatever it did before that stays done."
    )


def sub_agent_cancelled_at_failure(agent: str) -> str:
    """A sub-agent's run cancelled because the run that called it failed (the parent's
    model reads it when that run is continued)."""
    return (
        f"Not finished: the sub-agent {agent} was cancelled because this run failed before "
        "it answered. Whatever it did before that stays done."
    )


def sub_agent_lost(agent: str) -> str:
    """A sub-agent call whose child run is gone or ended without its answer reaching the
    parent (a crash between steps)."""
    return (
        f"Outcome unknown: the run of the sub-agent {agent} ended without its answer "
        "reaching this run. Whatever it did stays done; tell the user it should be checked "
        "before asking it again."
    )


def too_deep(agent: str, limit: int) -> str:
    return (
        f"Error: the sub-agent {agent} was not started: sub-agents may nest at most {limit} "
        "deep, and this call would go deeper. Nothing ran. Answer with what you have."
    )
