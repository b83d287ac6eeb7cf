"""Each Slack message reaches the agent once, and none is dropped in silence.

A reply that mentions the app arrives twice, as ``app_mention`` and as ``message``, with
different event ids and the same channel and ts; either may come late (a retry, a delay,
another web replica). The message is recorded with its id by the same Redis script that adds
it to the run, so the model sees it once. A reply Redis could not record is not marked
handled: a redelivery records it, and its author is told to send it again. Signed events to
the real Bolt app, a real Redis (faults are real: a key of the wrong type, a paused and then
killed server), the model's requests as the fake OpenAI server received them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agent_core import RunStatus, create_redis
from agent_core.testing import FakeOpenAI, call, reply
from bot import cards, conversations
from tests.bot.conftest import (
    APPROVER,
    APPROVER2,
    CHANNEL,
    REQUESTER,
    BotHarness,
    bot_settings,
    wait_until,
)
from tests.bot.test_conversations import (
    continued,
    ephemerals,
    message,
    root_of,
    send_event,
    status_is,
    thread_shows,
)
from tests.bot.test_mentions import BOT, _ts, dm, finished, in_thread, mention, one_run, runs_of
from tests.redis_server import RedisServer
from tests.slack_fake import FakeSlack


def twins(text: str, thread: str, user: str = REQUESTER) -> tuple[dict[str, Any], dict[str, Any]]:
    """One message written in a thread, as Slack delivers it: (app_mention, message)."""
    as_mention = mention(text, user=user, thread_ts=thread)
    as_message = {**as_mention, "type": "message", "channel_type": "channel"}
    return as_mention, as_message


async def model_called(fake_openai: FakeOpenAI, task: str, times: int) -> None:
    """Wait until the model got ``times`` requests for ``task`` (the thread's answer may
    come later: the notifier's recovery after a Redis restart is not what is tested here)."""

    async def called() -> bool:
        return len(fake_openai.requests_for(task)) >= times

    await wait_until(called, timeout=15)


def user_texts(fake_openai: FakeOpenAI, task: str) -> list[str]:
    """The user messages of the model's latest request for ``task``."""
    last = fake_openai.requests_for(task)[-1]["messages"]
    return [m["content"] for m in last if m["role"] == "user"]


async def test_a_thread_mention_is_added_once_whichever_delivery_comes_first(
    live: BotHarness,
    fake_openai: FakeOpenAI,
    make_bot: Callable[..., Awaitable[BotHarness]],
) -> None:
    other = await make_bot()  # a second web replica on the same Redis
    task = "look up user 7"
    fake_openai.script(
        task,
        [reply("user 7 is Ada"), reply("user 8 is Bo"), reply("glad to"), reply("none yet")],
    )
    fake_openai.script("look up user 9", [reply("user 9 is Cy")])
    thread = _ts()  # someone's message in the channel: no run's thread yet

    # A mention written as a reply there starts a run; its `message` twin reaches another
    # replica only after the run has answered: it is the same message, not a new reply.
    first, first_twin = twins(f"<@{BOT}> look up user 7", thread)
    assert (await send_event(live, first)).status == 200
    run = await one_run(live, task)
    await in_thread(live, CHANNEL, thread, "user 7 is Ada")
    await finished(live, run.run_id)
    assert (await send_event(other, first_twin)).status == 200

    # In the run's thread now: the message first (it continues the run), the mention after
    # the run answered; then the other way round.
    second, second_twin = twins(f"<@{BOT}> and user 8?", thread)
    assert (await send_event(live, second_twin)).status == 200
    await in_thread(live, CHANNEL, thread, "user 8 is Bo")
    await finished(live, run.run_id)
    assert (await send_event(other, second)).status == 200

    third, third_twin = twins(f"<@{BOT}> thanks", thread)
    assert (await send_event(other, third)).status == 200
    await in_thread(live, CHANNEL, thread, "glad to")
    await finished(live, run.run_id)
    assert (await send_event(live, third_twin)).status == 200

    # Both at once, each to its own replica: one of them adds it.
    fifth, fifth_twin = twins(f"<@{BOT}> any news?", thread, user=APPROVER2)
    got = await asyncio.gather(send_event(live, fifth_twin), send_event(other, fifth))
    assert [r.status for r in got] == [200, 200]
    await in_thread(live, CHANNEL, thread, "none yet")
    await finished(live, run.run_id)

    # Elsewhere, the `message` delivery comes first, in a thread that is no run's: it is
    # ignored, and its app_mention twin still starts a run.
    fourth, fourth_twin = twins(f"<@{BOT}> look up user 9", _ts())
    assert (await send_event(live, fourth_twin)).status == 200
    assert (await send_event(other, fourth)).status == 200
    run9 = await one_run(live, "look up user 9")
    await finished(live, run9.run_id)

    await asyncio.sleep(0.5)  # a late twin that went through would have continued the run
    assert (await live.gateway.get_run(run.run_id)).status is RunStatus.COMPLETED  # type: ignore[union-attr]
    assert len(fake_openai.requests_for(task)) == 4
    assert user_texts(fake_openai, task) == [
        "look up user 7",
        f"<@{BOT}> and user 8?",
        f"<@{BOT}> thanks",
        f"<@{BOT}> any news?",
    ]
    by = [d["by"] for d in await continued(live, run.run_id)]
    assert by == [REQUESTER, REQUESTER, APPROVER2]
    assert sorted(r.run_id for r in await runs_of(live)) == sorted([run.run_id, run9.run_id])
    assert ephemerals(live) == []


async def test_a_reply_redis_fails_to_record_is_not_marked_and_its_author_is_told(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "delete user 7"
    fake_openai.script(task, [call("delete_user", {"user_id": "7"}), reply("done, and logged")])
    run_id = await live.start_task(task)
    ts = await root_of(live, run_id)
    gate = await live.gate_of(run_id)

    # A fault between looking the thread up and recording the reply: the run's inbox holds
    # a value of the wrong type, so the script that records the reply fails (WRONGTYPE).
    inbox = live.keys.run_inbox(run_id)
    await live.redis.set(inbox, "not a list")
    event = message(ts, "and log it please", user=APPROVER2)
    assert (await send_event(live, event, event_id="EvLOST")).status == 200
    [told] = await live.fake.wait_for(lambda f: ephemerals(live))
    assert told["user"] == APPROVER2 and told["channel"] == CHANNEL and told["thread_ts"] == ts
    assert told["text"] == conversations.NOT_RECORDED.format(run=run_id)

    # Redis is sound again, and Slack delivers the event again: it was not marked handled,
    # so it is recorded now (queued: the run waits for approval), once.
    await live.redis.delete(inbox)
    assert (await send_event(live, event, event_id="EvLOST", retry=1)).status == 200
    await live.fake.wait_for(lambda f: len(ephemerals(live)) == 2)
    assert ephemerals(live)[1]["text"] == conversations.QUEUED.format(run=run_id)
    assert (await send_event(live, event, event_id="EvLOST", retry=2)).status == 200

    await live.client.action("gate_approve", cards.button_value(gate), user_id=APPROVER)
    await thread_shows(live, ts, "done, and logged")
    await status_is(live, run_id, RunStatus.COMPLETED)
    assert user_texts(fake_openai, task) == [task, "and log it please"]
    assert [d["by"] for d in await continued(live, run_id)] == [APPROVER2]
    assert len(ephemerals(live)) == 2


@pytest.fixture
async def private_redis() -> AsyncIterator[RedisServer]:
    server = RedisServer(appendonly=True).start()  # fsync always: a kill loses nothing
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
async def private_bot(
    private_redis: RedisServer, fake_slack: FakeSlack, fake_openai: FakeOpenAI, journal: Path
) -> AsyncIterator[BotHarness]:
    """The bot and a worker on a Redis of their own, which the test may kill."""
    redis = create_redis(private_redis.url)  # as the web process connects
    bot = await BotHarness(redis, fake_slack, bot_settings(fake_slack)).start()
    bot.start_worker(private_redis.url, fake_openai.base_url)
    try:
        yield bot
    finally:
        if not private_redis.running:
            private_redis.start()  # same port: let the bot and the worker stop cleanly
        await bot.close()
        await redis.aclose()


async def test_a_reply_whose_redis_dies_before_recording_it_is_told_and_redelivered_once(
    private_bot: BotHarness, private_redis: RedisServer, fake_openai: FakeOpenAI
) -> None:
    bot = private_bot
    task = "chat about user 4"
    fake_openai.script(task, [reply("user 4 is Ed"), reply("Ed joined in May")])
    run_id = await bot.start_task(task)
    ts = await root_of(bot, run_id)
    await thread_shows(bot, ts, "user 4 is Ed")
    await status_is(bot, run_id, RunStatus.COMPLETED)

    # Redis reads the thread, holds the script that would record the reply, then dies.
    # Slack gets its answer within its 3 s; the author learns the reply may be lost.
    await bot.redis.execute_command("CLIENT", "PAUSE", "10000", "WRITE")
    event = message(ts, "when did Ed join?", user=APPROVER2)
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert (await send_event(bot, event, event_id="EvDOUBT")).status == 200
    assert loop.time() - began < 3.0
    private_redis.kill()
    [told] = await bot.fake.wait_for(lambda f: ephemerals(bot), timeout=20, what="the notice")
    assert told["user"] == APPROVER2 and told["thread_ts"] == ts
    assert told["text"] == conversations.IN_DOUBT.format(run=run_id)

    # Back (from its append-only file); Slack's retry of the event records the reply.
    private_redis.start()
    assert (await send_event(bot, event, event_id="EvDOUBT", retry=1)).status == 200
    await model_called(fake_openai, task, 2)
    await status_is(bot, run_id, RunStatus.COMPLETED)
    assert (await send_event(bot, event, event_id="EvDOUBT", retry=2)).status == 200
    await asyncio.sleep(0.3)
    assert user_texts(fake_openai, task) == [task, "when did Ed join?"]
    assert len(fake_openai.requests_for(task)) == 2


async def test_with_redis_down_a_reply_is_left_for_slack_and_a_dm_is_answered(
    private_bot: BotHarness, private_redis: RedisServer, fake_openai: FakeOpenAI
) -> None:
    bot = private_bot
    task = "chat about user 5"
    fake_openai.script(task, [reply("user 5 is Flo"), reply("Flo is an admin")])
    fake_openai.script("look up user 6", [reply("user 6 is Gus")])
    run_id = await bot.start_task(task)
    ts = await root_of(bot, run_id)
    await thread_shows(bot, ts, "user 5 is Flo")
    await status_is(bot, run_id, RunStatus.COMPLETED)

    private_redis.kill()
    # A reply in some thread: the bot cannot tell whether it is a run's, so it tells nobody
    # and leaves the event unacknowledged: Slack delivers it again later.
    reply_event = message(ts, "is Flo an admin?")
    assert (await send_event(bot, reply_event, event_id="EvREPLY")).status == 500
    # A message to the app itself is answered: its author is told to send it again.
    ask = dm("look up user 6")
    assert (await send_event(bot, ask, event_id="EvDM")).status == 200
    [told] = await bot.fake.wait_for(lambda f: ephemerals(bot), timeout=20, what="the notice")
    assert told["user"] == REQUESTER and told["channel"] == ask["channel"]
    assert told["text"] == conversations.UNAVAILABLE

    private_redis.start()
    assert (await send_event(bot, reply_event, event_id="EvREPLY", retry=1)).status == 200
    await model_called(fake_openai, task, 2)
    assert user_texts(fake_openai, task) == [task, "is Flo an admin?"]
    # The DM was not marked handled either: its redelivery starts the run.
    assert (await send_event(bot, ask, event_id="EvDM", retry=1)).status == 200
    await model_called(fake_openai, "look up user 6", 1)
    assert len(ephemerals(bot)) == 1
