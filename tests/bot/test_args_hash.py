"""What the approver saw is what runs: Approve and Deny carry the hash of the card's arguments.

A click whose hash is not the gate's decides nothing (the core refuses it atomically); the
clicker is told why. Real Redis, the fake Slack server, signed requests, the core's worker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent_core import GateStatus, RunStatus
from agent_core.testing import FakeOpenAI, call, reply
from bot import cards
from tests.bot.conftest import APPROVER, BotHarness, journal_lines, wait_until

OTHER_HASH = "0" * 64


async def finished(bot: BotHarness, run_id: str) -> Any:
    async def done() -> Any:
        run = await bot.gateway.get_run(run_id)
        return run if run is not None and run.status.finished else None

    return await wait_until(done, timeout=15)


def button_values(blocks: list[dict[str, Any]]) -> dict[str, str]:
    return {
        e["action_id"]: e["value"]
        for b in blocks
        if b.get("type") == "actions"
        for e in b.get("elements", [])
    }


async def test_buttons_carry_the_hash_and_a_mismatch_decides_nothing(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "delete user 70"
    fake_openai.script(task, [call("delete_user", {"user_id": "70"}), reply("done")])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    card = await live.card(gate.gate_id)
    values = button_values(card.blocks)
    assert values[cards.APPROVE_ACTION] == f"{gate.gate_id}:{gate.args_hash}"
    assert values[cards.DENY_ACTION] == f"{gate.gate_id}:{gate.args_hash}"
    assert len(gate.args_hash) == 64

    fake = live.fake
    await live.client.action(
        cards.APPROVE_ACTION,
        f"{gate.gate_id}:{OTHER_HASH}",
        user_id=APPROVER,
        response_url=fake.response_url("mismatch"),
    )
    (r,) = await fake.wait_for(lambda f: f.responses("mismatch"), what="the mismatch notice")
    text = r.args["text"]
    assert "do not match this request's" in text and "nothing was decided" in text, text
    assert OTHER_HASH[:12] in text and gate.args_hash[:12] in text
    assert r.args["response_type"] == "ephemeral"
    still = await live.gateway.get_gate(gate.gate_id)
    assert still is not None and still.status is GateStatus.PENDING
    assert journal_lines(journal) == []
    assert cards.APPROVE_ACTION in button_values((await live.card(gate.gate_id)).blocks)

    # The card's own buttons still work, once, and the gate records the hash approved.
    await live.client.action(cards.APPROVE_ACTION, values[cards.APPROVE_ACTION], user_id=APPROVER)
    assert (await finished(live, run_id)).status is RunStatus.COMPLETED
    assert journal_lines(journal) == ["delete_user:70"]
    decided = await live.gateway.get_gate(gate.gate_id)
    assert decided is not None and decided.status is GateStatus.APPROVED
    assert getattr(decided, "decided_hash", None) == gate.args_hash


async def test_a_deny_form_carries_the_hash_and_a_mismatch_decides_nothing(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "email the board"
    fake_openai.script(
        task, [call("send_email", {"to": "board@x.com", "subject": "s", "body": "b"}), reply("ok")]
    )
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    fake = live.fake
    await live.client.action(
        cards.DENY_ACTION, cards.button_value(gate), user_id=APPROVER, trigger_id="trig-h"
    )
    (opened,) = await fake.wait_for(lambda f: f.calls_to("views.open"), what="the deny form")
    meta = json.loads(opened.args["view"]["private_metadata"])
    assert meta["args_hash"] == gate.args_hash

    values = {cards.REASON_BLOCK: {cards.REASON_ACTION: {"value": "no"}}}
    forged = json.dumps({**meta, "args_hash": OTHER_HASH})
    resp = await live.client.view_submission(
        cards.DENY_CALLBACK, forged, values=values, user_id=APPROVER
    )
    assert resp.status == 200

    def told(f: Any) -> list[Any]:
        return [c for c in f.calls_to("chat.postEphemeral") if "do not match" in c.args["text"]]

    (r,) = await fake.wait_for(told, what="the mismatch notice")
    assert r.args["user"] == APPROVER and "nothing was decided" in r.args["text"]
    still = await live.gateway.get_gate(gate.gate_id)
    assert still is not None and still.status is GateStatus.PENDING

    resp = await live.client.view_submission(
        cards.DENY_CALLBACK, json.dumps(meta), values=values, user_id=APPROVER
    )
    assert resp.status == 200
    await live.wait_card(gate.gate_id, "Denied* by <@U0APPROVER>")
    assert (await finished(live, run_id)).status is RunStatus.COMPLETED
    assert journal_lines(journal) == []


async def test_a_card_from_before_hashes_is_refreshed_and_approves_nothing(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "delete user 71"
    fake_openai.script(task, [call("delete_user", {"user_id": "71"}), reply("done")])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    # As an older version posted it: buttons carrying the gate id alone.
    card_key = live.keys.ext("slack-card", gate.gate_id, live.keys.shard_of(gate.gate_id))
    await live.redis.hset(card_key, "digest", "posted-by-an-older-version")
    fake = live.fake
    updates = len(fake.calls_to("chat.update"))
    await live.client.action(
        cards.APPROVE_ACTION, gate.gate_id, user_id=APPROVER, response_url=fake.response_url("old")
    )
    (r,) = await fake.wait_for(lambda f: f.responses("old"), what="the old-card notice")
    assert "nothing was decided" in r.args["text"] and "click *Approve* again" in r.args["text"]
    still = await live.gateway.get_gate(gate.gate_id)
    assert still is not None and still.status is GateStatus.PENDING
    await fake.wait_for(lambda f: len(f.calls_to("chat.update")) > updates, what="card refresh")
    card = await live.card(gate.gate_id)
    assert button_values(card.blocks)[cards.APPROVE_ACTION] == cards.button_value(gate)
    assert journal_lines(journal) == []

    # A deny form opened from such a card (no hash in it) still denies: denying is safe.
    old_meta = json.dumps({"gate_id": gate.gate_id, "channel": gate.origin["channel"]})
    values = {cards.REASON_BLOCK: {cards.REASON_ACTION: {"value": "old form"}}}
    await live.client.view_submission(
        cards.DENY_CALLBACK, old_meta, values=values, user_id=APPROVER
    )
    await live.wait_card(gate.gate_id, "Denied* by <@U0APPROVER>")
    assert (await finished(live, run_id)).status is RunStatus.COMPLETED
    assert journal_lines(journal) == []
