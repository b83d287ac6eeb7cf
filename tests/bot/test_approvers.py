"""APPROVERS: user IDs, user groups (looked up, cached briefly), ``*``; failing closed."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from agent_core import Gate, GateStatus
from bot.app import make_web_client
from bot.approvers import Approvers
from tests.bot.conftest import bot_settings
from tests.slack_fake import FakeSlack


@pytest.fixture
async def client(fake_slack: FakeSlack) -> AsyncIterator[AsyncWebClient]:
    yield make_web_client(bot_settings(fake_slack, SLACK_MAX_RETRIES=0))


def gate(requested_by: str = "U0REQ") -> Gate:
    now = time.time()
    return Gate(
        gate_id="g" * 24,
        run_id="r-x",
        call_id="c",
        turn=1,
        tool="t",
        args={},
        args_hash="h",
        status=GateStatus.PENDING,
        requested_by=requested_by,
        created_at=now,
        deadline=now + 60,
        timeout=60,
    )


async def test_empty_list_approves_nobody(client: AsyncWebClient) -> None:
    a = Approvers([], client)
    assert not a.configured
    assert not await a.is_approver("U1")
    assert "No approvers are configured" in (await a.why_not("U1") or "")
    assert await a.why_not_decide("U0REQ", gate(), approve=False) is None, (
        "the requester may decline"
    )


async def test_star_and_user_ids(client: AsyncWebClient) -> None:
    assert await Approvers(["*"], client).why_not("U9") is None
    a = Approvers(["U1", "W2"], client)
    assert await a.is_approver("U1") and await a.is_approver("W2")
    assert "not on the approver list" in (await a.why_not("U3") or "")


async def test_groups_are_looked_up_and_cached(
    client: AsyncWebClient, fake_slack: FakeSlack
) -> None:
    fake_slack.set_usergroup("S1", ["U5", "U6"])
    a = Approvers(["S1"], client, cache_seconds=60)
    assert await a.is_approver("U5")
    assert not await a.is_approver("U7")
    assert await a.is_approver("U6")
    assert len(fake_slack.calls_to("usergroups.users.list")) == 1
    fake_slack.set_usergroup("S1", ["U7"])
    expired = Approvers(["S1"], client, cache_seconds=0)
    assert await expired.is_approver("U7")


async def test_group_lookup_failure_fails_closed(
    client: AsyncWebClient, fake_slack: FakeSlack
) -> None:
    a = Approvers(["S404"], client)
    assert not await a.is_approver("U5")
    assert "could not be checked" in (await a.why_not("U5") or "")
    fake_slack.set_usergroup("S1", ["U5"])
    fake_slack.fail_next(
        "usergroups.users.list", 1, status=500, retry_after=None, error="fatal_error"
    )
    assert not await Approvers(["S1"], client).is_approver("U5")


async def test_self_approval(client: AsyncWebClient) -> None:
    strict = Approvers(["U0REQ", "U1"], client)
    assert "ALLOW_SELF_APPROVAL" in (
        await strict.why_not_decide("U0REQ", gate(), approve=True) or ""
    )
    assert await strict.why_not_decide("U1", gate(), approve=True) is None
    assert await strict.why_not_decide("U0REQ", gate(), approve=False) is None
    lax = Approvers(["U0REQ"], client, allow_self_approval=True)
    assert await lax.why_not_decide("U0REQ", gate(), approve=True) is None
    outsider = Approvers(["U1"], client, allow_self_approval=True)
    assert await outsider.why_not_decide("U0REQ", gate(), approve=True) is not None, (
        "still must be an approver"
    )


async def test_star_covers_only_this_workspace_unless_external_approvers_are_allowed(
    client: AsyncWebClient, fake_slack: FakeSlack
) -> None:
    fake_slack.set_usergroup("S1", ["U5"])
    star = Approvers(["*", "U1", "S1"], client)
    assert await star.why_not_decide("U9", gate(), approve=True, external=False) is None
    for approve in (True, False):
        why = await star.why_not_decide("U9", gate(), approve=approve, external=True)
        assert why is not None and "ALLOW_EXTERNAL_APPROVERS" in why and "another workspace" in why
    # Listed by user ID or user group: allowed wherever they come from.
    assert await star.why_not_decide("U1", gate(), approve=True, external=True) is None
    assert await star.why_not_decide("U5", gate(), approve=True, external=True) is None
    assert not await star.is_approver("U9", external=True)
    allowed = Approvers(["*"], client, allow_external=True)
    assert await allowed.why_not_decide("U9", gate(), approve=True, external=True) is None
    # Without "*", an external user who is not listed just is not on the list.
    listed = Approvers(["U1"], client)
    why = await listed.why_not_decide("U9", gate(), approve=True, external=True) or ""
    assert "not on the approver list" in why and "ALLOW_EXTERNAL_APPROVERS" not in why


async def test_an_escalation_widens_who_may_decide_that_gate_only_and_keeps_every_rule(
    client: AsyncWebClient, fake_slack: FakeSlack
) -> None:
    fake_slack.set_usergroup("S0LEADS", ["U0LEAD", "U0REQ", "U0SPOKE"])
    a = Approvers(["U1"], client)
    waiting = gate().model_copy(update={"escalate_to": ["S0LEADS", "U0BOSS"]})
    escalated = waiting.model_copy(
        update={"escalated_at": waiting.created_at + 60, "requesters": ["U0REQ", "U0SPOKE"]}
    )
    # Before the escalation, escalate_to may not decide; after, on that gate only.
    for user in ("U0LEAD", "U0BOSS"):
        assert "not on the approver list" in (
            await a.why_not_decide(user, waiting, approve=True) or ""
        )
        assert await a.why_not_decide(user, escalated, approve=True) is None
        assert await a.why_not_decide(user, gate(), approve=True) is not None
    # The requesters stay requesters: neither the starter nor who spoke may approve.
    assert "ALLOW_SELF_APPROVAL" in (await a.why_not_decide("U0REQ", escalated, approve=True) or "")
    spoke = await a.why_not_decide("U0SPOKE", escalated, approve=True) or ""
    assert "one of its requesters" in spoke
    assert await a.why_not_decide("U0SPOKE", escalated, approve=False) is None
    # A group that cannot be looked up counts as empty.
    broken = Approvers(["U1"], client)
    lost = escalated.model_copy(update={"escalate_to": ["S0GONE"]})
    assert await broken.why_not_decide("U0LEAD", lost, approve=True) is not None
