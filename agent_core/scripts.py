"""The Lua scripts: every state transition that must be atomic, and the one class that runs
them (:class:`Scripts`).

Each script is a file of ``agent_core/lua/`` with a header naming its KEYS, ARGV and reply
and named locals; shared helpers (the lease guard, the clock, a step's record, closing a
gate, reporting to a parent, the requesters) are ``lua/include/`` files, included (see
:mod:`agent_core.script_loader`). :class:`Scripts` has one method per script: it builds the
script's KEYS (from :mod:`agent_core.keys`; no key is built inside Lua, and every key of a
script is in one slot: the run's shard) and ARGV from named arguments, and turns the reply
into a type of :mod:`agent_core.script_replies`. Nothing else builds a script's KEYS. (The
gates' methods are written in :mod:`agent_core.gate_scripts`, a part of :class:`Scripts`.)

Every script is safe to run twice (a command is retried after a connection error or through
a failover): the second run changes nothing, and when the first run's reply was lost it
answers as the first did, recognising its own effect (a call's claimant, the attempt that
decided a gate or took a lease, the run's last step under a fence). Every script validates
its inputs before its first write, so none can fail half-way through.

Leases and fencing: a worker advances a run only while it holds the run's lease, kept in the
run hash as ``fence`` (a counter bumped at every acquisition: the fencing token) and
``lease_until`` (Redis clock). Every script that advances a run takes the worker's fence and
checks, inside the script, that it is still the current one and the lease not released
(``lua/include/lease.lua``). A worker paused past its lease and taken over gets ``lost`` and
writes nothing.

Events are appended without MAXLEN: the worker's trimmer removes them only once every
consumer group has read them (see :mod:`agent_core.trimmer`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis

from .connections import eval_replicated
from .gate_scripts import GateScripts
from .keys import Keys
from .script_replies import (
    Began,
    CallResult,
    Cancelled,
    CancelOutcome,
    Claim,
    ClaimOutcome,
    CompleteOutcome,
    ContinueReply,
    FailOutcome,
    GateToOpen,
    Lease,
    LeaseStatus,
    ModelRead,
    OpenOutcome,
    RepairOutcome,
    RetryOutcome,
    SettleOutcome,
    SpawnOutcome,
    Step,
    WaitOutcome,
    WorkerRecords,
    pairs,
    text,
)


def _flat(fields: dict[str, str] | Sequence[str]) -> list[str]:
    if isinstance(fields, dict):
        return [x for kv in fields.items() for x in kv]
    return list(fields)


def _step(reply: Any, history: list[bytes] | None = None) -> Step:
    """RECORD_TURN's or FINISH_TURN's reply as a :class:`Step` (``history``: FINISH_TURN's
    read, the LRANGE after it)."""
    if reply == "lost" or (isinstance(reply, list) and reply[:1] == ["lost"]):
        return Step(lost=True)
    if not reply:
        return Step()
    if reply[:1] == ["read"]:
        n = int(reply[1])
        return Step(run=pairs(reply[2 : 2 + n]), read=ModelRead.of(reply[2 + n :], history))
    if reply[:1] == ["recorded"]:
        opened = OpenOutcome(text(reply[1])) if reply[1] else None
        turn, gates = None, None
        if len(reply) > 5:
            turn = pairs(reply[4])
            gates = {h["gate_id"]: h for h in map(pairs, reply[5]) if h.get("gate_id")}
        return Step(
            run=pairs(reply[3]),
            gates=opened,
            finished=reply[2] == "1",
            turn=turn,
            gate_hashes=gates,
        )
    return Step(run=pairs(reply))


class Scripts(GateScripts):
    """The core's scripts on one client, one method per script."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        super().__init__(redis)
        self.keys = keys

    # --- keys shared by several scripts ----------------------------------------------------
    def _parent_keys(self, run_id: str, family: dict[str, str]) -> list[str]:
        """The parent's hash, the parent's turn hash and the shard's jobs stream, for a
        script that may report to the run's parent (``family``: the run's ``parent`` and
        ``parent_turn``); for a run without parent, its own hash twice (never written as a
        parent: the report is skipped) and the jobs stream."""
        k = self.keys
        jobs = k.jobs(k.shard_of(run_id))
        parent = family.get("parent")
        if not parent:
            return [k.run(run_id), k.run(run_id), jobs]
        return [k.run(parent), k.turn(parent, int(family.get("parent_turn") or 0)), jobs]

    def _parent_gate_key(self, run_id: str, family: dict[str, str]) -> str:
        """The gate hash of the parent's call that started this child run (``family``'s
        ``parent_gate``), where its outcome is audited; the run's own hash when there is
        none (the script finds no such gate there and audits nothing)."""
        gate_id = family.get("parent_gate") or ""
        k = self.keys
        if family.get("parent") and k.owns(gate_id) and k.shard_of(gate_id) == k.shard_of(run_id):
            return k.gate(gate_id)
        return k.run(run_id)

    # --- runs and jobs ---------------------------------------------------------------------
    async def start_run(
        self,
        run_id: str,
        *,
        idempotency_key: str | None,
        requested_by: str,
        first_message: str,
        now: str,
        ttl: int,
        fields: dict[str, str],
    ) -> str:
        """START_RUN: the run id, the new one or the one the key already started."""
        k = self.keys
        shard = k.shard_of(run_id)
        keys = [
            k.start_key(idempotency_key) if idempotency_key else k.run(run_id),
            k.run(run_id),
            k.history(run_id),
            k.user_runs(requested_by, shard),
            k.active(shard),
            k.jobs(shard),
            k.authors(run_id),
        ]
        args = ["1" if idempotency_key else "0", run_id, first_message, now, ttl, *_flat(fields)]
        return text(await self._run("start_run", keys, args))

    async def acquire_lease(
        self,
        run_id: str,
        *,
        lease_ms: int,
        worker: str,
        begin_agent: str | None = None,
        turn: str | None = None,
        attempt: str = "",
        gate_ids: Sequence[str] = (),
        batch: str = "",
        replicas: int = 0,
        wait_ms: int = 0,
    ) -> Lease:
        """ACQUIRE_LEASE; with ``begin_agent``, BEGIN_RUN too (run.started names that agent
        when the run names none) and the history for the model when the run is in phase
        ``model``; with ``turn`` that turn's hash when the run is still at it, in phase
        ``tools``, the hashes of ``gate_ids`` (the resume job's), and with ``batch`` (see
        acquire_lease.lua) its approved calls claimed at once. ``replicas``: WAIT for that
        many replicas after it (the claims; see :func:`eval_replicated`)."""
        k = self.keys
        keys = [k.run(run_id)]
        args: list[Any] = [lease_ms, worker]
        if begin_agent is not None:
            keys += [k.events(k.shard_of(run_id)), k.history(run_id), k.authors(run_id)]
            keys.append(k.run_inbox(run_id))
            args += [begin_agent, turn or "", attempt, batch if turn is not None else ""]
            if turn is not None:
                keys.append(k.turn(run_id, int(turn)))
                keys += [k.gate(g) for g in gate_ids]
                args += list(gate_ids)
        elif attempt:
            args += ["", "", attempt]
        reached = -1
        history: list[bytes] | None = None
        if replicas > 0 and batch and turn is not None:
            res, reached = await eval_replicated(
                self.redis, self.source("acquire_lease"), keys, args, replicas, wait_ms
            )
        elif begin_agent is not None and turn is None:
            # A job without a turn finds its run in phase `model`: the history is read in
            # the same round trip, right after the script. Not atomic with it, and it need
            # not be: while this lease holds, only its holder writes the history, and a
            # holder that lost it between the two reads fails its next fenced write.
            res, history = await self._run_then_lrange("acquire_lease", keys, args, keys[2])
        else:
            res = await self._run("acquire_lease", keys, args)
        status = LeaseStatus(res[0])
        if status is LeaseStatus.BUSY:
            return Lease(status, busy_for=float(res[1]))
        if status is LeaseStatus.MISSING:
            return Lease(status)
        began = None
        if len(res) > 3:
            read = res[3][5] if len(res[3]) > 5 else None  # READ_FOR_MODEL's reply, if any
            if history is None and read:
                # A resume job found its run in phase `model` (its turn was recorded by an
                # earlier attempt): the history costs one more round trip here.
                history = [m.encode() for m in await self.redis.lrange(keys[2], 0, -1)]
            began = Began.of(res[3], history)
        return Lease(status, str(res[1]), res[2], began=began, replicas=reached)

    async def renew_lease(self, run_id: str, fence: str, lease_ms: int) -> bool:
        """RENEW_LEASE: True if renewed, False once the run is no longer the caller's."""
        return bool(await self._run("renew_lease", [self.keys.run(run_id)], [fence, lease_ms]))

    async def release_lease(self, run_id: str, fence: str) -> bool:
        """RELEASE_LEASE: True if released (only its holder can)."""
        return bool(await self._run("release_lease", [self.keys.run(run_id)], [fence]))

    async def finish_job(
        self, jobs_stream: str, group: str, message_id: str, run_id: str, fence: str
    ) -> bool:
        """FINISH_JOB: ack and delete the job, release the lease; False when it was lost."""
        keys = [jobs_stream, self.keys.run(run_id)]
        return bool(await self._run("finish_job", keys, [group, message_id, fence]))

    async def requeue_job(
        self, jobs_stream: str, group: str, message_id: str, fields: Sequence[str]
    ) -> str | None:
        """REQUEUE_JOB: the new entry's id, None when the entry is no longer pending."""
        res = await self._run("requeue_job", [jobs_stream], [group, message_id, *fields])
        return text(res) if res else None

    async def begin_run(self, run_id: str, fence: str, agent: str, now: str) -> Began:
        """BEGIN_RUN: take the run to ``running`` when a job for it starts."""
        k = self.keys
        keys = [k.run(run_id), k.events(k.shard_of(run_id))]
        return Began.of(await self._run("begin_run", keys, [fence, agent, now]))

    async def repair_run(
        self, run_id: str, stuck_after: float, gate_ids: Sequence[str], *, shard: int | None = None
    ) -> RepairOutcome:
        """REPAIR_RUN, given every gate of the run; ``shard``: the shard whose active-runs
        set listed the run (the run's own by default)."""
        k = self.keys
        shard = k.shard_of(run_id) if shard is None else shard
        keys = [
            k.run(run_id),
            k.jobs(shard),
            k.run_gates(run_id),
            k.active(shard),
            *(k.gate(g) for g in gate_ids),
        ]
        res = await self._run("repair_run", keys, [stuck_after, run_id, *gate_ids])
        return RepairOutcome(text(res))

    # --- model turns -----------------------------------------------------------------------
    async def read_for_model(self, run_id: str, fence: str) -> ModelRead:
        """READ_FOR_MODEL: the lease as it stands and the history (the inbox moved in)."""
        k = self.keys
        keys = [k.run(run_id), k.history(run_id), k.authors(run_id), k.run_inbox(run_id)]
        reply, history = await self._run_then_lrange("read_for_model", keys, [fence], keys[1])
        return ModelRead.of(reply, history)

    async def record_turn(
        self,
        run: dict[str, str],
        turn: int,
        fence: str,
        *,
        assistant: str,
        done: bool,
        final: str,
        completed: str,
        now: str,
        fields: Sequence[str],
        gates: Sequence[GateToOpen] = (),
        top_run: str | None = None,
        job: tuple[str, str, str] | None = None,
    ) -> Step:
        """RECORD_TURN: the model's turn ``turn + 1`` (its calls, or with ``done`` the final
        answer; a child run's answer goes to its parent's call). With ``gates``, that turn's
        gates opened in the same step (``top_run``: the thread's, see :meth:`open_gates`);
        with ``job`` (stream, group, message id), the job finished too when the run then
        pauses or finishes (:attr:`Step.finished`)."""
        k = self.keys
        run_id = run["run_id"]
        shard = k.shard_of(run_id)
        keys = [
            k.run(run_id),
            k.history(run_id),
            k.turn(run_id, turn + 1),
            k.events(shard),
            k.finished(shard),
            k.active(shard),
            k.run_inbox(run_id),
            *self._parent_keys(run_id, run),
            self._parent_gate_key(run_id, run),
            *self._audit_keys(shard),
            job[0] if job else k.jobs(shard),
            k.deadlines(shard),
            k.run_gates(run_id),
            k.grants(top_run or run_id),
            k.nudges(shard),
            *(k.gate(g.gate_id) for g in gates),
        ]
        args: list[Any] = [fence, turn, assistant, "done" if done else "tools", final]
        args += [completed, now, "1" if run.get("parent") else "0"]
        args += [job[1], job[2]] if job else ["", ""]
        args.append(len(gates))
        for g in gates:
            args += [g.gate_id, g.timeout, g.fields, g.opened, g.decided]
        return _step(await self._run("record_turn", keys, [*args, *fields]))

    async def finish_turn(
        self,
        run_id: str,
        turn: int,
        fence: str,
        now: str,
        tool_messages: Sequence[str],
        *,
        read: bool = True,
        results: Sequence[CallResult] = (),
    ) -> Step:
        """FINISH_TURN: record ``results`` (calls this worker claimed and ran), append the
        tool messages and hand back to the model; with ``read``, what the next model call
        reads too (:attr:`Step.read`)."""
        k = self.keys
        shard = k.shard_of(run_id)
        keys = [k.run(run_id), k.history(run_id), k.authors(run_id), k.run_inbox(run_id)]
        keys += [k.turn(run_id, turn), k.events(shard), *self._audit_keys(shard)]
        args: list[Any] = [fence, turn, now, "1" if read else "0", len(results)]
        gate_at: dict[str, int] = {}
        for r in results:
            at = 0
            if r.gate_id:
                at = gate_at.setdefault(r.gate_id, len(gate_at) + 1)
            args += [r.call_id, r.result, r.event, r.outcome, at]
        keys += [k.gate(g) for g in gate_at]
        if not read:
            return _step(await self._run("finish_turn", keys, [*args, *tool_messages]))
        # The history in the same round trip, right after the script (see acquire_lease).
        reply, history = await self._run_then_lrange(
            "finish_turn", keys, [*args, *tool_messages], keys[1]
        )
        return _step(reply, history)

    # --- calls -----------------------------------------------------------------------------
    def _claim(
        self, run_id: str, turn: int, fence: str, call_id: str, idempotent: bool, attempt: str
    ) -> tuple[list[str], list[Any]]:
        keys = [self.keys.run(run_id), self.keys.turn(run_id, turn)]
        return keys, [fence, turn, call_id, "1" if idempotent else "0", attempt]

    @staticmethod
    def _claim_of(res: list[Any]) -> Claim:
        return Claim(ClaimOutcome(res[0]), text(res[1]) if len(res) > 1 else "")

    async def claim_call(
        self, run_id: str, turn: int, fence: str, call_id: str, *, idempotent: bool, attempt: str
    ) -> Claim:
        """CLAIM_CALL: claim a call before it runs (at most once unless ``idempotent``)."""
        keys, args = self._claim(run_id, turn, fence, call_id, idempotent, attempt)
        return self._claim_of(await self._run("claim_call", keys, args))

    async def claim_call_replicated(
        self,
        run_id: str,
        turn: int,
        fence: str,
        call_id: str,
        *,
        idempotent: bool,
        attempt: str,
        replicas: int,
        wait_ms: int,
    ) -> tuple[Claim, int]:
        """CLAIM_CALL then WAIT for ``replicas`` (see :func:`eval_replicated`); the claim
        and the replicas reached."""
        keys, args = self._claim(run_id, turn, fence, call_id, idempotent, attempt)
        res, reached = await eval_replicated(
            self.redis, self.source("claim_call"), keys, args, replicas, wait_ms
        )
        return self._claim_of(res), reached

    async def complete_call(
        self,
        run_id: str,
        turn: int,
        fence: str,
        call_id: str,
        result: str,
        event: str,
        *,
        gate_id: str | None = None,
        outcome: str = "executed",
    ) -> CompleteOutcome:
        """COMPLETE_CALL: a claimed call's result; ``event`` is tool.executed's data JSON
        without its closing brace. A gated call's ``outcome`` (executed | failed | in_doubt)
        goes to the audit trail with it."""
        k = self.keys
        shard = k.shard_of(run_id)
        keys = [k.run(run_id), k.turn(run_id, turn), k.events(shard), *self._audit_keys(shard)]
        if gate_id:
            keys.append(k.gate(gate_id))
        res = await self._run("complete_call", keys, [fence, call_id, result, event, outcome])
        return CompleteOutcome(text(res))

    async def settle_call(
        self,
        run_id: str,
        turn: int,
        fence: str,
        call_id: str,
        result: str,
        *,
        gate_id: str | None = None,
    ) -> SettleOutcome:
        """SETTLE_CALL: the result of a call that will not run; ``gate_id`` for an approved
        call (its ``not_run`` audit entry)."""
        keys = [self.keys.run(run_id), self.keys.turn(run_id, turn)]
        if gate_id:
            keys += [*self._audit_keys(self.keys.shard_of(run_id)), self.keys.gate(gate_id)]
        res = await self._run("settle_call", keys, [fence, turn, call_id, result])
        return SettleOutcome(text(res))

    # --- reopening a run -------------------------------------------------------------------
    async def retry_run(
        self, run_id: str, family: dict[str, str], *, by: str, now: str, attempt: str
    ) -> RetryOutcome:
        """RETRY_RUN; ``family``: the run's ``parent`` and ``parent_turn`` as read."""
        k = self.keys
        shard = k.shard_of(run_id)
        keys = [
            k.run(run_id),
            k.finished(shard),
            k.active(shard),
            k.jobs(shard),
            k.events(shard),
            *self._parent_keys(run_id, family)[:2],
        ]
        parent, parent_turn = family.get("parent", ""), family.get("parent_turn", "0")
        args = [run_id, by, now, parent, parent_turn, attempt]
        return RetryOutcome(text(await self._run("retry_run", keys, args)))

    async def continue_run(
        self,
        run_id: str,
        *,
        by: str,
        message: str,
        now: str,
        entry: str,
        dedupe: tuple[str, str, int] | None = None,
    ) -> ContinueReply:
        """CONTINUE_RUN; ``dedupe``: (dedupe key, this call's token, the record's TTL)."""
        k = self.keys
        shard = k.shard_of(run_id)
        keys = [
            k.run(run_id),
            k.history(run_id),
            k.authors(run_id),
            k.run_inbox(run_id),
            k.jobs(shard),
            k.active(shard),
            k.finished(shard),
            k.events(shard),
            k.user_runs(by, shard),
        ]
        args: list[Any] = [run_id, message, by, now, entry]
        if dedupe is not None:
            key, token, ttl = dedupe
            keys.append(k.seen_key(key, shard))
            args += [token, ttl]
        return ContinueReply(text(await self._run("continue_run", keys, args)))

    # --- sub-agents ------------------------------------------------------------------------
    async def spawn_child(
        self,
        parent_id: str,
        turn: int,
        fence: str,
        *,
        call_id: str,
        child_id: str,
        first_message: str,
        now: str,
        fields: dict[str, str],
    ) -> SpawnOutcome:
        """SPAWN_CHILD: the child run of a parent's call, once (under the parent's lease)."""
        k = self.keys
        shard = k.shard_of(parent_id)
        keys = [
            k.run(parent_id),
            k.turn(parent_id, turn),
            k.run(child_id),
            k.history(child_id),
            k.authors(child_id),
            k.active(shard),
            k.jobs(shard),
            k.children(parent_id),
        ]
        args = [fence, turn, call_id, child_id, first_message, now, *_flat(fields)]
        return SpawnOutcome(text(await self._run("spawn_child", keys, args)))

    async def wait_children(self, run_id: str, turn: int, fence: str, now: str) -> WaitOutcome:
        """WAIT_CHILDREN: pause a parent whose turn waits for child runs, or say go on."""
        keys = [self.keys.run(run_id), self.keys.turn(run_id, turn)]
        return WaitOutcome(text(await self._run("wait_children", keys, [fence, turn, now])))

    # --- stopping a run --------------------------------------------------------------------
    def _fail_keys(
        self, run_id: str, family: dict[str, str], turn: int, gate_ids: Sequence[str]
    ) -> list[str]:
        """FAIL_RUN's KEYS, in its order."""
        k = self.keys
        shard = k.shard_of(run_id)
        return [
            k.run(run_id),
            k.events(shard),
            k.finished(shard),
            k.deadlines(shard),
            k.run_gates(run_id),
            k.active(shard),
            *self._parent_keys(run_id, family),
            k.turn(run_id, turn),
            *self._audit_keys(shard),
            k.nudges(shard),
            *(k.gate(g) for g in gate_ids),
            self._parent_gate_key(run_id, family),
        ]

    async def fail_run(
        self,
        run_id: str,
        family: dict[str, str],
        turn: int,
        gate_ids: Sequence[str],
        *,
        fence: str,
        error: str,
        data: str,
        now: str,
        retryable: bool,
        told: str,
        not_run: str,
        in_doubt: str,
        attempt: str,
    ) -> FailOutcome:
        """FAIL_RUN, given the run's ``family`` (``parent``, ``parent_turn``), its current
        turn and every gate of the run."""
        keys = self._fail_keys(run_id, family, turn, gate_ids)
        args = [fence, error, data, now, run_id, "1" if retryable else "0", told, turn]
        args += [not_run, in_doubt, attempt, *gate_ids]
        return FailOutcome(text(await self._run("fail_run", keys, args)))

    async def cancel_run(
        self,
        run_id: str,
        family: dict[str, str],
        turn: int,
        gate_ids: Sequence[str],
        *,
        by: str,
        reason: str,
        told: str,
        attempt: str,
    ) -> Cancelled:
        """CANCEL_RUN, given the run's ``family``, its current turn and every gate."""
        k = self.keys
        shard = k.shard_of(run_id)
        keys = [
            k.run(run_id),
            k.deadlines(shard),
            k.events(shard),
            k.run_gates(run_id),
            k.finished(shard),
            k.active(shard),
            k.turn(run_id, turn),
            *self._parent_keys(run_id, family),
            *self._audit_keys(shard),
            k.nudges(shard),
            *(k.gate(g) for g in gate_ids),
            self._parent_gate_key(run_id, family),
        ]
        args = [by, reason, run_id, turn, told, attempt, *gate_ids]
        res = await self._run("cancel_run", keys, args)
        return Cancelled(CancelOutcome(res[0]), text(res[1]) if len(res) > 1 else "")

    # --- the audit trail ------------------------------------------------------------------
    async def trim_audit(self, shard: int, cut: str, limit: int = 1000) -> int:
        """TRIM_AUDIT: remove up to ``limit`` of a shard's audit entries older than the
        stream id ``cut``, the chain still verifiable; how many went."""
        return int(await self._run("trim_audit", self._audit_keys(shard), [cut, limit]))

    # --- deployment ------------------------------------------------------------------------
    async def announce_worker(
        self, presence_key: str, worker: str, record: str, stale_after: int
    ) -> str:
        """ANNOUNCE_WORKER: the worker's record in the presence hash; the Redis clock."""
        res = await self._run("announce_worker", [presence_key], [worker, record, stale_after])
        return text(res)

    async def read_workers(self, presence_key: str) -> WorkerRecords:
        """READ_WORKERS: the presence hash's records, with the Redis clock."""
        res = await self._run("read_workers", [presence_key], [])
        flat = [text(x) for x in res]
        return WorkerRecords(flat[0], list(zip(flat[1::2], flat[2::2], strict=False)))

    async def merge_stream(self, stream: str, record: str, entries: Sequence[str]) -> int:
        """MERGE_STREAM: append the old stream's entries (old id, field count, fields…)."""
        return int(await self._run("merge_stream", [stream, record], list(entries)))
