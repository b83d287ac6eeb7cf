"""Gateway.continue_run: a reply continues a run's conversation, with who said it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from agent_core import ContinueOutcome, Decision, InvalidState, RunNotFound, RunStatus
from agent_core.script_replies import LeaseStatus
from agent_core.scripts import Scripts
from agent_core.testing import FakeOpenAI, call, reply
from tests.agents import read_journal
from tests.core.harness import Harness


def wire(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(role, content) of each message of a request, without the system message."""
    return [(m["role"], m.get("content") or "") for m in messages if m["role"] != "system"]


async def test_continuing_a_completed_run_starts_its_next_turn_with_the_whole_history(
    harness: Harness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script("hello", [reply("hi, what next?"), reply("done: bye")])
    gw = harness.gateway
    run = await gw.start_run("hello", requested_by="U1", origin={"channel": "C1"})
    assert (await harness.wait_finished(run.run_id)).final == "hi, what next?"

    assert await gw.continue_run(run.run_id, "say bye", by="U2") is ContinueOutcome.STARTED
    again = await gw.wait(run.run_id, timeout=10)
    assert (again.status, again.final) == (RunStatus.COMPLETED, "done: bye")

    second = fake_openai.requests_for("hello")[-1]["messages"]
    assert wire(second) == [("user", "hello"), ("assistant", "hi, what next?"), ("user", "say bye")]
    # Authors are kept apart: the model gets plain Chat Completions messages.
    assert all(set(m) <= {"role", "content", "tool_calls", "tool_call_id"} for m in second)
    history = await gw.history(run.run_id, with_authors=True)
    assert [m.get("by") for m in history] == ["U1", None, "U2", None]
    continued = await harness.wait_event(run.run_id, "run.continued")
    assert continued.data == {
        "run_id": run.run_id,
        "by": "U2",
        "queued": False,
        "origin": {"channel": "C1"},
    }
    # The run is in U2's /agent status too, and purging it leaves neither index behind.
    assert [r.run_id for r in await gw.runs_for_user("U2")] == [run.run_id]
    assert await gw.purge_finished(0) == 1
    shard = harness.keys.shard_of(run.run_id)
    for user in ("U1", "U2"):
        assert await harness.redis.zcard(harness.keys.user_runs(user, shard)) == 0


async def test_a_message_while_awaiting_approval_is_queued_for_the_next_model_turn(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script(
        "delete 42",
        [call("delete_user", {"user_id": "42"}), reply("deleted, and noted")],
    )
    gw = harness.gateway
    run = await gw.start_run("delete 42", requested_by="U1")
    await harness.opened_gates(run.run_id, 1)
    assert await gw.continue_run(run.run_id, "also log it", by="U2") is ContinueOutcome.QUEUED
    assert await gw.continue_run(run.run_id, "thanks", by="U3") is ContinueOutcome.QUEUED
    assert (await gw.get_run(run.run_id)).status is RunStatus.AWAITING_APPROVAL  # type: ignore[union-attr]
    queued = [e for e in await harness.events() if e.type.value == "run.continued"]
    assert [(e.data["by"], e.data["queued"]) for e in queued] == [("U2", True), ("U3", True)]

    [gate] = await gw.pending_gates(run.run_id)
    await gw.decide(gate.gate_id, Decision.APPROVE, by="U9")
    done = await harness.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "deleted, and noted")
    assert read_journal(str(journal)) == ["delete_user:42"]

    last = wire(fake_openai.requests_for("delete 42")[-1]["messages"])
    assert [r for r, _ in last] == ["user", "assistant", "tool", "user", "user"]
    assert last[-2:] == [("user", "also log it"), ("user", "thanks")]
    history = await gw.history(run.run_id, with_authors=True)
    assert [m.get("by") for m in history if m["role"] == "user"] == ["U1", "U2", "U3"]
    assert await harness.redis.llen(harness.keys.run_inbox(run.run_id)) == 0


async def test_a_gate_after_a_continuation_names_its_author_among_its_requesters(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script(
        "start",
        [reply("ready"), call("delete_user", {"user_id": "7"}), reply("gone")],
    )
    gw = harness.gateway
    run = await gw.start_run("start", requested_by="U1")
    await harness.wait_finished(run.run_id)
    await gw.continue_run(run.run_id, "delete user 7", by="U2")
    [opened] = await harness.opened_gates(run.run_id, 1)
    assert (opened.data["requested_by"], opened.data["requesters"]) == ("U1", ["U1", "U2"])
    [gate] = await gw.pending_gates(run.run_id)
    # The bot refuses U1's and U2's approval (self-approval).
    assert (gate.requested_by, gate.requesters) == ("U1", ["U1", "U2"])


async def test_a_cancelled_run_does_not_continue(harness: Harness, fake_openai: FakeOpenAI) -> None:
    fake_openai.script("delete 5", [call("delete_user", {"user_id": "5"}), reply("x")])
    gw = harness.gateway
    run = await gw.start_run("delete 5", requested_by="U1")
    await harness.opened_gates(run.run_id, 1)
    await gw.cancel_run(run.run_id, by="U1")
    with pytest.raises(InvalidState, match="cancelled"):
        await gw.continue_run(run.run_id, "go on", by="U1")
    with pytest.raises(RunNotFound):
        await gw.continue_run("r-00zzzzzzzzzz", "go on", by="U1")
    with pytest.raises(ValueError):
        await gw.continue_run(run.run_id, "   ", by="U1")
    assert len(await gw.history(run.run_id)) == 2


async def test_a_failed_run_continues_and_counts_its_turns_afresh(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    from tests.agents import ops
    from tests.core.conftest import core_settings

    h = Harness(redis, core_settings(redis_url, fake_openai.base_url, MAX_TURNS=1), ops)
    h.start_worker()
    try:
        fake_openai.script("loop", [call("lookup", {"key": "a"}), reply("answered")])
        run = await h.gateway.start_run("loop", requested_by="U1")
        failed = await h.wait_finished(run.run_id)
        assert failed.status is RunStatus.FAILED and "MAX_TURNS" in (failed.error or "")
        assert await h.gateway.continue_run(run.run_id, "just answer", by="U1") == "started"
        done = await h.gateway.wait(run.run_id, timeout=10)
        assert (done.status, done.final, done.error) == (RunStatus.COMPLETED, "answered", None)
    finally:
        await h.close()


# --- crash safety: the inbox moves to the history under the lease, in one script ---------
async def lease(scripts: Scripts, run_id: str, ms: int = 60_000) -> str:
    res = await scripts.acquire_lease(run_id, lease_ms=ms, worker="test")
    assert res.status is LeaseStatus.OK, res
    return res.fence


async def test_the_history_read_after_a_script_survives_an_emptied_script_cache(
    observer: Harness, redis: Redis
) -> None:
    """READ_FOR_MODEL's history comes from an LRANGE pipelined after the script. A server
    that lost its scripts (restarted, a replica just promoted) answers the EVALSHA with
    NOSCRIPT: the pair is sent again with the script whole, and the read is the same."""
    gw, k = observer.gateway, observer.keys
    run = await gw.start_run("cache", requested_by="U1")
    rid = run.run_id
    await redis.hset(k.run(rid), mapping={"status": "running"})
    assert await gw.continue_run(rid, "queued", by="U2") is ContinueOutcome.QUEUED
    scripts = Scripts(redis, k)
    fence = await lease(scripts, rid)
    await scripts.read_for_model(rid, "0")  # registered and cached once
    await redis.script_flush()
    out = await scripts.read_for_model(rid, fence)
    assert [json.loads(m)["content"] for m in out.history] == ["cache", "queued"]
    assert out.fence == fence and out.phase == "model"
    assert await redis.llen(k.run_inbox(rid)) == 0


async def test_a_resume_job_that_finds_its_run_in_phase_model_still_reads_the_history(
    observer: Harness, redis: Redis
) -> None:
    """A job naming a turn is expected in phase `tools` (no history pipelined after its
    ACQUIRE_LEASE). Should an earlier attempt have closed that turn already, the run is in
    phase `model`: the history is then read in one more round trip, never left empty."""
    gw, k = observer.gateway, observer.keys
    run = await gw.start_run("resumed late", requested_by="U1")
    rid = run.run_id
    await redis.hset(k.run(rid), mapping={"status": "running", "phase": "model", "turn": "1"})
    scripts = Scripts(redis, k)
    lease = await scripts.acquire_lease(
        rid, lease_ms=60_000, worker="test", begin_agent="a", turn="0"
    )
    assert lease.status is LeaseStatus.OK and lease.began is not None
    read = lease.began.read
    assert read is not None and read.phase == "model"
    assert [json.loads(m)["content"] for m in read.history] == ["resumed late"]


async def test_queued_messages_move_only_under_a_current_lease(
    observer: Harness, redis: Redis
) -> None:
    gw, k = observer.gateway, observer.keys
    run = await gw.start_run("inbox", requested_by="U1")
    rid = run.run_id
    await redis.hset(k.run(rid), mapping={"status": "running"})
    assert await gw.continue_run(rid, "one", by="U2") is ContinueOutcome.QUEUED
    assert await gw.continue_run(rid, "two", by="U3") is ContinueOutcome.QUEUED
    scripts = Scripts(redis, k)
    fence = await lease(scripts, rid)

    # A stale fence (a worker taken over) moves nothing: the messages stay queued.
    await scripts.read_for_model(rid, "0")
    assert await redis.llen(k.run_inbox(rid)) == 2
    assert len(await gw.history(rid)) == 1

    out = await scripts.read_for_model(rid, fence)
    assert [json.loads(m)["content"] for m in out.history] == ["inbox", "one", "two"]
    assert await redis.llen(k.run_inbox(rid)) == 0
    assert await redis.hget(k.run(rid), "last_by") == "U3"

    # A final answer that crossed a queued message does not finish the run.
    assert await gw.continue_run(rid, "three", by="U2") is ContinueOutcome.QUEUED
    after = await scripts.record_turn(
        {"run_id": rid},
        0,
        fence,
        assistant=json.dumps({"role": "assistant", "content": "early answer"}),
        done=True,
        final="early answer",
        completed="{}",
        now="1",
        fields=[],
    )
    got = after.run
    assert got is not None
    assert (got["status"], got["phase"], got["turn"]) == ("running", "model", "1")
