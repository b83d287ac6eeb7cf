"""The model's HTTP path (agent_core.model_http): what the runner reasons with must be what
OpenAI's own client would have raised, for every kind of answer."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import openai
import pytest
from openai import AsyncOpenAI

from agent_core import retries
from agent_core.model_http import ModelEndpoint
from agent_core.provider_errors import api_failure
from agent_core.testing import FakeOpenAI, reply

pytestmark = pytest.mark.timeout(30)

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hello there"}]}).encode()


@pytest.fixture
async def endpoint(fake_openai: FakeOpenAI) -> AsyncIterator[ModelEndpoint]:
    client = AsyncOpenAI(api_key="sk-test-0123456789", base_url=fake_openai.base_url)
    ep = ModelEndpoint(client)
    yield ep
    fake_openai.clear_failures()
    await ep.aclose()
    await client.close()


async def test_a_completion_comes_back_as_json(
    endpoint: ModelEndpoint, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script("hello there", [reply("hi!")])
    body = await endpoint.post(BODY)
    assert body["choices"][0]["message"]["content"] == "hi!"
    assert fake_openai.errors == []  # the fake checks the key, the headers and the body


async def test_a_rate_limit_is_openais_rate_limit_error_with_its_hint(
    endpoint: ModelEndpoint, fake_openai: FakeOpenAI
) -> None:
    fake_openai.fail_next(1, status=429, retry_after=7)
    with pytest.raises(openai.RateLimitError) as exc:
        await endpoint.post(BODY)
    assert exc.value.status_code == 429
    assert retries.retryable(exc.value)
    assert retries.wait_for(exc.value, 0) == 7.0


@pytest.mark.parametrize(
    ("status", "kind", "retry"),
    [
        (400, openai.BadRequestError, False),
        (401, openai.AuthenticationError, False),
        (404, openai.NotFoundError, False),
        (500, openai.InternalServerError, True),
        (503, openai.InternalServerError, True),
    ],
)
async def test_each_status_gets_the_type_openais_client_gives_it(
    endpoint: ModelEndpoint,
    fake_openai: FakeOpenAI,
    status: int,
    kind: type[openai.APIStatusError],
    retry: bool,
) -> None:
    fake_openai.fail_next(1, status=status)
    with pytest.raises(kind) as exc:
        await endpoint.post(BODY)
    assert type(exc.value) is kind and exc.value.status_code == status
    assert retries.retryable(exc.value) is retry
    failure = api_failure(exc.value)
    assert failure.message.startswith(f"model API error ({kind.__name__}) HTTP {status}")
    assert "sk-test-0123456789" not in failure.message


async def test_nobody_listening_is_a_connection_error_naming_no_secret() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    client = AsyncOpenAI(api_key="sk-secret-abcdef", base_url=f"http://127.0.0.1:{port}/v1")
    ep = ModelEndpoint(client)
    try:
        with pytest.raises(openai.APIConnectionError) as exc:
            await ep.post(BODY)
        assert not isinstance(exc.value, openai.APITimeoutError)
        assert retries.retryable(exc.value)
        assert "sk-secret" not in str(exc.value) and "sk-secret" not in repr(exc.value.request)
    finally:
        await ep.aclose()
        await client.close()


async def test_a_server_that_never_answers_times_out_as_the_client_is_told() -> None:
    writers: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)  # no answer: closed by the test once the client gave up
        await reader.read(65536)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = AsyncOpenAI(api_key="sk-x", base_url=f"http://127.0.0.1:{port}/v1", timeout=0.3)
    ep = ModelEndpoint(client)
    try:
        with pytest.raises(openai.APITimeoutError):
            await ep.post(BODY)
    finally:
        await ep.aclose()
        await client.close()
        for w in writers:
            w.close()
        server.close()
        await server.wait_closed()


async def test_a_page_that_is_not_json_comes_back_as_text() -> None:
    async def page(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        html = b"<!doctype html><html><body>Welcome</body></html>"
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: "
            + str(len(html)).encode()
            + b"\r\n\r\n"
            + html
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(page, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = AsyncOpenAI(api_key="sk-x", base_url=f"http://127.0.0.1:{port}/v1")
    ep = ModelEndpoint(client)
    try:
        assert await ep.post(BODY) == "<!doctype html><html><body>Welcome</body></html>"
    finally:
        await ep.aclose()
        await client.close()
        server.close()
        await server.wait_closed()


async def test_a_runner_without_a_client_says_so() -> None:
    with pytest.raises(RuntimeError, match="no OpenAI client was given"):
        await ModelEndpoint(None).post(BODY)
