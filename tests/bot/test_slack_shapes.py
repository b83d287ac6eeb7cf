"""Slack's own odd requests, in the shapes Slack's SDKs test with (bolt-python's scenario
tests: Enterprise Grid teams and ``W`` user ids, ephemeral-message clicks without
``message``, ``view_closed`` with ``response_urls: []``, legacy attachment buttons and
dialogs), sent signed over HTTP to the real bot, with gates pending in real Redis.

Each test asserts what the person sees (the fake Slack's recorded ``response_url`` posts and
``chat.postEphemeral`` calls), that nothing was decided unless it should be, and that the
web process logged nothing at WARNING or above.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from redis.asyncio import Redis

from bot import cards
from tests.bot.conftest import (
    APPROVER,
    CHANNEL,
    STRANGER,
    BotHarness,
    bot_settings,
)
from tests.fuzz.pool import GatePool, settle
from tests.security.seen import button_value
from tests.slack_fake import FakeSlack, SlackCall

GRID = "E0GRID"
TEAM = "T0TEST"  # the fake Slack's auth.test team: the app's workspace
OTHER_TEAM = "T0OTHERORG"


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO)
    return caplog


def alarms(logs: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in logs.records if r.levelno >= logging.WARNING]


@pytest.fixture
async def pool(bot: BotHarness, redis: Redis) -> AsyncIterator[GatePool]:
    pool = await GatePool(redis, bot.gateway, runs=1, slack=bot.server.client).fill()
    await pool.carded()
    yield pool


def told(fake: FakeSlack) -> list[SlackCall]:
    """Everything said to a person: response_url posts, ephemeral messages, modals."""
    return [
        c
        for c in fake.calls
        if c.method.startswith("response_url:") or c.method in ("chat.postEphemeral", "views.open")
    ]


def grid_team(team_id: str = TEAM) -> dict[str, Any]:
    return {
        "id": team_id,
        "domain": "grid-workspace",
        "enterprise_id": GRID,
        "enterprise_name": "Sandbox Org",
    }


def grid_user(user_id: str, team_id: str = TEAM) -> dict[str, Any]:
    return {"id": user_id, "username": user_id.lower(), "name": user_id.lower(), "team_id": team_id}


def ephemeral_click(
    action_id: str, value: str, user_id: str, response_url: str | None, **extra: Any
) -> dict[str, Any]:
    """A click on a button of an ephemeral message: no ``message``, and
    ``container.is_ephemeral``; from a workspace of a Grid org."""
    payload: dict[str, Any] = {
        "type": "block_actions",
        "user": grid_user(user_id),
        "api_app_id": "A0APP",
        "token": "verification_token",
        "container": {
            "type": "message",
            "message_ts": "1700000001.000200",
            "channel_id": CHANNEL,
            "is_ephemeral": True,
        },
        "trigger_id": f"111.222.{time.time_ns()}",
        "team": grid_team(),
        "enterprise": {"id": GRID, "name": "Sandbox Org"},
        "is_enterprise_install": False,
        "channel": {"id": CHANNEL, "name": "test-channel"},
        "actions": [
            {
                "action_id": action_id,
                "block_id": "gate",
                "text": {"type": "plain_text", "text": "Button", "emoji": True},
                "value": value,
                "type": "button",
                "action_ts": f"{time.time():.6f}",
            }
        ],
    }
    if response_url is not None:
        payload["response_url"] = response_url
    payload.update(extra)
    return payload


# --------------------------------------------------------------------------- legacy payloads
def legacy_payloads(fake: FakeSlack, gate_id: str, value: str) -> dict[str, dict[str, Any]]:
    """Legacy payloads naming a real pending gate, from an approver, each with a
    response_url: none of them may decide it, nor say "unknown button"."""
    team = {"id": TEAM, "domain": "fake"}
    user = {"id": APPROVER, "name": "approver"}
    channel = {"id": CHANNEL, "name": "general"}
    dialog_state = json.dumps({"gate_id": gate_id, "channel": CHANNEL})
    return {
        # Attachment buttons: callback_id and the action's name and value as our buttons.
        "interactive_message": {
            "type": "interactive_message",
            "actions": [{"name": cards.APPROVE_ACTION, "type": "button", "value": value}],
            "callback_id": cards.APPROVE_ACTION,
            "team": team,
            "channel": channel,
            "user": user,
            "action_ts": f"{time.time():.6f}",
            "message_ts": "1700000000.000100",
            "attachment_id": "1",
            "token": "verification_token",
            "is_app_unfurl": False,
            "original_message": {
                "type": "message",
                "subtype": "bot_message",
                "text": "",
                "ts": "1700000000.000100",
                "attachments": [
                    {
                        "id": 1,
                        "callback_id": cards.APPROVE_ACTION,
                        "fallback": "Approve?",
                        "actions": [{"id": "1", "name": cards.APPROVE_ACTION, "type": "button"}],
                    }
                ],
            },
            "response_url": fake.response_url("legacy-im"),
            "trigger_id": "111.222.legacy",
        },
        "dialog_submission": {
            "type": "dialog_submission",
            "token": "verification_token",
            "action_ts": f"{time.time():.6f}",
            "team": team,
            "user": user,
            "channel": channel,
            "submission": {"reason": "no"},
            "callback_id": cards.DENY_CALLBACK,
            "response_url": fake.response_url("legacy-ds"),
            "state": dialog_state,
        },
        "dialog_submission named like a button": {
            "type": "dialog_submission",
            "token": "verification_token",
            "action_ts": f"{time.time():.6f}",
            "team": team,
            "user": user,
            "channel": channel,
            "submission": {"value": value},
            "callback_id": cards.APPROVE_ACTION,
            "response_url": fake.response_url("legacy-ds2"),
            "state": dialog_state,
        },
        "dialog_cancellation": {
            "type": "dialog_cancellation",
            "token": "verification_token",
            "action_ts": f"{time.time():.6f}",
            "team": team,
            "user": user,
            "channel": channel,
            "callback_id": cards.DENY_ACTION,
            "response_url": fake.response_url("legacy-dc"),
            "state": dialog_state,
        },
        "workflow_step_edit": {
            "type": "workflow_step_edit",
            "token": "verification_token",
            "action_ts": f"{time.time():.6f}",
            "team": team,
            "user": user,
            "callback_id": cards.APPROVE_ACTION,
            "trigger_id": "111.222.step",
            "workflow_step": {"workflow_step_edit_id": "1", "workflow_id": "2", "step_id": "3"},
        },
    }


async def test_legacy_payloads_are_answered_quietly_and_decide_nothing(
    bot: BotHarness, pool: GatePool, logs: pytest.LogCaptureFixture
) -> None:
    fake = bot.fake
    gate_id = pool.gate_ids[0]
    value = await button_value(fake, gate_id)
    # The turn opened two gates: its "Approve all" message is posted too, and the root
    # message updated to "awaiting approval"; let them be.
    await fake.wait_for(
        lambda f: any("approval requests" in json.dumps(m.blocks) for m in f.messages),
        what="the turn's message",
    )
    await fake.wait_for(
        lambda f: any("awaiting approval" in json.dumps(m.blocks) for m in f.messages),
        what="the root message",
    )
    await pool.carded()  # and every card lock released
    logs.clear()
    before = len(fake.calls)
    for name, payload in legacy_payloads(fake, gate_id, value).items():
        resp = await bot.client.payload(payload)
        assert (resp.status, resp.text) == (200, ""), name
    await settle(bot)
    assert told(fake) == [], "no 'unknown button', no reply of any kind"
    assert await pool.changes() == {}, "nothing was decided"
    calls = [c.method for c in fake.calls[before:] if c.method != "auth.test"]  # Bolt's, once
    assert calls == [], "no Slack call at all"
    assert alarms(logs) == []


async def test_suggestions_get_an_empty_option_list(
    bot: BotHarness, pool: GatePool, logs: pytest.LogCaptureFixture
) -> None:
    logs.clear()
    block = {
        "type": "block_suggestion",
        "user": grid_user("W0GRIDUSER"),
        "container": {"type": "view", "view_id": "V0VIEW"},
        "api_app_id": "A0APP",
        "token": "verification_token",
        "action_id": "pick_a_user",
        "block_id": "who",
        "value": "ali",
        "team": grid_team(),
        "enterprise": {"id": GRID, "name": "Sandbox Org"},
        "is_enterprise_install": False,
        "view": {"id": "V0VIEW", "type": "modal", "callback_id": "", "private_metadata": ""},
    }
    dialog = {
        "type": "dialog_suggestion",
        "token": "verification_token",
        "action_ts": f"{time.time():.6f}",
        "team": grid_team(),
        "user": {"id": "W0GRIDUSER", "name": "w", "team_id": TEAM},
        "channel": {"id": CHANNEL, "name": "general"},
        "name": "types",
        "value": "search keyword",
        "callback_id": cards.DENY_CALLBACK,
        "state": "Limo",
    }
    for payload in (block, dialog):
        resp = await bot.client.payload(payload)
        assert resp.status == 200 and resp.json() == {"options": []}, resp.text
    await settle(bot)
    assert told(bot.fake) == []
    assert await pool.changes() == {}
    assert alarms(logs) == []


async def test_closing_the_deny_form_decides_nothing(
    bot: BotHarness, pool: GatePool, logs: pytest.LogCaptureFixture
) -> None:
    """``view_closed`` of our deny form, exactly as the deny form's submission would carry
    it (same callback_id and private_metadata), in a Grid workspace: a quiet ack."""
    gate_id = pool.gate_ids[0]
    meta = json.dumps({"gate_id": gate_id, "channel": CHANNEL})
    payload = {
        "type": "view_closed",
        "team": grid_team(),
        "user": grid_user(APPROVER),
        "api_app_id": "A0APP",
        "token": "verification_token",
        "view": {
            "id": "V0VIEW",
            "team_id": TEAM,
            "type": "modal",
            "blocks": [],
            "private_metadata": meta,
            "callback_id": cards.DENY_CALLBACK,
            "state": {"values": {}},
            "hash": "1596530361.3wRYuk3R",
            "title": {"type": "plain_text", "text": "Deny tool call"},
            "clear_on_close": False,
            "notify_on_close": True,
            "previous_view_id": None,
            "root_view_id": "V0VIEW",
            "app_id": "A0APP",
            "external_id": "",
            "app_installed_team_id": TEAM,
            "bot_id": "B0BOT",
        },
        "is_cleared": False,
        "is_enterprise_install": False,
        "enterprise": {"id": GRID, "name": "Sandbox Org"},
        "response_urls": [],
    }
    logs.clear()
    resp = await bot.client.payload(payload)
    assert (resp.status, resp.text) == (200, "")
    await settle(bot)
    assert told(bot.fake) == []
    assert await pool.changes() == {}, "closing the form is not denying"
    assert alarms(logs) == []


# --------------------------------------------------------------------------- no response_url
async def test_a_click_without_response_url_is_answered_by_ephemeral_message(
    bot: BotHarness, pool: GatePool, logs: pytest.LogCaptureFixture
) -> None:
    fake = bot.fake
    gate_id = pool.gate_ids[0]
    value = await button_value(fake, gate_id)
    logs.clear()
    payload = ephemeral_click(cards.APPROVE_ACTION, value, STRANGER, None)
    assert (await bot.client.payload(payload)).status == 200
    await settle(bot)
    (msg,) = told(fake)
    assert msg.method == "chat.postEphemeral"
    assert (msg.args["channel"], msg.args["user"]) == (CHANNEL, STRANGER)
    assert "not on the approver list" in msg.args["text"]
    assert await pool.changes() == {}
    assert alarms(logs) == [], "a payload without response_url is normal, not a warning"


async def test_a_click_in_a_modal_without_channel_or_response_url_says_nothing(
    bot: BotHarness, pool: GatePool, logs: pytest.LogCaptureFixture
) -> None:
    """Clicks in a modal or on App Home carry neither a channel nor a response_url: there
    is nowhere to answer, and that is not worth a warning."""
    fake = bot.fake
    value = await button_value(fake, pool.gate_ids[0])
    logs.clear()
    for action_id, val in ((cards.APPROVE_ACTION, value), ("something_new", "x")):
        payload = ephemeral_click(action_id, val, STRANGER, None)
        payload["container"] = {"type": "view", "view_id": "V0VIEW"}
        payload.pop("channel")
        payload["view"] = {"id": "V0VIEW", "type": "home", "callback_id": "", "hash": "1"}
        assert (await bot.client.payload(payload)).status == 200
    await settle(bot)
    assert told(fake) == []
    assert await pool.changes() == {}
    assert alarms(logs) == []


# --------------------------------------------------------------------------- ephemeral clicks
async def test_clicks_on_an_ephemeral_message_without_message(
    bot: BotHarness, pool: GatePool, logs: pytest.LogCaptureFixture
) -> None:
    """bolt-python's block_actions fixture: ``container.is_ephemeral``, no ``message``,
    a Grid workspace's team. A stranger is told why not; an approver decides."""
    fake = bot.fake
    gate_id = pool.gate_ids[0]
    value = await button_value(fake, gate_id)
    logs.clear()
    no = ephemeral_click(cards.APPROVE_ACTION, value, STRANGER, fake.response_url("eph-no"))
    assert "message" not in no
    assert (await bot.client.payload(no)).status == 200
    await settle(bot)
    (msg,) = told(fake)
    assert msg.method == "response_url:eph-no"
    assert "not on the approver list" in msg.args["text"]
    assert msg.args["response_type"] == "ephemeral"
    assert await pool.changes() == {}

    yes = ephemeral_click(cards.APPROVE_ACTION, value, APPROVER, fake.response_url("eph-yes"))
    assert (await bot.client.payload(yes)).status == 200
    await settle(bot)
    assert [(g.gate_id, st) for g, st in (await pool.changes()).items()] == [
        (gate_id, ("approved", APPROVER))
    ]
    assert not fake.responses("eph-yes"), "a decision that went through needs no reply"
    await bot.wait_card(gate_id, "Approved")
    assert alarms(logs) == []


# --------------------------------------------------------------------------- Enterprise Grid
async def test_enterprise_grid_workspace_install(
    make_bot: Callable[..., Any], redis: Redis, logs: pytest.LogCaptureFixture
) -> None:
    """An app installed in one workspace of a Grid org: payloads carry the enterprise, user
    ids start with W. Approvers listed by W id decide; other Grid users do not."""
    boss, other = "W0GRIDBOSS", "W0GRIDOTHER"
    bot: BotHarness = await make_bot(APPROVERS=boss)
    fake = bot.fake
    pool = await GatePool(redis, bot.gateway, runs=1, slack=bot.server.client).fill()
    await pool.carded()
    gate_id = pool.gate_ids[0]
    value = await button_value(fake, gate_id)

    def click(user: str, name: str) -> dict[str, Any]:
        payload = bot.client.action_payload(
            cards.APPROVE_ACTION, value, user_id=user, response_url=fake.response_url(name)
        )
        return {
            **payload,
            "user": grid_user(user),
            "team": grid_team(),
            "enterprise": {"id": GRID, "name": "Sandbox Org"},
            "is_enterprise_install": False,
        }

    logs.clear()
    assert (await bot.client.payload(click(other, "grid-other"))).status == 200
    (r,) = await fake.wait_for(lambda f: f.responses("grid-other"), what="the refusal")
    assert "not on the approver list" in r.args["text"]
    assert await pool.changes() == {}

    assert (await bot.client.payload(click(boss, "grid-boss"))).status == 200
    await settle(bot)
    assert list((await pool.changes()).values()) == [("approved", boss)]

    # Slash commands from Grid carry enterprise_id and is_enterprise_install as form fields.
    body = bot.client.command_body(
        "status", user_id=boss, response_url=fake.response_url("grid-status")
    )
    body += f"&enterprise_id={GRID}&enterprise_name=Sandbox+Org"
    assert (await bot.client.post(body)).status == 200
    (r,) = await fake.wait_for(lambda f: f.responses("grid-status"), what="the status")
    assert "no runs" in r.args["text"]
    assert alarms(logs) == []


class OrgWideSlack(FakeSlack):
    """A fake Slack whose token is an org-wide (Enterprise Grid) installation's: auth.test
    names the enterprise and no single workspace (``team_id`` the enterprise's, or none)."""

    def __init__(self, team_id: str | None) -> None:
        super().__init__()
        self.auth_team = team_id

    def _api_auth_test(self, args: dict[str, Any]) -> dict[str, Any]:
        resp = {
            **super()._api_auth_test(args),
            "enterprise_id": GRID,
            "is_enterprise_install": True,
            "team_id": self.auth_team,
        }
        if self.auth_team is None:
            resp.pop("team_id")
        return resp


@pytest.mark.parametrize("auth_team", [GRID, None], ids=["team-is-enterprise", "no-team"])
async def test_org_wide_install_star_covers_nobody(
    redis: Redis, auth_team: str | None, logs: pytest.LogCaptureFixture
) -> None:
    """With an org-wide installation there is no "app's workspace" for ``*`` to mean. A click
    whose payload names the clicker's own workspace (as a Slack Connect user's does) must
    not make that workspace ours: refused, nothing decided. Listed users still decide."""
    listed = "W0LISTED"
    with OrgWideSlack(auth_team) as fake:
        bot = BotHarness(redis, fake, bot_settings(fake, APPROVERS=f"*,{listed}"))
        await bot.start()
        try:
            pool = await GatePool(redis, bot.gateway, runs=1, slack=bot.server.client).fill()
            await pool.carded()
            value = await button_value(fake, pool.gate_ids[0])
            for name, team in (("own-team", {"id": OTHER_TEAM}), ("no-team", None)):
                payload = ephemeral_click(
                    cards.APPROVE_ACTION, value, "W0OUTSIDER", fake.response_url(name)
                )
                payload["user"] = grid_user("W0OUTSIDER", OTHER_TEAM)
                payload.update(team=team, is_enterprise_install=True)
                assert (await bot.client.payload(payload)).status == 200
                (r,) = await fake.wait_for(lambda f, n=name: f.responses(n), what=name)
                assert "ALLOW_EXTERNAL_APPROVERS" in r.args["text"], r.args["text"]
            assert await pool.changes() == {}

            payload = ephemeral_click(cards.APPROVE_ACTION, value, listed, None)
            payload.update(team=None, is_enterprise_install=True)
            assert (await bot.client.payload(payload)).status == 200
            await settle(bot)
            assert list((await pool.changes()).values()) == [("approved", listed)]
        finally:
            await bot.close()
    assert alarms(logs) == []
