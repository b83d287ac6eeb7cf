"""One tool call: apply its gate's decision, claim it (at most once), run it, record it or
settle it as not run, or start a sub-agent's child run for it."""

from __future__ import annotations

import json
from typing import Any

from . import children, editing, gating, messages
from .agent import AgentTool
from .completions import (
    clean_text,
)
from .exceptions import LeaseLost
from .gating import args_hash
from .models import Gate, GateStatus
from .quorum import approvers_told
from .script_replies import (
    CallResult,
    Claim,
    ClaimOutcome,
    CompleteOutcome,
    OpenOutcome,
    SettleOutcome,
    SpawnOutcome,
)
from .steps import (
    EVENT_OUTPUT_CHARS,
    MAX_OUTPUT_CHARS,
    SPAWNED,
    RunnerState,
    _now,
    log,
)
from .stopping import new_attempt
from .tools import Tool


class ToolCalls(RunnerState):
    """The steps of one call of a tools turn."""

    async def _apply_gate(
        self,
        run: dict[str, str],
        turn: int,
        call: dict[str, Any],
        t: Tool,
        fence: str,
        gates: dict[str, dict[str, str]] | None = None,
    ) -> str | None:
        gid = call["gate_id"]
        h = gates[gid] if gates and gid in gates else None
        if h is None:
            h = await self.redis.hgetall(self.keys.gate(gid))
        gate = Gate.from_hash(h)
        if gate.status is GateStatus.PENDING:
            return None
        if gate.status is GateStatus.APPROVED:
            call, problem = editing.call_to_run(gate, call, t)  # the edited arguments, if any
            if problem is not None:
                return await self._settle(run, turn, call, problem, fence, gate.gate_id)
            # The call runs only with the arguments whose hash the approver saw (or wrote).
            seen = gate.decided_hash or gate.args_hash
            if seen != args_hash(call["args"]):
                changed = messages.args_changed(t.name)
                return await self._settle(run, turn, call, changed, fence, gate.gate_id)
            approval = approvers_told(gate.decided_by, gate.reason, gate.approvals)
            note = editing.told(gate)
            return await self._execute(run, turn, call, t, gate.gate_id, fence, approval, note)
        if gate.status is GateStatus.DENIED:
            text = messages.denied(t.name, gate.decided_by or "someone", gate.reason)
        elif gate.status is GateStatus.EXPIRED:
            text = messages.expired(t.name, gate.timeout)
        else:
            text = messages.cancelled(t.name, gate.decided_by or "")
        return await self._settle(run, turn, call, text, fence)

    async def _approval(
        self,
        gate_id: str,
        call: dict[str, Any],
        t: Tool,
        gates: dict[str, dict[str, str]] | None = None,
    ) -> tuple[dict[str, Any], list[tuple[str, str | None]] | None, str, str | None]:
        """For a claimed call: the call to run (its edited arguments, if any), who approved
        it and why (None unless approved), the edit's note and why it cannot run (or None)."""
        h = gates[gate_id] if gates and gate_id in gates else None
        if h is None:
            h = await self.redis.hgetall(self.keys.gate(gate_id))
        if h.get("status") != GateStatus.APPROVED.value:
            return call, None, "", None
        gate = Gate.from_hash(h)
        call, problem = editing.call_to_run(gate, call, t)
        approval = approvers_told(gate.decided_by, gate.reason, gate.approvals)
        return call, approval, editing.told(gate), problem

    async def _settle(
        self,
        run: dict[str, str],
        turn: int,
        call: dict[str, Any],
        text: str,
        fence: str,
        approved: str | None = None,
    ) -> str | None:
        """Record the result of a call that did not run; None when the run stopped.
        ``approved``: the gate that approved it (audited as not run)."""
        run_id = run["run_id"]
        res = await self.scripts.settle_call(
            run_id, turn, fence, call["id"], clean_text(text), gate_id=approved
        )
        if res is SettleOutcome.LOST:
            raise LeaseLost(run_id)
        return text if res is SettleOutcome.OK else None

    async def _execute(
        self,
        run: dict[str, str],
        turn: int,
        call: dict[str, Any],
        t: Tool,
        gate_id: str | None,
        fence: str,
        approval: list[tuple[str, str | None]] | None = None,
        note: str = "",
    ) -> str | None:
        """Run a call at most once: claimed before it starts, done after it ends.

        None when the run stopped (cancelled) before the call could start. ``approval`` (who
        approved, and why) adds the approver's reason to what the model is told; the event
        (and so the card) carries the tool's output alone.
        """
        if isinstance(t, AgentTool):
            return await self._spawn(run, turn, call, t, fence, note)
        run_id, cid = run["run_id"], call["id"]
        tkey = self.keys.turn(run_id, turn)
        # The attempt id is made once: a claim whose reply was lost, tried again, is told
        # "yours" instead of finding the call claimed (by itself) and reporting it in doubt.
        attempt = new_attempt()
        claim = await self._claim_call(run_id, turn, fence, cid, t.idempotent, attempt)
        if claim.outcome is ClaimOutcome.LOST:
            raise LeaseLost(run_id)
        if claim.outcome is ClaimOutcome.STOPPED:
            log.info("run %s is %s: %s not started", run_id, claim.state, t.name)
            return None
        if claim.outcome is ClaimOutcome.YOURS:
            log.info("run %s: the claim of %s was applied, its reply lost", run_id, t.name)
            claim = Claim(ClaimOutcome.OK, "")
        previous = claim.state
        if claim.outcome is not ClaimOutcome.OK and previous != "claimed":
            return str(await self.redis.hget(tkey, f"result:{cid}") or "")
        if claim.outcome is ClaimOutcome.OK and previous == "claimed":
            log.warning("run %s: re-running idempotent %s left in doubt", run_id, t.name)
        # Not OK and claimed before: a worker claimed this call and stopped before
        # reporting: never run it again (in doubt).
        told, r = await self._run_claimed(
            run, call, t, gate_id, approval, note, in_doubt=claim.outcome is not ClaimOutcome.OK
        )
        res = await self.scripts.complete_call(
            run_id, turn, fence, cid, told, r.event, gate_id=gate_id, outcome=r.outcome
        )
        if res is CompleteOutcome.LOST:
            log.warning(
                "run %s: result of %s discarded: this worker lost the run's lease while the "
                "call ran (the new owner reports it in doubt); outcome=%s",
                run_id,
                t.name,
                r.outcome,
            )
            raise LeaseLost(run_id)
        if res is not CompleteOutcome.OK:
            return str(await self.redis.hget(tkey, f"result:{cid}") or "")
        return told

    async def _run_claimed(
        self,
        run: dict[str, str],
        call: dict[str, Any],
        t: Tool,
        gate_id: str | None,
        approval: list[tuple[str, str | None]] | None = None,
        note: str = "",
        *,
        in_doubt: bool = False,
    ) -> tuple[str, CallResult]:
        """Run a call claimed for this worker (or, ``in_doubt``, report one another worker
        claimed and never finished): what the model reads, and the result to record."""
        run_id, cid = run["run_id"], call["id"]
        if in_doubt:
            output, ok = messages.in_doubt(t.name), False
        else:
            try:
                output = await t.call(call["args"])
                ok = True
            except Exception as exc:
                log.info("run %s: tool %s raised %s", run_id, t.name, type(exc).__name__)
                output, ok = messages.tool_raised(t.name, exc), False
        output = clean_text(output)
        if len(output) > MAX_OUTPUT_CHARS:
            output = (
                output[:MAX_OUTPUT_CHARS] + f"\n[output truncated at {MAX_OUTPUT_CHARS} characters]"
            )
        event = {
            "run_id": run_id,
            "call_id": cid,
            "gate_id": gate_id,
            "tool": t.name,
            "ok": ok,
            "in_doubt": in_doubt,
            "output": output[:EVENT_OUTPUT_CHARS],
            "origin": json.loads(run.get("origin") or "{}"),
        }
        told = (messages.with_approval(output, approval) if approval else output) + note
        outcome = "in_doubt" if in_doubt else "executed" if ok else "failed"
        return told, CallResult(cid, told, json.dumps(event)[:-1], gate_id, outcome)

    async def _claim_call(
        self, run_id: str, turn: int, fence: str, call_id: str, idempotent: bool, attempt: str
    ) -> Claim:
        """CLAIM_CALL; with ``claim_replicas``, then WAIT for that many replicas before the
        tool may start. A claim lost with its master (killed before replicating it) would
        let the promoted replica's next owner run the call again; once a replica has it,
        the call is reported in doubt instead. WAIT covers every write the master made
        before it, so a sub-agent's spawn is covered by its first tool's claim."""
        if self.claim_replicas <= 0:
            return await self.scripts.claim_call(
                run_id, turn, fence, call_id, idempotent=idempotent, attempt=attempt
            )
        claim, replicas = await self.scripts.claim_call_replicated(
            run_id,
            turn,
            fence,
            call_id,
            idempotent=idempotent,
            attempt=attempt,
            replicas=self.claim_replicas,
            wait_ms=self.claim_wait_ms,
        )
        ok = claim.outcome in (ClaimOutcome.OK, ClaimOutcome.YOURS)
        if ok and replicas < self.claim_replicas:
            log.error(
                "call %s of %s: its claim reached %s of %s replicas within %s ms; the tool "
                "runs anyway, and a failover now could run it again",
                call_id,
                self.keys.run(run_id),
                replicas,
                self.claim_replicas,
                self.claim_wait_ms,
            )
        return claim

    async def _spawn(
        self,
        run: dict[str, str],
        turn: int,
        call: dict[str, Any],
        t: AgentTool,
        fence: str,
        note: str = "",
    ) -> str | None:
        """Start the sub-agent's child run for this call (once); SPAWNED, or the call's
        result when it cannot start, or None when the run stopped."""
        run_id, k = run["run_id"], self.keys
        child = t.agent
        assert child is not None
        depth = int(run.get("depth") or 0) + 1
        if depth > self.max_depth:
            too_deep = messages.too_deep(t.name, self.max_depth)
            return await self._settle(run, turn, call, too_deep, fence, call.get("gate_id"))
        res = await children.spawn(
            self.scripts,
            run,
            turn,
            call,
            self.agent.name,
            child.name,
            depth,
            _now(),
            fence,
            note,
        )
        if res is SpawnOutcome.LOST:
            raise LeaseLost(run_id)
        if res is SpawnOutcome.STOPPED:
            return None
        if res is SpawnOutcome.STALE:  # settled meanwhile (a replay): its result is recorded
            return str(await self.redis.hget(k.turn(run_id, turn), f"result:{call['id']}") or "")
        return SPAWNED

    async def _open_gates(
        self,
        run: dict[str, str],
        turn: int,
        calls: list[dict[str, Any]],
        fence: str,
        indexes: list[int] | None = None,
    ) -> OpenOutcome:
        """Open one gate per call (see :func:`agent_core.gating.open_gates`)."""
        res = await gating.open_gates(
            self.scripts,
            self.agent,
            run,
            turn,
            calls,
            fence,
            indexes,
            timeout=self.approval_timeout,
            nudges=self.nudges,
            routes=self.approval_routes,
        )
        if res is OpenOutcome.LOST:
            raise LeaseLost(run["run_id"])
        return res
