"""Hostile requests against the bot's real HTTP endpoint: replays, stale or forged signatures
on clicks, button values naming other gates, users outside APPROVERS.

tests/bot/test_http.py already covers forged and stale signatures of slash commands, unknown
gate ids in buttons and malformed payloads; tests/bot/test_flow.py covers strangers and the
requester clicking the buttons. This file covers what they leave out.

What Bolt does with a replay: nothing. It checks the signature and that the timestamp is
within five minutes, and keeps no record of requests, so the same signed body sent again
within five minutes is processed again. The bot must therefore be idempotent per request.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest
from redis.asyncio import Redis

from agent_core import Gate, GateStatus
from agent_core.testing import FakeOpenAI, call, reply
from bot import cards
from tests.bot.conftest import (
    APPROVER,
    APPROVER2,
    CHANNEL,
    REQUESTER,
    SIGNING_SECRET,
    STRANGER,
    BotHarness,
    journal_lines,
    wait_until,
)
from tests.fuzz.pool import GatePool, settle
from tests.security.seen import button_value
from tests.slack_fake import FakeSlack, HttpResult, SlackClient, sign

REQUESTER2 = "U0REQTWO"


async def post_signed(client: SlackClient, body: str, timestamp: str) -> HttpResult:
    return await client.post(
        body, timestamp=timestamp, signature=sign(SIGNING_SECRET, timestamp, body)
    )


def click_body(
    client: SlackClient,
    action_id: str,
    value: str,
    user_id: str,
    fake: FakeSlack,
    name: str,
    **kw: Any,
) -> str:
    payload = client.action_payload(
        action_id, value, user_id=user_id, response_url=fake.response_url(name), **kw
    )
    return urlencode({"payload": json.dumps(payload)})


async def gate_state(bot: BotHarness, gate_id: str) -> Gate:
    gate = await bot.gateway.get_gate(gate_id)
    assert gate is not None
    return gate


async def finished(bot: BotHarness, run_id: str) -> None:
    async def done() -> bool:
        run = await bot.gateway.get_run(run_id)
        return run is not None and run.status.finished

    await wait_until(done, timeout=15)


# --------------------------------------------------------------------------- replays
async def test_a_replayed_approve_click_decides_once_and_runs_once(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "replay the approval"
    fake_openai.script(task, [call("delete_user", {"user_id": "r1"}), reply("ok")])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    fake = live.fake
    value = await button_value(fake, gate.gate_id)  # what a click on the card sends
    body = click_body(live.client, cards.APPROVE_ACTION, value, APPROVER, fake, "once")
    ts = str(int(time.time()))

    first = await post_signed(live.client, body, ts)
    assert first.status == 200
    await finished(live, run_id)
    decided = await gate_state(live, gate.gate_id)
    assert decided.status is GateStatus.APPROVED and decided.decided_by == APPROVER

    # The very same bytes, timestamp and signature, as an eavesdropper would replay them.
    again = await post_signed(live.client, body, ts)
    assert again.status == 200, "Bolt accepts it: it keeps no record of requests"
    await settle(live)
    replies = await fake.wait_for(lambda f: f.responses("once") if len(f.responses("once")) else [])
    assert any("Already approved by <@U0APPROVER>" in r.args["text"] for r in replies)
    after = await gate_state(live, gate.gate_id)
    assert after.decided_at == decided.decided_at, "decided once"
    assert journal_lines(journal) == ["delete_user:r1"], "ran once"


async def test_a_replayed_deny_submission_decides_once(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "replay the denial"
    fake_openai.script(task, [call("delete_user", {"user_id": "r2"}), reply("not done")])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    meta = json.dumps({"gate_id": gate.gate_id, "channel": CHANNEL})
    values = {cards.REASON_BLOCK: {cards.REASON_ACTION: {"value": "first reason"}}}
    payload = live.client.view_payload(cards.DENY_CALLBACK, meta, values, user_id=APPROVER)
    body = urlencode({"payload": json.dumps(payload)})
    ts = str(int(time.time()))
    assert (await post_signed(live.client, body, ts)).status == 200
    await finished(live, run_id)
    # Replayed, and replayed with a different reason by someone else (a second approver).
    assert (await post_signed(live.client, body, ts)).status == 200
    values2 = {cards.REASON_BLOCK: {cards.REASON_ACTION: {"value": "second reason"}}}
    await live.client.view_submission(cards.DENY_CALLBACK, meta, values=values2, user_id=APPROVER2)
    await settle(live)
    final = await gate_state(live, gate.gate_id)
    assert (final.status, final.decided_by, final.reason) == (
        GateStatus.DENIED,
        APPROVER,
        "first reason",
    )
    assert journal_lines(journal) == []


async def test_a_replayed_slash_command_starts_one_run(bot: BotHarness) -> None:
    body = bot.client.command_body("start exactly once", user_id=REQUESTER, channel_id=CHANNEL)
    ts = str(int(time.time()))
    assert (await post_signed(bot.client, body, ts)).status == 200
    assert (await post_signed(bot.client, body, ts)).status == 200
    await settle(bot)
    await asyncio.sleep(0.2)
    runs = [r for r in await bot.gateway.runs_for_user(REQUESTER) if r.task == "start exactly once"]
    assert len(runs) == 1, f"{len(runs)} runs started by one command"


# --------------------------------------------------------------------------- stale / forged clicks
@pytest.fixture
async def pool(bot: BotHarness, redis: Redis) -> GatePool:
    return await GatePool(redis, bot.gateway, runs=2, per_run=1, slack=bot.server.client).fill()


async def test_stale_future_and_forged_clicks_change_nothing(
    bot: BotHarness, pool: GatePool, redis: Redis
) -> None:
    gate_id = pool.gate_ids[0]
    fake = bot.fake
    await pool.carded()
    value = await button_value(fake, gate_id)
    body = click_body(bot.client, cards.APPROVE_ACTION, value, APPROVER, fake, "stale")
    now = int(time.time())
    before = sorted(await redis.keys("*"))
    attempts = [
        (str(now - 301), sign(SIGNING_SECRET, str(now - 301), body)),  # replayed too late
        (str(now + 301), sign(SIGNING_SECRET, str(now + 301), body)),
        (str(now) + ".0", sign(SIGNING_SECRET, str(now) + ".0", body)),
        ("1e10", sign(SIGNING_SECRET, "1e10", body)),
        ("-1", sign(SIGNING_SECRET, "-1", body)),
        ("9" * 40, sign(SIGNING_SECRET, "9" * 40, body)),
        (str(now), sign("not-the-secret", str(now), body)),
        (str(now), sign(SIGNING_SECRET, str(now), body).replace("v0=", "v1=")),
        (str(now), sign(SIGNING_SECRET, str(now), body).upper()),
        (str(now), sign(SIGNING_SECRET, str(now - 1), body)),  # signature of another timestamp
        (str(now), sign(SIGNING_SECRET, str(now), body.replace(APPROVER, STRANGER))),
    ]
    for ts, sig in attempts:
        resp = await bot.client.post(body, timestamp=ts, signature=sig)
        assert resp.status == 401, (ts, sig, resp.text)
    await settle(bot)
    assert await pool.changes() == {}
    assert sorted(await redis.keys("*")) == before
    assert not fake.responses("stale")
    # The same click, signed now, is accepted.
    resp = await post_signed(bot.client, body, str(int(time.time())))
    assert resp.status == 200
    await settle(bot)
    assert [g.gate_id for g in await pool.changes()] == [gate_id]


async def test_an_unsigned_body_that_is_not_utf8_is_refused_like_any_forgery(
    bot: BotHarness, pool: GatePool
) -> None:
    ts = str(int(time.time()))
    raw = b"payload=%7B%7D&x=\xff\xfe"
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": "v0=" + "0" * 64,
    }
    async with aiohttp.ClientSession() as s, s.post(bot.client.url, data=raw, headers=headers) as r:
        status = r.status
    assert status in (400, 401), status
    assert (await bot.client.command("help")).status == 200


# --------------------------------------------------------------------------- other gates, ids
async def test_a_button_value_naming_a_gate_of_another_run(
    bot: BotHarness, redis: Redis, fake_slack: FakeSlack
) -> None:
    """The value decides, never the message the button sat on; its own checks apply.

    The card of run A carries gate A's id. A request that carries gate B's id instead (only
    Slack can sign it, so only a tampered or buggy client) is a decision about gate B, checked
    against gate B's requester and the approver list, and gate A does not move.
    """
    pool = GatePool(redis, bot.gateway, runs=1, per_run=1, slack=bot.server.client)
    await pool.fill()
    gate_a = pool.gates[0]
    other = GatePool(redis, bot.gateway, runs=1, per_run=1, slack=bot.server.client)
    await other.fill()
    gate_b = other.gates[0]
    # Gate B's run is someone else's: make REQUESTER2 its requester.
    await redis.hset(bot.keys.gate(gate_b.gate_id), "requested_by", REQUESTER2)
    card_a_ts = await wait_until(
        lambda: redis.hget(
            bot.keys.ext("slack-card", gate_a.gate_id, bot.keys.shard_of(gate_a.gate_id)), "ts"
        )
    )
    on_card_a: dict[str, Any] = {"message_ts": card_a_ts, "channel_id": CHANNEL}

    # The requester of run B may not approve B from A's card either.
    await bot.client.action(
        cards.APPROVE_ACTION,
        gate_b.gate_id,
        user_id=REQUESTER2,
        response_url=fake_slack.response_url("selfb"),
        **on_card_a,
    )
    (r,) = await fake_slack.wait_for(lambda f: f.responses("selfb"))
    assert "ALLOW_SELF_APPROVAL" in r.args["text"]
    # A stranger may not.
    await bot.client.action(
        cards.APPROVE_ACTION,
        gate_b.gate_id,
        user_id=STRANGER,
        response_url=fake_slack.response_url("strangerb"),
        **on_card_a,
    )
    (r,) = await fake_slack.wait_for(lambda f: f.responses("strangerb"))
    assert "not on the approver list" in r.args["text"]
    await settle(bot)
    assert (await gate_state(bot, gate_a.gate_id)).status is GateStatus.PENDING
    assert (await gate_state(bot, gate_b.gate_id)).status is GateStatus.PENDING

    # An approver: gate B is decided (it is named), gate A is not.
    value_b = await button_value(fake_slack, gate_b.gate_id)
    await bot.client.action(cards.APPROVE_ACTION, value_b, user_id=APPROVER, **on_card_a)
    await settle(bot)
    assert (await gate_state(bot, gate_a.gate_id)).status is GateStatus.PENDING
    assert (await gate_state(bot, gate_b.gate_id)).status is GateStatus.APPROVED
    await bot.wait_card(gate_b.gate_id, "Approved* by <@U0APPROVER>")
    card_a = await bot.card(gate_a.gate_id)
    assert "gate_approve" in json.dumps(card_a.blocks), "card A still pending, buttons live"


async def test_random_gate_ids_in_buttons_and_deny_forms_decide_nothing(
    bot: BotHarness, pool: GatePool, redis: Redis
) -> None:
    fake = bot.fake
    await pool.carded()
    before = sorted(await redis.keys("*"))
    for i in range(3):
        gid = secrets.token_urlsafe(18)  # a well-formed id that no gate has
        for action in (cards.APPROVE_ACTION, cards.DENY_ACTION, cards.ARGS_ACTION):
            resp = await bot.client.action(
                action, gid, user_id=APPROVER, response_url=fake.response_url(f"rnd{i}")
            )
            assert resp.status == 200
        meta = json.dumps({"gate_id": gid, "channel": CHANNEL})
        assert (
            await bot.client.view_submission(cards.DENY_CALLBACK, meta, user_id=APPROVER)
        ).status == 200
    await settle(bot)
    assert await pool.changes() == {}
    assert sorted(await redis.keys("*")) == before, "not even a key was created"
    assert not fake.calls_to("views.open"), "no form for a gate that does not exist"
    told = [
        c.args.get("text", "") for c in fake.calls if "does not exist" in str(c.args.get("text"))
    ]
    assert len(told) == 12, [c.method for c in fake.calls]


async def test_deny_form_submitted_by_users_who_may_not_deny(
    bot: BotHarness, pool: GatePool, fake_slack: FakeSlack
) -> None:
    """The deny form is opened only for approvers, but its submission is checked again."""
    gate = pool.gates[0]
    meta = json.dumps({"gate_id": gate.gate_id, "channel": CHANNEL})
    values = {cards.REASON_BLOCK: {cards.REASON_ACTION: {"value": "nope"}}}
    for user in (STRANGER, "W0OTHERORG", "U0approver", APPROVER + " "):
        resp = await bot.client.view_submission(
            cards.DENY_CALLBACK, meta, values=values, user_id=user
        )
        assert resp.status == 200
    # No user at all, and a user object that is not one.
    for user_obj in ({}, {"id": ""}, {"id": None}, None):
        payload = bot.client.view_payload(cards.DENY_CALLBACK, meta, values)
        payload["user"] = user_obj
        assert (await bot.client.payload(payload)).status == 200
    await settle(bot)
    assert await pool.changes() == {}
    told = [
        c
        for c in fake_slack.calls_to("chat.postEphemeral")
        if "not on the approver list" in c.args["text"]
    ]
    assert len(told) == 4
    # The requester may deny their own call (docs/getting-started/using-slack.md: "The
    # starter may always deny their run's calls").
    await bot.client.view_submission(cards.DENY_CALLBACK, meta, values=values, user_id=REQUESTER)
    await settle(bot)
    assert (await gate_state(bot, gate.gate_id)).status is GateStatus.DENIED


async def test_approvers_list_with_only_a_group_that_cannot_be_read_approves_nobody(
    make_bot: Any, redis: Redis, fake_slack: FakeSlack
) -> None:
    bot: BotHarness = await make_bot(APPROVERS="S0BROKEN")
    pool = await GatePool(redis, bot.gateway, runs=1, per_run=1, slack=bot.server.client).fill()
    fake_slack.error_next("usergroups.users.list", "missing_scope", n=5)
    await bot.client.action(
        cards.APPROVE_ACTION,
        pool.gate_ids[0],
        user_id=APPROVER,
        response_url=fake_slack.response_url("grp"),
    )
    (r,) = await fake_slack.wait_for(lambda f: f.responses("grp"))
    assert "could not be checked" in r.args["text"]
    await settle(bot)
    assert await pool.changes() == {}
