"""Advance one run as far as it can go: model turns, tool calls, gates.

A run is a small state machine persisted in Redis (``phase`` = ``model`` → ``tools`` → ``model``
… → ``done``). Every step is written before the next one starts, so a worker killed at any
point leaves a run that another worker resumes from Redis alone:

* ``model``: call the model with the history; persist the assistant message and its calls.
* ``tools``: run un-gated calls (claimed → done), open gates for gated ones and pause; on
  resume apply the decisions, then append one tool message per call id, in order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any

import openai
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion
from redis.asyncio import Redis

from . import messages, scripts
from .agent import Agent
from .gateway import new_gate_id, pairs
from .keys import Keys
from .models import Gate, GateStatus
from .tools import Tool

log = logging.getLogger(__name__)

MAX_OUTPUT_CHARS = 100_000
EVENT_OUTPUT_CHARS = 2_000


def args_hash(args: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of the arguments (what the approver saw)."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _now() -> str:
    return f"{time.time():.6f}"


class Runner:
    """Runs turns of one agent against an OpenAI-compatible Chat Completions endpoint."""

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
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.agent = agent
        self.client = client
        self.model = agent.model or model
        self.approval_timeout = agent.approval_timeout or approval_timeout
        self.maxlen = events_maxlen
        self.max_turns = max_turns
        self._begin = redis.register_script(scripts.BEGIN_RUN)
        self._record = redis.register_script(scripts.RECORD_TURN)
        self._claim = redis.register_script(scripts.CLAIM_CALL)
        self._open = redis.register_script(scripts.OPEN_GATES)
        self._finish = redis.register_script(scripts.FINISH_TURN)
        self._fail = redis.register_script(scripts.FAIL_RUN)
        self._tools_param = agent.openai_tools()

    # --- driving ----------------------------------------------------------------------
    async def advance(self, run_id: str) -> None:
        """Take the run as far as it goes without a human; return when paused or finished."""
        k = self.keys
        began = await self._begin(
            keys=[k.run(run_id), k.events()], args=[self.maxlen, self.agent.name, _now()]
        )
        if began[0] == "":
            log.warning("job for unknown run %s ignored", run_id)
            return
        if began[0] != "running":
            return
        run: dict[str, str] | None = pairs(began[1])
        # Each step's script hands back the run as it left it: no re-read between steps.
        while run is not None and run.get("status") == "running":
            phase, turn = run.get("phase"), int(run.get("turn") or 0)
            if phase == "model":
                run = await self._model_turn(run, turn)
            elif phase == "tools":
                run = await self._tools_turn(run, turn)
            else:
                return

    async def fail(self, run_id: str, error: str) -> bool:
        """Fail a run that has not finished, recording the error; True if it moved."""
        k = self.keys
        origin = await self.redis.hget(k.run(run_id), "origin") or "{}"
        data = json.dumps({"run_id": run_id, "error": error, "origin": json.loads(origin)})
        moved = await self._fail(
            keys=[k.run(run_id), k.events(), k.finished()],
            args=[error, self.maxlen, data, _now()],
        )
        return bool(moved)

    # --- phase: model -----------------------------------------------------------------
    async def _model_turn(self, run: dict[str, str], turn: int) -> dict[str, str] | None:
        run_id = run["run_id"]
        k = self.keys
        if turn >= self.max_turns:
            await self.fail(
                run_id,
                f"stopped after {turn} model turns (MAX_TURNS): the agent kept calling tools",
            )
            return None
        history = [json.loads(m) for m in await self.redis.lrange(k.history(run_id), 0, -1)]
        request: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "system", "content": self.agent.instructions}, *history],
        }
        if self._tools_param:
            request["tools"] = self._tools_param
        try:
            # Not chat.completions.create(): its parameter transform walks every message in
            # Python (~160 ms of event-loop time at 1,000 messages, measured); the history
            # is already plain JSON. Same endpoint, retries and errors.
            completion = await self.client.post(
                "/chat/completions", body=request, cast_to=ChatCompletion
            )
        except openai.APIError as exc:
            # The client already retried 429/5xx/connection errors with backoff.
            status = getattr(exc, "status_code", None)
            detail = f"HTTP {status}: " if status else ""
            await self.fail(run_id, f"model API error ({type(exc).__name__}) {detail}{exc.message}")
            return None
        if not completion.choices:
            await self.fail(run_id, "model API error: the response had no choices")
            return None
        msg = completion.choices[0].message
        calls = list(msg.tool_calls or [])
        assistant: dict[str, Any] = {"role": "assistant", "content": msg.content}
        fields: list[str] = []
        if calls:
            assistant["tool_calls"], fields = self._plan_calls(run_id, turn + 1, calls)
        final = msg.content or ""
        completed = json.dumps(
            {"run_id": run_id, "final": final, "origin": json.loads(run.get("origin") or "{}")}
        )
        after = await self._record(
            keys=[
                k.run(run_id),
                k.history(run_id),
                k.turn(run_id, turn + 1),
                k.events(),
                k.finished(),
            ],
            args=[
                turn,
                json.dumps(assistant),
                "tools" if calls else "done",
                final,
                self.maxlen,
                completed,
                _now(),
                *fields,
            ],
        )
        return pairs(after) if after else None

    def _plan_calls(
        self, run_id: str, turn: int, calls: list[Any]
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """Validate each call and decide whether it needs a gate; the turn hash's fields."""
        wire: list[dict[str, Any]] = []
        fields: list[str] = []
        order: list[str] = []
        seen: set[str] = set()
        for n, c in enumerate(calls):
            fn = getattr(c, "function", None)
            name = getattr(fn, "name", "") or ""
            raw = getattr(fn, "arguments", "") or ""
            cid = c.id or f"call_{turn}_{n}"
            if cid in seen:  # some servers repeat ids; every call needs its own tool message
                cid = f"{cid}_{n}"
            seen.add(cid)
            order.append(cid)
            wire.append(
                {"id": cid, "type": "function", "function": {"name": name, "arguments": raw}}
            )
            record: dict[str, Any] = {"id": cid, "name": name, "arguments": raw}
            t = self.agent.get_tool(name)
            state, result = "ready", None
            if t is None:
                state = "done"
                result = messages.unknown_tool(name, [x.name for x in self.agent.tools])  # type: ignore[union-attr]
            else:
                try:
                    args = t.validate(raw)
                except Exception as exc:
                    state, result = "done", messages.invalid_arguments(name, str(exc))
                else:
                    record["args"] = args
                    if self.agent.requires_approval(t, args):
                        state = "needs_gate"
                        record["gate_id"] = new_gate_id()
            fields += [f"call:{cid}", json.dumps(record), f"state:{cid}", state]
            if result is not None:
                fields += [f"result:{cid}", result]
        fields += ["order", json.dumps(order)]
        return wire, fields

    # --- phase: tools -----------------------------------------------------------------
    async def _tools_turn(self, run: dict[str, str], turn: int) -> dict[str, str] | None:
        run_id = run["run_id"]
        k = self.keys
        th = await self.redis.hgetall(k.turn(run_id, turn))
        order: list[str] = json.loads(th.get("order") or "[]")
        results: dict[str, str] = {}
        to_gate: list[dict[str, Any]] = []
        for cid in order:
            call = json.loads(th[f"call:{cid}"])
            state = th.get(f"state:{cid}")
            t = self.agent.get_tool(call["name"])
            if state == "done":
                results[cid] = th.get(f"result:{cid}", "")
            elif state == "needs_gate":
                to_gate.append(call)
            elif t is None:  # the agent lost the tool between turns (redeploy)
                results[cid] = await self._settle(
                    run, turn, call, messages.unknown_tool(call["name"], [])
                )
            elif state == "ready":
                results[cid] = await self._execute(run, turn, call, t, None)
            elif state == "claimed":
                results[cid] = await self._execute(run, turn, call, t, call.get("gate_id"))
            elif state == "gated":
                out = await self._apply_gate(run, turn, call, t)
                if out is None:
                    return None  # still pending: the resume job comes with the decision
                results[cid] = out
        if to_gate:
            await self._open_gates(run, turn, to_gate)
            return None
        after = await self._finish(
            keys=[k.run(run_id), k.history(run_id)],
            args=[
                turn,
                _now(),
                *(
                    json.dumps({"role": "tool", "tool_call_id": c, "content": results[c]})
                    for c in order
                ),
            ],
        )
        return pairs(after) if after else None

    async def _apply_gate(
        self, run: dict[str, str], turn: int, call: dict[str, Any], t: Tool
    ) -> str | None:
        h = await self.redis.hgetall(self.keys.gate(call["gate_id"]))
        gate = Gate.from_hash(h)
        if gate.status is GateStatus.PENDING:
            return None
        if gate.status is GateStatus.APPROVED:
            if gate.args_hash != args_hash(call["args"]):
                return await self._settle(run, turn, call, messages.args_changed(t.name))
            return await self._execute(run, turn, call, t, gate.gate_id)
        if gate.status is GateStatus.DENIED:
            text = messages.denied(t.name, gate.decided_by or "someone", gate.reason)
        elif gate.status is GateStatus.EXPIRED:
            text = messages.expired(t.name, gate.timeout)
        else:
            text = messages.cancelled(t.name, gate.decided_by or "")
        return await self._settle(run, turn, call, text)

    async def _settle(self, run: dict[str, str], turn: int, call: dict[str, Any], text: str) -> str:
        """Record the result of a call that did not run."""
        cid = call["id"]
        await self.redis.hset(
            self.keys.turn(run["run_id"], turn),
            mapping={f"state:{cid}": "done", f"result:{cid}": text},
        )
        return text

    async def _execute(
        self,
        run: dict[str, str],
        turn: int,
        call: dict[str, Any],
        t: Tool,
        gate_id: str | None,
    ) -> str:
        """Run a call at most once: claimed before it starts, done after it ends."""
        run_id, cid = run["run_id"], call["id"]
        tkey = self.keys.turn(run_id, turn)
        claim, previous = await self._claim(keys=[tkey], args=[cid, "1" if t.idempotent else "0"])
        in_doubt = False
        if claim == "ok":
            if previous == "claimed":
                log.warning("run %s: re-running idempotent %s left in doubt", run_id, t.name)
            try:
                output = await t.call(call["args"])
                ok = True
            except Exception as exc:
                log.info("run %s: tool %s raised %s", run_id, t.name, type(exc).__name__)
                output, ok = messages.tool_raised(t.name, exc), False
        elif previous == "claimed":
            # A worker claimed this call and died before reporting: never run it again.
            output, ok, in_doubt = messages.in_doubt(t.name), False, True
        else:
            return await self.redis.hget(tkey, f"result:{cid}") or ""
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
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(tkey, mapping={f"state:{cid}": "done", f"result:{cid}": output})
            pipe.xadd(
                self.keys.events(),
                {"type": "tool.executed", "run_id": run_id, "data": json.dumps(event)},
                maxlen=self.maxlen,
                approximate=True,
            )
            await pipe.execute()
        return output

    async def _open_gates(
        self, run: dict[str, str], turn: int, calls: list[dict[str, Any]]
    ) -> None:
        run_id = run["run_id"]
        k = self.keys
        origin = json.loads(run.get("origin") or "{}")
        timeout = self.approval_timeout
        args: list[Any] = [turn, self.maxlen]
        gate_keys: list[str] = []
        for call in calls:
            t = self.agent.get_tool(call["name"])
            assert t is not None
            gid = call["gate_id"]
            digest = args_hash(call["args"])
            fields = {  # created_at and deadline are added by the script (Redis clock)
                "gate_id": gid,
                "run_id": run_id,
                "call_id": call["id"],
                "turn": str(turn),
                "tool": t.name,
                "description": t.description,
                "args": json.dumps(call["args"], ensure_ascii=False),
                "args_hash": digest,
                "status": "pending",
                "agent": self.agent.name,
                "requested_by": run.get("requested_by", ""),
                "origin": run.get("origin") or "{}",
                "timeout": str(timeout),
                "nested": "0",
            }
            event = {
                "gate_id": gid,
                "run_id": run_id,
                "call_id": call["id"],
                "turn": turn,
                "tool": t.name,
                "description": t.description,
                "args": call["args"],
                "args_hash": digest,
                "agent": self.agent.name,
                "requested_by": run.get("requested_by", ""),
                "origin": origin,
                "timeout": timeout,
                "nested": False,
            }
            # The script appends created_at and deadline and closes the object.
            args += [gid, str(timeout), json.dumps(fields), json.dumps(event)[:-1]]
            gate_keys.append(k.gate(gid))
        await self._open(
            keys=[
                k.run(run_id),
                k.turn(run_id, turn),
                k.deadlines(),
                k.events(),
                k.run_gates(run_id),
                *gate_keys,
            ],
            args=args,
        )
