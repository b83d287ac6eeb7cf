"""What odd but real model-server answers do to a run: each costs a bounded number of calls
and ends with the truth (issue 10, the parts in the core)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from agent_core import InvalidState, RunNotFound, RunStatus
from agent_core.testing import FakeOpenAI, call, calls, raw_response, reply
from tests.agents import read_journal, strict
from tests.core.conftest import core_settings
from tests.core.harness import Harness


@pytest.fixture
async def h(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> AsyncIterator[Harness]:
    harness = Harness(redis, core_settings(redis_url, fake_openai.base_url), strict)
    harness.start_worker()
    try:
        yield harness
    finally:
        await harness.close()


def completion(message: dict[str, Any], finish_reason: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }


async def test_a_relayed_provider_5xx_is_retried_then_answered(
    h: Harness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script("relay", [reply("fine")])
    fake_openai.error_next(2, {"message": "Provider returned error", "code": 502})
    run = await h.gateway.start_run("relay", requested_by="U1")
    done = await h.wait_finished(run.run_id, timeout=15)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "fine")
    assert len(fake_openai.requests_for("relay")) == 3


async def test_a_relayed_provider_4xx_fails_at_once(h: Harness, fake_openai: FakeOpenAI) -> None:
    fake_openai.script("relay 400", [reply("never")])
    fake_openai.error_next(1, {"message": "Invalid model", "code": 400})
    run = await h.gateway.start_run("relay 400", requested_by="U1")
    done = await h.wait_finished(run.run_id)
    assert done.status is RunStatus.FAILED
    assert (
        done.error
        == "model API error: the model provider returned an error: Invalid model (code 400)"
    )
    assert len(fake_openai.requests_for("relay 400")) == 1


async def test_a_content_filter_without_content_is_not_an_empty_answer(
    h: Harness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script(
        "filtered",
        [raw_response(completion({"role": "assistant", "content": None}, "content_filter"))],
    )
    run = await h.gateway.start_run("filtered", requested_by="U1")
    done = await h.wait_finished(run.run_id)
    assert done.status is RunStatus.FAILED
    assert done.error is not None and "content filter blocked the answer" in done.error
    assert len(fake_openai.requests_for("filtered")) == 1


async def test_a_refusal_is_shown_as_one(h: Harness, fake_openai: FakeOpenAI) -> None:
    fake_openai.script(
        "refuse",
        [
            raw_response(
                completion(
                    {"role": "assistant", "content": None, "refusal": "I can't help with that."},
                    "stop",
                )
            )
        ],
    )
    run = await h.gateway.start_run("refuse", requested_by="U1")
    done = await h.wait_finished(run.run_id)
    assert (done.status, done.final) == (
        RunStatus.COMPLETED,
        "The model refused: I can't help with that.",
    )


async def test_a_truncated_answer_is_marked_cut_off(h: Harness, fake_openai: FakeOpenAI) -> None:
    fake_openai.script(
        "long",
        [raw_response(completion({"role": "assistant", "content": "Step 1, step"}, "length"))],
    )
    run = await h.gateway.start_run("long", requested_by="U1")
    done = await h.wait_finished(run.run_id)
    assert done.final == "Step 1, step\n\n[cut off: the answer reached the model's output limit]"
    ev = await h.wait_event(run.run_id, "run.completed")
    assert ev.data["truncated"] is True


async def test_an_error_echoing_the_api_key_is_stored_without_it(
    h: Harness, fake_openai: FakeOpenAI
) -> None:
    body = {
        "error": {
            "message": "Incorrect API key provided: sk-proj-********************wxyz. "
            "You can find your API key at https://platform.openai.com/account/api-keys.",
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }
    }
    fake_openai.script("bad key", [raw_response(body, status=401)])
    run = await h.gateway.start_run("bad key", requested_by="U1")
    done = await h.wait_finished(run.run_id)
    assert done.status is RunStatus.FAILED and done.error is not None
    assert "Incorrect API key provided: [redacted]" in done.error
    assert "wxyz" not in done.error and "sk-" not in done.error
    assert len(fake_openai.requests_for("bad key")) == 1


async def test_a_rate_limit_hint_in_x_ratelimit_reset_is_honoured(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """No Retry-After, only ``x-ratelimit-reset-tokens: 2.5s``: one 429, one wait, one
    success (backing off blindly would have asked three or four times)."""
    settings = core_settings(redis_url, fake_openai.base_url, OPENAI_MAX_RETRIES=6)
    harness = Harness(redis, settings, strict)
    harness.start_worker()
    try:
        fake_openai.script("limited", [reply("after the limit")])
        fake_openai.rate_limit(2.5)
        run = await harness.gateway.start_run("limited", requested_by="U1")
        done = await harness.wait_finished(run.run_id, timeout=20)
        assert (done.status, done.final) == (RunStatus.COMPLETED, "after the limit")
        assert len(fake_openai.requests_for("limited")) == 2
        assert fake_openai.failures_served == 1
    finally:
        await harness.close()


async def test_a_model_that_keeps_failing_leaves_a_retryable_run_that_resumes_where_it_was(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """The approved call ran; then the model kept answering 503 past the retry budget. The
    run fails, retryable; retry_run continues it without running the call again."""
    settings = core_settings(
        redis_url, fake_openai.base_url, OPENAI_MAX_RETRIES=5, OPENAI_RETRY_BUDGET=1.5
    )
    harness = Harness(redis, settings, strict)
    harness.start_worker()
    try:
        fake_openai.script(
            "flaky", [call("delete_user", {"user_id": "77"}), reply("user 77 is gone")]
        )
        run = await harness.gateway.start_run("flaky", requested_by="U1")
        [opened] = await harness.opened_gates(run.run_id, 1)
        fake_openai.fail_next(50, status=503)
        await harness.gateway.decide(opened.data["gate_id"], "approve", by="U2")
        failed = await harness.wait_finished(run.run_id, timeout=20)
        assert failed.status is RunStatus.FAILED and failed.retryable
        assert failed.error is not None and "HTTP 503" in failed.error
        served = fake_openai.failures_served
        assert 2 <= served <= 6, served  # bounded by the budget, not a crash loop
        ev = await harness.wait_event(run.run_id, "run.failed")
        assert ev.data["retryable"] is True

        fake_openai.clear_failures()  # the provider is back
        again = await harness.gateway.retry_run(run.run_id, by="U1")
        # Queued; a worker may already have taken it by the time the run is read back.
        assert again.status in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.COMPLETED)
        await harness.wait_event(run.run_id, "run.retried")
        for _ in range(200):
            current = await harness.gateway.get_run(run.run_id)
            assert current is not None
            if current.status is RunStatus.COMPLETED:
                break
            await asyncio.sleep(0.05)
        assert current.final == "user 77 is gone"
        assert read_journal(str(journal)) == ["delete_user:77"]  # not run again
        with pytest.raises(InvalidState):
            await harness.gateway.retry_run(run.run_id, by="U1")
    finally:
        await harness.close()


async def test_a_run_that_failed_for_good_cannot_be_retried(
    h: Harness, fake_openai: FakeOpenAI, redis: Redis
) -> None:
    with pytest.raises(RunNotFound):
        await h.gateway.retry_run("r-000000000000", by="U1")
    fake_openai.script("turns", [reply("x")])
    run = await h.gateway.start_run("turns", requested_by="U1")
    await h.wait_finished(run.run_id)
    with pytest.raises(InvalidState, match="only a failed run can be retried"):
        await h.gateway.retry_run(run.run_id, by="U1")


async def test_the_history_sent_back_is_one_every_server_parses(
    h: Harness, fake_openai: FakeOpenAI
) -> None:
    """An assistant turn with tool calls goes back with content "" (Ollama refuses null) and
    arguments that are a JSON object (vLLM and llama.cpp parse them; broken ones become {})."""

    def parseable(messages: list[dict[str, Any]]) -> None:
        assistant = next(m for m in messages if m.get("role") == "assistant")
        assert assistant["content"] == ""
        args = [c["function"]["arguments"] for c in assistant["tool_calls"]]
        assert args == ['{"key":"k"}', "{}", "{}"], args

    fake_openai.script(
        "history",
        [
            calls(
                [
                    ("lookup", {"key": "k"}),
                    ("lookup", '{"key": "unterminated'),
                    ("lookup", "[1, 2]"),
                ]
            ),
            reply("ok", expect=parseable),
        ],
    )
    run = await h.gateway.start_run("history", requested_by="U1")
    done = await h.wait_finished(run.run_id)
    assert done.status is RunStatus.COMPLETED


# ------------------------------------------- a follow-up refused after an approved call ran
DEEPSEEK_400 = (
    "Missing `reasoning_content` field in the assistant message at message index 2. For more "
    "information, please refer to https://api-docs.deepseek.com/guides/thinking_mode#tool-calls"
)
GEMINI_400 = (
    "Function call is missing a thought_signature in functionCall parts. This is required for "
    "tools to work correctly, and missing thought_signature may lead to degraded model "
    "performance. Additional data, function call `default_api:delete_user` , position 2. "
    "please refer to https://ai.google.dev/gemini-api/docs/thought-signatures for more details."
)
OPENROUTER_403 = {
    "error": {
        "code": 403,
        "message": "delete_user is flagged as violence",
        "metadata": {"reasons": ["violence"], "flagged_input": "delete user…"},
    }
}

# (body, status, the run's error, whether /agent retry is offered)
REFUSED_FOLLOW_UPS: list[Any] = [
    pytest.param(
        {
            "error": {
                "message": DEEPSEEK_400,
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_request_error",
            }
        },
        400,
        f"model API error (BadRequestError) HTTP 400: {DEEPSEEK_400} (code invalid_request_error)",
        True,
        id="400-deepseek-reasoning",
    ),
    pytest.param(
        [{"error": {"code": 400, "message": GEMINI_400, "status": "INVALID_ARGUMENT"}}],
        400,
        f"model API error (BadRequestError) HTTP 400: {GEMINI_400} (INVALID_ARGUMENT)",
        True,
        id="400-gemini-list",
    ),
    pytest.param(
        {
            "code": "Client specified an invalid argument",
            "error": "Incorrect API key provided: xai-abcdefghijklmnopqrstuvwxyz0123456789.",
        },
        400,
        "model API error (BadRequestError) HTTP 400: Incorrect API key provided: [redacted] "
        "(code Client specified an invalid argument)",
        True,
        id="400-xai-string",
    ),
    pytest.param(
        {
            "error": {
                "message": "Content Exists Risk",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_request_error",
            }
        },
        400,
        "model API error (BadRequestError) HTTP 400: Content Exists Risk (code "
        "invalid_request_error) — the model provider's content inspection refused the "
        "request; it would again",
        False,
        id="400-deepseek-inspection",
    ),
    pytest.param(
        {
            "error": {
                "code": "data_inspection_failed",
                "param": None,
                "message": "Input text data may contain inappropriate content.",
                "type": "data_inspection_failed",
            }
        },
        400,
        "model API error (BadRequestError) HTTP 400: Input text data may contain inappropriate "
        "content. (code data_inspection_failed) — the model provider's content inspection "
        "refused the request; it would again",
        False,
        id="400-qwen-inspection",
    ),
    pytest.param(
        {
            "error": {
                "message": "Authentication Fails, Your api key: ****abcd is invalid",
                "type": "authentication_error",
                "param": None,
                "code": "invalid_request_error",
            }
        },
        401,
        "model API error (AuthenticationError) HTTP 401: Authentication Fails, Your api key: "
        "****abcd is invalid (code invalid_request_error) — the model provider refused the API "
        "key (OPENAI_API_KEY)",
        True,
        id="401",
    ),
    pytest.param(
        {
            "error": {
                "message": "Insufficient Balance",
                "type": "unknown_error",
                "param": None,
                "code": "invalid_request_error",
            }
        },
        402,
        "model API error (APIStatusError) HTTP 402: Insufficient Balance (code "
        "invalid_request_error) — the model provider's account is out of credits or balance; "
        "top it up first",
        True,
        id="402-deepseek",
    ),
    pytest.param(
        OPENROUTER_403,
        403,
        "model API error (PermissionDeniedError) HTTP 403: delete_user is flagged as violence — "
        "the model provider's moderation flagged the request; it would be again",
        False,
        id="403-moderation",
    ),
    pytest.param(
        [
            {
                "error": {
                    "code": 403,
                    "message": "User location is not supported for the API use.",
                    "status": "FAILED_PRECONDITION",
                }
            }
        ],
        403,
        "model API error (PermissionDeniedError) HTTP 403: User location is not supported for "
        "the API use. (FAILED_PRECONDITION) — the API key may not use this model or endpoint",
        True,
        id="403-permission",
    ),
    pytest.param(
        {
            "error": {
                "message": "The model `gpt-5-typo` does not exist or you do not have access to it.",
                "type": "invalid_request_error",
                "param": None,
                "code": "model_not_found",
            }
        },
        404,
        "model API error (NotFoundError) HTTP 404: The model `gpt-5-typo` does not exist or you "
        "do not have access to it. (code model_not_found) — no such model or endpoint: check "
        "OPENAI_MODEL and OPENAI_BASE_URL",
        True,
        id="404",
    ),
    pytest.param(
        {
            "error": {
                "message": "Request too large for gpt-4o: 1.2 MB.",
                "type": "invalid_request_error",
            }
        },
        413,
        "model API error (APIStatusError) HTTP 413: Request too large for gpt-4o: 1.2 MB. — the "
        "request is too large for the model provider; it would be again",
        False,
        id="413",
    ),
    pytest.param(
        {
            "object": "error",
            "message": {
                "detail": [
                    {
                        "type": "extra_forbidden",
                        "loc": ["body", "messages", 2, "assistant", "reasoning_content"],
                        "msg": "Extra inputs are not permitted",
                        "input": "x",
                    }
                ]
            },
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        },
        422,
        "model API error (UnprocessableEntityError) HTTP 422: Extra inputs are not permitted: "
        "body.messages.2.assistant.reasoning_content",
        True,
        id="422-mistral",
    ),
    pytest.param(
        {
            "error": {
                "message": "You exceeded your current quota, please check your plan and "
                "billing details.",
                "type": "insufficient_quota",
                "param": None,
                "code": "insufficient_quota",
            }
        },
        429,
        "model API error (RateLimitError) HTTP 429: You exceeded your current quota, please "
        "check your plan and billing details. (code insufficient_quota) — the model provider's "
        "account is out of credits or balance; top it up first",
        True,
        id="429-out-of-quota",
    ),
]


async def _status(h: Harness, run_id: str, status: RunStatus) -> Any:
    for _ in range(200):
        run = await h.gateway.get_run(run_id)
        assert run is not None
        if run.status is status:
            return run
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} is {run.status}, not {status}")


@pytest.mark.parametrize(("body", "status", "error", "retryable"), REFUSED_FOLLOW_UPS)
async def test_a_refused_follow_up_names_its_cause_after_one_request(
    h: Harness,
    fake_openai: FakeOpenAI,
    journal: Path,
    body: Any,
    status: int,
    error: str,
    retryable: bool,
) -> None:
    """The approved call ran; the model call after it is refused. The run fails at once
    (one request: a 4xx is never retried automatically) with the provider's own words, and
    is retryable exactly when a change outside the run can fix it; the retry then completes
    without running the call again."""
    fake_openai.script(
        "refused", [call("delete_user", {"user_id": "5"}), raw_response(body, status=status)]
    )
    run = await h.gateway.start_run("refused", requested_by="U1")
    [gate] = await h.opened_gates(run.run_id, 1)
    await h.gateway.decide(gate.data["gate_id"], "approve", by="U2")
    failed = await h.wait_finished(run.run_id)
    assert (failed.status, failed.error, failed.retryable) == (RunStatus.FAILED, error, retryable)
    assert len(fake_openai.requests_for("refused")) == 2
    assert read_journal(str(journal)) == ["delete_user:5"]
    if not retryable:
        with pytest.raises(InvalidState, match="a retry cannot fix"):
            await h.gateway.retry_run(run.run_id, by="U1")
        return
    # Fixed (the key, the model, the balance…): the retry asks again and completes.
    fake_openai.script("refused", [call("delete_user", {"user_id": "5"}), reply("user 5 gone")])
    await h.gateway.retry_run(run.run_id, by="U1")
    done = await _status(h, run.run_id, RunStatus.COMPLETED)
    assert done.final == "user 5 gone"
    assert read_journal(str(journal)) == ["delete_user:5"]  # not run again
    assert len(fake_openai.requests_for("refused")) == 3


async def test_a_long_provider_message_is_cut(h: Harness, fake_openai: FakeOpenAI) -> None:
    long = "The request was refused because " + "of a very long reason " * 100
    fake_openai.script("long", [raw_response({"error": {"message": long}}, status=400)])
    run = await h.gateway.start_run("long", requested_by="U1")
    done = await h.wait_finished(run.run_id)
    assert done.error is not None
    text = done.error.removeprefix("model API error (BadRequestError) HTTP 400: ")
    assert text.startswith("The request was refused because of a very long reason")
    assert len(text) == 600 and text.endswith("…")


async def test_thinking_written_inline_is_not_the_answer(
    h: Harness, fake_openai: FakeOpenAI
) -> None:
    """A reasoning model served without a reasoning parser writes its thinking in the
    content: the user reads the answer alone; the history keeps what the model said."""
    content = "<think>\nThe user greets me; no tool is needed.\n</think>\n\nHello!"
    fake_openai.script(
        "inline", [raw_response(completion({"role": "assistant", "content": content}, "stop"))]
    )
    run = await h.gateway.start_run("inline", requested_by="U1")
    done = await h.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "Hello!")
    assert (await h.history(run.run_id))[-1] == {"role": "assistant", "content": content}
