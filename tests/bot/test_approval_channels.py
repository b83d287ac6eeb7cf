"""Approval channels and per-tool approvers (agent_core/routes.py, bot/routing.py).

A tool routed to a channel has its card posted there, with a link to the task's thread, and
one line in the thread that follows the gate to its outcome; a channel the app cannot post
in sends the card back to the thread, saying why. Only the tool's approvers may decide its
calls, wherever the click comes from (card, Approve all, Home).

The bot, worker, Redis, the fake Slack and the fake model all run for real.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_core import Decision, Gate, GateStatus, RunStatus
from agent_core.testing import FakeOpenAI, call, calls, reply
from bot import cards, routing
from tests.agents import FINANCE_CHANNEL, FINANCE_GROUP, finance
from tests.bot.conftest import (
    APPROVER,
    APPROVER2,
    CHANNEL,
    REQUESTER,
    BotHarness,
    core_settings,
    journal_lines,
    wait_until,
)
from tests.bot.test_approve_all import buttons
from tests.bot.test_home import buttons as home_buttons
from tests.bot.test_home import home, home_click, home_shows, open_home, text_of
from tests.core.harness import Harness

FIN_MEMBER = "U0FINANCE"  # in the finance group, not in APPROVERS
WAITING = f"⏳ `pay_invoice`: waiting for approval in <#{FINANCE_CHANNEL}>"


@pytest.fixture
async def money(
    bot: BotHarness, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> BotHarness:
    """The bot with a worker serving the finance agent; the finance group holds FIN_MEMBER."""
    bot.fake.set_usergroup(FINANCE_GROUP, [FIN_MEMBER])
    start_finance(bot, redis_url, fake_openai)
    return bot


def start_finance(bot: BotHarness, redis_url: str, fake_openai: FakeOpenAI, **env: Any) -> None:
    bot.gateway.agent_name = finance.name  # `/agent <task>` starts the finance agent
    bot.core = Harness(bot.redis, core_settings(redis_url, fake_openai.base_url, **env), finance)
    bot.core.start_worker()


async def pay(bot: BotHarness, fake_openai: FakeOpenAI, task: str = "pay invoice 7") -> Gate:
    fake_openai.script(task, [call("pay_invoice", {"invoice": "7", "amount": 120}), reply("paid")])
    run_id = await bot.start_task(task)
    return await bot.gate_of(run_id)


def thread_of(bot: BotHarness, gate: Gate) -> list[Any]:
    return bot.fake.thread(CHANNEL, str(gate.origin["thread_ts"]))


async def thread_line(bot: BotHarness, gate: Gate, needle: str) -> Any:
    """The gate's line in the task's thread, once it contains ``needle``."""

    async def found() -> Any:
        lines = [m for m in thread_of(bot, gate) if "pay_invoice`:" in m.text]
        return lines[0] if len(lines) == 1 and needle in lines[0].text else None

    try:
        return await wait_until(found)
    except AssertionError:
        shown = [m.text for m in thread_of(bot, gate)]
        raise AssertionError(f"the thread never showed {needle!r}: {shown}") from None


async def click(bot: BotHarness, gate: Gate, user: str, *, told: bool = True) -> Any:
    """``user`` clicks Approve on the gate's card; what they are told (``told``: wait for it)."""
    action = cards.APPROVE_ACTION
    card = await bot.card(gate.gate_id)
    name = f"{user}-{action}-{card.ts}"
    resp = await bot.client.action(
        action,
        cards.button_value(gate),
        user_id=user,
        channel_id=card.channel,
        message_ts=card.ts,
        response_url=bot.fake.response_url(name),
    )
    assert resp.status == 200
    if not told:
        return None
    (said,) = await bot.fake.wait_for(lambda f: f.responses(name))
    return said.args.get("text")


async def finished(bot: BotHarness, run_id: str) -> RunStatus:
    async def done() -> RunStatus | None:
        run = await bot.gateway.get_run(run_id)
        return run.status if run is not None and run.status.finished else None

    status: RunStatus = await wait_until(done, timeout=15)
    return status


# --------------------------------------------------------------------------- the channel
async def test_the_card_lands_in_the_channel_and_the_thread_line_follows_an_approval(
    money: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    gate = await pay(money, fake_openai)
    assert gate.approvers == [FINANCE_GROUP] and gate.approval_channel == FINANCE_CHANNEL
    card = await money.card(gate.gate_id)
    assert card.channel == FINANCE_CHANNEL and card.thread_ts is None, "top level, in #finance"
    root_ts = str(gate.origin["thread_ts"])
    link = f"archives/{CHANNEL}/p{root_ts.replace('.', '')}"
    assert "|this task's thread>" in str(card.blocks) and link in str(card.blocks)
    assert cards.APPROVE_ACTION in str(card.blocks)
    line = await thread_line(money, gate, "waiting")
    assert line.text == WAITING
    assert not [m for m in thread_of(money, gate) if cards.APPROVE_ACTION in str(m.blocks)]

    await click(money, gate, FIN_MEMBER, told=False)
    assert await finished(money, gate.run_id) is RunStatus.COMPLETED
    assert journal_lines(journal) == ["pay_invoice:7:120"]
    done = await money.wait_card(gate.gate_id, "Executed")
    assert f"Approved* by <@{FIN_MEMBER}>" in str(done.blocks)
    line = await thread_line(money, gate, "approved")
    assert line.text == f"✅ `pay_invoice`: approved by <@{FIN_MEMBER}> in <#{FINANCE_CHANNEL}>"
    assert line.ts == (await thread_line(money, gate, "approved")).ts, "one line, updated"
    posts = [
        c
        for c in money.fake.calls_to("chat.postMessage")
        if c.args.get("channel") == FINANCE_CHANNEL
    ]
    assert len(posts) == 1


async def test_the_thread_line_tells_a_denial(
    money: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    gate = await pay(money, fake_openai)
    await thread_line(money, gate, "waiting")
    await money.gateway.decide(gate.gate_id, Decision.DENY, by=FIN_MEMBER, reason="wrong amount")
    line = await thread_line(money, gate, "denied")
    assert line.text == (
        f"🚫 `pay_invoice`: denied by <@{FIN_MEMBER}> in <#{FINANCE_CHANNEL}>, not executed"
        " — wrong amount"
    )
    await money.wait_card(gate.gate_id, "Denied")
    assert journal_lines(journal) == []


async def test_the_thread_line_tells_an_expiry(
    bot: BotHarness, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    start_finance(bot, redis_url, fake_openai, APPROVAL_TIMEOUT=1)
    gate = await pay(bot, fake_openai)
    line = await thread_line(bot, gate, "expired")
    assert line.text == (
        f"⌛ `pay_invoice`: expired in <#{FINANCE_CHANNEL}>, no decision within 1 s; not executed"
    )
    card = await bot.wait_card(gate.gate_id, "Expired")
    assert card.channel == FINANCE_CHANNEL and cards.APPROVE_ACTION not in str(card.blocks)
    assert journal_lines(journal) == []


async def test_the_thread_line_tells_a_cancel(
    money: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    gate = await pay(money, fake_openai)
    await thread_line(money, gate, "waiting")
    await money.gateway.cancel_run(gate.run_id, by=REQUESTER)
    line = await thread_line(money, gate, "cancelled")
    assert line.text == (
        f"✖️ `pay_invoice`: cancelled in <#{FINANCE_CHANNEL}>, the run was cancelled; not executed"
    )
    card = await money.wait_card(gate.gate_id, "Cancelled")
    assert card.channel == FINANCE_CHANNEL and cards.APPROVE_ACTION not in str(card.blocks)


def test_a_task_asked_in_the_approval_channel_keeps_its_card_in_its_thread() -> None:
    base = {
        "gate_id": "g",
        "run_id": "r",
        "call_id": "c",
        "turn": "1",
        "tool": "pay_invoice",
        "args": "{}",
        "args_hash": "h",
        "status": "pending",
        "created_at": "1",
        "deadline": "2",
        "timeout": "1",
        "approval_channel": FINANCE_CHANNEL,
    }
    here = Gate.from_hash({**base, "origin": json.dumps({"channel": FINANCE_CHANNEL})})
    elsewhere = Gate.from_hash({**base, "origin": json.dumps({"channel": CHANNEL})})
    outside = Gate.from_hash(base)  # not started from Slack
    assert (routing.routed(here), routing.routed(elsewhere), routing.routed(outside)) == (
        False,
        True,
        False,
    )


# --------------------------------------------------------------------------- falling back
@pytest.mark.parametrize(
    ("setup", "why"),
    [
        ("public", "the app is not in that channel"),
        ("private", "that channel does not exist, or is private and the app is not in it"),
        ("archived", "that channel is archived"),
    ],
)
async def test_a_channel_the_app_cannot_post_in_sends_the_card_to_the_thread(
    money: BotHarness, fake_openai: FakeOpenAI, journal: Path, setup: str, why: str
) -> None:
    if setup == "archived":
        money.fake.archive_channel(FINANCE_CHANNEL)
    else:
        money.fake.remove_bot(FINANCE_CHANNEL, private=setup == "private")
    gate = await pay(money, fake_openai)
    card = await money.card(gate.gate_id)
    assert card.channel == CHANNEL and card.thread_ts == gate.origin["thread_ts"]
    assert f"⚠️ Could not post in <#{FINANCE_CHANNEL}>: {why}. The card is here instead." in str(
        card.blocks
    )
    assert cards.APPROVE_ACTION in str(card.blocks)
    assert not [m for m in thread_of(money, gate) if "waiting for approval in" in m.text]
    # Still only the tool's approvers decide it.
    assert "Only the approvers of `pay_invoice`" in await click(money, gate, APPROVER)
    await click(money, gate, FIN_MEMBER, told=False)
    assert await finished(money, gate.run_id) is RunStatus.COMPLETED
    done = await money.wait_card(gate.gate_id, "Executed")
    assert "Could not post in" in str(done.blocks), "the reason stays on the card"
    assert journal_lines(journal) == ["pay_invoice:7:120"]


# --------------------------------------------------------------------------- who decides
async def test_only_the_tools_approvers_decide_on_the_card(
    money: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    gate = await pay(money, fake_openai)
    refused = (
        f"Only the approvers of `pay_invoice` may decide its calls (<!subteam^{FINANCE_GROUP}>), "
        "and you are not one of them."
    )
    for user in (APPROVER, APPROVER2):  # in APPROVERS, not in the tool's approvers
        assert await click(money, gate, user) == refused
    assert await click(money, gate, REQUESTER) == (
        "You asked for this run, so someone else has to approve its tool calls "
        "(self-approval is off: ALLOW_SELF_APPROVAL)."
    )
    g = await money.gateway.get_gate(gate.gate_id)
    assert g is not None and g.status is GateStatus.PENDING
    assert journal_lines(journal) == []


async def test_a_group_that_cannot_be_looked_up_approves_nobody(
    money: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    gate = await pay(money, fake_openai)
    money.fake.error_next("usergroups.users.list", "missing_scope", n=1)
    told = await click(money, gate, FIN_MEMBER)
    assert "could not be checked just now" in told
    g = await money.gateway.get_gate(gate.gate_id)
    assert g is not None and g.status is GateStatus.PENDING


async def test_the_agents_approvers_replace_approvers_and_the_tools_replace_the_agents(
    money: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "delete user 9"
    fake_openai.script(task, [call("delete_user", {"user_id": "9"}), reply("deleted")])
    run_id = await money.start_task(task)
    gate = await money.gate_of(run_id)
    assert gate.approvers == [APPROVER2] and gate.approval_channel == ""
    card = await money.card(gate.gate_id)
    assert card.channel == CHANNEL and card.thread_ts == gate.origin["thread_ts"]
    told = await click(money, gate, APPROVER)  # in APPROVERS, not in the agent's list
    assert "Only the approvers of `delete_user`" in told and "<@U0BOSS>" in told
    assert "Only the approvers" in await click(money, gate, FIN_MEMBER)
    await click(money, gate, APPROVER2, told=False)
    assert await finished(money, run_id) is RunStatus.COMPLETED
    assert journal_lines(journal) == ["delete_user:9"]


async def test_approve_all_in_the_channel_follows_the_tools_approvers(
    money: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "pay invoices 1 and 2"
    fake_openai.script(
        task,
        [
            calls([("pay_invoice", {"invoice": i, "amount": 5}) for i in ("1", "2")]),
            reply("paid"),
        ],
    )
    run_id = await money.start_task(task)

    async def turn_message() -> Any:
        gates = await money.gateway.gates(run_id)
        if len(gates) < 2:
            return None
        key = money.keys.ext("slack-turn", f"{run_id}:{gates[0].turn}", money.keys.shard_of(run_id))
        rec = await money.redis.hgetall(key)
        msg = money.fake.message(rec["channel"], rec["ts"]) if rec.get("ts") else None
        return msg

    msg = await wait_until(turn_message)
    assert msg.channel == FINANCE_CHANNEL and msg.thread_ts is None
    assert "this task's thread>" in str(msg.blocks)
    value = buttons(msg)[cards.TURN_APPROVE_ACTION]["value"]

    async def approve_all(user: str) -> str:
        name = f"all-{user}"
        resp = await money.client.action(
            cards.TURN_APPROVE_ACTION,
            value,
            user_id=user,
            channel_id=FINANCE_CHANNEL,
            message_ts=msg.ts,
            response_url=money.fake.response_url(name),
        )
        assert resp.status == 200
        (told,) = await money.fake.wait_for(lambda f: f.responses(name))
        return str(told.args["text"])

    assert "Only the approvers of `pay_invoice`" in await approve_all(APPROVER)
    assert all(g.status is GateStatus.PENDING for g in await money.gateway.gates(run_id))
    assert journal_lines(journal) == []
    assert (await approve_all(FIN_MEMBER)).startswith("✅ You approved 2 calls")
    assert await finished(money, run_id) is RunStatus.COMPLETED
    assert sorted(journal_lines(journal)) == ["pay_invoice:1:5", "pay_invoice:2:5"]


async def test_home_lists_only_what_the_person_may_decide_and_refuses_the_rest(
    money: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    for user in (APPROVER, FIN_MEMBER):
        await open_home(money, user)
        await home_shows(money, user, "Nothing waits for you")
    gate = await pay(money, fake_openai)
    view = await home_shows(money, FIN_MEMBER, "pay_invoice")
    shown = home_buttons(view, gate.gate_id)
    assert shown[cards.APPROVE_ACTION]["value"] == cards.button_value(gate)
    card = await money.card(gate.gate_id)
    assert f"archives/{FINANCE_CHANNEL}/p{card.ts.replace('.', '')}" in str(shown)
    approver_view = await home(money, APPROVER)
    assert "pay_invoice" not in text_of(approver_view)
    assert "Nothing waits for you" in text_of(approver_view)

    # A forged Home click by someone in APPROVERS but not in the tool's approvers.
    await home_click(money, cards.APPROVE_ACTION, cards.button_value(gate), APPROVER)
    await home_shows(money, APPROVER, "Only the approvers of")
    g = await money.gateway.get_gate(gate.gate_id)
    assert g is not None and g.status is GateStatus.PENDING

    await home_click(money, cards.APPROVE_ACTION, cards.button_value(gate), FIN_MEMBER)
    assert await finished(money, gate.run_id) is RunStatus.COMPLETED
    assert journal_lines(journal) == ["pay_invoice:7:120"]
    await thread_line(money, gate, "approved")


async def test_approval_routes_route_a_tool_of_the_agent(
    bot: BotHarness, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """APPROVAL_ROUTES routes a tool that sets nothing itself (as for an MCP tool), and wins
    over the agent's own approvers."""
    bot.fake.set_usergroup(FINANCE_GROUP, [FIN_MEMBER])
    routes = '{"delete_user": {"channel": "C0OPS", "approvers": ["S0FINANCE", "U0APPROVER"]}}'
    start_finance(bot, redis_url, fake_openai, APPROVAL_ROUTES=routes)
    task = "delete user 5"
    fake_openai.script(task, [call("delete_user", {"user_id": "5"}), reply("deleted")])
    run_id = await bot.start_task(task)
    gate = await bot.gate_of(run_id)
    assert gate.approvers == [FINANCE_GROUP, APPROVER] and gate.approval_channel == "C0OPS"
    card = await bot.card(gate.gate_id)
    assert card.channel == "C0OPS"
    assert "Only the approvers of `delete_user`" in await click(bot, gate, APPROVER2)
    await click(bot, gate, APPROVER, told=False)
    assert await finished(bot, run_id) is RunStatus.COMPLETED
    assert journal_lines(journal) == ["delete_user:5"]
