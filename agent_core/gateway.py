"""The programmatic gateway API: start runs, read them, decide gates, cancel, read events.

The Slack bot, a CLI and the tests all go through :class:`Gateway`. It never runs the model:
it writes to Redis and the workers pick the work up from the jobs stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import time
from collections.abc import Iterable, Sequence
from typing import Any

from redis.asyncio import Redis

from .completions import clean_text
from .deciding import apply_decision
from .events import EventConsumer
from .exceptions import ChildRunSettled, GateNotFound, InvalidState, RunNotFound
from .grants import Grants
from .keys import Keys
from .models import ContinueOutcome, DecideResult, Decision, Gate, GateStatus, Run, RunStatus
from .placement import ShardPicker
from .script_replies import ContinueReply, RepairOutcome, RetryOutcome
from .scripts import Scripts
from .settings import Settings
from .stopping import Stopper, new_attempt
from .streams import stream_groups

log = logging.getLogger(__name__)

MAX_TASK_CHARS = 20_000
# How long an idempotency key (start_run) or a dedupe key (continue_run) is remembered.
IDEMPOTENCY_TTL_SECONDS = 86_400
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


def valid_gate_id(gate_id: str, keys: Keys | None = None) -> bool:
    """A well-formed gate id (of one of ``keys``' shards, when given)."""
    ok = isinstance(gate_id, str) and bool(_GATE_ID.match(gate_id))
    return ok and (keys is None or keys.owns(gate_id))


def valid_run_id(run_id: str, keys: Keys | None = None) -> bool:
    """A well-formed run id (of one of ``keys``' shards, when given)."""
    ok = isinstance(run_id, str) and bool(_RUN_ID.match(run_id))
    return ok and (keys is None or keys.owns(run_id))


def _attempt(attempt: str | None) -> str:
    """The caller's attempt id, checked, or a new one."""
    if attempt is None:
        return new_attempt()
    if not 0 < len(attempt) <= 200:
        raise ValueError("attempt must be 1 to 200 characters")
    return attempt


class Gateway:
    """Start runs, read them, decide their gates and cancel them."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys | None = None,
        *,
        agent_name: str = "",
        decision_replicas: int = 0,
        decision_wait_ms: int = 1000,
    ) -> None:
        self.redis = redis
        self.keys = keys or Keys()
        self.agent_name = agent_name
        # A decision returns once this many replicas have it (WAIT), so a failover right
        # after the click cannot lose it: 0 on a Redis without replicas.
        self.decision_replicas = decision_replicas
        self.decision_wait_ms = decision_wait_ms
        self._owns_redis = False  # True when from_settings made the client: aclose() closes it
        self.scripts = Scripts(redis, self.keys)
        self._check_cursor = (0, 0)
        self.placement = ShardPicker(redis, self.keys)
        self.stopper = Stopper(redis, self.keys)
        self.grants = Grants(self)  # allow for this thread (agent_core.grants)

    @classmethod
    async def from_settings(
        cls, settings: Settings | None = None, *, agent_name: str = ""
    ) -> Gateway:
        """A Gateway configured as the workers are, from the same settings.

        ``settings`` default to :meth:`Settings.from_env`. The Redis client is the workers'
        (REDIS_URL; the cluster client on a Redis Cluster, see REDIS_CLUSTER), and so are the
        keys (KEY_PREFIX, SHARDS) and the replicas a decision waits for (DECISION_REPLICAS).
        Raises :class:`ConfigError` when Redis cannot be reached or holds the old key layout.
        :meth:`aclose` (or ``async with``) closes the client.
        """
        from .connections import reachable_redis
        from .layout import refuse_old_layout

        if settings is None:
            settings = Settings.from_env()
        redis = await reachable_redis(settings.redis_url, settings.redis_cluster)
        keys = Keys(settings.key_prefix, settings.shards)
        try:
            await refuse_old_layout(redis, keys)
        except BaseException:
            await redis.aclose()
            raise
        gateway = cls(
            redis, keys, agent_name=agent_name, decision_replicas=settings.decision_replicas
        )
        gateway._owns_redis = True
        return gateway

    async def aclose(self) -> None:
        """Close the Redis client if :meth:`from_settings` made it (a client passed to the
        constructor stays its owner's to close)."""
        if self._owns_redis:
            await self.redis.aclose()

    async def __aenter__(self) -> Gateway:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # --- runs -------------------------------------------------------------------------
    async def start_run(
        self,
        task: str,
        requested_by: str,
        origin: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        agent: str | None = None,
    ) -> Run:
        """Queue a new run of the agent on ``task``; a worker picks it up.

        ``agent`` names the agent (default: the Gateway's ``agent_name``; when that is empty
        too, the workers' first agent).

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
        k = self.keys
        # With an idempotency key the run goes to that key's shard: the key and the run are
        # written by one single-slot script. Without, to an even share of each master.
        run_id = k.new_run_id(
            k.shard_for(idempotency_key) if idempotency_key else self.placement.pick()
        )
        now = time.time()
        fields = {
            "run_id": run_id,
            "agent": agent or self.agent_name,
            "task": task,
            "requested_by": requested_by,
            "requesters": json.dumps([requested_by]),
            "origin": json.dumps(origin or {}),
            "status": "queued",
            "phase": "model",
            "turn": "0",
            "pending": "0",
            "created_at": f"{now:.6f}",
            "updated_at": f"{now:.6f}",
        }
        got = await self.scripts.start_run(
            run_id,
            idempotency_key=idempotency_key,
            requested_by=requested_by,
            first_message=json.dumps({"role": "user", "content": task}),
            now=f"{now:.6f}",
            ttl=IDEMPOTENCY_TTL_SECONDS,
            fields=fields,
        )
        if got != run_id:
            existing = await self.get_run(got)
            if existing is not None:
                return existing
        return Run.from_hash(fields)

    async def started_run(self, idempotency_key: str) -> str | None:
        """The id of the run :meth:`start_run` started with ``idempotency_key`` (remembered
        for a day), or None."""
        if not 0 < len(idempotency_key) <= 200:
            return None
        got = await self.redis.get(self.keys.start_key(idempotency_key))
        run_id = got.decode() if isinstance(got, bytes) else got
        return run_id if run_id and valid_run_id(run_id, self.keys) else None

    async def get_run(self, run_id: str) -> Run | None:
        """The run, or None."""
        if not valid_run_id(run_id, self.keys):
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
        if not valid_run_id(run_id, self.keys):
            raise RunNotFound(f"no run {run_id[:40]!r}")
        stream = self.keys.events(self.keys.shard_of(run_id))
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
        """The user's runs, newest first (from every shard)."""
        k = self.keys
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in k.all_shards():
                pipe.zrevrange(k.user_runs(user, shard), 0, limit - 1, withscores=True)
            per_shard = await pipe.execute()
        scored = sorted((s for rows in per_shard for s in rows), key=lambda r: -r[1])[:limit]
        if not scored:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for run_id, _ in scored:
                pipe.hgetall(k.run(run_id))
            hashes = await pipe.execute()
        return [Run.from_hash(h) for h in hashes if h]

    async def history(self, run_id: str, *, with_authors: bool = False) -> list[dict[str, Any]]:
        """The run's messages so far (without the agent's instructions). ``with_authors``:
        each user message also carries ``"by"``, the user who said it (stored apart: the
        model never sees it)."""
        k = self.keys
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.lrange(k.history(run_id), 0, -1)
            pipe.hgetall(k.authors(run_id))
            pipe.hget(k.run(run_id), "requested_by")
            raw, authors, requester = await pipe.execute()
        msgs = [json.loads(m) for m in raw]
        if with_authors:
            for i, m in enumerate(msgs):
                if m.get("role") == "user":
                    m["by"] = authors.get(str(i)) or (requester if i == 0 else None)
        return msgs

    async def continue_run(
        self, run_id: str, message: str, by: str, *, dedupe_key: str | None = None
    ) -> ContinueOutcome:
        """Continue the run's conversation with ``message`` from the user ``by``.

        A completed or failed run starts its next turn with the whole history (``STARTED``).
        A run still working or awaiting approval keeps the message for its next model turn
        (``QUEUED``). Once the model has read it, ``by`` is one of the run's requesters: none of
        them may approve the calls it asks for later (unless self-approval is allowed).
        :class:`RunNotFound` for an unknown run, :class:`InvalidState` for a cancelled one.

        ``dedupe_key`` (a chat message's id, up to 200 characters) handles each message once
        within a day: the key is recorded by the same script that records the message, so
        either both happen or neither, and a later call with the key returns ``DUPLICATE``
        and changes nothing. A run started by :meth:`start_run` with the same string as its
        ``idempotency_key`` has seen the key too. A call retried after a lost reply gets the
        outcome it had.
        """
        message = clean_text(message).strip()
        if not message:
            raise ValueError("the message is empty")
        if len(message) > MAX_TASK_CHARS:
            raise ValueError(f"the message is longer than {MAX_TASK_CHARS} characters")
        if not by:
            raise ValueError("by is required")
        if dedupe_key is not None and not 0 < len(dedupe_key) <= 200:
            raise ValueError("dedupe_key must be 1 to 200 characters")
        if not valid_run_id(run_id, self.keys):
            raise RunNotFound(f"no run {run_id[:40]!r}")
        wire = json.dumps({"role": "user", "content": message})
        dedupe = None
        if dedupe_key is not None:
            dedupe = (dedupe_key, secrets.token_hex(8), IDEMPOTENCY_TTL_SECONDS)
        res = await self.scripts.continue_run(
            run_id,
            by=by,
            message=wire,
            now=f"{time.time():.6f}",
            entry=json.dumps({"by": by, "message": wire}),
            dedupe=dedupe,
        )
        if res is ContinueReply.MISSING:
            raise RunNotFound(f"no run {run_id!r}")
        if res is ContinueReply.CANCELLED:
            raise InvalidState(f"run {run_id} was cancelled; a cancelled run does not continue")
        return ContinueOutcome(res.value)

    async def cancel_run(
        self, run_id: str, by: str, reason: str | None = None, *, attempt: str | None = None
    ) -> Run:
        """Cancel a run that has not finished; its pending gates become ``cancelled``, and
        its sub-agents' runs are cancelled too. :class:`InvalidState` when it has finished.

        ``attempt`` names this request (default: a new one). The cancel is recorded with
        it, so a repeat with the same attempt (a client retrying after a lost answer,
        as redis-py does after a dropped connection) is answered as the first was.
        """
        if not valid_run_id(run_id, self.keys):
            raise RunNotFound(f"no run {run_id!r}")
        await self.stopper.cancel(run_id, by, reason, _attempt(attempt))
        run = await self.get_run(run_id)
        assert run is not None
        return run

    async def cancel_children(self, run_id: str, by: str, reason: str) -> int:
        """Cancel the run's unfinished child runs (sub-agents), and theirs; how many."""
        return await self.stopper.cancel_children(run_id, by, reason)

    async def retry_run(self, run_id: str, by: str, *, attempt: str | None = None) -> Run:
        """Continue a run whose model call kept failing, from the step it failed in.

        Nothing that ran runs again: every earlier step is recorded. :class:`RunNotFound`
        for an unknown run, :class:`InvalidState` when it is not failed or its failure is
        not one a retry can fix. A sub-agent's run is retried only while its parent still
        waits for it; once the parent has its failure as the call's result,
        :class:`ChildRunSettled` names the top run to retry instead. ``attempt``: as for
        :meth:`cancel_run`, a repeat with the same attempt is answered as the first was.
        """
        if not valid_run_id(run_id, self.keys):
            raise RunNotFound(f"no run {run_id!r}")
        if not by:
            raise ValueError("by is required")
        # A run's parent never changes: the script only checks these were read right.
        parent, parent_turn = await self.redis.hmget(
            self.keys.run(run_id), ["parent", "parent_turn"]
        )
        family = {"parent": parent or "", "parent_turn": parent_turn or "0"}
        res = await self.scripts.retry_run(
            run_id, family, by=by, now=f"{time.time():.6f}", attempt=_attempt(attempt)
        )
        if res is RetryOutcome.MISSING:
            raise RunNotFound(f"no run {run_id!r}")
        if res is RetryOutcome.NOT_FAILED:
            run = await self.get_run(run_id)
            status = run.status.value if run else "gone"
            raise InvalidState(f"run {run_id} is {status}; only a failed run can be retried")
        if res is RetryOutcome.PARENT_MOVED_ON:
            top = await self.top_run_id(run_id)
            raise ChildRunSettled(
                f"run {run_id} is a sub-agent's run and its parent has already been told it "
                f"failed; retry the top run {top} instead",
                top_run=top,
            )
        if res is RetryOutcome.NOT_RETRYABLE:
            raise InvalidState(f"run {run_id} failed in a way a retry cannot fix (see its error)")
        if res is not RetryOutcome.QUEUED:
            raise InvalidState(f"run {run_id} changed while it was being retried; try again")
        run = await self.get_run(run_id)
        assert run is not None
        return run

    async def top_run_id(self, run_id: str) -> str:
        """The run at the top of ``run_id``'s sub-agents (the run itself when it has no
        parent): the one its thread's root message shows."""
        for _ in range(32):  # deeper than any MAX_DEPTH; a loop in the data cannot hang
            parent = await self.redis.hget(self.keys.run(run_id), "parent")
            if not parent or not valid_run_id(parent, self.keys):
                break
            run_id = parent
        return run_id

    # --- gates ------------------------------------------------------------------------
    async def get_gate(self, gate_id: str) -> Gate | None:
        """The gate, or None (also for a malformed id)."""
        if not valid_gate_id(gate_id, self.keys):
            return None
        h = await self.redis.hgetall(self.keys.gate(gate_id))
        return Gate.from_hash(h) if h else None

    async def gates(self, run_id: str) -> list[Gate]:
        """Every gate the run opened: by turn, and within a turn in the order of its calls."""
        if not valid_run_id(run_id, self.keys):
            return []
        ids = await self.redis.smembers(self.keys.run_gates(run_id))
        return sorted(await self.gates_by_id(ids), key=lambda g: g.sort_key)

    async def gates_by_id(self, gate_ids: Iterable[str]) -> list[Gate]:
        """The gates of ``gate_ids`` that exist, in that order (one round trip); malformed
        ids and gates purged meanwhile are left out."""
        ids = [g for g in gate_ids if valid_gate_id(g, self.keys)]
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for g in ids:
                pipe.hgetall(self.keys.gate(g))
            hashes = await pipe.execute()
        out: list[Gate] = []
        for h in hashes:
            try:
                out.append(Gate.from_hash(h))
            except (KeyError, ValueError):
                continue  # purged meanwhile (an empty hash), or not a gate
        return out

    async def pending_gates(self, run_id: str) -> list[Gate]:
        """The run's gates still waiting for a decision, in the order of their calls."""
        return [g for g in await self.gates(run_id) if g.status is GateStatus.PENDING]

    async def decide(
        self,
        gate: str | Gate,
        decision: Decision | str,
        by: str,
        reason: str | None = None,
        *,
        args_hash: str | None = None,
        run_id: str | None = None,
        groups: Sequence[str] = (),
        allow_self_approval: bool = True,
    ) -> DecideResult:
        """Approve or deny a pending gate, atomically and exactly once.

        The first decision wins; every later one (a double click, a second approver, a click
        racing the expiry) gets ``applied=False`` and the gate as the first decision left it.
        A decision arriving after the deadline turns the gate ``expired``. ``reason`` reaches
        the model with the outcome, for an approval as for a denial.

        ``args_hash`` is the arguments hash the decider was shown (a Slack card carries it in
        its buttons). When given, it must be the gate's, or :class:`ArgsHashMismatch` is
        raised and nothing is decided. The gate records it as ``decided_hash``, and an
        approved call runs only if its arguments hash to it.

        ``gate``: the gate's id, or a :class:`Gate` read before (from :meth:`pending_gates`,
        say), which names its run: the decision is then one round trip, as with ``run_id``
        (the gate's run). The script checks the run is the gate's; a forged or stale one
        decides nothing, and the gate's own run is then read and used (never another run's).

        A gate that needs several approvals (:mod:`agent_core.quorum`) records an approval
        that does not complete its quorum (``counted=True``, still pending); ``groups``: the
        quorum's user groups ``by`` belongs to. An approval by a requester (unless
        ``allow_self_approval``), a second one by the same person or one no unfilled group
        of theirs can take records nothing (``refused`` says why).
        """
        decision = Decision(decision)
        if not by:
            raise ValueError("by is required")
        gate_id, run_id = (gate, run_id) if isinstance(gate, str) else (gate.gate_id, gate.run_id)
        return await self._apply(
            gate_id,
            decision.status.value,
            by,
            reason,
            args_hash or "",
            run_id=run_id,
            groups=groups,
            allow_self_approval=allow_self_approval,
        )

    async def decide_call(
        self,
        run_id: str,
        call_id: str,
        decision: Decision | str,
        by: str,
        reason: str | None = None,
        *,
        args_hash: str | None = None,
    ) -> DecideResult:
        """Decide the gate of one tool call, named by its run and the model's call id, as
        :meth:`decide` does (the latest turn holding that call id is the one decided).

        :class:`RunNotFound` for an unknown run, :class:`GateNotFound` when the call does
        not exist or needed no approval.
        """
        decision = Decision(decision)
        if not by:
            raise ValueError("by is required")
        gate_id = await self._gate_of_call(run_id, call_id)
        status = decision.status.value
        return await self._apply(gate_id, status, by, reason, args_hash or "", run_id=run_id)

    async def _gate_of_call(self, run_id: str, call_id: str) -> str:
        if not valid_run_id(run_id, self.keys):
            raise RunNotFound(f"no run {run_id[:40]!r}")
        if not isinstance(call_id, str) or not 0 < len(call_id) <= 200:
            raise GateNotFound(f"run {run_id} has no call {str(call_id)[:40]!r}")
        k = self.keys
        turn = await self.redis.hget(k.run(run_id), "turn")
        if turn is None:
            raise RunNotFound(f"no run {run_id!r}")
        turns = range(int(turn), 0, -1)  # newest first: a server may reuse call ids
        async with self.redis.pipeline(transaction=False) as pipe:
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

    async def decide_many(
        self,
        gates: Iterable[str | Gate],
        decision: Decision | str,
        by: str,
        reason: str | None = None,
        *,
        groups: Sequence[str] = (),
        allow_self_approval: bool = True,
    ) -> list[DecideResult]:
        """Approve or deny several gates (e.g. every pending gate of a turn): one result per
        gate, in the order given.

        Each gate is decided atomically and exactly once, as by :meth:`decide`. A gate
        someone already decided is left as it is (``applied=False``, with their decision).
        A run resumes once, when its last pending gate is decided. :class:`GateNotFound`,
        before anything is decided, when a gate does not exist. ``groups`` and
        ``allow_self_approval`` as for :meth:`decide`: ``by`` counts once per gate. A
        :class:`Gate` given names its run (as for :meth:`decide`): only the runs of gates
        given by id are read first.
        """
        decision = Decision(decision)
        if not by:
            raise ValueError("by is required")
        given = list(gates)
        ids = [g if isinstance(g, str) else g.gate_id for g in given]
        run_ids = [None if isinstance(g, str) else g.run_id for g in given]
        k = self.keys
        unknown = [g for g in ids if not valid_gate_id(g, k)]
        asked = [i for i, r in enumerate(run_ids) if r is None]
        if asked and not unknown:
            async with self.redis.pipeline(transaction=False) as pipe:
                for i in asked:
                    pipe.hget(k.gate(ids[i]), "run_id")
                for i, r in zip(asked, await pipe.execute(), strict=True):
                    run_ids[i] = r
            unknown = [g for g, r in zip(ids, run_ids, strict=True) if r is None]
        if unknown:
            shown = ", ".join(repr(g[:40]) for g in unknown[:5])
            raise GateNotFound(f"no gate {shown}; nothing was decided")
        return [
            await self._apply(
                g,
                decision.status.value,
                by,
                reason,
                "",
                run_id=r,
                groups=groups,
                allow_self_approval=allow_self_approval,
            )
            for g, r in zip(ids, run_ids, strict=True)
        ]

    async def expire(self, gate_id: str) -> DecideResult | None:
        """Expire a gate whose deadline has passed (the sweeper's path); None if not due."""
        try:
            return await self._apply(gate_id, GateStatus.EXPIRED.value, "", None, "")
        except InvalidState:
            return None

    async def _apply(
        self,
        gate_id: str,
        status: str,
        by: str,
        reason: str | None,
        seen_hash: str,
        *,
        run_id: str | None = None,
        groups: Sequence[str] = (),
        allow_self_approval: bool = True,
    ) -> DecideResult:
        return await apply_decision(
            self,
            gate_id,
            status,
            by,
            reason,
            seen_hash,
            run_id=run_id,
            groups=groups,
            allow_self_approval=allow_self_approval,
        )

    async def due_gates(
        self, limit: int = 100, shards: Iterable[int] | None = None
    ) -> tuple[list[str], float | None]:
        """Pending gate ids past their deadline (Redis clock), in ``shards`` (default all),
        and the time until the next deadline after them."""
        k = self.keys
        chosen = list(k.all_shards() if shards is None else shards)
        # TIME on its own: a cluster pipeline cannot carry a keyless command.
        sec, usec = await self.redis.time()
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in chosen:
                pipe.zrange(k.deadlines(shard), 0, limit, withscores=True)
            per_shard = await pipe.execute()
        now = sec + usec / 1e6
        entries = sorted((e for rows in per_shard for e in rows), key=lambda e: e[1])
        due = [g for g, score in entries if score <= now][:limit]
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
        async with self.redis.pipeline(transaction=False) as pipe:
            for shard in k.all_shards():
                pipe.zrangebyscore(k.finished(shard), "-inf", cutoff, start=0, num=limit)
            per_shard = await pipe.execute()
        run_ids = [r for rows in per_shard for r in rows if valid_run_id(r, k)][:limit]
        if not run_ids:
            return 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.hmget(k.run(run_id), ["turn", "requested_by"])
                pipe.smembers(k.run_gates(run_id))
                pipe.hvals(k.authors(run_id))  # whoever continued it has it in their index
            replies = await pipe.execute()
        async with self.redis.pipeline(transaction=False) as pipe:
            for i, run_id in enumerate(run_ids):
                (turn, requested_by), gate_ids = replies[3 * i], replies[3 * i + 1]
                authors = {a for a in replies[3 * i + 2] if a} | {requested_by or ""}
                doomed = [k.run(run_id), k.history(run_id), k.run_gates(run_id)]
                doomed += [k.run_inbox(run_id), k.authors(run_id), k.children(run_id)]
                doomed.append(k.grants(run_id))  # its thread's grants die with it
                doomed += [k.turn(run_id, n) for n in range(1, int(turn or 0) + 1)]
                doomed += [k.gate(g) for g in gate_ids]
                pipe.unlink(*doomed)
                shard = k.shard_of(run_id)
                for author in sorted(authors - {""}):
                    pipe.zrem(k.user_runs(author, shard), run_id)
                pipe.zrem(k.finished(shard), run_id)
                pipe.zrem(k.active(shard), run_id)
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
        # Walk every shard's set across calls, `limit` runs at a time.
        shard, start = self._check_cursor
        run_ids = await self.redis.zrange(k.active(shard), start, start + limit - 1)
        if len(run_ids) < limit:
            self._check_cursor = ((shard + 1) % k.shards, 0)
        else:
            self._check_cursor = (shard, start + limit)
        run_ids = [r for r in run_ids if valid_run_id(r, k)]
        if not run_ids:
            return []
        sec, usec = await self.redis.time()
        async with self.redis.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.hmget(k.run(run_id), ["status", "updated_at", "lease_until"])
            rows = await pipe.execute()
        now = sec + usec / 1e6
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
                res = await self.scripts.repair_run(run_id, stuck_after, gate_ids, shard=shard)
                if res is not RepairOutcome.RETRY:
                    break
            if res is RepairOutcome.REPAIRED:
                repaired.append(run_id)
        return repaired

    # --- events -----------------------------------------------------------------------
    def event_consumer(
        self, group: str, consumer: str, *, claim_idle_ms: int = 30_000
    ) -> EventConsumer:
        """A consumer-group reader of every shard's events stream (on one Redis node; on
        Redis Cluster use :meth:`event_consumers`)."""
        return EventConsumer(self.redis, self.keys, group, consumer, claim_idle_ms=claim_idle_ms)

    def event_consumers(
        self, group: str, consumer: str, *, claim_idle_ms: int = 30_000
    ) -> list[EventConsumer]:
        """Readers that together cover every shard's events: one on a single Redis node, one
        per shard on Redis Cluster (a read cannot span slots). Run each in its own loop."""
        return [
            EventConsumer(
                self.redis,
                self.keys,
                group,
                consumer,
                shards=[self.keys.shard_of_stream(s) for s in streams],
                claim_idle_ms=claim_idle_ms,
            )
            for streams in stream_groups(
                self.redis, [self.keys.events(s) for s in self.keys.all_shards()]
            )
        ]
