"""Thread replies: a reply in a run's thread continues the run (Events API ``message``)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from agent_core import GateStatus, RunStatus
from agent_core.testing import FakeOpenAI, call, reply
from bot import cards, conversations
from tests.bot.conftest import (
    APPROVER,
    APPROVER2,
    CHANNEL,
    REQUESTER,
    SIGNING_SECRET,
    BotHarness,
    journal_lines,
    wait_until,
)
from tests.slack_fake import HttpResult, sign

_ids = itertools.count(1)


async def send_event(
    bot: BotHarness, event: dict[str, Any], *, event_id: str | None = None, retry: int = 0
) -> HttpResult:
    """An Events API ``event_callback``, signed as Slack signs it (with Slack's retry
    headers when ``retry`` > 0)."""
    body = json.dumps(
        {
            "token": "unused",
            "team_id": "T0TEST",
            "api_app_id": "A0APP",
            "type": "event_callback",
            "event_id": event_id or f"Ev{next(_ids):08d}",
            "event_time": int(time.time()),
            "event": event,
        }
    )
    ts = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": sign(SIGNING_SECRET, ts, body),
    }
    if retry:
        headers |= {"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_timeout"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(bot.client.url, data=body.encode(), headers=headers) as resp,
    ):
        return HttpResult(resp.status, await resp.text(), dict(resp.headers))


def message(thread_ts: str, text: str, user: str = REQUESTER, **extra: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "channel": CHANNEL,
        "channel_type": "channel",
        "user": user,
        "text": text,
        "ts": f"{time.time():.6f}",
        "thread_ts": thread_ts,
        **extra,
    }


async def root_of(bot: BotHarness, run_id: str) -> str:
    async def saved() -> str | None:
        return (await bot.server.context.store.run(run_id)).ts  # type: ignore[union-attr]

    ts: str = await wait_until(saved)
    return ts


async def thread_shows(bot: BotHarness, ts: str, needle: str) -> None:
    await bot.fake.wait_for(
        lambda f: any(needle in m.text for m in f.thread(CHANNEL, ts)), what=repr(needle)
    )


async def status_is(bot: BotHarness, run_id: str, *wanted: RunStatus) -> None:
    async def check() -> bool:
        run = await bot.gateway.get_run(run_id)
        return run is not None and run.status in wanted

    await wait_until(check, timeout=15)


def ephemerals(bot: BotHarness) -> list[dict[str, Any]]:
    return [c.args for c in bot.fake.calls_to("chat.postEphemeral")]


async def continued(bot: BotHarness, run_id: str) -> list[dict[str, Any]]:
    stream = bot.keys.events(bot.keys.shard_of(run_id))
    entries = await bot.redis.xrange(stream)
    return [
        json.loads(f["data"])
        for _, f in entries
        if f.get("type") == "run.continued" and f.get("run_id") == run_id
    ]


async def test_a_thread_reply_continues_a_finished_run_and_a_retry_continues_it_once(
    live: BotHarness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script("chat with me", [reply("first answer"), reply("second answer")])
    run_id = await live.start_task("chat with me")
    ts = await root_of(live, run_id)
    await thread_shows(live, ts, "first answer")

    event = message(ts, "tell me more")  # Slack's retry carries the same event
    resp = await send_event(live, event, event_id="EvSAME")
    assert resp.status == 200, resp.text
    again = await send_event(live, event, event_id="EvSAME", retry=1)
    assert again.status == 200, again.text
    await thread_shows(live, ts, "second answer")
    await status_is(live, run_id, RunStatus.COMPLETED)

    last = fake_openai.requests_for("chat with me")[-1]["messages"]
    assert [(m["role"], m["content"]) for m in last if m["role"] != "system"] == [
        ("user", "chat with me"),
        ("assistant", "first answer"),
        ("user", "tell me more"),
    ]
    assert [d["by"] for d in await continued(live, run_id)] == [REQUESTER]
    assert len(fake_openai.requests_for("chat with me")) == 2
    assert ephemerals(live) == []


async def test_url_verification_is_answered(bot: BotHarness) -> None:
    body = json.dumps({"token": "x", "challenge": "c-123", "type": "url_verification"})
    resp = await bot.client.post(body, content_type="application/json")
    assert resp.status == 200 and "c-123" in resp.text


async def test_bots_edits_and_other_threads_are_ignored(
    live: BotHarness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script("quiet one", [reply("done")])
    run_id = await live.start_task("quiet one")
    ts = await root_of(live, run_id)
    await status_is(live, run_id, RunStatus.COMPLETED)

    ignored = [
        message(ts, "from a bot", bot_id="B0OTHER"),
        message(ts, "from this app", user="U0BOT"),
        message(ts, "edited", subtype="message_changed"),
        message(ts, "joined", subtype="channel_join"),
        message("1234.000001", "a thread that is no run's"),
        {**message(ts, "a root message"), "thread_ts": None},
    ]
    for event in ignored:
        resp = await send_event(live, event)
        assert resp.status == 200, resp.text
    await asyncio.sleep(0.3)
    assert await continued(live, run_id) == []
    assert ephemerals(live) == []
    assert (await live.gateway.get_run(run_id)).status is RunStatus.COMPLETED  # type: ignore[union-attr]


async def test_a_reply_while_awaiting_approval_is_queued_and_the_gate_is_its_authors(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    # The second request carries the queued reply, after the tool result: it asks for 8.
    fake_openai.script(
        "delete user 7",
        [
            call("delete_user", {"user_id": "7"}),
            call("delete_user", {"user_id": "8"}),
            reply("both gone"),
        ],
    )
    run_id = await live.start_task("delete user 7")
    ts = await root_of(live, run_id)
    gate = await live.gate_of(run_id)

    await send_event(live, message(ts, "then delete 8 too", user=APPROVER2))
    [told] = await live.fake.wait_for(lambda f: [c.args for c in f.calls_to("chat.postEphemeral")])
    assert told["user"] == APPROVER2 and told["thread_ts"] == ts
    assert told["text"] == conversations.QUEUED.format(run=run_id)

    await live.client.action("gate_approve", cards.button_value(gate), user_id=APPROVER)

    # The reply was queued: the model got it after the tool result, and the gate it led to
    # names its author among its requesters, who may not approve it (self-approval);
    # someone else may.
    async def second_gate() -> Any:
        gates = await live.gateway.pending_gates(run_id)
        return gates[0] if gates else None

    gate2 = await wait_until(second_gate, timeout=15)
    assert (gate2.requested_by, gate2.requesters) == (REQUESTER, [REQUESTER, APPROVER2])
    await live.client.action(
        "gate_approve",
        cards.button_value(gate2),
        user_id=APPROVER2,
        response_url=live.fake.response_url("self"),
    )
    (r,) = await live.fake.wait_for(lambda f: f.responses("self"))
    assert "ALLOW_SELF_APPROVAL" in r.args["text"]
    assert (await live.gateway.get_gate(gate2.gate_id)).status is GateStatus.PENDING  # type: ignore[union-attr]
    await live.client.action("gate_approve", cards.button_value(gate2), user_id=APPROVER)
    await thread_shows(live, ts, "both gone")
    assert journal_lines(journal) == ["delete_user:7", "delete_user:8"]
    roles = [
        (m["role"], m.get("content"))
        for m in fake_openai.requests_for("delete user 7")[1]["messages"]
        if m["role"] != "system"
    ]
    assert [r for r, _ in roles] == ["user", "assistant", "tool", "user"]
    assert roles[-1] == ("user", "then delete 8 too")


async def test_a_reply_to_a_cancelled_run_is_answered_privately(
    live: BotHarness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script("delete user 9", [call("delete_user", {"user_id": "9"}), reply("x")])
    run_id = await live.start_task("delete user 9")
    ts = await root_of(live, run_id)
    await live.gate_of(run_id)
    await live.gateway.cancel_run(run_id, by=REQUESTER)

    await send_event(live, message(ts, "go on please"))
    [told] = await live.fake.wait_for(lambda f: [c.args for c in f.calls_to("chat.postEphemeral")])
    assert told["user"] == REQUESTER and told["channel"] == CHANNEL
    assert told["text"] == conversations.CANCELLED.format(run=run_id, command="/agent")
    assert await continued(live, run_id) == []
