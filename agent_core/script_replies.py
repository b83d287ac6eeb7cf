"""What the Lua scripts answer, typed: one enum or small dataclass per script (see
:class:`agent_core.scripts.Scripts`, which turns each reply into these). No caller reads a
script's reply by position."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


def pairs(flat: list[Any]) -> dict[str, str]:
    """A hash returned by a script as a flat [field, value, ...] list, as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def text(reply: Any) -> str:
    """A status or bulk reply as text (a client without decode_responses answers bytes)."""
    return reply.decode() if isinstance(reply, bytes) else str(reply)


@dataclass(frozen=True)
class Began:
    """BEGIN_RUN's answer (also taken with the lease by ACQUIRE_LEASE). ``status`` is the
    run's status after the call, '' when the run does not exist, 'lost' when the lease is
    no longer the caller's; ``run`` the run hash (None when the run stays paused, its gates
    pending). Read with the lease by ACQUIRE_LEASE: ``turn``, the hash of the turn a resume
    job resumes, ``gates`` the hashes of the gates the job named (by gate id), ``claimed``
    the calls claimed for this worker in one batch; ``read`` what the model call of a run
    in phase ``model`` reads."""

    status: str
    run: dict[str, str] | None = None
    turn: dict[str, str] | None = None
    gates: dict[str, dict[str, str]] | None = None
    claimed: frozenset[str] = frozenset()
    read: ModelRead | None = None

    @classmethod
    def of(cls, reply: list[Any], history: list[bytes] | None = None) -> Began:
        """``history``: the run's, read after the script (needed when it read for the model:
        :attr:`needs_history` says so when it was not read)."""

        def at(i: int) -> Any:
            return reply[i] if len(reply) > i else None

        run = pairs(reply[1]) if at(1) else None
        turn = pairs(reply[2]) if at(2) else None
        gates = None
        if at(3) is not None:
            gates = {}
            for flat in reply[3]:
                h = pairs(flat)
                if h.get("gate_id"):
                    gates[h["gate_id"]] = h
        claimed = frozenset(text(c) for c in at(4) or ())
        read = ModelRead.of(reply[5], history) if at(5) else None
        return cls(text(reply[0]), run, turn, gates, claimed, read)


class LeaseStatus(str, Enum):
    OK = "ok"
    BUSY = "busy"  # another worker holds a live lease
    MISSING = "missing"  # no such run


@dataclass(frozen=True)
class Lease:
    """ACQUIRE_LEASE's answer: the fence when taken, the previous owner on a takeover ('' if
    none), seconds left on the holder's lease when busy, and BEGIN_RUN's answer when taken
    with ``begin``."""

    status: LeaseStatus
    fence: str = ""
    previous_owner: str = ""
    busy_for: float = 0.0
    began: Began | None = None
    replicas: int = -1  # the replicas WAIT reached (-1: not waited for)


@dataclass(frozen=True)
class ModelRead:
    """READ_FOR_MODEL's answer: the lease as it stands, the run's turn and phase, the Redis
    clock, and the history (each message's JSON, as stored: UTF-8 bytes)."""

    fence: str
    lease_until: float
    turn: str
    phase: str
    now: str
    history: list[bytes]

    @classmethod
    def of(cls, reply: list[Any], history: list[bytes] | None) -> ModelRead:
        """From the script's reply and the history read right after it (a read without
        it is a caller's mistake: never a model call on an empty history)."""
        if history is None:
            raise ValueError("READ_FOR_MODEL's reply without the history read after it")
        fence, until, turn, phase, now = reply
        return cls(fence, float(until or 0), turn, phase, now, history)


@dataclass(frozen=True)
class Step:
    """RECORD_TURN's and FINISH_TURN's answer: ``lost`` when the lease is not the caller's;
    else the run hash as the step left it (None when the run is no longer at that step:
    cancelled, or a replay), and with FINISH_TURN's read what the next model call reads.
    RECORD_TURN's also says what became of the gates it opened (``gates``, None when it
    was given none) and whether it finished the job (``finished``: acked, lease released);
    when rules or grants decided every gate, the turn's hash and its gates' (``turn``,
    ``gate_hashes``)."""

    lost: bool = False
    run: dict[str, str] | None = None
    read: ModelRead | None = None
    gates: OpenOutcome | None = None
    finished: bool = False
    turn: dict[str, str] | None = None  # RECORD_TURN's, when rules decided every gate
    gate_hashes: dict[str, dict[str, str]] | None = None  # and its gates', by gate id


class DecideOutcome(str, Enum):
    APPLIED = "applied"
    DECIDED = "decided"  # someone else was first
    MISSING = "missing"
    NOT_DUE = "not_due"  # an expiry asked too early
    MISMATCH = "mismatch"  # the arguments hash the decider saw is not the gate's
    COUNTED = "counted"  # an approval counted towards the gate's quorum: still pending
    REFUSED = "refused"  # an approval not recorded (``why`` says why)


class RevokeOutcome(str, Enum):
    """REVOKE_GRANT's answer."""

    REVOKED = "revoked"
    ENDED = "ended"  # revoked or expired already
    MISSING = "missing"


@dataclass(frozen=True)
class Decision:
    """DECIDE_GATE's answer: the outcome, the gate hash (applied, decided, counted and
    refused only) and, for refused, why (requester | again | group | not_member)."""

    outcome: DecideOutcome
    gate: dict[str, str] | None = None
    why: str = ""


class ClaimOutcome(str, Enum):
    OK = "ok"  # claimed now
    NO = "no"  # not claimable (``state`` says why)
    YOURS = "yours"  # this attempt's own earlier claim (its reply was lost)
    LOST = "lost"
    STOPPED = "stopped"  # the run is not running at that turn (``state``: its status)


@dataclass(frozen=True)
class Claim:
    """CLAIM_CALL's answer; ``state`` is the call's previous state (ok, no) or the run's
    status (stopped)."""

    outcome: ClaimOutcome
    state: str = ""


class CompleteOutcome(str, Enum):
    OK = "ok"
    LOST = "lost"
    STALE = "stale"  # the call is not claimed: nothing written


class SettleOutcome(str, Enum):
    OK = "ok"
    LOST = "lost"
    STOPPED = "stopped"


class OpenOutcome(str, Enum):
    OK = "ok"  # paused
    DECIDED = "decided"  # approver rules decided every gate: go on
    LOST = "lost"
    STOPPED = "stopped"
    STALE = "stale"


@dataclass(frozen=True)
class CallResult:
    """A claimed call's result for FINISH_TURN (COMPLETE_CALL's values): the text the model
    reads, tool.executed's data JSON without its closing brace, and for a gated call its
    gate and audit outcome (executed | failed | in_doubt)."""

    call_id: str
    result: str
    event: str
    gate_id: str | None = None
    outcome: str = "executed"


@dataclass(frozen=True)
class GateToOpen:
    """One gate for OPEN_GATES: its fields (a flat JSON object of strings) and its events'
    data, each JSON without its closing brace (the script appends the times); ``decided``
    is '' for a gate left to a person."""

    gate_id: str
    timeout: str
    fields: str
    opened: str
    decided: str = ""


class RepairOutcome(str, Enum):
    REPAIRED = "repaired"
    WAITING = "waiting"
    BUSY = "busy"
    RECENT = "recent"
    FINISHED = "finished"
    RETRY = "retry"
    MISSING = "missing"


class RetryOutcome(str, Enum):
    QUEUED = "queued"
    MISSING = "missing"
    NOT_FAILED = "not_failed"
    NOT_RETRYABLE = "not_retryable"
    PARENT_MOVED_ON = "parent_moved_on"
    RETRY = "retry"  # read the parent again


class ContinueReply(str, Enum):
    STARTED = "started"
    QUEUED = "queued"
    CANCELLED = "cancelled"
    MISSING = "missing"
    DUPLICATE = "duplicate"


class SpawnOutcome(str, Enum):
    SPAWNED = "spawned"
    LOST = "lost"
    STOPPED = "stopped"
    STALE = "stale"


class WaitOutcome(str, Enum):
    WAITING = "waiting"
    GO = "go"
    ORPHANED = "orphaned"
    LOST = "lost"
    STOPPED = "stopped"


class FailOutcome(str, Enum):
    FAILED = "failed"
    FINISHED = "finished"
    LOST = "lost"
    RETRY = "retry"
    MISSING = "missing"


class CancelOutcome(str, Enum):
    CANCELLED = "cancelled"
    FINISHED = "finished"
    MISSING = "missing"
    RETRY = "retry"


@dataclass(frozen=True)
class Cancelled:
    """CANCEL_RUN's answer; ``status`` is the run's final status when already finished."""

    outcome: CancelOutcome
    status: str = ""


@dataclass(frozen=True)
class WorkerRecords:
    """READ_WORKERS' answer: the Redis clock and each worker's (name, record JSON)."""

    now: str
    records: list[tuple[str, str]] = field(default_factory=list)


class NudgeOutcome(str, Enum):
    FIRED = "fired"  # this call fired the step
    GONE = "gone"  # no such entry: fired already (by another worker), or removed by a decision
    NOT_DUE = "not_due"
    NOT_PENDING = "not_pending"  # the gate was decided or closed (or is gone): entry dropped
    LATE = "late"  # the gate is past its deadline (its expiry comes next): entry dropped


@dataclass(frozen=True)
class Nudged:
    """FIRE_NUDGE's answer: the outcome, and the gate hash when it fired."""

    outcome: NudgeOutcome
    gate: dict[str, str] | None = None
