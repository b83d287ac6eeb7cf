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

import json
import logging
import secrets
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .completions import clean_text
from .exceptions import ArgsHashMismatch, GateNotFound, InvalidState, RunNotFound
from .ids import valid_gate_id, valid_run_id
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
    res, replicas = await gw.scripts.decide_gate(
        gate_id,
        run_id,
        status,
        **decision,
        replicas=gw.decision_replicas,
        wait_ms=gw.decision_wait_ms,
    )
    if gw.decision_replicas > 0:
        warn_unreplicated(gw, gate_id, res.outcome, replicas)
    return res


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


async def gate_of_call(gw: Gateway, run_id: str, call_id: str) -> str:
    """The gate of the run's tool call ``call_id`` (the latest turn holding it); see
    :meth:`Gateway.decide_call`."""
    if not valid_run_id(run_id, gw.keys):
        raise RunNotFound(f"no run {run_id[:40]!r}")
    if not isinstance(call_id, str) or not 0 < len(call_id) <= 200:
        raise GateNotFound(f"run {run_id} has no call {str(call_id)[:40]!r}")
    k = gw.keys
    turn = await gw.redis.hget(k.run(run_id), "turn")
    if turn is None:
        raise RunNotFound(f"no run {run_id!r}")
    turns = range(int(turn), 0, -1)  # newest first: a server may reuse call ids
    async with gw.redis.pipeline(transaction=False) as pipe:
        for n in turns:
            pipe.hget(k.turn(run_id, n), f"call:{call_id}")
        records = await pipe.execute()
    raw = next((r for r in records if r), None)
    if raw is None:
        raise GateNotFound(f"run {run_id} has no call {call_id!r}")
    gate_id = json.loads(raw).get("gate_id")
    if not isinstance(gate_id, str) or not gate_id:
        raise GateNotFound(f"call {call_id!r} of run {run_id} needed no approval")
    return gate_id


async def gates_and_runs(gw: Gateway, gates: Iterable[str | Gate]) -> list[tuple[str, str | None]]:
    """Each gate's id and run, for :meth:`Gateway.decide_many`: a :class:`Gate` names its
    run, the runs of gates given by id are read (one round trip). :class:`GateNotFound`
    when a gate does not exist."""
    given = list(gates)
    ids = [g if isinstance(g, str) else g.gate_id for g in given]
    run_ids = [None if isinstance(g, str) else g.run_id for g in given]
    k = gw.keys
    unknown = [g for g in ids if not valid_gate_id(g, k)]
    asked = [i for i, r in enumerate(run_ids) if r is None]
    if asked and not unknown:
        async with gw.redis.pipeline(transaction=False) as pipe:
            for i in asked:
                pipe.hget(k.gate(ids[i]), "run_id")
            for i, r in zip(asked, await pipe.execute(), strict=True):
                run_ids[i] = r
        unknown = [g for g, r in zip(ids, run_ids, strict=True) if r is None]
    if unknown:
        shown = ", ".join(repr(g[:40]) for g in unknown[:5])
        raise GateNotFound(f"no gate {shown}; nothing was decided")
    return list(zip(ids, run_ids, strict=True))
