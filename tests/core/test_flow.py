"""The agent loop end to end: model ↔ tools ↔ gates, with a worker in the test's loop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from agent_core import Decision, GateStatus, RunStatus
from agent_core.runner import args_hash
from agent_core.testing import FakeOpenAI, call, calls, reply, tool_messages
from tests.agents import read_journal
from tests.core.harness import Harness, tool_contents


def last_tool(messages: list[dict[str, Any]]) -> str:
    return str(tool_messages(messages)[-1]["content"])


async def test_ungated_calls_run_without_a_gate(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    def saw_value(m: list[dict[str, Any]]) -> None:
        assert last_tool(m) == "value of k1"

    fake_openai.script(
        "look k1", [call("lookup", {"key": "k1"}), reply("k1 found", expect=saw_value)]
    )
    run = await harness.gateway.start_run("look k1", requested_by="U1")
    done = await harness.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "k1 found")
    assert read_journal(str(journal)) == ["lookup:k1"]
    assert not [e for e in await harness.events() if e.type.value == "gate.opened"]
    types = [e.type.value for e in await harness.events() if e.run_id == run.run_id]
    assert types == ["run.started", "tool.executed", "run.completed"]


async def test_approved_call_runs_once_and_model_gets_its_output(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    def saw_output(m: list[dict[str, Any]]) -> None:
        assert last_tool(m) == "user 42 deleted"

    fake_openai.script(
        "delete 42", [call("delete_user", {"user_id": "42"}), reply("gone", expect=saw_output)]
    )
    run = await harness.gateway.start_run("delete 42", requested_by="U1", origin={"channel": "C1"})
    [opened] = await harness.opened_gates(run.run_id, 1)
    d = opened.data
    assert (d["tool"], d["args"], d["requested_by"], d["origin"]) == (
        "delete_user",
        {"user_id": "42"},
        "U1",
        {"channel": "C1"},
    )
    assert d["args_hash"] == args_hash({"user_id": "42"})
    assert d["description"] == "Permanently delete a user."
    assert 29 < d["deadline"] - d["created_at"] <= 30
    assert await harness.status(run.run_id) is RunStatus.AWAITING_APPROVAL
    assert read_journal(str(journal)) == []  # nothing ran before the decision

    res = await harness.gateway.decide(d["gate_id"], Decision.APPROVE, by="U2")
    assert res.applied and res.gate.status is GateStatus.APPROVED and res.gate.decided_by == "U2"
    done = await harness.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "gone")
    assert read_journal(str(journal)) == ["delete_user:42"]
    decided = await harness.wait_event(run.run_id, "gate.decided")
    assert decided.data | {"decided_at": 0} == {
        "gate_id": d["gate_id"],
        "run_id": run.run_id,
        "call_id": d["call_id"],
        "tool": "delete_user",
        "turn": 1,
        "turn_gates": 1,
        "status": "approved",
        "by": "U2",
        "reason": "",
        "decided_at": 0,
        "origin": {"channel": "C1"},
    }
    executed = await harness.wait_event(run.run_id, "tool.executed")
    assert executed.data["gate_id"] == d["gate_id"] and executed.data["ok"] is True
    # Both jobs (start, resume) were acknowledged and deleted: the stream does not grow.
    assert await harness.redis.xlen(harness.keys.jobs(harness.keys.shard_of(run.run_id))) == 0


async def test_denied_call_never_runs_and_model_is_told_who_and_why(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    def told_denied(m: list[dict[str, Any]]) -> None:
        text = last_tool(m)
        assert "declined" in text and "U9" in text and "wrong account" in text
        assert "Do not retry" in text and "timed out" not in text

    fake_openai.script(
        "delete 7",
        [call("delete_user", {"user_id": "7"}), reply("ok, not deleted", expect=told_denied)],
    )
    run = await harness.gateway.start_run("delete 7", requested_by="U1")
    [opened] = await harness.opened_gates(run.run_id, 1)
    res = await harness.gateway.decide(
        opened.data["gate_id"], "deny", by="U9", reason="wrong account"
    )
    assert (
        res.applied and res.gate.status is GateStatus.DENIED and res.gate.reason == "wrong account"
    )
    done = await harness.wait_finished(run.run_id)
    assert done.status is RunStatus.COMPLETED
    assert read_journal(str(journal)) == []
    assert not [e for e in await harness.events() if e.type.value == "tool.executed"]


async def test_expiry_is_reported_as_a_timeout_not_a_refusal(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path, redis_url: str
) -> None:
    from tests.agents import ops
    from tests.core.conftest import core_settings
    from tests.core.harness import Harness as H

    def told_timeout(m: list[dict[str, Any]]) -> None:
        text = last_tool(m)
        assert "timed out" in text and "within 1 s" in text and "not executed" in text
        assert "declined it" not in text.replace("Nobody declined it", "")

    fake_openai.script(
        "delete 8", [call("delete_user", {"user_id": "8"}), reply("timed out", expect=told_timeout)]
    )
    fast = H(harness.redis, core_settings(redis_url, fake_openai.base_url, APPROVAL_TIMEOUT=1), ops)
    await harness.close()  # only the fast-timeout worker serves this test
    fast.start_worker()
    try:
        run = await fast.gateway.start_run("delete 8", requested_by="U1")
        [opened] = await fast.opened_gates(run.run_id, 1)
        decided = await fast.wait_event(run.run_id, "gate.decided", timeout=5)
        assert decided.data["status"] == "expired" and decided.data["by"] == ""
        done = await fast.wait_finished(run.run_id)
        assert done.status is RunStatus.COMPLETED
        late = await fast.gateway.decide(opened.data["gate_id"], Decision.APPROVE, by="U2")
        assert not late.applied and late.gate.status is GateStatus.EXPIRED
        assert read_journal(str(journal)) == []
    finally:
        await fast.close()


async def test_two_gates_in_one_turn_resume_only_when_both_are_decided(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    step = calls(
        [
            ("delete_user", {"user_id": "1"}),
            ("lookup", {"key": "a"}),
            ("delete_user", {"user_id": "2"}),
        ]
    )
    ids = [tc.id for tc in step.tool_calls]

    def one_message_per_call_in_order(m: list[dict[str, Any]]) -> None:
        tools = tool_messages(m)
        assert [t["tool_call_id"] for t in tools] == ids
        assert tools[0]["content"] == "user 1 deleted"
        assert tools[1]["content"] == "value of a"
        assert "declined" in tools[2]["content"] and "not needed" in tools[2]["content"]

    fake_openai.script("two", [step, reply("one of two", expect=one_message_per_call_in_order)])
    run = await harness.gateway.start_run("two", requested_by="U1")
    g1, g2 = await harness.opened_gates(run.run_id, 2)
    assert [g1.data["call_id"], g2.data["call_id"]] == [ids[0], ids[2]]
    assert read_journal(str(journal)) == ["lookup:a"]  # the un-gated call ran before pausing

    assert (await harness.gateway.decide(g1.data["gate_id"], "approve", by="U2")).applied
    await asyncio.sleep(0.3)
    assert await harness.status(run.run_id) is RunStatus.AWAITING_APPROVAL
    assert read_journal(str(journal)) == ["lookup:a"]  # nothing runs until the turn is decided
    assert len(fake_openai.requests_for("two")) == 1

    assert (
        await harness.gateway.decide(g2.data["gate_id"], "deny", by="U3", reason="not needed")
    ).applied
    done = await harness.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "one of two")
    assert read_journal(str(journal)) == ["lookup:a", "delete_user:1"]


async def test_invalid_arguments_go_back_to_the_model_without_a_gate(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    def bad_json(m: list[dict[str, Any]]) -> None:
        assert "not valid JSON" in last_tool(m) and "Nothing ran" in last_tool(m)

    def bad_type(m: list[dict[str, Any]]) -> None:
        text = last_tool(m)
        assert "invalid arguments" in text and "amount" in text

    def unknown(m: list[dict[str, Any]]) -> None:
        assert "no tool named 'nuke'" in last_tool(m)

    fake_openai.script(
        "bad args",
        [
            call("delete_user", '{"user_id": 4'),
            call("charge", {"account": "A", "amount": "lots"}, expect=bad_json),
            call("delete_user", {"user_id": "4", "force": True}),
            call("nuke", {}, expect=lambda m: None),
            reply("gave up", expect=unknown),
        ],
    )
    # Expectations check the message produced by the previous step.
    fake_openai.script(
        "bad type",
        [call("charge", {"account": "A", "amount": "lots"}), reply("fixed", expect=bad_type)],
    )
    r1 = await harness.gateway.start_run("bad args", requested_by="U1")
    r2 = await harness.gateway.start_run("bad type", requested_by="U1")
    for r in (r1, r2):
        assert (await harness.wait_finished(r.run_id)).status is RunStatus.COMPLETED
    assert not [e for e in await harness.events() if e.type.value == "gate.opened"]
    assert read_journal(str(journal)) == []
    contents = tool_contents(await harness.history(r1.run_id))
    assert "force" in contents[2] and "Extra inputs" in contents[2]


async def test_conditional_approval_and_agent_policy(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    inside = {"to": "bob@example.com", "subject": "hi", "body": "b"}
    outside = {"to": "eve@evil.test", "subject": "hi", "body": "b"}
    fake_openai.script(
        "mail",
        [
            calls(
                [
                    ("send_email", inside),
                    ("send_email", outside),
                    ("charge", {"account": "A", "amount": 5}),
                ]
            ),
            reply("mailed"),
        ],
    )
    fake_openai.script("risky", [call("risky", {"x": 1}), reply("r")])
    run = await harness.gateway.start_run("mail", requested_by="U1")
    gates = await harness.opened_gates(run.run_id, 2)
    assert sorted(g.data["tool"] for g in gates) == ["charge", "send_email"]
    assert [g.data["args"] for g in gates if g.data["tool"] == "send_email"] == [outside]
    assert read_journal(str(journal)) == ["send_email:bob@example.com"]
    r2 = await harness.gateway.start_run("risky", requested_by="U1")
    [g] = await harness.opened_gates(r2.run_id, 1)  # the rule raised: gated, fail closed
    assert g.data["tool"] == "risky"


async def test_a_tool_that_raises_becomes_an_error_message_and_the_run_goes_on(
    harness: Harness, fake_openai: FakeOpenAI
) -> None:
    def saw_error(m: list[dict[str, Any]]) -> None:
        assert last_tool(m) == "Error: the tool explode failed: RuntimeError: exploded: because"

    fake_openai.script(
        "boom", [call("explode", {"why": "because"}), reply("it failed", expect=saw_error)]
    )
    run = await harness.gateway.start_run("boom", requested_by="U1")
    done = await harness.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "it failed")
    executed = await harness.wait_event(run.run_id, "tool.executed")
    assert executed.data["ok"] is False


async def test_model_errors_are_retried_then_fail_the_run_and_the_worker_survives(
    harness: Harness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script("flaky", [reply("made it")])
    fake_openai.fail_next(2, status=429, retry_after=0)
    run = await harness.gateway.start_run("flaky", requested_by="U1")
    done = await harness.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "made it")
    assert fake_openai.failures_served == 2

    fake_openai.script("down", [reply("never")])
    fake_openai.fail_next(3, status=500)  # the first try and both retries
    run2 = await harness.gateway.start_run("down", requested_by="U1")
    failed = await harness.wait_finished(run2.run_id, timeout=15)
    assert failed.status is RunStatus.FAILED
    assert failed.error is not None and "HTTP 500" in failed.error
    assert "sk-test" not in failed.error
    ev = await harness.wait_event(run2.run_id, "run.failed")
    assert ev.data["error"] == failed.error

    fake_openai.script("after", [reply("still alive")])
    run3 = await harness.gateway.start_run("after", requested_by="U1")
    assert (await harness.wait_finished(run3.run_id)).final == "still alive"


async def test_cancel_closes_pending_gates_and_later_clicks_change_nothing(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script(
        "cancel me", [calls([("delete_user", {"user_id": "1"}), ("delete_user", {"user_id": "2"})])]
    )
    run = await harness.gateway.start_run("cancel me", requested_by="U1", origin={"c": 1})
    g1, g2 = await harness.opened_gates(run.run_id, 2)
    assert (await harness.gateway.decide(g1.data["gate_id"], "approve", by="U2")).applied
    cancelled = await harness.gateway.cancel_run(run.run_id, by="U1", reason="changed my mind")
    assert cancelled.status is RunStatus.CANCELLED and cancelled.cancelled_by == "U1"
    ev = await harness.wait_event(run.run_id, "gate.decided", status="cancelled")
    assert ev.data["gate_id"] == g2.data["gate_id"] and ev.data["by"] == "U1"
    await harness.wait_event(run.run_id, "run.cancelled", by="U1")
    late = await harness.gateway.decide(g2.data["gate_id"], "approve", by="U2")
    assert not late.applied and late.gate.status is GateStatus.CANCELLED
    await asyncio.sleep(0.3)
    assert read_journal(str(journal)) == []  # the approved call never ran: its run is gone
    assert await harness.gateway.pending_gates(run.run_id) == []
    assert len(fake_openai.requests_for("cancel me")) == 1


async def test_history_is_append_only_and_paused_runs_hold_no_memory(
    harness: Harness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script(
        "steps",
        [call("lookup", {"key": "a"}), call("delete_user", {"user_id": "3"}), reply("fine")],
    )
    run = await harness.gateway.start_run("steps", requested_by="U1")
    [g] = await harness.opened_gates(run.run_id, 1)
    paused = await harness.history(run.run_id)
    assert [m["role"] for m in paused] == ["user", "assistant", "tool", "assistant"]
    await harness.gateway.decide(g.data["gate_id"], "approve", by="U2")
    await harness.wait_finished(run.run_id)
    after = await harness.history(run.run_id)
    assert after[: len(paused)] == paused
    assert [m["role"] for m in after] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    # The model saw the same history plus the system instructions.
    last = fake_openai.requests_for("steps")[-1]["messages"]
    assert last[0] == {"role": "system", "content": "You are a test agent."}
    assert [json.dumps(m, sort_keys=True) for m in last[1:]] == [
        json.dumps(m, sort_keys=True) for m in after[:-1]
    ]


async def test_a_run_that_never_stops_calling_tools_fails_at_max_turns(
    redis: Any, redis_url: str, fake_openai: FakeOpenAI
) -> None:
    from tests.agents import ops
    from tests.core.conftest import core_settings

    h = Harness(redis, core_settings(redis_url, fake_openai.base_url, MAX_TURNS=3), ops)
    h.start_worker()
    try:
        fake_openai.script("loop", [call("lookup", {"key": str(i)}) for i in range(3)])
        run = await h.gateway.start_run("loop", requested_by="U1")
        failed = await h.wait_finished(run.run_id)
        assert failed.status is RunStatus.FAILED
        assert failed.error == (
            "stopped after 3 model turns (MAX_TURNS): the agent kept calling tools"
        )
        assert len(fake_openai.requests_for("loop")) == 3
    finally:
        await h.close()


async def test_a_history_in_any_script_reaches_the_model_as_it_was_written(
    harness: Harness, fake_openai: FakeOpenAI
) -> None:
    # The stored messages are spliced into the request body as the bytes Redis holds (on
    # one node never decoded): multi-byte UTF-8 and escapes must arrive intact, twice.
    task = 'supprime l\'utilisateur 42 — «vite» ✓ 日本語 "quoted" \\ back\nnew line 🙂'
    answer = "Gelöscht: 42 ✓ 🙂 «fini»"

    def saw_everything(m: list[dict[str, Any]]) -> None:
        assert [x["content"] for x in m if x["role"] == "user"] == [task]
        assert last_tool(m) == "user 42 deleted"

    fake_openai.script(
        task, [call("delete_user", {"user_id": "42"}), reply(answer, expect=saw_everything)]
    )
    run = await harness.gateway.start_run(task, requested_by="U1")
    [opened] = await harness.opened_gates(run.run_id, 1)
    await harness.gateway.decide(opened.data["gate_id"], Decision.APPROVE, by="U2")
    done = await harness.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, answer)
    bodies = fake_openai.requests_for(task)
    assert len(bodies) == 2
    assert bodies[0]["messages"][1] == {"role": "user", "content": task}
    assert bodies[1]["messages"][1] == {"role": "user", "content": task}
