"""A tools turn: run the calls claimed as one batch, the others one by one, open gates and
pause, wait for sub-agents, or finish the turn (FINISH_TURN)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from . import messages
from .agent import AgentTool
from .exceptions import LeaseLost
from .gating import args_hash
from .models import Gate
from .quorum import approvers_told
from .script_replies import (
    CallResult,
    CompleteOutcome,
    ModelRead,
    OpenOutcome,
    WaitOutcome,
)
from .steps import (
    SPAWNED,
    _now,
    log,
)
from .tool_calls import ToolCalls


class ToolsTurn(ToolCalls):
    """The ``tools`` phase of a run."""

    # --- phase: tools -----------------------------------------------------------------
    async def _tools_turn(
        self,
        run: dict[str, str],
        turn: int,
        fence: str,
        read: list[ModelRead] | None = None,
        th: dict[str, str] | None = None,
        gates: dict[str, dict[str, str]] | None = None,
        claimed: frozenset[str] = frozenset(),
    ) -> dict[str, str] | None:
        """``th``, ``gates`` and ``claimed``: the turn's hash, its gates' hashes (by id) and
        the calls claimed for this worker in one batch, when ACQUIRE_LEASE read them."""
        run_id = run["run_id"]
        k = self.keys
        if th is None:
            th = await self.redis.hgetall(k.turn(run_id, turn))
        order: list[str] = json.loads(th.get("order") or "[]")
        results: dict[str, str] = {}
        # The batch's results, recorded by FINISH_TURN (or one by one if the turn waits).
        done: list[CallResult] = []
        if claimed:
            batch = [(c, json.loads(th[f"call:{c}"])) for c in order if c in claimed]
            ran = await self._run_batch(run, turn, batch, gates or {}, fence)
            for cid, told, result in ran:
                results[cid] = told
                if result is not None:
                    done.append(result)
        to_gate: list[tuple[int, dict[str, Any]]] = []
        waiting = False  # for a child run (a sub-agent) to answer
        stopped = False
        for index, cid in enumerate(order):
            if cid in results:
                continue
            call = json.loads(th[f"call:{cid}"])
            state = th.get(f"state:{cid}")
            t = self.agent.get_tool(call["name"])
            out: str | None
            if state == "done":
                out = th.get(f"result:{cid}", "")
            elif state == "child":
                waiting = True
                continue
            elif state == "needs_gate":
                to_gate.append((index, call))
                continue
            elif t is None:  # the agent lost the tool between turns (redeploy)
                out = await self._settle(
                    run, turn, call, messages.unknown_tool(call["name"], []), fence
                )
            elif state == "ready":
                out = await self._execute(run, turn, call, t, None, fence)
            elif state == "claimed":
                gate_id = call.get("gate_id")
                approval, note, problem = None, "", None
                if gate_id:  # an edited approval runs its edited arguments, never the original
                    call, approval, note, problem = await self._approval(gate_id, call, t, gates)
                if problem is not None:  # approved, and not run: audited as such
                    out = await self._settle(run, turn, call, problem, fence, gate_id)
                else:
                    out = await self._execute(run, turn, call, t, gate_id, fence, approval, note)
            elif state == "gated":
                gated = await self._apply_gate(run, turn, call, t, fence, gates)
                if gated is None:
                    stopped = True  # still pending: the resume job comes with the decision
                    break
                out = gated
            else:
                out = None
            if out is None:
                stopped = True  # the run stopped (cancelled): nothing more starts
                break
            if out is SPAWNED:
                waiting = True
                continue
            results[cid] = out
        if done and (stopped or to_gate or waiting):
            await self._complete_each(run_id, turn, fence, done)
        if stopped:
            return None
        if to_gate:
            opened = await self._open_gates(
                run, turn, [c for _, c in to_gate], fence, [i for i, _ in to_gate]
            )
            if opened is OpenOutcome.DECIDED:  # approver rules decided every one: no pause
                return await self._tools_turn(run, turn, fence, read)
            return None
        if waiting:
            res = await self.scripts.wait_children(run_id, turn, fence, _now())
            if res is WaitOutcome.LOST:
                raise LeaseLost(run_id)
            if res is WaitOutcome.ORPHANED:  # left by a failure, the run continued since
                for c in await self.stopper.cancel_orphans(run_id, turn):
                    lost_text = messages.sub_agent_lost(c["name"])
                    if await self._settle(run, turn, c, lost_text, fence) is None:
                        return None
                return await self._tools_turn(run, turn, fence, read)
            if res is WaitOutcome.GO:  # every child answered meanwhile: their results are in
                return await self._tools_turn(run, turn, fence, read)
            return None  # the last child to finish enqueues the resume job
        after = await self.scripts.finish_turn(
            run_id,
            turn,
            fence,
            _now(),
            [json.dumps({"role": "tool", "tool_call_id": c, "content": results[c]}) for c in order],
            results=done,
        )
        if after.lost:
            for r in done:
                log.warning(
                    "run %s: result of %s discarded: this worker lost the run's lease while "
                    "the call ran (the new owner reports it in doubt); outcome=%s",
                    run_id,
                    json.loads(th[f"call:{r.call_id}"])["name"],
                    r.outcome,
                )
            raise LeaseLost(run_id)
        if after.read is not None and read is not None:
            read.append(after.read)
        return after.run

    async def _run_batch(
        self,
        run: dict[str, str],
        turn: int,
        batch: list[tuple[str, dict[str, Any]]],
        gates: dict[str, dict[str, str]],
        fence: str,
    ) -> list[tuple[str, str, CallResult | None]]:
        """Run the calls ACQUIRE_LEASE claimed as one batch, together (a turn's tool calls
        are parallel calls, as the OpenAI API, the Agents SDK and LangGraph's ToolNode
        treat them): each call's id, what the model reads and its result to record (None
        when it was settled here, not run: a check failed after the claim)."""
        out: list[tuple[str, str, CallResult | None]] = []
        starts: list[tuple[str, Any]] = []
        for cid, call in batch:
            t = self.agent.get_tool(call["name"])
            h = gates.get(call.get("gate_id") or "")
            gate = Gate.from_hash(h) if h else None
            problem = None
            if t is None:
                problem = messages.unknown_tool(call["name"], [])
            elif isinstance(t, AgentTool):  # never claimed so (the batch rule names them)
                problem = messages.sub_agent_lost(t.name)
            elif gate is None or (gate.decided_hash or gate.args_hash) != args_hash(call["args"]):
                problem = messages.args_changed(t.name)  # the script checked it: never
            if problem is not None or t is None or gate is None:
                # Settled as not run, before any call of the batch starts.
                told = await self._settle(run, turn, call, problem or "", fence, call["gate_id"])
                if told is None:
                    return []  # the run stopped: nothing starts
                out.append((cid, told, None))
                continue
            approval = approvers_told(gate.decided_by, gate.reason, gate.approvals)
            starts.append((cid, self._run_claimed(run, call, t, gate.gate_id, approval)))
        ran = await asyncio.gather(*(start for _, start in starts))
        for (cid, _), (told, result) in zip(starts, ran, strict=True):
            out.append((cid, told, result))
        return out

    async def _complete_each(
        self, run_id: str, turn: int, fence: str, done: list[CallResult]
    ) -> None:
        """COMPLETE_CALL for each result of a batch whose turn does not finish now."""
        for r in done:
            res = await self.scripts.complete_call(
                run_id,
                turn,
                fence,
                r.call_id,
                r.result,
                r.event,
                gate_id=r.gate_id,
                outcome=r.outcome,
            )
            if res is CompleteOutcome.LOST:
                raise LeaseLost(run_id)
