"""Slack's ``ssl_check``: an unsigned ``ssl_check=1&token=…`` POSTed to the command URL when
the URL is saved, to check its certificate. Bolt answers it before verifying anything, with
an empty 200, and dispatches nothing; so does the web process, for exactly that request.
Every other unsigned or forged request, however much it looks like one, is still 401 and
reaches no parser, no Redis and no Slack call.
"""

from __future__ import annotations

import json
import logging
import time
from urllib.parse import urlencode

import aiohttp
import pytest
from redis.asyncio import Redis

from tests.bot.conftest import REQUESTER, BotHarness, notifier_ready
from tests.fuzz.pool import settle
from tests.slack_fake import HttpResult

FORM = "application/x-www-form-urlencoded"


async def unsigned(url: str, body: str, content_type: str = FORM, **headers: str) -> HttpResult:
    """POST ``body`` with no signature headers (unless given), as Slack sends ssl_check."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            url, data=body.encode(), headers={"Content-Type": content_type, **headers}
        ) as resp,
    ):
        return HttpResult(resp.status, await resp.text(), dict(resp.headers))


async def keys(redis: Redis) -> list[str]:
    return sorted(await redis.keys("*"))


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO)
    return caplog


async def test_ssl_check_gets_an_empty_200_and_does_nothing(
    bot: BotHarness, redis: Redis, logs: pytest.LogCaptureFixture
) -> None:
    await notifier_ready(bot)  # the notifier's group exists
    before = await keys(redis)
    url = bot.client.url
    stale = str(int(time.time()) - 3600)
    for body, headers in (
        ("ssl_check=1&token=gIkuvaNzQIHg97ATvDxqgjtO", {}),  # as Slack sends it
        ("token=gIkuvaNzQIHg97ATvDxqgjtO&ssl_check=1", {}),  # bolt-python's test order
        ("ssl_check=1", {}),
        ("ssl_check=1&token=", {}),
        # Signature headers change nothing: the request does nothing either way.
        (
            "ssl_check=1&token=x",
            {"X-Slack-Request-Timestamp": stale, "X-Slack-Signature": "v0=" + "0" * 64},
        ),
    ):
        resp = await unsigned(url, body, **headers)
        assert (resp.status, resp.text) == (200, ""), body
    # Signed, Bolt's own middleware answers it the same way.
    signed = await bot.client.post("ssl_check=1&token=x")
    assert (signed.status, signed.text) == (200, "")
    await settle(bot)
    assert await keys(redis) == before
    assert [c.method for c in bot.fake.calls if c.method != "auth.test"] == []
    assert [r.getMessage() for r in logs.records if r.levelno >= logging.WARNING] == []


async def test_a_signed_command_carrying_ssl_check_starts_nothing(bot: BotHarness) -> None:
    """Bolt takes any body with ``ssl_check=1`` for the check (its middleware runs first):
    a signed slash command with that field is answered empty and dispatches nothing."""
    body = bot.client.command_body("delete everything", user_id=REQUESTER) + "&ssl_check=1"
    resp = await bot.client.post(body)
    assert (resp.status, resp.text) == (200, "")
    await settle(bot)
    assert await bot.gateway.runs_for_user(REQUESTER) == []
    assert not bot.fake.calls_to("chat.postMessage")


async def test_anything_else_unsigned_is_still_refused(
    bot: BotHarness, redis: Redis, logs: pytest.LogCaptureFixture
) -> None:
    await notifier_ready(bot)
    before = await keys(redis)
    command = bot.client.command_body("delete everything", user_id=REQUESTER)
    click = urlencode({"payload": json.dumps({"type": "block_actions", "actions": [{}]})})
    attempts: list[tuple[str, str]] = [
        (command, FORM),  # a plain unsigned command
        (command + "&ssl_check=1", FORM),  # a command posing as the check
        ("ssl_check=1&" + command, FORM),
        (click + "&ssl_check=1", FORM),  # a click posing as the check
        ("ssl_check=1&token=x&text=hi", FORM),
        ("ssl_check=1&ssl_check=1", FORM),
        ("ssl_check=1&token=a&token=b", FORM),
        ("ssl_check=0&token=x", FORM),
        ("ssl_check=true", FORM),
        ("ssl_check=1&token=x", "application/json"),
        ("ssl_check=1&token=x", "text/plain"),
        (json.dumps({"ssl_check": "1", "token": "x"}), "application/json"),
        (json.dumps({"ssl_check": "1", "token": "x"}), FORM),
        ("ssl_check=1&token=" + "x" * 2000, FORM),
        ("ssl_check=1&tok%FFen=x", FORM),
        ("", FORM),
    ]
    for body, content_type in attempts:
        resp = await unsigned(bot.client.url, body, content_type)
        assert resp.status == 401, (body[:80], content_type, resp.text)
        assert resp.json() == {"error": "invalid request"}
    await settle(bot)
    assert await keys(redis) == before
    assert bot.fake.calls == []
    assert await bot.gateway.runs_for_user(REQUESTER) == []
