"""The fake OpenAI server, driven by the real ``openai`` client."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import openai
import pytest

from agent_core.testing import FakeOpenAI, call, calls, reply, tool_messages
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
