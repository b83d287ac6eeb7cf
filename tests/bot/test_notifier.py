"""The notifier: idempotent under redelivery and replicas; every outcome reaches the card."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from agent_core import EventType
from agent_core.events import parse_event
from agent_core.streams import StreamMessage
from agent_core.testing import FakeOpenAI, call, calls, reply
from bot import cards
from bot.notifier import Notifier
from tests.bot.conftest import APPROVER, CHANNEL, BotHarness, journal_lines, wait_until


async def all_events(bot: BotHarness) -> list[Any]:
    out = []
    for shard in bot.keys.all_shards():
        stream = bot.keys.events(shard)
        out += [
            parse_event(StreamMessage(i, f, 1, stream)) for i, f in await bot.redis.xrange(stream)
        ]
    return out


async def xadd_event(bot: BotHarness, type_: str, run_id: str, data: dict[str, Any]) -> None:
    await bot.redis.xadd(
        bot.keys.events(bot.keys.shard_of(run_id)),
        {"type": type_, "run_id": run_id, "data": json.dumps(data)},
    )


def posts_and_updates(bot: BotHarness) -> tuple[int, int]:
    return len(bot.fake.calls_to("chat.postMessage")), len(bot.fake.calls_to("chat.update"))


async def run_to_completion(live: BotHarness, fake_openai: FakeOpenAI, task: str) -> str:
    fake_openai.script(
        task,
        [call("delete_user", {"user_id": "1"}), call("lookup", {"key": "k"}), reply("all done")],
    )
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    await live.client.action("gate_approve", cards.button_value(gate), user_id=APPROVER)
    thread_ts = (await live.gateway.get_run(run_id)).origin["thread_ts"]  # type: ignore[union-attr]
    await live.fake.wait_for(
        lambda f: any("all done" in m.text for m in f.thread(CHANNEL, thread_ts))
    )
    await live.fake.wait_for(lambda f: f.shows(CHANNEL, thread_ts, "completed"))
    await live.wait_card(gate.gate_id, "Executed")
    return run_id


async def test_replayed_events_change_nothing(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    run_id = await run_to_completion(live, fake_openai, "replay me")
    await asyncio.sleep(0.3)
    thread = live.fake.thread(CHANNEL, (await live.gateway.get_run(run_id)).origin["thread_ts"])  # type: ignore[union-attr]
    assert [m.text for m in thread if "Ran `lookup`" in m.text], (
        "ungated tool calls show as progress"
    )
    before = posts_and_updates(live)
    events = await all_events(live)
    assert {e.type for e in events} >= {
        EventType.GATE_OPENED,
        EventType.GATE_DECIDED,
        EventType.TOOL_EXECUTED,
        EventType.RUN_COMPLETED,
    }
    replica = Notifier(
        live.gateway,
        live.server.context.publisher,
        live.server.context.store,
        consumer="web-replay",
    )
    for event in events + events:
        await replica.handle(event)
    assert posts_and_updates(live) == before, "a redelivered event posts and updates nothing"


async def test_two_replicas_racing_on_the_same_events_post_one_card(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "race the replicas"
    fake_openai.script(task, [call("delete_user", {"user_id": "2"}), reply("ok")])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    await live.redis.delete(
        live.keys.ext("slack-card", gate.gate_id, live.keys.shard_of(gate.gate_id))
    )  # as if never posted
    ctx = live.server.context
    replicas = [
        Notifier(live.gateway, ctx.publisher, ctx.store, consumer=f"web-{i}") for i in range(4)
    ]
    opened = [e for e in await all_events(live) if e.type is EventType.GATE_OPENED]
    before = len(live.fake.calls_to("chat.postMessage"))
    await asyncio.gather(*(r.handle(opened[0]) for r in replicas))
    assert len(live.fake.calls_to("chat.postMessage")) == before + 1


async def test_decision_made_elsewhere_and_in_doubt_reach_the_card(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "decided outside slack"
    fake_openai.script(task, [call("delete_user", {"user_id": "3"}), reply("ok")])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    await live.gateway.decide(gate.gate_id, "approve", by="U0CLI")
    msg = await live.wait_card(gate.gate_id, "Approved* by <@U0CLI>")
    assert "gate_approve" not in str(msg.blocks)
    await live.wait_card(gate.gate_id, "Executed")
    # A crash report for the same gate (as the core sends for an in-doubt call).
    await xadd_event(
        live,
        "tool.executed",
        run_id,
        {
            "run_id": run_id,
            "call_id": gate.call_id,
            "gate_id": gate.gate_id,
            "tool": "delete_user",
            "ok": False,
            "output": "",
            "in_doubt": True,
            "origin": gate.origin,
        },
    )
    await live.wait_card(gate.gate_id, "In doubt")


async def test_runs_started_outside_slack_are_ignored(bot: BotHarness) -> None:
    run = await bot.gateway.start_run("from the API", requested_by="api")
    await xadd_event(
        bot, "run.completed", run.run_id, {"run_id": run.run_id, "final": "x", "origin": {}}
    )
    await xadd_event(
        bot, "run.failed", run.run_id, {"run_id": run.run_id, "error": "x", "origin": None}
    )

    async def handled() -> bool:
        return bot.server.notifier.handled >= 2

    await wait_until(handled)
    await asyncio.sleep(0.1)
    stream = bot.keys.events(bot.keys.shard_of(run.run_id))
    assert (await bot.redis.xpending(stream, "bot"))["pending"] == 0
    assert bot.fake.calls == []


async def test_failed_run_is_told_in_the_thread(bot: BotHarness) -> None:
    run_id = await bot.start_task("this will fail")
    run = await bot.gateway.get_run(run_id)
    assert run is not None
    await xadd_event(
        bot,
        "run.failed",
        run_id,
        {"run_id": run_id, "error": "model <!here> unavailable", "origin": run.origin},
    )
    msgs = await bot.fake.wait_for(
        lambda f: [m for m in f.thread(CHANNEL, run.origin["thread_ts"]) if "failed" in m.text]
    )
    assert "&lt;!here&gt;" in msgs[0].text, "error text is escaped"


async def test_transient_slack_failure_leaves_the_event_pending(bot: BotHarness) -> None:
    run_id = await bot.start_task("flaky slack")
    run = await bot.gateway.get_run(run_id)
    assert run is not None
    await asyncio.sleep(0.2)
    bot.fake.fail_next(
        "chat.postMessage", 50, status=503, retry_after=None, error="service_unavailable"
    )
    await xadd_event(
        bot, "run.completed", run_id, {"run_id": run_id, "final": "answer", "origin": run.origin}
    )

    async def pending_one() -> bool:
        info = await bot.redis.xpending(bot.keys.events(bot.keys.shard_of(run_id)), "bot")
        return int(info["pending"]) == 1

    await bot.fake.wait_for(
        lambda f: [c for c in f.calls_to("chat.postMessage") if c.status == 503]
    )
    await asyncio.sleep(0.2)
    assert await pending_one(), "not acknowledged: it will be delivered again"
    assert (
        await bot.redis.hget(
            bot.keys.ext("slack-run", run_id, bot.keys.shard_of(run_id)), "posted:final:0"
        )
        is None
    )


async def test_card_refused_for_size_falls_back_to_a_compact_one(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "refused card"
    fake_openai.script(task, [call("delete_user", {"user_id": "4"}), reply("ok")])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    await live.redis.delete(
        live.keys.ext("slack-card", gate.gate_id, live.keys.shard_of(gate.gate_id))
    )  # as if never posted
    live.fake.error_next("chat.postMessage", "msg_blocks_too_long")
    await live.server.context.publisher.show_gate(gate.gate_id)
    refused, accepted = live.fake.calls_to("chat.postMessage")[-2:]
    assert refused.response["error"] == "msg_blocks_too_long" and accepted.ok
    assert "gate_approve" in json.dumps(accepted.args["blocks"]), (
        "the compact card still has the buttons"
    )
    assert (
        await live.redis.hget(
            live.keys.ext("slack-card", gate.gate_id, live.keys.shard_of(gate.gate_id)), "ts"
        )
        == accepted.response["ts"]
    )


async def approved_with_no_worker(
    live: BotHarness, fake_openai: FakeOpenAI, task: str, n: int
) -> tuple[str, list[Any]]:
    """A run with ``n`` approved gates (cards posted) whose calls no worker will run."""
    fake_openai.script(
        task, [calls([("delete_user", {"user_id": str(i)}) for i in range(n)]), reply("never")]
    )
    run_id = await live.start_task(task)

    async def carded() -> list[Any]:
        gates = await live.gateway.pending_gates(run_id)
        ready = [
            g
            for g in gates
            if await live.redis.hget(
                live.keys.ext("slack-card", g.gate_id, live.keys.shard_of(g.gate_id)), "ts"
            )
        ]
        return ready if len(ready) == n else []

    gates = await wait_until(carded)
    assert live.core is not None
    await live.core.close()  # the worker stops: the events below stand in for its own
    live.core = None
    for g in gates:
        await live.gateway.decide(g.gate_id, "approve", by=APPROVER)
        await live.wait_card(g.gate_id, "Running…")
    return run_id, gates


async def test_the_root_message_says_the_run_awaits_approval_until_it_is_decided(
    live: BotHarness, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """While a gate waits, the run's root message says so, not "running"; once the gate is
    decided it is running again (before a worker has even taken it back), then completed."""
    task = "root tells the truth"
    fake_openai.script(task, [call("delete_user", {"user_id": "5"}), reply("all done")])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    thread_ts = (await live.gateway.get_run(run_id)).origin["thread_ts"]  # type: ignore[union-attr]
    root = f"Run `{run_id}` · "
    await live.fake.wait_for(
        lambda f: f.shows(CHANNEL, thread_ts, root + "🔐 awaiting approval"),
        what="the root message awaiting approval",
    )
    assert not live.fake.shows(CHANNEL, thread_ts, "running")
    assert live.core is not None
    await live.core.close()  # no worker: the run waits between its decision and its resume
    live.core = None
    await live.client.action("gate_approve", cards.button_value(gate), user_id=APPROVER)
    await live.wait_card(gate.gate_id, "Running…")
    await live.fake.wait_for(
        lambda f: f.shows(CHANNEL, thread_ts, root + "⚙️ running"),
        what="the root message running again",
    )
    assert not live.fake.shows(CHANNEL, thread_ts, "awaiting approval")
    live.start_worker(redis_url, fake_openai.base_url)
    await live.fake.wait_for(
        lambda f: f.shows(CHANNEL, thread_ts, root + "✅ completed"),
        what="the root message completed",
    )
    assert journal_lines(journal) == ["delete_user:5"]


async def test_cancel_tells_which_approved_calls_never_ran_and_which_were_running(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    run_id, (never, running, done) = await approved_with_no_worker(
        live, fake_openai, "cancel in the middle", 3
    )
    origin = never.origin
    # The third call had finished before the cancel: its outcome is already on its card.
    executed = {
        "gate_id": done.gate_id,
        "tool": "delete_user",
        "ok": True,
        "output": "user 2 deleted",
    }
    await xadd_event(live, "tool.executed", run_id, {**executed, "origin": origin})
    await live.wait_card(done.gate_id, "Executed")
    cancelled = {
        "run_id": run_id,
        "by": "U0REQ",
        "reason": None,
        "origin": origin,
        "never_ran": [never.gate_id],
        "running": [running.gate_id],
    }
    await xadd_event(live, "run.cancelled", run_id, cancelled)
    msg = await live.wait_card(never.gate_id, "Never ran")
    assert "the run was cancelled before this call started; not executed" in str(msg.blocks)
    assert "Running…" not in str(msg.blocks)
    msg = await live.wait_card(running.gate_id, "Was running when the run was cancelled")
    assert "its outcome will appear here" in str(msg.blocks) and "Running…" not in str(msg.blocks)
    # The call still running at the cancel finishes: its card tells how, and that it was late.
    late = {
        "gate_id": running.gate_id,
        "tool": "delete_user",
        "ok": True,
        "output": "user 1 deleted",
    }
    await xadd_event(
        live, "tool.executed", run_id, {**late, "after_cancel": True, "origin": origin}
    )
    msg = await live.wait_card(running.gate_id, "Finished after the run was cancelled")
    assert "user 1 deleted" in str(msg.blocks) and "Was running" not in str(msg.blocks)
    # A redelivered cancel changes none of the outcomes already shown.
    await xadd_event(live, "run.cancelled", run_id, cancelled)
    await asyncio.sleep(0.3)
    assert "Finished after the run was cancelled" in str((await live.card(running.gate_id)).blocks)
    assert "user 2 deleted" in str((await live.card(done.gate_id)).blocks)
    assert "Never ran" not in str((await live.card(done.gate_id)).blocks)


async def test_a_call_that_fails_after_the_cancel_says_so(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    run_id, (gate,) = await approved_with_no_worker(live, fake_openai, "fail after cancel", 1)
    origin = gate.origin
    await xadd_event(
        live,
        "run.cancelled",
        run_id,
        {
            "run_id": run_id,
            "by": "U0REQ",
            "origin": origin,
            "never_ran": [],
            "running": [gate.gate_id],
        },
    )
    await live.wait_card(gate.gate_id, "Was running when the run was cancelled")
    failed = {"gate_id": gate.gate_id, "tool": "delete_user", "ok": False, "output": "boom"}
    await xadd_event(
        live, "tool.executed", run_id, {**failed, "after_cancel": True, "origin": origin}
    )
    msg = await live.wait_card(gate.gate_id, "The tool failed after the run was cancelled")
    assert "boom" in str(msg.blocks)


async def test_a_cancel_event_without_the_lists_still_ends_running(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """Events from an older core carry no never_ran/running lists: the old guess stands."""
    run_id, (gate,) = await approved_with_no_worker(live, fake_openai, "old cancel event", 1)
    await xadd_event(
        live, "run.cancelled", run_id, {"run_id": run_id, "by": "U0REQ", "origin": gate.origin}
    )
    msg = await live.wait_card(gate.gate_id, "Never ran")
    assert "not executed" in str(msg.blocks) and "Running…" not in str(msg.blocks)


async def test_a_batch_updates_each_card_and_root_message_once(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """A web process that fell behind reads a click's gate.decided and tool.executed (and the
    run's events) in one batch: each message is updated once, to the final state."""
    run_id = await run_to_completion(live, fake_openai, "batch me")
    events = [
        e
        for e in await all_events(live)
        if e.run_id == run_id
        and e.type
        in (
            EventType.GATE_DECIDED,
            EventType.TOOL_EXECUTED,
            EventType.RUN_STARTED,
            EventType.RUN_COMPLETED,
        )
        and (e.type is not EventType.TOOL_EXECUTED or e.data.get("gate_id"))  # the card's
    ]
    gate_id = next(e.data["gate_id"] for e in events if e.type is EventType.GATE_DECIDED)
    ctx = live.server.context
    replica = Notifier(live.gateway, ctx.publisher, ctx.store, consumer="web-behind")

    async def stale() -> None:  # as if none of these events had been handled yet
        await ctx.store.set_card_digest(gate_id, "stale")
        await ctx.store.set_run_digest(run_id, "stale")
        result = [f"result_{f}" for f in ("ok", "output", "in_doubt", "skipped")]
        await live.redis.hdel(ctx.store.card_key(gate_id), "shown", *result)

    def updates() -> int:
        return len(live.fake.calls_to("chat.update"))

    before = updates()
    for event in events:  # control: alone, each event updates its message
        await stale()
        assert await replica.handle_batch([event]) == [event]
    # gate.decided updates both the card and the root message ("running" again).
    assert updates() - before == len(events) + 1 == 5

    await stale()
    before = updates()
    assert await replica.handle_batch(events) == events, "every event may be acknowledged"
    assert updates() - before == 2, "the card once and the root message once"
    card = await live.card(gate_id)
    assert "Executed" in str(card.blocks), "the one update shows the final state"
    thread_ts = (await live.gateway.get_run(run_id)).origin["thread_ts"]  # type: ignore[union-attr]
    assert live.fake.shows(CHANNEL, thread_ts, "completed")


async def test_threads_are_handled_side_by_side_and_each_in_order(bot: BotHarness) -> None:
    """One thread's events keep their order; another thread's do not wait for them."""
    ctx = bot.server.context

    def event(i: int, run_id: str, thread: str) -> Any:
        origin = {"channel": CHANNEL, "thread_ts": thread}
        return parse_event(
            StreamMessage(
                f"1-{i}",
                {
                    "type": "run.started",
                    "run_id": run_id,
                    "data": json.dumps({"run_id": run_id, "origin": origin}),
                },
                1,
                "s",
            )
        )

    a1, a2 = event(1, "r-00aaaaaaaaaa", "1.1"), event(2, "r-00aaaaaaaaaa", "1.1")
    b1 = event(3, "r-00bbbbbbbbbb", "2.2")
    log: list[str] = []
    b_started = asyncio.Event()

    class Probe(Notifier):
        async def handle(self, event: Any, **kw: Any) -> None:
            log.append(f"start {event.id}")
            if event is b1:
                b_started.set()
            else:  # thread A's first event holds until thread B's has started
                await asyncio.wait_for(b_started.wait(), timeout=5)
            await asyncio.sleep(0.01 if event is a1 else 0)
            log.append(f"end {event.id}")

    probe = Probe(bot.gateway, ctx.publisher, ctx.store, consumer="probe", concurrency=4)
    assert await probe.handle_batch([a1, a2, b1]) == [a1, a2, b1]
    assert log.index("end 1-1") < log.index("start 1-2"), "a thread's events in order"
    assert log.index("start 1-3") < log.index("end 1-1"), "other threads side by side"


async def test_a_card_the_click_updated_is_not_rendered_again_by_the_notifier(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "click shows it"
    fake_openai.script(task, [call("delete_user", {"user_id": "5"}), reply("ok")])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    await live.client.action("gate_approve", cards.button_value(gate), user_id=APPROVER)
    await live.wait_card(gate.gate_id, "Executed")
    [decided] = [
        e
        for e in await all_events(live)
        if e.type is EventType.GATE_DECIDED and e.data["gate_id"] == gate.gate_id
    ]
    ctx = live.server.context
    rendered: list[str] = []
    show_gate = ctx.publisher.show_gate

    async def spy(gate_id: str, **kw: Any) -> Any:
        rendered.append(gate_id)
        return await show_gate(gate_id, **kw)

    replica = Notifier(live.gateway, ctx.publisher, ctx.store, consumer="web-spy")
    ctx.publisher.show_gate = spy  # type: ignore[method-assign]
    try:
        await replica.handle(decided)
        assert rendered == [], "the card already shows this decision"
        await live.redis.hdel(ctx.store.card_key(gate.gate_id), "shown")
        await replica.handle(decided)
        assert rendered == [gate.gate_id], "control: not known to show it, it is rendered"
    finally:
        ctx.publisher.show_gate = show_gate  # type: ignore[method-assign]


async def test_the_notifier_waits_for_the_clicks_own_card_update_and_takes_over_if_it_fails(
    live: BotHarness, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """The decision's event reaches the notifier while the click's card update is still on
    its way to Slack: the notifier waits for it and does not update the card again. When the
    click's update fails, the notifier makes it. Meanwhile other threads' events go on."""
    assert live.core is not None
    for task, uid in (("held update", "5"), ("failed update", "6"), ("other thread", "7")):
        fake_openai.script(task, [call("delete_user", {"user_id": uid}), reply("ok")])
    held_run, failed_run, other_run = (
        await live.start_task("held update"),
        await live.start_task("failed update"),
        await live.start_task("other thread"),
    )
    held, failed = await live.gate_of(held_run), await live.gate_of(failed_run)
    other = await live.gate_of(other_run)
    await live.core.close()  # the runs stay approved, not executed: the card says so
    live.core = None
    held_ts = (await live.card(held.gate_id)).ts

    def card_updates(ts: str) -> int:
        return sum(1 for c in live.fake.calls_to("chat.update") if c.args.get("ts") == ts)

    publisher = live.server.context.publisher
    rendered: list[str] = []
    show_gate = publisher.show_gate

    async def spy(gate_id: str, **kw: Any) -> Any:
        rendered.append(gate_id)
        return await show_gate(gate_id, **kw)

    publisher.show_gate = spy  # type: ignore[method-assign]
    try:
        live.fake.hold("chat.update", when=lambda args: args.get("ts") == held_ts)
        click = asyncio.create_task(
            live.client.action("gate_approve", cards.button_value(held), user_id=APPROVER)
        )
        await live.fake.wait_for(lambda f: f.held == 1, what="the click's card update, held")
        await asyncio.sleep(0.5)  # the notifier has read the decision's event meanwhile
        assert card_updates(held_ts) == 1, "only the click's own update"
        # Decided elsewhere (the gateway, no click): another thread's card is updated by
        # the notifier while it waits for the held click.
        assert (await live.gateway.decide(other.gate_id, "approve", by=APPROVER)).applied
        await live.wait_card(other.gate_id, "Approved", timeout=3.0)
        assert live.fake.held == 1, "still held"
        live.fake.release()
        await click
        await live.wait_card(held.gate_id, "Approved")
        await live.fake.wait_for(lambda f: f.shows(CHANNEL, held.origin["thread_ts"], "running"))
        assert card_updates(held_ts) == 1, "the notifier left the card the click updated"
        assert rendered.count(held.gate_id) == 1, "rendered once, by the click"
    finally:
        publisher.show_gate = show_gate  # type: ignore[method-assign]

    failed_ts = (await live.card(failed.gate_id)).ts
    live.fake.error_next("chat.update", "internal_error")  # the click's own update
    await live.client.action("gate_approve", cards.button_value(failed), user_id=APPROVER)
    await live.wait_card(failed.gate_id, "Approved")  # the notifier's update
    assert card_updates(failed_ts) == 2
    assert journal_lines(journal) == []


async def test_a_cancel_delivered_again_after_its_card_was_busy_still_shows_never_ran(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """The cancel's "never ran" is stored, then the card's lock is held by another (a click's
    update stalled by a Redis failover, a web process killed while updating it): the event is
    left pending. Delivered again, it shows what it stored. (Seen in the cluster soak: the
    second delivery found the result stored and returned without showing it; the card said
    "Running…" for good.)"""
    run_id, (gate,) = await approved_with_no_worker(live, fake_openai, "cancel, card busy", 1)
    data = {
        "run_id": run_id,
        "by": "U0REQ",
        "origin": gate.origin,
        "never_ran": [gate.gate_id],
        "running": [],
    }
    stream = live.keys.events(live.keys.shard_of(run_id))
    fields = {"type": "run.cancelled", "run_id": run_id, "data": json.dumps(data)}
    event = parse_event(StreamMessage("1-1", fields, 1, stream))
    ctx = live.server.context
    replica = Notifier(live.gateway, ctx.publisher, ctx.store, consumer="web-replica")
    async with ctx.store.lock(f"gate:{gate.gate_id}"):
        assert not await replica.handle_safely(event), "the card is busy: left pending"
    assert "Running…" in str((await live.card(gate.gate_id)).blocks)
    assert await replica.handle_safely(event)  # delivered again
    msg = await live.wait_card(gate.gate_id, "Never ran", timeout=2)
    assert "Running…" not in str(msg.blocks)


async def test_an_event_that_found_its_card_busy_is_shown_within_seconds(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """A card's lock held by a holder that will never release it (a web process killed while
    updating it, or its release lost with a Redis master): the event that finds it busy gives
    up after the lock wait (3 s) and is tried again by the notifier a second later, once the
    lock ran out (4 s), instead of waiting pending for the group's claim after 30 s idle."""
    run_id, (gate,) = await approved_with_no_worker(live, fake_openai, "card held", 1)
    lock = live.server.context.store.lock_key(f"gate:{gate.gate_id}")
    assert await live.redis.set(lock, "a-dead-holder", px=4000)
    started = asyncio.get_running_loop().time()
    data = {
        "run_id": run_id,
        "call_id": gate.call_id,
        "gate_id": gate.gate_id,
        "tool": "delete_user",
        "ok": True,
        "in_doubt": False,
        "output": "user 0 deleted",
        "origin": gate.origin,
    }
    await xadd_event(live, "tool.executed", run_id, data)
    await live.wait_card(gate.gate_id, "user 0 deleted", timeout=10)
    took = asyncio.get_running_loop().time() - started
    assert 3.5 < took < 8, took  # after the lock ran out, and well before the 30 s claim


async def test_the_web_process_stops_promptly_while_it_is_posting_cards(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    # The acknowledging task was stopped by a cancel, which redis-py can swallow inside an
    # XACK: a stop that came while events were being handled then waited for that task
    # until the server's 10 s limit cancelled the notifier, skipping its last acknowledgements.
    for i in range(2):
        task = f"delete user {i} and then stop"
        fake_openai.script(task, [call("delete_user", {"user_id": str(i)}), reply("ok")])
        await live.start_task(task)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await live.server.stop()
    assert loop.time() - started < 5, "the stop waited for a task that never ends"


async def test_events_of_two_shards_with_the_same_id_are_both_handled_and_acknowledged(
    bot: BotHarness,
) -> None:
    """Each shard has its own stream, and two streams give the same id to entries added in
    the same millisecond. Both are handled and acknowledged at once: keyed by id alone, the
    second was taken for one already held and sat pending until it was claimed back (30 s)."""
    ctx = bot.server.context
    by_shard = {shard: bot.keys.new_run_id(shard) for shard in (0, 1)}
    same_id = f"{int(time.time() * 1000) + 60_000}-0"  # later than any id already there
    streams = []
    for shard, run_id in by_shard.items():
        stream = bot.keys.events(shard)
        streams.append(stream)
        origin = {"channel": CHANNEL, "thread_ts": f"1.{shard}"}
        fields = {"type": "run.started", "run_id": run_id, "data": json.dumps({"origin": origin})}
        assert await bot.redis.xadd(stream, fields, id=same_id) == same_id
    seen: list[tuple[str, str]] = []

    class Probe(Notifier):
        async def handle(self, event: Any, **kw: Any) -> None:
            if event.id == same_id:
                seen.append((event.stream, event.run_id))

    probe = Probe(bot.gateway, ctx.publisher, ctx.store, consumer="probe", group="same-ids")
    stop = asyncio.Event()
    task = asyncio.create_task(probe.run(stop))
    try:

        async def both_seen() -> bool:
            return len(seen) == 2

        await wait_until(both_seen, timeout=5)

        async def pending() -> int:
            counts = [(await bot.redis.xpending(s, "same-ids"))["pending"] for s in streams]
            return sum(int(c) for c in counts)

        for _ in range(50):
            if await pending() == 0:
                break
            await asyncio.sleep(0.1)
        assert await pending() == 0, "both entries acknowledged"
    finally:
        stop.set()
        await task
    assert sorted(seen) == sorted(zip(streams, by_shard.values(), strict=True))
