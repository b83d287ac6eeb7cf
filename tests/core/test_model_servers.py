"""What odd but real model-server answers do to a run: each costs a bounded number of calls
and ends with the truth (issue 10, the parts in the core)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from agent_core import RunStatus
from agent_core.testing import FakeOpenAI, raw_response, reply
from tests.agents import strict
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
