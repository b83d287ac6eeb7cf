"""The playground's HTTP server, without a browser: the Web API the bot calls, the page's UI
API and its live stream, and the signed requests the playground sends the bot.

Everything is real and local: the :class:`Playground` app on 127.0.0.1 with a private Redis,
``slack_sdk``'s own clients calling it, and a small aiohttp server standing in for the bot's
``/slack/events`` that records each request (and checks its Slack signature) and answers what
the test tells it to.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import secrets
import time
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
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from playground import people
from playground import store as store_module
from playground.guard import TOKEN_HEADER
from playground.launcher import slack_manifest
from playground.outbound import ACK_TIMEOUT, Sender
from playground.server import PageInfo, Playground, bot_events
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


@pytest.fixture
async def env(redis: Redis) -> AsyncIterator[Env]:
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


# =========================================================================== Web API: auth
async def test_web_api_auth(env: Env) -> None:
    assert await env.api("auth.test", token=None) == {"ok": False, "error": "not_authed"}
    assert await env.api("auth.test", token="xoxb-wrong") == {"ok": False, "error": "invalid_auth"}
    assert (await env.api("chat.postMessage", token="xoxb-wrong", channel=CH, text="x"))[
        "error"
    ] == "invalid_auth"
    # The token as a form field, as some clients send it.
    fields = {"token": TOKEN, "channel": CH, "text": "by form token"}
    async with env.http.post(f"{env.url}/api/chat.postMessage", data=fields) as r:
        assert (await r.json())["ok"] is True
    async with env.stream(RILEY) as stream:
        assert await env.api("nope.method") == {"ok": False, "error": "unknown_method"}
        event, data = await stream.next()
        assert event == "notice"
        assert data["level"] == "error"
        assert data["text"].startswith("nope.method → unknown_method")
    assert texts(await env.history(RILEY)) == ["by form token"]


async def test_auth_test_through_slack_sdk(env: Env) -> None:
    resp = await env.slack.auth_test()
    assert resp["ok"] is True
    assert resp["user_id"] == people.BOT_USER_ID
    assert resp["bot_id"] == people.BOT_ID
    assert resp["team_id"] == people.TEAM_ID
    assert resp["team"] == people.TEAM_NAME
    assert resp["user"] == people.BOT_NAME
    assert resp["url"].startswith("http")
    with pytest.raises(SlackApiError) as exc:
        await AsyncWebClient(
            token="xoxb-wrong", base_url=env.url + "/api/", session=env.http
        ).auth_test()
    assert exc.value.response["error"] == "invalid_auth"


# =========================================================================== chat.postMessage
async def test_post_message_is_stored_and_shown(env: Env) -> None:
    async with env.stream(AVERY) as stream:
        sent = await env.say("Approve?", blocks=BUTTONS)
        shown = await stream.next_message()
    assert sent["ok"] is True and sent["channel"] == CH and TS.match(sent["ts"])
    assert sent["message"]["blocks"] == BUTTONS
    assert sent["message"]["bot_id"] == people.BOT_ID
    assert shown["ts"] == sent["ts"] and shown["blocks"] == BUTTONS
    assert shown["bot"] is True and shown["user_name"] == people.BOT_NAME
    assert shown["ephemeral"] is False
    [stored] = await env.history(RILEY)
    assert stored == shown


async def test_post_message_with_a_form_body(env: Env) -> None:
    out = await env.api_form(
        "chat.postMessage", {"channel": CH, "text": "form", "blocks": json.dumps(BUTTONS)}
    )
    assert out["ok"] is True
    [stored] = await env.history(RILEY)
    assert stored["blocks"] == BUTTONS and stored["text"] == "form"


async def test_thread_replies_and_reply_counts(env: Env) -> None:
    root = await env.say("Task started")
    first = await env.say("first reply", thread_ts=root["ts"])
    # A reply to a reply lands in the root's thread, as in Slack.
    second = await env.say("reply to a reply", thread_ts=first["ts"])
    assert second["message"]["thread_ts"] == root["ts"]
    [shown] = await env.history(RILEY)  # replies are not in the channel's history
    assert shown["ts"] == root["ts"]
    assert shown["reply_count"] == 2
    assert shown["latest_reply"] == second["ts"]
    assert shown["reply_users"] == [people.BOT_USER_ID]
    thread = await env.thread(AVERY, root["ts"])
    assert thread["root"]["reply_count"] == 2
    assert texts(thread["replies"]) == ["first reply", "reply to a reply"]
    assert all(r["thread_ts"] == root["ts"] for r in thread["replies"])
    # conversations.replies from any message of the thread answers the whole thread.
    resp = await env.slack.conversations_replies(channel=CH, ts=second["ts"])
    assert texts(resp["messages"]) == ["Task started", "first reply", "reply to a reply"]
    assert resp["messages"][0]["reply_count"] == 2
    hist = await env.slack.conversations_history(channel=CH)
    assert [m["ts"] for m in hist["messages"]] == [root["ts"]]
    assert hist["messages"][0]["reply_count"] == 2
    assert hist["messages"][0]["thread_ts"] == root["ts"]


async def test_replies_are_announced_with_their_root(env: Env) -> None:
    root = await env.say("Task started")
    async with env.stream(RILEY) as stream:
        reply = await env.say("a reply", thread_ts=root["ts"])
        got = await stream.next_message()
        assert got["ts"] == reply["ts"] and got["thread_ts"] == root["ts"]
        moved = await stream.next_message()
        assert moved["ts"] == root["ts"] and moved["reply_count"] == 1


@pytest.mark.parametrize(
    ("blocks", "reason"),
    [
        ([{"type": "nope"}], "block 0: unknown block type 'nope'"),
        (
            [{"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3001}}],
            "block 0 (section): text attribute cannot exceed 3000 characters",
        ),
        (  # an element inside a block: a button's label is at most 75 characters
            [
                {"type": "divider"},
                {
                    "type": "actions",
                    "elements": [
                        {
                            "type": "button",
                            "action_id": "a",
                            "text": {"type": "plain_text", "text": "x" * 76},
                        }
                    ],
                },
            ],
            "block 1 (actions): text attribute cannot exceed 75 characters",
        ),
    ],
)
async def test_invalid_blocks_are_refused_with_a_notice(
    env: Env, blocks: list[dict[str, Any]], reason: str
) -> None:
    async with env.stream(RILEY) as stream:
        with pytest.raises(SlackApiError) as exc:
            await env.say("bad", blocks=blocks)
        event, data = await stream.next()
    # The bot sees only Slack's error code; the page says which block and why.
    assert exc.value.response.data == {"ok": False, "error": "invalid_blocks"}
    assert event == "notice" and data["level"] == "error"
    assert data["text"].startswith(f"chat.postMessage → invalid_blocks: {reason}")
    assert await env.history(RILEY) == []


async def test_post_message_refusals(env: Env) -> None:
    assert (await env.api("chat.postMessage", channel="C0NOPE", text="x"))[
        "error"
    ] == "channel_not_found"
    assert (await env.api("chat.postMessage", channel=CH))["error"] == "no_text"
    assert (await env.api("chat.postMessage", channel=CH, text=""))["error"] == "no_text"
    bad_metadata = {"event_type": "gate"}  # no event_payload
    assert (await env.api("chat.postMessage", channel=CH, text="x", metadata=bad_metadata))[
        "error"
    ] == "invalid_metadata_format"
    big = [{"type": "section", "text": {"type": "mrkdwn", "text": "y" * 2900}}] * 5
    assert (await env.api("chat.postMessage", channel=CH, text="x", blocks=big))[
        "error"
    ] == "msg_blocks_too_long"
    assert await env.history(RILEY) == []


async def test_metadata_round_trip(env: Env) -> None:
    metadata = {"event_type": "approval_gate", "event_payload": {"gate": "g-1", "n": 2}}
    root = await env.say("card", metadata=metadata)
    reply = await env.say("reply card", thread_ts=root["ts"], metadata=metadata)
    plain = await env.slack.conversations_history(channel=CH)
    assert "metadata" not in plain["messages"][0]
    full = await env.slack.conversations_history(channel=CH, include_all_metadata=True)
    assert full["messages"][0]["metadata"] == metadata
    plain_replies = await env.slack.conversations_replies(channel=CH, ts=root["ts"])
    assert all("metadata" not in m for m in plain_replies["messages"])
    replies = await env.slack.conversations_replies(
        channel=CH, ts=root["ts"], include_all_metadata=True
    )
    assert [m["ts"] for m in replies["messages"]] == [root["ts"], reply["ts"]]
    assert [m["metadata"] for m in replies["messages"]] == [metadata, metadata]


def _without_ids(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Blocks without the block_id Slack (and the playground) gives a block sent without one."""
    assert all(b.get("block_id") for b in blocks)
    return [{k: v for k, v in b.items() if k != "block_id"} for b in blocks]


# =========================================================================== chat.update
async def test_update_changes_the_message_in_place(env: Env) -> None:
    sent = await env.say("Waiting for a decision", blocks=BUTTONS)
    async with env.stream(AVERY) as stream:
        resp = await env.slack.chat_update(channel=CH, ts=sent["ts"], text="Approved by @Avery")
        shown = await stream.next_message()
    assert resp["ts"] == sent["ts"] and resp["text"] == "Approved by @Avery"
    assert shown["ts"] == sent["ts"] and shown["updated"] == 1
    assert shown["blocks"] == BUTTONS  # blocks omitted: kept
    new_blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "Approved"}}]
    await env.slack.chat_update(channel=CH, ts=sent["ts"], text="done", blocks=new_blocks)
    [stored] = await env.history(RILEY)
    assert stored["ts"] == sent["ts"] and stored["updated"] == 2
    assert stored["text"] == "done"
    # Slack gives a block sent without a block_id one of its own, and keeps the rest as sent.
    [block] = stored["blocks"]
    assert isinstance(block.pop("block_id"), str) and block == new_blocks[0]
    [wire] = (await env.slack.conversations_history(channel=CH))["messages"]
    assert wire["edited"]["ts"] == sent["ts"]


async def test_update_refusals(env: Env) -> None:
    await env.send(RILEY, "a person's message")
    [mine] = await env.history(RILEY)
    out = await env.api("chat.update", channel=CH, ts=mine["ts"], text="hijacked")
    assert out == {"ok": False, "error": "cant_update_message"}
    out = await env.api("chat.update", channel=CH, ts="1700000000.000001", text="x")
    assert out == {"ok": False, "error": "message_not_found"}
    eph = await env.slack.chat_postEphemeral(channel=CH, user=RILEY, text="only you")
    out = await env.api("chat.update", channel=CH, ts=eph["message_ts"], text="x")
    assert out == {"ok": False, "error": "message_not_found"}
    bad = await env.say("fine")
    out = await env.api("chat.update", channel=CH, ts=bad["ts"], blocks=[{"type": "nope"}])
    assert out == {"ok": False, "error": "invalid_blocks"}
    assert texts(await env.history(RILEY)) == ["a person's message", "only you", "fine"]


async def test_delete(env: Env) -> None:
    sent = await env.say("to delete")
    async with env.stream(AVERY) as stream:
        await env.slack.chat_delete(channel=CH, ts=sent["ts"])
        assert await stream.next() == ("delete", {"channel": CH, "ts": sent["ts"]})
    assert await env.history(AVERY) == []
    out = await env.api("chat.delete", channel=CH, ts=sent["ts"])
    assert out == {"ok": False, "error": "message_not_found"}


# =========================================================================== ephemeral
async def test_ephemeral_goes_to_the_named_person_only(env: Env) -> None:
    root = await env.say("Task started")
    async with env.stream(RILEY) as riley, env.stream(AVERY) as avery:
        resp = await env.slack.chat_postEphemeral(channel=CH, user=RILEY, text="Only you")
        in_thread = await env.slack.chat_postEphemeral(
            channel=CH, user=RILEY, text="Only you, in the thread", thread_ts=root["ts"]
        )
        marker = await env.say("everyone")
        got = await riley.next_message()
        assert got["ts"] == resp["message_ts"] and got["ephemeral"] is True
        assert (await riley.next_message())["ts"] == in_thread["message_ts"]
        assert (await riley.next_message())["ts"] == marker["ts"]
        # Avery's tab never gets them: the next message it gets is the public one.
        assert (await avery.next_message())["ts"] == marker["ts"]
    assert texts(await env.history(RILEY)) == ["Task started", "Only you", "everyone"]
    assert texts(await env.history(AVERY)) == ["Task started", "everyone"]
    assert texts((await env.thread(RILEY, root["ts"]))["replies"]) == ["Only you, in the thread"]
    avery_thread = await env.thread(AVERY, root["ts"])
    assert avery_thread["replies"] == [] and avery_thread["root"]["reply_count"] == 0
    # The bot never reads ephemeral messages back.
    hist = await env.slack.conversations_history(channel=CH)
    assert texts(hist["messages"]) == ["everyone", "Task started"]
    out = await env.api("chat.postEphemeral", channel=CH, user="U0NOBODY", text="x")
    assert out["error"] == "user_not_in_channel"


# =========================================================================== paging
async def test_history_pages_newest_first(env: Env) -> None:
    posted = [(await env.say(f"m{i}"))["ts"] for i in range(250)]
    pages: list[list[str]] = []
    cursor = ""
    while True:
        resp = await env.slack.conversations_history(channel=CH, limit=100, cursor=cursor)
        pages.append([m["ts"] for m in resp["messages"]])
        cursor = resp["response_metadata"]["next_cursor"]
        assert resp["has_more"] is bool(cursor)
        if not cursor:
            break
    assert [len(p) for p in pages] == [100, 100, 50]
    assert [ts for page in pages for ts in page] == posted[::-1]
    # The page shows the newest ones, oldest first, and says older ones exist.
    status, data = await env.get("/ui/history", **{"as": RILEY, "limit": "50"})
    assert status == 200 and data["has_more"] is True
    assert [m["ts"] for m in data["messages"]] == posted[-50:]
    status, data = await env.get(
        "/ui/history", **{"as": RILEY, "limit": "200", "before": posted[50]}
    )
    assert [m["ts"] for m in data["messages"]] == posted[:50] and data["has_more"] is False


async def test_replies_pages_oldest_first(env: Env) -> None:
    root = await env.say("root")
    replies = [(await env.say(f"r{i}", thread_ts=root["ts"]))["ts"] for i in range(25)]
    seen: list[str] = []
    cursor = ""
    for _ in range(10):
        resp = await env.slack.conversations_replies(
            channel=CH, ts=root["ts"], limit=10, cursor=cursor
        )
        seen += [m["ts"] for m in resp["messages"]]
        cursor = resp["response_metadata"]["next_cursor"]
        if not cursor:
            break
    assert seen == [root["ts"], *replies]


async def test_history_window(env: Env) -> None:
    ts = [(await env.say(f"m{i}"))["ts"] for i in range(5)]

    async def window(**args: Any) -> list[str]:
        resp = await env.slack.conversations_history(channel=CH, **args)
        return [m["ts"] for m in resp["messages"]]

    assert await window(oldest=ts[1], latest=ts[3]) == [ts[2]]
    assert await window(oldest=ts[1], latest=ts[3], inclusive=True) == [ts[3], ts[2], ts[1]]
    assert await window(oldest=ts[3]) == [ts[4]]
    assert await window(oldest=ts[3], inclusive=True) == [ts[4], ts[3]]
    assert await window(latest=ts[1]) == [ts[0]]
    assert await window(latest=ts[1], inclusive=True) == [ts[1], ts[0]]
    root = ts[0]
    replies = [(await env.say(f"r{i}", thread_ts=root))["ts"] for i in range(3)]
    resp = await env.slack.conversations_replies(channel=CH, ts=root, oldest=replies[0])
    assert [m["ts"] for m in resp["messages"]] == [root, *replies[1:]]
    for bad in ({"oldest": "yesterday"}, {"oldest": "nan"}, {"latest": "NaN"}):
        out = await env.api("conversations.history", channel=CH, **bad)
        assert out == {"ok": False, "error": "invalid_arguments"}
    out = await env.api("conversations.replies", channel=CH, ts=root, latest="nan")
    assert out == {"ok": False, "error": "invalid_arguments"}


@pytest.mark.parametrize(
    "cursor",
    [
        "not-a-cursor",
        base64.urlsafe_b64encode(b"next:abc").decode(),
        base64.urlsafe_b64encode(b"next:-5").decode(),
        base64.urlsafe_b64encode(b"prev:5").decode(),
    ],
)
async def test_invalid_cursor(env: Env, cursor: str) -> None:
    for i in range(3):
        await env.say(f"m{i}")
    out = await env.api("conversations.history", channel=CH, cursor=cursor)
    assert out == {"ok": False, "error": "invalid_cursor"}


async def test_reading_an_unknown_channel_or_thread(env: Env) -> None:
    assert (await env.api("conversations.history", channel="C0NOPE"))["error"] == (
        "channel_not_found"
    )
    out = await env.api("conversations.replies", channel=CH, ts="1700000000.000001")
    assert out["error"] == "thread_not_found"


# =========================================================================== views
async def test_views_open_with_the_clickers_trigger(env: Env) -> None:
    card = await env.say("Approve?", blocks=BUTTONS)
    async with env.stream(AVERY) as avery, env.stream(RILEY) as riley:
        status, data = await env.click(AVERY, card["ts"], "deny")
        assert (status, data) == (200, {"ok": True})
        trigger = env.bot.received[-1].payload()["trigger_id"]
        resp = await env.slack.views_open(trigger_id=trigger, view=modal())
        view = resp["view"]
        assert view["id"].startswith("V") and view["title"]["text"] == "Deny delete_user"
        assert view["app_id"] == people.APP_ID and view["team_id"] == people.TEAM_ID
        event, shown = await avery.next()
        assert event == "view" and shown == {"view_id": view["id"], "view": view}
        # The modal opens for the person who clicked, nowhere else.
        marker = await env.say("marker")
        assert (await riley.next_message())["ts"] == marker["ts"]
        # A trigger opens one view.
        with pytest.raises(SlackApiError) as exc:
            await env.slack.views_open(trigger_id=trigger, view=modal())
        assert exc.value.response["error"] == "exchanged_trigger_id"
    assert await env.pg.store.get_view(view["id"]) == (AVERY, view)
    for bad in ("", "1.2.nope"):
        out = await env.api("views.open", trigger_id=bad, view=modal())
        assert out == {"ok": False, "error": "expired_trigger_id"}


async def test_views_open_trigger_expires(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "TRIGGER_TTL_MS", 50)
    trigger = (await env.command(RILEY)).form()["trigger_id"]
    await asyncio.sleep(0.2)
    out = await env.api("views.open", trigger_id=trigger, view=modal())
    assert out == {"ok": False, "error": "expired_trigger_id"}


async def test_views_open_refuses_a_bad_view(env: Env) -> None:
    trigger = (await env.command(RILEY)).form()["trigger_id"]
    async with env.stream(RILEY) as stream:
        out = await env.api("views.open", trigger_id=trigger, view=modal("x" * 25))
        assert out == {"ok": False, "error": "invalid_arguments"}
        event, data = await stream.next()
        assert event == "notice" and "1-24 characters" in data["text"]
    bad_block = {**modal(), "blocks": [{"type": "input", "label": "not an object"}]}
    out = await env.api("views.open", trigger_id=trigger, view=bad_block)
    assert out == {"ok": False, "error": "invalid_blocks"}
    out = await env.api("views.open", trigger_id=trigger, view={"type": "home"})
    assert out == {"ok": False, "error": "invalid_arguments"}
    # A refused view does not use up the trigger.
    assert (await env.slack.views_open(trigger_id=trigger, view=modal()))["ok"] is True


async def test_views_update_by_view_id(env: Env) -> None:
    view = await env.open_view(RILEY, modal())
    async with env.stream(RILEY) as riley, env.stream(AVERY) as avery:
        resp = await env.slack.views_update(view_id=view["id"], view=modal("Reason, please"))
        event, shown = await riley.next()
        assert event == "view" and shown["view_id"] == view["id"]
        assert shown["view"]["title"]["text"] == "Reason, please"
        marker = await env.say("marker")
        assert (await avery.next_message())["ts"] == marker["ts"]
    assert resp["view"]["id"] == view["id"]
    found = await env.pg.store.get_view(view["id"])
    assert found is not None and found[0] == RILEY
    assert found[1]["title"]["text"] == "Reason, please"
    out = await env.api("views.update", view_id="VNOPE", view=modal())
    assert out == {"ok": False, "error": "not_found"}


# =========================================================================== people
async def test_usergroups_and_users(env: Env) -> None:
    resp = await env.slack.usergroups_users_list(usergroup=people.ONCALL_GROUP)
    assert resp["users"] == [SAM]
    out = await env.api("usergroups.users.list", usergroup="S0NOPE")
    assert out == {"ok": False, "error": "no_such_subteam"}
    user = (await env.slack.users_info(user=AVERY))["user"]
    assert user["id"] == AVERY and user["real_name"] == "Avery" and user["is_bot"] is False
    assert user["profile"]["display_name"] == "Avery"
    assert user["profile"]["title"] == people.APPROVER.title
    bot = (await env.slack.users_info(user=people.BOT_USER_ID))["user"]
    assert bot["is_bot"] is True and bot["name"] == people.BOT_NAME
    assert (await env.api("users.info", user="U0NOBODY"))["error"] == "user_not_found"


# =========================================================================== /ui/send
async def test_command_is_sent_signed_as_slack_does(env: Env) -> None:
    got = await env.command(RILEY, "/agent   delete user 42 ")
    assert got.signed
    assert got.headers["X-Slack-Signature"].startswith("v0=")
    assert abs(int(got.headers["X-Slack-Request-Timestamp"]) - time.time()) < 60
    form = got.form()
    assert form["command"] == "/agent"
    assert form["text"] == "delete user 42"
    assert form["user_id"] == RILEY and form["user_name"] == "riley"
    assert form["channel_id"] == CH and form["team_id"] == people.TEAM_ID
    assert form["api_app_id"] == people.APP_ID
    assert form["response_url"].startswith(f"{env.url}/respond/")
    assert re.fullmatch(r"\d+\.\d+\.[0-9a-f]{32}", form["trigger_id"])
    # Bolt acknowledged with an empty body: nothing is shown.
    assert await env.history(RILEY) == []


async def test_command_answer_becomes_an_ephemeral_message(env: Env) -> None:
    env.bot.answer(json_reply({"text": "Usage: /agent <task>", "response_type": "ephemeral"}))
    async with env.stream(RILEY) as riley, env.stream(AVERY) as avery:
        await env.command(RILEY, "/agent help")
        shown = await riley.next_message()
        marker = await env.say("marker")
        assert (await avery.next_message())["ts"] == marker["ts"]
    assert shown["text"] == "Usage: /agent <task>" and shown["ephemeral"] is True
    assert shown["user"] == people.BOT_USER_ID
    assert texts(await env.history(RILEY)) == ["Usage: /agent <task>", "marker"]
    assert texts(await env.history(AVERY)) == ["marker"]
    # in_channel: everyone sees it.
    env.bot.answer(json_reply({"text": "For everyone", "response_type": "in_channel"}))
    await env.command(RILEY)
    assert texts(await env.history(AVERY)) == ["marker", "For everyone"]
    # A plain-text body is shown to the person as is.
    env.bot.answer(Reply(200, "plain words"))
    await env.command(RILEY)
    assert texts(await env.history(RILEY))[-1] == "plain words"
    assert texts(await env.history(AVERY)) == ["marker", "For everyone"]


async def test_command_answer_with_bad_blocks_is_a_notice(env: Env) -> None:
    env.bot.answer(json_reply({"text": "x", "blocks": [{"type": "nope"}]}))
    async with env.stream(RILEY) as riley:
        await env.command(RILEY)
        event, data = await riley.next()
    assert event == "notice"
    assert data["text"].startswith("/agent answer → invalid_blocks: block 0")
    assert await env.history(RILEY) == []


async def test_command_failure_is_shown_as_slack_does(env: Env) -> None:
    env.bot.answer(Reply(500, "boom"))
    await env.command(RILEY)
    [shown] = await env.history(RILEY)
    assert shown["text"] == '/agent failed with the error "http_service_error"'
    assert shown["ephemeral"] is True and shown["user"] == "USLACKBOT" and not shown["bot"]
    assert await env.history(AVERY) == []


async def test_command_ack_timeout(env: Env) -> None:
    env.bot.answer(Reply(delay=ACK_TIMEOUT + 1))
    started = time.monotonic()
    await env.command(RILEY)
    assert ACK_TIMEOUT - 0.1 < time.monotonic() - started < ACK_TIMEOUT + 1.5
    [shown] = await env.history(RILEY)
    assert shown["text"] == '/agent failed with the error "operation_timeout"'
    assert shown["ephemeral"] is True


async def test_command_with_the_bot_down(env: Env) -> None:
    env.pg.sender.events_url = "http://127.0.0.1:9/slack/events"  # nothing listens there
    assert await env.send(RILEY, "/agent status") == {"ok": True}
    [shown] = await env.history(RILEY)
    assert shown["text"].startswith('/agent failed with the error "dispatch_failed')


async def test_unknown_command_sends_nothing(env: Env) -> None:
    out = await env.send(RILEY, "/nope do it")
    assert out == {"ok": False, "error": "/nope is not a valid command. Try /agent help."}
    assert env.bot.received == []
    assert await env.history(RILEY) == []


async def test_plain_message_is_not_an_event_without_a_subscription(env: Env) -> None:
    assert await env.send(RILEY, "hello @agent <b>&") == {"ok": True}
    assert env.bot.received == []
    [shown] = await env.history(AVERY)
    assert shown["user"] == RILEY and shown["user_name"] == "Riley" and not shown["bot"]
    # Stored as Slack sends it: escaped, with the mention as <@U…>.
    assert shown["text"] == f"hello <@{people.BOT_USER_ID}> &lt;b&gt;&amp;"


async def test_message_event_when_subscribed(env: Env) -> None:
    env.pg.info.bot_events = frozenset({"message.channels"})
    root = await env.say("root")
    assert await env.send(AVERY, "hi @Riley", thread_ts=root["ts"]) == {"ok": True}
    [got] = env.bot.received
    envelope = got.envelope()
    assert envelope["type"] == "event_callback"
    assert envelope["team_id"] == people.TEAM_ID and envelope["api_app_id"] == people.APP_ID
    assert envelope["event_id"].startswith("Ev")
    assert envelope["authorizations"][0]["user_id"] == people.BOT_USER_ID
    event = envelope["event"]
    assert event["type"] == "message" and event["channel"] == CH
    assert event["user"] == AVERY and event["text"] == f"hi <@{RILEY}>"
    assert event["thread_ts"] == root["ts"] and TS.match(event["ts"])
    assert event["channel_type"] == "channel"
    # No mention of the bot, no app_mention (and it is not subscribed anyway).
    assert len(env.bot.received) == 1


async def test_app_mention_only_when_subscribed(env: Env) -> None:
    env.pg.info.bot_events = frozenset({"app_mention"})
    await env.send(RILEY, "no mention here")
    assert env.bot.received == []
    await env.send(RILEY, "@agent status please")
    [got] = env.bot.received
    event = got.envelope()["event"]
    assert event["type"] == "app_mention" and event["user"] == RILEY
    assert event["text"] == f"<@{people.BOT_USER_ID}> status please"
    # Both subscribed: the message, then the mention, as two requests.
    env.pg.info.bot_events = frozenset({"app_mention", "message.channels"})
    await env.send(RILEY, "hey @agent")
    kinds = [r.envelope()["event"]["type"] for r in env.bot.received[1:]]
    assert kinds == ["message", "app_mention"]


async def test_event_refused_by_the_bot_is_a_notice(env: Env) -> None:
    env.pg.info.bot_events = frozenset({"message.channels"})
    env.bot.answer(Reply(500))
    async with env.stream(RILEY) as riley:
        await env.send(RILEY, "hello")
        assert (await riley.next_message())["text"] == "hello"
        event, data = await riley.next()
    assert event == "notice" and data["text"] == "event message → the app answered HTTP 500"


async def test_sending_in_a_thread_that_does_not_exist(env: Env) -> None:
    out = await env.send(RILEY, "hi", thread_ts="1700000000.000001")
    assert out == {"ok": False, "error": "that thread does not exist"}
    assert await env.history(RILEY) == []


# =========================================================================== /ui/action
async def test_action_payload_is_built_from_the_stored_message(env: Env) -> None:
    root = await env.say("Task started")
    card = await env.say("Approve?", blocks=BUTTONS, thread_ts=root["ts"])
    # The page claims another value: the bot gets the button's real one.
    status, data = await env.click(AVERY, card["ts"], value="gate-9:approve", style="danger")
    assert (status, data) == (200, {"ok": True})
    [got] = env.bot.received
    assert got.signed
    payload = got.payload()
    assert payload["type"] == "block_actions"
    assert payload["user"]["id"] == AVERY and payload["user"]["username"] == "avery"
    assert payload["team"]["id"] == people.TEAM_ID
    assert payload["api_app_id"] == people.APP_ID
    assert payload["channel"]["id"] == CH
    [action] = payload["actions"]
    assert action["value"] == "gate-1:approve"
    assert action["style"] == "primary"
    assert action["action_id"] == "approve" and action["block_id"] == "decide"
    assert action["type"] == "button" and action["text"]["text"] == "Approve"
    assert float(action["action_ts"]) > 0
    assert payload["container"] == {
        "type": "message",
        "message_ts": card["ts"],
        "channel_id": CH,
        "is_ephemeral": False,
        "thread_ts": root["ts"],
    }
    assert payload["message"]["ts"] == card["ts"]
    assert payload["message"]["blocks"] == BUTTONS
    assert payload["message"]["thread_ts"] == root["ts"]
    assert payload["response_url"].startswith(f"{env.url}/respond/")
    assert re.fullmatch(r"\d+\.\d+\.[0-9a-f]{32}", payload["trigger_id"])


async def test_action_refusals(env: Env) -> None:
    card = await env.say("Approve?", blocks=BUTTONS)
    eph = await env.slack.chat_postEphemeral(channel=CH, user=RILEY, text="x", blocks=BUTTONS)
    # Someone else's ephemeral message.
    status, data = await env.click(AVERY, eph["message_ts"])
    assert status == 400 and data["error"] == "no such message"
    # An element the message does not have.
    status, data = await env.click(AVERY, card["ts"], "delete_everything")
    assert status == 400 and data["error"] == "no such element in that message"
    status, data = await env.click(AVERY, card["ts"], "approve", block_id="other")
    assert status == 400
    # A message that does not exist.
    status, data = await env.click(AVERY, "1700000000.000001")
    assert status == 400
    assert env.bot.received == []
    # The person the ephemeral message was for can click it.
    status, data = await env.click(RILEY, eph["message_ts"])
    assert (status, data) == (200, {"ok": True})
    assert env.bot.received[-1].payload()["container"]["is_ephemeral"] is True


async def test_action_the_bot_fails(env: Env) -> None:
    card = await env.say("Approve?", blocks=BUTTONS)
    env.bot.answer(Reply(500))
    status, data = await env.click(AVERY, card["ts"])
    assert status == 200
    assert data == {"ok": False, "error": "The app did not respond (HTTP 500)."}


async def test_action_in_a_view(env: Env) -> None:
    view = modal()
    view["blocks"].append(
        {
            "type": "actions",
            "block_id": "more",
            "elements": [
                {
                    "type": "static_select",
                    "action_id": "pick",
                    "placeholder": {"type": "plain_text", "text": "Pick"},
                    "options": [
                        {"text": {"type": "plain_text", "text": "A"}, "value": "a"},
                        {"text": {"type": "plain_text", "text": "B"}, "value": "b"},
                    ],
                }
            ],
        }
    )
    opened = await env.open_view(RILEY, view)
    container = {"type": "view", "view_id": opened["id"]}
    action = {"action_id": "pick", "block_id": "more", "selected_option": {"value": "b"}}
    body = {"as": RILEY, "container": container, "action": action}
    assert await env.post("/ui/action", body) == (200, {"ok": True})
    payload = env.bot.received[-1].payload()
    assert payload["container"] == container and payload["view"]["id"] == opened["id"]
    assert payload["actions"][0]["selected_option"]["value"] == "b"
    assert payload["actions"][0]["selected_option"]["text"]["text"] == "B"
    assert "response_url" not in payload
    # An option the select does not have; someone else's view.
    bad = {**body, "action": {**action, "selected_option": {"value": "z"}}}
    assert (await env.post("/ui/action", bad))[0] == 400
    assert (await env.post("/ui/action", {**body, "as": AVERY}))[0] == 400


async def test_home_tab_for_the_acting_person(env: Env) -> None:
    """Opening Home tells the app (app_home_opened, when subscribed); views.publish reaches
    that person's page; a click on Home is a block_actions from a ``home`` view, theirs only."""
    env.pg.info.bot_events = frozenset({"app_home_opened"})
    assert await env.post("/ui/home", {"as": AVERY}) == (200, {"ok": True, "view": None})
    event = env.bot.received[-1].envelope()["event"]
    assert (event["type"], event["user"], event["tab"]) == ("app_home_opened", AVERY, "home")

    async with env.stream(AVERY) as page:
        resp = await env.slack.views_publish(
            user_id=AVERY, view={"type": "home", "blocks": BUTTONS}
        )
        published = dict(resp["view"])
        assert published["type"] == "home" and published["id"]
        kind, data = await page.next()
        assert kind == "home" and data["user"] == AVERY and data["view"]["id"] == published["id"]

    status, shown = await env.post("/ui/home", {"as": AVERY})
    assert status == 200 and shown["view"]["blocks"] == published["blocks"]
    received = len(env.bot.received)
    assert await env.get("/ui/home", **{"as": AVERY}) == (200, shown)  # read only
    assert await env.get("/ui/home", **{"as": RILEY}) == (200, {"ok": True, "view": None})
    assert len(env.bot.received) == received
    assert env.bot.received[-1].envelope()["event"]["view"]["id"] == published["id"]

    container = {"type": "view", "view_id": published["id"]}
    action = {"action_id": "approve", "block_id": "decide"}
    body = {"as": AVERY, "container": container, "action": action}
    assert await env.post("/ui/action", body) == (200, {"ok": True})
    payload = env.bot.received[-1].payload()
    assert payload["container"] == container and payload["view"]["type"] == "home"
    assert payload["user"]["id"] == AVERY and "response_url" not in payload
    # Someone else's Home.
    assert (await env.post("/ui/action", {**body, "as": RILEY}))[0] == 400

    # Slack's refusals: someone outside the workspace, a view that is not a Home view.
    with pytest.raises(SlackApiError) as outsider:
        await env.slack.views_publish(user_id="U0NOBODY", view={"type": "home", "blocks": []})
    assert outsider.value.response["error"] == "invalid_arguments"
    with pytest.raises(SlackApiError) as modal_view:
        await env.slack.views_publish(user_id=AVERY, view=modal())
    assert modal_view.value.response["error"] == "invalid_arguments"


# =========================================================================== response_url
async def clicked(env: Env, who: str = AVERY) -> tuple[str, str, str]:
    """(root ts, card ts, response_url) after ``who`` clicks a card in a thread."""
    root = await env.say("Task started")
    card = await env.say("Approve?", blocks=BUTTONS, thread_ts=root["ts"])
    assert (await env.click(who, card["ts"]))[0] == 200
    return root["ts"], card["ts"], str(env.bot.received[-1].payload()["response_url"])


async def test_response_url_default_is_ephemeral_in_the_thread(env: Env) -> None:
    root, _card, url = await clicked(env)
    hook = AsyncWebhookClient(url, session=env.http)
    async with env.stream(RILEY) as riley, env.stream(AVERY) as avery:
        resp = await hook.send(text="Only approvers can decide")
        shown = await avery.next_message()
        marker = await env.say("marker")
        assert (await riley.next_message())["ts"] == marker["ts"]
    assert resp.status_code == 200
    assert shown["text"] == "Only approvers can decide" and shown["ephemeral"] is True
    assert shown["thread_ts"] == root
    assert texts((await env.thread(AVERY, root))["replies"]) == [
        "Approve?",
        "Only approvers can decide",
    ]
    assert texts((await env.thread(RILEY, root))["replies"]) == ["Approve?"]
    assert "Only approvers can decide" not in texts(await env.history(AVERY))


async def test_response_url_in_channel(env: Env) -> None:
    root, _card, url = await clicked(env)
    resp = await AsyncWebhookClient(url, session=env.http).send(
        text="For all", response_type="in_channel"
    )
    assert resp.status_code == 200
    replies = (await env.thread(RILEY, root))["replies"]
    assert texts(replies) == ["Approve?", "For all"] and replies[1]["ephemeral"] is False
    # A command's response_url, in the channel.
    cmd_url = (await env.command(RILEY)).form()["response_url"]
    await AsyncWebhookClient(cmd_url, session=env.http).send(
        text="Started", response_type="in_channel"
    )
    assert texts(await env.history(AVERY)) == ["Task started", "Started"]


async def test_response_url_replace_original(env: Env) -> None:
    _root, card, url = await clicked(env)
    done = [{"type": "section", "text": {"type": "mrkdwn", "text": "Approved by <@U0PGAVERY>"}}]
    async with env.stream(RILEY) as riley:
        resp = await AsyncWebhookClient(url, session=env.http).send(
            text="Approved", blocks=done, replace_original=True
        )
        shown = await riley.next_message()
    assert resp.status_code == 200
    assert shown["ts"] == card and _without_ids(shown["blocks"]) == done and shown["updated"] == 1
    stored = await env.pg.store.get(CH, card)
    assert stored is not None and stored.text == "Approved" and _without_ids(stored.blocks) == done


async def test_response_url_delete_original(env: Env) -> None:
    root, card, url = await clicked(env)
    async with env.stream(RILEY) as riley:
        resp = await AsyncWebhookClient(url, session=env.http).send(delete_original=True)
        assert await riley.next() == ("delete", {"channel": CH, "ts": card})
    assert resp.status_code == 200
    assert await env.pg.store.get(CH, card) is None
    assert (await env.thread(RILEY, root))["replies"] == []


async def test_response_url_refusals(env: Env) -> None:
    _root, _card, url = await clicked(env)
    async with env.http.post(f"{env.url}/respond/not-a-token", json={"text": "x"}) as r:
        assert r.status == 404
    async with env.http.post(url, json={"blocks": [{"type": "nope"}]}) as r:
        assert r.status == 400 and (await r.json())["error"] == "invalid_blocks"
    async with env.http.post(url, json={}) as r:
        assert r.status == 400 and (await r.json())["error"] == "no_text"


async def test_response_url_works_five_times(env: Env) -> None:
    _root, _card, url = await clicked(env)
    hook = AsyncWebhookClient(url, session=env.http)
    statuses = [(await hook.send(text=f"use {i}")).status_code for i in range(6)]
    assert statuses == [200, 200, 200, 200, 200, 404]


async def test_response_url_five_uses_even_at_once(env: Env) -> None:
    _root, _card, url = await clicked(env)
    hook = AsyncWebhookClient(url, session=env.http)
    results = await asyncio.gather(*(hook.send(text=f"use {i}") for i in range(12)))
    assert sorted(r.status_code for r in results) == [200] * 5 + [404] * 7


# =========================================================================== views: submit
async def test_view_submit_required_field_empty(env: Env) -> None:
    view = await env.open_view(RILEY, modal())
    sent = len(env.bot.received)
    body = {"as": RILEY, "view_id": view["id"], "values": {"reason": {"text": {"value": "  "}}}}
    status, data = await env.post("/ui/view/submit", body)
    assert status == 200
    assert data == {
        "ok": True,
        "closed": False,
        "errors": {"reason": "Please fill out this field."},
    }
    too_long = {**body, "values": {"reason": {"text": {"value": "x" * 201}}}}
    status, data = await env.post("/ui/view/submit", too_long)
    assert data["errors"] == {"reason": "Please enter at most 200 characters."}
    assert len(env.bot.received) == sent  # Slack's client checks these itself


async def test_view_submit_sends_the_state(env: Env) -> None:
    view = await env.open_view(RILEY, modal())
    values = {"reason": {"text": {"value": "too risky"}}}
    status, data = await env.post(
        "/ui/view/submit", {"as": RILEY, "view_id": view["id"], "values": values}
    )
    assert (status, data) == (200, {"ok": True, "closed": True})
    payload = env.bot.received[-1].payload()
    assert payload["type"] == "view_submission" and payload["user"]["id"] == RILEY
    assert payload["view"]["id"] == view["id"]
    assert payload["view"]["callback_id"] == "deny_reason"
    assert payload["view"]["private_metadata"] == "gate-1"
    assert payload["view"]["state"]["values"] == {
        "reason": {"text": {"type": "plain_text_input", "value": "too risky"}},
        "note": {"text": {"type": "plain_text_input", "value": None}},
    }
    assert await env.pg.store.get_view(view["id"]) is None
    # The view is gone: submitting again is refused.
    status, data = await env.post(
        "/ui/view/submit", {"as": RILEY, "view_id": view["id"], "values": values}
    )
    assert status == 400


async def test_view_submit_errors_from_the_bot(env: Env) -> None:
    view = await env.open_view(RILEY, modal())
    env.bot.answer(json_reply({"response_action": "errors", "errors": {"reason": "Say more"}}))
    values = {"reason": {"text": {"value": "no"}}}
    body = {"as": RILEY, "view_id": view["id"], "values": values}
    assert await env.post("/ui/view/submit", body) == (
        200,
        {"ok": True, "closed": False, "errors": {"reason": "Say more"}},
    )
    assert await env.pg.store.get_view(view["id"]) is not None  # the modal stays open


async def test_view_submit_update(env: Env) -> None:
    view = await env.open_view(RILEY, modal())
    new = modal("Are you sure?")
    env.bot.answer(json_reply({"response_action": "update", "view": new}))
    body = {"as": RILEY, "view_id": view["id"], "values": {"reason": {"text": {"value": "ok"}}}}
    status, data = await env.post("/ui/view/submit", body)
    assert status == 200 and data["ok"] is True and data["closed"] is False
    assert data["view"]["id"] == view["id"]
    assert data["view"]["title"]["text"] == "Are you sure?"
    found = await env.pg.store.get_view(view["id"])
    assert found is not None and found[1]["title"]["text"] == "Are you sure?"


async def test_view_submit_the_bot_fails(env: Env) -> None:
    view = await env.open_view(RILEY, modal())
    env.bot.answer(Reply(500))
    body = {"as": RILEY, "view_id": view["id"], "values": {"reason": {"text": {"value": "x"}}}}
    status, data = await env.post("/ui/view/submit", body)
    assert status == 200 and data["ok"] is False
    assert await env.pg.store.get_view(view["id"]) is not None


async def test_view_submit_by_someone_else(env: Env) -> None:
    view = await env.open_view(RILEY, modal())
    body = {"as": AVERY, "view_id": view["id"], "values": {"reason": {"text": {"value": "x"}}}}
    status, data = await env.post("/ui/view/submit", body)
    assert status == 400 and data["error"] == "no such open view"


@pytest.mark.parametrize("notify", [True, False])
async def test_view_close(env: Env, notify: bool) -> None:
    view = await env.open_view(RILEY, modal(notify=notify))
    sent = len(env.bot.received)
    # Someone else cannot close it.
    assert await env.post("/ui/view/close", {"as": AVERY, "view_id": view["id"]}) == (
        200,
        {"ok": True},
    )
    assert await env.pg.store.get_view(view["id"]) is not None
    assert await env.post("/ui/view/close", {"as": RILEY, "view_id": view["id"]}) == (
        200,
        {"ok": True},
    )
    assert await env.pg.store.get_view(view["id"]) is None
    if notify:
        [got] = env.bot.received[sent:]
        payload = got.payload()
        assert payload["type"] == "view_closed" and payload["user"]["id"] == RILEY
        assert payload["view"]["id"] == view["id"] and payload["is_cleared"] is False
    else:
        assert env.bot.received[sent:] == []


# =========================================================================== bad input
@pytest.mark.parametrize(
    ("method", "path", "body", "error"),
    [
        ("POST", "/ui/send", {"as": "U0NOBODY", "text": "hi"}, "unknown user"),
        ("POST", "/ui/send", {"text": "hi"}, "unknown user"),
        ("POST", "/ui/send", "not json", "the body must be JSON"),
        ("POST", "/ui/send", ["a", "list"], "the body must be a JSON object"),
        ("POST", "/ui/send", {"as": RILEY, "text": "   "}, "nothing to send"),
        ("POST", "/ui/send", {"as": RILEY, "text": "hi", "thread_ts": "abc"}, "thread_ts"),
        ("POST", "/ui/send", {"as": RILEY, "text": "hi", "thread_ts": 17.5}, "thread_ts"),
        ("POST", "/ui/action", "{", "the body must be JSON"),
        ("POST", "/ui/action", {"as": RILEY}, "container and action are required"),
        ("POST", "/ui/action", {"as": "nobody", "container": {}, "action": {}}, "unknown user"),
        ("POST", "/ui/view/submit", {"as": RILEY, "view_id": "V1", "values": "x"}, "values"),
        ("POST", "/ui/view/submit", {"as": RILEY, "view_id": "VNOPE"}, "no such open view"),
        ("POST", "/ui/view/close", "[", "the body must be JSON"),
        ("GET", "/ui/history?as=U0NOBODY", None, "unknown user"),
        ("GET", "/ui/history?as=U0PGRILEY&before=abc", None, "before must be a message ts"),
        ("GET", "/ui/thread", None, "unknown user"),
        ("GET", "/ui/stream?as=", None, "unknown user"),
    ],
)
async def test_bad_ui_requests(env: Env, method: str, path: str, body: Any, error: str) -> None:
    if method == "GET":
        async with env.http.get(env.url + path, headers=env.token) as r:
            status, data = r.status, await r.json()
    else:
        status, data = await env.post(path, body)
    assert status == 400
    assert data["ok"] is False and error in data["error"]
    assert env.bot.received == []
    assert await env.history(RILEY) == []
    assert await env.pg.store.redis.keys(f"{env.pg.store.p}:msgs") == []


async def test_page_and_state(env: Env) -> None:
    async with env.http.get(env.url + "/") as r:
        assert r.status == 200 and "text/html" in r.headers["Content-Type"]
    status, state = await env.get("/ui/state")
    assert status == 200
    assert state["channel"] == {"id": CH, "name": people.CHANNEL_NAME}
    assert [u["id"] for u in state["users"]] == [RILEY, AVERY, SAM, MORGAN]
    assert state["default_user"] == RILEY and state["command"] == "/agent"
    assert state["usergroups"][0]["users"] == [SAM]
    status, data = await env.get("/ui/thread", **{"as": RILEY, "ts": "1700000000.000001"})
    assert (status, data) == (404, {"error": "thread_not_found"})


# =========================================================================== bot_events()
def test_bot_events_from_a_manifest_snippet() -> None:
    manifest = """
display_information:
  name: Agent
settings:
  event_subscriptions:
    request_url: https://example.com/slack/events
    bot_events:
      - app_mention        # when someone @mentions the bot
      - "message.channels"
    user_events:
      - reaction_added
  interactivity:
    is_enabled: true
"""
    assert bot_events(manifest) == frozenset({"app_mention", "message.channels"})
    same_indent = "settings:\n  event_subscriptions:\n    bot_events:\n    - app_mention\n"
    assert bot_events(same_indent) == frozenset({"app_mention"})
    assert bot_events("settings:\n  interactivity:\n    is_enabled: true\n") == frozenset()


def test_the_real_manifest_subscribes_to_thread_replies() -> None:
    # The playground sends the bot what Slack would: the events its manifest subscribes to.
    assert bot_events(slack_manifest()) == {
        "app_home_opened",
        "app_mention",
        "assistant_thread_context_changed",
        "assistant_thread_started",
        "member_joined_channel",
        "message.channels",
        "message.groups",
        "message.im",
    }
