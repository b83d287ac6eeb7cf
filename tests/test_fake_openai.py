"""The fake OpenAI server, driven by the real ``openai`` client."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import aiohttp
import openai
import pytest

from agent_core.testing import (
    SERVERS,
    FakeOpenAI,
    Step,
    call,
    calls,
    filtered,
    reply,
    tool_messages,
)
from agent_core.testing.servers import thought_signature
from tests.conftest import fail_on_fake_openai_errors


def client_for(fake: FakeOpenAI, *, max_retries: int = 0, api_key: str = "test") -> Any:
    return openai.AsyncOpenAI(base_url=fake.base_url, api_key=api_key, max_retries=max_retries)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "delete_user",
            "description": "Delete a user",
            "parameters": {
                "type": "object",
                "properties": {"user_id": {"type": "integer"}},
                "required": ["user_id"],
            },
        },
    }
]


async def test_tool_call_round_trip(fake_openai: FakeOpenAI) -> None:
    def saw_tool_result(messages: list[dict[str, Any]]) -> None:
        results = tool_messages(messages)
        assert [m["content"] for m in results] == ["deleted"]

    fake_openai.script(
        "delete user 42",
        [
            call("delete_user", {"user_id": 42}, id="call_del"),
            reply("User 42 is gone.", expect=saw_tool_result),
        ],
    )
    messages: list[Any] = [
        {"role": "system", "content": "You are careful."},
        {"role": "user", "content": "delete user 42"},
    ]
    async with client_for(fake_openai) as client:
        first = await client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, tools=TOOLS
        )
        choice = first.choices[0]
        assert first.object == "chat.completion"
        assert choice.finish_reason == "tool_calls"
        assert choice.message.role == "assistant"
        assert choice.message.content is None
        assert choice.message.tool_calls is not None
        (tool_call,) = choice.message.tool_calls
        assert tool_call.id == "call_del"
        assert tool_call.type == "function"
        assert tool_call.function.name == "delete_user"
        assert json.loads(tool_call.function.arguments) == {"user_id": 42}
        assert first.usage is not None and first.usage.total_tokens > 0

        messages.append(choice.message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": "deleted"})
        second = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        assert second.choices[0].finish_reason == "stop"
        assert second.choices[0].message.content == "User 42 is gone."
        assert second.choices[0].message.tool_calls is None

        # Stateless: asking the first question again gets the first answer again.
        again = await client.chat.completions.create(model="gpt-4o-mini", messages=messages[:2])
        assert again.choices[0].message.tool_calls is not None
        assert again.choices[0].message.tool_calls[0].id == "call_del"

    assert len(fake_openai.requests_for("delete user 42")) == 3
    assert fake_openai.requests_for("another task") == []
    assert fake_openai.errors == []


async def test_several_calls_get_unique_ids(fake_openai: FakeOpenAI) -> None:
    step = calls([("a", {}), ("b", {"x": 1}), ("a", "{}")])
    fake_openai.script("many", [step])
    async with client_for(fake_openai) as client:
        result = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "many"}]
        )
    tool_calls = result.choices[0].message.tool_calls
    assert tool_calls is not None
    assert [tc.function.name for tc in tool_calls] == ["a", "b", "a"]
    ids = [tc.id for tc in tool_calls]
    assert len(set(ids)) == 3 and all(i.startswith("call_") for i in ids)


async def test_invalid_json_arguments_are_sent_raw(fake_openai: FakeOpenAI) -> None:
    fake_openai.script("broken", [call("delete_user", '{"user_id": 4')])
    async with client_for(fake_openai) as client:
        result = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "broken"}]
        )
    tool_calls = result.choices[0].message.tool_calls
    assert tool_calls is not None
    assert tool_calls[0].function.arguments == '{"user_id": 4'


async def test_unexpected_request_is_a_500_and_recorded() -> None:
    with FakeOpenAI() as fake:
        fake.script("known", [reply("hi")])
        async with client_for(fake, max_retries=2) as client:
            with pytest.raises(openai.InternalServerError) as info:
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "unknown"}]
                )
            assert "no script for task 'unknown'" in str(info.value)
            # Past the end of the script.
            with pytest.raises(openai.InternalServerError):
                await client.chat.completions.create(
                    model="m",
                    messages=[
                        {"role": "user", "content": "known"},
                        {"role": "assistant", "content": "hi"},
                        {"role": "user", "content": "and?"},
                    ],
                )
        # Not retried although the client may retry: the error is not transient.
        assert len(fake.requests) == 2
        assert len(fake.errors) == 2
        assert "no script for task 'unknown'" in fake.errors[0]
        assert "only 1 step(s)" in fake.errors[1]


async def test_failing_expect_is_recorded() -> None:
    def never(messages: list[dict[str, Any]]) -> None:
        raise AssertionError("wanted a tool result")

    with FakeOpenAI() as fake:
        fake.script("t", [reply("no", expect=never)])
        async with client_for(fake) as client:
            with pytest.raises(openai.InternalServerError):
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "t"}]
                )
        assert len(fake.errors) == 1
        assert "wanted a tool result" in fake.errors[0]


async def test_responder_answers_what_no_script_covers() -> None:
    seen: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = []

    def respond(
        messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None
    ) -> Step:
        seen.append((messages, tools))
        messages.append({"role": "user", "content": "mutated"})  # a copy: the record is intact
        if tool_messages(messages):
            return reply(f"saw {tool_messages(messages)[0]['content']}")
        return call("delete_user", {"user_id": 42}, id="abcDEF123")

    def plain(messages: list[dict[str, Any]]) -> Step:
        return reply(f"{len(messages)} message(s)")

    with FakeOpenAI(server="mistral", responder=respond) as fake:
        fake.script("scripted", [reply("from the script")])
        history: list[Any] = [{"role": "user", "content": "anything"}]
        async with client_for(fake) as client:
            first = await client.chat.completions.create(model="m", messages=history, tools=TOOLS)
            (tc,) = first.choices[0].message.tool_calls or []
            assert (tc.id, tc.function.name, first.choices[0].finish_reason) == (
                "abcDEF123",
                "delete_user",
                "tool_calls",
            )
            history += [
                first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": "abcDEF123", "content": "deleted"},
            ]
            second = await client.chat.completions.create(model="m", messages=history)
            assert second.choices[0].message.content == "saw deleted"
            scripted = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "scripted"}]
            )
            assert scripted.choices[0].message.content == "from the script"  # scripts first
            # Tools given only to a responder that asks for them; [] when the request has none.
            assert [t for _, t in seen] == [TOOLS, []]
            assert fake.requests[0]["messages"] == [{"role": "user", "content": "anything"}]

            fake.respond_with(plain)
            other = await client.chat.completions.create(model="m", messages=history)
            assert other.choices[0].message.content == "3 message(s)"
            fake.respond_with(None)
            with pytest.raises(openai.InternalServerError, match="no script for task"):
                await client.chat.completions.create(model="m", messages=history)
            fake.reset()  # back to the constructor's responder
            again = await client.chat.completions.create(model="m", messages=history)
            assert again.choices[0].message.content == "saw deleted"
        assert fake.errors == []


async def test_a_failing_responder_is_an_error_and_recorded() -> None:
    def broken(messages: list[dict[str, Any]]) -> Step:
        raise KeyError("no idea")

    def wrong(messages: list[dict[str, Any]]) -> Step:
        return "not a step"  # type: ignore[return-value]

    with FakeOpenAI(responder=broken) as fake:
        async with client_for(fake, max_retries=2) as client:
            with pytest.raises(openai.InternalServerError, match="raised KeyError"):
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "t"}]
                )
            fake.respond_with(wrong)
            with pytest.raises(openai.InternalServerError, match="not a Step"):
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "t"}]
                )
        assert len(fake.requests) == 2  # not retried
        assert len(fake.errors) == 2
        assert "task 't' (responder): raised KeyError('no idea')" in fake.errors[0]
        assert "Traceback" in fake.errors[0]
        assert "returned 'not a step', not a Step" in fake.errors[1]


async def test_dangling_tool_call_id_is_a_400_like_the_real_api() -> None:
    with FakeOpenAI() as fake:
        fake.script("t", [call("x", {}), reply("done")])
        async with client_for(fake) as client:
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(
                    model="m",
                    messages=[
                        {"role": "user", "content": "t"},
                        {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "call_1",
                                    "type": "function",
                                    "function": {"name": "x", "arguments": "{}"},
                                }
                            ],
                        },
                    ],
                )
        assert "call_1" in str(info.value)
        assert len(fake.errors) == 1


def test_fixture_teardown_check_fails_on_errors() -> None:
    """What ``fake_openai`` does at teardown, on a server that saw an unexpected request."""
    with FakeOpenAI() as fake:
        body = {"model": "m", "messages": [{"role": "user", "content": "nobody scripted me"}]}
        request = urllib.request.Request(
            fake.base_url + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": "Bearer x", "Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=5)
        assert info.value.code == 500
        info.value.close()
        errors = fake.errors
    with pytest.raises(
        pytest.fail.Exception, match=r"(?s)1 unexpected request.*nobody scripted me"
    ):
        fail_on_fake_openai_errors(errors)
    fail_on_fake_openai_errors([])  # no errors: no failure


async def test_fail_next_429_is_retried(fake_openai: FakeOpenAI) -> None:
    fake_openai.script("busy", [reply("finally")])
    fake_openai.fail_next(2, status=429, retry_after=0.01)
    async with client_for(fake_openai, max_retries=2) as client:
        result = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "busy"}]
        )
    assert result.choices[0].message.content == "finally"
    assert fake_openai.failures_served == 2
    assert len(fake_openai.requests_for("busy")) == 3


async def test_fail_next_without_retries_raises(fake_openai: FakeOpenAI) -> None:
    fake_openai.script("t", [reply("ok")])
    fake_openai.fail_next(1, status=500)
    async with client_for(fake_openai) as client:
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "t"}]
            )
        ok = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "t"}]
        )
    assert ok.choices[0].message.content == "ok"
    assert fake_openai.failures_served == 1


async def test_missing_api_key_is_401(fake_openai: FakeOpenAI) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            fake_openai.base_url + "/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "t"}]},
        ) as response,
    ):
        assert response.status == 401
        body = await response.json()
    assert body["error"]["type"] == "invalid_request_error"
    assert "API key" in body["error"]["message"]
    assert fake_openai.requests == []


async def test_wrong_api_key_is_401_through_the_client() -> None:
    with FakeOpenAI(api_key="right") as fake:
        async with client_for(fake, api_key="wrong") as client:
            with pytest.raises(openai.AuthenticationError):
                await client.models.list()
        async with client_for(fake, api_key="right") as client:
            models = await client.models.list()
            assert [m.id for m in models.data] == ["gpt-4o-mini"]


# --------------------------------------------------------------------------- server profiles
async def post_chat(fake: FakeOpenAI, body: dict[str, Any]) -> tuple[int, Any, Any]:
    """POST a raw chat body; (status, JSON body, headers)."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            fake.base_url + "/chat/completions",
            json=body,
            headers={"Authorization": "Bearer test"},
        ) as response,
    ):
        return response.status, await response.json(), response.headers


def assistant_calling(call_id: Any, arguments: Any = "{}", content: Any = None) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "x", "arguments": arguments}}
        ],
    }


USER = {"role": "user", "content": "t"}


def answered(call_id: Any, arguments: Any = "{}", content: Any = None) -> list[dict[str, Any]]:
    return [
        USER,
        assistant_calling(call_id, arguments, content),
        {"role": "tool", "tool_call_id": call_id, "content": "ok"},
    ]


def test_unknown_profiles_and_quirks_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown server"):
        FakeOpenAI(server="bedrock")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown quirks"):
        FakeOpenAI(quirks={"tabs"})
    with pytest.raises(ValueError, match="upstream is for a relay"):
        FakeOpenAI(server="mistral", upstream="openai")
    assert set(SERVERS) >= {"openai", "azure", "ollama", "vllm", "llamacpp", "mistral"}


# (server, options, body, status, rule, what the body says)
REFUSALS: list[Any] = [
    pytest.param(
        "openai",
        {},
        {"messages": [USER, assistant_calling("call_a")]},
        400,
        "tool_calls_answered",
        {"error": {"param": "messages.[1].role"}},
        id="openai-unanswered",
    ),
    pytest.param(
        "openai",
        {},
        {"messages": [USER, {"role": "assistant", "content": None}, USER]},
        400,
        "openai.assistant_content",
        {"error": {"param": "messages.[1].content"}},
        id="openai-null",
    ),
    pytest.param(
        "openai",
        {},
        {"messages": answered("c" * 41)},
        400,
        "openai.tool_call_id_length",
        {"error": {"code": "string_above_max_length"}},
        id="openai-id-41",
    ),
    pytest.param(
        "openai",
        {},
        {
            "messages": [USER],
            "tools": [{"type": "function", "function": {"name": "x", "description": "d" * 1025}}],
        },
        400,
        "openai.tool_description_length",
        {"error": {"param": "tools[0].function.description"}},
        id="openai-description",
    ),
    pytest.param(
        "azure",
        {},
        {"messages": [USER, {"role": "assistant", "content": None}, USER]},
        400,
        "openai.assistant_content",
        {"error": {"status": 400}},
        id="azure-null",
    ),
    pytest.param(
        "ollama",
        {},
        {"messages": answered("call_a", content=None)},
        400,
        "ollama.content_type",
        {
            "error": {
                "message": "invalid message content type: <nil>",
                "type": "invalid_request_error",
            }
        },
        id="ollama-null",
    ),
    pytest.param(
        "vllm",
        {},
        {"messages": answered("call_a", '{"key": "unterminated')},
        400,
        "vllm.history_arguments",
        {"error": {"type": "BadRequestError", "code": 400}},
        id="vllm-args",
    ),
    pytest.param(
        "llamacpp",
        {},
        {"messages": answered("call_a", "[1,")},
        500,
        "llamacpp.history_arguments",
        {"error": {"code": 500, "type": "server_error"}},
        id="llamacpp-args",
    ),
    pytest.param(
        "llamacpp",
        {},
        {"messages": answered(7)},
        500,
        "llamacpp.id_type",
        {"error": {"code": 500}},
        id="llamacpp-id-type",
    ),
    pytest.param(
        "mistral",
        {},
        {"messages": answered("call_1", content="")},
        400,
        "mistral.tool_call_id",
        {
            "object": "error",
            "message": "Tool call id was call_1 but must be a-z, A-Z, 0-9, with a length of 9.",
        },
        id="mistral-id",
    ),
    pytest.param(
        "mistral",
        {},
        {"messages": [USER, {"role": "assistant", "content": "x", "reasoning_content": "r"}, USER]},
        422,
        "mistral.extra_fields",
        {
            "message": {
                "detail": [
                    {
                        "type": "extra_forbidden",
                        "loc": ["body", "messages", 1, "assistant", "reasoning_content"],
                    }
                ]
            }
        },
        id="mistral-extra",
    ),
    pytest.param(
        "mistral",
        {},
        {"messages": [USER, {"role": "assistant", "content": ""}, USER]},
        400,
        "mistral.empty_assistant",
        {"type": "invalid_request_error"},
        id="mistral-empty",
    ),
    pytest.param(
        "mistral",
        {},
        {"messages": [USER, assistant_calling("AbCdE1234", content="")]},
        400,
        "mistral.tool_calls_answered",
        {"message": "Not the same number of function calls and responses"},
        id="mistral-unanswered",
    ),
    pytest.param(
        "mistral",
        {},
        {"messages": [*answered("AbCdE1234", content=""), USER]},
        400,
        "mistral.role_order",
        {"message": "Unexpected role 'user' after role 'tool'", "code": "3230"},
        id="mistral-user-after-tool",
    ),
    pytest.param(
        "mistral",
        {},
        {"messages": [USER, {"role": "assistant", "content": "x"}]},
        400,
        "mistral.last_role",
        {"type": "invalid_request_error"},
        id="mistral-last-assistant",
    ),
    pytest.param(
        "groq",
        {},
        {"messages": [USER], "logprobs": True},
        400,
        "groq.unsupported",
        {"error": {"param": "logprobs"}},
        id="groq-logprobs",
    ),
    pytest.param(
        "groq",
        {},
        {"messages": [USER], "n": 2},
        400,
        "groq.unsupported",
        {"error": {"param": "n"}},
        id="groq-n",
    ),
    pytest.param(
        "openrouter",
        {"upstream": "mistral"},
        {"messages": answered("call_1", content="")},
        400,
        "mistral.tool_call_id",
        {
            "error": {
                "code": 400,
                "message": "Provider returned error",
                "metadata": {"provider_name": "Mistral"},
            }
        },
        id="openrouter-mistral-id",
    ),
    pytest.param(
        "litellm",
        {"upstream": "vllm"},
        {"messages": answered("call_a", "{")},
        400,
        "vllm.history_arguments",
        {"error": {"code": "400"}},
        id="litellm-vllm-args",
    ),
]


def contains(actual: Any, expected: Any) -> bool:
    """``expected`` is a sub-structure of ``actual`` (dicts by key, lists item by item)."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            k in actual and contains(actual[k], v) for k, v in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(contains(a, e) for a, e in zip(actual, expected, strict=True))
        )
    return bool(actual == expected)


@pytest.mark.parametrize(("server", "options", "body", "status", "rule", "says"), REFUSALS)
async def test_each_profile_refuses_what_its_server_refuses(
    server: Any, options: dict[str, Any], body: dict[str, Any], status: int, rule: str, says: Any
) -> None:
    with FakeOpenAI(server=server, **options) as fake:
        fake.script("t", [reply("never"), reply("never"), reply("never")])
        got_status, got, _ = await post_chat(fake, {"model": "m", **body})
        assert (got_status, contains(got, says)) == (status, True), got
        [error] = fake.errors
        assert f"({rule})" in error


async def test_relays_wrap_the_upstream_refusal() -> None:
    with FakeOpenAI(server="openrouter", upstream="mistral") as fake:
        _, got, _ = await post_chat(
            fake, {"model": "m", "messages": answered("call_1", content="")}
        )
        raw = json.loads(got["error"]["metadata"]["raw"])
        assert raw["message"].startswith("Tool call id was call_1")
    with FakeOpenAI(server="litellm", upstream="mistral") as fake:
        _, got, _ = await post_chat(
            fake, {"model": "m", "messages": answered("call_1", content="")}
        )
        assert got["error"]["message"].startswith("litellm.BadRequestError: MistralException - ")


@pytest.mark.parametrize(
    ("server", "messages"),
    [
        ("openai", answered("call_a")),  # content null beside tool calls is fine for OpenAI
        ("ollama", answered("call_a", content="")),
        ("vllm", answered("call_a", "")),  # "" becomes {}
        ("mistral", answered("AbCdE1234", content="")),  # "" beside tool calls is accepted
        ("groq", answered("call_a")),
    ],
)
async def test_what_a_server_accepts_is_not_refused(server: Any, messages: list[Any]) -> None:
    with FakeOpenAI(server=server) as fake:
        fake.script("t", [reply("a"), reply("ok")])
        status, got, _ = await post_chat(fake, {"model": "m", "messages": messages})
        assert (status, fake.errors) == (200, []), got


ID_FORMATS = {
    "openai": r"call_\d+",
    "azure": r"call_\d+",
    "groq": r"call_\d+",
    "litellm": r"call_\d+",
    "openrouter": r"call_\d+",
    "mistral": r"[A-Za-z0-9]{9}",
    "ollama": r"call_[a-z0-9]{8}",
    "vllm": r"chatcmpl-tool-[0-9a-f]{32}",
    "llamacpp": r"[A-Za-z0-9]{32}",
    "deepseek": r"call_\d+",
    "gemini": r"call_\d+",
    "anthropic": r"toolu_01[A-Za-z0-9]{22}",
}


@pytest.mark.parametrize("server", SERVERS)
async def test_each_profile_answers_in_its_servers_shape(server: Any) -> None:
    with FakeOpenAI(server=server) as fake:
        fake.script("t", [calls([("a", {"k": 1}), ("b", {})], reasoning="hmm")])
        first, second = [
            (await post_chat(fake, {"model": "m", "messages": [USER]}))[1] for _ in range(2)
        ]
        async with client_for(fake) as client:  # the OpenAI client parses every shape
            parsed = await client.chat.completions.create(model="m", messages=[USER])
    choice, message = first["choices"][0], first["choices"][0]["message"]
    ids = [tc["id"] for tc in message["tool_calls"]]
    assert all(re.fullmatch(ID_FORMATS[server], i) for i in ids), ids
    assert len(set(ids)) == 2
    assert ids == [tc["id"] for tc in second["choices"][0]["message"]["tool_calls"]]  # stable
    assert parsed.choices[0].message.tool_calls is not None
    assert choice["finish_reason"] == "tool_calls"
    reasoning = {
        "vllm": message.get("reasoning_content"),
        "llamacpp": message.get("reasoning_content"),
        "litellm": message.get("reasoning_content"),
        "openrouter": message.get("reasoning"),
        "mistral": (message["content"] or [{}])[0].get("thinking"),
        "deepseek": message.get("reasoning_content"),
    }.get(server)
    assert reasoning in ("hmm", [{"type": "text", "text": "hmm"}]) or server in (
        "openai",
        "azure",
        "ollama",
        "groq",
        "gemini",  # thoughts only with include_thoughts
        "anthropic",  # never through the OpenAI layer
    )
    extra: dict[str, Callable[[], bool]] = {
        "azure": lambda: "prompt_filter_results" in first and "content_filter_results" in choice,
        "ollama": lambda: first["system_fingerprint"] == "fp_ollama" and message["content"] == "",
        "vllm": lambda: "stop_reason" in choice,
        "llamacpp": lambda: "timings" in first,
        "openrouter": lambda: (
            first["provider"] == "OpenAI" and choice["native_finish_reason"] == "tool_calls"
        ),
        "groq": lambda: first["x_groq"]["id"].startswith("req_"),
        "mistral": lambda: all(tc["index"] == k for k, tc in enumerate(message["tool_calls"])),
        "deepseek": lambda: (
            first["usage"]["completion_tokens_details"]["reasoning_tokens"] >= 0
            and "prompt_cache_hit_tokens" in first["usage"]
        ),
        # One signature per step, on its first call only (parallel calls).
        "gemini": lambda: (
            [tc.get("extra_content") for tc in message["tool_calls"]]
            == [{"google": {"thought_signature": thought_signature("a")}}, None]
        ),
        "anthropic": lambda: "reasoning_content" not in message,
    }
    assert extra.get(server, lambda: True)()


async def test_explicit_ids_are_sent_as_given_by_every_profile() -> None:
    with FakeOpenAI(server="mistral") as fake:
        fake.script("t", [calls([("a", {}, ""), ("b", {}, "dup"), ("c", {}, "dup")])])
        _, got, _ = await post_chat(fake, {"model": "m", "messages": [USER]})
    assert [tc["id"] for tc in got["choices"][0]["message"]["tool_calls"]] == ["", "dup", "dup"]


async def test_magistral_answers_in_chunks() -> None:
    with FakeOpenAI(server="mistral") as fake:
        fake.script("t", [reply("Paris.", reasoning="France.")])
        _, got, _ = await post_chat(fake, {"model": "m", "messages": [USER]})
    assert got["choices"][0]["message"]["content"] == [
        {"type": "thinking", "thinking": [{"type": "text", "text": "France."}]},
        {"type": "text", "text": "Paris."},
    ]


async def test_azure_content_filter_shapes() -> None:
    with FakeOpenAI(server="azure") as fake:
        fake.script("t", [filtered(category="violence")])
        _, got, _ = await post_chat(fake, {"model": "m", "messages": [USER]})
    choice = got["choices"][0]
    assert (choice["finish_reason"], choice["message"]["content"]) == ("content_filter", None)
    assert choice["content_filter_results"]["violence"] == {"filtered": True, "severity": "high"}
    assert choice["content_filter_results"]["hate"] == {"filtered": False, "severity": "safe"}
    assert got["prompt_filter_results"][0]["prompt_index"] == 0


@pytest.mark.parametrize(
    ("quirk", "check"),
    [
        ("object_arguments", lambda tc, ch: tc["function"]["arguments"] == {"k": 1}),
        ("missing_ids", lambda tc, ch: "id" not in tc),
        ("empty_ids", lambda tc, ch: tc["id"] == ""),
        ("stop_with_tool_calls", lambda tc, ch: ch["finish_reason"] == "stop"),
    ],
)
async def test_quirks(quirk: str, check: Any) -> None:
    with FakeOpenAI(server="llamacpp", quirks={quirk}) as fake:
        fake.script("t", [call("a", {"k": 1})])
        _, got, _ = await post_chat(fake, {"model": "m", "messages": [USER]})
    choice = got["choices"][0]
    assert check(choice["message"]["tool_calls"][0], choice)


@pytest.mark.parametrize(
    ("server", "header", "expected"),
    [
        ("openai", None, {"x-ratelimit-reset-tokens": re.compile(r"\d+\.\d{3}s")}),
        ("groq", None, {"retry-after": "3", "x-ratelimit-reset-tokens": re.compile(r"\d+\.\d+s")}),
        ("azure", None, {"retry-after": "3"}),
        ("azure", "x-rate-limit-reset-tokens", {"x-rate-limit-reset-tokens": "3"}),
        ("openrouter", None, {"Retry-After": "3"}),
        ("openai", "retry-after-ms", {"retry-after-ms": re.compile(r"2\d{3}")}),
    ],
)
async def test_each_profile_rate_limits_in_its_own_words(
    server: Any, header: str | None, expected: dict[str, Any]
) -> None:
    with FakeOpenAI(server=server) as fake:
        fake.rate_limit(2.5, header=header)
        status, got, headers = await post_chat(fake, {"model": "m", "messages": [USER]})
    assert status == 429 and "error" in got
    for name, value in expected.items():
        assert name in headers, dict(headers)
        assert (
            value.fullmatch(headers[name])
            if isinstance(value, re.Pattern)
            else headers[name] == value
        )
    if header is not None:
        assert not {"retry-after", "x-ratelimit-reset-tokens"} - {header} & {
            h.lower() for h in headers
        }
