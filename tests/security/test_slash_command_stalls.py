"""An acknowledged ``/agent <task>`` is never silently lost.

The command is acknowledged once its run is in Redis, and at the latest after
ACK_BUDGET_SECONDS. When Redis stalls past that budget (here: a real ``redis-server`` with
writes paused by ``CLIENT PAUSE <ms> WRITE``), the acknowledgement itself tells the person,
ephemerally, that the task is not recorded yet; then the response_url tells them that it
started (and its message appears) or that it was not started. A web process SIGKILLed right
after such an acknowledgement leaves nothing half-started: the person was already told what
it means when nothing follows.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio import Redis

from agent_core import Gateway, Keys, Run
from bot import commands
from tests.bot.conftest import CHANNEL, REQUESTER, SIGNING_SECRET, BotHarness
from tests.fuzz.pool import settle
from tests.redis_server import RedisServer
from tests.security.webproc import start_web
from tests.slack_fake import FakeSlack, HttpResult, SlackClient

PAUSE_MS = "30000"  # longer than any test waits: each one ends the pause itself


async def runs_of(gateway: Gateway, task: str) -> list[Run]:
    return [r for r in await gateway.runs_for_user(REQUESTER, limit=50) if r.task == task]


def posted_about(fake: FakeSlack, task: str) -> list[Any]:
    """Channel messages that mention the task (the run's root message)."""
    return [m for m in fake.messages if task in m.text or task in json.dumps(m.blocks)]


def replies(fake: FakeSlack, name: str) -> list[str]:
    return [str(c.args.get("text") or "") for c in fake.responses(name)]


def told_not_recorded(resp: HttpResult) -> bool:
    """The acknowledgement says, to this person only, that the task is not recorded yet."""
    if resp.status != 200 or not resp.text:
        return False
    body = resp.json()
    return body.get("response_type") == "ephemeral" and "not been recorded yet" in body["text"]


@pytest.fixture
async def paused(redis: Redis) -> AsyncIterator[Redis]:
    """The session's Redis with writes paused; the test unpauses it (and teardown, always)."""
    await redis.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
    try:
        yield redis
    finally:
        await redis.execute_command("CLIENT", "UNPAUSE")


async def test_a_stalled_command_is_told_not_recorded_yet_then_that_it_started(
    bot: BotHarness, paused: Redis
) -> None:
    fake, task = bot.fake, "rotate the staging keys"
    loop = asyncio.get_running_loop()
    sent = loop.time()
    resp = await bot.client.command(
        task, user_id=REQUESTER, channel_id=CHANNEL, response_url=fake.response_url("late")
    )
    waited = loop.time() - sent
    assert told_not_recorded(resp), resp.text
    assert commands.ACK_BUDGET_SECONDS <= waited < commands.ACK_BUDGET_SECONDS + 1.5
    assert posted_about(fake, task) == [], "nothing is shown before the task is recorded"
    assert await runs_of(bot.gateway, task) == []

    await paused.execute_command("CLIENT", "UNPAUSE")  # Redis answers again
    (started,) = await fake.wait_for(lambda f: replies(f, "late"), what="the outcome")
    (run,) = await runs_of(bot.gateway, task)
    assert "has started" in started and run.run_id in started
    (root,) = await fake.wait_for(
        lambda f: [m for m in posted_about(f, task) if run.run_id in json.dumps(m.blocks)],
        what="the run's message",
    )
    assert root.channel == CHANNEL and run.origin["thread_ts"] == root.ts
    await settle(bot)
    assert len(replies(fake, "late")) == 1 and len(await runs_of(bot.gateway, task)) == 1


async def test_a_command_stalled_past_the_deadline_is_told_it_was_not_started(
    bot: BotHarness, paused: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commands, "START_DEADLINE_SECONDS", 3.0)
    fake, task = bot.fake, "empty the trash"
    resp = await bot.client.command(
        task, user_id=REQUESTER, channel_id=CHANNEL, response_url=fake.response_url("slow")
    )
    assert told_not_recorded(resp) and "within 3 seconds" in resp.json()["text"]
    (outcome,) = await fake.wait_for(lambda f: replies(f, "slow"), what="the outcome")
    assert "was not started" in outcome and "Nothing will run" in outcome
    await paused.execute_command("CLIENT", "UNPAUSE")
    await paused.set("t:probe", "1")  # whatever was queued before this write has run
    await settle(bot)
    assert await runs_of(bot.gateway, task) == [], "given up means never started"
    assert posted_about(fake, task) == []
    assert replies(fake, "slow") == [outcome]


async def test_a_command_retried_during_a_stall_starts_one_run(
    bot: BotHarness, paused: Redis
) -> None:
    """Slack's retry (the same signed body) arrives while the first is still unrecorded."""
    fake, task = bot.fake, "restart the queue workers"
    body = bot.client.command_body(
        task, user_id=REQUESTER, channel_id=CHANNEL, response_url=fake.response_url("retry")
    )
    first, second = await asyncio.gather(bot.client.post(body), bot.client.post(body))
    assert told_not_recorded(first) and told_not_recorded(second)
    await paused.execute_command("CLIENT", "UNPAUSE")
    told = await fake.wait_for(lambda f: len(replies(f, "retry")) == 2 and replies(f, "retry"))
    assert sum("has started" in t for t in told) == 1, told
    assert sum("already received" in t for t in told) == 1, told
    await settle(bot)
    assert len(await runs_of(bot.gateway, task)) == 1
    assert len(posted_about(fake, task)) == 1


@pytest.fixture
async def private_redis() -> AsyncIterator[tuple[RedisServer, Redis]]:
    server = RedisServer().start()
    client = aioredis.Redis.from_url(server.url, decode_responses=True)
    try:
        yield server, client
    finally:
        await client.aclose()
        server.close()


@pytest.mark.parametrize("stalled", [False, True], ids=["recorded", "stalled"])
async def test_a_web_killed_right_after_the_ack_leaves_no_acknowledged_task_unaccounted(
    private_redis: tuple[RedisServer, Redis],
    fake_slack: FakeSlack,
    tmp_path: Path,
    stalled: bool,
) -> None:
    """Acknowledged without a word means recorded; acknowledged while Redis stalls means the
    person was told it was not recorded yet, and with the process gone it never will be."""
    server, redis = private_redis
    web = await start_web(server.url, fake_slack, tmp_path / "web.log")
    gateway = Gateway(redis, Keys("t"))
    task = "archive the old tickets"
    try:
        if stalled:
            await redis.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
        slack = SlackClient(web.events_url, SIGNING_SECRET, fake=fake_slack)
        resp = await slack.command(
            task, user_id=REQUESTER, channel_id=CHANNEL, response_url=fake_slack.response_url("k")
        )
        web.kill()  # right after the ack
        await redis.execute_command("CLIENT", "UNPAUSE")
        await redis.set("t:probe", "1")  # the dead process's queued writes are gone or done
    finally:
        web.kill()
    assert resp.status == 200
    if not stalled:
        assert resp.text == "", "acknowledged without a word: the run is recorded"
        assert len(await runs_of(gateway, task)) == 1
        return
    assert told_not_recorded(resp), resp.text
    assert "it was not started" in resp.json()["text"], "says what silence means"
    assert await runs_of(gateway, task) == []
    assert posted_about(fake_slack, task) == [], "no message claims it is starting"
