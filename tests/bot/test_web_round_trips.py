"""The web process's round trips for one approved click and its run's events, counted on a
real Redis (tests/redis_counting.py): the click's handler (read the gate, decide, update the
card under its lock) and the notifier (the decision, the tool's outcome, the answer).

Reading the events (XREADGROUP, blocked in a loop) and acknowledging them (XACK, batched)
depend on timing, so they are left out; everything else is pinned, so that a change that
adds a round trip per click says so here.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from redis.asyncio import Redis

from agent_core.connections import create_redis
from agent_core.script_loader import source
from agent_core.testing import FakeOpenAI, call, reply
from bot import cards
from tests.bot.conftest import (
    APPROVER,
    CHANNEL,
    BotHarness,
    bot_settings,
    journal_lines,
    wait_until,
)
from tests.redis_counting import record, script_shas
from tests.slack_fake import FakeSlack

STREAMS = {"XREADGROUP", "XACK", "XAUTOCLAIM", "XCLAIM"}


async def none_pending(bot: BotHarness) -> bool:
    """Whether the notifier has acknowledged every event it read."""
    for shard in bot.keys.all_shards():
        info = await bot.redis.xpending(bot.keys.events(shard), "bot")
        if int(info["pending"]):
            return False
    return True


def counted(log: list[str]) -> Counter[str]:
    return Counter(c for c in log if c not in STREAMS)


async def test_an_approved_click_and_its_runs_events_in_round_trips(
    redis: Redis,
    redis_url: str,
    fake_slack: FakeSlack,
    fake_openai: FakeOpenAI,
    journal: Path,
) -> None:
    log: list[str] = []
    rec = create_redis(redis_url)
    record(rec, log, "agent_core", "bot")
    for package in ("agent_core", "bot"):  # loaded: no NOSCRIPT round trip counted
        for name in script_shas(package).values():
            await redis.script_load(source(package, name))
    h = BotHarness(rec, fake_slack, bot_settings(fake_slack))
    h.redis = redis  # the test's own reads are not counted
    await h.start()
    try:
        task = "count my round trips"
        fake_openai.script(task, [call("delete_user", {"user_id": "7"}), reply("all done")])
        h.start_worker(redis_url, fake_openai.base_url)
        run_id = await h.start_task(task)
        gate = await h.gate_of(run_id)
        thread_ts = (await h.gateway.get_run(run_id)).origin["thread_ts"]  # type: ignore[union-attr]
        await fake_slack.wait_for(lambda f: f.shows(CHANNEL, thread_ts, "awaiting approval"))
        await wait_until(lambda: none_pending(h))
        assert h.core is not None
        await h.core.close()  # the decision's events are handled before the run resumes
        h.core = None

        log.clear()
        await h.client.action("gate_approve", cards.button_value(gate), user_id=APPROVER)
        await fake_slack.wait_for(lambda f: f.shows(CHANNEL, thread_ts, "⚙️ running"))
        await wait_until(lambda: none_pending(h))
        click = counted(log)

        log.clear()
        h.start_worker(redis_url, fake_openai.base_url)
        await fake_slack.wait_for(lambda f: f.shows(CHANNEL, thread_ts, "✅ completed"))
        await h.wait_card(gate.gate_id, "Executed")
        await wait_until(lambda: none_pending(h))
        resumed = counted(log)
        assert journal_lines(journal) == ["delete_user:7"]
        # The click: the gate read (who may decide it), the decision, the card updated under
        # its lock; then the notifier, waiting for that update instead of making it again,
        # updates the root message ("running") under its lock, and Home records the
        # decision with its viewers read in the same pipeline.
        assert click == Counter(
            {
                "HGETALL": 1,
                "decide_gate": 1,
                "lock_and_read": 2,
                "release_after_writes": 2,
                "ZADD+ZREMRANGEBYRANK+EXPIRE+ZRANGEBYSCORE": 1,
            }
        ), click
        # tool.executed: its outcome stored as the card's lock is taken, the card updated;
        # run.completed: the run's gates (SMEMBERS, then HGETALL), then the approved call's
        # outcome and the run's sub-agents together, for the answer's heading; the answer
        # posted under the root message's lock (marked posted at once), the root message
        # rendered from the gates read again under it.
        assert resumed == Counter(
            {
                "lock_and_read": 2,
                "release_after_writes": 2,
                "SMEMBERS": 2,
                "HGETALL": 2,
                "HGETALL+SMEMBERS": 1,
                "MULTI+HSET+EXPIRE+EXEC": 1,
            }
        ), resumed
        assert sum(click.values()) + sum(resumed.values()) == 17  # 24 before (2026-12-06)
    finally:
        await h.close()
        await rec.aclose()
