"""Deciding one gate: the body of :meth:`Gateway.decide` and its siblings (one DECIDE_GATE
call, then its reply as a :class:`DecideResult`). A quorum's approval that does not complete
it comes back ``counted``; an approval the script refused (a requester's, a second one by
the same person, a group already heard) comes back ``refused`` (see :mod:`agent_core.quorum`).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .completions import clean_text
from .exceptions import ArgsHashMismatch, GateNotFound, InvalidState
from .models import DecideResult, Gate
from .script_replies import DecideOutcome
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
    from .gateway import valid_gate_id, valid_run_id

    if not valid_gate_id(gate_id, gw.keys):
        raise GateNotFound(f"no gate {gate_id[:40]!r}")
    k = gw.keys
    if run_id is None:
        run_id = await gw.redis.hget(k.gate(gate_id), "run_id")
    if run_id is None or not valid_run_id(run_id, k) or k.shard_of(run_id) != k.shard_of(gate_id):
        raise GateNotFound(f"no gate {gate_id!r}")
    decision = {
        "by": by,
        "reason": clean_text(reason or "")[:MAX_REASON_CHARS],
        # Made once: a decision whose reply was lost, tried again, is told it decided.
        "attempt": secrets.token_hex(8),
        "seen_hash": seen_hash,
        "groups": list(groups),
        "self_ok": allow_self_approval,
        "edit": edit,
    }
    if gw.decision_replicas > 0:
        res, replicas = await gw.scripts.decide_gate_replicated(
            gate_id,
            run_id,
            status,
            **decision,  # type: ignore[arg-type]
            replicas=gw.decision_replicas,
            wait_ms=gw.decision_wait_ms,
        )
        warn_unreplicated(gw, gate_id, res.outcome, replicas)
    else:
        res = await gw.scripts.decide_gate(gate_id, run_id, status, **decision)  # type: ignore[arg-type]
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
