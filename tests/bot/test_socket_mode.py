"""Socket Mode (SLACK_APP_TOKEN set): the same handlers, reached over the fake's WebSocket."""

from __future__ import annotations

from urllib.parse import parse_qsl

import aiohttp
from redis.asyncio import Redis

from agent_core import Gateway, Keys
from bot.server import BotServer
from tests.bot.conftest import CHANNEL, PREFIX, REQUESTER, bot_settings, wait_until
from tests.slack_fake import FakeSlack, SlackClient


async def test_socket_mode_serves_commands_and_actions(redis: Redis, fake_slack: FakeSlack) -> None:
    settings = bot_settings(
        fake_slack, SLACK_APP_TOKEN=fake_slack.app_token, SLACK_SIGNING_SECRET=""
    )
    assert settings.socket_mode
    gateway = Gateway(redis, Keys(PREFIX))
    server = BotServer(settings, redis, gateway, host="127.0.0.1", port=0, notifier_block_ms=100)
    await server.start()
    try:
        await fake_slack.wait_for(lambda f: f.socket_connections, what="a Socket Mode connection")
        requests = SlackClient("unused", "unused", fake=fake_slack)
        form = dict(parse_qsl(requests.command_body("help")))
        ack = await fake_slack.socket_request("slash_commands", {**form, "text": "help"})
        assert "Usage" in ack["payload"]["text"]

        body = {**form, "text": "look it up", "user_id": REQUESTER, "channel_id": CHANNEL}
        await fake_slack.socket_request("slash_commands", body)
        runs = await wait_until(lambda: gateway.runs_for_user(REQUESTER))
        assert runs[0].task == "look it up"

        click = requests.action_payload(
            "gate_approve", "x" * 24, response_url=fake_slack.response_url("sm")
        )
        await fake_slack.socket_request("interactive", click)
        (reply,) = await fake_slack.wait_for(lambda f: f.responses("sm"))
        assert "does not exist" in reply.args["text"]

        async with (
            aiohttp.ClientSession() as s,
            s.post(server.url + "/slack/events", data=b"x") as r,
        ):
            assert r.status == 404, "no HTTP endpoint in Socket Mode"
    finally:
        await server.stop()
