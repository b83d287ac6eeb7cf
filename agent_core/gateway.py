"""The programmatic gateway API: start runs, read them, decide gates, cancel, read events.

The Slack bot, a CLI and the tests all go through :class:`Gateway`. It never runs the model:
it writes to Redis and the workers pick the work up from the jobs stream.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections.abc import Iterable
from typing import Any

from redis.asyncio import Redis

from . import scripts
from .completions import clean_text
from .events import EventConsumer
from .exceptions import ArgsHashMismatch, GateNotFound, InvalidState, RunNotFound
from .keys import Keys
from .models import DecideResult, Decision, Gate, GateStatus, Run, RunStatus

MAX_TASK_CHARS = 20_000
MAX_REASON_CHARS = 2_000
_GATE_ID = re.compile(r"^[A-Za-z0-9_-]{24}$")
_RUN_ID = re.compile(r"^r-[a-z0-9]{12}$")


# The states Gateway.wait can wait for: each is entered in the same script that publishes
# its event, so a waiter reading the events stream cannot miss it.
FINISHED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})
WAITABLE = FINISHED | {RunStatus.AWAITING_APPROVAL}
_ENTERED_BY = {
    "gate.opened": RunStatus.AWAITING_APPROVAL,
    "run.completed": RunStatus.COMPLETED,
    "run.failed": RunStatus.FAILED,
    "run.cancelled": RunStatus.CANCELLED,
}
# Longest single XREAD BLOCK of Gateway.wait: well under the client's socket timeout.
_WAIT_BLOCK_MS = 1000


def pairs(flat: list[str]) -> dict[str, str]:
    """A hash returned by a script as a flat [field, value, ...] list, as a dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def new_run_id() -> str:
    """A short run id a person can type (``r-`` and 12 base-36 characters)."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "r-" + "".join(secrets.choice(alphabet) for _ in range(12))


def new_gate_id() -> str:
    """An unguessable gate id (144 random bits), safe to put in a button value."""
    return secrets.token_urlsafe(18)


def valid_gate_id(gate_id: str) -> bool:
    return isinstance(gate_id, str) and bool(_GATE_ID.match(gate_id))


def valid_run_id(run_id: str) -> bool:
    return isinstance(run_id, str) and bool(_RUN_ID.match(run_id))


class Gateway:
    """Start runs, read them, decide their gates and cancel them."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys | None = None,
        *,
        agent_name: str = "agent",
        events_maxlen: int = 100_000,
    ) -> None:
        self.redis = redis
        self.keys = keys or Keys()
        self.agent_name = agent_name
        self.events_maxlen = events_maxlen
        self._decide = redis.register_script(scripts.DECIDE_GATE)
        self._cancel = redis.register_script(scripts.CANCEL_RUN)
        self._repair = redis.register_script(scripts.REPAIR_RUN)
        self._start = redis.register_script(scripts.START_RUN)
        self._retry = redis.register_script(scripts.RETRY_RUN)
        self._check_cursor = 0

    # --- runs -------------------------------------------------------------------------
    async def start_run(
        self,
        task: str,
        requested_by: str,
        origin: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Run:
        """Queue a new run of the agent on ``task``; a worker picks it up.

        With ``idempotency_key`` (a Slack trigger id, a request id), calling again with the
        same key within a day returns the run the first call started and starts nothing.
        """
        task = clean_text(task).strip()
        if not task:
            raise ValueError("the task is empty")
        if len(task) > MAX_TASK_CHARS:
            raise ValueError(f"the task is longer than {MAX_TASK_CHARS} characters")
        if not requested_by:
            raise ValueError("requested_by is required")
        if idempotency_key is not None and not 0 < len(idempotency_key) <= 200:
            raise ValueError("idempotency_key must be 1 to 200 characters")
        run_id = new_run_id()
        now = time.time()
        fields = {
            "run_id": run_id,
            "agent": self.agent_name,
            "task": task,
            "requested_by": requested_by,
            "origin": json.dumps(origin or {}),
            "status": "queued",
            "phase": "model",
            "turn": "0",
            "pending": "0",
            "created_at": f"{now:.6f}",
            "updated_at": f"{now:.6f}",
        }
        k = self.keys
        got = await self._start(
            keys=[
                k.start_key(idempotency_key) if idempotency_key else k.run(run_id),
                k.run(run_id),
                k.history(run_id),
                k.user_runs(requested_by),
                k.active(),
                k.jobs(),
            ],
            args=[
                "1" if idempotency_key else "0",
                run_id,
                json.dumps({"role": "user", "content": task}),
                f"{now:.6f}",
                86400,
                *(x for kv in fields.items() for x in kv),
            ],
        )
        if got != run_id:
            existing = await self.get_run(str(got))
            if existing is not None:
                return existing
        return Run.from_hash(fields)

    async def get_run(self, run_id: str) -> Run | None:
        """The run, or None."""
        if not valid_run_id(run_id):
            return None
        h = await self.redis.hgetall(self.keys.run(run_id))
        return Run.from_hash(h) if h else None

    async def wait(
        self,
        run_id: str,
        until: RunStatus | str | Iterable[RunStatus | str] = FINISHED,
        *,
        timeout: float | None = None,
    ) -> Run:
        """Block until the run is in a state of ``until``, or finished; return it.

        ``until`` is one status or several, among ``awaiting_approval``, ``completed``,
        ``failed`` and ``cancelled`` (default: the three finished ones). A finished run also
        ends the wait, since it goes nowhere else unless retried: check ``run.status``. A run
        already there is returned at once. The Run is read after the transition, so a run
        awaited for ``awaiting_approval`` may have moved on if a decision came in between.

        Nothing polls: it reads the events stream with XREAD BLOCK from the position taken
        before reading the run, so no transition is missed. Each waiting call holds one
        connection of the client's pool. Raises :class:`TimeoutError` after ``timeout``
        seconds (None: no limit) and :class:`RunNotFound` for an unknown (or purged) run.
        """
        targets = {RunStatus(until)} if isinstance(until, str) else {RunStatus(s) for s in until}
        if not targets or not targets <= WAITABLE:
            raise ValueError(
                "until must name awaiting_approval, completed, failed or cancelled: those "
                "are the states the events stream announces"
            )
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        stream = self.keys.events()
        # The stream position first, then the run: an event after it is read below.
        last = await self.redis.xrevrange(stream, count=1)
        position = last[0][0] if last else "0-0"
        run = await self.get_run(run_id)
        while True:
            if run is None:
                raise RunNotFound(f"no run {run_id!r}")
            if run.status in targets or run.status.finished:
                return run
            block_ms = _WAIT_BLOCK_MS
            if deadline is not None:
                left = deadline - loop.time()
                if left <= 0:
                    wanted = ", ".join(sorted(s.value for s in targets))
                    raise TimeoutError(
                        f"run {run_id} is still {run.status.value} after {timeout} s "
                        f"(waited for {wanted})"
                    )
                block_ms = max(1, min(block_ms, int(left * 1000)))
            reply = await self.redis.xread({stream: position}, count=500, block=block_ms)
            entered = False
            for _stream, entries in reply or []:
                for msg_id, fields in entries:
                    position = msg_id
                    status = _ENTERED_BY.get((fields or {}).get("type", ""))
                    if status is not None and fields.get("run_id") == run_id:
                        entered = entered or status in targets or status.finished
            if entered:
                run = await self.get_run(run_id)
                if run is None:
                    raise RunNotFound(f"no run {run_id!r}")
                return run

    async def runs_for_user(self, user: str, limit: int = 20) -> list[Run]:
        """The user's runs, newest first."""
        ids = await self.redis.zrevrange(self.keys.user_runs(user), 0, limit - 1)
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for run_id in ids:
                pipe.hgetall(self.keys.run(run_id))
            hashes = await pipe.execute()
        return [Run.from_hash(h) for h in hashes if h]

    async def history(self, run_id: str) -> list[dict[str, Any]]:
        """The run's messages so far (without the agent's instructions)."""
        return [json.loads(m) for m in await self.redis.lrange(self.keys.history(run_id), 0, -1)]

    async def cancel_run(self, run_id: str, by: str, reason: str | None = None) -> Run:
        """Cancel a run that has not finished; its pending gates become ``cancelled``."""
        if not valid_run_id(run_id):
            raise RunNotFound(f"no run {run_id!r}")
        k = self.keys
        for _ in range(10):
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.smembers(k.run_gates(run_id))
                pipe.hget(k.run(run_id), "turn")
                members, turn = await pipe.execute()
            gate_ids = sorted(members)
            turn = turn or "0"
            res = await self._cancel(
                keys=[
                    k.run(run_id),
                    k.deadlines(),
                    k.events(),
                    k.run_gates(run_id),
                    k.finished(),
                    k.active(),
                    k.turn(run_id, int(turn)),
                    *(k.gate(g) for g in gate_ids),
                ],
                args=[
                    by,
                    clean_text(reason or "")[:MAX_REASON_CHARS],
                    run_id,
                    turn,
                    *gate_ids,
                ],
            )
            if res[0] == "missing":
                raise RunNotFound(f"no run {run_id!r}")
            if res[0] == "finished":
                raise InvalidState(f"run {run_id} has already {res[1]}")
            if res[0] == "cancelled":
                run = await self.get_run(run_id)
                assert run is not None
                return run
        raise InvalidState(f"run {run_id} kept opening gates; try again")

    async def retry_run(self, run_id: str, by: str) -> Run:
        """Continue a run whose model call kept failing, from the step it failed in.

        Nothing that ran runs again: every earlier step is recorded. :class:`RunNotFound`
        for an unknown run, :class:`InvalidState` when it is not failed or its failure is
        not one a retry can fix.
        """
        if not valid_run_id(run_id):
            raise RunNotFound(f"no run {run_id!r}")
        if not by:
            raise ValueError("by is required")
        k = self.keys
        res = await self._retry(
            keys=[k.run(run_id), k.finished(), k.active(), k.jobs(), k.events()],
            args=[run_id, by, f"{time.time():.6f}"],
        )
        if res == "missing":
            raise RunNotFound(f"no run {run_id!r}")
        if res == "not_failed":
            run = await self.get_run(run_id)
            status = run.status.value if run else "gone"
            raise InvalidState(f"run {run_id} is {status}; only a failed run can be retried")
        if res == "not_retryable":
            raise InvalidState(f"run {run_id} failed in a way a retry cannot fix (see its error)")
        run = await self.get_run(run_id)
        assert run is not None
        return run

    # --- gates ------------------------------------------------------------------------
    async def get_gate(self, gate_id: str) -> Gate | None:
        """The gate, or None (also for a malformed id)."""
        if not valid_gate_id(gate_id):
            return None
        h = await self.redis.hgetall(self.keys.gate(gate_id))
        return Gate.from_hash(h) if h else None

    async def gates(self, run_id: str) -> list[Gate]:
        """Every gate the run opened, oldest first."""
        ids = await self.redis.smembers(self.keys.run_gates(run_id))
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for g in ids:
                pipe.hgetall(self.keys.gate(g))
            hashes = await pipe.execute()
        return sorted((Gate.from_hash(h) for h in hashes if h), key=lambda g: g.created_at)

    async def pending_gates(self, run_id: str) -> list[Gate]:
        """The run's gates still waiting for a decision."""
        return [g for g in await self.gates(run_id) if g.status is GateStatus.PENDING]

    async def decide(
        self,
        gate_id: str,
        decision: Decision | str,
        by: str,
        reason: str | None = None,
        *,
        args_hash: str | None = None,
    ) -> DecideResult:
        """Approve or deny a pending gate, atomically and exactly once.

        The first decision wins; every later one (a double click, a second approver, a click
        racing the expiry) gets ``applied=False`` and the gate as the first decision left it.
        A decision arriving after the deadline turns the gate ``expired``.

        ``args_hash`` is the arguments hash the decider was shown (a Slack card carries it in
        its buttons). When given, it must be the gate's, or :class:`ArgsHashMismatch` is
        raised and nothing is decided. The gate records it as ``decided_hash``, and an
        approved call runs only if its arguments hash to it.
        """
        decision = Decision(decision)
        if not by:
            raise ValueError("by is required")
        return await self._apply(gate_id, decision.status.value, by, reason, args_hash or "")

    async def expire(self, gate_id: str) -> DecideResult | None:
        """Expire a gate whose deadline has passed (the sweeper's path); None if not due."""
        try:
            return await self._apply(gate_id, GateStatus.EXPIRED.value, "", None, "")
        except InvalidState:
            return None

    async def _apply(
        self, gate_id: str, status: str, by: str, reason: str | None, seen_hash: str
    ) -> DecideResult:
        if not valid_gate_id(gate_id):
            raise GateNotFound(f"no gate {gate_id[:40]!r}")
        k = self.keys
        run_id = await self.redis.hget(k.gate(gate_id), "run_id")
        if run_id is None:
            raise GateNotFound(f"no gate {gate_id!r}")
        res = await self._decide(
            keys=[k.gate(gate_id), k.run(run_id), k.deadlines(), k.jobs(), k.events()],
            args=[
                gate_id,
                status,
                by,
                clean_text(reason or "")[:MAX_REASON_CHARS],
                "",
                run_id,
                seen_hash,
            ],
        )
        if res[0] == "missing":
            raise GateNotFound(f"no gate {gate_id!r}")
        if res[0] == "mismatch":
            raise ArgsHashMismatch(
                f"gate {gate_id}: the arguments hash {seen_hash[:12]!r} is not this request's; "
                "nothing was decided"
            )
        if res[0] == "not_due":
            raise InvalidState(f"gate {gate_id} is not due yet")
        return DecideResult(applied=res[0] == "applied", gate=Gate.from_hash(pairs(res[1])))

    async def due_gates(self, limit: int = 100) -> tuple[list[str], float | None]:
        """Pending gate ids past their deadline (Redis clock), and the next deadline after them."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.zrange(self.keys.deadlines(), 0, limit, withscores=True)
            (sec, usec), entries = await pipe.execute()
        now = sec + usec / 1e6
        due = [g for g, score in entries if score <= now]
        later = [score for _, score in entries if score > now]
        return due, (later[0] - now if later else None)

    async def purge_finished(self, older_than: float, limit: int = 100) -> int:
        """Delete the keys of runs that finished more than ``older_than`` seconds ago.

        Several workers may purge at once: deleting twice is harmless. Returns how many runs
        were purged.
        """
        k = self.keys
        sec, usec = await self.redis.time()
        cutoff = sec + usec / 1e6 - older_than
        run_ids = await self.redis.zrangebyscore(k.finished(), "-inf", cutoff, start=0, num=limit)
        if not run_ids:
            return 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.hmget(k.run(run_id), ["turn", "requested_by"])
                pipe.smembers(k.run_gates(run_id))
            replies = await pipe.execute()
        async with self.redis.pipeline(transaction=False) as pipe:
            for i, run_id in enumerate(run_ids):
                (turn, requested_by), gate_ids = replies[2 * i], replies[2 * i + 1]
                doomed = [k.run(run_id), k.history(run_id), k.run_gates(run_id)]
                doomed += [k.turn(run_id, n) for n in range(1, int(turn or 0) + 1)]
                doomed += [k.gate(g) for g in gate_ids]
                pipe.unlink(*doomed)
                if requested_by:
                    pipe.zrem(k.user_runs(requested_by), run_id)
                pipe.zrem(k.finished(), run_id)
                pipe.zrem(k.active(), run_id)
            await pipe.execute()
        return len(run_ids)

    async def repair_stuck(self, stuck_after: float, limit: int = 200) -> list[str]:
        """Find runs that nothing will move on and repair them; the ids repaired.

        A run is stuck when it is not finished, no worker holds its lease, it made no
        progress for ``stuck_after`` seconds, and it waits for approval with no pending gate
        or has no job. It gets its pending count recounted and a resume job (an extra job is
        harmless). Several workers may check at once: a repaired run counts as progress.
        """
        k = self.keys
        start = self._check_cursor
        run_ids = await self.redis.zrange(k.active(), start, start + limit - 1)
        # Walk the whole set across calls, `limit` runs at a time.
        self._check_cursor = 0 if len(run_ids) < limit else start + limit
        if not run_ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.time()
            for run_id in run_ids:
                pipe.hmget(k.run(run_id), ["status", "updated_at", "lease_until"])
            sec_usec, *rows = await pipe.execute()
        now = sec_usec[0] + sec_usec[1] / 1e6
        suspects = [
            run_id
            for run_id, (status, updated, lease) in zip(run_ids, rows, strict=True)
            if status is None
            or status in ("completed", "failed", "cancelled")
            or (float(lease or 0) <= now and float(updated or 0) <= now - stuck_after)
        ]
        repaired: list[str] = []
        for run_id in suspects:
            for _ in range(3):
                gate_ids = sorted(await self.redis.smembers(k.run_gates(run_id)))
                res = await self._repair(
                    keys=[
                        k.run(run_id),
                        k.jobs(),
                        k.run_gates(run_id),
                        k.active(),
                        *(k.gate(g) for g in gate_ids),
                    ],
                    args=[stuck_after, run_id, *gate_ids],
                )
                if res != "retry":
                    break
            if res == "repaired":
                repaired.append(run_id)
        return repaired

    # --- events -----------------------------------------------------------------------
    def event_consumer(
        self, group: str, consumer: str, *, claim_idle_ms: int = 30_000
    ) -> EventConsumer:
        """A consumer-group reader of the events stream."""
        return EventConsumer(self.redis, self.keys, group, consumer, claim_idle_ms=claim_idle_ms)
