"""Other web pages cannot drive the playground: the server accepts only its own Host and
Origin, JSON bodies, and the session token its page carries.

The attacks are those a page the developer visits can mount: a cross-site POST (a form, or a
``text/plain`` fetch, which needs no preflight), and DNS rebinding (the page's own host name
now resolves to 127.0.0.1, so the browser sends ``Host: evil.example`` and lets the page read
the answers). Each is refused before anything reaches the bot: no run starts, no card is
approved, nothing is read. The server is the real :class:`Playground` app on 127.0.0.1 with a
private Redis; the bot is a recording HTTP server.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import test_utils, web
from redis.asyncio import Redis
from slack_sdk.web.async_client import AsyncWebClient

from playground import people
from playground.guard import TOKEN_HEADER
from playground.outbound import Sender
from playground.server import PageInfo, Playground
from playground.store import Store
from tests.playground.server_env import BUTTONS, SECRET, TOKEN, FakeBot

CH = people.CHANNEL_ID
RILEY, AVERY = people.REQUESTER.id, people.APPROVER.id
EVIL = "evil.example"
JSON = "application/json"


@dataclass
class Site:
    pg: Playground
    bot: FakeBot
    port: int
    http: aiohttp.ClientSession
    card_ts: str = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def own(self) -> dict[str, str]:
        """What the page in a browser sends: its Origin and its token."""
        return {"Origin": self.url, TOKEN_HEADER: self.pg.session_token}

    async def call(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: str | None = None,
    ) -> tuple[int, str]:
        async with self.http.request(method, self.url + path, headers=headers, data=body) as r:
            return r.status, await r.text()

    async def shown(self) -> list[str]:
        """The texts of the channel's messages, as the page reads them."""
        headers = {TOKEN_HEADER: self.pg.session_token}
        async with self.http.get(f"{self.url}/ui/history?as={RILEY}", headers=headers) as r:
            assert r.status == 200
            return [m["text"] for m in (await r.json())["messages"]]


@pytest.fixture
async def site(redis: Redis) -> AsyncIterator[Site]:
    bot = FakeBot()
    bot_app = web.Application()
    bot_app.router.add_post("/slack/events", bot.handle)
    bot_server = test_utils.TestServer(bot_app, host="127.0.0.1")
    await bot_server.start_server()
    pg = Playground(
        Store(redis, f"pgguard-{uuid.uuid4().hex[:10]}"),
        Sender(f"http://127.0.0.1:{bot_server.port}/slack/events", SECRET),
        TOKEN,
        PageInfo(),
    )
    server = test_utils.TestServer(pg.app(), host="127.0.0.1")
    await server.start_server()
    assert server.port is not None
    pg.response_base = f"http://127.0.0.1:{server.port}"
    http = aiohttp.ClientSession()
    try:
        site = Site(pg, bot, server.port, http)
        # An approval card for Avery to click, posted by the bot as it posts them.
        slack = AsyncWebClient(token=TOKEN, base_url=site.url + "/api/", session=http)
        site.card_ts = (await slack.chat_postMessage(channel=CH, text="Approve?", blocks=BUTTONS))[
            "ts"
        ]
        yield site
    finally:
        await http.close()
        await server.close()
        await bot_server.close()


def start_run() -> tuple[str, str]:
    """What the page posts for ``/agent delete user 42``."""
    return "/ui/send", json.dumps({"as": RILEY, "text": "/agent delete user 42"})


def approve(card_ts: str) -> tuple[str, str]:
    """What the page posts for Avery's click on Approve."""
    return "/ui/action", json.dumps(
        {
            "as": AVERY,
            "container": {"type": "message", "channel": CH, "ts": card_ts},
            "action": {"action_id": "approve", "block_id": "decide"},
        }
    )


# Each attack: the headers it arrives with (given the playground's port and token), the
# status it must get, and the words of its error.
ATTACKS: dict[str, tuple[Any, int, str]] = {
    "cross-site page (foreign Origin)": (
        lambda port, token: {
            "Origin": f"https://{EVIL}",
            TOKEN_HEADER: token,
            "Content-Type": JSON,
        },
        403,
        "other web pages",
    ),
    "sandboxed page (Origin: null)": (
        lambda port, token: {"Origin": "null", TOKEN_HEADER: token, "Content-Type": JSON},
        403,
        "other web pages",
    ),
    "DNS rebinding (foreign Host, its own Origin)": (
        lambda port, token: {
            "Host": f"{EVIL}:{port}",
            "Origin": f"http://{EVIL}:{port}",
            TOKEN_HEADER: token,
            "Content-Type": JSON,
        },
        403,
        "Host",
    ),
    "DNS rebinding (foreign Host, no Origin)": (
        lambda port, token: {"Host": f"{EVIL}:{port}", TOKEN_HEADER: token, "Content-Type": JSON},
        403,
        "Host",
    ),
    "own Host on another port": (
        lambda port, token: {"Host": f"127.0.0.1:{port + 1}", TOKEN_HEADER: token},
        403,
        "Host",
    ),
    "text/plain body (no preflight)": (
        lambda port, token: {
            "Origin": f"http://127.0.0.1:{port}",
            TOKEN_HEADER: token,
            "Content-Type": "text/plain",
        },
        415,
        "application/json",
    ),
    "form body": (
        lambda port, token: {
            "Origin": f"http://127.0.0.1:{port}",
            TOKEN_HEADER: token,
            "Content-Type": "application/x-www-form-urlencoded",
        },
        415,
        "application/json",
    ),
    "no token": (
        lambda port, token: {"Origin": f"http://127.0.0.1:{port}", "Content-Type": JSON},
        403,
        "session token",
    ),
    "wrong token": (
        lambda port, token: {
            "Origin": f"http://127.0.0.1:{port}",
            TOKEN_HEADER: token[:-1] + ("A" if token[-1] != "A" else "B"),
            "Content-Type": JSON,
        },
        403,
        "session token",
    ),
    "no token, from a local tool (no Origin)": (
        lambda port, token: {"Content-Type": JSON},
        403,
        "session token",
    ),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_an_attack_neither_starts_a_run_nor_approves(site: Site, attack: str) -> None:
    headers_for, status, words = ATTACKS[attack]
    headers = headers_for(site.port, site.pg.session_token)
    for path, body in (start_run(), approve(site.card_ts)):
        got, text = await site.call("POST", path, headers, body)
        assert got == status, (path, text)
        assert words in text, text
    # The bot never heard of it: no slash command (no run), no click (no decision).
    assert site.bot.received == []
    assert await site.shown() == ["Approve?"]


READS = ["/", "/ui/state", f"/ui/history?as={RILEY}", f"/ui/stream?as={RILEY}"]


@pytest.mark.parametrize("path", READS)
async def test_dns_rebinding_reads_nothing(site: Site, path: str) -> None:
    # The rebound page's own requests: its Host, and (a same-origin GET) no Origin.
    status, text = await site.call("GET", path, {"Host": f"{EVIL}:{site.port}"})
    assert status == 403
    assert "Approve?" not in text and site.pg.session_token not in text


@pytest.mark.parametrize("path", READS[1:])
async def test_reading_state_needs_the_token(site: Site, path: str) -> None:
    status, text = await site.call("GET", path, {})
    assert status == 403 and "session token" in text and "Approve?" not in text
    bad = {TOKEN_HEADER: "x" + site.pg.session_token}
    status, text = await site.call("GET", path.replace("?", "?token=nope&"), bad)
    assert status == 403 and "Approve?" not in text


async def test_the_page_carries_the_token_and_it_works(site: Site) -> None:
    async with site.http.get(site.url + "/") as r:
        assert r.status == 200
        page = await r.text()
        assert r.headers["Cache-Control"] == "no-store"
        assert r.headers["X-Frame-Options"] == "DENY"
        assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
    found = re.search(r'<meta name="playground-token" content="([^"]+)">', page)
    assert found is not None and found.group(1) == site.pg.session_token
    assert "{{" not in page

    # The page, in a browser: its Origin and the token.
    path, body = start_run()
    assert await site.call("POST", path, {**site.own, "Content-Type": JSON}, body) == (
        200,
        '{"ok": true}',
    )
    assert site.bot.received[-1].form()["text"] == "delete user 42"
    click, clicked = approve(site.card_ts)
    assert (await site.call("POST", click, {**site.own, "Content-Type": JSON}, clicked))[0] == 200
    assert site.bot.received[-1].payload()["actions"][0]["value"] == "gate-1:approve"
    # The same page opened as http://localhost:PORT.
    local = {
        "Host": f"localhost:{site.port}",
        "Origin": f"http://localhost:{site.port}",
        TOKEN_HEADER: site.pg.session_token,
        "Content-Type": "application/json; charset=utf-8",
    }
    assert (await site.call("POST", path, local, body))[0] == 200
    # A tool on this machine (curl, a script): no Origin, the right Host and the token.
    tool = {TOKEN_HEADER: site.pg.session_token, "Content-Type": JSON}
    assert (await site.call("POST", path, tool, body))[0] == 200
    assert len(site.bot.received) == 4
    # The stream takes the token from its query (an EventSource cannot send headers).
    query = f"/ui/stream?as={RILEY}&token={site.pg.session_token}"
    async with site.http.get(site.url + query, headers={"Origin": site.url}) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")


async def test_the_bot_still_reaches_the_web_api(site: Site) -> None:
    # The Web API (the bot token) and response URLs need no session token: the bot has none.
    slack = AsyncWebClient(token=TOKEN, base_url=site.url + "/api/", session=site.http)
    assert (await slack.auth_test())["ok"] is True
    # …but another page cannot reach them either.
    status, _ = await site.call(
        "POST", "/api/auth.test", {"Origin": f"https://{EVIL}", "Authorization": f"Bearer {TOKEN}"}
    )
    assert status == 403
