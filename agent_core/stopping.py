"""Stopping a run: a cancel (a person's, or its parent's stopping) and a failure (by the
worker holding its lease), each one script that closes the run's gates and settles the calls
of its turn, followed by the cascade to the run's sub-agents' runs.

Both scripts recognise their own earlier effect (invariant 11): the caller picks an attempt
id once per logical call, the script records it with the change, and a re-run of the same
attempt (redis-py retrying after a reply lost to a dropped connection) answers as the first
run did instead of "already finished", so the caller goes on with the cascade and tells the
truth. The scripts are ``lua/fail_run.lua`` and ``lua/cancel_run.lua``, run through
:class:`agent_core.scripts.Scripts`.
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
from .completions import clean_text, redact_secrets
from .exceptions import InvalidState, LeaseLost, RunNotFound
from .keys import Keys
from .script_replies import CancelOutcome, FailOutcome
from .scripts import Scripts

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 2_000


def new_attempt() -> str:
    """An attempt id: one per logical call, the same for every retry of it."""
    return secrets.token_hex(8)


class Stopper:
    """Cancels and fails runs (CANCEL_RUN, FAIL_RUN) and cascades to their sub-agents."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self.scripts = Scripts(redis, keys)

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
        for _ in range(10):
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.smembers(k.run_gates(run_id))
                pipe.hmget(k.run(run_id), ["turn", "parent", "parent_turn", "agent", "parent_gate"])
                members, (turn, parent, parent_turn, agent, pgate) = await pipe.execute()
            gate_ids = sorted(members)
            turn = turn or "0"
            family = {"parent": parent or "", "parent_turn": parent_turn or "0"}
            family["parent_gate"] = pgate or ""
            told = ""
            if parent:
                told = (
                    messages.sub_agent_cancelled_at_failure(agent or "")
                    if parent_failed
                    else messages.sub_agent_cancelled(agent or "", by)
                )
            from . import metrics  # on first use: `import agent_core` loads no prometheus_client

            were_pending = await metrics.pending_gates(self.redis, k, gate_ids)
            res = await self.scripts.cancel_run(
                run_id,
                family,
                int(turn),
                gate_ids,
                by=by,
                reason=clean_text(reason or "")[:MAX_REASON_CHARS],
                told=told,
                attempt=attempt,
            )
            if res.outcome is CancelOutcome.MISSING:
                raise RunNotFound(f"no run {run_id!r}")
            if res.outcome is CancelOutcome.FINISHED:
                raise InvalidState(f"run {run_id} has already {res.status}")
            if res.outcome is CancelOutcome.CANCELLED:
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
        origin, parent, parent_turn, agent, waiting, pgate = await self.redis.hmget(
            k.run(run_id),
            ["origin", "parent", "parent_turn", "agent", "children_pending", "parent_gate"],
        )
        run = {
            "parent": parent or "",
            "parent_turn": parent_turn or "0",
            "parent_gate": pgate or "",
        }
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
            res = await self.scripts.fail_run(
                run_id,
                run,
                int(turn),
                gate_ids,
                fence=fence,
                error=error,
                data=data,
                now=f"{time.time():.6f}",
                retryable=retryable,
                told=told,
                not_run=not_run,
                in_doubt=in_doubt,
                attempt=attempt,
            )
            if res is FailOutcome.LOST:
                raise LeaseLost(run_id)
            if res is not FailOutcome.RETRY:
                if res is FailOutcome.FAILED:
                    await metrics.count_cancelled(self.redis, k, were_pending)
                    if int(waiting or 0) > 0:
                        await self.cancel_children(
                            run_id, "", f"run {run_id} failed", parent_failed=True
                        )
                return res is FailOutcome.FAILED
        return False
