"""Bolt gets everything from BotSettings, never from the environment by itself."""

from __future__ import annotations

import logging
import os

import pytest
from redis.asyncio import Redis
from slack_bolt.async_app import AsyncApp

from agent_core import Gateway, Keys
from bot.app import create_app, make_web_client
from tests.bot.conftest import PREFIX, bot_settings
from tests.slack_fake import FakeSlack

UNUSED = "will be unused"


def bolt_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("slack_bolt")]


def test_bolt_alone_would_warn(
    fake_slack: FakeSlack, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning this module is about: AsyncApp reads SLACK_BOT_TOKEN itself."""
    monkeypatch.setenv("SLACK_BOT_TOKEN", fake_slack.token)
    client = make_web_client(bot_settings(fake_slack))
    with caplog.at_level(logging.WARNING):
        AsyncApp(client=client, signing_secret="s", name="t")
    assert any(UNUSED in m for m in bolt_warnings(caplog))


async def test_app_start_with_the_token_in_the_environment_warns_nothing(
    fake_slack: FakeSlack,
    redis: Redis,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("SLACK_BOT_TOKEN", fake_slack.token)
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "from-the-environment")
    monkeypatch.setenv("SLACK_CLIENT_ID", "1.2")
    monkeypatch.setenv("SLACK_CLIENT_SECRET", "not-a-secret")
    settings = bot_settings(fake_slack)
    client = make_web_client(settings)
    with caplog.at_level(logging.DEBUG, logger="slack_bolt"):
        app = create_app(settings, redis, Gateway(redis, Keys(PREFIX)), client)
    assert [m for m in bolt_warnings(caplog) if UNUSED in m] == []
    assert app.client is client
    assert app.oauth_flow is None, "SLACK_CLIENT_ID/SECRET must not turn Bolt's OAuth on"
    # The environment is as it was.
    assert os.environ["SLACK_BOT_TOKEN"] == fake_slack.token
    assert os.environ["SLACK_SIGNING_SECRET"] == "from-the-environment"
    assert os.environ["SLACK_CLIENT_ID"] == "1.2"
