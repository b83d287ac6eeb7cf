"""Crash windows the soak (tests/soak/test_soak.py) runs into, reproduced deterministically.

Each is a way for Slack to tell an approver something that is not true after a process dies
or a run is cancelled at the wrong moment. A bug found here is first pinned as a strict xfail;
when its fix lands, the mark goes and the comment above the test says what was fixed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio import Redis
from slack_sdk.web.async_client import AsyncWebClient

from agent_core import Gateway, Keys
from agent_core.testing import FakeOpenAI, calls, reply
from bot import cards
from bot.publisher import TransientSlackError, card_metadata
from bot.server import BotServer
from tests.bot.conftest import (
    APPROVER,
    CHANNEL,
    REQUESTER,
    SIGNING_SECRET,
    BotHarness,
    bot_settings,
    journal_lines,
    wait_until,
)
from tests.fuzz.pool import GatePool
from tests.redis_server import RedisServer
from tests.security.seen import button_value, live_buttons
from tests.security.webproc import WebProcess, age_pending_events, expire_locks, start_web
from tests.slack_fake import FakeSlack, SlackCall, SlackClient


# --------------------------------------------------------------------------- 1. ack, then crash
@pytest.fixture
async def web_on_private_redis(
    fake_slack: FakeSlack, tmp_path: Path
) -> AsyncIterator[tuple[RedisServer, subprocess.Popen[bytes], str]]:
    server = RedisServer().start()
    try:
        web = await start_web(server.url, fake_slack, tmp_path / "web.log")
        try:
            yield server, web.proc, web.url
        finally:
            web.kill()
    finally:
        server.close()


async def test_an_acknowledged_click_survives_a_web_crash(
    web_on_private_redis: tuple[RedisServer, subprocess.Popen[bytes], str],
    fake_slack: FakeSlack,
) -> None:
    server, web, url = web_on_private_redis
    redis = aioredis.Redis.from_url(server.url, decode_responses=True)
    try:
        pool = await GatePool(redis, Gateway(redis, Keys("t")), runs=1, per_run=1).fill()
        gate_id = pool.gate_ids[0]
        slack = SlackClient(url + "/slack/events", SIGNING_SECRET, fake=fake_slack)
        value = await button_value(fake_slack, gate_id)
        # Writes (EVALSHA included) wait while reads go on: the click's handler reads the gate,
        # then blocks on the decision, as a slow or failing Redis would hold it.
        await redis.execute_command("CLIENT", "PAUSE", "5000", "WRITE")
        click = asyncio.ensure_future(slack.action(cards.APPROVE_ACTION, value, user_id=APPROVER))
        done, _ = await asyncio.wait({click}, timeout=1.0)
        await asyncio.sleep(0.2)
        os.kill(web.pid, signal.SIGKILL)  # the crash
        web.wait(10)
        await redis.execute_command("CLIENT", "UNPAUSE")
        acknowledged = bool(done) and not click.exception() and click.result().status == 200
        if not done:
            click.cancel()
        status = await redis.hget(Keys("t").gate(gate_id), "status")
        assert not acknowledged or status == "approved", (
            f"the click was acknowledged (HTTP 200) and the gate is still {status}"
        )
    finally:
        await redis.aclose()


# --------------------------------------------------------------------------- 2. approved, cancelled
async def test_an_approved_call_of_a_cancelled_run_does_not_show_running(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "two calls, then cancel"
    fake_openai.script(
        task,
        [
            calls([("delete_user", {"user_id": "a"}), ("delete_user", {"user_id": "b"})]),
            reply("never"),
        ],
    )
    run_id = await live.start_task(task, user_id=REQUESTER)

    async def two_cards() -> list[Any]:
        gates = await live.gateway.pending_gates(run_id)
        k = live.keys
        posted = [
            g
            for g in gates
            if await live.redis.hget(k.ext("slack-card", g.gate_id, k.shard_of(g.gate_id)), "ts")
        ]
        return posted if len(posted) == 2 else []

    first, second = await wait_until(two_cards)
    value = await button_value(live.fake, first.gate_id)
    await live.client.action(cards.APPROVE_ACTION, value, user_id=APPROVER)
    await live.wait_card(first.gate_id, "Approved* by")
    await live.client.command(f"cancel {run_id}", user_id=REQUESTER)
    await live.wait_card(second.gate_id, "Cancelled")
    run = await live.gateway.get_run(run_id)
    assert run is not None
    await live.fake.wait_for(lambda f: f.shows(CHANNEL, run.origin["thread_ts"], "cancelled"))
    await asyncio.sleep(0.5)  # every event handled
    assert journal_lines(journal) == [], "the approved call never ran"
    card = json.dumps((await live.card(first.gate_id)).blocks, ensure_ascii=False)
    assert "Running" not in card, "the card claims the call is running"
    assert "not executed" in card


# --------------------------------------------------------------------------- 2b. /agent, then crash
# Fixed in 09da2b7 (ack once the run is in Redis): a crash before start_run used to leave an
# acknowledged command with no run and a root message stuck at "⏳ starting…".
async def test_an_acknowledged_slash_command_survives_a_crash(
    bot: BotHarness, redis: Redis
) -> None:
    task = "start me even if web dies"
    await redis.execute_command("CLIENT", "PAUSE", "3000", "WRITE")
    try:
        sent = asyncio.ensure_future(
            bot.client.command(task, user_id=REQUESTER, channel_id=CHANNEL)
        )
        done, _ = await asyncio.wait({sent}, timeout=1.0)
        await asyncio.sleep(0.2)
        # The process dies: its handler stops wherever it was.
        for t in list(bot.server.context.inflight):
            t.cancel()
    finally:
        await redis.execute_command("CLIENT", "UNPAUSE")
    acknowledged = bool(done) and not sent.exception() and sent.result().status == 200
    if not done:
        sent.cancel()
    await asyncio.sleep(0.2)
    runs = [r for r in await bot.gateway.runs_for_user(REQUESTER) if r.task == task]
    assert not acknowledged or runs, "acknowledged (HTTP 200), yet no run was started"


# --------------------------------------------------------------------------- 3. post, then crash
# Fixed: a web process killed between chat.postMessage and recording the card's ts used to
# leave a second card on redelivery, the first one keeping live buttons forever. The intent
# to post is recorded first, the card carries the gate id as message metadata, and the
# redelivery finds and adopts it (conversations.replies/history, include_all_metadata).
def gate_cards(fake: FakeSlack, gate_id: str) -> list[str]:
    """The ts of every message that is a card of the gate (its metadata names the gate)."""
    return [
        m.ts
        for m in fake.messages
        if (m.metadata or {}).get("event_payload", {}).get("gate_id") == gate_id
    ]


def card_posts(fake: FakeSlack) -> list[SlackCall]:
    return [c for c in fake.calls_to("chat.postMessage") if "metadata" in c.args]


@pytest.fixture
async def publisher_only(
    redis: Redis, fake_slack: FakeSlack
) -> AsyncIterator[tuple[BotServer, GatePool]]:
    """The bot's publisher and store without its notifier: the test hands it the events."""
    gateway = Gateway(redis, Keys("t"))
    server = BotServer(
        bot_settings(fake_slack), redis, gateway, host="127.0.0.1", port=0, run_notifier=False
    )
    pool = await GatePool(redis, gateway, runs=1, per_run=1, slack=server.client).fill()
    yield server, pool


async def crash_after_posting(server: BotServer, gate_id: str) -> None:
    """``show_gate`` in a process that dies right after chat.postMessage answered."""
    store, publisher = server.context.store, server.context.publisher
    store.save_card = _crash  # type: ignore[method-assign,assignment]
    try:
        with pytest.raises(_Crash):
            await publisher.show_gate(gate_id)
    finally:
        del store.save_card  # the class's method again


async def test_a_redelivered_gate_adopts_the_card_posted_before_the_crash(
    publisher_only: tuple[BotServer, GatePool], fake_slack: FakeSlack
) -> None:
    server, pool = publisher_only
    gate_id = pool.gate_ids[0]
    await crash_after_posting(server, gate_id)
    (first,) = gate_cards(fake_slack, gate_id)
    await server.context.publisher.show_gate(gate_id)  # gate.opened, redelivered
    assert gate_cards(fake_slack, gate_id) == [first], "no second card"
    assert len(card_posts(fake_slack)) == 1
    (lookup,) = fake_slack.calls_to("conversations.replies")
    assert lookup.args["include_all_metadata"] in ("1", "true")
    assert (await server.context.store.card(gate_id)).ts == first


async def test_no_card_keeps_live_buttons_after_a_crash_between_post_and_record(
    publisher_only: tuple[BotServer, GatePool], fake_slack: FakeSlack
) -> None:
    server, pool = publisher_only
    publisher = server.context.publisher
    gate_id = pool.gate_ids[0]
    await crash_after_posting(server, gate_id)
    await publisher.show_gate(gate_id)
    await pool.gateway.decide(gate_id, "approve", by=APPROVER)
    await publisher.show_gate(gate_id)  # gate.decided
    assert live_buttons(fake_slack, gate_id) == []
    (card,) = gate_cards(fake_slack, gate_id)
    assert fake_slack.shows(CHANNEL, card, "Approved")


async def test_a_card_outside_a_thread_is_found_in_the_channel(
    redis: Redis, fake_slack: FakeSlack
) -> None:
    gateway = Gateway(redis, Keys("t"))
    server = BotServer(
        bot_settings(fake_slack), redis, gateway, host="127.0.0.1", port=0, run_notifier=False
    )
    pool = await GatePool(redis, gateway, runs=1, per_run=1, threaded=False).fill()
    gate_id = pool.gate_ids[0]
    await crash_after_posting(server, gate_id)
    await server.context.publisher.show_gate(gate_id)
    await gateway.decide(gate_id, "deny", by=APPROVER)
    await server.context.publisher.show_gate(gate_id)
    (card,) = gate_cards(fake_slack, gate_id)
    assert fake_slack.message(CHANNEL, card).thread_ts is None  # type: ignore[union-attr]
    assert fake_slack.calls_to("conversations.history") and live_buttons(fake_slack, gate_id) == []


async def test_when_slack_refuses_the_lookup_the_card_is_posted_again(
    publisher_only: tuple[BotServer, GatePool],
    fake_slack: FakeSlack,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A workspace that never granted the history scopes: the card still gets shown (as
    before the fix, the one posted before the crash is not updated), and the log says so."""
    server, pool = publisher_only
    gate_id = pool.gate_ids[0]
    await crash_after_posting(server, gate_id)
    fake_slack.error_next("conversations.replies", "missing_scope")
    await server.context.publisher.show_gate(gate_id)
    _first, second = gate_cards(fake_slack, gate_id)
    assert (await server.context.store.card(gate_id)).ts == second
    assert "missing_scope" in caplog.text and "posting it again" in caplog.text


async def test_every_message_of_a_gate_is_updated(
    publisher_only: tuple[BotServer, GatePool], fake_slack: FakeSlack
) -> None:
    """Two processes posted the gate's card (one paused past its lock): both are recorded and
    both are updated when the gate is decided."""
    server, pool = publisher_only
    store, publisher = server.context.store, server.context.publisher
    gate_id = pool.gate_ids[0]
    await publisher.show_gate(gate_id)
    gate = await pool.gateway.get_gate(gate_id)
    assert gate is not None
    card = cards.gate_card(gate)
    late = await server.client.chat_postMessage(
        channel=CHANNEL,
        thread_ts=gate.origin["thread_ts"],
        text=card.text,
        blocks=card.blocks,
        metadata=card_metadata(gate_id),
    )
    assert not await store.save_card(gate_id, CHANNEL, str(late["ts"]), "late")
    assert len(live_buttons(fake_slack, gate_id)) == 2
    await pool.gateway.decide(gate_id, "approve", by=APPROVER)
    await publisher.show_gate(gate_id)
    assert live_buttons(fake_slack, gate_id) == []
    assert all(fake_slack.shows(CHANNEL, ts, "Approved") for ts in gate_cards(fake_slack, gate_id))


async def test_a_web_killed_while_posting_a_card_leaves_one_card(
    fake_slack: FakeSlack, tmp_path: Path
) -> None:
    """The real thing: the card is posted and the web process is SIGKILLed before Slack's
    answer reaches it; the restarted web gets the event again, adopts the card, and the click
    on it updates it."""
    server = RedisServer().start()
    redis = aioredis.Redis.from_url(server.url, decode_responses=True)
    webs: list[WebProcess] = []
    try:
        fake_slack.hold("chat.postMessage", when=lambda args: "metadata" in args)
        webs.append(await start_web(server.url, fake_slack, tmp_path / "web.log"))
        slack_api = AsyncWebClient(token=fake_slack.token, base_url=fake_slack.base_url)
        pool = GatePool(redis, Gateway(redis, Keys("t")), runs=1, per_run=1, slack=slack_api)
        await pool.fill()
        gate_id = pool.gate_ids[0]
        await fake_slack.wait_for(lambda f: f.held == 1, what="the card's post, held")
        (posted,) = live_buttons(fake_slack, gate_id)
        webs[0].kill()  # Slack posted the card; the process never learned where
        fake_slack.release()
        # What 30 s bring: the dead process's card lock expires, its events become claimable.
        await expire_locks(redis)
        assert await age_pending_events(redis, webs[0].consumer) >= 1
        webs.append(await start_web(server.url, fake_slack, tmp_path / "web.log"))

        async def adopted() -> bool:
            return bool(
                await redis.hget(
                    Keys("t").ext("slack-card", gate_id, Keys("t").shard_of(gate_id)), "ts"
                )
                == posted
            )

        await wait_until(adopted, timeout=15)
        slack = SlackClient(webs[1].events_url, SIGNING_SECRET, fake=fake_slack)
        value = await button_value(fake_slack, gate_id)  # what the click on the card sends
        resp = await slack.action(cards.APPROVE_ACTION, value, user_id=APPROVER, message_ts=posted)
        assert resp.status == 200
        await fake_slack.wait_for(lambda f: f.shows(CHANNEL, posted, "Approved"), timeout=15)
        assert gate_cards(fake_slack, gate_id) == [posted], "one card, never posted twice"
        assert live_buttons(fake_slack, gate_id) == []
        assert len(card_posts(fake_slack)) == 1
    finally:
        fake_slack.release()
        for web in webs:
            web.kill()
        await redis.aclose()
        server.close()


class _Crash(Exception):
    pass


async def _crash(*args: Any, **kwargs: Any) -> None:
    raise _Crash("the process died here")


async def test_a_card_post_whose_answer_is_lost_is_not_posted_twice(
    publisher_only: tuple[BotServer, GatePool], fake_slack: FakeSlack
) -> None:
    """Slack posts the card but the connection drops before its answer: the Web API client
    must not retry the post (that would leave a first card with live buttons); the event is
    retried and adopts the card."""
    server, pool = publisher_only
    publisher = server.context.publisher
    gate_id = pool.gate_ids[0]
    fake_slack.drop_next("chat.postMessage")
    with pytest.raises(TransientSlackError):
        await publisher.show_gate(gate_id)
    (first,) = gate_cards(fake_slack, gate_id)
    await publisher.show_gate(gate_id)  # gate.opened, redelivered
    assert gate_cards(fake_slack, gate_id) == [first]
    await pool.gateway.decide(gate_id, "approve", by=APPROVER)
    await publisher.show_gate(gate_id)
    assert live_buttons(fake_slack, gate_id) == []
    assert fake_slack.shows(CHANNEL, first, "Approved")
