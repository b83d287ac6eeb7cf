"""The whole path: slash command → worker → gate card → click → tool → answer in the thread.

Slack is the fake Web API server, the model is the fake OpenAI server, Redis is real, the
worker is the core's; requests reach the bot signed, over HTTP.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from agent_core import GateStatus, RunStatus
from agent_core.testing import FakeOpenAI, call, reply
from bot import cards
from tests.bot.conftest import (
    APPROVER,
    APPROVER2,
    CHANNEL,
    GROUP_MEMBER,
    REQUESTER,
    STRANGER,
    BotHarness,
    journal_lines,
    wait_until,
)


def tool_messages(fake_openai: FakeOpenAI, task: str) -> list[str]:
    reqs = fake_openai.requests_for(task)
    return [m["content"] for m in reqs[-1]["messages"] if m.get("role") == "tool"] if reqs else []


async def finished(bot: BotHarness, run_id: str) -> Any:
    async def done() -> Any:
        run = await bot.gateway.get_run(run_id)
        return run if run is not None and run.status.finished else None

    return await wait_until(done, timeout=15)


async def test_slash_command_to_final_answer(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "delete user 42 please"
    answer = "Done. " + "User 42 is gone. " * 400  # long: split over several messages
    fake_openai.script(task, [call("delete_user", {"user_id": "42"}), reply(answer)])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    card = await live.card(gate.gate_id)
    run = await live.gateway.get_run(run_id)
    assert run is not None
    assert card.channel == CHANNEL and card.thread_ts == run.origin["thread_ts"], (
        "card in the thread"
    )
    assert "delete_user" in str(card.blocks) and "gate_approve" in str(card.blocks)
    assert journal_lines(journal) == [], "nothing runs before approval"

    resp = await live.client.action(
        "gate_approve", cards.button_value(gate), user_id=APPROVER, message_ts=card.ts
    )
    assert resp.status == 200
    done = await finished(live, run_id)
    assert done.status is RunStatus.COMPLETED
    assert journal_lines(journal) == ["delete_user:42"]

    msg = await live.wait_card(gate.gate_id, "Executed")
    assert "Approved* by <@U0APPROVER>" in str(msg.blocks)
    assert "user 42 deleted" in str(msg.blocks)
    assert "gate_approve" not in str(msg.blocks), "buttons removed"

    thread_ts = run.origin["thread_ts"]

    def answer_posted(f: Any) -> Any:
        return [
            m
            for m in f.thread(CHANNEL, thread_ts)
            if "/" in m.text and m.text.rstrip().endswith(")_")
        ]

    parts = await live.fake.wait_for(answer_posted, what="the split answer")
    await asyncio.sleep(0.3)
    parts = answer_posted(live.fake)
    n = len(parts)
    assert n >= 2 and parts[0].text.startswith("✅ *Answer*")
    assert [p.text.endswith(f"_({i + 1}/{n})_") for i, p in enumerate(parts)] == [True] * n
    joined = "".join(p.text for p in parts)
    assert joined.count("User 42 is gone.") == 400, "split, not cut"
    root = live.fake.message(CHANNEL, thread_ts)
    assert root is not None
    await live.fake.wait_for(lambda f: f.shows(CHANNEL, thread_ts, "completed"))
    for c in live.fake.calls_to("chat.postMessage") + live.fake.calls_to("chat.update"):
        assert c.ok, c
        assert c.args.get("text"), "every message has a text fallback"


async def test_deny_with_reason_reaches_the_model(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "email the customer"
    args = {"to": "ceo@bigcorp.com", "subject": "hi", "body": "we are closing"}

    def saw_denial(messages: list[dict[str, Any]]) -> None:
        tool = [m["content"] for m in messages if m.get("role") == "tool"]
        assert tool and "wrong recipient" in tool[-1] and APPROVER in tool[-1], tool

    fake_openai.script(task, [call("send_email", args), reply("OK, not sent.", expect=saw_denial)])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    card = await live.card(gate.gate_id)

    await live.client.action(
        "gate_deny",
        cards.button_value(gate),
        user_id=APPROVER,
        trigger_id="trig-1",
        message_ts=card.ts,
    )
    (opened,) = await live.fake.wait_for(lambda f: f.calls_to("views.open"), what="deny modal")
    view = opened.args["view"]
    assert opened.args["trigger_id"] == "trig-1" and view["callback_id"] == cards.DENY_CALLBACK
    assert json.loads(view["private_metadata"])["args_hash"] == gate.args_hash
    assert (await live.gateway.get_gate(gate.gate_id)).status is GateStatus.PENDING  # type: ignore[union-attr]

    values = {
        cards.REASON_BLOCK: {
            cards.REASON_ACTION: {"type": "plain_text_input", "value": "  wrong recipient  "}
        }
    }
    resp = await live.client.view_submission(
        view["callback_id"], view["private_metadata"], values=values, user_id=APPROVER
    )
    assert resp.status == 200 and resp.text == ""
    done = await finished(live, run_id)
    assert done.status is RunStatus.COMPLETED
    decided = await live.gateway.get_gate(gate.gate_id)
    assert decided is not None
    assert (decided.status, decided.decided_by, decided.reason) == (
        GateStatus.DENIED,
        APPROVER,
        "wrong recipient",
    )
    assert journal_lines(journal) == []
    msg = await live.wait_card(gate.gate_id, "Denied")
    assert "wrong recipient" in str(msg.blocks) and "gate_deny" not in str(msg.blocks)
    # The root message does not read as if the email went out.
    thread_ts = done.origin["thread_ts"]
    await live.fake.wait_for(
        lambda f: f.shows(CHANNEL, thread_ts, "✅ completed · 1 call denied"), what="root"
    )


async def test_unauthorized_and_self_approval_are_refused(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "delete user 7"
    fake_openai.script(task, [call("delete_user", {"user_id": "7"}), reply("deleted")])
    run_id = await live.start_task(task, user_id=REQUESTER)
    gate = await live.gate_of(run_id)
    fake = live.fake

    await live.client.action(
        "gate_approve",
        cards.button_value(gate),
        user_id=STRANGER,
        response_url=fake.response_url("stranger"),
    )
    (r,) = await fake.wait_for(lambda f: f.responses("stranger"))
    assert "not on the approver list" in r.args["text"] and r.args["response_type"] == "ephemeral"

    await live.client.action(
        "gate_deny",
        cards.button_value(gate),
        user_id=STRANGER,
        response_url=fake.response_url("stranger2"),
    )
    (r,) = await fake.wait_for(lambda f: f.responses("stranger2"))
    assert "not on the approver list" in r.args["text"]
    assert not fake.calls_to("views.open"), "no deny form for someone who may not deny"

    await live.client.action(
        "gate_approve",
        cards.button_value(gate),
        user_id=REQUESTER,
        response_url=fake.response_url("self"),
    )
    (r,) = await fake.wait_for(lambda f: f.responses("self"))
    assert "ALLOW_SELF_APPROVAL" in r.args["text"]

    await asyncio.sleep(0.2)
    still = await live.gateway.get_gate(gate.gate_id)
    assert still is not None and still.status is GateStatus.PENDING
    assert "gate_approve" in str((await live.card(gate.gate_id)).blocks), (
        "buttons stay for real approvers"
    )
    assert journal_lines(journal) == []

    # A member of the approver user group (S…) may approve.
    await live.client.action("gate_approve", cards.button_value(gate), user_id=GROUP_MEMBER)
    assert (await finished(live, run_id)).status is RunStatus.COMPLETED
    assert journal_lines(journal) == ["delete_user:7"]
    assert fake.calls_to("usergroups.users.list")


async def test_self_approval_allowed_when_enabled(
    make_bot: Any, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    bot: BotHarness = await make_bot(ALLOW_SELF_APPROVAL="true", APPROVERS=REQUESTER)
    bot.start_worker(redis_url, fake_openai.base_url)
    task = "delete user 8"
    fake_openai.script(task, [call("delete_user", {"user_id": "8"}), reply("deleted")])
    run_id = await bot.start_task(task, user_id=REQUESTER)
    gate = await bot.gate_of(run_id)
    await bot.client.action("gate_approve", cards.button_value(gate), user_id=REQUESTER)
    assert (await finished(bot, run_id)).status is RunStatus.COMPLETED
    assert journal_lines(journal) == ["delete_user:8"]


async def test_no_approvers_means_nobody_approves(
    make_bot: Any, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    bot: BotHarness = await make_bot(APPROVERS="")
    bot.start_worker(redis_url, fake_openai.base_url)
    task = "delete user 9"
    fake_openai.script(task, [call("delete_user", {"user_id": "9"}), reply("deleted")])
    run_id = await bot.start_task(task)
    gate = await bot.gate_of(run_id)
    await bot.client.action(
        "gate_approve",
        cards.button_value(gate),
        user_id=APPROVER,
        response_url=bot.fake.response_url("x"),
    )
    (r,) = await bot.fake.wait_for(lambda f: f.responses("x"))
    assert "No approvers are configured" in r.args["text"]
    assert (await bot.gateway.get_gate(gate.gate_id)).status is GateStatus.PENDING  # type: ignore[union-attr]


async def test_double_click_and_approve_deny_race_make_one_decision(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "delete user 5"
    fake_openai.script(task, [call("delete_user", {"user_id": "5"}), reply("deleted")])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    fake = live.fake
    meta = json.dumps({"gate_id": gate.gate_id, "channel": CHANNEL, "args_hash": gate.args_hash})
    values = {cards.REASON_BLOCK: {cards.REASON_ACTION: {"value": "no"}}}
    clicks = [
        live.client.action(
            "gate_approve",
            cards.button_value(gate),
            user_id=APPROVER,
            response_url=fake.response_url("a1"),
        ),
        live.client.action(
            "gate_approve",
            cards.button_value(gate),
            user_id=APPROVER,
            response_url=fake.response_url("a2"),
        ),
        live.client.action(
            "gate_approve",
            cards.button_value(gate),
            user_id=APPROVER2,
            response_url=fake.response_url("a3"),
        ),
        live.client.view_submission(cards.DENY_CALLBACK, meta, values=values, user_id=APPROVER2),
        live.client.view_submission(cards.DENY_CALLBACK, meta, values=values, user_id=GROUP_MEMBER),
    ]
    results = await asyncio.gather(*clicks)
    assert [r.status for r in results] == [200] * 5
    done = await finished(live, run_id)
    assert done.status is RunStatus.COMPLETED
    final = await live.gateway.get_gate(gate.gate_id)
    assert final is not None and final.status in (GateStatus.APPROVED, GateStatus.DENIED)
    executed = journal_lines(journal)
    assert executed == (["delete_user:5"] if final.status is GateStatus.APPROVED else [])
    # Everyone but the winner is told who decided first.
    verb = final.status.value

    def notices(f: Any) -> list[Any]:
        return [
            c
            for c in f.calls
            if f"Already {verb} by <@{final.decided_by}>" in str(c.args.get("text"))
        ]

    await fake.wait_for(lambda f: len(notices(f)) >= 4, what="four already-decided notices")
    await asyncio.sleep(0.3)
    assert len(notices(fake)) == 4, [(c.method, c.args.get("text")) for c in fake.calls]
    outcome = "Approved" if verb == "approved" else "Denied"
    await live.wait_card(gate.gate_id, f"{outcome}* by <@{final.decided_by}>")


async def test_expiry_updates_the_card(
    bot: BotHarness, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    bot.start_worker(redis_url, fake_openai.base_url, APPROVAL_TIMEOUT=1)
    task = "delete user 3"

    def told_expired(messages: list[dict[str, Any]]) -> None:
        tool = [m["content"] for m in messages if m.get("role") == "tool"]
        assert tool and "timed out" in tool[-1] and "Not executed" in tool[-1], tool

    fake_openai.script(
        task, [call("delete_user", {"user_id": "3"}), reply("nobody answered", expect=told_expired)]
    )
    run_id = await bot.start_task(task)
    gate = await bot.gate_of(run_id)
    msg = await bot.wait_card(gate.gate_id, "Expired", timeout=10)
    assert "no decision within 1 s, not executed" in str(msg.blocks)
    assert "gate_approve" not in str(msg.blocks)
    await bot.client.action(
        "gate_approve",
        cards.button_value(gate),
        user_id=APPROVER,
        response_url=bot.fake.response_url("late"),
    )
    (r,) = await bot.fake.wait_for(lambda f: f.responses("late"))
    assert "already expired" in r.args["text"]
    await finished(bot, run_id)
    assert journal_lines(journal) == []


async def test_cancel_updates_cards_and_thread(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "delete user 11"
    fake_openai.script(task, [call("delete_user", {"user_id": "11"}), reply("never")])
    run_id = await live.start_task(task, user_id=REQUESTER)
    gate = await live.gate_of(run_id)
    fake = live.fake

    await live.client.command(
        f"cancel {run_id}", user_id=STRANGER, response_url=fake.response_url("no")
    )
    (r,) = await fake.wait_for(lambda f: f.responses("no"))
    assert "Only the person who started this run or an approver" in r.args["text"]
    assert (await live.gateway.get_run(run_id)).status is RunStatus.AWAITING_APPROVAL  # type: ignore[union-attr]

    await live.client.command("status", user_id=REQUESTER, response_url=fake.response_url("st"))
    (r,) = await fake.wait_for(lambda f: f.responses("st"))
    assert run_id in str(r.args["blocks"]) and "waiting: `delete_user`" in str(r.args["blocks"])

    await live.client.command(
        f"cancel {run_id}", user_id=REQUESTER, response_url=fake.response_url("yes")
    )
    (r,) = await fake.wait_for(lambda f: f.responses("yes"))
    assert f"Cancelled run `{run_id}`" in r.args["text"]
    msg = await live.wait_card(gate.gate_id, "Cancelled")
    assert "<@U0REQ>" in str(msg.blocks) and "gate_approve" not in str(msg.blocks)
    run = await live.gateway.get_run(run_id)
    assert run is not None and run.status is RunStatus.CANCELLED
    thread_ts = run.origin["thread_ts"]
    await fake.wait_for(
        lambda f: any("Run cancelled" in m.text for m in f.thread(CHANNEL, thread_ts))
    )
    await fake.wait_for(lambda f: f.shows(CHANNEL, thread_ts, "cancelled"))

    await live.client.command(
        f"cancel {run_id}", user_id=REQUESTER, response_url=fake.response_url("again")
    )
    (r,) = await fake.wait_for(lambda f: f.responses("again"))
    assert "already finished" in r.args["text"]
    assert journal_lines(journal) == []


async def test_rate_limited_slack_calls_are_retried(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "delete user 12"
    fake_openai.script(task, [call("delete_user", {"user_id": "12"}), reply("ok")])
    live.fake.fail_next("chat.postMessage", 1, retry_after=1)
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    live.fake.fail_next("chat.update", 2, retry_after=0)
    await live.client.action("gate_approve", cards.button_value(gate), user_id=APPROVER)
    await live.wait_card(gate.gate_id, "Approved* by")
    statuses = [
        c.status for c in live.fake.calls if c.method in ("chat.postMessage", "chat.update")
    ]
    assert statuses.count(429) == 3 and statuses[0] == 429 and statuses[1] == 200
    assert (await finished(live, run_id)).status is RunStatus.COMPLETED


async def test_slack_outage_never_loses_a_decision(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "delete user 13"
    fake_openai.script(task, [call("delete_user", {"user_id": "13"}), reply("ok")])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    live.fake.fail_next(
        "chat.update", 30, status=503, retry_after=None, error="service_unavailable"
    )
    live.fake.fail_next(
        "chat.postMessage", 30, status=503, retry_after=None, error="service_unavailable"
    )
    await live.client.action("gate_approve", cards.button_value(gate), user_id=APPROVER)
    assert (await finished(live, run_id)).status is RunStatus.COMPLETED
    assert journal_lines(journal) == ["delete_user:13"]
    decided = await live.gateway.get_gate(gate.gate_id)
    assert decided is not None and decided.status is GateStatus.APPROVED


async def test_click_after_the_deadline_expires_the_gate(
    bot: BotHarness, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """The sweeper has not run yet (long interval): the late click itself expires the gate."""
    bot.start_worker(redis_url, fake_openai.base_url, APPROVAL_TIMEOUT=1, SWEEP_INTERVAL=60)
    task = "delete user 14"
    fake_openai.script(task, [call("delete_user", {"user_id": "14"}), reply("too late")])
    run_id = await bot.start_task(task)
    gate = await bot.gate_of(run_id)
    await asyncio.sleep(1.3)
    await bot.client.action(
        "gate_approve",
        cards.button_value(gate),
        user_id=APPROVER,
        response_url=bot.fake.response_url("late"),
    )
    (r,) = await bot.fake.wait_for(lambda f: f.responses("late"))
    assert "already expired" in r.args["text"]
    await bot.wait_card(gate.gate_id, "Expired")
    assert (await finished(bot, run_id)).status is RunStatus.COMPLETED
    assert journal_lines(journal) == []


async def test_20kb_argument_card_and_full_view(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "send the big report"
    body = "".join(f"line {i:05d}: <data & more>\n" for i in range(800))  # ~24 KB, with & < >
    args = {"to": "board@bigcorp.com", "subject": "report", "body": body}
    fake_openai.script(task, [call("send_email", args), reply("sent")])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    card = await live.card(gate.gate_id)
    text = json.dumps(card.blocks)
    assert "Arguments truncated" in text and "View all arguments" in text
    assert len(card.blocks) <= 50 and all(
        len(b.get("text", {}).get("text", "")) <= 3000 for b in card.blocks
    )
    posted = [
        c
        for c in live.fake.calls_to("chat.postMessage")
        if c.args.get("thread_ts") and "blocks" in c.args
    ]
    assert posted and all(c.ok for c in posted), "Slack (the fake, validating) accepted the card"

    await live.client.action("gate_args", gate.gate_id, user_id=APPROVER, trigger_id="trig-args")
    (opened,) = await live.fake.wait_for(lambda f: f.calls_to("views.open"))
    assert opened.ok
    shown = "".join(
        b["text"]["text"].removeprefix("```\n").removesuffix("\n```")
        for b in opened.args["view"]["blocks"][1:]
        if b["type"] == "section"
    )
    assert shown == cards.escape(cards.pretty_args(args)), (
        "every character is viewable before deciding"
    )

    live.fake.error_next("views.open", "expired_trigger_id")
    await live.client.action(
        "gate_deny",
        cards.button_value(gate),
        user_id=APPROVER,
        response_url=live.fake.response_url("slow"),
    )
    (r,) = await live.fake.wait_for(lambda f: f.responses("slow"))
    assert "could not open the deny form in time" in r.args["text"]
    assert (await live.gateway.get_gate(gate.gate_id)).status is GateStatus.PENDING  # type: ignore[union-attr]
    await live.client.action("gate_approve", cards.button_value(gate), user_id=APPROVER)
    assert (await finished(live, run_id)).status is RunStatus.COMPLETED
    assert journal_lines(journal) == ["send_email:board@bigcorp.com"]


async def test_shutdown_finishes_acknowledged_clicks(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "delete user 15"
    fake_openai.script(task, [call("delete_user", {"user_id": "15"}), reply("ok")])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    resp = await live.client.action("gate_approve", cards.button_value(gate), user_id=APPROVER)
    assert resp.status == 200
    await live.server.stop()  # SIGTERM right after Slack got its ack
    decided = await live.gateway.get_gate(gate.gate_id)
    assert decided is not None and decided.status is GateStatus.APPROVED
    assert (await finished(live, run_id)).status is RunStatus.COMPLETED
