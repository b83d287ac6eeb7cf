"""Allow for this thread, in Slack: Approve & allow and its modal, the card of a call a grant
approved, ``/agent grants`` and Revoke, and the walk-arounds (a requester's click and a
forged form; a non-approver's Revoke). The bot, a worker, Redis, the fake Slack and the fake
model all run for real."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agent_core import GateStatus
from agent_core.grants import grant_note
from agent_core.testing import FakeOpenAI, call, reply, tool_messages
from bot import cards, grant_view
from tests.agents import shipping
from tests.bot.conftest import (
    APPROVER,
    APPROVER2,
    GROUP,
    GROUP_MEMBER,
    REQUESTER,
    BotHarness,
    Workers,
    bot_settings,
    journal_lines,
    wait_until,
)
from tests.slack_fake import FakeSlack

pytestmark = pytest.mark.timeout(60)
NOBODY = "U0NOBODY"  # on no approver list


@pytest.fixture
async def sbot(make_multi: Callable[..., Awaitable[BotHarness]], workers: Workers) -> BotHarness:
    """The bot serving the ``shipping`` agent, and a worker running it."""
    workers([shipping])
    return await make_multi(agents=[shipping])


async def click(bot: BotHarness, action: str, value: str, user: str, name: str) -> str:
    """``user`` clicks a button; the ephemeral reply they got (through response_url)."""
    resp = await bot.client.action(
        action, value, user_id=user, response_url=bot.fake.response_url(name)
    )
    assert resp.status == 200, resp.text
    (told,) = await bot.fake.wait_for(lambda f: f.responses(name), what=f"reply to {name}")
    return str(told.args["text"])


def staging_only(gate: Any) -> dict[str, Any]:
    value = json.dumps(["env", "staging"])
    return {
        grant_view.SCOPE_BLOCK: {
            grant_view.SCOPE_ACTION: {"type": "static_select", "selected_option": {"value": value}}
        }
    }


async def test_approve_and_allow_decides_the_threads_next_call_and_revoke_ends_it(
    sbot: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    told: list[str] = []

    def seen(messages: list[dict[str, Any]]) -> None:
        told.append(tool_messages(messages)[-1]["content"])

    fake_openai.script(
        "ship 1",
        [
            call("ship", {"env": "staging", "version": 1}),
            call("ship", {"env": "staging", "version": 2}),
            reply("both shipped", expect=seen),
        ],
    )
    run_id = await sbot.start_task("ship 1")
    gate = await sbot.gate_of(run_id)
    card = await sbot.card(gate.gate_id)
    labels = [
        e["text"]["text"] for b in card.blocks if b["type"] == "actions" for e in b["elements"]
    ]
    assert labels == ["Approve", "Approve & allow ship in this thread for 1 h", "Deny"]
    value = cards.button_value(gate)

    # The requester cannot grant (the button answers, no form opens) ...
    text = await click(sbot, grant_view.GRANT_ACTION, value, REQUESTER, "own")
    assert text.startswith("You asked for this run, so someone else has to approve")
    assert not sbot.fake.calls_to("views.open")
    # ... nor with a forged form: nothing is decided, no grant is recorded.
    meta = json.dumps({"gate_id": gate.gate_id, "args_hash": gate.args_hash, "channel": ""})
    forged = await sbot.client.view_submission(
        grant_view.GRANT_CALLBACK, meta, values=staging_only(gate), user_id=REQUESTER
    )
    assert forged.status == 200
    assert (await sbot.gateway.get_gate(gate.gate_id)).status is GateStatus.PENDING  # type: ignore[union-attr]
    assert await sbot.redis.hlen(sbot.keys.grants(run_id)) == 0

    # An approver opens the form: any arguments, or only one of the call's own values.
    resp = await sbot.client.action(
        grant_view.GRANT_ACTION, value, user_id=APPROVER, trigger_id="trig-g"
    )
    assert resp.status == 200
    (opened,) = await sbot.fake.wait_for(lambda f: f.calls_to("views.open"), what="grant form")
    view = opened.args["view"]
    assert view["callback_id"] == grant_view.GRANT_CALLBACK
    options = view["blocks"][1]["element"]["options"]
    assert [o["text"]["text"] for o in options] == [
        "any arguments",
        'only env="staging"',
        "only version=1",
    ]
    resp = await sbot.client.view_submission(
        view["callback_id"], view["private_metadata"], values=staging_only(gate), user_id=APPROVER
    )
    assert resp.status == 200 and resp.text == ""

    async def second_gate() -> Any:
        gates = await sbot.gateway.gates(run_id)
        return gates[1] if len(gates) > 1 and gates[1].status is not GateStatus.PENDING else None

    later = await wait_until(second_gate, timeout=15)
    card_key = sbot.keys.ext("slack-card", later.gate_id, sbot.keys.shard_of(later.gate_id))

    async def posted() -> bool:
        return bool(await sbot.redis.hget(card_key, "ts"))

    await wait_until(posted, timeout=15)
    assert (later.status, later.granted_by) == (GateStatus.APPROVED, APPROVER)
    assert later.decided_by == f"grant:{later.grant_id}"
    msg = await sbot.wait_card(later.gate_id, "grant until")
    shown = str(msg.blocks)
    assert f"*Allowed* by <@{APPROVER}>'s grant until <!date^" in shown
    assert not [b for b in msg.blocks if b["type"] == "actions"], "no buttons"
    assert "<@grant:" not in shown
    first = await sbot.wait_card(gate.gate_id, "and allowed")
    assert f"(grant `{later.grant_id}`" in str(first.blocks)
    grant = await sbot.gateway.grants.get(later.grant_id)
    assert grant is not None and (grant.field, grant.value) == ("env", "staging")

    async def done() -> Any:
        run = await sbot.gateway.get_run(run_id)
        return run if run is not None and run.status.finished else None

    await wait_until(done, timeout=15)
    note = grant_note(APPROVER, "ship", grant.expires_at, grant.created_at)
    assert told == [f"shipped 2 to staging\n\nApproved by {note}."]
    assert journal_lines(journal) == ["ship:staging:1", "ship:staging:2"]

    # /agent grants: an approver sees it with Revoke; someone on no list sees nothing.
    resp = await sbot.client.command(
        "grants", user_id=APPROVER2, response_url=sbot.fake.response_url("list")
    )
    assert resp.status == 200
    (listed,) = await sbot.fake.wait_for(lambda f: f.responses("list"), what="grants list")
    assert listed.args["response_type"] == "ephemeral"
    blocks = str(listed.args["blocks"])
    assert "`ship` of *shipping*" in blocks and 'only env="staging"' in blocks
    assert grant.grant_id in blocks and grant_view.REVOKE_ACTION in blocks
    resp = await sbot.client.command(
        "grants", user_id=NOBODY, response_url=sbot.fake.response_url("none")
    )
    (empty,) = await sbot.fake.wait_for(lambda f: f.responses("none"), what="empty list")
    assert empty.args["text"] == "No live grants you can see."
    # Revoke: refused to someone on no list (a forged click), done for an approver.
    text = await click(sbot, grant_view.REVOKE_ACTION, grant.grant_id, NOBODY, "nope")
    assert "not on the approver list" in text
    assert (await sbot.gateway.grants.get(grant.grant_id)).live()  # type: ignore[union-attr]
    text = await click(sbot, grant_view.REVOKE_ACTION, grant.grant_id, APPROVER2, "revoke")
    assert text.startswith("🔒 Revoked the grant for `ship`")
    assert not (await sbot.gateway.grants.get(grant.grant_id)).live()  # type: ignore[union-attr]


async def test_someone_the_call_was_escalated_to_may_approve_it_but_not_grant(
    fake_slack: FakeSlack,
) -> None:
    from types import SimpleNamespace

    from bot.app import make_web_client
    from bot.approvers import Approvers
    from bot.grant_actions import NOT_OFFERED, GrantActions
    from tests.bot.test_approvers import gate as make_gate

    approvers = Approvers([APPROVER], make_web_client(bot_settings(fake_slack)))
    g = make_gate().model_copy(
        update={
            "allow_for": 3600.0,
            "escalate_to": ["U0ESCALATED"],
            "escalated_at": 1.0,
            "args": {"env": "staging"},
        }
    )
    assert await approvers.why_not_decide("U0ESCALATED", g, approve=True) is None
    grants = GrantActions(SimpleNamespace(approvers=approvers))  # type: ignore[arg-type]
    assert await grants._why_not(APPROVER, g, False) is None
    why = await grants._why_not("U0ESCALATED", g, False)
    assert why == "You are not on the approver list for this agent (APPROVERS)."
    # A tool without allow_for, or a quorum's call, is never granted.
    plain = g.model_copy(update={"allow_for": None})
    assert await grants._why_not(APPROVER, plain, False) == NOT_OFFERED
    assert grant_view.buttons(plain) == []
    assert [o for o, _ in grant_view.choices(g)] == ["any", '["env", "staging"]']


async def test_a_grant_keeps_deciding_after_its_granter_leaves_the_group_until_revoked(
    sbot: BotHarness, fake_openai: FakeOpenAI, fake_slack: FakeSlack, journal: Path
) -> None:
    """Group membership is checked when a grant is made, not each time it decides
    (docs/agents/grants.md): the granter, removed from the approver group, may no longer
    click Approve, yet their grant still approves the thread's next matching call; a
    Revoke by another approver ends it."""
    fake_openai.script(
        "ship group",
        [
            call("ship", {"env": "staging", "version": 1}),
            reply("one"),
            call("ship", {"env": "staging", "version": 2}),
            reply("two"),
            call("ship", {"env": "staging", "version": 3}),
            reply("three"),
        ],
    )
    run_id = await sbot.start_task("ship group")
    gate = await sbot.gate_of(run_id)
    meta = json.dumps({"gate_id": gate.gate_id, "args_hash": gate.args_hash, "channel": ""})
    any_args = {
        grant_view.SCOPE_BLOCK: {
            grant_view.SCOPE_ACTION: {"type": "static_select", "selected_option": {"value": "any"}}
        }
    }
    resp = await sbot.client.view_submission(
        grant_view.GRANT_CALLBACK, meta, values=any_args, user_id=GROUP_MEMBER
    )
    assert resp.status == 200 and resp.text == ""
    [grant] = await sbot.gateway.grants.of_thread(run_id)
    assert grant.granted_by == GROUP_MEMBER

    async def finished() -> Any:
        run = await sbot.gateway.get_run(run_id)
        return run if run is not None and run.status.finished else None

    await wait_until(finished, timeout=15)
    # Out of the group (and the bot's cache of it): no longer an approver...
    fake_slack.set_usergroup(GROUP, [])
    sbot.server.context.approvers._cache.clear()
    assert "not on the approver list" in (
        await sbot.server.context.approvers.why_not_decide(GROUP_MEMBER, gate, approve=True) or ""
    )
    # ... yet their grant still approves the thread's next call, nobody asked.
    await sbot.gateway.continue_run(run_id, "ship 2", by=REQUESTER)
    await wait_until(finished, timeout=15)
    second = (await sbot.gateway.gates(run_id))[1]
    assert (second.status, second.decided_by) == (GateStatus.APPROVED, f"grant:{grant.grant_id}")
    # Revoked by another approver: the next call asks a person again.
    text = await click(sbot, grant_view.REVOKE_ACTION, grant.grant_id, APPROVER, "revoke-g")
    assert text.startswith("🔒 Revoked the grant for `ship`")
    await sbot.gateway.continue_run(run_id, "ship 3", by=REQUESTER)

    async def third() -> Any:
        gates = await sbot.gateway.gates(run_id)
        return gates[2] if len(gates) > 2 else None

    assert (await wait_until(third, timeout=15)).status is GateStatus.PENDING
    assert journal_lines(journal) == ["ship:staging:1", "ship:staging:2"]
