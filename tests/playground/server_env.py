"""The playground's HTTP server under test, without a browser (shared by its test files):
the :class:`Playground` app on 127.0.0.1 with a private Redis, ``slack_sdk``'s own clients
calling it, and a small aiohttp server standing in for the bot's ``/slack/events`` that
records each request (and checks its Slack signature) and answers what the test tells it to.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import pytest
from aiohttp import test_utils, web
from redis.asyncio import Redis
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from playground import people
from playground.guard import TOKEN_HEADER
from playground.outbound import Sender
from playground.server import PageInfo, Playground
from playground.store import Store

SECRET = "playground-test-signing-secret"
TOKEN = "xoxb-playground-test-" + secrets.token_hex(6)
CH = people.CHANNEL_ID
RILEY, AVERY, SAM, MORGAN = (p.id for p in people.PEOPLE)
TS = re.compile(r"^\d{10}\.\d{6}$")

BUTTONS: list[dict[str, Any]] = [
    {
        "type": "section",
        "block_id": "card",
        "text": {"type": "mrkdwn", "text": "*delete_user* `42`: approve?"},
    },
    {
        "type": "actions",
        "block_id": "decide",
        "elements": [
            {
                "type": "button",
                "action_id": "approve",
                "text": {"type": "plain_text", "text": "Approve"},
                "style": "primary",
                "value": "gate-1:approve",
            },
            {
                "type": "button",
                "action_id": "deny",
                "text": {"type": "plain_text", "text": "Deny"},
                "style": "danger",
                "value": "gate-1:deny",
            },
        ],
    },
]


def modal(title: str = "Deny delete_user", *, notify: bool = False) -> dict[str, Any]:
    return {
        "type": "modal",
        "callback_id": "deny_reason",
        "title": {"type": "plain_text", "text": title},
        "submit": {"type": "plain_text", "text": "Deny"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "private_metadata": "gate-1",
        "notify_on_close": notify,
        "blocks": [
            {
                "type": "input",
                "block_id": "reason",
                "label": {"type": "plain_text", "text": "Why?"},
                "element": {
                    "type": "plain_text_input",
                    "action_id": "text",
                    "multiline": True,
                    "max_length": 200,
                },
            },
            {
                "type": "input",
                "block_id": "note",
                "optional": True,
                "label": {"type": "plain_text", "text": "Note"},
                "element": {"type": "plain_text_input", "action_id": "text"},
            },
        ],
    }


# --------------------------------------------------------------------------- the bot's side
@dataclass
class Received:
    """One request the playground sent to the bot's /slack/events."""

    headers: dict[str, str]
    body: str
    signed: bool

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "")

    def form(self) -> dict[str, str]:
        assert self.content_type.startswith("application/x-www-form-urlencoded")
        parsed = parse_qs(self.body, keep_blank_values=True, strict_parsing=True)
        assert all(len(v) == 1 for v in parsed.values()), parsed
        return {k: v[0] for k, v in parsed.items()}

    def payload(self) -> dict[str, Any]:
        """The JSON of an interaction (its only form field is ``payload``)."""
        form = self.form()
        assert set(form) == {"payload"}, form
        data: dict[str, Any] = json.loads(form["payload"])
        return data

    def envelope(self) -> dict[str, Any]:
        """An Events API request: a JSON body."""
        assert self.content_type.startswith("application/json")
        data: dict[str, Any] = json.loads(self.body)
        return data


@dataclass
class Reply:
    status: int = 200
    body: str = ""
    content_type: str = "text/plain"
    delay: float = 0.0


def json_reply(data: Any, status: int = 200) -> Reply:
    return Reply(status, json.dumps(data), "application/json")


@dataclass
class FakeBot:
    """The bot's /slack/events: records every request, answers the queued replies in order
    (then 200 with an empty body, as Bolt acknowledges)."""

    verifier: SignatureVerifier = field(default_factory=lambda: SignatureVerifier(SECRET))
    received: list[Received] = field(default_factory=list)
    replies: deque[Reply] = field(default_factory=deque)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def answer(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def handle(self, request: web.Request) -> web.Response:
        body = (await request.read()).decode()
        headers = dict(request.headers)
        signed = self.verifier.is_valid(
            body,
            headers.get("X-Slack-Request-Timestamp", ""),
            headers.get("X-Slack-Signature", ""),
        )
        self.received.append(Received(headers, body, signed))
        reply = self.replies.popleft() if self.replies else Reply()
        if reply.delay:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.release.wait(), reply.delay)
        return web.Response(status=reply.status, text=reply.body, content_type=reply.content_type)


# --------------------------------------------------------------------------- the page's side
@dataclass
class Stream:
    """An open ``/ui/stream``: the Server-Sent Events the page gets."""

    resp: aiohttp.ClientResponse

    async def next(self, timeout: float = 3.0) -> tuple[str, dict[str, Any]]:
        event, data = "", ""
        while True:
            line = await asyncio.wait_for(self.resp.content.readline(), timeout)
            assert line, "the stream ended"
            text = line.decode().rstrip("\n")
            if text:
                key, _, value = text.partition(": ")
                if key == "event":
                    event = value
                elif key == "data":
                    data = value
                continue
            if event and event != "ping":
                return event, json.loads(data)
            event, data = "", ""

    async def next_message(self, timeout: float = 3.0) -> dict[str, Any]:
        """The next ``message`` event (other kinds are skipped)."""
        while True:
            event, data = await self.next(timeout)
            if event == "message":
                return data


@dataclass
class Env:
    pg: Playground
    bot: FakeBot
    url: str
    http: aiohttp.ClientSession
    slack: AsyncWebClient

    async def api(self, method: str, token: str | None = TOKEN, **args: Any) -> dict[str, Any]:
        """A Web API call with a JSON body, as slack_sdk sends chat.postMessage."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with self.http.post(f"{self.url}/api/{method}", json=args, headers=headers) as r:
            assert r.status == 200  # Slack answers 200 even for an error
            data: dict[str, Any] = await r.json()
            return data

    async def api_form(self, method: str, fields: dict[str, str]) -> dict[str, Any]:
        """A Web API call with a form-encoded body."""
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with self.http.post(f"{self.url}/api/{method}", data=fields, headers=headers) as r:
            assert r.status == 200
            data: dict[str, Any] = await r.json()
            return data

    @property
    def token(self) -> dict[str, str]:
        """The header the page sends its session token in."""
        return {TOKEN_HEADER: self.pg.session_token}

    async def get(self, path: str, **params: str) -> tuple[int, Any]:
        async with self.http.get(self.url + path, params=params, headers=self.token) as r:
            return r.status, await r.json()

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        kwargs: dict[str, Any] = (
            {"data": body, "headers": {**self.token, "Content-Type": "application/json"}}
            if isinstance(body, (str, bytes))
            else {"json": body, "headers": self.token}
        )
        async with self.http.post(self.url + path, **kwargs) as r:
            return r.status, await r.json()

    async def history(self, who: str, **params: str) -> list[dict[str, Any]]:
        status, data = await self.get("/ui/history", **{"as": who, **params})
        assert status == 200, data
        messages: list[dict[str, Any]] = data["messages"]
        return messages

    async def thread(self, who: str, ts: str) -> dict[str, Any]:
        status, data = await self.get("/ui/thread", **{"as": who, "ts": ts})
        assert status == 200, data
        return dict(data)

    async def send(self, who: str, text: str, thread_ts: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"as": who, "text": text}
        if thread_ts:
            body["thread_ts"] = thread_ts
        status, data = await self.post("/ui/send", body)
        assert status == 200, data
        return dict(data)

    async def say(self, text: str = "hello", **args: Any) -> dict[str, Any]:
        """The bot posts in the channel (slack_sdk's chat.postMessage)."""
        resp = await self.slack.chat_postMessage(channel=CH, text=text, **args)
        assert isinstance(resp.data, dict)
        return dict(resp.data)

    async def command(self, who: str, text: str = "/agent status") -> Received:
        """A person runs the slash command; the request the bot got."""
        before = len(self.bot.received)
        assert await self.send(who, text) == {"ok": True}
        assert len(self.bot.received) == before + 1
        return self.bot.received[-1]

    async def open_view(self, who: str, view: dict[str, Any]) -> dict[str, Any]:
        """A person runs the command; the bot opens ``view`` with its trigger."""
        trigger = (await self.command(who)).form()["trigger_id"]
        resp = await self.slack.views_open(trigger_id=trigger, view=view)
        return dict(resp["view"])

    async def click(
        self, who: str, msg_ts: str, action_id: str = "approve", **extra: Any
    ) -> tuple[int, Any]:
        action = {"action_id": action_id, "block_id": "decide", **extra}
        container = {"type": "message", "channel": CH, "ts": msg_ts}
        return await self.post("/ui/action", {"as": who, "container": container, "action": action})

    @contextlib.asynccontextmanager
    async def stream(self, who: str) -> AsyncIterator[Stream]:
        params = {"as": who}
        async with self.http.get(
            f"{self.url}/ui/stream", params=params, headers=self.token
        ) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            # The first line is written once the tab is subscribed: from then on, it gets all.
            first = await asyncio.wait_for(resp.content.readline(), 3)
            assert first == b"retry: 1000\n"
            yield Stream(resp)


@contextlib.asynccontextmanager
async def open_env(redis: Redis) -> AsyncIterator[Env]:
    """The playground and the bot standing in for ours; every request checked as signed."""
    bot = FakeBot()
    bot_app = web.Application()
    bot_app.router.add_post("/slack/events", bot.handle)
    bot_server = test_utils.TestServer(bot_app, host="127.0.0.1")
    await bot_server.start_server()
    pg = Playground(
        Store(redis, f"pgtest-{uuid.uuid4().hex[:10]}"),
        Sender(f"http://127.0.0.1:{bot_server.port}/slack/events", SECRET),
        TOKEN,
        PageInfo(examples=["/agent status"]),
    )
    server = test_utils.TestServer(pg.app(), host="127.0.0.1")
    await server.start_server()
    url = f"http://127.0.0.1:{server.port}"
    pg.response_base = url
    http = aiohttp.ClientSession()
    slack = AsyncWebClient(token=TOKEN, base_url=url + "/api/", session=http)
    try:
        yield Env(pg, bot, url, http, slack)
    finally:
        bot.release.set()
        await http.close()
        await server.close()
        await bot_server.close()
    unsigned = [r.body[:200] for r in bot.received if not r.signed]
    assert not unsigned, f"requests without a valid Slack signature: {unsigned}"


def texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["text"] for m in messages]


def without_ids(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Blocks without the block_id Slack (and the playground) gives a block sent without one."""
    assert all(b.get("block_id") for b in blocks)
    return [{k: v for k, v in b.items() if k != "block_id"} for b in blocks]


@pytest.fixture
async def env(redis: Redis) -> AsyncIterator[Env]:
    """The fixture of the server's tests (imported by name where used)."""
    async with open_env(redis) as e:
        yield e
