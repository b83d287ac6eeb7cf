"""Unbounded output: a long answer is a few messages and a file, and one Slack thread held up by
Slack (a long answer, a 429 with Retry-After) never holds up another thread's cards.

The bot, the worker, Redis, the fake Slack (with Slack's ~1 message a second per channel
enforced) and the fake model all run for real.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agent_core import Gate, RunStatus
from agent_core.events import parse_event
from agent_core.streams import StreamMessage
from agent_core.testing import FakeOpenAI, call, reply
from bot import answers
from bot import notifier as notifier_module
from bot.notifier import Notifier
from bot.publisher import RateLimited
from tests.bot.conftest import CHANNEL, REQUESTER, BotHarness, wait_until

OTHER = "C0OTHER"  # a second channel, with its own posting limit
# What a loaded 2-core machine needs to post a card whose thread is not held up; the hole
# held such a card back for as long as the other thread's answer took (45 s and more).
CARD_BOUND_SECONDS = 8.0


def long_answer(kb: int) -> str:
    para = "The quarterly numbers, line by line, with every figure the report needs. " * 12
    out, i = [], 0
    while sum(len(p) for p in out) < kb * 1024:
        out.append(f"## Section {i}\n{para}\n")
        i += 1
    return "\n".join(out) + "\nEND OF REPORT"


async def start_in(bot: BotHarness, task: str, channel: str) -> str:
    """``/agent <task>`` in ``channel``; the run id."""
    resp = await bot.client.command(task, user_id=REQUESTER, channel_id=channel)
    assert resp.status == 200, resp.text

    async def started() -> str | None:
        runs = await bot.gateway.runs_for_user(REQUESTER, limit=50)
        return next((r.run_id for r in runs if r.task == task), None)

    run_id: str = await wait_until(started)
    return run_id


async def finished(bot: BotHarness, run_id: str) -> Any:
    async def done() -> Any:
        run = await bot.gateway.get_run(run_id)
        return run if run is not None and run.status.finished else None

    return await wait_until(done, timeout=20)


async def card_posted_at(bot: BotHarness, gate: Gate, timeout: float) -> float:
    """When the fake Slack carried out the post of ``gate``'s card."""

    def posted(f: Any) -> list[Any]:
        return [
            c
            for c in f.calls_to("chat.postMessage")
            if c.ok
            and (c.args.get("metadata") or {}).get("event_payload") == {"gate_id": gate.gate_id}
        ]

    (post,) = await bot.fake.wait_for(posted, timeout=timeout, what="the other thread's card")
    at: float = post.at
    return at


async def pending_events(bot: BotHarness) -> int:
    total = 0
    for shard in bot.keys.all_shards():
        info = await bot.redis.xpending(bot.keys.events(shard), "bot")
        total += int(info["pending"])
    return total


async def test_a_long_answer_is_a_preview_and_a_file_and_holds_up_no_other_thread(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """300 KB once became 87 messages at ~1 a second, and a new card in another thread
    waited behind them all."""
    live.fake.limit_posts(per_second=1.0, burst=1)
    text = long_answer(300)
    fake_openai.script("write the long report", [reply(text)])
    fake_openai.script("delete user 77", [call("delete_user", {"user_id": "77"}), reply("ok")])

    run_a = await start_in(live, "write the long report", CHANNEL)
    done_a = await finished(live, run_a)
    assert done_a.status is RunStatus.COMPLETED
    # Thread A's answer is now being posted; a gate opens in thread B.
    run_b = await start_in(live, "delete user 77", OTHER)
    gate_b = await wait_until(lambda: live.gateway.pending_gates(run_b), timeout=10)
    opened = gate_b[0].created_at
    shown = await card_posted_at(live, gate_b[0], timeout=CARD_BOUND_SECONDS + 5)
    assert shown - opened < CARD_BOUND_SECONDS, f"the card waited {shown - opened:.1f} s"

    thread_a = done_a.origin["thread_ts"]

    def file_shared(f: Any) -> list[Any]:
        return [x for x in f.files if x.thread_ts == thread_a and x.completed]

    (shared,) = await live.fake.wait_for(file_shared, timeout=15, what="the answer's file")
    assert shared.text == done_a.final == text, "the file holds the whole answer"
    assert shared.channel == CHANNEL and shared.filename.endswith(".md")
    replies = live.fake.thread(CHANNEL, thread_a)
    said = [m for m in replies if not m.files]
    assert 1 <= len(said) <= answers.MAX_ANSWER_MESSAGES, [m.text[:80] for m in said]
    preview = said[0].text
    assert preview.startswith("✅ *Answer*\n## Section 0")
    assert f"{len(text):,} characters" in preview and shared.filename in preview
    assert len(preview) < 2000, "a short preview"
    assert [m.ts for m in replies][-1] == shared.ts, "the file after the preview"
    posts = [
        c for c in live.fake.calls_to("chat.postMessage") if c.args.get("thread_ts") == thread_a
    ]
    assert len([c for c in posts if c.ok]) <= answers.MAX_ANSWER_MESSAGES
    await wait_until(lambda: _none_pending(live), timeout=10)


async def _none_pending(bot: BotHarness) -> bool:
    return await pending_events(bot) == 0


async def test_a_thread_waiting_out_a_429_holds_up_no_other_thread(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """Slack asks thread A to come back in 20 s: thread B's new card goes out meanwhile, and
    A's answer stays unacknowledged until it is posted."""
    fake_openai.script("short report", [reply("All quiet.")])
    fake_openai.script("delete user 78", [call("delete_user", {"user_id": "78"}), reply("ok")])
    run_a = await start_in(live, "short report", CHANNEL)

    def in_a(args: dict[str, Any]) -> bool:
        return args.get("channel") == CHANNEL and bool(args.get("thread_ts"))

    live.fake.fail_next("chat.postMessage", 1, retry_after=20, when=in_a)
    done_a = await finished(live, run_a)
    await live.fake.wait_for(
        lambda f: [c for c in f.calls_to("chat.postMessage") if c.status == 429],
        what="thread A rate-limited",
    )
    run_b = await start_in(live, "delete user 78", OTHER)
    gate_b = await wait_until(lambda: live.gateway.pending_gates(run_b), timeout=10)
    shown = await card_posted_at(live, gate_b[0], timeout=CARD_BOUND_SECONDS + 5)
    assert shown - gate_b[0].created_at < CARD_BOUND_SECONDS
    thread_a = done_a.origin["thread_ts"]
    assert not [m for m in live.fake.thread(CHANNEL, thread_a) if "All quiet" in m.text]
    assert await pending_events(live) >= 1, "A's answer is not acknowledged before it is posted"


def _event(i: int, run_id: str, thread: str) -> Any:
    origin = {"channel": CHANNEL, "thread_ts": thread}
    fields = {
        "type": "run.started",
        "run_id": run_id,
        "data": json.dumps({"run_id": run_id, "origin": origin}),
    }
    return parse_event(StreamMessage(f"1-{i}", fields, 1, "s"))


async def test_a_429_waits_without_a_slot_and_keeps_its_threads_order(bot: BotHarness) -> None:
    """With one slot (the default NOTIFIER_CONCURRENCY), thread A's first event is told to come
    back in a second: thread B's event is handled meanwhile, A's second event only after A's
    first, and every event may be acknowledged in the end."""
    ctx = bot.server.context
    a1, a2 = _event(1, "r-00aaaaaaaaaa", "1.1"), _event(2, "r-00aaaaaaaaaa", "1.1")
    b1 = _event(3, "r-00bbbbbbbbbb", "2.2")
    log: list[str] = []
    limited = [True]

    class Probe(Notifier):
        async def handle(self, event: Any, **kw: Any) -> None:
            log.append(f"start {event.id}")
            if event is a1 and limited[0]:
                limited[0] = False
                raise RateLimited("chat.postMessage: ratelimited", 1.0)
            log.append(f"end {event.id}")

    probe = Probe(bot.gateway, ctx.publisher, ctx.store, consumer="probe", concurrency=1)
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await probe.handle_batch([a1, a2, b1]) == [a1, a2, b1]
    assert loop.time() - began >= 0.9, "Retry-After was waited out"
    assert log.index("end 1-3") < log.index("end 1-1"), "B went on while A waited"
    assert log.index("end 1-1") < log.index("start 1-2"), "A's events in order"
    assert log.count("start 1-1") == 2, "A's first event was tried again"


async def test_a_refused_file_is_told_in_the_thread(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """An app installed before files:write was added: the upload is refused for good; the
    thread says so (once), and the event is not retried for ever."""
    text = long_answer(40)
    fake_openai.script("a report nobody can attach", [reply(text)])
    live.fake.error_next("files.getUploadURLExternal", "missing_scope")
    run_id = await start_in(live, "a report nobody can attach", CHANNEL)
    done = await finished(live, run_id)
    thread = done.origin["thread_ts"]

    def told(f: Any) -> list[Any]:
        return [m for m in f.thread(CHANNEL, thread) if "could not be attached" in m.text]

    (msg,) = await live.fake.wait_for(told, what="the refusal")
    assert "`missing_scope`" in msg.text and "files:write" in msg.text
    assert live.fake.thread(CHANNEL, thread)[0].text.startswith("✅ *Answer*\n## Section 0")
    await wait_until(lambda: _none_pending(live), timeout=10)
    await asyncio.sleep(0.3)
    assert len(told(live.fake)) == 1 and not [f for f in live.fake.files if f.completed]


async def test_an_event_waiting_out_a_429_is_kept_from_other_replicas(
    bot: BotHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While its thread waits, the event stays this replica's: its idle time in the group is
    reset, so no other replica claims it (nor does this one, counting a delivery)."""
    monkeypatch.setattr(notifier_module, "TOUCH_SECONDS", 0.3, raising=False)
    run_id = await bot.start_task("wait for slack")
    run = await bot.gateway.get_run(run_id)
    assert run is not None
    thread = run.origin["thread_ts"]
    bot.fake.fail_next(
        "chat.postMessage", 1, retry_after=20, when=lambda a: a.get("thread_ts") == thread
    )
    stream = bot.keys.events(bot.keys.shard_of(run_id))
    data = {"run_id": run_id, "final": "done", "origin": run.origin}
    entry = await bot.redis.xadd(
        stream, {"type": "run.completed", "run_id": run_id, "data": json.dumps(data)}
    )
    await bot.fake.wait_for(
        lambda f: [c for c in f.calls_to("chat.postMessage") if c.status == 429],
        what="the 429",
    )
    await asyncio.sleep(2.0)
    (pending,) = await bot.redis.xpending_range(stream, "bot", entry, entry, 1)
    assert pending["time_since_delivered"] < 1500, pending
    assert pending["times_delivered"] == 1 and pending["consumer"] == "web-test"
