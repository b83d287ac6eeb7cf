"""A deployment of the previous version, for the key-layout migration tests: every process
named its keys with the old hash tags (``{t:3}``). The worker is this version's, built while
``agent_core.worker`` makes its keys with ``Keys(..., legacy=True)``: the key names are the
only difference between the two versions."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import AsyncOpenAI
from redis.asyncio import Redis

from agent_core import Agent, Gateway, Keys, RunStatus, Settings
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


async def paused_old_deployment(
    redis: Redis,
    agent: Agent,
    settings: Settings,
    fake: FakeOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    runs: int = 4,
) -> OldDeployment:
    """``runs`` runs (started with idempotency keys, so their start keys have a TTL), each
    paused on an open gate of ``delete_user``; the old worker stopped."""
    old = Keys(settings.key_prefix, settings.shards, legacy=True)
    gateway = Gateway(redis, old, agent_name=agent.name)
    worker, client = old_worker(redis, agent, settings, monkeypatch)
    task = asyncio.create_task(worker.run())
    deployment = OldDeployment(old, {}, {}, {})
    try:
        for i in range(runs):
            text = f"delete user {i}"
            fake.script(text, [call("delete_user", {"user_id": str(i)}), reply(f"user {i} gone")])
            run = await gateway.start_run(text, "U1", idempotency_key=f"trigger-{i}")
            deployment.tasks[run.run_id] = text
            deployment.triggers[run.run_id] = f"trigger-{i}"
        for run_id in deployment.tasks:
            paused = await gateway.wait(run_id, "awaiting_approval", timeout=20)
            assert paused.status is RunStatus.AWAITING_APPROVAL, paused
            deployment.gates[run_id] = (await gateway.pending_gates(run_id))[0].gate_id
    finally:
        worker.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 15)
        await client.close()
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
