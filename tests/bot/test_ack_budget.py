"""A decision Redis cannot make durable within the ack budget is not acknowledged as if it were
(a click, the deny form, and the modals that decide: Approve & allow, Edit & approve).

Redis is real and stalled the way a slow or failing server stalls a click: ``CLIENT PAUSE
<ms> WRITE`` lets the handler read the gate and holds its decision script. Slack still gets
its ack in time (it allows 3 s), and the person is told, privately, that nothing is
recorded yet; then that it is, or that it failed. Signed requests to the real Bolt app.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from agent_core import GateStatus, RunStatus
from agent_core.testing import FakeOpenAI, call, reply
from bot import cards, clicks, durable_acks, edit_view, grant_actions, grant_view
from tests.bot import test_edit_cards, test_grant_cards
from tests.bot.conftest import (
    APPROVER,
    CHANNEL,
    BotHarness,
    bot_settings,
    journal_lines,
    wait_until,
)
from tests.bot.test_edit_cards import YES, choice, number, open_modal, values
from tests.bot.test_grant_cards import staging_only
from tests.redis_server import RedisServer
from tests.slack_fake import FakeSlack

PAUSE_MS = 3500
sbot = test_grant_cards.sbot  # the bot serving the shipping agent (grants), and its worker
ebot = test_edit_cards.ebot  # the bot serving the editing agent, and its worker
NOT_YET = "has not been recorded yet: the approval service is not answering"


async def finished(bot: BotHarness, run_id: str) -> Any:
    async def done() -> Any:
        run = await bot.gateway.get_run(run_id)
        return run if run is not None and run.status.finished else None

    return await wait_until(done, timeout=20)


async def pause_writes(redis: aioredis.Redis, ms: int = PAUSE_MS) -> None:
    await redis.execute_command("CLIENT", "PAUSE", str(ms), "WRITE")


async def test_a_stalled_approval_is_acked_and_the_approver_told_until_it_lands(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "delete user 60"
    fake_openai.script(task, [call("delete_user", {"user_id": "60"}), reply("done")])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    fake = live.fake
    loop = asyncio.get_running_loop()

    await pause_writes(live.redis)
    t0 = loop.time()
    resp = await live.client.action(
        cards.APPROVE_ACTION,
        cards.button_value(gate),
        user_id=APPROVER,
        response_url=fake.response_url("stalled"),
    )
    acked_after = loop.time() - t0
    assert resp.status == 200 and acked_after < 3.0, f"Slack needs its ack: {acked_after:.2f} s"
    (warning,) = await fake.wait_for(lambda f: f.responses("stalled"), what="the warning")
    assert warning.args["text"] == durable_acks.NOT_RECORDED_YET.format(what="approval")
    assert (
        warning.args["response_type"] == "ephemeral" and warning.args["replace_original"] is False
    )
    assert "⚠️ Your approval has not been recorded yet" in warning.args["text"]
    assert loop.time() - t0 < PAUSE_MS / 1000, "told while Redis still stalls"
    pending = await live.gateway.get_gate(gate.gate_id)  # reads still work while paused
    assert pending is not None and pending.status is GateStatus.PENDING
    assert cards.APPROVE_ACTION in json.dumps((await live.card(gate.gate_id)).blocks)

    # Redis answers again: the decision lands, once; the approver and the card say so.
    def two(f: FakeSlack) -> list[Any]:
        return f.responses("stalled") if len(f.responses("stalled")) >= 2 else []

    _, recorded = await fake.wait_for(two, timeout=10, what="the all-clear")
    assert recorded.args["text"] == durable_acks.RECORDED_NOW.format(what="approval")
    assert (await finished(live, run_id)).status is RunStatus.COMPLETED
    await live.wait_card(gate.gate_id, "Executed")
    assert journal_lines(journal) == ["delete_user:60"]
    assert len(fake.responses("stalled")) == 2


async def test_a_stalled_denial_keeps_the_form_open_saying_so(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "delete user 61"
    fake_openai.script(task, [call("delete_user", {"user_id": "61"}), reply("not done")])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    fake = live.fake
    await live.client.action(
        cards.DENY_ACTION, cards.button_value(gate), user_id=APPROVER, trigger_id="trig-stall"
    )
    (opened,) = await fake.wait_for(lambda f: f.calls_to("views.open"), what="the deny form")
    view = opened.args["view"]
    values = {cards.REASON_BLOCK: {cards.REASON_ACTION: {"value": "stalled no"}}}
    loop = asyncio.get_running_loop()

    await pause_writes(live.redis)
    t0 = loop.time()
    resp = await live.client.view_submission(
        view["callback_id"], view["private_metadata"], values=values, user_id=APPROVER
    )
    assert resp.status == 200 and loop.time() - t0 < 3.0
    assert resp.json() == {
        "response_action": "errors",
        "errors": {cards.REASON_BLOCK: durable_acks.NOT_RECORDED_FORM},
    }, "the form stays open and says the denial is not recorded"
    assert "could not be recorded" in durable_acks.NOT_RECORDED_FORM
    pending = await live.gateway.get_gate(gate.gate_id)
    assert pending is not None and pending.status is GateStatus.PENDING

    # The denial was already on its way to Redis: once Redis answers it lands, and the
    # approver is told so (a second submission would be told it was denied by them).
    def recorded(f: FakeSlack) -> list[Any]:
        return [
            c
            for c in f.calls_to("chat.postEphemeral")
            if c.args["text"].startswith(durable_acks.RECORDED_NOW.format(what="denial"))
        ]

    (told,) = await fake.wait_for(recorded, timeout=10, what="the all-clear")
    assert (told.args["channel"], told.args["user"]) == (CHANNEL, APPROVER)
    await live.wait_card(gate.gate_id, "Denied* by <@U0APPROVER>")
    assert (await finished(live, run_id)).status is RunStatus.COMPLETED
    assert journal_lines(journal) == []


@pytest.fixture
async def private_redis() -> AsyncIterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.close()


async def test_a_stalled_approval_that_finally_fails_says_so(
    private_redis: RedisServer, fake_slack: FakeSlack, fake_openai: FakeOpenAI, journal: Path
) -> None:
    redis = aioredis.Redis.from_url(private_redis.url, decode_responses=True)
    bot = await BotHarness(redis, fake_slack, bot_settings(fake_slack)).start()
    try:
        bot.start_worker(private_redis.url, fake_openai.base_url)
        task = "delete user 62"
        fake_openai.script(task, [call("delete_user", {"user_id": "62"}), reply("done")])
        run_id = await bot.start_task(task)
        gate = await bot.gate_of(run_id)

        await pause_writes(redis, 10_000)
        resp = await bot.client.action(
            cards.APPROVE_ACTION,
            cards.button_value(gate),
            user_id=APPROVER,
            response_url=fake_slack.response_url("doomed"),
        )
        assert resp.status == 200
        (warning,) = await fake_slack.wait_for(lambda f: f.responses("doomed"))
        assert NOT_YET in warning.args["text"]
        private_redis.kill()  # the decision never reaches a Redis that answers

        def two(f: FakeSlack) -> list[Any]:
            return f.responses("doomed") if len(f.responses("doomed")) >= 2 else []

        _, failed = await fake_slack.wait_for(two, timeout=20, what="the failure notice")
        assert failed.args["text"] == clicks.UNAVAILABLE
        assert "nothing was decided" in failed.args["text"]
        assert journal_lines(journal) == []
    finally:
        if not private_redis.running:
            private_redis.start()  # same port: let the bot and the worker stop cleanly
        await bot.close()
        await redis.aclose()


# --- the modals that decide: Approve & allow, Edit & approve ---------------------------------
def recorded_now(f: FakeSlack) -> list[Any]:
    return [
        c
        for c in f.calls_to("chat.postEphemeral")
        if c.args["text"]
        == durable_acks.RECORDED_NOW.format(what="approval") + " You can close the form."
    ]


async def test_a_stalled_approve_and_allow_keeps_the_form_open_saying_so(
    sbot: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """GRANT_GATE held by a write pause: the modal is answered in time, kept open with a
    note that nothing is recorded yet; once Redis answers, the approval and the grant land
    once and the approver is told privately."""
    fake_openai.script(
        "ship stalled", [call("ship", {"env": "staging", "version": 4}), reply("shipped")]
    )
    run_id = await sbot.start_task("ship stalled")
    gate = await sbot.gate_of(run_id)
    fake = sbot.fake
    await sbot.client.action(
        grant_view.GRANT_ACTION, cards.button_value(gate), user_id=APPROVER, trigger_id="trig-gs"
    )
    (opened,) = await fake.wait_for(lambda f: f.calls_to("views.open"), what="the grant form")
    view = opened.args["view"]
    loop = asyncio.get_running_loop()

    await pause_writes(sbot.redis)
    t0 = loop.time()
    resp = await sbot.client.view_submission(
        view["callback_id"], view["private_metadata"], values=staging_only(gate), user_id=APPROVER
    )
    assert resp.status == 200 and loop.time() - t0 < 3.0, "Slack needs its answer in 3 s"
    assert resp.json() == {
        "response_action": "errors",
        "errors": {grant_view.SCOPE_BLOCK: grant_actions.NOT_RECORDED},
    }, "the form stays open and says the approval is not recorded yet"
    pending = await sbot.gateway.get_gate(gate.gate_id)
    assert pending is not None and pending.status is GateStatus.PENDING

    (told,) = await fake.wait_for(recorded_now, timeout=10, what="the all-clear")
    assert (told.args["channel"], told.args["user"]) == (CHANNEL, APPROVER)
    assert await sbot.redis.hlen(sbot.keys.grants(run_id)) == 1
    assert (await finished(sbot, run_id)).status is RunStatus.COMPLETED
    assert journal_lines(journal) == ["ship:staging:4"]


async def test_a_stalled_edit_and_approve_keeps_the_form_open_saying_so(
    ebot: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """Redis paused for reads and writes (the gate cannot even be read): the edit modal is
    answered in time, the note on its first input; then the edited approval lands once."""
    fake_openai.script(
        "refund A-8",
        [call("refund_order", {"order_id": "A-8", "amount_cents": 4900}), reply("refunded")],
    )
    run_id = await ebot.start_task("refund A-8")
    gate = await ebot.gate_of(run_id)
    view = await open_modal(ebot, cards.button_value(gate), APPROVER, "trig-es")
    good = values(amount_cents=number("2500"), reason=choice("late"), notify=YES)
    loop = asyncio.get_running_loop()

    await ebot.redis.execute_command("CLIENT", "PAUSE", str(PAUSE_MS), "ALL")
    t0 = loop.time()
    resp = await ebot.client.view_submission(
        edit_view.EDIT_CALLBACK, view["private_metadata"], values=good, user_id=APPROVER
    )
    assert resp.status == 200 and loop.time() - t0 < 3.0, "Slack needs its answer in 3 s"
    assert resp.json() == {
        "response_action": "errors",
        "errors": {"arg:amount_cents": edit_view.NOT_RECORDED},
    }

    (told,) = await ebot.fake.wait_for(recorded_now, timeout=10, what="the all-clear")
    assert told.args["user"] == APPROVER
    assert (await finished(ebot, run_id)).status is RunStatus.COMPLETED
    assert journal_lines(journal) == ["refund_order:A-8:2500:late:True"]
