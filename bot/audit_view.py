"""``/agent audit [tool|@user]``: the last entries of the audit trail (agent_core.audit), in a
private (ephemeral) reply, for approvers only.

Who may: anyone who may approve, that is on APPROVERS, or on the own approver list of a
gate the trail shows (a tool's or agent's approvers, :meth:`Approvers.list_for`). Fails
closed: a gate no longer in Redis, or a user group that cannot be looked up, lets nobody in.
"""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime

from agent_core.audit import AuditEntry, latest

from . import cards
from .context import BotContext

SHOWN = 20
_MENTION = re.compile(r"^<@([UW][A-Z0-9]+)(?:\|[^>]*)?>$|^@?([UW][A-Z0-9]{2,})$")
REFUSED = "Only approvers may read the audit trail."
NAME_NOT_ID = (
    "Name the person by their Slack member ID (`U…`, in their profile under ⋮ → Copy member "
    "ID), or mention them so that Slack sends the ID."
)
WHAT = {
    "opened": "asked for",
    "counted": "approval counted",
    "approved": "approved",
    "denied": "denied",
    "expired": "expired",
    "closed": "closed",
    "reminded": "reminded",
    "escalated": "escalated",
    "executed": "ran",
    "failed": "failed",
    "in_doubt": "in doubt",
    "not_run": "not run",
}


def parse_filter(arg: str) -> tuple[str, str] | None:
    """``(tool, user)`` from what follows ``audit``; None for a name that is not an ID."""
    arg = html.unescape(arg).strip()
    if not arg:
        return "", ""
    m = _MENTION.match(arg)
    if m:
        return "", m.group(1) or m.group(2)
    if arg.startswith("@") or arg.startswith("<@"):
        return None
    return arg, ""


def _line(e: AuditEntry) -> str:
    when = datetime.fromtimestamp(e.at, UTC).strftime("%Y-%m-%d %H:%M:%S")
    by = e.get("by")
    who = f"<@{by}>" if by[:1] in ("U", "W") else cards.clip_escaped(by, 60) if by else ""
    what = WHAT.get(e.kind, cards.clip_escaped(e.kind, 30))
    tool = cards.clip_escaped(e.get("tool"), 60)
    reason = e.get("reason")
    tail = f" — {cards.clip_escaped(reason, 120)}" if reason else ""
    return (
        f"`{when}` *{tool}* {what}{' by ' + who if who else ''} "
        f"(gate `{cards.clip_escaped(e.get('gate_id'), 40)}`, run "
        f"`{cards.clip_escaped(e.get('run_id'), 40)}`){tail}"
    )


async def may_audit(
    ctx: BotContext, user_id: str, shown: list[AuditEntry], *, external: bool
) -> bool:
    """Whether ``user_id`` may approve: on APPROVERS, or on a shown gate's own list."""
    approvers = ctx.approvers
    if await approvers.is_approver(user_id, external=external):
        return True
    seen: set[str] = set()
    for e in shown:
        gid = e.get("gate_id")
        if not gid or gid in seen:
            continue
        seen.add(gid)
        gate = await ctx.gateway.get_gate(gid)
        if gate is not None and gate.approvers:
            if await approvers.is_approver(user_id, external=external, gate=gate):
                return True
    return False


async def audit_reply(ctx: BotContext, user_id: str, arg: str, *, external: bool) -> str:
    """The text of the private reply to ``/agent audit <arg>`` for ``user_id``."""
    wanted = parse_filter(arg)
    if wanted is None:
        return NAME_NOT_ID
    tool, user = wanted
    redis, keys = ctx.store.redis, ctx.store.keys
    if not await may_audit(ctx, user_id, await latest(redis, keys, 200), external=external):
        return REFUSED
    shown = await latest(redis, keys, SHOWN, tool=tool, user=user)
    about = f" of `{cards.clip_escaped(tool, 60)}`" if tool else f" by <@{user}>" if user else ""
    if not shown:
        return f"The audit trail has no entries{about}."
    head = f"*The last {len(shown)} audit entries{about}* (newest first)"
    return "\n".join([head, *(_line(e) for e in shown)])
