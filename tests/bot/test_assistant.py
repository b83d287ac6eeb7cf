"""Assistant threads (Slack's "Agents & AI Apps"): prompts, runs and the status line.

Signed events go in as Slack sends them (the person's side is played by FakeSlack); the
Web API calls the bot makes come out recorded, and the thread's status line is read as the
person sees it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from agent_core import Agent, Run
from agent_core.testing import FakeOpenAI, call, reply
from bot import assistant, cards
from bot.directory import AgentDirectory
from playground import people
from playground.slack_api import WebApi
from playground.store import Store as PlaygroundStore
from tests.agents import ops
from tests.bot.conftest import (
    APPROVER,
    APPROVER2,
    CHANNEL,
    GROUP,
    GROUP_MEMBER,
    REQUESTER,
    BotHarness,
    wait_until,
)
from tests.bot.test_conversations import continued, ephemerals
from tests.bot.test_mentions import dm, finished, runs_of
from tests.slack_fake import FakeSlack

BOT, BOT_ID = "U0BOT", "B0BOT"  # the fake Slack's bot user
WAITING_AVERY = "is waiting for approval from @Avery"

# The agent whose assistant threads the tests open (AGENT names it, as in the web process).
# The bot's test worker serves tests.agents.ops: this is that agent, offering prompts.
helpdesk = Agent(
    name=ops.name,
    tools=ops.tools,
    instructions="You help with user accounts.",
    description="I look up and change user accounts.",
    suggested_prompts=["Look up user 7", ("Delete a user", "delete user 5")],
)


def offering(bot: BotHarness) -> BotHarness:
    """The bot as a web process configured with AGENT=helpdesk (its prompts are offered)."""
    bot.server.context.agents = AgentDirectory([helpdesk])
    return bot


@pytest.fixture
async def bot(make_bot: Callable[..., Awaitable[BotHarness]]) -> BotHarness:
    return offering(await make_bot())


@pytest.fixture
async def avery(
    make_bot: Callable[..., Awaitable[BotHarness]],
    redis_url: str,
    fake_openai: FakeOpenAI,
    journal: Path,
) -> BotHarness:
    """A bot and worker whose only approver is Avery."""
    bot = offering(await make_bot(APPROVERS=APPROVER))
    bot.fake.set_user(APPROVER, "Avery")
    bot.start_worker(redis_url, fake_openai.base_url)
    return bot


def thread_of(started: dict[str, Any]) -> tuple[str, str]:
    t = started["assistant_thread"]
    return t["channel_id"], t["thread_ts"]


def seen(statuses: list[str]) -> list[str]:
    """The status line as a person watching it sees it change (repeats are invisible)."""
    return [s for i, s in enumerate(statuses) if i == 0 or s != statuses[i - 1]]


async def open_thread(bot: BotHarness, context: str | None = CHANNEL) -> dict[str, Any]:
    started = bot.fake.open_assistant_thread(REQUESTER, context_channel=context)
    resp = await bot.client.event(started)
    assert resp.status == 200, resp.text
    channel, ts = thread_of(started)
    await bot.fake.wait_for(
        lambda f: f.thread(channel, ts) and any(m.bot_id for m in f.thread(channel, ts)),
        what="the greeting",
    )
    return started


async def shown(bot: BotHarness, started: dict[str, Any], needle: str) -> None:
    channel, ts = thread_of(started)
    await bot.fake.wait_for(
        lambda f: any(needle in m.text for m in f.thread(channel, ts)), what=repr(needle)
    )


async def status_becomes(bot: BotHarness, started: dict[str, Any], status: str) -> None:
    channel, ts = thread_of(started)
    await bot.fake.wait_for(lambda f: f.status(channel, ts) == status, what=f"status {status!r}")


async def saw(bot: BotHarness, started: dict[str, Any], statuses: list[str]) -> None:
    """Wait until the thread's status line went through ``statuses``, and no further."""
    channel, ts = thread_of(started)
    try:
        await bot.fake.wait_for(lambda f: seen(f.statuses(channel, ts)) == statuses)
    except AssertionError:
        raise AssertionError(f"the status line went {bot.fake.statuses(channel, ts)}") from None


async def one_run(bot: BotHarness) -> Run:
    runs: list[Run] = await wait_until(lambda: runs_of(bot))
    assert len(runs) == 1
    return runs[0]


async def test_opening_the_assistant_greets_and_offers_the_agents_prompts(
    bot: BotHarness,
) -> None:
    started = bot.fake.open_assistant_thread(REQUESTER, context_channel=CHANNEL)
    # Acknowledged first: Slack hears back while the greeting is still on its way.
    bot.fake.hold("chat.postMessage")
    resp = await bot.client.event(started, event_id="EvSTART")
    assert resp.status == 200, resp.text
    await bot.fake.wait_for(lambda f: f.held == 1, what="the greeting, held")
    bot.fake.release()
    again = await bot.client.event(started, event_id="EvSTART", retry=1)
    assert again.status == 200, again.text
    channel, ts = thread_of(started)

    [offer] = await bot.fake.wait_for(lambda f: f.calls_to("assistant.threads.setSuggestedPrompts"))
    assert offer.ok and offer.args["channel_id"] == channel and offer.args["thread_ts"] == ts
    assert offer.args["prompts"] == [
        {"title": "Look up user 7", "message": "Look up user 7"},
        {"title": "Delete a user", "message": "delete user 5"},
    ]
    greeting = [m for m in bot.fake.thread(channel, ts) if m.bot_id]
    assert len(greeting) == 1
    assert greeting[0].text.startswith(f"Hi <@{REQUESTER}>! I look up and change user accounts.")
    await asyncio.sleep(0.2)  # the retry greeted nobody twice
    assert len(bot.fake.calls_to("assistant.threads.setSuggestedPrompts")) == 1
    assert len(bot.fake.calls_to("chat.postMessage")) == 1

    # The thread's context (the channel the person looks at) is kept, and follows them.
    threads = assistant.ThreadStore(bot.server.context.store)
    assert await threads.find(channel_id=channel, thread_ts=ts) == {
        "channel_id": CHANNEL,
        "team_id": "T0TEST",
    }
    resp = await bot.client.event(bot.fake.assistant_context(started, "C0OTHER"))
    assert resp.status == 200, resp.text

    async def moved() -> bool:
        found = await threads.find(channel_id=channel, thread_ts=ts)
        return found is not None and found.channel_id == "C0OTHER"

    await wait_until(moved)
    assert bot.fake.calls_to("assistant.threads.setStatus") == []


async def test_an_agent_without_prompts_is_offered_none(bot: BotHarness) -> None:
    bot.server.context.agents = AgentDirectory([ops])
    await open_thread(bot, context=None)
    await asyncio.sleep(0.2)
    assert bot.fake.calls_to("assistant.threads.setSuggestedPrompts") == []


async def test_a_run_in_the_thread_says_what_it_does_and_a_follow_up_continues_it(
    avery: BotHarness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script(
        "delete user 5",
        [call("delete_user", {"user_id": "5"}), reply("user 5 deleted"), reply("no user 6 here")],
    )
    started = await open_thread(avery)
    channel, ts = thread_of(started)
    ask = avery.fake.assistant_message(started, "delete user 5")
    assert (await avery.client.event(ask, event_id="EvASK")).status == 200
    assert (await avery.client.event(ask, event_id="EvASK", retry=1)).status == 200

    run = await one_run(avery)
    assert run.origin == {"channel": channel, "thread_ts": ts, "team": "T0TEST", "assistant": True}
    gate = await avery.gate_of(run.run_id)
    assert (await avery.card(gate.gate_id)).thread_ts == ts  # the card is in the thread
    await status_becomes(avery, started, WAITING_AVERY)

    await avery.client.action("gate_approve", cards.button_value(gate), user_id=APPROVER)
    await shown(avery, started, "user 5 deleted")
    steps = [assistant.WORKING, WAITING_AVERY, assistant.WORKING, ""]
    await saw(avery, started, steps)
    assert avery.fake.status(channel, ts) == ""
    await finished(avery, run.run_id)

    # A follow-up in the same thread continues the same run, with its own status line.
    follow = avery.fake.assistant_message(started, "and user 6?")
    assert (await avery.client.event(follow)).status == 200
    await shown(avery, started, "no user 6 here")
    await saw(avery, started, [*steps, assistant.WORKING, ""])
    assert [d["by"] for d in await continued(avery, run.run_id)] == [REQUESTER]
    assert [r.run_id for r in await runs_of(avery)] == [run.run_id]
    roots = [m for m in avery.fake.messages if m.text.startswith("Task started by")]
    assert len(roots) == 1 and roots[0].thread_ts == ts  # the retry started nothing
    assert ephemerals(avery) == []


async def test_bots_and_edits_in_the_thread_start_nothing(
    live: BotHarness, fake_openai: FakeOpenAI
) -> None:
    started = await open_thread(live)
    ts = started["assistant_thread"]["thread_ts"]
    own = live.fake.assistant_message(started, "my own reply", user_id=BOT)
    other = live.fake.assistant_message(started, "another bot")
    edited = live.fake.assistant_message(started, "edited")
    ignored = [
        {**own, "bot_id": BOT_ID, "app_id": "A0APP"},
        {**other, "bot_id": "B0OTHER", "user": "U0OTHERBOT"},
        {
            **edited,
            "subtype": "message_changed",
            "message": {"type": "message", "text": "edited", "thread_ts": ts, "user": REQUESTER},
        },
    ]
    for event in ignored:
        resp = await live.client.event(event)
        assert resp.status == 200, resp.text
    await asyncio.sleep(0.3)
    assert await runs_of(live) == [] and await runs_of(live, BOT) == []
    assert len(live.fake.calls_to("chat.postMessage")) == 1  # the greeting
    assert live.fake.calls_to("assistant.threads.setStatus") == []


async def test_a_dm_run_outside_the_assistant_gets_no_status(
    live: BotHarness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script(
        "delete user 8", [call("delete_user", {"user_id": "8"}), reply("8 gone"), reply("ok")]
    )
    event = dm("delete user 8")
    assert (await live.client.event(event)).status == 200
    run = await one_run(live)
    assert "assistant" not in run.origin
    gate = await live.gate_of(run.run_id)
    await live.client.action("gate_approve", cards.button_value(gate), user_id=APPROVER)
    await finished(live, run.run_id)
    # A reply in that DM thread is bot.conversations' (not the assistant's): it continues.
    await live.client.event(dm("thanks", thread_ts=event["ts"]))
    await live.fake.wait_for(lambda f: any(m.text.endswith("\nok") for m in f.messages))
    assert [d["by"] for d in await continued(live, run.run_id)] == [REQUESTER]
    assert live.fake.calls_to("assistant.threads.setStatus") == []


async def test_a_refused_status_never_stops_the_run_or_the_notifier(
    live: BotHarness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script("look up user 7", [reply("user 7 is Ada")])
    started = await open_thread(live)
    live.fake.error_next("assistant.threads.setStatus", "fatal_error", n=100)
    await live.client.event(live.fake.assistant_message(started, "look up user 7"))
    await shown(live, started, "user 7 is Ada")
    run = await one_run(live)
    await finished(live, run.run_id)
    assert live.fake.calls_to("assistant.threads.setStatus")  # tried, refused, logged


async def test_the_waiting_status_names_the_approvers_as_people_know_them(
    make_bot: Callable[..., Awaitable[BotHarness]], fake_slack: FakeSlack
) -> None:
    fake_slack.set_user(APPROVER, "Avery")
    fake_slack.set_user(APPROVER2, "Blake")
    fake_slack.set_usergroup(GROUP, [GROUP_MEMBER], handle="oncall")

    async def waiting(approvers: str, requested_by: str = REQUESTER, **more: Any) -> str:
        bot = await make_bot(APPROVERS=approvers, **more)
        line = assistant.status_line(bot.server.context.publisher)
        assert line is not None
        return await line.waiting(requested_by)

    both = f"{APPROVER},{APPROVER2},{GROUP}"
    assert await waiting(both) == "is waiting for approval from @Avery, @Blake or @oncall"
    # The requester may not approve their own calls (unless ALLOW_SELF_APPROVAL).
    assert await waiting(both, APPROVER2) == "is waiting for approval from @Avery or @oncall"
    mine = await waiting(both, APPROVER2, ALLOW_SELF_APPROVAL=True)
    assert mine == "is waiting for approval from @Avery, @Blake or @oncall"
    assert await waiting(f"{APPROVER},U0GHOST") == (
        "is waiting for approval from @Avery or another approver"
    )
    assert await waiting("*") == "is waiting for approval"
    assert await waiting("U0GHOST") == "is waiting for approval"


async def test_fake_slack_answers_the_assistant_methods_as_slack_does(
    fake_slack: FakeSlack,
) -> None:
    client = AsyncWebClient(token=fake_slack.token, base_url=fake_slack.base_url)
    started = fake_slack.open_assistant_thread(REQUESTER)
    channel, ts = thread_of(started)
    t = started["assistant_thread"]
    assert started["type"] == "assistant_thread_started" and t["user_id"] == REQUESTER
    assert channel.startswith("D") and t["context"] == {}

    async def error(method: str, **args: Any) -> str:
        with pytest.raises(SlackApiError) as err:
            await client.api_call(f"assistant.threads.{method}", json=args)
        return str(err.value.response["error"])

    five = [{"title": f"p{i}", "message": f"m{i}"} for i in range(5)]
    here: dict[str, Any] = {"channel_id": channel, "thread_ts": ts}
    refused: dict[str, list[tuple[str, dict[str, Any]]]] = {
        "invalid_arguments": [
            ("setStatus", here),  # no status
            ("setStatus", {"channel_id": channel, "status": "x"}),  # no thread_ts
            ("setStatus", {**here, "status": "x", "loading_messages": ["m"] * 11}),
            ("setSuggestedPrompts", {**here, "prompts": five}),  # four at most
            ("setSuggestedPrompts", {"channel_id": channel, "prompts": [{"title": "t"}]}),
            ("setSuggestedPrompts", here),  # no prompts
            ("setTitle", here),  # no title
        ],
        "channel_not_found": [("setStatus", {**here, "channel_id": "D0NONE", "status": "x"})],
        "invalid_thread_ts": [("setTitle", {**here, "thread_ts": "1.000001", "title": "t"})],
    }
    for expected, calls in refused.items():
        for method, args in calls:
            assert await error(method, **args) == expected, (method, args)

    await client.assistant_threads_setSuggestedPrompts(
        channel_id=channel, thread_ts=ts, prompts=five[:4], title="Try"
    )
    await client.assistant_threads_setTitle(channel_id=channel, thread_ts=ts, title="Users")
    await client.assistant_threads_setStatus(channel_id=channel, thread_ts=ts, status="is x…")
    assert fake_slack.status(channel, ts) == "is x…"
    await client.assistant_threads_setStatus(channel_id=channel, thread_ts=ts, status="")
    assert fake_slack.status(channel, ts) == ""
    await client.assistant_threads_setStatus(channel_id=channel, thread_ts=ts, status="is y…")
    await client.chat_postMessage(channel=channel, thread_ts=ts, text="an answer")
    assert fake_slack.status(channel, ts) == ""  # the app's reply cleared it
    assert fake_slack.statuses(channel, ts) == ["is x…", "", "is y…"]


async def test_the_playground_accepts_the_assistant_methods(redis: Redis) -> None:
    store = PlaygroundStore(redis, prefix="pgtest")
    api = WebApi(store, people.WORKSPACE, "xoxb-pg")
    posted = await api.call(
        "chat.postMessage", {"channel": people.CHANNEL_ID, "text": "root"}, "xoxb-pg"
    )
    ts = posted["ts"]
    where = {"channel_id": people.CHANNEL_ID, "thread_ts": ts}

    async def answer(method: str, **args: Any) -> dict[str, Any]:
        return await api.call(method, args, "xoxb-pg")

    assert await answer("assistant.threads.setStatus", **where, status="is working…") == {
        "ok": True
    }
    assert await store.status(people.CHANNEL_ID, ts) == "is working…"
    prompts = [{"title": "a", "message": "b"}]
    assert (await answer("assistant.threads.setSuggestedPrompts", **where, prompts=prompts))["ok"]
    assert (await answer("assistant.threads.setTitle", **where, title="t"))["ok"]
    assert (await answer("assistant.threads.setStatus", **where))["error"] == "invalid_arguments"
    assert (await answer("assistant.threads.setStatus", channel_id="D0X", thread_ts=ts, status=""))[
        "error"
    ] == "channel_not_found"
    groups = (await answer("usergroups.list"))["usergroups"]
    assert {g["handle"] for g in groups} == {"oncall", "finance"}
