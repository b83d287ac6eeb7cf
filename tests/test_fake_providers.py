"""The fake's reasoning-model profiles (DeepSeek, Gemini's OpenAI endpoint, Anthropic's
OpenAI layer) and the relays' own reasoning fields, as raw HTTP sees them."""

from __future__ import annotations

from typing import Any

import pytest

from agent_core.testing import FakeOpenAI, call, reply
from agent_core.testing.servers import thought_signature
from tests.test_fake_openai import USER, answered, contains, post_chat


def signed(call_id: str, signature: str) -> list[dict[str, Any]]:
    """A Gemini history whose call carries ``signature`` as Gemini sends it."""
    messages = answered(call_id)
    messages[1]["tool_calls"][0]["extra_content"] = {"google": {"thought_signature": signature}}
    return messages


# (server, body, status, rule, what the body says)
REFUSALS: list[Any] = [
    pytest.param(
        "deepseek",
        {"messages": answered("call_a")},
        400,
        "deepseek.reasoning_content",
        {
            "error": {
                "message": "Missing `reasoning_content` field in the assistant message at "
                "message index 1. For more information, please refer to "
                "https://api-docs.deepseek.com/guides/thinking_mode#tool-calls",
                "type": "invalid_request_error",
                "code": "invalid_request_error",
            }
        },
        id="deepseek-no-reasoning",
    ),
    pytest.param(
        "deepseek",
        {
            "messages": [
                *answered("call_a", content=""),
                {"role": "assistant", "content": "done"},  # the answer in the same segment
                USER,
            ]
        },
        400,
        "deepseek.reasoning_content",
        {"error": {"code": "invalid_request_error"}},
        id="deepseek-answer-without-reasoning",
    ),
    pytest.param(
        "gemini",
        {"messages": answered("call_a")},
        400,
        "gemini.thought_signature",
        [
            {
                "error": {
                    "code": 400,
                    "message": "Function call is missing a thought_signature in functionCall "
                    "parts. This is required for tools to work correctly, and missing "
                    "thought_signature may lead to degraded model performance. Additional data, "
                    "function call `default_api:x` , position 1. please refer to "
                    "https://ai.google.dev/gemini-api/docs/thought-signatures for more details.",
                    "status": "INVALID_ARGUMENT",
                }
            }
        ],
        id="gemini-no-signature",
    ),
    pytest.param(
        "gemini",
        {"messages": signed("call_a", "not the one it sent")},
        400,
        "gemini.thought_signature",
        [{"error": {"message": "Corrupted thought signature.", "status": "INVALID_ARGUMENT"}}],
        id="gemini-changed-signature",
    ),
]


@pytest.mark.parametrize(("server", "body", "status", "rule", "says"), REFUSALS)
async def test_each_reasoning_profile_refuses_what_its_server_refuses(
    server: Any, body: dict[str, Any], status: int, rule: str, says: Any
) -> None:
    with FakeOpenAI(server=server) as fake:
        fake.script("t", [reply("never"), reply("never"), reply("never")])
        got_status, got, _ = await post_chat(fake, {"model": "m", **body})
        assert (got_status, contains(got, says)) == (status, True), got
        [error] = fake.errors
        assert f"({rule})" in error


@pytest.mark.parametrize(
    ("server", "messages"),
    [
        ("gemini", signed("call_a", thought_signature("x"))),
        ("gemini", [*signed("call_a", "old turn: not checked"), USER]),  # only the current turn
        ("deepseek", [USER, {"role": "assistant", "content": "hi"}, USER]),  # no tool call
        ("anthropic", answered("toolu_01AbCdEfGhIjKlMnOpQrStUv")),
    ],
)
async def test_what_a_reasoning_profile_accepts_is_not_refused(
    server: Any, messages: list[Any]
) -> None:
    with FakeOpenAI(server=server) as fake:
        fake.script("t", [reply("a"), reply("ok")])
        status, got, _ = await post_chat(fake, {"model": "m", "messages": messages})
        assert (status, fake.errors) == (200, []), got


async def test_deepseek_takes_back_the_reasoning_it_gave() -> None:
    """Thinking mode (on by default) answers reasoning_content, "" when the model said
    nothing aloud; a history carrying it back is accepted; thinking turned off, none."""
    with FakeOpenAI(server="deepseek") as fake:
        fake.script("t", [call("x", {}), reply("done", reasoning="it ran")])
        _, first, _ = await post_chat(fake, {"model": "m", "messages": [USER]})
        message = first["choices"][0]["message"]
        assert message["reasoning_content"] == ""
        tc = message["tool_calls"][0]
        back = [USER, message, {"role": "tool", "tool_call_id": tc["id"], "content": "ok"}]
        status, second, _ = await post_chat(fake, {"model": "m", "messages": back})
        assert (status, second["choices"][0]["message"]["reasoning_content"]) == (200, "it ran")
        off = {"model": "m", "messages": [USER], "thinking": {"type": "disabled"}}
        _, plain, _ = await post_chat(fake, off)
        assert "reasoning_content" not in plain["choices"][0]["message"]
        assert fake.errors == []


@pytest.mark.parametrize(
    ("server", "upstream", "field"),
    [
        ("litellm", "mistral", "reasoning_content"),  # BerriAI/litellm#30884
        ("openrouter", "mistral", "reasoning"),  # OpenRouter's own input field
    ],
)
async def test_a_relay_does_not_forward_its_own_reasoning_fields(
    server: Any, upstream: Any, field: str
) -> None:
    """What a relay returned, it takes back; Mistral behind it never sees the field (Mistral
    itself refuses it: see REFUSALS, mistral-extra)."""
    messages = answered("AbCdE1234", content="")
    messages[1][field] = "thinking"
    with FakeOpenAI(server=server, upstream=upstream) as fake:
        fake.script("t", [reply("a"), reply("ok")])
        status, got, _ = await post_chat(fake, {"model": "m", "messages": messages})
        assert (status, fake.errors) == (200, []), got


@pytest.mark.parametrize(
    ("server", "status", "says"),
    [
        (
            "anthropic",
            529,
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        ),
        (
            "deepseek",
            402,
            {"error": {"message": "Insufficient Balance", "code": "invalid_request_error"}},
        ),
        (
            "gemini",
            429,
            [
                {
                    "error": {
                        "code": 429,
                        "message": "Resource has been exhausted (e.g. check quota).",
                        "status": "RESOURCE_EXHAUSTED",
                    }
                }
            ],
        ),
    ],
)
async def test_injected_failures_speak_the_profiles_words(
    server: Any, status: int, says: Any
) -> None:
    with FakeOpenAI(server=server) as fake:
        fake.script("t", [reply("ok")])
        fake.fail_next(1, status=status)
        got_status, got, _ = await post_chat(fake, {"model": "m", "messages": [USER]})
        assert (got_status, contains(got, says)) == (status, True), got
        if server == "gemini":  # and its rate limit is the same list
            fake.rate_limit(2.0)
            got_status, got, _ = await post_chat(fake, {"model": "m", "messages": [USER]})
            assert (got_status, contains(got, says)) == (429, True), got
