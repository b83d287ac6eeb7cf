"""The playground's scripted model, driving the real example ops agent through a real worker
and Redis: what a user sees for each outcome of an approval."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio import Redis

from agent_core import RunStatus, messages
from agent_core.examples import ops
from agent_core.exceptions import ConfigError
from agent_core.testing import FakeOpenAI
from playground.model import (
    API_KEY,
    HELP,
    MODEL_HINT,
    hint_for,
    load_responder,
    ops_responder,
    parse_task,
    report_line,
    start_model,
)
from tests.conftest import fail_on_fake_openai_errors
from tests.core.conftest import core_settings
from tests.core.harness import Harness

USERS = {
    "42": {"name": "Ada Lovelace", "email": "ada@example.com", "plan": "pro"},
    "43": {"name": "Alan Turing", "email": "alan@partner.org", "plan": "free"},
}


@pytest.fixture(scope="module")
def model_server() -> Iterator[FakeOpenAI]:
    fake = start_model()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def model(model_server: FakeOpenAI) -> Iterator[FakeOpenAI]:
    """The scripted model, reset; the test fails if it saw an unexpected request."""
    model_server.reset()
    yield model_server
    errors = model_server.errors
    model_server.reset()
    fail_on_fake_openai_errors(errors)


@pytest.fixture
def users(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, str]]:
    """The example agent's in-memory user table, fresh for each test."""
    table = {k: dict(v) for k, v in USERS.items()}
    monkeypatch.setattr(ops, "_USERS", table)
    return table


async def ops_harness(redis: Redis, redis_url: str, model: FakeOpenAI, **settings: Any) -> Harness:
    values = {"OPENAI_API_KEY": API_KEY, **settings}
    h = Harness(redis, core_settings(redis_url, model.base_url, **values), ops.agent)
    h.start_worker()
    return h


@pytest.fixture
async def h(
    redis: Redis, redis_url: str, model: FakeOpenAI, users: dict[str, Any]
) -> AsyncIterator[Harness]:
    harness = await ops_harness(redis, redis_url, model)
    try:
        yield harness
    finally:
        await harness.close()


async def events_of(h: Harness, run_id: str, type_: str) -> list[dict[str, Any]]:
    return [e.data for e in await h.events() if e.run_id == run_id and e.type.value == type_]


# --------------------------------------------------------------------------- through the worker
async def test_delete_approved_runs_once_and_the_answer_says_so(
    h: Harness, users: dict[str, Any]
) -> None:
    run = await h.gateway.start_run("delete user 42", requested_by="U1")
    [opened] = await h.opened_gates(run.run_id, 1)
    assert (opened.data["tool"], opened.data["args"]) == ("delete_user", {"user_id": "42"})
    assert "42" in users  # nothing ran before the decision
    assert (await h.gateway.decide(opened.data["gate_id"], "approve", by="U2")).applied
    done = await h.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "Done: user 42 deleted.")
    assert "42" not in users and "43" in users
    executed = await events_of(h, run.run_id, "tool.executed")
    assert [(e["tool"], e["output"]) for e in executed] == [("delete_user", "user 42 deleted")]
    assert len(await events_of(h, run.run_id, "gate.opened")) == 1


async def test_denied_answer_quotes_the_reason_and_nothing_is_deleted(
    h: Harness, users: dict[str, Any]
) -> None:
    reason = "wrong account: Ada's is the *other* 42 (ask #ops first)"
    run = await h.gateway.start_run("please delete user 42", requested_by="U1")
    [opened] = await h.opened_gates(run.run_id, 1)
    assert (await h.gateway.decide(opened.data["gate_id"], "deny", by="U9", reason=reason)).applied
    done = await h.wait_finished(run.run_id)
    assert done.status is RunStatus.COMPLETED
    assert done.final == (
        f"I did not delete user 42: the request was denied by U9 (reason: {reason})."
    )
    assert "42" in users
    assert await events_of(h, run.run_id, "tool.executed") == []


async def test_expiry_is_reported_as_nobody_answering_not_a_refusal(
    redis: Redis, redis_url: str, model: FakeOpenAI, users: dict[str, Any]
) -> None:
    h = await ops_harness(redis, redis_url, model, APPROVAL_TIMEOUT=1)
    try:
        run = await h.gateway.start_run("delete user 42", requested_by="U1")
        await h.opened_gates(run.run_id, 1)
        done = await h.wait_finished(run.run_id, timeout=10)
    finally:
        await h.close()
    assert done.status is RunStatus.COMPLETED
    assert done.final == (
        "The approval request for delete_user (user 42) expired before anyone answered: "
        "no decision arrived within 1 s, so nothing was deleted."
    )
    assert not any(word in (done.final or "").lower() for word in ("denied", "declined"))
    assert "42" in users


async def test_two_users_open_two_gates_in_one_turn(h: Harness, users: dict[str, Any]) -> None:
    run = await h.gateway.start_run("delete users 42 and 43", requested_by="U1")
    g1, g2 = await h.opened_gates(run.run_id, 2)
    assert [g.data["args"] for g in (g1, g2)] == [{"user_id": "42"}, {"user_id": "43"}]
    assert g1.data["turn"] == g2.data["turn"]
    assert (await h.gateway.decide(g1.data["gate_id"], "approve", by="U2")).applied
    assert (await h.gateway.decide(g2.data["gate_id"], "deny", by="U3", reason="keep")).applied
    done = await h.wait_finished(run.run_id)
    assert done.final == (
        "Done: user 42 deleted.\n"
        "I did not delete user 43: the request was denied by U3 (reason: keep)."
    )
    assert list(users) == ["43"]


async def test_an_unknown_request_gets_the_help_and_calls_nothing(
    h: Harness, model: FakeOpenAI
) -> None:
    run = await h.gateway.start_run("what's the weather like?", requested_by="U1")
    done = await h.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, HELP)
    assert "OPENAI_API_KEY" in HELP and "OPENAI_BASE_URL" in HELP and "delete user 42" in HELP
    assert len(model.requests) == 1
    assert [e.type.value for e in await h.events() if e.run_id == run.run_id] == [
        "run.started",
        "run.completed",
    ]


async def test_a_look_up_runs_without_approval(h: Harness) -> None:
    run = await h.gateway.start_run("who is user 43?", requested_by="U1")
    done = await h.wait_finished(run.run_id)
    assert done.final is not None and done.final.startswith("User 43: ")
    assert "Alan Turing" in done.final
    assert await events_of(h, run.run_id, "gate.opened") == []


async def test_a_long_email_body_reaches_the_card_as_typed(h: Harness) -> None:
    body = "\n".join(
        f"Line {i}: the launch moves to 10:30, see https://example.org/{i}." for i in range(80)
    )
    run = await h.gateway.start_run(
        f"email alan@partner.org about Launch update: {body}", requested_by="U1"
    )
    [opened] = await h.opened_gates(run.run_id, 1)
    assert opened.data["args"] == {
        "to": "alan@partner.org",
        "subject": "Launch update",
        "body": body,
    }
    assert (await h.gateway.decide(opened.data["gate_id"], "approve", by="U2")).applied
    done = await h.wait_finished(run.run_id)
    assert done.final == f"Done: email to alan@partner.org queued ({len(body)} characters)."


# --------------------------------------------------------------------------- the responder alone
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (messages.denied("delete_user", "U2", None), "denied by U2, who gave no reason."),
        (
            messages.cancelled("delete_user", "U3"),
            "The run was cancelled by U3 before delete_user (user 42) ran, so nothing was deleted.",
        ),
        (messages.in_doubt("delete_user"), "The outcome of delete_user (user 42) is unknown"),
        (
            messages.tool_raised("delete_user", OSError("disk full")),
            "delete_user (user 42) failed: OSError: disk full.",
        ),
        (
            messages.invalid_arguments("delete_user", "user_id: field required"),
            "rejected before any approval: user_id: field required. Nothing ran.",
        ),
        (messages.args_changed("delete_user"), "no longer matched what the approver saw"),
        (messages.too_many_calls(70, 64), "None of the calls ran: this turn asked for 70"),
        ("no user 42; nothing deleted", "delete_user (user 42) ran and returned: no user 42;"),
        (messages.expired("delete_user", 300), "no decision arrived within 5 minutes (300 s)"),
    ],
)
def test_each_outcome_the_runner_reports_is_told_plainly(text: str, expected: str) -> None:
    assert expected in report_line("delete_user", {"user_id": "42"}, text)


def test_people_are_named_not_mentioned() -> None:
    # The bot escapes what the model writes, so "<@U0PGAVERY>" would show as that raw id:
    # the scripted model writes the name the page shows everywhere else.
    denied = report_line(
        "delete_user", {"user_id": "42"}, messages.denied("delete_user", "U0PGAVERY", "no")
    )
    assert denied == "I did not delete user 42: the request was denied by @Avery (reason: no)."
    cancelled = report_line(
        "delete_user", {"user_id": "42"}, messages.cancelled("delete_user", "U0PGRILEY")
    )
    assert cancelled.startswith("The run was cancelled by @Riley before delete_user")
    # Someone the playground does not know keeps their id, never a mention.
    unknown = report_line(
        "delete_user", {"user_id": "42"}, messages.denied("delete_user", "U0OTHER", None)
    )
    assert "denied by U0OTHER, who gave no reason" in unknown and "<@" not in unknown


def test_unknown_tool_and_a_tool_not_offered() -> None:
    line = report_line("nuke", {}, messages.unknown_tool("nuke", ["get_user"]))
    assert line == "I called nuke, but this agent has no tool by that name, so nothing ran."
    other_agent = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    step = ops_responder([{"role": "user", "content": "delete user 42"}], tools=other_agent)
    assert not step.tool_calls
    assert step.content is not None and "no delete_user tool (it offers: lookup)" in step.content


def test_the_latest_user_message_is_the_task() -> None:
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "ops"},
        {"role": "user", "content": "delete user 42"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "delete_user", "arguments": '{"user_id": "42"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "user 42 deleted"},
        {"role": "assistant", "content": "Done: user 42 deleted."},
        {"role": "user", "content": [{"type": "text", "text": "look up user 43"}]},
    ]
    step = ops_responder(history)
    assert [(c.name, c.arguments) for c in step.tool_calls] == [("get_user", '{"user_id":"43"}')]


@pytest.mark.parametrize(
    ("task", "tool", "args"),
    [
        ("Delete user #42, 43 and user 44.", "delete_user", ["42", "43", "44"]),
        ("remove account u-7", "delete_user", ["u-7"]),
        ("get user 42", "get_user", ["42"]),
        ("look up users 42 and 43", "get_user", ["42", "43"]),
    ],
)
def test_user_tasks(task: str, tool: str, args: list[str]) -> None:
    intent = parse_task(task)
    assert intent is not None
    assert (intent.tool, [a["user_id"] for a in intent.args]) == (tool, args)


def test_email_variants() -> None:
    intent = parse_task("send an email to <mailto:ada@example.com|ada@example.com> about Lunch")
    assert intent is not None and intent.args == (
        {"to": "ada@example.com", "subject": "Lunch", "body": "Lunch"},
    )
    assert parse_task("email alan@partner.org") is None
    assert parse_task("delete user") is None


# --------------------------------------------------------------------------- loading
@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("nope", "'nope' is not 'package.module:function'"),
        ("os:nothing", "'os' has no attribute 'nothing'"),
        ("no_such_module_xyz:respond", "cannot import 'no_such_module_xyz'"),
        ("os:sep", "is a str, not a function"),
    ],
)
def test_a_bad_playground_model_is_one_clear_line(spec: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_responder(spec)
    text = str(info.value)
    assert text.startswith("PLAYGROUND_MODEL is invalid: ") and says in text
    assert "\n" not in text
    # No chained traceback: nothing printed but the line.
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__


def test_load_responder_and_hint() -> None:
    assert load_responder(None) is ops_responder
    assert load_responder("  ") is ops_responder
    assert load_responder("playground.model:ops_responder") is ops_responder
    assert hint_for(None) == MODEL_HINT and "OPENAI_API_KEY" in MODEL_HINT
    assert "my_model:respond" in hint_for("my_model:respond")
