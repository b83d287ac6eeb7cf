"""Whoever spoke to the agent is a requester (DESIGN invariant 10).

A call's requesters are everyone whose message the model had read when it asked for the
call: the run's starter and everyone who replied in its thread before that turn. None of
them may approve it (unless ALLOW_SELF_APPROVAL), by a card button or by "Approve all", and
the card names them all. Each scenario walks the real bot, worker, Redis and fakes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_core import GateStatus, RunStatus
from agent_core.testing import FakeOpenAI, call, calls, reply
from bot import cards
from tests.bot.conftest import (
    APPROVER,
    APPROVER2,
    REQUESTER,
    STRANGER,
    BotHarness,
    journal_lines,
)
from tests.bot.test_approve_all import all_message, buttons
from tests.bot.test_conversations import message, root_of, send_event, status_is, thread_shows


async def say(bot: BotHarness, run_id: str, ts: str, text: str, user: str) -> None:
    """``user`` replies ``text`` in the run's thread, signed as Slack sends it."""
    resp = await send_event(bot, message(ts, text, user=user))
    assert resp.status == 200, resp.text


async def answered_then_reply(
    bot: BotHarness, task: str, starter: str, answer: str, text: str, user: str
) -> tuple[str, str]:
    """``starter`` runs ``task``; once the run has answered ``answer`` and completed, ``user``
    replies ``text`` in its thread. The run id and the thread's ts."""
    run_id = await bot.start_task(task, user_id=starter)
    ts = await root_of(bot, run_id)
    await thread_shows(bot, ts, answer)
    await status_is(bot, run_id, RunStatus.COMPLETED)
    await say(bot, run_id, ts, text, user=user)
    return run_id, ts


async def click(bot: BotHarness, action: str, value: str, user: str, name: str) -> str:
    """A click answered privately (``respond``); the text the clicker was shown."""
    await bot.client.action(action, value, user_id=user, response_url=bot.fake.response_url(name))
    (r,) = await bot.fake.wait_for(lambda f: f.responses(name), what=name)
    return str(r.args["text"])


async def test_an_approver_who_asked_in_the_thread_cannot_approve_after_someone_else_replied(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    # The approver asks for a deletion in the thread; a bystander's "ok" comes last. The
    # call is hers as much as the starter's and the bystander's.
    fake_openai.script(
        "tidy up the accounts",
        [
            reply("Which accounts?"),
            reply("Shall I delete user 8?"),
            call("delete_user", {"user_id": "8"}),
            reply("user 8 is gone"),
        ],
    )
    run_id = await live.start_task("tidy up the accounts", user_id=REQUESTER)
    ts = await root_of(live, run_id)
    await thread_shows(live, ts, "Which accounts?")
    await say(live, run_id, ts, "also delete user 8", user=APPROVER)
    await thread_shows(live, ts, "Shall I delete user 8?")
    await status_is(live, run_id, RunStatus.COMPLETED)
    await say(live, run_id, ts, "ok", user=STRANGER)
    gate = await live.gate_of(run_id)

    assert gate.requested_by == REQUESTER
    assert gate.requesters == [REQUESTER, APPROVER, STRANGER]
    card = await live.wait_card(gate.gate_id, "thread:")
    assert f"*Requested by*\\n<@{REQUESTER}> (thread: <@{APPROVER}>, <@{STRANGER}>)" in str(
        card.blocks
    )

    told = await click(live, "gate_approve", cards.button_value(gate), APPROVER, "self")
    assert "one of its requesters" in told and "ALLOW_SELF_APPROVAL" in told
    assert (await live.gateway.get_gate(gate.gate_id)).status is GateStatus.PENDING  # type: ignore[union-attr]
    assert journal_lines(journal) == []

    await live.client.action("gate_approve", cards.button_value(gate), user_id=APPROVER2)
    await thread_shows(live, ts, "user 8 is gone")
    assert journal_lines(journal) == ["delete_user:8"]


async def test_the_starter_cannot_approve_after_a_bystander_replied(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script(
        "clean up user 9",
        [reply("Delete user 9?"), call("delete_user", {"user_id": "9"}), reply("done")],
    )
    run_id, ts = await answered_then_reply(
        live, "clean up user 9", APPROVER2, "Delete user 9?", "hm", STRANGER
    )
    gate = await live.gate_of(run_id)
    assert gate.requesters == [APPROVER2, STRANGER]

    told = await click(live, "gate_approve", cards.button_value(gate), APPROVER2, "own")
    assert "You asked for this run" in told
    assert (await live.gateway.get_gate(gate.gate_id)).status is GateStatus.PENDING  # type: ignore[union-attr]
    # The bystander is no approver at all.
    told = await click(live, "gate_approve", cards.button_value(gate), STRANGER, "stranger")
    assert "not on the approver list" in told

    await live.client.action("gate_approve", cards.button_value(gate), user_id=APPROVER)
    await thread_shows(live, ts, "done")
    assert journal_lines(journal) == ["delete_user:9"]


async def test_approve_all_refuses_a_requester_from_the_thread(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script(
        "two deletions",
        [
            reply("Which two?"),
            calls([("delete_user", {"user_id": "3"}), ("delete_user", {"user_id": "4"})]),
            reply("both gone"),
        ],
    )
    run_id, ts = await answered_then_reply(
        live, "two deletions", REQUESTER, "Which two?", "users 3 and 4", APPROVER
    )
    gates, msg = await all_message(live, run_id)
    value = buttons(msg)[cards.TURN_APPROVE_ACTION]["value"]

    told = await click(live, cards.TURN_APPROVE_ACTION, value, APPROVER, "all")
    assert "one of its requesters" in told
    for g in gates:
        got: Any = await live.gateway.get_gate(g.gate_id)
        assert got.status is GateStatus.PENDING
    assert journal_lines(journal) == []

    await click(live, cards.TURN_APPROVE_ACTION, value, APPROVER2, "boss")
    await thread_shows(live, ts, "both gone")
    assert sorted(journal_lines(journal)) == ["delete_user:3", "delete_user:4"]


async def test_with_self_approval_allowed_a_thread_requester_may_approve(
    make_bot: Any, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    bot = await make_bot(ALLOW_SELF_APPROVAL="true")
    bot.start_worker(redis_url, fake_openai.base_url)
    fake_openai.script(
        "remove user 5",
        [reply("Sure?"), call("delete_user", {"user_id": "5"}), reply("removed")],
    )
    run_id, ts = await answered_then_reply(
        bot, "remove user 5", REQUESTER, "Sure?", "yes", APPROVER
    )
    gate = await bot.gate_of(run_id)
    assert gate.requesters == [REQUESTER, APPROVER]
    await bot.client.action("gate_approve", cards.button_value(gate), user_id=APPROVER)
    await thread_shows(bot, ts, "removed")
    assert journal_lines(journal) == ["delete_user:5"]
