"""What Slack shows of a gate that needs more than one approver (agent_core.quorum): the
progress line of its card and Home, what the clicker whose approval was counted or refused
is told, and which quorum groups a clicker fills."""

from __future__ import annotations

from agent_core.models import DecideResult, Gate, GateStatus
from agent_core.quorum import counted, needed, unfilled_groups

from . import cards


def _group(group_id: str) -> str:
    return f"`{cards.escape(group_id)}`"


def _and(names: list[str]) -> str:
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


def approvers_text(gate: Gate) -> str:
    """``<@A> and <@B>``: everyone whose approval counted (the rule's included)."""
    return _and([cards.user(a.by) for a in gate.approvals])


def progress(gate: Gate) -> str:
    """``1 of 2 approvals: <@A>``, or per group ``✅ `S0SRE`: <@A> · ⏳ `S0SECURITY```."""
    q = gate.quorum
    if q is None:
        return ""
    if q.groups:
        by_group = {a.group: a.by for a in gate.approvals if a.group}
        parts = [
            f"✅ {_group(g)}: {cards.user(by_group[g])}" if g in by_group else f"⏳ {_group(g)}"
            for g in q.groups
        ]
        rules = [a.by for a in gate.approvals if not a.group]
        if rules:
            parts.append("also approved by " + _and([cards.user(r) for r in rules]))
        return " · ".join(parts)
    line = f"{counted(q, gate.approvals)} of {needed(q)} approvals"
    return line + (f": {approvers_text(gate)}" if gate.approvals else "")


def outcome_line(gate: Gate) -> str | None:
    """The card's outcome line for a quorum gate, or None to use the usual one."""
    if gate.quorum is None:
        return None
    s = gate.status
    if s is GateStatus.PENDING:
        return f"⏳ {progress(gate)} · expires {cards.fmt_date(gate.deadline)}"
    if s is GateStatus.APPROVED and gate.approvals:
        line = f"✅ *Approved* by {approvers_text(gate)} at {cards.fmt_date(gate.decided_at)}"
        reasons = [
            f"{cards.user(a.by)}: {cards.clip_escaped(a.reason, 300)}"
            for a in gate.approvals
            if a.reason
        ]
        return line + ("\n*Reasons:* " + " · ".join(reasons) if reasons else "")
    return None


def after_line(gate: Gate) -> str:
    """For a quorum gate that ended otherwise (denied, expired…): the approvals it had."""
    if gate.quorum is None or gate.status in (GateStatus.PENDING, GateStatus.APPROVED):
        return ""
    if not gate.approvals:
        return ""
    return f"\n_Approvals before that: {progress(gate)}_"


def counted_message(gate: Gate) -> str:
    """What the clicker whose approval was counted is told."""
    more = needed(gate.quorum) - counted(gate.quorum, gate.approvals)
    wait = (
        "waiting for " + _and([_group(g) for g in unfilled_groups(gate.quorum, gate.approvals)])
        if gate.quorum is not None and gate.quorum.groups
        else f"waiting for {more} more"
    )
    return (
        f"✅ Your approval is counted: {progress(gate)}. The call runs once the others "
        f"approve ({wait})."
    )


def refused_message(result: DecideResult) -> str:
    """What the clicker whose approval was refused (nothing recorded) is told."""
    gate, why = result.gate, result.refused
    if why == "again":
        return f"You already approved this request; {progress(gate)}. It needs someone else."
    if why == "group":
        return (
            f"Your group has already approved this request ({progress(gate)}); it needs an "
            "approver from another group, so nothing was recorded."
        )
    if why == "not_member":
        groups = _and([_group(g) for g in (gate.quorum.groups if gate.quorum else [])])
        return (
            f"This request needs one approver from each of {groups}, and you are in none of "
            "them (or the group could not be checked just now), so nothing was recorded."
        )
    if why == "requester":
        return (
            "You are one of this run's requesters, so your approval does not count "
            "(self-approval is off: ALLOW_SELF_APPROVAL); nothing was recorded."
        )
    return "Your approval was not recorded."


def may_still_approve(user_id: str, gate: Gate, groups: list[str]) -> bool:
    """Whether ``user_id`` (in the quorum's ``groups``) could add an approval to ``gate``."""
    if gate.quorum is None:
        return True
    if any(a.by == user_id for a in gate.approvals):
        return False
    if gate.quorum.groups:
        return bool(set(groups) & set(unfilled_groups(gate.quorum, gate.approvals)))
    return True


def many_line(counted_gates: list[Gate], refused: list[DecideResult]) -> str:
    """Added to an *Approve all* reply: the calls where the approval was only counted, and
    those where it was refused."""
    lines: list[str] = []
    if counted_gates:
        shown = ", ".join(f"`{cards.escape(g.tool)}` ({progress(g)})" for g in counted_gates[:10])
        lines.append(f"Your approval is counted on {shown}: they need more approvers.")
    if refused:
        shown = ", ".join(f"`{cards.escape(r.gate.tool)}`" for r in refused[:10])
        lines.append(f"Your approval was not recorded on {shown}: " + refused_message(refused[0]))
    return "\n".join(lines)
