"""A task is never lost to a web process that dies before its ack, nor to a lost reply.

The mention's run is made durable (keyed by the message) before Slack gets its ack, and a
delivery claims the message while it works. Slack delivers an event again when it got no
answer: a retry that finds the run starts nothing, and once the dead delivery's claim
lapsed it posts the root message the dead process never recorded; a retry that finds
another delivery still at work is left unanswered (HTTP 500) for Slack to deliver later.
A slash command's claim on its trigger carries its own token, so a claim whose reply was
lost (and that redis-py sent again) is not taken for a repeated request. Real ``python -m
bot`` processes killed with SIGKILL, a real Redis (behind a proxy that loses a reply), the
fake Slack server.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest
from redis.asyncio import Redis

from agent_core import Gateway, Keys, create_redis
from bot import mentions
from bot.conversations import MESSAGE_NS
from bot.store import Store
from tests.bot.conftest import (
    CHANNEL,
    PREFIX,
    REQUESTER,
    SIGNING_SECRET,
    BotHarness,
    bot_settings,
    wait_until,
)
from tests.bot.test_mentions import mention
from tests.security.webproc import start_web
from tests.slack_fake import FakeSlack, SlackClient
from tests.tcp_proxy import TcpProxy


async def lapse_claim(redis: Redis, ident: str) -> None:
    """Let a dead delivery's claim on a message lapse now, as it does after CLAIM_SECONDS."""
    keys = Keys(PREFIX)
    key = keys.ext(MESSAGE_NS, ident, keys.shard_for(ident))
    await redis.pexpire(key, 1)
    # Gone before the next delivery: one sent within the millisecond would find it held.
    while await redis.exists(key):
        await asyncio.sleep(0.001)


async def test_a_mention_whose_web_dies_before_its_ack_is_finished_by_slacks_retry(
    fake_slack: FakeSlack, redis: Redis, redis_url: str, tmp_path: Path
) -> None:
    task = "look up user 7"
    event = mention(f"<@U0BOT> {task}")
    # The root message is posted, but the process dies before it learns where.
    fake_slack.hold("chat.postMessage", when=lambda a: str(a.get("text", "")).startswith("Task"))
    web = await start_web(redis_url, fake_slack, tmp_path / "web.log", prefix=PREFIX)
    first = SlackClient(web.events_url, SIGNING_SECRET, fake=fake_slack)
    sent = asyncio.ensure_future(first.event(event, event_id="EvCRASH"))

    async def posting() -> bool:
        return fake_slack.held == 1

    await wait_until(posting)
    gateway = Gateway(redis, Keys(PREFIX))
    [run] = await gateway.runs_for_user(REQUESTER)
    assert run.task == task and run.origin["thread_ts"] == event["ts"]
    web.kill()
    with pytest.raises(aiohttp.ClientError):
        await sent  # Slack got no answer: it delivers the event again
    fake_slack.release()

    again = await start_web(redis_url, fake_slack, tmp_path / "web2.log", prefix=PREFIX)
    client = SlackClient(again.events_url, SIGNING_SECRET, fake=fake_slack)
    store = Store(redis, Keys(PREFIX))
    # Slack's first retry, while the dead delivery's claim holds: the run exists, so it is
    # acknowledged and starts nothing; the claim's holder may still be posting.
    resp = await client.event(event, event_id="EvCRASH", retry=1)
    assert resp.status == 200, resp.text
    assert (await store.run(run.run_id)).ts is None
    # The next one, after the claim lapsed, posts the root message and records it.
    await lapse_claim(redis, f"{CHANNEL}:{event['ts']}")
    assert (await client.event(event, event_id="EvCRASH", retry=2)).status == 200
    root = (await store.run(run.run_id)).ts
    assert root is not None
    assert [r.run_id for r in await gateway.runs_for_user(REQUESTER)] == [run.run_id]
    roots = [m for m in fake_slack.thread(CHANNEL, event["ts"]) if m.text.startswith("Task")]
    # The dead process's message stays behind (it never learned its ts); the recorded one
    # is the retry's, and replies in the person's thread continue the run.
    assert len(roots) == 2 and roots[-1].ts == root
    assert task in roots[-1].text
    assert await store.run_of_thread(CHANNEL, event["ts"]) == run.run_id
    again.kill()


async def test_a_delivery_finding_another_at_work_is_left_for_slack_and_then_starts_once(
    bot: BotHarness, redis: Redis
) -> None:
    task = "look up user 8"
    event = mention(f"<@U0BOT> {task}")
    store = Store(redis, Keys(PREFIX))
    # Another web replica has claimed this message and is (or was) starting it.
    ident = f"{CHANNEL}:{event['ts']}"
    assert await store.claim(MESSAGE_NS, ident, "another-replica", mentions.CLAIM_SECONDS)
    resp = await bot.client.event(event, event_id="EvBUSY")
    assert resp.status == 500  # Bolt's answer to Redeliver: Slack will try again
    assert await bot.gateway.runs_for_user(REQUESTER) == []
    assert not [m for m in bot.fake.messages if m.text.startswith("Task")]

    await lapse_claim(redis, ident)  # that replica died: its claim lapses
    assert (await bot.client.event(event, event_id="EvBUSY", retry=1)).status == 200
    assert (await bot.client.event(event, event_id="EvBUSY", retry=2)).status == 200
    [run] = await bot.gateway.runs_for_user(REQUESTER)
    assert run.task == task
    roots = [m for m in bot.fake.thread(CHANNEL, event["ts"]) if m.text.startswith("Task")]
    assert len(roots) == 1 and (await store.run(run.run_id)).ts == roots[0].ts


async def test_a_slash_command_whose_claim_reply_is_lost_still_starts_once(
    redis_url: str, fake_slack: FakeSlack, redis: Redis
) -> None:
    """Redis records the command's trigger, but its answer is lost; redis-py sends the SET
    again. The retry must find the request's own claim, not 'already received'."""
    parts = urlsplit(redis_url)
    with TcpProxy(parts.port or 6379, parts.hostname or "127.0.0.1") as proxy:
        through_proxy = create_redis(proxy.url_for(redis_url))
        bot = BotHarness(through_proxy, fake_slack, bot_settings(fake_slack))
        await bot.start()
        try:
            proxy.lose_reply(b"SET", b"slack-trigger")
            resp = await bot.client.command("look up user 9", user_id=REQUESTER, channel_id=CHANNEL)
            assert resp.status == 200 and "already" not in resp.text
            assert proxy.armed == 0, "the claim's reply was lost"
            runs = await wait_until(lambda: bot.gateway.runs_for_user(REQUESTER))
            assert [r.task for r in runs] == ["look up user 9"]
            await fake_slack.wait_for(
                lambda f: [m for m in f.messages if runs[0].run_id in str(m.blocks)],
                what="the root message showing the run",
            )
            roots = [m for m in fake_slack.messages if m.text.startswith("Task started")]
            assert len(roots) == 1
        finally:
            await bot.close()
            await through_proxy.aclose()
