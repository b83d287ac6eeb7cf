"""Advance one run as far as it can go: model turns, tool calls, gates.

A run is a small state machine persisted in Redis (``phase`` = ``model`` → ``tools`` → ``model``
… → ``done``). Every step is written before the next one starts, so a worker killed at any
point leaves a run that another worker resumes from Redis alone:

* ``model``: call the model with the history; persist the assistant message and its calls.
* ``tools``: run un-gated calls (claimed → done), open gates for gated ones and pause; on
  resume apply the decisions, then append one tool message per call id, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import openai
from openai import AsyncOpenAI
from redis.asyncio import Redis

from . import children, editing, gating, messages, model_calls, provider_errors, turns
from .agent import Agent, AgentTool
from .completions import (
    Completion,
    ModelResponseError,
    ToolCall,
    clean_text,
)
from .exceptions import LeaseLost
from .gating import args_hash
from .keys import Keys
from .model_http import ModelEndpoint
from .models import Gate, GateStatus
from .nudges import Nudges, check_agent
from .quorum import approvers_told
from .routes import ApprovalRoute
from .script_replies import (
    Began,
    CallResult,
    Claim,
    ClaimOutcome,
    CompleteOutcome,
    ModelRead,
    OpenOutcome,
    SettleOutcome,
    SpawnOutcome,
    WaitOutcome,
)
from .scripts import Scripts
from .stopping import Stopper, new_attempt
from .tools import Tool

log = logging.getLogger(__name__)

MAX_OUTPUT_CHARS = 100_000
EVENT_OUTPUT_CHARS = 2_000


def _now() -> str:
    return f"{time.time():.6f}"


# What _execute returns for a call that started a child run: its result comes later.
SPAWNED = "\x00spawned"


@dataclass
class JobRef:
    """The job a worker advances a run for: the step that pauses or finishes the run
    finishes it too (acked, lease released: RECORD_TURN), and says so in ``finished``."""

    stream: str
    group: str
    message_id: str
    finished: bool = False

    @property
    def fields(self) -> tuple[str, str, str]:
        return self.stream, self.group, self.message_id


class Runner:
    """Runs turns of one agent against an OpenAI-compatible Chat Completions endpoint.

    Every write goes through a script that checks the caller's fence (its lease on the run):
    when the lease is lost, :class:`LeaseLost` is raised and nothing more is written.
    """

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        agent: Agent,
        client: AsyncOpenAI,
        *,
        model: str,
        approval_timeout: float,
        events_maxlen: int = 100_000,
        max_turns: int = 30,
        max_calls_per_turn: int = 64,
        model_retries: int = 10,
        retry_budget: float = 120.0,
        max_depth: int = children.DEFAULT_MAX_DEPTH,
        claim_replicas: int = 0,
        claim_wait_ms: int = 1000,
        nudges: Nudges = Nudges(),
        approval_routes: Mapping[str, ApprovalRoute] | None = None,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.agent = agent
        self.client = client
        self.endpoint = ModelEndpoint(client)
        self.model = agent.model or model
        self.approval_timeout = agent.approval_timeout or approval_timeout
        # The settings' reminder and escalation; a step that could never fire is refused now.
        self.nudges = nudges
        check_agent(agent, self.approval_timeout, nudges)
        self.maxlen = events_maxlen
        self.max_turns = max_turns
        self.max_calls_per_turn = max_calls_per_turn
        self.model_retries = model_retries
        self.retry_budget = retry_budget
        self.max_depth = max_depth
        self.claim_replicas = claim_replicas
        self.claim_wait_ms = claim_wait_ms
        self.approval_routes = dict(approval_routes or {})
        self.scripts = Scripts(redis, keys)
        self.stopper = Stopper(redis, keys)
        # The runners of the other agents this worker serves, by agent name: a job names a
        # run, and the run names its agent.
        self.peers: dict[str, Runner] = {}
        self._head_version: tuple[int, ...] | None = None
        self._body_head = b""

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

    # --- driving ----------------------------------------------------------------------
    async def advance(
        self,
        run_id: str,
        fence: str,
        lost: asyncio.Event | None = None,
        began: Began | None = None,
        job: JobRef | None = None,
    ) -> None:
        """Take the run as far as it goes without a human; return when paused or finished.

        ``fence`` is the caller's lease on the run (see :mod:`agent_core.scripts`); ``lost``,
        set by the caller's heartbeat when a renewal was refused, stops a model call (and its
        retries) at once. Raises :class:`LeaseLost` when the lease is no longer the caller's.
        ``began``: BEGIN_RUN's reply when the caller took it with the lease (ACQUIRE_LEASE),
        followed by the hash of the turn a resume job resumes when ACQUIRE_LEASE read it.
        """
        if began is None:
            began = await self.scripts.begin_run(run_id, fence, self.agent.name, _now())
        if began.status == "":
            log.warning("job for unknown run %s ignored", run_id)
            return
        if began.status == "lost":
            raise LeaseLost(run_id)
        if began.status != "running" or began.run is None:
            return
        run, turn_hash = began.run, began.turn
        if run.get("parent") and await self._orphaned(run, fence):
            return
        name = run.get("agent") or self.agent.name  # none named: this worker's first agent
        runner = self if name == self.agent.name else self.peers.get(name)
        if runner is None:
            served = ", ".join(sorted({self.agent.name, *self.peers})) or "none"
            await self.fail(
                run_id,
                f"no agent named {name!r} is configured on this worker (it serves {served}): "
                "add it to AGENTS on the workers, or start runs of a configured agent",
                fence,
            )
            return
        await runner.drive(run, fence, lost, turn_hash, began=began, job=job)

    async def drive(
        self,
        run: dict[str, str] | None,
        fence: str,
        lost: asyncio.Event | None = None,
        turn_hash: dict[str, str] | None = None,
        *,
        began: Began | None = None,
        job: JobRef | None = None,
    ) -> None:
        """Advance a run this worker has begun (see :meth:`advance`) until it pauses.
        ``turn_hash``: the run's current turn, read with the lease (a resume job's turn);
        ``began``: what ACQUIRE_LEASE read with it (the history for a model turn, the
        turn's gates and the calls it claimed); ``job``: finished by the step that pauses
        or finishes the run, when that is a model turn's record."""
        # Each step's script hands back the run as it left it: no re-read between steps. A
        # turn's last step also hands over what the next model call reads (``read``).
        read: list[ModelRead] = [began.read] if began is not None and began.read else []
        gates = began.gates if began is not None else None
        claimed = began.claimed if began is not None else frozenset()
        while run is not None and run.get("status") == "running":
            phase, turn = run.get("phase"), int(run.get("turn") or 0)
            if phase == "model":
                recorded: list[tuple[dict[str, str], dict[str, dict[str, str]] | None]] = []
                run = await self._model_turn(
                    run, turn, fence, lost, read.pop() if read else None, job, recorded
                )
                if recorded:  # the turn (and its gates) as just written: not read back
                    (turn_hash, gates), claimed = recorded[0], frozenset()
                    continue
            elif phase == "tools":
                run = await self._tools_turn(run, turn, fence, read, turn_hash, gates, claimed)
            else:
                return
            turn_hash, gates, claimed = None, None, frozenset()  # read for the first step only

    async def _orphaned(self, run: dict[str, str], fence: str) -> bool:
        """A child run whose parent finished (cancelled, failed) while the cascade did not
        reach it (a crash in between) is cancelled here, before it does anything more."""
        status, by = await self.redis.hmget(
            self.keys.run(run["parent"]), ["status", "cancelled_by"]
        )
        if status not in (None, "completed", "failed", "cancelled"):
            return False
        with contextlib.suppress(Exception):
            await self.stopper.cancel(
                run["run_id"],
                by or "",
                f"its parent run {run['parent']} is {status or 'gone'}",
                new_attempt(),
                parent_failed=status == "failed",
            )
        return True

    async def fail(self, run_id: str, error: str, fence: str, *, retryable: bool = False) -> bool:
        """Fail a run that has not finished, closing its pending gates and cancelling its
        sub-agents' runs (:meth:`Stopper.fail`); True if it moved. Only the holder of the
        run's lease can; :class:`LeaseLost` otherwise."""
        return await self.stopper.fail(run_id, error, fence, retryable=retryable)

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

    def request_body(self, history: list[str]) -> bytes:
        """The Chat Completions request for a history given as stored (each message's JSON)."""
        head = self._head()
        if not history:
            return head + b"]}"
        return b"".join((head, b",", ",".join(history).encode(), b"]}"))

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
