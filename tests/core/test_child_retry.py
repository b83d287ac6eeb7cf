"""Retrying a sub-agent's failed run: only while its parent still waits for that very run.

A child's failure is its parent's call result at once (FAIL_RUN). Retried after that, the
child would run its tools and model calls for an answer nobody reads, so ``retry_run``
refuses and names the top run to retry instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from agent_core import ChildRunSettled, RunStatus
from agent_core.testing import FakeOpenAI, call, calls, raw_response, reply, tool_messages
from tests.agents import desk, read_journal
from tests.core.conftest import core_settings
from tests.core.harness import Harness

pytestmark = pytest.mark.timeout(60)

UNAVAILABLE = {"error": {"message": "overloaded", "type": "server_error", "code": None}}
FLAKY = {"OPENAI_MAX_RETRIES": 1, "OPENAI_RETRY_BUDGET": 2}


@pytest.fixture
async def h(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> AsyncIterator[Harness]:
    harness = Harness(redis, core_settings(redis_url, fake_openai.base_url, **FLAKY), desk)
    harness.start_worker()
    try:
        yield harness
    finally:
        await harness.close()


def told(*parts: str) -> Any:
    def check(messages: list[dict[str, Any]]) -> None:
        texts = [str(m["content"]) for m in tool_messages(messages)]
        for p in parts:
            assert any(p in t for t in texts), texts

    return check


async def failed_child(h: Harness, parent_id: str) -> str:
    for _ in range(200):
        for child in await h.redis.smembers(h.keys.children(parent_id)):
            run = await h.gateway.get_run(child)
            if run is not None and run.status is RunStatus.FAILED:
                return str(child)
        await asyncio.sleep(0.05)
    raise AssertionError(f"no failed child of {parent_id}")


async def test_a_child_whose_failure_the_running_parent_read_is_not_retried(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """The parent's turn still waits on its own gate; the child failed retryably (its model
    kept answering 503) and the parent's call has that failure. A retry of the child would
    run its lookup and call the model again, and its answer would be dropped."""
    fake_openai.script(
        "delete 5 and ask billing",
        [
            calls([("delete_user", {"user_id": "5"}), ("billing", {"task": "look up 9"})]),
            reply("done", expect=told("sub-agent billing failed", "user 5 deleted")),
        ],
    )
    fake_openai.script("look up 9", [raw_response(UNAVAILABLE, status=503)])
    run = await h.gateway.start_run("delete 5 and ask billing", requested_by="U1")
    [own] = await h.opened_gates(run.run_id, 1)
    child_id = await failed_child(h, run.run_id)
    child = await h.gateway.get_run(child_id)
    assert child is not None and child.retryable
    asked = len(fake_openai.requests_for("look up 9"))
    # The provider is back: a retried child would now call lookup and answer.
    fake_openai.script("look up 9", [call("lookup", {"key": "9"}), reply("9 is nine")])

    with pytest.raises(ChildRunSettled) as refused:
        await h.gateway.retry_run(child_id, by="U1")
    assert refused.value.top_run == run.run_id
    assert f"retry the top run {run.run_id}" in str(refused.value)
    await asyncio.sleep(0.5)
    child = await h.gateway.get_run(child_id)
    assert child is not None and child.status is RunStatus.FAILED
    assert len(fake_openai.requests_for("look up 9")) == asked, "no model call for nobody"
    assert read_journal(str(journal)) == [], "no tool ran for nobody"

    await h.gateway.decide(own.data["gate_id"], "approve", by="U2")
    done = await h.wait_finished(run.run_id, timeout=15)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "done")
    assert read_journal(str(journal)) == ["delete_user:5"]
    assert fake_openai.errors == []


async def test_a_grandchild_retried_after_the_top_run_finished_names_the_top_run(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script("close the books", [call("billing", {"task": "book 6"}), reply("closed")])
    fake_openai.script("book 6", [call("ledger", {"task": "write off 6"}), reply("no ledger")])
    fake_openai.script("write off 6", [raw_response(UNAVAILABLE, status=503)])
    run = await h.gateway.start_run("close the books", requested_by="U1")
    done = await h.wait_finished(run.run_id, timeout=20)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "closed")
    [billing] = await h.redis.smembers(h.keys.children(run.run_id))
    [ledger] = await h.redis.smembers(h.keys.children(billing))
    fake_openai.script("write off 6", [call("lookup", {"key": "6"}), reply("written")])

    with pytest.raises(ChildRunSettled) as refused:
        await h.gateway.retry_run(ledger, by="U1")
    assert refused.value.top_run == run.run_id
    await asyncio.sleep(0.5)
    assert (await h.gateway.get_run(ledger)).status is RunStatus.FAILED  # type: ignore[union-attr]
    assert read_journal(str(journal)) == []
    # Nothing of the family moved: no run.retried, no new start.
    assert not [e for e in await h.events() if e.type.value == "run.retried"]


async def test_the_decision_is_the_parents_call_for_that_very_child(
    h: Harness, fake_openai: FakeOpenAI, redis: Redis
) -> None:
    """RETRY_RUN decides in one script from the parent's turn: the call must still be
    `child`, for this run, in a parent that has not finished. (A failure reports to the
    parent in the same script, so only a state written otherwise, by an older version or
    by hand, reaches the allowed branch.)"""
    fake_openai.script("ask billing", [call("billing", {"task": "look up 8"}), reply("ok")])
    fake_openai.script("look up 8", [raw_response(UNAVAILABLE, status=503)])
    run = await h.gateway.start_run("ask billing", requested_by="U1")
    child_id = await failed_child(h, run.run_id)
    await h.wait_finished(run.run_id, timeout=15)
    await h.close()  # no worker: the retried child stays queued
    rk, tk = h.keys.run(run.run_id), h.keys.turn(run.run_id, 1)
    cid = await redis.hget(h.keys.run(child_id), "parent_call")

    # The parent waits again on its call, but for another child run.
    await redis.hset(rk, "status", "awaiting_approval")
    await redis.hset(tk, mapping={f"state:{cid}": "child", f"child:{cid}": "r-0000000000zz"})
    with pytest.raises(ChildRunSettled):
        await h.gateway.retry_run(child_id, by="U1")
    # A finished parent waits on nothing, whatever its turn says.
    await redis.hset(tk, f"child:{cid}", child_id)
    await redis.hset(rk, "status", "completed")
    with pytest.raises(ChildRunSettled):
        await h.gateway.retry_run(child_id, by="U1")
    # Waiting on this very child: the retry goes ahead.
    await redis.hset(rk, "status", "awaiting_approval")
    again = await h.gateway.retry_run(child_id, by="U1")
    assert again.status is RunStatus.QUEUED
