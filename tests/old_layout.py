"""A deployment of the previous version, for the key-layout migration tests: every process
named its keys with the old hash tags (``{t:3}``). The worker is this version's, built while
``agent_core.worker`` makes its keys with ``Keys(..., legacy=True)``: the key names are the
only difference between the two versions. :func:`live_state_and_old_writes`: such a worker
running for a moment beside this version's, after the upgrade, in the shard of live runs."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import AsyncOpenAI
from redis.asyncio import Redis

from agent_core import Agent, GateStatus, Gateway, Keys, RunStatus, Settings
from agent_core import worker as worker_module
from agent_core.testing import FakeOpenAI, call, reply
from agent_core.worker import Worker
from tests.agents import read_journal


@dataclass
class OldDeployment:
    keys: Keys  # the old layout's
    gates: dict[str, str]  # run id -> its open gate's id
    tasks: dict[str, str]  # run id -> task
    triggers: dict[str, str]  # run id -> the idempotency key it was started with


def old_worker(
    redis: Redis, agent: Agent, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> tuple[Worker, AsyncOpenAI]:
    client = AsyncOpenAI(api_key="sk-test", base_url=settings.openai_base_url, max_retries=0)
    with monkeypatch.context() as m:
        m.setattr(worker_module, "Keys", functools.partial(Keys, legacy=True))
        return Worker(redis, agent, client, settings), client


async def forget_audit_trail(redis: Redis, old: Keys) -> None:
    """Delete the audit trail this version's scripts kept under the old layout's names: the
    previous version kept none (the key names are not the only difference there)."""
    for shard in old.all_shards():
        await redis.delete(old.audit(shard), old.audit_head(shard))


async def paused_old_deployment(
    redis: Redis,
    agent: Agent,
    settings: Settings,
    fake: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    runs: int = 4,
    triggers: list[str] | None = None,
) -> OldDeployment:
    """``runs`` runs (started with idempotency keys, so their start keys have a TTL: by
    default ``trigger-<i>``, else ``triggers``), each paused on an open gate of
    ``delete_user``; the old worker stopped."""
    old = Keys(settings.key_prefix, settings.shards, legacy=True)
    gateway = Gateway(redis, old, agent_name=agent.name)
    worker, client = old_worker(redis, agent, settings, monkeypatch)
    task = asyncio.create_task(worker.run())
    deployment = OldDeployment(old, {}, {}, {})
    try:
        for i, trigger in enumerate(triggers or [f"trigger-{i}" for i in range(runs)]):
            text = f"delete user {i}"
            fake.script(text, [call("delete_user", {"user_id": str(i)}), reply(f"user {i} gone")])
            run = await gateway.start_run(text, "U1", idempotency_key=trigger)
            deployment.tasks[run.run_id] = text
            deployment.triggers[run.run_id] = trigger
        for run_id in deployment.tasks:
            paused = await gateway.wait(run_id, "awaiting_approval", timeout=20)
            assert paused.status is RunStatus.AWAITING_APPROVAL, paused
            deployment.gates[run_id] = (await gateway.pending_gates(run_id))[0].gate_id
    finally:
        worker.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 15)
        await client.close()
    await forget_audit_trail(redis, old)
    return deployment


async def approve_and_finish(gateway: Gateway, old: OldDeployment, journal: Path) -> None:
    """Approve every gate by its id (a button posted before the migration), then every run
    completes and each approved call ran once; a start's idempotency key still names its run."""
    for gate_id in old.gates.values():
        assert (await gateway.decide(gate_id, "approve", by="U2")).applied
    for run_id in old.gates:
        done = await gateway.wait(run_id, timeout=30)
        assert done.status is RunStatus.COMPLETED, done
        assert done.final == f"user {old.tasks[run_id].split()[-1]} gone"
    expected = Counter(f"delete_user:{t.split()[-1]}" for t in old.tasks.values())
    assert Counter(read_journal(str(journal))) == expected
    run_id, trigger = next(iter(old.triggers.items()))
    again = await gateway.start_run("delete user 0", "U1", idempotency_key=trigger)
    assert again.run_id == run_id, "the idempotency keys moved too"


@dataclass
class LiveState:
    """A deployment of this version with work in flight, and keys of the old layout written
    after it by a process of the previous version, in the same shard."""

    keys: Keys  # the new layout's
    shard: int
    approved: str  # a run whose approval was acknowledged: its resume job waits on the jobs stream
    waiting: str  # a run paused on a gate that must still expire
    gate: str  # that gate
    deadline: float  # its deadline (the score in the shard's deadlines)
    old: OldDeployment  # two runs of the old version, in the same shard:
    old_approved: str  # one approved, its resume job on the old jobs stream
    old_waiting: str  # one still paused, its gate in the old deadlines


async def live_state_and_old_writes(
    redis: Redis,
    agent: Agent,
    settings: Settings,
    fake: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    approval_timeout: float = 8,
) -> LiveState:
    """This version's worker pauses two runs (gates of ``approval_timeout`` s). Meanwhile a
    worker of the previous version starts for a moment: it creates its consumer groups (every
    shard's jobs stream) and pauses two runs in the same shard. Both workers stopped, one gate
    of each version is approved: the resume jobs wait on the two jobs streams."""
    keys = Keys(settings.key_prefix, settings.shards)

    def in_shard(prefix: str, count: int) -> list[str]:
        names = (f"{prefix}-{i}" for i in itertools.count())
        return list(itertools.islice((n for n in names if keys.shard_for(n) == shard), count))

    shard = keys.shard_for("trigger-0")
    approved_key, waiting_key = in_shard("live", 2)
    gateway = Gateway(redis, keys, agent_name=agent.name)
    new_settings = settings.model_copy(update={"approval_timeout": approval_timeout})
    client = AsyncOpenAI(api_key="sk-test", base_url=settings.openai_base_url, max_retries=0)
    worker = Worker(redis, agent, client, new_settings)
    task = asyncio.create_task(worker.run())
    runs = {}
    try:
        for user, key in (("7", approved_key), ("8", waiting_key)):
            text = f"delete user {user}"
            fake.script(text, [call("delete_user", {"user_id": user}), reply(f"user {user} gone")])
            runs[user] = (await gateway.start_run(text, "U1", idempotency_key=key)).run_id
        for run_id in runs.values():
            paused = await gateway.wait(run_id, "awaiting_approval", timeout=20)
            assert paused.status is RunStatus.AWAITING_APPROVAL, paused
        # While this version's worker runs.
        old = await paused_old_deployment(
            redis, agent, settings, fake, monkeypatch, triggers=in_shard("trigger", 2)
        )
    finally:
        worker.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 15)
        await client.close()
    approved_gate = (await gateway.pending_gates(runs["7"]))[0].gate_id
    assert (await gateway.decide(approved_gate, "approve", by="U2")).applied
    gate = (await gateway.pending_gates(runs["8"]))[0]
    deadline = await redis.zscore(keys.deadlines(shard), gate.gate_id)
    assert deadline is not None and abs(deadline - gate.deadline) < 0.01
    old_approved, old_waiting = old.gates
    assert {old.keys.shard_of(r) for r in old.gates} == {shard}
    old_gateway = Gateway(redis, old.keys, agent_name=agent.name)
    assert (await old_gateway.decide(old.gates[old_approved], "approve", by="U2")).applied
    await forget_audit_trail(redis, old.keys)
    return LiveState(
        keys, shard, runs["7"], runs["8"], gate.gate_id, deadline, old, old_approved, old_waiting
    )


async def assert_live_state_kept(redis: Redis, live: LiveState) -> None:
    """After the migration: the shard's jobs stream holds the acknowledged approval's resume
    job and the old approved run's, once each; both waiting gates keep their deadlines; every
    run is in the shard's active runs."""
    keys, shard = live.keys, live.shard
    jobs = await redis.xrange(keys.jobs(shard))
    assert Counter((f["type"], f["run_id"]) for _, f in jobs) == Counter(
        {("resume", live.approved): 1, ("resume", live.old_approved): 1}
    ), jobs
    deadlines = dict(await redis.zrange(keys.deadlines(shard), 0, -1, withscores=True))
    old_gate = live.old.gates[live.old_waiting]
    assert deadlines.keys() == {live.gate, old_gate}, deadlines
    assert deadlines[live.gate] == live.deadline
    active = set(await redis.zrange(keys.active(shard), 0, -1))
    assert active == {live.approved, live.waiting, live.old_approved, live.old_waiting}


async def finish_live_state(gateway: Gateway, live: LiveState, journal: Path) -> None:
    """With a worker of this version running: the approved call runs once, the waiting gate
    expires (the model is told), the old version's approved run resumes, and its waiting one
    is approved by its gate id (a button posted before) and resumes."""
    done = await gateway.wait(live.approved, timeout=30)
    assert done.status is RunStatus.COMPLETED and done.final == "user 7 gone", done
    expired = await gateway.wait(live.waiting, timeout=30)
    assert expired.status is RunStatus.COMPLETED, expired
    gate = await gateway.get_gate(live.gate)
    assert gate is not None and gate.status is GateStatus.EXPIRED, gate
    told = [m["content"] for m in await gateway.history(live.waiting) if m["role"] == "tool"]
    assert len(told) == 1 and "timed out" in told[0], told
    resumed = await gateway.wait(live.old_approved, timeout=30)
    assert resumed.status is RunStatus.COMPLETED and resumed.final == "user 0 gone", resumed
    assert (await gateway.decide(live.old.gates[live.old_waiting], "approve", by="U2")).applied
    resumed = await gateway.wait(live.old_waiting, timeout=30)
    assert resumed.status is RunStatus.COMPLETED and resumed.final == "user 1 gone", resumed
    assert Counter(read_journal(str(journal))) == Counter(
        ["delete_user:7", "delete_user:0", "delete_user:1"]
    )
