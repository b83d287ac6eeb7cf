"""The programmatic gateway API: start runs, read them, decide gates, cancel, read events.

The Slack bot, a CLI and the tests all go through :class:`Gateway`. It never runs the model:
it writes to Redis and the workers pick the work up from the jobs stream.

The class holds the public methods and their documentation; the longer bodies live by
concept: :mod:`agent_core.run_control` (start, continue, retry), :mod:`agent_core.waiting`,
:mod:`agent_core.deciding`, :mod:`agent_core.upkeep` (due gates, purging, repairs) and
:mod:`agent_core.ids`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from redis.asyncio import Redis

from . import run_control
from .deciding import apply_decision, gate_of_call, gates_and_runs
from .events import EventConsumer
from .exceptions import InvalidState, RunNotFound
from .grants import Grants
from .ids import valid_gate_id as valid_gate_id
from .ids import valid_run_id as valid_run_id
from .keys import Keys
from .models import ContinueOutcome, DecideResult, Decision, Gate, GateStatus, Run, RunStatus
from .placement import ShardPicker
from .scripts import Scripts
from .settings import Settings
from .stopping import Stopper
from .streams import stream_groups
from .upkeep import Upkeep
from .waiting import FINISHED, wait_for

log = logging.getLogger(__name__)


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
        self.placement = ShardPicker(redis, self.keys)
        self.stopper = Stopper(redis, self.keys)
        self.grants = Grants(self)  # allow for this thread (agent_core.grants)
        self._upkeep = Upkeep(redis, self.keys, self.scripts)

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
        return await run_control.start_run(self, task, requested_by, origin, idempotency_key, agent)

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
        return await wait_for(self, run_id, targets, timeout)

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
        return await run_control.continue_run(self, run_id, message, by, dedupe_key)

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
        await self.stopper.cancel(run_id, by, reason, run_control.checked_attempt(attempt))
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
        return await run_control.retry_run(self, run_id, by, attempt)

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
        gate_id = await gate_of_call(self, run_id, call_id)
        status = decision.status.value
        return await self._apply(gate_id, status, by, reason, args_hash or "", run_id=run_id)

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
            for g, r in await gates_and_runs(self, gates)
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
        return await self._upkeep.due_gates(limit, shards)

    async def purge_finished(self, older_than: float, limit: int = 100) -> int:
        """Delete the keys of runs that finished more than ``older_than`` seconds ago.

        Several workers may purge at once: deleting twice is harmless. Returns how many runs
        were purged.
        """
        return await self._upkeep.purge_finished(older_than, limit)

    async def repair_stuck(self, stuck_after: float, limit: int = 200) -> list[str]:
        """Find runs that nothing will move on and repair them; the ids repaired.

        A run is stuck when it is not finished, no worker holds its lease, it made no
        progress for ``stuck_after`` seconds, and it waits for approval with no pending gate
        or has no job. It gets its pending count recounted and a resume job (an extra job is
        harmless). Several workers may check at once: a repaired run counts as progress.
        """
        return await self._upkeep.repair_stuck(stuck_after, limit)

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
