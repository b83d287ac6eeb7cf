"""Crash windows the soak (tests/soak/test_soak.py) runs into, reproduced deterministically.

Each is a way for Slack to tell an approver something that is not true after a process dies
or a run is cancelled at the wrong moment. They are bugs in bot/ (strict xfail tests: when a
fix lands, the test passes and the mark must go). The "what happens today" tests pin the
mechanism each xfail relies on.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis
from redis.asyncio import Redis

from agent_core import Gateway, Keys
from agent_core.testing import FakeOpenAI, calls, reply
from bot import cards
from bot.server import BotServer
from bot.testing import FakeSlack, SlackClient
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
from tests.redis_server import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]


def live_buttons(fake: FakeSlack, gate_id: str) -> list[str]:
    """The ts of every message that still offers Approve/Deny for the gate."""
    out = []
    for m in fake.messages:
        for b in m.blocks:
            if b.get("type") == "actions" and any(
                e.get("value") == gate_id and e.get("action_id") == cards.APPROVE_ACTION
                for e in b.get("elements", [])
            ):
                out.append(m.ts)
    return out


# --------------------------------------------------------------------------- 1. ack, then crash
@pytest.fixture
async def web_on_private_redis(
    fake_slack: FakeSlack, tmp_path: Path
) -> AsyncIterator[tuple[RedisServer, subprocess.Popen[bytes], str]]:
    server = RedisServer().start()
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": str(ROOT),
        "REDIS_URL": server.url,
        "KEY_PREFIX": "t",
        "AGENT": "tests.agents:ops",
        "SLACK_BOT_TOKEN": fake_slack.token,
        "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "SLACK_API_URL": fake_slack.base_url,
        "APPROVERS": APPROVER,
        "PORT": str(port),
    }
    with (tmp_path / "web.log").open("wb") as log:
        web = subprocess.Popen(
            [sys.executable, "-m", "bot"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"

    async def healthy() -> bool:
        assert web.poll() is None, (tmp_path / "web.log").read_text()
        try:
            async with aiohttp.ClientSession() as s, s.get(url + "/healthz") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False

    try:
        await wait_until(healthy, timeout=30, interval=0.05)
        yield server, web, url
    finally:
        if web.poll() is None:
            os.kill(web.pid, signal.SIGKILL)
            web.wait(10)
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
        # Writes (EVALSHA included) wait while reads go on: the click's handler reads the gate,
        # then blocks on the decision, as a slow or failing Redis would hold it.
        await redis.execute_command("CLIENT", "PAUSE", "5000", "WRITE")
        click = asyncio.ensure_future(slack.action(cards.APPROVE_ACTION, gate_id, user_id=APPROVER))
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
        posted = [g for g in gates if await live.redis.hget(k.ext("slack-card", g.gate_id), "ts")]
        return posted if len(posted) == 2 else []

    first, second = await wait_until(two_cards)
    await live.client.action(cards.APPROVE_ACTION, first.gate_id, user_id=APPROVER)
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


async def test_a_crash_between_posting_a_card_and_recording_it_posts_it_twice(
    publisher_only: tuple[BotServer, GatePool],
    fake_slack: FakeSlack,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What happens today (the mechanism of the xfail below)."""
    server, pool = publisher_only
    store, publisher = server.context.store, server.context.publisher
    gate_id = pool.gate_ids[0]
    with monkeypatch.context() as m:
        m.setattr(store, "save_card", _crash)  # dies right after chat.postMessage answered
        with pytest.raises(_Crash):
            await publisher.show_gate(gate_id)
    await publisher.show_gate(gate_id)  # gate.opened, redelivered to the restarted web
    assert len(live_buttons(fake_slack, gate_id)) == 2, "two cards, both with buttons"


@pytest.mark.xfail(
    strict=True,
    reason=(
        "Publisher.show_gate posts a card (chat.postMessage), then records where it is "
        "(Store.save_card). A web process that dies in between leaves the event unacknowledged; "
        "its redelivery posts a second card, and the first one is never updated again: it "
        "keeps live Approve/Deny buttons after the gate is decided (invariant 7). Fix: make "
        "the post idempotent, e.g. attach the gate id as message metadata and, before posting, "
        "look for it in the thread (conversations.replies with include_all_metadata), or "
        "record each posted ts and update every card of the gate."
    ),
)
async def test_no_card_keeps_live_buttons_after_a_crash_between_post_and_record(
    publisher_only: tuple[BotServer, GatePool],
    fake_slack: FakeSlack,
    redis: Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, pool = publisher_only
    store, publisher = server.context.store, server.context.publisher
    gate_id = pool.gate_ids[0]
    with monkeypatch.context() as m:
        m.setattr(store, "save_card", _crash)
        with pytest.raises(_Crash):
            await publisher.show_gate(gate_id)
    await publisher.show_gate(gate_id)
    await pool.gateway.decide(gate_id, "approve", by=APPROVER)
    await publisher.show_gate(gate_id)  # gate.decided
    assert live_buttons(fake_slack, gate_id) == []


class _Crash(Exception):
    pass


async def _crash(*args: Any, **kwargs: Any) -> None:
    raise _Crash("the process died here")
