""" "Works with any OpenAI-compatible server", tested: every server profile of FakeOpenAI
(its request rules enforced, its response shapes replayed) driven through a real Worker.

Each server runs the same flow (a turn with an un-gated and a gated call, the gate approved,
a final answer), then the odd shapes it is known for. Every case asserts what the run ends
with, what the model was told and how many model requests it cost. The fixture fails a test
whose requests broke a rule of the server (``FakeOpenAI.errors``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from agent_core import Agent, RunStatus, tool
from agent_core.testing import (
    SERVERS,
    FakeOpenAI,
    ServerName,
    call,
    calls,
    filtered,
    raw_response,
    reply,
    tool_messages,
)
from agent_core.testing.servers import thought_signature
from tests.agents import read_journal, strict
from tests.conftest import fail_on_fake_openai_errors
from tests.core.conftest import core_settings
from tests.core.harness import Harness

Messages = list[dict[str, Any]]
MakeFake = Callable[..., FakeOpenAI]


@pytest.fixture
def make_fake() -> Iterator[MakeFake]:
    """Start FakeOpenAI servers with a profile; the test fails if one saw a broken rule."""
    started: list[FakeOpenAI] = []

    def make(server: ServerName, **kwargs: Any) -> FakeOpenAI:
        fake = FakeOpenAI(server=server, **kwargs).start()
        started.append(fake)
        return fake

    yield make
    errors = [e for fake in started for e in fake.errors]
    for fake in started:
        fake.stop()
    fail_on_fake_openai_errors(errors)


@contextlib.asynccontextmanager
async def worker_for(
    redis: Redis, redis_url: str, fake: FakeOpenAI, **settings: object
) -> AsyncIterator[Harness]:
    h = Harness(redis, core_settings(redis_url, fake.base_url, **settings), strict)
    h.start_worker()
    try:
        yield h
    finally:
        await h.close()


def sent_back_cleanly(
    messages: Messages,
    provider_fields: dict[str, Any] | None = None,
    call_fields: dict[str, Any] | None = None,
) -> None:
    """The history the worker sends back: the standard fields plus, on an assistant turn
    that called tools, exactly the provider's own fields it came with (``provider_fields``;
    ``call_fields`` on its first call), content a string, arguments JSON text, and each call
    answered by its own tool message."""
    allowed = {
        "assistant": {"role", "content", "tool_calls"},
        "tool": {"role", "content", "tool_call_id"},
    }
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            extra = {k: v for k, v in m.items() if k not in allowed["assistant"]}
            assert extra == (provider_fields or {}), m
            first = m["tool_calls"][0]
            assert {k: v for k, v in first.items() if k not in ("id", "type", "function")} == (
                call_fields or {}
            ), first
        else:
            assert set(m) <= allowed.get(m["role"], {"role", "content"}), m
        assert isinstance(m["content"], str), m
    calls_sent = [tc for m in messages for tc in m.get("tool_calls") or []]
    for tc in calls_sent:
        assert {"id", "type", "function"} <= set(tc), tc
        assert isinstance(json.loads(tc["function"]["arguments"]), dict), tc
    ids = [tc["id"] for tc in calls_sent]
    assert [t["tool_call_id"] for t in tool_messages(messages)] == ids
    assert len(set(ids)) == len(ids)


# ----------------------------------------------------------------------------- the full flow
FLOW = "look up k1, then delete user 42"

PROFILES: list[Any] = [
    *(pytest.param(s, {}, id=s) for s in SERVERS),
    pytest.param("openrouter", {"upstream": "mistral"}, id="openrouter-mistral"),
    pytest.param("litellm", {"upstream": "mistral"}, id="litellm-mistral"),
    pytest.param("litellm", {"upstream": "vllm"}, id="litellm-vllm"),
    pytest.param("ollama", {"quirks": {"stop_with_tool_calls"}}, id="ollama-0.2-stop"),
    pytest.param("vllm", {"quirks": {"stop_with_tool_calls"}}, id="vllm-required-stop"),
    pytest.param(
        "llamacpp", {"quirks": {"object_arguments", "missing_ids"}}, id="llamacpp-object-noid"
    ),
    pytest.param("llamacpp", {"quirks": {"empty_ids"}}, id="llamacpp-empty-ids"),
]


THOUGHT = "Look it up first, then delete."
# What each profile attaches to a turn that calls tools, which must come back as it came.
SENT_BACK: dict[str, dict[str, Any]] = {
    "vllm": {"reasoning_content": THOUGHT},
    "llamacpp": {"reasoning_content": THOUGHT},
    "litellm": {"reasoning_content": THOUGHT},
    "openrouter": {"reasoning": THOUGHT},
    "deepseek": {"reasoning_content": THOUGHT},
}
CALL_SENT_BACK: dict[str, dict[str, Any]] = {
    "gemini": {"extra_content": {"google": {"thought_signature": thought_signature("lookup")}}},
}


@pytest.mark.parametrize(("server", "options"), PROFILES)
async def test_a_gated_and_an_ungated_call_then_the_answer(
    server: ServerName,
    options: dict[str, Any],
    make_fake: MakeFake,
    redis: Redis,
    redis_url: str,
    journal: Path,
) -> None:
    """DeepSeek refuses the follow-up without the turn's reasoning_content, Gemini without
    its thought signature: the worker sends back what each gave, and nothing else."""
    fake = make_fake(server, **options)

    def told(messages: Messages) -> None:
        sent_back_cleanly(messages, SENT_BACK.get(server), CALL_SENT_BACK.get(server))
        results = [t["content"] for t in tool_messages(messages)]
        assert results == ["value of k1", "user 42 deleted"]

    fake.script(
        FLOW,
        [
            calls(
                [("lookup", {"key": "k1"}), ("delete_user", {"user_id": "42"})],
                reasoning=THOUGHT,
            ),
            reply("User 42 is deleted.", reasoning="Both calls ran.", expect=told),
        ],
    )
    async with worker_for(redis, redis_url, fake) as h:
        run = await h.gateway.start_run(FLOW, requested_by="U1")
        [gate] = await h.opened_gates(run.run_id, 1)
        assert gate.data["tool"] == "delete_user"
        assert read_journal(str(journal)) == ["lookup:k1"]  # the un-gated call did not wait
        await h.gateway.decide(gate.data["gate_id"], "approve", by="U2")
        done = await h.wait_finished(run.run_id)
        history = await h.history(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "User 42 is deleted.")
    assert "Both calls ran" not in (done.final or "")  # reasoning is not the answer
    # The answer to tool results keeps its reasoning too (DeepSeek wants every assistant
    # message of a segment with tool calls to carry it).
    kept = {k: "Both calls ran." for k in SENT_BACK.get(server, {})}
    assert history[-1] == {"role": "assistant", "content": "User 42 is deleted.", **kept}
    assert read_journal(str(journal)) == ["lookup:k1", "delete_user:42"]
    assert len(fake.requests_for(FLOW)) == 2


# ------------------------------------------------- the model call after the approved call
async def _completed(h: Harness, run_id: str) -> Any:
    for _ in range(200):
        run = await h.gateway.get_run(run_id)
        assert run is not None
        if run.status is RunStatus.COMPLETED:
            return run
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} is {run.status}")


@pytest.mark.parametrize(
    ("server", "failing", "error", "auto_retried"),
    [
        # Out of balance: never retried automatically, the cause named after one request.
        pytest.param(
            "deepseek",
            lambda fake: fake.fail_next(1, status=402),
            "model API error (APIStatusError) HTTP 402: Insufficient Balance (code "
            "invalid_request_error) — the model provider's account is out of credits or "
            "balance; top it up first",
            False,
            id="deepseek-402",
        ),
        # Out of quota past the retry budget: Gemini's list-shaped 429.
        pytest.param(
            "gemini",
            lambda fake: fake.rate_limit(60),
            "model API error (RateLimitError) HTTP 429: Resource has been exhausted (e.g. check "
            "quota). (RESOURCE_EXHAUSTED)",
            True,
            id="gemini-429",
        ),
        # Overloaded past the retry budget.
        pytest.param(
            "anthropic",
            lambda fake: fake.fail_next(50, status=529),
            "model API error (InternalServerError) HTTP 529: Overloaded",
            True,
            id="anthropic-529",
        ),
    ],
)
async def test_a_provider_failing_after_the_approved_call_leaves_a_retryable_run(
    server: ServerName,
    failing: Callable[[FakeOpenAI], None],
    error: str,
    auto_retried: bool,
    make_fake: MakeFake,
    redis: Redis,
    redis_url: str,
    journal: Path,
) -> None:
    """The approved call ran, then the provider failed the next model call: the run fails
    retryable with the provider's own words; once the provider is fixed, /agent retry asks
    again with the stored turn (its reasoning or signature intact) and completes, and the
    call never runs again."""
    fake = make_fake(server)

    def told(messages: Messages) -> None:
        sent_back_cleanly(messages, SENT_BACK.get(server), CALL_SENT_BACK.get(server))
        assert [t["content"] for t in tool_messages(messages)] == ["value of k1", "user 7 deleted"]

    task = "look up k1, then delete user 7"
    fake.script(
        task,
        [
            calls(
                [("lookup", {"key": "k1"}), ("delete_user", {"user_id": "7"})], reasoning=THOUGHT
            ),
            reply("User 7 is deleted.", expect=told),
        ],
    )
    async with worker_for(
        redis, redis_url, fake, OPENAI_MAX_RETRIES=4, OPENAI_RETRY_BUDGET=1.5
    ) as h:
        run = await h.gateway.start_run(task, requested_by="U1")
        [gate] = await h.opened_gates(run.run_id, 1)
        failing(fake)
        await h.gateway.decide(gate.data["gate_id"], "approve", by="U2")
        failed = await h.wait_finished(run.run_id, timeout=20)
        assert (failed.status, failed.error, failed.retryable) == (RunStatus.FAILED, error, True)
        event = await h.wait_event(run.run_id, "run.failed")
        assert event.data["retryable"] is True and event.data["error"] == error
        refused = fake.failures_served
        assert (refused > 1) is auto_retried and refused <= 5, refused
        assert read_journal(str(journal)) == ["lookup:k1", "delete_user:7"]

        fake.clear_failures()  # topped up, quota reset, capacity back
        await h.gateway.retry_run(run.run_id, by="U1")
        done = await _completed(h, run.run_id)
    assert done.final == "User 7 is deleted."
    assert read_journal(str(journal)) == ["lookup:k1", "delete_user:7"]  # nothing ran again
    assert len(fake.requests_for(task)) == 2 + refused


# ----------------------------------------------------------------------------- odd shapes
async def test_azure_content_filter_on_the_answer_fails_the_run_once(
    make_fake: MakeFake, redis: Redis, redis_url: str, journal: Path
) -> None:
    fake = make_fake("azure")
    fake.script("filtered", [call("lookup", {"key": "k1"}), filtered(category="violence")])
    async with worker_for(redis, redis_url, fake) as h:
        run = await h.gateway.start_run("filtered", requested_by="U1")
        done = await h.wait_finished(run.run_id)
    assert done.status is RunStatus.FAILED
    assert done.error is not None and "content filter blocked the answer" in done.error
    assert read_journal(str(journal)) == ["lookup:k1"]
    assert len(fake.requests_for("filtered")) == 2  # no retry of a filtered answer


async def test_azure_content_filter_mid_answer_keeps_the_text_marked_cut_off(
    make_fake: MakeFake, redis: Redis, redis_url: str, journal: Path
) -> None:
    fake = make_fake("azure")
    fake.script("partial", [filtered("Step 1: open the", category="self_harm")])
    async with worker_for(redis, redis_url, fake) as h:
        run = await h.gateway.start_run("partial", requested_by="U1")
        done = await h.wait_finished(run.run_id)
        event = await h.wait_event(run.run_id, "run.completed")
    assert done.final == "Step 1: open the\n\n[cut off by the model provider's content filter]"
    assert event.data["truncated"] is True
    assert len(fake.requests_for("partial")) == 1


async def test_azure_prompt_filter_400_fails_at_once_with_the_reason(
    make_fake: MakeFake, redis: Redis, redis_url: str, journal: Path
) -> None:
    """The prompt itself filtered: Azure's documented 400 (code content_filter, innererror
    ResponsibleAIPolicyViolation). Not retried: the same prompt is filtered again."""
    fake = make_fake("azure")
    body = {
        "error": {
            "message": "The response was filtered due to the prompt triggering Azure OpenAI's "
            "content management policy. Please modify your prompt and retry.",
            "type": None,
            "param": "prompt",
            "code": "content_filter",
            "status": 400,
            "innererror": {
                "code": "ResponsibleAIPolicyViolation",
                "content_filter_result": {"violence": {"filtered": True, "severity": "high"}},
            },
        }
    }
    fake.script("prompt filtered", [raw_response(body, status=400)])
    async with worker_for(redis, redis_url, fake) as h:
        run = await h.gateway.start_run("prompt filtered", requested_by="U1")
        done = await h.wait_finished(run.run_id)
    assert done.status is RunStatus.FAILED
    assert done.error is not None and "content management policy" in done.error
    assert len(fake.requests_for("prompt filtered")) == 1


async def test_magistral_thinking_chunks_stay_out_of_the_answer(
    make_fake: MakeFake, redis: Redis, redis_url: str, journal: Path
) -> None:
    fake = make_fake("mistral")
    fake.script("capital", [reply("Paris.", reasoning="France's capital is Paris, not Lyon.")])
    async with worker_for(redis, redis_url, fake) as h:
        run = await h.gateway.start_run("capital", requested_by="U1")
        done = await h.wait_finished(run.run_id)
        history = await h.history(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "Paris.")
    assert history[-1] == {"role": "assistant", "content": "Paris."}  # stored as text
    assert len(fake.requests_for("capital")) == 1


async def test_mistral_gets_its_id_format_when_the_model_repeats_or_omits_ids(
    make_fake: MakeFake, redis: Redis, redis_url: str, journal: Path
) -> None:
    """Ids "" and a repeated one (as some servers send) are replaced by ids Mistral accepts
    (the fake refuses any other): the calls run once each, one request more."""
    fake = make_fake("mistral")

    def told(messages: Messages) -> None:
        sent_back_cleanly(messages)
        assert [t["content"] for t in tool_messages(messages)] == [
            "value of a",
            "value of b",
            "value of c",
        ]

    fake.script(
        "ids",
        [
            calls(
                [
                    ("lookup", {"key": "a"}, ""),
                    ("lookup", {"key": "b"}, "AbCdE1234"),
                    ("lookup", {"key": "c"}, "AbCdE1234"),
                ]
            ),
            reply("done", expect=told),
        ],
    )
    async with worker_for(redis, redis_url, fake) as h:
        run = await h.gateway.start_run("ids", requested_by="U1")
        done = await h.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "done")
    assert read_journal(str(journal)) == ["lookup:a", "lookup:b", "lookup:c"]
    assert len(fake.requests_for("ids")) == 2


async def test_llamacpp_object_arguments_that_fail_validation_are_told_to_the_model(
    make_fake: MakeFake, redis: Redis, redis_url: str, journal: Path
) -> None:
    """Arguments as an object ({"key": 5}: not a string): nothing runs, the model is told
    why, and the history goes back with JSON-text arguments llama.cpp parses."""
    fake = make_fake("llamacpp", quirks={"object_arguments"})

    def told(messages: Messages) -> None:
        sent_back_cleanly(messages)
        [result] = [t["content"] for t in tool_messages(messages)]
        assert result.startswith("Error: the call to lookup was rejected"), result
        assert "Nothing ran" in result

    fake.script("bad args", [call("lookup", {"key": 5}), reply("sorry", expect=told)])
    async with worker_for(redis, redis_url, fake) as h:
        run = await h.gateway.start_run("bad args", requested_by="U1")
        done = await h.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "sorry")
    assert read_journal(str(journal)) == []
    assert len(fake.requests_for("bad args")) == 2


async def test_openrouter_relayed_502_in_a_200_is_retried_then_answered(
    make_fake: MakeFake, redis: Redis, redis_url: str, journal: Path
) -> None:
    fake = make_fake("openrouter")
    fake.script("relay", [reply("fine")])
    fake.error_next(
        2,
        {
            "code": 502,
            "message": "Provider returned error",
            "metadata": {"raw": "upstream connect error", "provider_name": "OpenAI"},
        },
    )
    async with worker_for(redis, redis_url, fake) as h:
        run = await h.gateway.start_run("relay", requested_by="U1")
        done = await h.wait_finished(run.run_id, timeout=15)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "fine")
    assert len(fake.requests_for("relay")) == 3


async def test_openrouter_error_inside_the_choice_is_not_an_empty_answer(
    make_fake: MakeFake, redis: Redis, redis_url: str, journal: Path
) -> None:
    """OpenRouter documents errors "while the LLM is producing the output" in a 200; its
    choice type carries ``error`` and finish_reason ``"error"``."""
    fake = make_fake("openrouter")
    body = {
        "id": "gen-1",
        "object": "chat.completion",
        "provider": "OpenAI",
        "choices": [
            {
                "index": 0,
                "finish_reason": "error",
                "native_finish_reason": "error",
                "message": {"role": "assistant", "content": ""},
                "error": {"code": 502, "message": "Upstream stream ended early"},
            }
        ],
    }
    fake.script("mid error", [raw_response(body)])
    async with worker_for(redis, redis_url, fake, OPENAI_RETRY_BUDGET=3) as h:
        run = await h.gateway.start_run("mid error", requested_by="U1")
        done = await h.wait_finished(run.run_id, timeout=15)
    assert done.status is RunStatus.FAILED
    assert done.error is not None and "Upstream stream ended early" in done.error
    assert len(fake.requests_for("mid error")) <= 4  # retried as a 5xx at most, no loop


@pytest.mark.parametrize(
    ("server", "header"),
    [
        pytest.param("groq", None, id="groq"),  # retry-after + x-ratelimit-reset-tokens
        pytest.param("groq", "x-ratelimit-reset-tokens", id="groq-reset-only"),
        pytest.param("azure", None, id="azure"),  # retry-after
        pytest.param("openrouter", None, id="openrouter"),  # Retry-After
        pytest.param(
            "azure",
            "x-rate-limit-reset-tokens",
            id="azure-x-rate-limit-reset",
        ),
    ],
)
async def test_a_429_waits_what_the_server_said_then_answers(
    server: ServerName,
    header: str | None,
    make_fake: MakeFake,
    redis: Redis,
    redis_url: str,
    journal: Path,
) -> None:
    fake = make_fake(server)
    fake.script("limited", [reply("after the limit")])
    async with worker_for(redis, redis_url, fake, OPENAI_MAX_RETRIES=6) as h:
        fake.rate_limit(1.6, header=header)
        started = time.monotonic()
        run = await h.gateway.start_run("limited", requested_by="U1")
        done = await h.wait_finished(run.run_id, timeout=20)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "after the limit")
    assert time.monotonic() - started >= 1.5
    # One 429, one wait for the hint, one success: blind backoff would ask 3 or 4 times.
    assert (len(fake.requests_for("limited")), fake.failures_served) == (2, 1)


@tool(description="Look something up in the archive. " + "Mind the retention rules. " * 42)
def archive_lookup(key: str) -> str:
    return f"archived {key}"


verbose = Agent(name="test-verbose", instructions="You are a test agent.", tools=[archive_lookup])


async def test_a_long_tool_description_does_not_get_every_request_refused(
    redis: Redis, redis_url: str, journal: Path
) -> None:
    assert len(archive_lookup.description) > 1024
    with FakeOpenAI(server="openai") as fake:  # not make_fake: the refusal is the finding
        fake.script("archive", [reply("nothing archived")])
        h = Harness(redis, core_settings(redis_url, fake.base_url), verbose)
        h.start_worker()
        try:
            run = await h.gateway.start_run("archive", requested_by="U1")
            done = await h.wait_finished(run.run_id)
        finally:
            await h.close()
        assert fake.errors == []
    assert (done.status, done.final) == (RunStatus.COMPLETED, "nothing archived")
