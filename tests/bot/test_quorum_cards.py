"""More than one approver, in Slack: the card's progress, the clickers' replies, Approve all
and Home. The bot, a worker, Redis, the fake Slack and the fake model all run for real."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agent_core import GateStatus, RunStatus
from agent_core.testing import FakeOpenAI, call, calls, reply
from bot import cards
from tests.agents import quorum, told_exactly
from tests.bot.conftest import (
    APPROVER,
    APPROVER2,
    CHANNEL,
    GROUP_MEMBER,
    REQUESTER,
    BotHarness,
    Workers,
    bot_settings,
    journal_lines,
    wait_until,
)
from tests.bot.test_approve_all import all_message, buttons
from tests.bot.test_home import home_click, home_lacks, home_shows, open_home
from tests.slack_fake import FakeSlack

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def qbot(make_multi: Callable[..., Awaitable[BotHarness]], workers: Workers) -> BotHarness:
    """The bot serving the ``quorum`` agent, and a worker running it."""
    workers([quorum])
    return await make_multi(agents=[quorum])


async def click(
    bot: BotHarness, action: str, value: str, user: str, name: str, ts: str | None = None
) -> str:
    """``user`` clicks a button; the ephemeral reply they got (through response_url)."""
    resp = await bot.client.action(
        action, value, user_id=user, message_ts=ts, response_url=bot.fake.response_url(name)
    )
    assert resp.status == 200, resp.text
    (told,) = await bot.fake.wait_for(lambda f: f.responses(name), what=f"reply to {name}")
    assert told.args["response_type"] == "ephemeral"
    return str(told.args["text"])


async def finished(bot: BotHarness, run_id: str) -> Any:
    async def done() -> Any:
        run = await bot.gateway.get_run(run_id)
        return run if run is not None and run.status.finished else None

    return await wait_until(done, timeout=15)


async def test_two_people_approve_on_the_card_and_the_model_is_told_both(
    qbot: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script(
        "wire 500",
        [
            call("wire", {"amount": 500}),
            reply(
                "sent", expect=told_exactly(f"wired 500\n\nApproved by {APPROVER} and {APPROVER2}.")
            ),
        ],
    )
    run_id = await qbot.start_task("wire 500")
    gate = await qbot.gate_of(run_id)
    card = await qbot.wait_card(gate.gate_id, "0 of 2 approvals")
    value = cards.button_value(gate)
    # The requester never counts.
    text = await click(qbot, cards.APPROVE_ACTION, value, REQUESTER, "own", card.ts)
    assert text.startswith("You asked for this run, so someone else has to approve")
    text = await click(qbot, cards.APPROVE_ACTION, value, APPROVER, "first", card.ts)
    assert text == (
        f"✅ Your approval is counted: 1 of 2 approvals: <@{APPROVER}>. The call runs once the "
        "others approve (waiting for 1 more)."
    )
    card = await qbot.wait_card(gate.gate_id, f"1 of 2 approvals: <@{APPROVER}>")
    assert cards.APPROVE_ACTION in str(card.blocks), "the buttons stay while it needs more"
    text = await click(qbot, cards.APPROVE_ACTION, value, APPROVER, "again", card.ts)
    assert text == (
        f"You already approved this request; 1 of 2 approvals: <@{APPROVER}>. It needs "
        "someone else."
    )
    assert journal_lines(journal) == []
    resp = await qbot.client.action(
        cards.APPROVE_ACTION, value, user_id=APPROVER2, message_ts=card.ts
    )
    assert resp.status == 200
    done = await finished(qbot, run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "sent")
    card = await qbot.wait_card(gate.gate_id, "Executed")
    assert f"✅ *Approved* by <@{APPROVER}> and <@{APPROVER2}> at" in str(card.blocks)
    assert cards.APPROVE_ACTION not in str(card.blocks)
    assert journal_lines(journal) == ["wire:500"]


async def test_two_approvers_racing_for_the_last_approval_decide_once(
    qbot: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script("wire 800", [call("wire", {"amount": 800}), reply("sent")])
    run_id = await qbot.start_task("wire 800")
    gate = await qbot.gate_of(run_id)
    value = cards.button_value(gate)
    await click(qbot, cards.APPROVE_ACTION, value, APPROVER, "first")
    results = await asyncio.gather(
        qbot.client.action(
            cards.APPROVE_ACTION,
            value,
            user_id=APPROVER2,
            response_url=qbot.fake.response_url("r1"),
        ),
        qbot.client.action(
            cards.APPROVE_ACTION,
            value,
            user_id=GROUP_MEMBER,
            response_url=qbot.fake.response_url("r2"),
        ),
    )
    assert [r.status for r in results] == [200, 200]
    await finished(qbot, run_id)
    decided = await qbot.gateway.get_gate(gate.gate_id)
    assert decided is not None and decided.status is GateStatus.APPROVED
    assert decided.decided_by in (APPROVER2, GROUP_MEMBER)
    assert [a.by for a in decided.approvals] == [APPROVER, decided.decided_by]
    loser = "r2" if decided.decided_by == APPROVER2 else "r1"
    (told,) = await qbot.fake.wait_for(lambda f: f.responses(loser))
    assert told.args["text"].startswith(
        f"Already approved by <@{APPROVER}> and <@{decided.decided_by}> at "
    )
    assert journal_lines(journal) == ["wire:800"]


async def test_one_deny_ends_a_half_approved_request(
    qbot: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script(
        "wire 900",
        [
            call("wire", {"amount": 900}),
            reply(
                "not sent",
                expect=told_exactly(
                    f"Not executed: the user {APPROVER2} declined this call to wire. Their "
                    "reason: wrong account Do not retry this call (or an equivalent one) unless "
                    "the user asks you to."
                ),
            ),
        ],
    )
    run_id = await qbot.start_task("wire 900")
    gate = await qbot.gate_of(run_id)
    await click(qbot, cards.APPROVE_ACTION, cards.button_value(gate), APPROVER, "first")
    meta = json.dumps({"gate_id": gate.gate_id, "channel": CHANNEL, "args_hash": gate.args_hash})
    values = {
        cards.REASON_BLOCK: {
            cards.REASON_ACTION: {"type": "plain_text_input", "value": "wrong account"}
        }
    }
    resp = await qbot.client.view_submission(
        cards.DENY_CALLBACK, meta, values=values, user_id=APPROVER2
    )
    assert resp.status == 200
    done = await finished(qbot, run_id)
    assert done.final == "not sent"
    card = await qbot.wait_card(gate.gate_id, "Denied")
    shown = str(card.blocks)
    assert f"🚫 *Denied* by <@{APPROVER2}>" in shown
    assert f"Approvals before that: 1 of 2 approvals: <@{APPROVER}>" in shown
    assert journal_lines(journal) == []


async def test_a_group_quorum_takes_one_approver_from_each_group(
    qbot: BotHarness, fake_openai: FakeOpenAI, fake_slack: FakeSlack, journal: Path
) -> None:
    fake_slack.set_usergroup("S0SRE", [APPROVER, GROUP_MEMBER])
    fake_slack.set_usergroup("S0SECURITY", [APPROVER2])
    fake_openai.script("rotate prod", [call("rotate_keys", {"env": "prod"}), reply("rotated")])
    run_id = await qbot.start_task("rotate prod")
    gate = await qbot.gate_of(run_id)
    value = cards.button_value(gate)
    await qbot.wait_card(gate.gate_id, "⏳ `S0SRE` · ⏳ `S0SECURITY`")
    text = await click(qbot, cards.APPROVE_ACTION, value, APPROVER, "sre")
    assert text.startswith(
        f"✅ Your approval is counted: ✅ `S0SRE`: <@{APPROVER}> · ⏳ `S0SECURITY`"
    )
    assert text.endswith("(waiting for `S0SECURITY`).")
    text = await click(qbot, cards.APPROVE_ACTION, value, GROUP_MEMBER, "sre2")
    assert text.startswith("Your group has already approved this request")
    await qbot.wait_card(gate.gate_id, f"✅ `S0SRE`: <@{APPROVER}> · ⏳ `S0SECURITY`")
    resp = await qbot.client.action(cards.APPROVE_ACTION, value, user_id=APPROVER2)
    assert resp.status == 200
    await finished(qbot, run_id)
    card = await qbot.wait_card(gate.gate_id, "Executed")
    assert f"Approved* by <@{APPROVER}> and <@{APPROVER2}>" in str(card.blocks)
    assert journal_lines(journal) == ["rotate_keys:prod"]


async def test_approve_all_counts_one_approval_per_gate_for_the_clicker(
    qbot: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script(
        "wire 1 and 2",
        [calls([("wire", {"amount": 1001}), ("wire", {"amount": 1002})]), reply("ok")],
    )
    run_id = await qbot.start_task("wire 1 and 2")
    _gates, msg = await all_message(qbot, run_id)
    value = buttons(msg)[cards.TURN_APPROVE_ACTION]["value"]
    text = await click(qbot, cards.TURN_APPROVE_ACTION, value, REQUESTER, "own", msg.ts)
    assert text.startswith("You asked for this run")
    text = await click(qbot, cards.TURN_APPROVE_ACTION, value, APPROVER, "first", msg.ts)
    assert text == (
        f"Your approval is counted on `wire` (1 of 2 approvals: <@{APPROVER}>), `wire` (1 of 2 "
        f"approvals: <@{APPROVER}>): they need more approvers."
    )
    text = await click(qbot, cards.TURN_APPROVE_ACTION, value, APPROVER, "again", msg.ts)
    assert "Your approval was not recorded on `wire`, `wire`: You already approved" in text
    assert journal_lines(journal) == []
    text = await click(qbot, cards.TURN_APPROVE_ACTION, value, APPROVER2, "second", msg.ts)
    assert text == "✅ You approved 2 calls: `wire`, `wire`."
    await finished(qbot, run_id)

    async def settled() -> Any:
        m = qbot.fake.message(CHANNEL, msg.ts)
        return m if m is not None and "All 2 approved" in str(m.blocks) else None

    done = await wait_until(settled)
    assert done.text == f"✅ All 2 approved by <@{APPROVER}> and <@{APPROVER2}>"
    assert sorted(journal_lines(journal)) == ["wire:1001", "wire:1002"]


async def test_home_shows_progress_and_not_to_who_approved_already(
    qbot: BotHarness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script("wire 77777", [call("wire", {"amount": 77777}), reply("ok")])
    run_id = await qbot.start_task("wire 77777")
    gate = await qbot.gate_of(run_id)
    for user in (APPROVER, APPROVER2):
        await open_home(qbot, user)
        await home_shows(qbot, user, "0 of 2 approvals")
    await click(qbot, cards.APPROVE_ACTION, cards.button_value(gate), APPROVER, "first")
    await home_shows(qbot, APPROVER2, f"1 of 2 approvals: <@{APPROVER}>")
    await home_lacks(qbot, APPROVER, gate.gate_id)
    # Clicks on Home (forged: Home offers them no Approve) follow the card's rules.
    await open_home(qbot, REQUESTER)
    await home_click(qbot, cards.APPROVE_ACTION, cards.button_value(gate), REQUESTER)
    await home_shows(qbot, REQUESTER, "You asked for this run")
    await home_click(qbot, cards.APPROVE_ACTION, cards.button_value(gate), APPROVER)
    await home_shows(qbot, APPROVER, "You already approved this request")
    again = await qbot.gateway.get_gate(gate.gate_id)
    assert again is not None and again.status is GateStatus.PENDING
    assert [a.by for a in again.approvals] == [APPROVER]
    await qbot.gateway.cancel_run(run_id, by=REQUESTER)


async def test_an_approval_counted_towards_a_quorum_is_among_the_approvers_decisions(
    qbot: BotHarness, fake_openai: FakeOpenAI
) -> None:
    """The first approver's Home lists their approval at once (it waits for more), then
    with the outcome once the second approver completes the quorum; the second's lists
    their decision as a card click's would be."""
    fake_openai.script("wire 66666", [call("wire", {"amount": 66666}), reply("ok")])
    run_id = await qbot.start_task("wire 66666")
    gate = await qbot.gate_of(run_id)
    for user in (APPROVER, APPROVER2):
        await open_home(qbot, user)
        await home_shows(qbot, user, "You have not decided anything yet")
    await click(qbot, cards.APPROVE_ACTION, cards.button_value(gate), APPROVER, "first")
    await home_shows(qbot, APPROVER, "👍 You approved (1 of 2; it waits for more)")
    second = await qbot.client.action(
        cards.APPROVE_ACTION, cards.button_value(gate), user_id=APPROVER2
    )
    assert second.status == 200, second.text
    view = await home_shows(qbot, APPROVER, "👍 You approved; then ✅ Approved")
    assert "66666" in json.dumps(view["blocks"], ensure_ascii=False)
    other = await home_shows(qbot, APPROVER2, "✅ Approved")
    assert "You approved" not in json.dumps(other["blocks"], ensure_ascii=False)


async def test_quorum_groups_are_looked_up_and_fail_closed(fake_slack: FakeSlack) -> None:
    from agent_core import Quorum
    from bot.app import make_web_client
    from bot.approvers import Approvers
    from tests.bot.test_approvers import gate as plain_gate

    client = make_web_client(bot_settings(fake_slack))
    g = plain_gate().model_copy(update={"quorum": Quorum(count=2, groups=["S0SRE", "S0SEC"])})
    fake_slack.set_usergroup("S0SRE", ["U5"])
    fake_slack.set_usergroup("S0SEC", ["U5", "U6"])
    a = Approvers(["U5", "U6"], client)
    assert await a.quorum_groups("U5", g) == ["S0SRE", "S0SEC"]
    assert await a.quorum_groups("U6", g) == ["S0SEC"]
    assert await a.quorum_groups("U5", plain_gate()) == []  # no quorum: no lookup
    fake_slack.fail_next(
        "usergroups.users.list", 2, status=500, retry_after=None, error="fatal_error"
    )
    fresh = Approvers(["U5"], client)
    assert await fresh.quorum_groups("U5", g) == []  # a failed lookup: a member of none
