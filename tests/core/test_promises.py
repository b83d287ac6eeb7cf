"""The gate's promises against coerced arguments, cancellations, failures and odd model output.

Each test drives a real worker (in the test's event loop) against the test's redis-server and
the FakeOpenAI HTTP server, and asserts what a user would see: the text the model receives,
the tool's side effect (the journal), the gate's record and the events the bot turns into
cards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from agent_core import ArgsHashMismatch, GateStatus, Keys, LeaseLost, RunStatus
from agent_core.runner import args_hash
from agent_core.script_replies import LeaseStatus
from agent_core.scripts import Scripts
from agent_core.testing import FakeOpenAI, call, calls, raw_response, reply, tool_messages
from tests.agents import read_journal, strict
from tests.core.conftest import core_settings
from tests.core.harness import Harness


@pytest.fixture
async def strict_harness(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> AsyncIterator[Harness]:
    h = Harness(redis, core_settings(redis_url, fake_openai.base_url), strict)
    h.start_worker()
    try:
        yield h
    finally:
        await h.close()


async def take_lease(redis: Redis, keys: Keys, run_id: str, owner: str = "test") -> str:
    """Take the run's lease as a worker does, once the worker that paused it let it go."""
    for _ in range(200):
        res = await Scripts(redis, keys).acquire_lease(run_id, lease_ms=10_000, worker=owner)
        if res.status is LeaseStatus.OK:
            return res.fence
        await asyncio.sleep(0.02)
    raise AssertionError(f"the lease of run {run_id} was never free")


def tool_texts(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m["content"]) for m in tool_messages(messages)]


# --------------------------------------------------------------------------- 2. arguments
async def test_a_string_false_cannot_slip_past_the_approval_rule(
    strict_harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """``{"dry_run": "false"}`` used to reach the rule as a truthy string (no gate) and the
    tool as False: a real deploy without approval. Now it is an argument error."""

    def told_invalid(m: list[dict[str, Any]]) -> None:
        (text,) = tool_texts(m)
        assert "rejected before any approval or execution" in text, text
        assert "dry_run: Input should be a valid boolean" in text, text

    fake_openai.script(
        "deploy prod",
        [call("deploy", {"env": "prod", "dry_run": "false"}), reply("fixed", expect=told_invalid)],
    )
    run = await strict_harness.gateway.start_run("deploy prod", requested_by="U1")
    done = await strict_harness.wait_finished(run.run_id)
    assert done.status is RunStatus.COMPLETED
    assert read_journal(str(journal)) == []
    assert not [e for e in await strict_harness.events() if e.type.value == "gate.opened"]


async def test_the_rule_card_hash_and_tool_see_the_same_validated_arguments(
    strict_harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script(
        "real deploy",
        [call("deploy", {"env": "prod", "dry_run": False}), reply("deployed")],
    )
    run = await strict_harness.gateway.start_run("real deploy", requested_by="U1")
    [opened] = await strict_harness.opened_gates(run.run_id, 1)
    shown = {"env": "prod", "dry_run": False}
    assert opened.data["args"] == shown
    assert opened.data["args_hash"] == args_hash(shown)
    gid = opened.data["gate_id"]
    with pytest.raises(ArgsHashMismatch):
        await strict_harness.gateway.decide(gid, "approve", by="U2", args_hash="0" * 64)
    gate = await strict_harness.gateway.get_gate(gid)
    assert gate is not None and gate.status is GateStatus.PENDING  # nothing was decided
    res = await strict_harness.gateway.decide(gid, "approve", by="U2", args_hash=args_hash(shown))
    assert res.applied and res.gate.decided_hash == args_hash(shown)
    await strict_harness.wait_finished(run.run_id)
    assert read_journal(str(journal)) == ["deploy:prod:real"]


async def test_an_approved_call_runs_only_with_the_arguments_the_approver_saw(
    strict_harness: Harness, fake_openai: FakeOpenAI, journal: Path, redis: Redis
) -> None:
    def told_mismatch(m: list[dict[str, Any]]) -> None:
        (text,) = tool_texts(m)
        assert "no longer match what the approver saw" in text, text

    fake_openai.script(
        "delete 5",
        [call("delete_user", {"user_id": "5"}), reply("not done", expect=told_mismatch)],
    )
    run = await strict_harness.gateway.start_run("delete 5", requested_by="U1")
    [opened] = await strict_harness.opened_gates(run.run_id, 1)
    # Someone with write access to Redis swaps the stored call for another user.
    turn = strict_harness.keys.turn(run.run_id, 1)
    field = f"call:{opened.data['call_id']}"
    stored = json.loads(await redis.hget(turn, field))
    stored["args"] = {"user_id": "999"}
    await redis.hset(turn, field, json.dumps(stored))
    await strict_harness.gateway.decide(
        opened.data["gate_id"], "approve", by="U2", args_hash=opened.data["args_hash"]
    )
    done = await strict_harness.wait_finished(run.run_id)
    assert done.status is RunStatus.COMPLETED
    assert read_journal(str(journal)) == []


# --------------------------------------------------------------------------- 3. cancel
async def test_after_cancel_returns_no_call_starts_and_a_running_call_reports_after_it(
    redis: Redis,
    redis_url: str,
    fake_openai: FakeOpenAI,
    journal: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent that runs a turn's calls one at a time (``parallel_tool_calls=False``): a
    cancel while the first runs means the second never starts."""
    monkeypatch.setenv("TEST_SLOW_SECONDS", "1.0")
    fake_openai.script(
        "two transfers",
        [calls([("transfer", {"amount": 5}), ("delete_user", {"user_id": "9"})])],
    )
    one_by_one = dataclasses.replace(strict, parallel_tool_calls=False)
    h = Harness(redis, core_settings(redis_url, fake_openai.base_url), one_by_one)
    h.start_worker()
    try:
        await _cancel_while_the_first_call_runs(h, journal)
    finally:
        await h.close()


async def test_the_approved_calls_of_a_turn_start_together_and_a_cancel_reports_both_running(
    strict_harness: Harness,
    fake_openai: FakeOpenAI,
    journal: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """By default a turn's approved calls are claimed in one step and start together: a
    cancel while they run reports both running, and both report their results after it."""
    monkeypatch.setenv("TEST_SLOW_SECONDS", "1.0")
    fake_openai.script(
        "two transfers",
        [calls([("transfer", {"amount": 5}), ("delete_user", {"user_id": "9"})])],
    )
    h = strict_harness
    run = await h.gateway.start_run("two transfers", requested_by="U1")
    opened = await h.opened_gates(run.run_id, 2)
    by_tool = {e.data["tool"]: e.data["gate_id"] for e in opened}
    for gid in by_tool.values():
        await h.gateway.decide(gid, "approve", by="U2")
    for _ in range(200):
        if "transfer:start:5" in read_journal(str(journal)):
            break
        await asyncio.sleep(0.02)
    assert "delete_user:9" in read_journal(str(journal)), "started together"
    cancelled = await h.gateway.cancel_run(run.run_id, by="U1", reason="changed my mind")
    assert cancelled.status is RunStatus.CANCELLED
    ev = await h.wait_event(run.run_id, "run.cancelled")
    assert sorted(ev.data["running"]) == sorted(by_tool.values())
    assert ev.data["never_ran"] == []
    for tool in ("transfer", "delete_user"):
        done = await h.wait_event(run.run_id, "tool.executed", timeout=10, tool=tool)
        assert done.data["after_cancel"] is True and done.data["ok"] is True
    await asyncio.sleep(0.3)
    assert sorted(read_journal(str(journal))) == [
        "delete_user:9",
        "transfer:end:5",
        "transfer:start:5",
    ]


async def _cancel_while_the_first_call_runs(h: Harness, journal: Path) -> None:
    run = await h.gateway.start_run("two transfers", requested_by="U1")
    opened = await h.opened_gates(run.run_id, 2)
    by_tool = {e.data["tool"]: e.data["gate_id"] for e in opened}
    for gid in by_tool.values():
        await h.gateway.decide(gid, "approve", by="U2")
    for _ in range(200):
        if "transfer:start:5" in read_journal(str(journal)):
            break
        await asyncio.sleep(0.02)
    cancelled = await h.gateway.cancel_run(run.run_id, by="U1", reason="changed my mind")
    assert cancelled.status is RunStatus.CANCELLED
    ev = await h.wait_event(run.run_id, "run.cancelled")
    assert ev.data["running"] == [by_tool["transfer"]]
    assert ev.data["never_ran"] == [by_tool["delete_user"]]
    done = await h.wait_event(run.run_id, "tool.executed", timeout=10, tool="transfer")
    assert done.data["after_cancel"] is True and done.data["ok"] is True
    await asyncio.sleep(0.3)
    lines = read_journal(str(journal))
    assert lines == ["transfer:start:5", "transfer:end:5"]  # delete_user never started
    run_after = await h.gateway.get_run(run.run_id)
    assert run_after is not None and run_after.status is RunStatus.CANCELLED


async def test_a_failed_run_closes_its_pending_gates(
    strict_harness: Harness, fake_openai: FakeOpenAI, redis: Redis
) -> None:
    h = strict_harness
    fake_openai.script("fail me", [call("delete_user", {"user_id": "3"})])
    run = await h.gateway.start_run("fail me", requested_by="U1")
    [opened] = await h.opened_gates(run.run_id, 1)
    gid = opened.data["gate_id"]
    worker, _ = h.workers[0]
    fence = await take_lease(redis, h.keys, run.run_id)
    assert await worker.runner.fail(run.run_id, "the model endpoint is gone", fence)
    gate = await h.gateway.get_gate(gid)
    assert gate is not None
    assert (gate.status, gate.closed_by_failure) == (GateStatus.CANCELLED, True)
    assert gate.reason == "the run failed: the model endpoint is gone"
    ev = await h.wait_event(run.run_id, "gate.decided", gate_id=gid)
    assert ev.data["run_failed"] is True and ev.data["status"] == "cancelled"
    assert await redis.zscore(h.keys.deadlines(h.keys.shard_of(gid)), gid) is None
    late = await h.gateway.decide(gid, "approve", by="U2")
    assert not late.applied and late.gate.status is GateStatus.CANCELLED


async def test_only_the_lease_holder_can_fail_a_run(
    strict_harness: Harness, fake_openai: FakeOpenAI, redis: Redis
) -> None:
    h = strict_harness
    fake_openai.script("hold", [call("delete_user", {"user_id": "4"})])
    run = await h.gateway.start_run("hold", requested_by="U1")
    await h.opened_gates(run.run_id, 1)
    worker, _ = h.workers[0]
    stale = await take_lease(redis, h.keys, run.run_id, "a")
    await redis.hset(h.keys.run(run.run_id), "lease_until", "0")  # its lease ran out
    await take_lease(redis, h.keys, run.run_id, "b")
    with pytest.raises(LeaseLost):
        await worker.runner.fail(run.run_id, "stale", stale)
    assert await h.status(run.run_id) is RunStatus.AWAITING_APPROVAL


# --------------------------------------------------------------------------- 4. no hangs
async def test_repeated_and_empty_call_ids_get_unique_ids_every_server_accepts(
    strict_harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    def answered_each(m: list[dict[str, Any]]) -> None:
        assistant = [x for x in m if x.get("role") == "assistant"][-1]
        ids = [c["id"] for c in assistant["tool_calls"]]
        assert len(set(ids)) == 4, ids
        assert ids[0] == "x_2" and ids[1] == "x", ids
        for generated in ids[2:]:
            assert len(generated) == 9 and generated.isalnum(), ids  # Mistral's rule
        assert [t["tool_call_id"] for t in tool_messages(m)] == ids

    fake_openai.script(
        "ids",
        [
            calls(
                [
                    ("lookup", {"key": "a"}, "x_2"),
                    ("lookup", {"key": "b"}, "x"),
                    ("lookup", {"key": "c"}, "x"),
                    ("lookup", {"key": "d"}, ""),
                ]
            ),
            reply("ok", expect=answered_each),
        ],
    )
    run = await strict_harness.gateway.start_run("ids", requested_by="U1")
    done = await strict_harness.wait_finished(run.run_id)
    assert done.status is RunStatus.COMPLETED
    assert sorted(read_journal(str(journal))) == ["lookup:a", "lookup:b", "lookup:c", "lookup:d"]


async def test_a_job_for_a_busy_run_is_not_a_failed_delivery(
    redis: Redis,
    redis_url: str,
    fake_openai: FakeOpenAI,
    journal: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TEST_SLOW_SECONDS", "2.5")
    settings = core_settings(
        redis_url, fake_openai.base_url, JOB_MAX_DELIVERIES=1, WORKER_LEASE=1.0
    )
    h = Harness(redis, settings, strict)
    h.start_worker()
    h.start_worker()
    try:
        fake_openai.script("slow", [call("slow_report", {"name": "s"}), reply("report ready")])
        run = await h.gateway.start_run("slow", requested_by="U1")
        for _ in range(200):
            if any(x.startswith("slow_report:start:s") for x in read_journal(str(journal))):
                break
            await asyncio.sleep(0.02)
        for _ in range(3):  # duplicate jobs, as a repair or a decision may enqueue
            await redis.xadd(
                h.keys.jobs(h.keys.shard_of(run.run_id)), {"type": "resume", "run_id": run.run_id}
            )
        done = await h.wait_finished(run.run_id, timeout=20)
        assert (done.status, done.final) == (RunStatus.COMPLETED, "report ready")
        assert sum(x.startswith("slow_report:start") for x in read_journal(str(journal))) == 1
        assert await redis.xlen(h.keys.dead_jobs(h.keys.shard_of(run.run_id))) == 0
    finally:
        await h.close()


async def test_the_sweeper_repairs_runs_that_nothing_would_move_on(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    settings = core_settings(redis_url, fake_openai.base_url, STUCK_RUN_AFTER=0.5)
    h = Harness(redis, settings, strict)
    try:
        # 1. A queued run whose job was lost.
        fake_openai.script("lost job", [reply("done anyway")])
        lost = await h.gateway.start_run("lost job", requested_by="U1")
        await redis.delete(h.keys.jobs(h.keys.shard_of(lost.run_id)))
        # 2. A run waiting for approval whose gate was decided without a resume job.
        fake_openai.script("lost resume", [call("delete_user", {"user_id": "8"}), reply("gone")])
        waiting = await h.gateway.start_run("lost resume", requested_by="U1")
        h.start_worker()
        [opened] = await h.opened_gates(waiting.run_id, 1)
        await asyncio.sleep(0.2)
        gid = opened.data["gate_id"]
        await redis.hset(h.keys.gate(gid), mapping={"status": "approved", "decided_by": "U2"})
        await redis.zrem(h.keys.deadlines(h.keys.shard_of(gid)), gid)
        assert (await h.wait_finished(lost.run_id, timeout=15)).final == "done anyway"
        assert (await h.wait_finished(waiting.run_id, timeout=15)).final == "gone"
        assert read_journal(str(journal)) == ["delete_user:8"]
        assert all([await redis.zcard(h.keys.active(s)) == 0 for s in h.keys.all_shards()])
    finally:
        await h.close()


# --------------------------------------------------------------------------- 5. bounds
async def test_a_turn_with_too_many_calls_gets_a_tool_error_for_each(
    strict_harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    def told(m: list[dict[str, Any]]) -> None:
        texts = tool_texts(m)
        assert len(texts) == 2100
        assert all("more than the 64 allowed in one turn" in t for t in texts), texts[0]

    fake_openai.script(
        "flood",
        [calls([("lookup", {"key": str(i)}) for i in range(2100)]), reply("ok", expect=told)],
    )
    run = await strict_harness.gateway.start_run("flood", requested_by="U1")
    done = await strict_harness.wait_finished(run.run_id, timeout=20)
    assert done.status is RunStatus.COMPLETED
    assert read_journal(str(journal)) == []


async def test_a_script_with_bad_input_writes_nothing(observer: Harness, redis: Redis) -> None:
    run = await observer.gateway.start_run("bad input", requested_by="U1")
    k = observer.keys
    before = await redis.hgetall(k.run(run.run_id))
    with pytest.raises(Exception, match="bad arguments"):
        # An odd number of turn-hash values: refused before the first write.
        await Scripts(redis, k).record_turn(
            {"run_id": run.run_id},
            0,
            "1",
            assistant="{}",
            done=False,
            final="",
            completed="{}",
            now="1",
            fields=["lonely field"],
        )
    assert await redis.hgetall(k.run(run.run_id)) == before
    assert await redis.llen(k.history(run.run_id)) == 1


async def test_tool_output_that_is_not_valid_unicode_is_cleaned_not_in_doubt(
    strict_harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    def told(m: list[dict[str, Any]]) -> None:
        assert tool_texts(m) == ["half an emoji: \ufffd"]

    fake_openai.script("garble", [call("garbled", {"name": "g"}), reply("ok", expect=told)])
    run = await strict_harness.gateway.start_run("garble", requested_by="U1")
    done = await strict_harness.wait_finished(run.run_id)
    assert done.status is RunStatus.COMPLETED
    ev = await strict_harness.wait_event(run.run_id, "tool.executed")
    assert ev.data["ok"] is True and ev.data["in_doubt"] is False


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            "<!DOCTYPE html><html><body>Welcome to nginx!</body></html>",
            "the model endpoint returned HTML, not JSON; check OPENAI_BASE_URL",
        ),
        (
            {"choices": [{"index": 0, "finish_reason": "stop"}]},
            "the response's first choice has no message",
        ),
        ({"id": "x", "object": "chat.completion", "choices": []}, "the response had no choices"),
        (
            {"error": {"message": "Provider returned error", "code": 400}},
            "the model provider returned an error: Provider returned error (code 400)",
        ),
        (
            {"choices": [{"message": {"role": "assistant", "content": 42}}]},
            "the message's content is a int, not text or a list of chunks",
        ),
    ],
)
async def test_a_malformed_model_response_fails_the_run_at_once_naming_the_problem(
    strict_harness: Harness, fake_openai: FakeOpenAI, body: Any, error: str
) -> None:
    fake_openai.script("odd server", [raw_response(body)])
    run = await strict_harness.gateway.start_run("odd server", requested_by="U1")
    done = await strict_harness.wait_finished(run.run_id)
    assert done.status is RunStatus.FAILED
    assert done.error == f"model API error: {error}"
    assert len(fake_openai.requests_for("odd server")) == 1  # failed at once, no paid retries


async def test_content_as_a_list_of_chunks_keeps_the_text_and_drops_the_thinking(
    strict_harness: Harness, fake_openai: FakeOpenAI
) -> None:
    chunks = [
        {"type": "thinking", "thinking": [{"type": "text", "text": "let me think"}]},
        {"type": "text", "text": "Hello "},
        {"type": "text", "text": "there."},
    ]
    fake_openai.script(
        "magistral",
        [
            raw_response(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": chunks},
                            "finish_reason": "stop",
                        }
                    ],
                }
            )
        ],
    )
    run = await strict_harness.gateway.start_run("magistral", requested_by="U1")
    done = await strict_harness.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "Hello there.")


async def test_start_run_with_the_same_key_starts_one_run(observer: Harness, redis: Redis) -> None:
    gw = observer.gateway
    first = await gw.start_run("once", requested_by="U1", idempotency_key="trigger-1")
    again = await gw.start_run("once", requested_by="U1", idempotency_key="trigger-1")
    other = await gw.start_run("once", requested_by="U1", idempotency_key="trigger-2")
    assert again.run_id == first.run_id != other.run_id
    k = observer.keys
    # A key's run lives in the key's shard, with its one start job.
    assert k.shard_of(first.run_id) == k.shard_for("trigger-1")
    assert k.shard_of(other.run_id) == k.shard_for("trigger-2")
    assert sum([await redis.xlen(k.jobs(s)) for s in k.all_shards()]) == 2
    assert sum([await redis.zcard(k.user_runs("U1", s)) for s in k.all_shards()]) == 2
