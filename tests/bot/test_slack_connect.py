"""Slack Connect: with APPROVERS=*, people from another workspace decide nothing, unless
ALLOW_EXTERNAL_APPROVERS is on or they are listed by user ID.

The bot's own workspace is the team ``auth.test`` returned (the fake Slack's ``T0TEST``); a
click's workspace is ``user.team_id`` in its payload. Signed requests, real Redis, the
core's worker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent_core import GateStatus, RunStatus
from agent_core.testing import FakeOpenAI, call, reply
from bot import cards
from tests.bot.conftest import APPROVER, BotHarness, journal_lines, wait_until

EXTERNAL = "U0EXTERNAL"
OTHER_TEAM = "T0OTHERORG"


def from_team(payload: dict[str, Any], team_id: str | None) -> dict[str, Any]:
    """The payload as Slack sends it for a user of ``team_id`` (``None``: no team given)."""
    user = dict(payload["user"])
    if team_id is None:
        user.pop("team_id", None)
    else:
        user["team_id"] = team_id
    return {**payload, "user": user}


async def finished(bot: BotHarness, run_id: str) -> Any:
    async def done() -> Any:
        run = await bot.gateway.get_run(run_id)
        return run if run is not None and run.status.finished else None

    return await wait_until(done, timeout=15)


async def started_gate(bot: BotHarness, fake_openai: FakeOpenAI, task: str, user: str) -> Any:
    fake_openai.script(task, [call("delete_user", {"user_id": user}), reply("done")])
    run_id = await bot.start_task(task)
    return run_id, await bot.gate_of(run_id)


async def test_star_does_not_cover_other_workspaces(
    make_bot: Any, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    bot: BotHarness = await make_bot(APPROVERS="*")
    bot.start_worker(redis_url, fake_openai.base_url)
    run_id, gate = await started_gate(bot, fake_openai, "delete user 80", "80")
    fake, client = bot.fake, bot.client
    value = cards.button_value(gate)

    for name, team in (("ext", OTHER_TEAM), ("noteam", None)):  # no team: fail closed
        for action_id in (cards.APPROVE_ACTION, cards.DENY_ACTION):
            payload = client.action_payload(
                action_id, value, user_id=EXTERNAL, response_url=fake.response_url(name)
            )
            assert (await client.payload(from_team(payload, team))).status == 200

        def two(f: Any, n: str = name) -> list[Any]:
            return f.responses(n) if len(f.responses(n)) >= 2 else []

        for r in await fake.wait_for(two, what=f"two refusals ({name})"):
            text = r.args["text"]
            assert "another workspace" in text and "ALLOW_EXTERNAL_APPROVERS" in text, text
            assert "nothing was decided" in text and r.args["response_type"] == "ephemeral"
    assert not fake.calls_to("views.open"), "no deny form for someone who may not deny"

    # The app's workspace is the one auth.test named, whatever team the payload claims.
    payload = client.action_payload(
        cards.APPROVE_ACTION, value, user_id=EXTERNAL, response_url=fake.response_url("claim")
    )
    payload = {**from_team(payload, OTHER_TEAM), "team": {"id": OTHER_TEAM, "domain": "other"}}
    await client.payload(payload)
    (r,) = await fake.wait_for(lambda f: f.responses("claim"), what="the refusal")
    assert "ALLOW_EXTERNAL_APPROVERS" in r.args["text"]

    # A deny form submitted from another workspace (opened some other way) decides nothing.
    meta = json.dumps({"gate_id": gate.gate_id, "channel": gate.origin["channel"]})
    values = {cards.REASON_BLOCK: {cards.REASON_ACTION: {"value": "from outside"}}}
    view = client.view_payload(cards.DENY_CALLBACK, meta, values, user_id=EXTERNAL)
    assert (await client.payload(from_team(view, OTHER_TEAM))).status == 200

    def told(f: Any) -> list[Any]:
        return [
            c
            for c in f.calls_to("chat.postEphemeral")
            if c.args["user"] == EXTERNAL and "ALLOW_EXTERNAL_APPROVERS" in c.args["text"]
        ]

    await fake.wait_for(told, what="the form's refusal")
    still = await bot.gateway.get_gate(gate.gate_id)
    assert still is not None and still.status is GateStatus.PENDING
    assert journal_lines(journal) == []
    assert cards.APPROVE_ACTION in json.dumps((await bot.card(gate.gate_id)).blocks)

    # Someone of the app's own workspace may, under the same "*".
    await client.action(cards.APPROVE_ACTION, value, user_id=APPROVER)
    assert (await finished(bot, run_id)).status is RunStatus.COMPLETED
    assert journal_lines(journal) == ["delete_user:80"]


async def test_other_workspaces_approve_when_allowed_or_listed(
    make_bot: Any, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    allowing: BotHarness = await make_bot(APPROVERS="*", ALLOW_EXTERNAL_APPROVERS="true")
    allowing.start_worker(redis_url, fake_openai.base_url)
    run_id, gate = await started_gate(allowing, fake_openai, "delete user 81", "81")
    payload = allowing.client.action_payload(
        cards.APPROVE_ACTION, cards.button_value(gate), user_id=EXTERNAL
    )
    await allowing.client.payload(from_team(payload, OTHER_TEAM))
    assert (await finished(allowing, run_id)).status is RunStatus.COMPLETED
    decided = await allowing.gateway.get_gate(gate.gate_id)
    assert decided is not None and decided.decided_by == EXTERNAL
    assert journal_lines(journal) == ["delete_user:81"]


async def test_an_external_user_listed_by_id_may_approve(
    make_bot: Any, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    bot: BotHarness = await make_bot(APPROVERS=f"*,{EXTERNAL}")
    bot.start_worker(redis_url, fake_openai.base_url)
    run_id, gate = await started_gate(bot, fake_openai, "delete user 82", "82")
    payload = bot.client.action_payload(
        cards.APPROVE_ACTION, cards.button_value(gate), user_id=EXTERNAL
    )
    await bot.client.payload(from_team(payload, OTHER_TEAM))
    assert (await finished(bot, run_id)).status is RunStatus.COMPLETED
    assert journal_lines(journal) == ["delete_user:82"]


async def test_star_does_not_let_other_workspaces_cancel_runs(
    make_bot: Any, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    bot: BotHarness = await make_bot(APPROVERS="*")
    bot.start_worker(redis_url, fake_openai.base_url)
    run_id, _gate = await started_gate(bot, fake_openai, "delete user 81", "81")
    fake, client = bot.fake, bot.client
    body = client.command_body(
        f"cancel {run_id}",
        user_id=EXTERNAL,
        team_id=OTHER_TEAM,
        response_url=fake.response_url("ext-cancel"),
    )
    assert (await client.post(body)).status == 200
    (r,) = await fake.wait_for(lambda f: f.responses("ext-cancel"), what="the refusal")
    assert "Only the person who started this run or an approver can cancel it" in r.args["text"]
    run = await bot.gateway.get_run(run_id)
    assert run is not None and run.status is RunStatus.AWAITING_APPROVAL
    # Someone of the app's own workspace may, under APPROVERS=*.
    body = client.command_body(
        f"cancel {run_id}", user_id="U0INSIDER", response_url=fake.response_url("in-cancel")
    )
    assert (await client.post(body)).status == 200
    (r,) = await fake.wait_for(lambda f: f.responses("in-cancel"), what="the confirmation")
    assert "Cancelled run" in r.args["text"]
