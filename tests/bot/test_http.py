"""Signed requests over HTTP to the bot's real aiohttp server (no worker needed)."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlencode

import aiohttp
from redis.asyncio import Redis

from agent_core import Gateway, Keys
from bot.server import BotServer
from tests.bot.conftest import (
    APPROVER,
    CHANNEL,
    REQUESTER,
    SIGNING_SECRET,
    BotHarness,
    bot_settings,
    notifier_ready,
)
from tests.slack_fake import FakeSlack, SlackCall, SlackClient, sign


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return r.status, await r.text()


async def test_help_is_answered_in_the_ack(bot: BotHarness) -> None:
    for text in ("", "help", "  HELP "):
        started = time.monotonic()
        resp = await bot.client.command(text)
        assert resp.status == 200
        assert time.monotonic() - started < 2
        assert "Usage" in resp.json()["text"] and "/agent status" in resp.json()["text"]
    assert not bot.fake.calls_to("chat.postMessage")


async def test_too_long_task_is_refused_and_nothing_starts(bot: BotHarness) -> None:
    resp = await bot.client.command("do " + "x" * 5000, user_id=REQUESTER)
    assert resp.status == 200
    assert "limit is 2,000" in resp.json()["text"]
    assert await bot.gateway.runs_for_user(REQUESTER) == []
    assert not bot.fake.calls_to("chat.postMessage")


async def _redis_keys(redis: Redis) -> list[str]:
    return sorted(await redis.keys("*"))


async def test_forged_and_stale_signatures_are_rejected(bot: BotHarness, redis: Redis) -> None:
    await notifier_ready(bot)  # the notifier's consumer group
    before = await _redis_keys(redis)
    body = bot.client.command_body("delete everything", user_id=REQUESTER)
    now = str(int(time.time()))
    attempts: list[tuple[str, dict[str, str]]] = [
        (body, {"secret": "wrong-secret"}),
        (body, {"timestamp": str(int(time.time()) - 301)}),  # correctly signed, too old
        (body, {"timestamp": str(int(time.time()) + 400)}),
        (body, {"signature": ""}),
        (body, {"timestamp": "", "signature": sign(SIGNING_SECRET, "", body)}),
        (body, {"timestamp": "soon", "signature": sign(SIGNING_SECRET, "soon", body)}),
        (body + "&x=1", {"timestamp": now, "signature": sign(SIGNING_SECRET, now, body)}),
        (bot.client.command_body("x"), {"signature": "v0=" + "0" * 64}),
    ]
    for raw, how in attempts:
        resp = await bot.client.post(raw, **how)
        assert resp.status == 401, (how, resp.text)
        assert resp.json() == {"error": "invalid request"}
    assert await _redis_keys(redis) == before
    assert bot.fake.calls == []
    # A correctly signed request still works.
    ok = await bot.client.command("help")
    assert ok.status == 200


async def test_malformed_payloads_get_a_clear_answer(bot: BotHarness) -> None:
    bad = await bot.client.post(urlencode({"payload": "{not json"}))
    assert bad.status == 400 and bad.json() == {"error": "malformed payload"}
    weird = await bot.client.post(urlencode({"payload": "[1, 2]"}))
    assert weird.status in (400, 404)
    no_actions = await bot.client.payload({"type": "block_actions", "user": {"id": APPROVER}})
    assert no_actions.status == 404 and "unhandled" in no_actions.text
    unknown_type = await bot.client.payload({"type": "something_else"})
    assert unknown_type.status == 404
    other_command = await bot.client.command("hi", command="/other")
    assert other_command.status == 404
    assert (await bot.client.command("help")).status == 200, "still serving"


async def test_unknown_button_and_unknown_gate_ids(bot: BotHarness) -> None:
    fake = bot.fake
    resp = await bot.client.action("something_new", "x", response_url=fake.response_url("u"))
    assert resp.status == 200
    (msg,) = await fake.wait_for(lambda f: f.responses("u"), what="reply to unknown action")
    assert "don't know that button" in msg.args["text"]
    assert msg.args["response_type"] == "ephemeral" and msg.args["replace_original"] is False

    for i, value in enumerate(["AbCdEfGhIjKlMnOpQrStUvWx", "../../etc", "x" * 3000, ""]):
        name = f"g{i}"
        for action_id in ("gate_approve", "gate_deny", "gate_args"):
            resp = await bot.client.action(action_id, value, response_url=fake.response_url(name))
            assert resp.status == 200

        def three(f: FakeSlack, n: str = name) -> list[SlackCall]:
            return f.responses(n) if len(f.responses(n)) >= 3 else []

        replies = await fake.wait_for(three)
        for r in replies:
            assert "does not exist" in r.args["text"] or "malformed" in r.args["text"]
    assert not fake.calls_to("views.open")
    assert not fake.calls_to("chat.update")


async def test_status_and_cancel_of_unknown_run(bot: BotHarness) -> None:
    fake = bot.fake
    await bot.client.command("status", user_id=REQUESTER, response_url=fake.response_url("s"))
    (reply,) = await fake.wait_for(lambda f: f.responses("s"))
    assert "no runs" in reply.args["text"]
    await bot.client.command("cancel r-000000000000", response_url=fake.response_url("c"))
    (reply,) = await fake.wait_for(lambda f: f.responses("c"))
    assert "There is no run `r-000000000000`" in reply.args["text"]
    resp = await bot.client.command("cancel")
    assert "Which run?" in resp.json()["text"]


async def test_channel_without_the_bot_starts_nothing(bot: BotHarness) -> None:
    fake = bot.fake
    fake.block_channel("C0PRIVATE")
    await bot.client.command(
        "look up the weather",
        user_id=REQUESTER,
        channel_id="C0PRIVATE",
        response_url=fake.response_url("p"),
    )
    (reply,) = await fake.wait_for(lambda f: f.responses("p"))
    assert "not_in_channel" in reply.args["text"] and "Invite me" in reply.args["text"]
    assert await bot.gateway.runs_for_user(REQUESTER) == []


async def test_slash_command_starts_a_run_in_a_thread(bot: BotHarness) -> None:
    """Without a worker the run stays queued, but the thread and the run exist."""
    resp = await bot.client.command("check the &lt;prod&gt; disk", user_id=REQUESTER)
    assert resp.status == 200 and resp.text == ""
    run_id = await bot.start_task("check disk usage")
    run = await bot.gateway.get_run(run_id)
    assert run is not None
    runs = {r.task: r for r in await bot.gateway.runs_for_user(REQUESTER)}
    assert "check the <prod> disk" in runs, "Slack's HTML escaping is undone for the agent"
    root = bot.fake.message(run.origin["channel"], run.origin["thread_ts"])
    assert root is not None and root.thread_ts is None
    assert run.origin == {
        "channel": CHANNEL,
        "thread_ts": root.ts,
        "root_ts": root.ts,
        "team": "T0TEST",
    }
    assert "Task started by <@U0REQ>" in root.text
    await bot.fake.wait_for(lambda f: f.shows(root.channel, root.ts, run_id))
    assert "check disk usage" in str(root.blocks)


async def test_redis_outage_gives_clear_answers_and_unhealthy(
    bot: BotHarness, fake_slack: FakeSlack
) -> None:
    status, body = await get(bot.server.url + "/healthz")
    assert status == 200 and json.loads(body)["ok"] is True  # its workers: tests/bot/test_agents.py
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    dead = Redis.from_url(f"redis://127.0.0.1:{dead_port}/0", socket_connect_timeout=0.5)
    server = BotServer(
        bot_settings(fake_slack),
        dead,
        Gateway(dead, Keys("t")),
        host="127.0.0.1",
        port=0,
        run_notifier=False,
    )
    await server.start()
    try:
        status, _ = await get(server.url + "/healthz")
        assert status == 503
        slack = SlackClient(server.url + "/slack/events", SIGNING_SECRET, fake=fake_slack)
        click = await slack.action(
            "gate_approve", "00" + "A" * 22, response_url=fake_slack.response_url("down")
        )
        assert click.status == 200, "acknowledged at once, even with Redis down"
        (r,) = await fake_slack.wait_for(lambda f: f.responses("down"))
        assert "unavailable right now, so nothing was decided" in r.args["text"]
        await slack.command("status", response_url=fake_slack.response_url("down2"))
        (r,) = await fake_slack.wait_for(lambda f: f.responses("down2"))
        assert "unavailable right now" in r.args["text"]
    finally:
        await server.stop()
        await dead.aclose()


async def test_a_task_mentioning_the_word_payload_starts(bot: BotHarness) -> None:
    """Bolt took any form body containing "payload" for an interactive payload and read the
    command as empty: Slack got 404 for ``/agent summarize the payload``."""
    task = "summarize the payload of job 3"
    run_id = await bot.start_task(task)
    run = await bot.gateway.get_run(run_id)
    assert run is not None and run.task == task
