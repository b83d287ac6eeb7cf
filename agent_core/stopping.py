"""Stopping a run: a cancel (a person's, or its parent's stopping) and a failure (by the
worker holding its lease), each one script that closes the run's gates and settles the calls
of its turn, followed by the cascade to the run's sub-agents' runs.

Both scripts recognise their own earlier effect (invariant 11): the caller picks an attempt
id once per logical call, the script records it with the change, and a re-run of the same
attempt (redis-py retrying after a reply lost to a dropped connection) answers as the first
run did instead of "already finished", so the caller goes on with the cascade and tells the
truth. As in :mod:`agent_core.scripts`: each script names its KEYS and ARGV in a header
comment, and every key arrives in KEYS.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import time
from typing import Any

from redis.asyncio import Redis

from . import messages
from .children import parent_keys
from .completions import clean_text, redact_secrets
from .exceptions import InvalidState, LeaseLost, RunNotFound
from .keys import Keys
from .scripts import _HELPERS

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 2_000

# Fail a run that is not finished yet, closing its pending gates (their cards say why).
# Only the lease holder may fail a run. A retryable failure (the model call kept failing)
# keeps the phase it failed in, so that Gateway.retry_run continues from there.
# A failure in the tools phase also closes the current turn's calls that did not run, so
# that no later continuation or retry runs them on an approval given before the failure:
# calls not started (ready, gated and approved, or whose gate this failure closed) are
# recorded as not run (ARGV[9]), a call claimed by a worker that never reported as in doubt
# (ARGV[10]). A call whose gate was denied or expired keeps its decision (the model is told
# it on the next turn); a sub-agent's call is settled by its child's cancel (Stopper.fail
# starts it; a crash before it is made good by Stopper.cancel_orphans). The run.failed
# event lists the approved gates whose calls never ran (`never_ran`) and those in doubt
# (`in_doubt`), so that their cards stop saying "Running…".
# KEYS[1] run hash, KEYS[2] events stream, KEYS[3] finished-runs zset, KEYS[4] deadlines
# zset, KEYS[5] run gates set, KEYS[6] active-runs zset, KEYS[7] parent run hash, KEYS[8]
# parent turn hash, KEYS[9] jobs stream (a child run's failure is its parent call's result;
# any run: KEYS[1] twice and the shard's jobs stream), KEYS[10] the current turn's hash,
# KEYS[11..] every gate hash of the run (the members of KEYS[5], in ARGV order)
# ARGV[1] fence, ARGV[2] error text, ARGV[3] run.failed event data JSON (a JSON object; the
# two lists are added to it), ARGV[4] now, ARGV[5] run id, ARGV[6] '1' when the failure is
# retryable, ARGV[7] what the parent's model is told ('' for a run without parent),
# ARGV[8] the current turn (guard), ARGV[9] the result of a call that did not run,
# ARGV[10] the result of a call in doubt, ARGV[11] this call's attempt id (recorded as
# `fail_attempt`), ARGV[12..] gate ids (ARGV[i + 1] is KEYS[i]'s)
# Returns 'failed' (also to a re-run of the same attempt: its first reply was lost) |
# 'finished' (already finished) | 'lost' | 'retry' (a gate was opened or a turn recorded
# since the caller looked: look again) | 'missing' as status replies.
FAIL_RUN = (
    _HELPERS
    + """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {ok = 'missing'} end
if finished(st) then
  if st == 'failed' and (ARGV[11] or '') ~= ''
    and redis.call('HGET', KEYS[1], 'fail_attempt') == ARGV[11] then
    return {ok = 'failed'}
  end
  return {ok = 'finished'}
end
if not holds(KEYS[1], ARGV[1]) then return {ok = 'lost'} end
if redis.call('SCARD', KEYS[5]) ~= #KEYS - 10
  or (redis.call('HGET', KEYS[1], 'turn') or '0') ~= ARGV[8] then
  return {ok = 'retry'}
end
local nowstr = string.format('%.6f', now())
local origin = redis.call('HGET', KEYS[1], 'origin') or '{}'
local reason = 'the run failed: ' .. ARGV[2]
local gate_keys = {}
for i = 11, #KEYS do
  gate_keys[ARGV[i + 1]] = KEYS[i]
  if redis.call('HGET', KEYS[i], 'status') == 'pending' then
    close_gate(KEYS[i], ARGV[i + 1], KEYS[4], KEYS[2], ARGV[5], '', reason, nowstr, origin,
      ',"run_failed":true', {'closed_by_failure', '1'})
  end
end
local phase = redis.call('HGET', KEYS[1], 'phase') or 'model'
local never, doubt = {}, {}
if phase == 'tools' then
  local order = cjson.decode(redis.call('HGET', KEYS[10], 'order') or '[]')
  for _, cid in ipairs(order) do
    local s = redis.call('HGET', KEYS[10], 'state:' .. cid)
    local gid = redis.call('HGET', KEYS[10], 'gate:' .. cid)
    local gs = nil
    if gid and gate_keys[gid] then gs = redis.call('HGET', gate_keys[gid], 'status') end
    if s == 'claimed' then
      redis.call('HSET', KEYS[10], 'state:' .. cid, 'done', 'result:' .. cid, ARGV[10])
      if gid then doubt[#doubt + 1] = gid end
    elseif s == 'ready' or s == 'needs_gate'
      or (s == 'gated' and gs ~= 'denied' and gs ~= 'expired') then
      redis.call('HSET', KEYS[10], 'state:' .. cid, 'done', 'result:' .. cid, ARGV[9])
      if gs == 'approved' then never[#never + 1] = gid end
    end
  end
end
local function ids(list)
  if #list == 0 then return '[]' end
  return cjson.encode(list)
end
local head = string.sub(ARGV[3], 1, -2)
local data = head .. (head == '{' and '' or ',') .. '"never_ran":' .. ids(never)
  .. ',"in_doubt":' .. ids(doubt) .. '}'
redis.call('HSET', KEYS[1], 'status', 'failed', 'error', ARGV[2], 'phase', 'done',
  'failed_phase', phase, 'retryable', ARGV[6], 'fail_attempt', ARGV[11] or '',
  'pending', 0, 'children_pending', 0, 'updated_at', ARGV[4])
redis.call('XADD', KEYS[2], '*', 'type', 'run.failed', 'run_id', ARGV[5], 'data', data)
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[5])
redis.call('ZREM', KEYS[6], ARGV[5])
if ARGV[7] ~= '' then report_child(KEYS[1], KEYS[7], KEYS[8], KEYS[9], KEYS[2], ARGV[7], false) end
return {ok = 'failed'}
"""
)

# Cancel a run and every pending gate it has. Afterwards no call of the run starts (claims
# check the status); calls of the current turn are sorted into never-ran and running.
# KEYS[1] run hash, KEYS[2] deadlines zset, KEYS[3] events stream, KEYS[4] run gates set,
# KEYS[5] finished-runs zset, KEYS[6] active-runs zset, KEYS[7] the current turn's hash,
# KEYS[8] parent run hash, KEYS[9] parent turn hash, KEYS[10] jobs stream (as in FAIL_RUN),
# KEYS[11..] every gate hash of the run (the members of KEYS[4], in ARGV order)
# ARGV[1] by, ARGV[2] reason, ARGV[3] run id, ARGV[4] the current turn (guard),
# ARGV[5] what the parent's model is told ('' for a run without parent), ARGV[6] this
# call's attempt id (recorded as `cancel_attempt`), ARGV[7..] gate ids
# Returns {'cancelled'} (also to a re-run of the same attempt: its first reply was lost) |
# {'finished', status} | {'missing'} | {'retry'} (a gate was opened or a turn recorded since
# the caller looked: look again).
CANCEL_RUN = (
    _HELPERS
    + """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {'missing'} end
if finished(st) then
  if st == 'cancelled' and ARGV[6] ~= ''
    and redis.call('HGET', KEYS[1], 'cancel_attempt') == ARGV[6] then
    return {'cancelled'}
  end
  return {'finished', st}
end
if redis.call('SCARD', KEYS[4]) ~= #KEYS - 10
  or (redis.call('HGET', KEYS[1], 'turn') or '0') ~= ARGV[4] then
  return {'retry'}
end
local t = redis.call('TIME')
local nowstr = string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000)
local origin = redis.call('HGET', KEYS[1], 'origin') or '{}'
local never, running = {}, {}
for i = 11, #KEYS do
  local gid = ARGV[i - 4]
  local gs = redis.call('HGET', KEYS[i], 'status')
  if gs == 'pending' then
    close_gate(KEYS[i], gid, KEYS[2], KEYS[3], ARGV[3], ARGV[1], ARGV[2], nowstr, origin, '', {})
  elseif gs == 'approved' then
    local g = redis.call('HMGET', KEYS[i], 'turn', 'call_id')
    if g[1] == ARGV[4] then
      local cs = redis.call('HGET', KEYS[7], 'state:' .. g[2])
      if cs == 'claimed' or cs == 'child' then  -- running, or its sub-agent's run is
        running[#running + 1] = gid
      elseif cs ~= 'done' then
        never[#never + 1] = gid
      end
    end
  end
end
redis.call('HSET', KEYS[1], 'status', 'cancelled', 'cancelled_by', ARGV[1], 'pending', 0,
  'children_pending', 0, 'phase', 'done', 'cancel_attempt', ARGV[6], 'updated_at', nowstr)
local function ids(list)
  if #list == 0 then return '[]' end
  return cjson.encode(list)
end
local data = '{"run_id":' .. cjson.encode(ARGV[3]) .. ',"by":' .. cjson.encode(ARGV[1])
  .. ',"reason":' .. cjson.encode(ARGV[2]) .. ',"never_ran":' .. ids(never)
  .. ',"running":' .. ids(running) .. ',"origin":' .. origin .. '}'
redis.call('XADD', KEYS[3], '*', 'type', 'run.cancelled', 'run_id', ARGV[3], 'data', data)
redis.call('ZADD', KEYS[5], nowstr, ARGV[3])
redis.call('ZREM', KEYS[6], ARGV[3])
if ARGV[5] ~= '' then report_child(KEYS[1], KEYS[8], KEYS[9], KEYS[10], KEYS[3], ARGV[5], false) end
return {'cancelled'}
"""
)


def fail_keys(
    keys: Keys, run_id: str, family: dict[str, str], turn: int, gate_ids: list[str]
) -> list[str]:
    """FAIL_RUN's KEYS, in its order: ``family`` holds the run's ``parent`` and
    ``parent_turn`` ('' and '0' for a run without parent), ``gate_ids`` every gate of the run."""
    shard = keys.shard_of(run_id)
    return [
        keys.run(run_id),
        keys.events(shard),
        keys.finished(shard),
        keys.deadlines(shard),
        keys.run_gates(run_id),
        keys.active(shard),
        *parent_keys(keys, run_id, family),
        keys.turn(run_id, turn),
        *(keys.gate(g) for g in gate_ids),
    ]


def new_attempt() -> str:
    """An attempt id: one per logical call, the same for every retry of it."""
    return secrets.token_hex(8)


class Stopper:
    """Cancels and fails runs (CANCEL_RUN, FAIL_RUN) and cascades to their sub-agents."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._cancel = redis.register_script(CANCEL_RUN)
        self._fail = redis.register_script(FAIL_RUN)

    async def cancel(
        self,
        run_id: str,
        by: str,
        reason: str | None,
        attempt: str,
        *,
        parent_failed: bool = False,
    ) -> None:
        """Cancel a run that has not finished, then its unfinished sub-agents' runs.

        :class:`RunNotFound` for an unknown run, :class:`InvalidState` for a finished one
        (unless ``attempt`` cancelled it: that is this call's own effect). A sub-agent's
        parent is told who cancelled it, or with ``parent_failed`` that its own run failed.
        """
        k = self.keys
        shard = k.shard_of(run_id)
        for _ in range(10):
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.smembers(k.run_gates(run_id))
                pipe.hmget(k.run(run_id), ["turn", "parent", "parent_turn", "agent"])
                members, (turn, parent, parent_turn, agent) = await pipe.execute()
            gate_ids = sorted(members)
            turn = turn or "0"
            family = {"parent": parent or "", "parent_turn": parent_turn or "0"}
            told = ""
            if parent:
                told = (
                    messages.sub_agent_cancelled_at_failure(agent or "")
                    if parent_failed
                    else messages.sub_agent_cancelled(agent or "", by)
                )
            from . import metrics  # on first use: `import agent_core` loads no prometheus_client

            were_pending = await metrics.pending_gates(self.redis, k, gate_ids)
            res = await self._cancel(
                keys=[
                    k.run(run_id),
                    k.deadlines(shard),
                    k.events(shard),
                    k.run_gates(run_id),
                    k.finished(shard),
                    k.active(shard),
                    k.turn(run_id, int(turn)),
                    *parent_keys(k, run_id, family),
                    *(k.gate(g) for g in gate_ids),
                ],
                args=[
                    by,
                    clean_text(reason or "")[:MAX_REASON_CHARS],
                    run_id,
                    turn,
                    told,
                    attempt,
                    *gate_ids,
                ],
            )
            if res[0] == "missing":
                raise RunNotFound(f"no run {run_id!r}")
            if res[0] == "finished":
                raise InvalidState(f"run {run_id} has already {res[1]}")
            if res[0] == "cancelled":
                await metrics.count_cancelled(self.redis, k, were_pending)
                await self.cancel_children(run_id, by, f"its parent run {run_id} was cancelled")
                return
        raise InvalidState(f"run {run_id} kept opening gates; try again")

    async def cancel_children(
        self, run_id: str, by: str, reason: str, *, parent_failed: bool = False
    ) -> int:
        """Cancel the run's unfinished child runs (sub-agents), and theirs; how many.

        A crash half-way leaves a child running: the worker that next advances it finds
        its parent finished and cancels it then (or, when the parent failed and was
        continued, the parent's worker does: :meth:`cancel_orphans`).
        """
        cancelled = 0
        for child in sorted(await self.redis.smembers(self.keys.children(run_id))):
            with contextlib.suppress(InvalidState, RunNotFound):
                await self.cancel(child, by, reason, new_attempt(), parent_failed=parent_failed)
                cancelled += 1
        return cancelled

    async def cancel_orphans(self, run_id: str, turn: int) -> list[dict[str, Any]]:
        """Finish the cascade of a failure that a crash cut short, for a run continued since.

        FAIL_RUN leaves its turn's sub-agent calls (`child`) to their child runs' cancel,
        and counts none of them pending any more. Each such child still running is cancelled
        now, which settles its call ("cancelled when this run failed"). Returns the calls
        still waiting after that, on a child run that is gone or ended without reporting:
        the caller settles them, so the turn always moves on.
        """
        tkey = self.keys.turn(run_id, turn)
        th = await self.redis.hgetall(tkey)
        reason = f"its parent run {run_id} failed"
        for cid in json.loads(th.get("order") or "[]"):
            child = th.get(f"child:{cid}")
            if th.get(f"state:{cid}") == "child" and child:
                log.warning(
                    "run %s: cancelling sub-agent run %s left by its failure", run_id, child
                )
                with contextlib.suppress(InvalidState, RunNotFound):
                    await self.cancel(child, "", reason, new_attempt(), parent_failed=True)
        th = await self.redis.hgetall(tkey)
        return [
            json.loads(th[f"call:{cid}"])
            for cid in json.loads(th.get("order") or "[]")
            if th.get(f"state:{cid}") == "child"
        ]

    async def fail(self, run_id: str, error: str, fence: str, *, retryable: bool = False) -> bool:
        """Fail a run that has not finished, closing its pending gates; True if it moved.

        Only the holder of the run's lease can (``fence``); :class:`LeaseLost` otherwise. A
        ``retryable`` failure can be continued with :meth:`Gateway.retry_run`. A child run's
        failure is its parent call's result; a parent's cancels its unfinished children.
        """
        k = self.keys
        error = redact_secrets(clean_text(error))
        origin, parent, parent_turn, agent, waiting = await self.redis.hmget(
            k.run(run_id), ["origin", "parent", "parent_turn", "agent", "children_pending"]
        )
        run = {"parent": parent or "", "parent_turn": parent_turn or "0"}
        told = messages.sub_agent_failed(agent or "", error) if parent else ""
        data = json.dumps(
            {
                "run_id": run_id,
                "error": error,
                "retryable": retryable,
                "origin": json.loads(origin or "{}"),
            }
        )
        # The current turn's calls that did not run are closed with the failure.
        not_run, in_doubt = messages.not_run_at_failure(error), messages.in_doubt_at_failure()
        attempt = new_attempt()
        for _ in range(10):
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.smembers(k.run_gates(run_id))
                pipe.hget(k.run(run_id), "turn")
                members, turn = await pipe.execute()
            gate_ids = sorted(members)
            turn = turn or "0"
            from . import metrics  # on first use: `import agent_core` loads no prometheus_client

            were_pending = await metrics.pending_gates(self.redis, k, gate_ids)
            res = await self._fail(
                keys=fail_keys(k, run_id, run, int(turn), gate_ids),
                args=[
                    fence,
                    error,
                    data,
                    f"{time.time():.6f}",
                    run_id,
                    "1" if retryable else "0",
                    told,
                    turn,
                    not_run,
                    in_doubt,
                    attempt,
                    *gate_ids,
                ],
            )
            if res == "lost":
                raise LeaseLost(run_id)
            if res != "retry":
                if res == "failed":
                    await metrics.count_cancelled(self.redis, k, were_pending)
                    if int(waiting or 0) > 0:
                        await self.cancel_children(
                            run_id, "", f"run {run_id} failed", parent_failed=True
                        )
                return bool(res == "failed")
        return False
