"""Allow for this thread: an approval that also approves the thread's later matching calls.

A tool opts in with ``@tool(requires_approval=True, allow_for=3600)`` (seconds or a
timedelta; off when unset). An approver of one of its calls may then **approve and allow**:
GRANT_GATE approves that gate exactly as DECIDE_GATE does and, in the same atomic step,
records a grant of the thread (its top run: sub-agents' calls are in their top run's
thread), the agent and the tool, with an optional constraint on one argument
(``env == "staging"``), an expiry (at most ``allow_for`` from now), who granted it and their
workspace. When a later call of the same thread, agent and tool opens its gate and a live
grant matches, OPEN_GATES opens it already approved by ``grant:<id>``: nobody is asked.

A grant decides a call only when its granter could have approved it: the same approver list
(the gate's route), and the granter is none of the call's requesters (unless self-approval
was allowed when they granted). A grant never decides a gate that needs a quorum, and a tool
cannot combine ``allow_for`` with ``approvals``. Grants never cross threads, agents, tools or
workspaces (a thread is in one workspace). A grant ends at its expiry, when revoked
(:meth:`Grants.revoke`: a call whose gate is not open yet asks a person again), or when its
thread's top run is purged (RUN_RETENTION), whichever comes first.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

from .completions import clean_text
from .deciding import warn_unreplicated
from .exceptions import ArgsHashMismatch, GateNotFound
from .keys import Keys
from .models import DecideResult, Gate
from .nudges import seconds
from .script_replies import DecideOutcome, RevokeOutcome
from .stopping import MAX_REASON_CHARS

if TYPE_CHECKING:
    from .agent import Agent
    from .gateway import Gateway
    from .tools import Tool

GRANT_PREFIX = "grant:"
MAX_GRANTS_PER_THREAD = 100  # revoked and expired ones included: a thread is short-lived
MAX_SAFE_INT = 2**53 - 1  # a constraint's number must survive Lua's doubles exactly
_GRANT_ID = re.compile(r"^(r-[0-9a-z]{12})\.[0-9a-f]{12}$")

Scalar = str | int | bool


def scope_of(grant_id: str) -> str | None:
    """The thread (top run id) a grant id belongs to, or None for a malformed id."""
    m = _GRANT_ID.match(grant_id) if isinstance(grant_id, str) else None
    return m.group(1) if m else None


def allow_for_of(agent: Agent, tool: Tool) -> float:
    """How long a grant of ``tool``'s calls by ``agent`` lasts: the tool's ``allow_for``,
    else the agent's; 0 for none."""
    own = getattr(tool, "allow_for", None)
    return seconds(own if own is not None else agent.allow_for, "allow_for") or 0.0


async def thread_of(redis: Redis, keys: Keys, run: dict[str, str]) -> str:
    """The thread of a run: its top run (the run itself when it has no parent)."""
    run_id, parent = run["run_id"], run.get("parent") or ""
    for _ in range(32):  # deeper than any MAX_DEPTH; a loop in the data cannot hang
        if not parent or not keys.owns(parent):
            break
        run_id = parent
        parent = await redis.hget(keys.run(run_id), "parent") or ""
    return run_id


def until_text(until: float, since: float | None = None) -> str:
    """``14:05 UTC``, or ``2026-12-04 14:05 UTC`` when it is not within the next day."""
    at = datetime.fromtimestamp(until, UTC)
    since = time.time() if since is None else since
    return at.strftime("%H:%M UTC" if until - since < 86400 else "%Y-%m-%d %H:%M UTC")


def grant_note(granted_by: str, tool: str, until: float, since: float | None = None) -> str:
    """What the model is told about a call a grant approved, after ``Approved by``."""
    return f"{granted_by}'s grant (allow `{tool}` in this thread until {until_text(until, since)})"


def constraint_ok(field: str | None, value: Any, args: dict[str, Any]) -> str | None:
    """None when ``field == value`` is a usable constraint for a call with ``args`` (a
    top-level argument whose value is a string, a boolean or a whole number and equals
    ``value``), else why not. No field: no constraint."""
    if field is None:
        return None
    if field not in args:
        return f"`{field}` is not an argument of this call"
    if isinstance(value, bool) or isinstance(value, str):
        pass
    elif isinstance(value, int):
        if abs(value) > MAX_SAFE_INT:
            return f"`{field}` is too large a number to constrain"
    else:
        return f"`{field}` is not a text, yes/no or whole-number argument"
    if type(args[field]) is not type(value) or args[field] != value:
        return f"`{field}` is not {json.dumps(value)} in this call"
    return None


@dataclass(frozen=True)
class Grant:
    """One grant, as recorded (see the module)."""

    grant_id: str
    scope: str  # the thread's top run
    agent: str
    tool: str
    approvers: list[str]
    field: str  # '' for none: any arguments
    value: Any  # the constrained value, when ``field`` is set
    expires_at: float
    granted_by: str
    gate_id: str  # the gate whose approval made it
    created_at: float
    note: str
    team: str = ""
    revoked_at: float | None = None
    revoked_by: str = ""

    @classmethod
    def of(cls, raw: str) -> Grant | None:
        """A record of a thread's grants hash; None when unreadable."""
        try:
            d = json.loads(raw)
            approvers = json.loads(d.get("approvers") or "[]")
            return cls(
                grant_id=str(d["id"]),
                scope=str(d["scope"]),
                agent=str(d["agent"]),
                tool=str(d["tool"]),
                approvers=[str(a) for a in approvers] if isinstance(approvers, list) else [],
                field=str(d.get("field") or ""),
                value=json.loads(d["value"]) if d.get("field") else None,
                expires_at=float(d["expires_at"]),
                granted_by=str(d["granted_by"]),
                gate_id=str(d.get("gate_id") or ""),
                created_at=float(d.get("created_at") or 0),
                note=str(d.get("note") or ""),
                team=str(d.get("team") or ""),
                revoked_at=float(d["revoked_at"]) if d.get("revoked_at") else None,
                revoked_by=str(d.get("revoked_by") or ""),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def live(self, now: float | None = None) -> bool:
        """Neither revoked nor expired."""
        now = time.time() if now is None else now
        return self.revoked_at is None and self.expires_at > now

    @property
    def constraint(self) -> str:
        """``only env="staging"``, or ``any arguments``."""
        return f"only {self.field}={json.dumps(self.value)}" if self.field else "any arguments"


@dataclass(frozen=True)
class GrantResult:
    """:meth:`Grants.approve_and_allow`'s outcome: the decision (as :meth:`Gateway.decide`
    answers it; ``refused`` says why an approval was not recorded, among them
    ``not_allowed`` and ``too_many``) and the grant recorded, if any."""

    decision: DecideResult | None
    grant: Grant | None = None
    refused: str | None = None


class Grants:
    """A gateway's grants: make one with an approval, list them, revoke one."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    async def approve_and_allow(
        self,
        gate: str | Gate,
        by: str,
        *,
        args_hash: str,
        field: str | None = None,
        value: Scalar | None = None,
        reason: str | None = None,
        allow_self_approval: bool = True,
        team: str = "",
    ) -> GrantResult:
        """Approve a pending gate and allow its tool in its thread (see the module).

        ``field``/``value``: an optional constraint (the call's own value of one simple
        argument). The grant lasts the tool's ``allow_for`` from now. Raises as
        :meth:`Gateway.decide` does (:class:`GateNotFound`, :class:`ArgsHashMismatch`) and
        ValueError for an unusable constraint. ``gate``: its id, or the :class:`Gate` the
        caller has just read (not read again; a stale or forged run in it grants nothing,
        and the gate is then read and granted as if given by id)."""
        gw = self.gw
        read = None if isinstance(gate, str) else gate
        gate_id = gate if isinstance(gate, str) else gate.gate_id
        if read is None:
            read = await gw.get_gate(gate_id)
        if read is None:
            raise GateNotFound(f"no gate {gate_id[:40]!r}")
        given, gate = gate, read
        if not by:
            raise ValueError("by is required")
        why = constraint_ok(field, value, gate.args)
        if why is not None:
            raise ValueError(why)
        allow_for = gate.allow_for or 0.0
        scope = await gw.top_run_id(gate.run_id)
        sec, usec = await gw.redis.time()
        now = sec + usec / 1e6
        until = now + allow_for
        spec = {
            "scope": scope,
            "field": field or "",
            "value": json.dumps(value) if field else "",
            "note": grant_note(by, gate.tool, until, now),
            "team": team,
        }
        grant_id = f"{scope}.{secrets.token_hex(6)}"
        granting = {
            "by": by,
            "reason": clean_text(reason or "")[:MAX_REASON_CHARS],
            "attempt": secrets.token_hex(8),
            "seen_hash": args_hash,
            "self_ok": allow_self_approval,
            "grant_id": grant_id,
            "until": until,
            "spec": spec,
            "max_grants": MAX_GRANTS_PER_THREAD,
        }
        # With DECISION_REPLICAS, acknowledged once a replica has it, as a decision.
        res, reached = await gw.scripts.grant_gate(
            gate_id,
            gate.run_id,
            **granting,
            replicas=gw.decision_replicas,
            wait_ms=gw.decision_wait_ms,
        )
        if gw.decision_replicas > 0:
            warn_unreplicated(gw, gate_id, res.outcome, reached)
        if res.outcome is DecideOutcome.MISSING and not isinstance(given, str):
            # Not the gate's run (nothing was written): read the gate itself, once.
            return await self.approve_and_allow(
                gate_id,
                by,
                args_hash=args_hash,
                field=field,
                value=value,
                reason=reason,
                allow_self_approval=allow_self_approval,
                team=team,
            )
        if res.outcome is DecideOutcome.MISSING:
            raise GateNotFound(f"no gate {gate_id!r}")
        if res.outcome is DecideOutcome.MISMATCH:
            raise ArgsHashMismatch(
                f"gate {gate_id}: the arguments hash {args_hash[:12]!r} is not this "
                "request's; nothing was decided"
            )
        if res.gate is None:  # not_allowed | too_many | bad_until: nothing decided
            return GrantResult(None, None, res.why or "not_allowed")
        decided = Gate.from_hash(res.gate)
        result = DecideResult(
            applied=res.outcome is DecideOutcome.APPLIED,
            gate=decided,
            counted=res.outcome is DecideOutcome.COUNTED,
            refused=(res.why or "refused") if res.outcome is DecideOutcome.REFUSED else None,
        )
        grant = None
        if result.applied and res.gate.get("granted") == grant_id:
            grant = await self.get(grant_id)
            from . import metrics

            metrics.gate_decided(decided.status.value, decided.created_at, decided.decided_at)
        return GrantResult(result, grant, result.refused)

    async def get(self, grant_id: str) -> Grant | None:
        """The grant (live or not) while its thread is kept; None otherwise."""
        scope = scope_of(grant_id)
        if scope is None or not self.gw.keys.owns(scope):
            return None
        raw = await self.gw.redis.hget(self.gw.keys.grants(scope), grant_id)
        return Grant.of(raw) if raw else None

    async def of_thread(self, run_id: str) -> list[Grant]:
        """Every grant of the thread of ``run_id`` (live or not), oldest first."""
        scope = await self.gw.top_run_id(run_id)
        raws = await self.gw.redis.hvals(self.gw.keys.grants(scope))
        found = [g for g in (Grant.of(r) for r in raws) if g is not None]
        return sorted(found, key=lambda g: g.created_at)

    async def live(self, limit: int = 200) -> list[Grant]:
        """The live grants of every thread, soonest to expire first (at most ``limit``)."""
        k = self.gw.keys
        sec, usec = await self.gw.redis.time()
        now = sec + usec / 1e6
        async with self.gw.redis.pipeline(transaction=False) as pipe:
            for shard in k.all_shards():
                pipe.zrangebyscore(k.live_grants(shard), now, "+inf", start=0, num=limit)
            ids = [g for rows in await pipe.execute() for g in rows if scope_of(g)]
        async with self.gw.redis.pipeline(transaction=False) as pipe:
            for gid in ids:
                pipe.hget(k.grants(str(scope_of(gid))), gid)
            raws = await pipe.execute()
        found = [Grant.of(r) for r in raws if r]
        live = [g for g in found if g is not None and g.live(now)]
        return sorted(live, key=lambda g: g.expires_at)[:limit]

    async def revoke(self, grant_id: str, by: str) -> RevokeOutcome:
        """End a grant now: ``revoked``, ``ended`` (revoked or expired already) or
        ``missing``. The caller checks ``by`` may (see the front end's approver rules)."""
        scope = scope_of(grant_id)
        if scope is None or not self.gw.keys.owns(scope):
            return RevokeOutcome.MISSING
        if not by:
            raise ValueError("by is required")
        return await self.gw.scripts.revoke_grant(grant_id, scope, by)


def is_grant(by: str | None) -> bool:
    """Whether a gate was decided by a grant (``decided_by`` is ``grant:<id>``)."""
    return bool(by) and str(by).startswith(GRANT_PREFIX)
