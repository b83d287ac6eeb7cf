"""``/agent audit [tool|@user]``: approvers only (APPROVERS, or a gate's own approver list),
answered privately with the last audit entries; a non-approver and the requester get
nothing of the trail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_core.testing import FakeOpenAI, call, reply
from bot import cards
from tests.bot.conftest import APPROVER, REQUESTER, STRANGER, BotHarness
from tests.bot.test_approval_channels import FIN_MEMBER, money, pay  # noqa: F401

REFUSED = "Only approvers may read the audit trail."


async def audit(bot: BotHarness, text: str, user: str, name: str) -> dict[str, Any]:
    """``/agent <text>`` as ``user``: the reply (its text and response type)."""
    fake = bot.fake
    body = bot.client.command_body(text, user_id=user, response_url=fake.response_url(name))
    resp = await bot.client.post(body)
    assert resp.status == 200, resp.text
    if resp.text:
        return dict(resp.json())
    (r,) = await fake.wait_for(lambda f: f.responses(name), what=f"the reply to {text!r}")
    return dict(r.args)


async def approved_and_ran(bot: BotHarness, fake_openai: FakeOpenAI, task: str) -> str:
    fake_openai.script(task, [call("delete_user", {"user_id": "42"}), reply("gone")])
    run_id = await bot.start_task(task)
    gate = await bot.gate_of(run_id)
    await bot.client.action(cards.APPROVE_ACTION, cards.button_value(gate), user_id=APPROVER)
    await bot.wait_card(gate.gate_id, "user 42 deleted")
    return gate.gate_id


async def test_an_approver_reads_the_trail_privately_and_others_are_refused(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    gid = await approved_and_ran(live, fake_openai, "remove user 42")
    got = await audit(live, "audit", APPROVER, "a1")
    assert got["response_type"] == "ephemeral"
    lines = got["text"].splitlines()
    assert lines[0] == "*The last 3 audit entries* (newest first)"
    assert [(f"gate `{gid}`" in x) for x in lines[1:]] == [True, True, True]
    assert "*delete_user* ran" in lines[1]
    assert f"*delete_user* approved by <@{APPROVER}>" in lines[2]
    assert f"*delete_user* asked for by <@{REQUESTER}>" in lines[3]
    for who, name in ((STRANGER, "s1"), (REQUESTER, "r1")):
        refused = await audit(live, "audit", who, name)
        assert (refused["response_type"], refused["text"]) == ("ephemeral", REFUSED)
        refused = await audit(live, f"audit <@{APPROVER}>", who, name + "b")
        assert refused["text"] == REFUSED
    # Filters: by tool, by person (a mention as Slack sends it, escaped), by a name.
    by_tool = await audit(live, "audit delete_user", APPROVER, "a2")
    assert by_tool["text"].startswith("*The last 3 audit entries of `delete_user`*")
    none = await audit(live, "audit send_email", APPROVER, "a3")
    assert none["text"] == "The audit trail has no entries of `send_email`."
    mine = await audit(live, f"audit &lt;@{APPROVER}|boss&gt;", APPROVER, "a4")
    assert mine["text"].startswith(f"*The last 1 audit entries by <@{APPROVER}>*")
    named = await audit(live, "audit @boss", APPROVER, "a5")
    assert "member ID" in named["text"]
    # Nothing was started by any of these commands.
    assert len(await live.gateway.runs_for_user(APPROVER, limit=10)) == 0


async def test_a_tools_own_approver_may_read_it_too(
    money: BotHarness,  # noqa: F811
    fake_openai: FakeOpenAI,
) -> None:
    gate = await pay(money, fake_openai)
    got = await audit(money, "audit pay_invoice", FIN_MEMBER, "f1")
    assert got["response_type"] == "ephemeral"
    assert f"gate `{gate.gate_id}`" in got["text"] and "asked for" in got["text"]
    assert (await audit(money, "audit", STRANGER, "f2"))["text"] == REFUSED
