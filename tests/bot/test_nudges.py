"""Reminders and escalation in Slack: one reply each in the card's thread, fired once by two
sweeping workers, surviving a worker restart, never after the decision; the escalation group
may decide only once escalated (card, Approve all, Home); the card tells the next step.

The bot, the workers, Redis and the fake Slack are real (tests/bot/conftest.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from agent_core import Gate, GateStatus, RunStatus
from agent_core.testing import FakeOpenAI, call, calls, reply
from bot import cards
from tests.bot.conftest import (
    APPROVER,
    APPROVER2,
    CHANNEL,
    GROUP,
    REQUESTER,
    BotHarness,
    journal_lines,
    wait_until,
)
from tests.bot.test_assistant import WAITING_AVERY, offering, one_run, open_thread, thread_of
from tests.bot.test_home import home_click, home_shows, open_home, text_of
from tests.slack_fake import FakeSlack

LEADS = "S0LEADS"
LEAD = "U0LEAD"  # a member of LEADS only: not an approver until the gate is escalated
NUDGES = {"REMIND_AFTER": 1, "ESCALATE_AFTER": 2, "ESCALATE_TO": LEADS}
NOT_APPROVER = "You are not on the approver list for this agent (APPROVERS)."


def at(ts: float) -> str:
    """How the bot writes a time of day for Slack to render."""
    return f"<!date^{int(ts)}^{{time}}|{datetime.fromtimestamp(ts, UTC).strftime('%H:%M UTC')}>"


def replies(bot: BotHarness, gate: Gate) -> list[str]:
    """The bot's replies in the task's thread that are not cards or run messages."""
    thread = gate.origin["thread_ts"]
    return [
        m.text
        for m in bot.fake.thread(CHANNEL, thread)
        if m.text.startswith(("⏰ Reminder", "⏫ Escalated"))
    ]


async def gated(bot: BotHarness, fake_openai: FakeOpenAI, task: str) -> Gate:
    fake_openai.script(task, [call("delete_user", {"user_id": "7"}), reply("user 7 deleted")])
    run_id = await bot.start_task(task, user_id=REQUESTER)
    return await bot.gate_of(run_id)


async def now_gate(bot: BotHarness, gate: Gate) -> Gate:
    g = await bot.gateway.get_gate(gate.gate_id)
    assert g is not None
    return g


async def refused(bot: BotHarness, action: str, value: str, user: str, name: str) -> str:
    await bot.client.action(action, value, user_id=user, response_url=bot.fake.response_url(name))
    (r,) = await bot.fake.wait_for(lambda f: f.responses(name))
    return str(r.args["text"])


async def test_the_reminder_and_the_escalation_each_reach_the_card_thread_once(
    make_bot: Callable[..., Awaitable[BotHarness]],
    redis_url: str,
    fake_openai: FakeOpenAI,
    fake_slack: FakeSlack,
    journal: Path,
) -> None:
    fake_slack.set_usergroup(LEADS, [LEAD])
    bot = await make_bot()
    core = bot.start_worker(redis_url, fake_openai.base_url, **NUDGES)
    core.start_worker()  # two sweepers at once
    gate = await gated(bot, fake_openai, "delete user 7")
    assert gate.remind_at is not None and gate.escalate_at is not None
    card = await bot.card(gate.gate_id)
    line = f"⏰ Next: reminding the approvers at {at(gate.remind_at)}, escalating at {at(gate.escalate_at)}"
    assert line in str(card.blocks)
    assert LEADS not in str(card.blocks), "the card pings nobody when it is posted"

    # Before the escalation, the escalation group may not decide.
    text = await refused(bot, "gate_approve", cards.button_value(gate), LEAD, "early")
    assert text == NOT_APPROVER

    await bot.wait_card(gate.gate_id, "⏫ Escalated to")
    await asyncio.sleep(0.5)  # both sweepers swept again; the notifier had time to post more
    g = await now_gate(bot, gate)
    assert g.reminded_at is not None and g.escalated_at is not None
    assert replies(bot, gate) == [
        f"⏰ Reminder for <@{APPROVER}>, <@{APPROVER2}>, <!subteam^{GROUP}>: `delete_user` "
        f"(run `{gate.run_id}`) has waited 1 s for a decision. It expires at {at(g.deadline)}.",
        f"⏫ Escalated to <!subteam^{LEADS}>: `delete_user` (run `{gate.run_id}`) got no "
        f"decision in 2 s. You may now approve or deny it on its card. It expires at "
        f"{at(g.deadline)}.",
    ]
    card = await bot.card(gate.gate_id)
    assert (
        f"⏰ Reminded the approvers at {at(g.reminded_at)} · ⏫ Escalated to "
        f"<!subteam^{LEADS}> at {at(g.escalated_at)}: they may decide too"
    ) in str(card.blocks)
    assert "Next:" not in str(card.blocks)

    # Now the escalation group may decide.
    await bot.client.action("gate_approve", cards.button_value(gate), user_id=LEAD)
    msg = await bot.wait_card(gate.gate_id, "Executed")
    assert f"Approved* by <@{LEAD}>" in str(msg.blocks)
    assert journal_lines(journal) == ["delete_user:7"]
    # After the decision the card keeps what happened, without "they may decide too".
    assert f'<!subteam^{LEADS}> at {at(g.escalated_at)}"' in str(msg.blocks).replace("'", '"')
    assert len(replies(bot, gate)) == 2


async def test_a_worker_restart_loses_neither_step(
    make_bot: Callable[..., Awaitable[BotHarness]],
    redis_url: str,
    fake_openai: FakeOpenAI,
    fake_slack: FakeSlack,
) -> None:
    bot = await make_bot()
    core = bot.start_worker(redis_url, fake_openai.base_url, **NUDGES)
    gate = await gated(bot, fake_openai, "delete user 7")
    worker, task = core.workers[0]
    worker.stop()  # before either step is due
    await asyncio.wait_for(task, 10)
    await asyncio.sleep(2.5)  # both are due now, and nobody sweeps
    assert replies(bot, gate) == []
    core.start_worker()  # a new worker finds them in Redis
    await bot.fake.wait_for(lambda f: len(replies(bot, gate)) == 2, what="both replies")
    await asyncio.sleep(0.3)
    assert [r[:12] for r in replies(bot, gate)] == ["⏰ Reminder f", "⏫ Escalated "]


async def test_nothing_is_posted_after_the_decision(
    make_bot: Callable[..., Awaitable[BotHarness]],
    redis_url: str,
    fake_openai: FakeOpenAI,
    fake_slack: FakeSlack,
) -> None:
    bot = await make_bot()
    bot.start_worker(redis_url, fake_openai.base_url, **NUDGES)
    gate = await gated(bot, fake_openai, "delete user 7")
    await bot.client.action("gate_approve", cards.button_value(gate), user_id=APPROVER)
    msg = await bot.wait_card(gate.gate_id, "Executed")
    await asyncio.sleep(2.5)  # past both steps
    assert replies(bot, gate) == []
    g = await now_gate(bot, gate)
    assert g.reminded_at is None and g.escalated_at is None
    assert "Next:" not in str(msg.blocks) and "Remind" not in str(
        (await bot.card(gate.gate_id)).blocks
    )


async def test_a_reminder_read_after_the_decision_posts_nothing(
    make_bot: Callable[..., Awaitable[BotHarness]],
    redis_url: str,
    fake_openai: FakeOpenAI,
    fake_slack: FakeSlack,
) -> None:
    # The reminder fires, then the gate is decided before the bot gets to gate.reminded (it
    # waits for the card's lock, held here): the bot finds the gate decided and posts nothing,
    # then or when the event is delivered again.
    bot = await make_bot()
    core = bot.start_worker(redis_url, fake_openai.base_url, REMIND_AFTER=1)
    gate = await gated(bot, fake_openai, "delete user 7")
    worker, task = core.workers[0]
    worker.stop()  # the test fires the reminder itself
    await asyncio.wait_for(task, 10)
    await asyncio.sleep(1.1)
    async with bot.server.context.store.lock(f"gate:{gate.gate_id}"):
        res = await core.gateway.scripts.fire_nudge(gate.gate_id, "remind")
        assert res.outcome.value == "fired"
        await core.gateway.decide(gate.gate_id, "deny", by=APPROVER)
    await bot.wait_card(gate.gate_id, "Denied")
    event = await core.wait_event(gate.run_id, "gate.reminded")
    await bot.server.notifier.handle(event)  # delivered again, later still
    await asyncio.sleep(0.3)
    assert replies(bot, gate) == []


async def test_a_redelivered_reminder_posts_once(
    make_bot: Callable[..., Awaitable[BotHarness]],
    redis_url: str,
    fake_openai: FakeOpenAI,
    fake_slack: FakeSlack,
) -> None:
    bot = await make_bot()
    core = bot.start_worker(redis_url, fake_openai.base_url, REMIND_AFTER=1)
    gate = await gated(bot, fake_openai, "delete user 7")
    await bot.fake.wait_for(lambda f: len(replies(bot, gate)) == 1, what="the reminder")
    event = await core.wait_event(gate.run_id, "gate.reminded")
    await asyncio.gather(*(bot.server.notifier.handle(event) for _ in range(3)))
    assert len(replies(bot, gate)) == 1


async def test_the_escalation_group_approves_all_and_on_home_only_once_escalated(
    make_bot: Callable[..., Awaitable[BotHarness]],
    redis_url: str,
    fake_openai: FakeOpenAI,
    fake_slack: FakeSlack,
    journal: Path,
) -> None:
    fake_slack.set_usergroup(LEADS, [LEAD])
    bot = await make_bot()
    bot.start_worker(redis_url, fake_openai.base_url, ESCALATE_AFTER=2, ESCALATE_TO=LEADS)
    await open_home(bot, LEAD)
    await home_shows(bot, LEAD, "Nothing waits for you")
    task = "delete users 1 and 2"
    fake_openai.script(
        task,
        [
            calls([("delete_user", {"user_id": "1"}), ("delete_user", {"user_id": "2"})]),
            reply("both deleted"),
        ],
    )
    run_id = await bot.start_task(task, user_id=REQUESTER)
    first = await bot.gate_of(run_id)
    gates = await bot.gateway.pending_gates(run_id)
    assert len(gates) == 2

    async def turn_posted() -> bool:
        return any("turn_approve_all" in str(m.blocks) for m in bot.fake.messages)

    await wait_until(turn_posted)
    value = cards.turn_value(gates)
    assert await refused(bot, "turn_approve_all", value, LEAD, "all-early") == NOT_APPROVER
    await home_click(bot, cards.APPROVE_ACTION, cards.button_value(first), LEAD)
    assert (await now_gate(bot, first)).status is GateStatus.PENDING
    view = await home_shows(bot, LEAD, NOT_APPROVER)  # what the click came to
    assert "Nothing waits for you" in text_of(view) and first.gate_id not in text_of(view)

    # Escalated: LEAD's Home is refreshed with both gates, and a click there decides.
    view = await home_shows(bot, LEAD, "Waiting for your decision (2)", timeout=10)
    assert first.gate_id in text_of(view)
    await home_click(bot, cards.APPROVE_ACTION, cards.button_value(first), LEAD)
    assert (await now_gate(bot, first)).decided_by == LEAD
    # ...and so does Approve all, for what remains.
    await bot.client.action("turn_approve_all", value, user_id=LEAD)

    async def done() -> bool:
        run = await bot.gateway.get_run(run_id)
        return run is not None and run.status is RunStatus.COMPLETED

    await wait_until(done, timeout=15)
    assert sorted(journal_lines(journal)) == ["delete_user:1", "delete_user:2"]
    assert [g.decided_by for g in await bot.gateway.gates(run_id)] == [LEAD, LEAD]


async def test_in_an_assistant_thread_the_reminder_keeps_the_waiting_status(
    make_bot: Callable[..., Awaitable[BotHarness]],
    redis_url: str,
    fake_openai: FakeOpenAI,
) -> None:
    bot = offering(await make_bot(APPROVERS=APPROVER))
    bot.fake.set_user(APPROVER, "Avery")
    bot.start_worker(redis_url, fake_openai.base_url, REMIND_AFTER=1)
    fake_openai.script("delete user 5", [call("delete_user", {"user_id": "5"}), reply("done")])
    started = await open_thread(bot)
    channel, ts = thread_of(started)
    assert (
        await bot.client.event(bot.fake.assistant_message(started, "delete user 5"))
    ).status == 200
    run = await one_run(bot)
    await bot.gate_of(run.run_id)
    reminder = f"⏰ Reminder for <@{APPROVER}>: `delete_user`"
    await bot.fake.wait_for(
        lambda f: any(m.text.startswith(reminder) for m in f.thread(channel, ts)), what="reminder"
    )
    await asyncio.sleep(0.3)
    # The reply cleared the status line (as Slack does); the bot set it again.
    assert bot.fake.status(channel, ts) == WAITING_AVERY
