"""Mentions and DMs: ``@agent <task>`` in a channel, or a DM to the app, starts a run."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agent_core import Run, RunStatus
from agent_core.testing import FakeOpenAI, call, reply
from bot import cards, mentions
from bot.mentions import strip_mentions
from tests.bot.conftest import APPROVER, CHANNEL, REQUESTER, BotHarness, wait_until
from tests.bot.test_conversations import continued, ephemerals, send_event

BOT = "U0BOT"  # the fake Slack's bot user
DM = "D0DM"


def _ts() -> str:
    time.sleep(0.001)  # distinct message timestamps
    return f"{time.time():.6f}"


def mention(text: str, user: str = REQUESTER, **extra: Any) -> dict[str, Any]:
    ts = _ts()
    return {
        "type": "app_mention",
        "channel": CHANNEL,
        "user": user,
        "text": text,
        "ts": ts,
        "event_ts": ts,
        **extra,
    }


def dm(text: str, user: str = REQUESTER, **extra: Any) -> dict[str, Any]:
    ts = _ts()
    return {
        "type": "message",
        "channel": DM,
        "channel_type": "im",
        "user": user,
        "text": text,
        "ts": ts,
        "event_ts": ts,
        **extra,
    }


async def runs_of(bot: BotHarness, user: str = REQUESTER) -> list[Run]:
    return await bot.gateway.runs_for_user(user, limit=50)


async def one_run(bot: BotHarness, task: str) -> Run:
    async def started() -> list[Run]:
        return [r for r in await runs_of(bot) if r.task == task]

    runs: list[Run] = await wait_until(started)
    return runs[0]


async def root_ts(bot: BotHarness, run_id: str) -> str:
    async def saved() -> str | None:
        return (await bot.server.context.store.run(run_id)).ts

    ts: str = await wait_until(saved)
    return ts


async def finished(bot: BotHarness, run_id: str) -> None:
    async def done() -> bool:
        r = await bot.gateway.get_run(run_id)
        return r is not None and r.status is RunStatus.COMPLETED

    await wait_until(done, timeout=15)


async def in_thread(bot: BotHarness, channel: str, thread: str, needle: str) -> None:
    await bot.fake.wait_for(
        lambda f: any(needle in m.text for m in f.thread(channel, thread)), what=repr(needle)
    )


def test_strip_mentions() -> None:
    assert strip_mentions("<@U0BOT> delete user 5", BOT) == " delete user 5"
    assert strip_mentions("please <@U0BOT|agent>  ask <@U0ADA>", BOT) == "please ask <@U0ADA>"
    assert strip_mentions("<@U0X> hi <@U0Y>", None) == " hi <@U0Y>"


async def test_a_mention_starts_a_run_in_its_thread_and_a_retry_starts_none(
    live: BotHarness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script(
        "delete user 5",
        [call("delete_user", {"user_id": "5"}), reply("user 5 deleted"), reply("all good")],
    )
    event = mention(f"<@{BOT}> delete user 5")
    resp = await send_event(live, event, event_id="EvMENTION")
    assert resp.status == 200, resp.text
    again = await send_event(live, event, event_id="EvMENTION", retry=1)
    assert again.status == 200, again.text

    run = await one_run(live, "delete user 5")
    assert run.requested_by == REQUESTER
    assert run.origin == {"channel": CHANNEL, "thread_ts": event["ts"], "team": "T0TEST"}
    # The root message is the first reply under the mention; the card follows it there.
    root = live.fake.message(CHANNEL, await root_ts(live, run.run_id))
    assert root is not None and root.thread_ts == event["ts"]
    assert root.text.startswith(f"Task started by <@{REQUESTER}>: delete user 5")
    gate = await live.gate_of(run.run_id)
    assert (await live.card(gate.gate_id)).thread_ts == event["ts"]
    await live.client.action("gate_approve", cards.button_value(gate), user_id=APPROVER)
    await in_thread(live, CHANNEL, event["ts"], "user 5 deleted")

    # The retry started nothing and posted nothing.
    assert [r.run_id for r in await runs_of(live)] == [run.run_id]
    roots = [m for m in live.fake.messages if m.text.startswith("Task started by")]
    assert len(roots) == 1

    await finished(live, run.run_id)
    # In the run's thread, a mention is a reply: it continues the run (whichever of its two
    # events comes first, once: tests/bot/test_message_once.py), and starts no second run.
    later = mention(f"<@{BOT}> thanks", thread_ts=event["ts"])
    await send_event(live, later)
    await send_event(live, {**later, "type": "message", "channel_type": "channel"})
    await in_thread(live, CHANNEL, event["ts"], "all good")
    assert [d["by"] for d in await continued(live, run.run_id)] == [REQUESTER]
    assert [r.run_id for r in await runs_of(live)] == [run.run_id]
    assert ephemerals(live) == []


async def test_a_dm_starts_a_run_answered_in_the_dm_thread(
    live: BotHarness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script(
        "look up user 7",
        [call("lookup", {"key": "user 7"}), reply("user 7 is Ada"), reply("Ada is an admin")],
    )
    event = dm("look up user 7")
    assert (await send_event(live, event)).status == 200
    run = await one_run(live, "look up user 7")
    assert run.origin == {"channel": DM, "thread_ts": event["ts"], "team": "T0TEST"}
    await in_thread(live, DM, event["ts"], "user 7 is Ada")
    root = live.fake.message(DM, await root_ts(live, run.run_id))
    assert root is not None and root.thread_ts == event["ts"]

    await finished(live, run.run_id)
    # A reply in the DM thread continues the run, as in a channel.
    follow = dm("is Ada an admin?", thread_ts=event["ts"])
    await send_event(live, follow)
    await in_thread(live, DM, event["ts"], "Ada is an admin")
    assert [r.run_id for r in await runs_of(live)] == [run.run_id]
    assert ephemerals(live) == []


async def test_an_empty_or_too_long_mention_is_answered_privately(
    live: BotHarness, fake_openai: FakeOpenAI
) -> None:
    await send_event(live, mention(f"<@{BOT}>"))
    [told] = await live.fake.wait_for(lambda f: ephemerals(live))
    assert told["user"] == REQUESTER and told["channel"] == CHANNEL
    assert told["text"] == mentions.EMPTY.format(bot=f"<@{BOT}>")

    await send_event(live, mention(f"<@{BOT}> " + "x" * 2001))
    await live.fake.wait_for(lambda f: len(ephemerals(live)) == 2)
    assert ephemerals(live)[1]["text"] == mentions.TOO_LONG.format(n=2001, limit=2000)
    assert await runs_of(live) == []
    assert live.fake.calls_to("chat.postMessage") == []


async def test_bots_edits_this_app_and_plain_chat_start_nothing(
    live: BotHarness, fake_openai: FakeOpenAI
) -> None:
    ignored = [
        mention(f"<@{BOT}> from a bot", bot_id="B0OTHER"),
        mention(f"<@{BOT}> edited", subtype="message_changed"),
        dm("from a bot", bot_id="B0OTHER"),
        dm("from this app", user=BOT),
        dm("edited", subtype="message_changed"),
        dm("a thread that is no run's", thread_ts="1234.000001"),
        {**dm("plain chat in a channel"), "channel": CHANNEL, "channel_type": "channel"},
    ]
    for event in ignored:
        resp = await send_event(live, event)
        assert resp.status == 200, resp.text
    await asyncio.sleep(0.3)
    assert await runs_of(live) == []
    assert await runs_of(live, BOT) == []
    assert live.fake.calls_to("chat.postMessage") == []
    assert ephemerals(live) == []
