"""A call's requesters: everyone whose message the model had read when it asked for it, the
run's starter first, inherited by sub-agents and shown to approver rules."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis

from agent_core import Agent, ContinueOutcome
from agent_core.scripts import Scripts
from agent_core.testing import FakeOpenAI, call, reply, tool_messages
from tests.agents import desk, read_journal, ruled
from tests.core.conftest import core_settings
from tests.core.harness import Harness
from tests.core.test_subagents import child_gate

pytestmark = pytest.mark.timeout(60)


async def answered(h: Harness, run_id: str, final: str, timeout: float = 15) -> None:
    """Wait until the run's latest answer is ``final`` (a continued run finishes twice)."""
    for _ in range(int(timeout * 20)):
        run = await h.gateway.get_run(run_id)
        if run is not None and run.status.finished and run.final == final:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} never answered {final!r}: {run}")


@pytest.fixture
async def desk_h(agent_harness: Callable[[Agent], Harness]) -> Harness:
    return agent_harness(desk)


@pytest.fixture
async def ruled_h(agent_harness: Callable[[Agent], Harness]) -> Harness:
    return agent_harness(ruled)


async def test_a_sub_agents_gate_names_every_person_the_top_run_had_read(
    desk_h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    h = desk_h
    fake_openai.script(
        "a refund for us",
        [reply("Which order?"), call("billing", {"task": "refund order 7"}), reply("refunded")],
    )
    fake_openai.script("refund order 7", [call("refund", {"order": 7}), reply("order 7 refunded")])
    run = await h.gateway.start_run("a refund for us", requested_by="U1")
    assert (await h.wait_finished(run.run_id)).final == "Which order?"
    assert await h.gateway.continue_run(run.run_id, "order 7", by="U2") is ContinueOutcome.STARTED

    child_id, gate = await child_gate(h, run.run_id)
    assert gate["requested_by"] == "U1"
    assert gate["requesters"] == ["U1", "U2"]
    stored = await h.gateway.get_gate(gate["gate_id"])
    assert stored is not None and stored.requesters == ["U1", "U2"]
    child = await h.gateway.get_run(child_id)
    assert child is not None and (child.requested_by, child.requesters) == ("U1", ["U1", "U2"])

    assert (await h.gateway.decide(gate["gate_id"], "approve", by="U3")).applied
    await answered(h, run.run_id, "refunded")
    assert read_journal(str(journal)) == ["refund:7"]


async def test_approver_rules_get_the_primary_requester_and_the_full_set(
    ruled_h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    h = ruled_h
    fake_openai.script(
        "clean up",
        [
            reply("What should go?"),
            call("delete_user", {"user_id": "shared"}),
            reply("not deleted"),
        ],
    )
    run = await h.gateway.start_run("clean up", requested_by="U1")
    await h.wait_finished(run.run_id)
    await h.gateway.continue_run(run.run_id, "the shared user", by="U2")
    await answered(h, run.run_id, "not deleted")
    last = fake_openai.requests_for("clean up")[-1]["messages"]
    assert "asked by U1; requesters U1, U2" in tool_messages(last)[-1]["content"]
    assert read_journal(str(journal)) == []


async def test_a_run_stored_before_requesters_existed_gets_them_from_its_history(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI
) -> None:
    # A run written by the previous version: no `requesters` field, authors in the history.
    # No worker: the test plays the worker's part itself (the lease, the model's read).
    idle = Harness(redis, core_settings(redis_url, fake_openai.base_url), desk)
    gw, k = idle.gateway, idle.keys
    run = await gw.start_run("old run", requested_by="U1")
    rid = run.run_id
    await redis.hdel(k.run(rid), "requesters")
    await redis.rpush(k.history(rid), json.dumps({"role": "user", "content": "me too"}))
    await redis.hset(k.authors(rid), "1", "U2")
    await redis.hset(k.run(rid), mapping={"status": "running"})
    assert await gw.continue_run(rid, "and this", by="U3") is ContinueOutcome.QUEUED
    scripts = Scripts(redis, k)
    res = await scripts.acquire_lease(rid, lease_ms=5000, worker="test")
    await scripts.read_for_model(rid, res.fence)
    assert json.loads(await redis.hget(k.run(rid), "requesters")) == ["U1", "U2", "U3"]
    again = await gw.get_run(rid)
    assert again is not None and again.requesters == ["U1", "U2", "U3"]
    await idle.close()
