"""The model turn: call the model with the stored history, validate its calls, decide which
need a gate, and record the turn (RECORD_TURN)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai

from . import gating, messages, model_calls, provider_errors, turns
from .completions import (
    Completion,
    ModelResponseError,
    ToolCall,
)
from .exceptions import LeaseLost
from .gating import args_hash
from .script_replies import (
    ModelRead,
)
from .steps import (
    JobRef,
    RunnerState,
    _now,
)


class ModelTurn(RunnerState):
    """The ``model`` phase of a run."""

    _head_version: tuple[int, ...] | None
    _body_head: bytes

    def _head(self) -> bytes:
        """The request body up to the first history message, rebuilt when a toolset's tools
        change. The history is stored as the JSON of each message, and spliced in as it is:
        never decoded, never re-encoded (at 1,000 messages that was most of a model turn's
        CPU, measured)."""
        version = self.agent.tools_version
        if version != self._head_version:
            head: dict[str, Any] = {"model": self.model}
            tools = self.agent.openai_tools()
            if tools:
                head["tools"] = tools
            system = json.dumps({"role": "system", "content": self.agent.instructions})
            self._body_head = (json.dumps(head)[:-1] + ',"messages":[' + system).encode()
            self._head_version = version
        return self._body_head

    # --- phase: model -----------------------------------------------------------------
    async def _model_turn(
        self,
        run: dict[str, str],
        turn: int,
        fence: str,
        lost: asyncio.Event | None = None,
        read: ModelRead | None = None,
        job: JobRef | None = None,
        recorded: list[tuple[dict[str, str], dict[str, dict[str, str]] | None]] | None = None,
    ) -> dict[str, str] | None:
        """One model turn, recorded. ``recorded`` receives the new turn's hash (and its
        gates' when rules decided them all) when its calls run next: the tools phase runs
        from them, no read back."""
        run_id = run["run_id"]
        k = self.keys
        # Counted from the run's latest continuation (Gateway.continue_run).
        taken = turn - int(run.get("turns_from") or 0)
        if taken >= self.max_turns:
            await self.fail(
                run_id,
                f"stopped after {taken} model turns (MAX_TURNS): the agent kept calling tools",
                fence,
            )
            return None
        # The history and a look at the lease in one round trip: a worker that was paused
        # before this point (and taken over) stops here instead of paying for a model call
        # on a stale history. (Its writes would be refused anyway.)
        # Messages queued while the run worked join the history here, under the lease.
        if read is None:
            read = await self.scripts.read_for_model(run_id, fence)
        if read.fence != fence or read.lease_until <= 0:  # taken over, or released
            raise LeaseLost(run_id)
        if read.turn != str(turn) or read.phase != "model":
            return None  # cancelled meanwhile
        raw = read.history
        request = self.request_body(raw)
        try:
            completion = await self._complete_model(request, run_id, lost)
        except openai.APIError as exc:
            # Retried (429, 5xx, timeouts, connection errors) within OPENAI_RETRY_BUDGET.
            # Nothing of this turn was recorded: the run can be retried from here, unless
            # the provider refuses the history itself (provider_errors.classify).
            failure = provider_errors.api_failure(exc)
            await self.fail(run_id, failure.message, fence, retryable=failure.retryable)
            return None
        except ModelResponseError as exc:
            await self.fail(run_id, f"model API error: {exc}", fence, retryable=exc.fixable)
            return None
        if not completion.tool_calls:
            refused = turns.unusable_answer(completion)
            if refused is not None:
                await self.fail(run_id, refused, fence)
                return None
        calls = completion.tool_calls
        wire: list[dict[str, Any]] = []
        fields: list[str] = []
        plan: gating.GatePlan | None = None
        if calls:
            wire, fields, planned = self._plan_calls(turn + 1, calls, k.shard_of(run_id))
            states = {state for _, _, state in planned}
            if "needs_gate" in states and states <= {"needs_gate", "done"}:
                # Nothing runs before the gates: they open as the turn is recorded.
                gated = [(i, c) for i, c, state in planned if state == "needs_gate"]
                plan = await gating.plan_gates(
                    self.scripts,
                    self.agent,
                    run,
                    turn + 1,
                    [c for _, c in gated],
                    [i for i, _ in gated],
                    timeout=self.approval_timeout,
                    nudges=self.nudges,
                    routes=self.approval_routes,
                )
        # Stored with the provider's own fields, which go back in every later request.
        assistant = turns.assistant_message(completion, raw, wire)
        final, truncated = turns.final_text(completion)
        completed = json.dumps(
            {
                "run_id": run_id,
                "final": final,
                "truncated": truncated,
                # 0, or the turn of the run's latest continuation: one answer per leg.
                "turns_from": int(run.get("turns_from") or 0),
                "origin": json.loads(run.get("origin") or "{}"),
            }
        )
        after = await self.scripts.record_turn(
            run,
            turn,
            fence,
            assistant=json.dumps(assistant),
            done=not calls,
            final=final,
            completed=completed,
            now=_now(),
            fields=fields,
            gates=plan.gates if plan else (),
            top_run=plan.top_run if plan else None,
            job=job.fields if job else None,
        )
        if after.lost:
            raise LeaseLost(run_id)
        if plan is not None:
            await plan.count(self.scripts, after.gates)
        if job is not None and after.finished:
            job.finished = True
        if recorded is not None and calls and after.run is not None:
            if plan is None:
                recorded.append((dict(zip(fields[::2], fields[1::2], strict=True)), None))
            elif after.turn is not None:  # decided by rules or grants: the calls run now
                recorded.append((after.turn, after.gate_hashes))
        return after.run

    def request_body(self, history: list[bytes]) -> bytes:
        """The Chat Completions request for a history given as stored (each message's JSON)."""
        head = self._head()
        if not history:
            return head + b"]}"
        # One join, so one buffer of the body's size (a long history's body is megabytes).
        return b",".join([head, *history[:-1], history[-1] + b"]}"])

    async def _complete_model(
        self, request: bytes, run_id: str = "", lost: asyncio.Event | None = None
    ) -> Completion:
        """One completion, retried as :func:`agent_core.model_calls.complete` says."""
        return await model_calls.complete(
            self.endpoint, request, run_id, lost, self.model_retries, self.retry_budget
        )

    def _plan_calls(
        self, turn: int, calls: list[ToolCall], shard: int
    ) -> tuple[list[dict[str, Any]], list[str], list[tuple[int, dict[str, Any], str]]]:
        """Validate each call and decide whether it needs a gate (its gate id in the run's
        ``shard``); the calls as sent back, the turn hash's fields, and each call's index,
        record (as it will be read back) and state."""
        wire: list[dict[str, Any]] = []
        fields: list[str] = []
        planned: list[tuple[int, dict[str, Any], str]] = []
        order: list[str] = []
        taken = {c.id for c in calls if c.id}
        seen: set[str] = set()
        too_many = len(calls) > self.max_calls_per_turn
        for c in calls:
            cid = c.id
            if not cid or cid in seen:  # some servers omit or repeat ids
                cid = turns.new_call_id(taken | seen)
            seen.add(cid)
            order.append(cid)
            wire.append(
                {
                    "id": cid,
                    "type": "function",
                    # Sent back in the history: vLLM and llama.cpp parse it as JSON and fail
                    # the whole request on text that is not a JSON object.
                    "function": {
                        "name": c.name,
                        "arguments": turns.json_object_or_empty(c.arguments),
                    },
                    **c.extra,  # e.g. Gemini's thought signature, which must come back
                }
            )
            record: dict[str, Any] = {"id": cid, "name": c.name, "arguments": c.arguments}
            t = self.agent.get_tool(c.name)
            state, result = "ready", None
            if too_many:
                state = "done"
                result = messages.too_many_calls(len(calls), self.max_calls_per_turn)
            elif t is None:
                state = "done"
                result = messages.unknown_tool(c.name, self.agent.tool_names())
            else:
                try:
                    args = t.validate(c.arguments)
                except Exception as exc:
                    state, result = "done", messages.invalid_arguments(c.name, str(exc))
                else:
                    # The validated arguments (strict, defaults filled in) are what the rule
                    # sees, what the card shows, what the hash covers and what the tool gets.
                    record["args"] = args
                    if self.agent.requires_approval(t, args):
                        state = "needs_gate"
                        record["gate_id"] = self.keys.new_gate_id(shard)
                        # What a batch claim checks the approved hash against (Lua has
                        # no SHA-256): the hash of the arguments the gate shows.
                        record["args_hash"] = args_hash(args)
            stored = json.dumps(record)
            planned.append((len(order) - 1, json.loads(stored), state))
            fields += [f"call:{cid}", stored, f"state:{cid}", state]
            if result is not None:
                fields += [f"result:{cid}", result]
        fields += ["order", json.dumps(order)]
        return wire, fields, planned
