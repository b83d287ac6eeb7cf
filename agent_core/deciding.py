"""Deciding one gate: the body of :meth:`Gateway.decide` and its siblings (one DECIDE_GATE
call, then its reply as a :class:`DecideResult`). A caller that knows the gate's run (a
:class:`Gate` it read) decides in one round trip; otherwise the gate's run is read first
(HGET). The script checks the run it is given is the gate's: a forged or stale one decides
nothing, and the gate's own run is then read and tried, once. A quorum's approval that does
not complete it comes back ``counted``; an approval the script refused (a requester's, a
second one by the same person, a group already heard) comes back ``refused`` (see
:mod:`agent_core.quorum`).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .completions import clean_text
from .exceptions import ArgsHashMismatch, GateNotFound, InvalidState
from .models import DecideResult, Gate
from .script_replies import DecideOutcome, Decision
from .stopping import MAX_REASON_CHARS

if TYPE_CHECKING:
    from .gateway import Gateway

log = logging.getLogger(__name__)


def warn_unreplicated(gw: Gateway, gate_id: str, outcome: DecideOutcome, reached: int) -> None:
    """Log a decision (or a grant's) that WAIT saw reach fewer replicas than
    DECISION_REPLICAS: acknowledged, but a failover now could lose it."""
    durable = (DecideOutcome.APPLIED, DecideOutcome.COUNTED)
    if outcome in durable and reached < gw.decision_replicas:
        log.error(
            "gate %s: the decision reached %s of %s replicas within %s ms; a failover "
            "now could lose it",
            gate_id,
            reached,
            gw.decision_replicas,
            gw.decision_wait_ms,
        )


def run_of(gw: Gateway, gate_id: str, run_id: str | None) -> bool:
    """Whether ``run_id`` may be the run of ``gate_id`` (well formed, of its shard): worth
    giving to the script, which checks it is the gate's."""
    from .gateway import valid_run_id

    k = gw.keys
    return (
        run_id is not None and valid_run_id(run_id, k) and k.shard_of(run_id) == k.shard_of(gate_id)
    )


async def stored_run(gw: Gateway, gate_id: str) -> str:
    """The run the gate records (one round trip); :class:`GateNotFound` without one."""
    run_id = await gw.redis.hget(gw.keys.gate(gate_id), "run_id")
    if run_id is None or not run_of(gw, gate_id, run_id):
        raise GateNotFound(f"no gate {gate_id!r}")
    return str(run_id)


async def _decide(
    gw: Gateway, gate_id: str, run_id: str, status: str, decision: dict[str, Any]
) -> Decision:
    """One DECIDE_GATE (then WAIT, with DECISION_REPLICAS)."""
    if gw.decision_replicas > 0:
        res, replicas = await gw.scripts.decide_gate_replicated(
            gate_id,
            run_id,
            status,
            **decision,
            replicas=gw.decision_replicas,
            wait_ms=gw.decision_wait_ms,
        )
        warn_unreplicated(gw, gate_id, res.outcome, replicas)
        return res
    return await gw.scripts.decide_gate(gate_id, run_id, status, **decision)


async def apply_decision(
    gw: Gateway,
    gate_id: str,
    status: str,
    by: str,
    reason: str | None,
    seen_hash: str,
    *,
    run_id: str | None = None,
    groups: Sequence[str] = (),
    allow_self_approval: bool = True,
    edit: tuple[str, str] | None = None,
) -> DecideResult:
    """Run DECIDE_GATE for one gate; see :meth:`Gateway.decide` (``edit``: the edited
    arguments' canonical JSON and hash, see :func:`agent_core.editing.approve_edited`)."""
    from .gateway import valid_gate_id

    if not valid_gate_id(gate_id, gw.keys):
        raise GateNotFound(f"no gate {gate_id[:40]!r}")
    given = run_id if run_of(gw, gate_id, run_id) else None
    run_id = given or await stored_run(gw, gate_id)
    decision: dict[str, Any] = {
        "by": by,
        "reason": clean_text(reason or "")[:MAX_REASON_CHARS],
        # Made once: a decision whose reply was lost, tried again, is told it decided.
        "attempt": secrets.token_hex(8),
        "seen_hash": seen_hash,
        "groups": list(groups),
        "self_ok": allow_self_approval,
        "edit": edit,
    }
    res = await _decide(gw, gate_id, run_id, status, decision)
    if res.outcome is DecideOutcome.MISSING and given is not None:
        # The run the caller gave is not the gate's (a forged or stale value): the script
        # refused it and changed nothing. Ask the gate for its run, once.
        stored = await stored_run(gw, gate_id)
        if stored != given:
            res = await _decide(gw, gate_id, stored, status, decision)
    if res.outcome is DecideOutcome.MISSING:
        raise GateNotFound(f"no gate {gate_id!r}")
    if res.outcome is DecideOutcome.MISMATCH:
        raise ArgsHashMismatch(
            f"gate {gate_id}: the arguments hash {seen_hash[:12]!r} is not this request's; "
            "nothing was decided"
        )
    if res.outcome is DecideOutcome.NOT_DUE:
        raise InvalidState(f"gate {gate_id} is not due yet")
    assert res.gate is not None
    result = DecideResult(
        applied=res.outcome is DecideOutcome.APPLIED,
        gate=Gate.from_hash(res.gate),
        counted=res.outcome is DecideOutcome.COUNTED,
        refused=(res.why or "refused") if res.outcome is DecideOutcome.REFUSED else None,
    )
    if result.applied:
        from . import metrics  # on first use: `import agent_core` loads no prometheus_client

        g = result.gate
        metrics.gate_decided(g.status.value, g.created_at, g.decided_at)
    return result
