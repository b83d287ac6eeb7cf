"""A task asked by a mention is never lost to a web process that dies before its ack.

The mention's run is made durable (keyed by the message) before Slack gets its ack, and a
delivery claims the message while it works. Slack delivers an event again when it got no
answer: a retry that finds the run starts nothing, and once the dead delivery's claim
lapsed it posts the root message the dead process never recorded; a retry that finds
another delivery still at work is left unanswered (HTTP 500) for Slack to deliver later.
Real ``python -m bot`` processes killed with SIGKILL, a real Redis, the fake Slack server.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest
from redis.asyncio import Redis

from agent_core import Gateway, Keys, create_redis
from bot import mentions
from bot.conversations import MESSAGE_NS
from bot.store import Store
from bot.testing import FakeSlack, SlackClient
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
from tests.bot.test_process import ROOT, free_port
from tests.tcp_proxy import TcpProxy

Spawn = Callable[[], Awaitable[tuple[SlackClient, "subprocess.Popen[bytes]"]]]


@pytest.fixture
async def spawn_web(redis_url: str, fake_slack: FakeSlack, tmp_path: Path) -> AsyncIterator[Spawn]:
    """``await spawn_web()``: a started ``python -m bot`` and a client that signs like Slack;
    every process still running is killed at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    async def spawn() -> tuple[SlackClient, subprocess.Popen[bytes]]:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLACK_")}
        env.update(
            {
                "REDIS_URL": redis_url,
                "KEY_PREFIX": PREFIX,
                "AGENT": "tests.agents:ops",
                "SLACK_BOT_TOKEN": fake_slack.token,
                "SLACK_SIGNING_SECRET": SIGNING_SECRET,
                "SLACK_API_URL": fake_slack.base_url.rstrip("/"),
                "APPROVERS": "U0APPROVER",
                "PORT": str(port),
            }
        )
        log = tmp_path / f"web{len(procs)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bot"],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"

        async def healthy() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                async with aiohttp.ClientSession() as s, s.get(url + "/healthz") as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await wait_until(healthy, timeout=30, interval=0.1)
        return SlackClient(url + "/slack/events", SIGNING_SECRET, fake=fake_slack), proc

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


async def test_a_mention_whose_web_dies_before_its_ack_is_finished_by_slacks_retry(
    spawn_web: Spawn, fake_slack: FakeSlack, redis: Redis
) -> None:
    task = "look up user 7"
    event = mention(f"<@U0BOT> {task}")
    # The root message is posted, but the process dies before it learns where.
    fake_slack.hold("chat.postMessage", when=lambda a: str(a.get("text", "")).startswith("Task"))
    first, proc = await spawn_web()
    sent = asyncio.ensure_future(first.event(event, event_id="EvCRASH"))

    async def posting() -> bool:
        return fake_slack.held == 1

    await wait_until(posting)
    gateway = Gateway(redis, Keys(PREFIX))
    [run] = await gateway.runs_for_user(REQUESTER)
    assert run.task == task and run.origin["thread_ts"] == event["ts"]
    proc.kill()
    proc.wait(timeout=10)
    with pytest.raises(aiohttp.ClientError):
        await sent  # Slack got no answer: it delivers the event again
    fake_slack.release()

    again, _ = await spawn_web()
    store = Store(redis, Keys(PREFIX))
    tries = iter(range(1, 100))

    async def retried() -> str | None:
        resp = await again.event(event, event_id="EvCRASH", retry=next(tries))
        assert resp.status == 200, resp.text  # the run exists: acknowledged at once
        return (await store.run(run.run_id)).ts

    # Slack's retries (here every half second) start nothing; the first one after the dead
    # delivery's claim lapsed posts the root message and records it.
    root: str = await wait_until(retried, timeout=mentions.CLAIM_SECONDS + 15, interval=0.5)
    assert [r.run_id for r in await gateway.runs_for_user(REQUESTER)] == [run.run_id]
    roots = [m for m in fake_slack.thread(CHANNEL, event["ts"]) if m.text.startswith("Task")]
    # The dead process's message stays behind (it never learned its ts); the recorded one
    # is the retry's, and replies in the person's thread continue the run.
    assert len(roots) == 2 and roots[-1].ts == root
    assert task in roots[-1].text
    assert await store.run_of_thread(CHANNEL, event["ts"]) == run.run_id


async def test_a_delivery_finding_another_at_work_is_left_for_slack_and_then_starts_once(
    bot: BotHarness, redis: Redis
) -> None:
    task = "look up user 8"
    event = mention(f"<@U0BOT> {task}")
    store = Store(redis, Keys(PREFIX))
    # Another web replica has claimed this message and is (or was) starting it.
    ident = f"{CHANNEL}:{event['ts']}"
    assert await store.claim(MESSAGE_NS, ident, "another-replica", lease_seconds=1.0)
    resp = await bot.client.event(event, event_id="EvBUSY")
    assert resp.status == 500  # Bolt's answer to Redeliver: Slack will try again
    assert await bot.gateway.runs_for_user(REQUESTER) == []
    assert not [m for m in bot.fake.messages if m.text.startswith("Task")]

    async def lapsed() -> bool:
        return not await redis.exists(
            store.keys.ext(MESSAGE_NS, ident, store.keys.shard_for(ident))
        )

    await wait_until(lapsed, timeout=5)
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
