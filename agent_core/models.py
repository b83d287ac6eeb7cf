"""States and records: what a run, a gate and an event look like to callers."""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

from pydantic import BaseModel, Field

from .quorum import Approval, Quorum, approvals_of


class RunStatus(str, Enum):
    """``queued → running → awaiting_approval → running → … → completed | failed | cancelled``."""

    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


class GateStatus(str, Enum):
    """``pending → approved | denied | expired | cancelled``, exactly once."""

    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class Decision(str, Enum):
    """What a person may decide about a gate."""

    APPROVE = "approve"
    DENY = "deny"

    @property
    def status(self) -> GateStatus:
        return GateStatus.APPROVED if self is Decision.APPROVE else GateStatus.DENIED


class EventType(str, Enum):
    """Event types on the events stream."""

    RUN_STARTED = "run.started"
    GATE_OPENED = "gate.opened"
    GATE_DECIDED = "gate.decided"
    TOOL_EXECUTED = "tool.executed"
    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    RUN_RETRIED = "run.retried"
    RUN_CONTINUED = "run.continued"
    GATE_REMINDED = "gate.reminded"  # its approvers were reminded (agent_core.nudges)
    GATE_ESCALATED = "gate.escalated"  # its escalate_to may decide it too from now on
    GATE_APPROVAL = "gate.approval"  # one approval counted; the gate needs more (quorum)
    GRANT_CREATED = "grant.created"  # an approval allowed its tool in the thread (grants)
    GRANT_REVOKED = "grant.revoked"  # a grant was ended before its expiry


class ContinueOutcome(str, Enum):
    """What :meth:`Gateway.continue_run` did with a message."""

    STARTED = "started"  # the run had finished: the message starts its next turn
    QUEUED = "queued"  # the run is working: the model gets it at its next turn
    DUPLICATE = "duplicate"  # its dedupe key was recorded already: nothing was done


def requesters_of(h: dict[str, str]) -> list[str]:
    """Everyone whose message the model had read, the starter first (a run hash's or a gate
    hash's ``requesters``; for one stored before the field existed, its ``requested_by`` and,
    for a run, the author of its latest message)."""
    found = [u for u in _str_list(h.get("requesters")) if u]
    if not found:
        found = [u for u in (h.get("requested_by"), h.get("last_by")) if u]
    return list(dict.fromkeys(found))


def _opt_float(value: str | None) -> float | None:
    return float(value) if value not in (None, "") else None


class Run(BaseModel):
    """A run as stored in Redis."""

    run_id: str
    agent: str
    task: str
    requested_by: str
    # Everyone who spoke to the agent in this run, the starter first: none of them may approve
    # its calls unless self-approval is allowed.
    requesters: list[str] = Field(default_factory=list)
    origin: dict[str, Any] = Field(default_factory=dict)
    status: RunStatus
    created_at: float
    updated_at: float
    turn: int = 0
    pending: int = 0
    children_pending: int = 0  # sub-agent runs it waits for
    final: str | None = None
    error: str | None = None
    cancelled_by: str | None = None
    retryable: bool = False  # failed, and Gateway.retry_run can continue it

    @classmethod
    def from_hash(cls, h: dict[str, str]) -> Run:
        return cls(
            run_id=h["run_id"],
            agent=h.get("agent", ""),
            task=h.get("task", ""),
            requested_by=h.get("requested_by", ""),
            requesters=requesters_of(h),
            origin=json.loads(h.get("origin") or "{}"),
            status=RunStatus(h["status"]),
            created_at=float(h.get("created_at") or 0),
            updated_at=float(h.get("updated_at") or 0),
            turn=int(h.get("turn") or 0),
            pending=int(h.get("pending") or 0),
            children_pending=int(h.get("children_pending") or 0),
            final=h.get("final") or None,
            error=h.get("error") or None,
            cancelled_by=h.get("cancelled_by") or None,
            retryable=h.get("retryable") == "1" and h.get("status") == "failed",
        )


class Gate(BaseModel):
    """One approval gate: a gated tool call waiting for (or past) a decision."""

    gate_id: str
    run_id: str
    call_id: str
    turn: int
    tool: str
    description: str = ""
    args: dict[str, Any]
    args_hash: str
    status: GateStatus
    agent: str = ""
    requested_by: str = ""  # the primary requester: the top run's starter
    # Everyone whose message the model had read when it asked for the call (the primary
    # first, then who spoke in the thread), down through sub-agents.
    requesters: list[str] = Field(default_factory=list)
    origin: dict[str, Any] = Field(default_factory=dict)
    created_at: float
    deadline: float
    timeout: float
    decided_by: str | None = None
    decided_at: float | None = None
    reason: str | None = None
    nested: bool = False  # opened by a sub-agent's run (its path says whose)
    path: list[str] = Field(default_factory=list)  # the agents from the top run down to this
    decided_hash: str | None = None  # the arguments hash the decider saw
    closed_by_failure: bool = False  # cancelled because the run failed
    index: int | None = None  # the call's position in its turn (None: a gate of an older core)
    turn_gates: int | None = None  # how many gates its turn opened (None: an older core's)
    # Reminders and escalation (agent_core.nudges): when each step is due (None: none), who
    # is escalated to, and when each step fired (None: not yet).
    remind_at: float | None = None
    escalate_at: float | None = None
    escalate_to: list[str] = Field(default_factory=list)
    reminded_at: float | None = None
    escalated_at: float | None = None
    # More than one approver (agent_core.quorum): None when one approval decides.
    quorum: Quorum | None = None
    approvals: list[Approval] = Field(default_factory=list)  # counted so far, in order
    # Who may decide it (Slack IDs, from its tool's or agent's route; empty: the global
    # APPROVERS) and the channel its card goes to (empty: the task's thread).
    approvers: list[str] = Field(default_factory=list)
    approval_channel: str = ""
    # Edit, then approve (agent_core.editing): the fields a person may edit (empty: none),
    # the arguments' JSON schema, and once approved with edits, the arguments that run
    # (their hash is the decided hash) and who edited them.
    editable: list[str] = Field(default_factory=list)
    args_schema: dict[str, Any] | None = None
    edited_args: dict[str, Any] | None = None
    edited_hash: str | None = None
    edited_by: str | None = None
    # Allow for this thread (agent_core.grants): how long a grant made with its approval
    # lasts (None: its tool allows none); the grant that decided it, its granter and end;
    # the grant its own approval made.
    allow_for: float | None = None
    grant_id: str = ""
    granted_by: str = ""
    grant_until: float | None = None
    granted: str = ""

    @classmethod
    def from_hash(cls, h: dict[str, str]) -> Gate:
        return cls(
            gate_id=h["gate_id"],
            run_id=h["run_id"],
            call_id=h["call_id"],
            turn=int(h["turn"]),
            tool=h["tool"],
            description=h.get("description", ""),
            args=json.loads(h["args"]),
            args_hash=h["args_hash"],
            status=GateStatus(h["status"]),
            agent=h.get("agent", ""),
            requested_by=h.get("requested_by", ""),
            requesters=requesters_of(h),
            origin=json.loads(h.get("origin") or "{}"),
            created_at=float(h["created_at"]),
            deadline=float(h["deadline"]),
            timeout=float(h["timeout"]),
            decided_by=h.get("decided_by") or None,
            decided_at=_opt_float(h.get("decided_at")),
            reason=h.get("reason") or None,
            nested=h.get("nested") == "1",
            path=_str_list(h.get("path")),
            decided_hash=h.get("decided_hash") or None,
            closed_by_failure=h.get("closed_by_failure") == "1",
            index=int(h["index"]) if h.get("index") else None,
            turn_gates=int(h["turn_gates"]) if h.get("turn_gates") else None,
            remind_at=_opt_float(h.get("remind_at")),
            escalate_at=_opt_float(h.get("escalate_at")),
            escalate_to=_str_list(h.get("escalate_to")),
            reminded_at=_opt_float(h.get("reminded_at")),
            escalated_at=_opt_float(h.get("escalated_at")),
            quorum=Quorum.from_field(h.get("quorum")),
            approvals=approvals_of(h.get("approvals")),
            approvers=_str_list(h.get("approvers")),
            approval_channel=h.get("approval_channel") or "",
            editable=_str_list(h.get("editable")),
            args_schema=_opt_json(h.get("args_schema")),
            edited_args=_opt_json(h.get("edited_args")),
            edited_hash=h.get("edited_hash") or None,
            edited_by=h.get("edited_by") or None,
            allow_for=_opt_float(h.get("allow_for")),
            grant_id=h.get("grant_id") or "",
            granted_by=h.get("granted_by") or "",
            grant_until=_opt_float(h.get("grant_until")),
            granted=h.get("granted") or "",
        )

    def extra_approvers(self) -> list[str]:
        """Who may decide this gate besides its approvers: its ``escalate_to`` once it was
        escalated (the front end's check adds them to the approver list)."""
        return list(self.escalate_to) if self.escalated_at is not None else []

    @property
    def sort_key(self) -> tuple[int, bool, int, float]:
        """Sort key: by turn, then by the call's position in it (gates opened before calls
        carried a position come after, by creation time)."""
        return (self.turn, self.index is None, self.index or 0, self.created_at)


class DecideResult(BaseModel):
    """The outcome of :meth:`Gateway.decide` (one per gate of :meth:`Gateway.decide_many`).

    ``applied`` is true only for the one call that moved the gate out of ``pending``;
    every other call gets ``applied=False`` and the gate as the first decision left it.
    """

    applied: bool
    gate: Gate
    # A quorum's approval recorded without deciding the gate (it needs more approvals).
    counted: bool = False
    # Why an approval was refused, nothing recorded: requester | again (this person has
    # approved already) | group (their groups have approved already) | not_member.
    refused: str | None = None

    @property
    def status(self) -> GateStatus:
        return self.gate.status


class Event(BaseModel):
    """One entry of the events stream."""

    id: str
    type: EventType
    run_id: str
    data: dict[str, Any]
    # The stream it was read from (each shard has its own), for acknowledging it.
    stream: str = ""


def _opt_json(raw: str | None) -> dict[str, Any] | None:
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _str_list(raw: str | None) -> list[str]:
    try:
        value = json.loads(raw or "[]")
    except ValueError:
        return []
    return [str(x) for x in value] if isinstance(value, list) else []
