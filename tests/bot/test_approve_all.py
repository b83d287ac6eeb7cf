""" "Approve all N" / "Deny all": one click decides every pending gate of a turn.

The bot, the worker, Redis, the fake Slack and the fake model all run for real; clicks reach
the bot signed, as Slack sends them.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from agent_core import EventType, Gate, GateStatus, RunStatus
from agent_core.testing import FakeOpenAI, calls, reply
from bot import cards, durable_acks, turn_actions
from bot.notifier import Notifier
from bot.store import TURN_NS, turn_ident
from tests.bot.conftest import (
    APPROVER,
    APPROVER2,
    CHANNEL,
    REQUESTER,
    STRANGER,
    BotHarness,
    journal_lines,
    wait_until,
)
from tests.bot.test_notifier import all_events
from tests.core.harness import tool_contents


def three_deletes(task: str, fake_openai: FakeOpenAI, **expect: Any) -> None:
    """The model deletes the three users the task names, in one turn."""
    ids = [w.strip(",") for w in task.split() if w.strip(",").isdigit()]
    fake_openai.script(
        task, [calls([("delete_user", {"user_id": i}) for i in ids]), reply("done", **expect)]
    )


async def all_message(bot: BotHarness, run_id: str) -> tuple[list[Gate], Any]:
    """The turn's gates (in call order) and its "Approve all" message, once posted."""

    async def posted() -> tuple[list[Gate], Any] | None:
        gates = await bot.gateway.gates(run_id)
        if not gates:
            return None
        key = bot.keys.ext("slack-turn", f"{run_id}:{gates[0].turn}", bot.keys.shard_of(run_id))
        ts = await bot.redis.hget(key, "ts")
        msg = bot.fake.message(CHANNEL, ts) if ts else None
        return (gates, msg) if msg is not None else None

    found: tuple[list[Gate], Any] = await wait_until(posted)
    return found


def buttons(msg: Any) -> dict[str, dict[str, Any]]:
    return {
        el["action_id"]: el
        for block in msg.blocks
        if block.get("type") == "actions"
        for el in block["elements"]
    }


async def finished(bot: BotHarness, run_id: str) -> Any:
    async def done() -> Any:
        run = await bot.gateway.get_run(run_id)
        return run if run is not None and run.status.finished else None

    return await wait_until(done, timeout=15)


async def test_approve_all_by_an_approver(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    three_deletes("delete users 1, 2 and 3", fake_openai)
    run_id = await live.start_task("delete users 1, 2 and 3")
    gates, msg = await all_message(live, run_id)
    assert [g.args["user_id"] for g in gates] == ["1", "2", "3"]
    shown = [await live.card(g.gate_id) for g in gates]
    assert float(msg.ts) > max(float(c.ts) for c in shown), "below the three cards"
    assert msg.thread_ts is not None and {c.thread_ts for c in shown} == {msg.thread_ts}
    approve = buttons(msg)[cards.TURN_APPROVE_ACTION]
    assert approve["text"]["text"] == "Approve all 3" and approve["style"] == "primary"
    confirm = approve["confirm"]["text"]["text"]
    for i in ("1", "2", "3"):  # the calls can be told apart: each with its arguments
        assert f'`delete_user(user_id="{i}")`' in confirm, confirm
    deny = buttons(msg)[cards.TURN_DENY_ACTION]
    assert deny["text"]["text"] == "Deny all" and deny["style"] == "danger"
    assert journal_lines(journal) == []

    resp = await live.client.action(
        cards.TURN_APPROVE_ACTION,
        approve["value"],
        user_id=APPROVER,
        message_ts=msg.ts,
        response_url=live.fake.response_url("all"),
    )
    assert resp.status == 200
    (told,) = await live.fake.wait_for(lambda f: f.responses("all"))
    assert told.args["text"] == (
        "✅ You approved 3 calls: `delete_user`, `delete_user`, `delete_user`."
    )
    assert told.args["response_type"] == "ephemeral"
    assert (await finished(live, run_id)).status is RunStatus.COMPLETED
    assert sorted(journal_lines(journal)) == ["delete_user:1", "delete_user:2", "delete_user:3"]
    for g in gates:
        card = await live.wait_card(g.gate_id, "Executed")
        assert "Approved* by <@U0APPROVER>" in str(card.blocks)
        assert cards.APPROVE_ACTION not in str(card.blocks)

    async def settled() -> Any:
        m = live.fake.message(CHANNEL, msg.ts)
        return m if m is not None and "All 3 approved" in str(m.blocks) else None

    done = await wait_until(settled)
    assert done.text == "✅ All 3 approved by <@U0APPROVER>"
    assert buttons(done) == {}, "the buttons are gone"


async def test_outsiders_self_approval_and_forged_values_decide_nothing(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    three_deletes("delete users 1 2 3", fake_openai)
    run_id = await live.start_task("delete users 1 2 3", user_id=REQUESTER)
    gates, msg = await all_message(live, run_id)
    value = buttons(msg)[cards.TURN_APPROVE_ACTION]["value"]
    fake = live.fake

    async def click(action: str, value: str, user_id: str, name: str) -> str:
        await live.client.action(
            action, value, user_id=user_id, response_url=fake.response_url(name)
        )
        (r,) = await fake.wait_for(lambda f: f.responses(name), what=name)
        return str(r.args["text"])

    assert "not on the approver list" in await click(
        cards.TURN_APPROVE_ACTION, value, STRANGER, "stranger"
    )
    assert "not on the approver list" in await click(
        cards.TURN_DENY_ACTION, value, STRANGER, "stranger-deny"
    )
    assert "ALLOW_SELF_APPROVAL" in await click(cards.TURN_APPROVE_ACTION, value, REQUESTER, "self")
    run, turn, _digest = value.split(":")
    forged = [
        f"{run}:{turn}:{'0' * 16}",  # another set of gates (or arguments) than the message's
        f"{run}:{int(turn) + 1}:{_digest}",
        f"r-000000000000:{turn}:{_digest}",
        cards.button_value(gates[0]),  # a single card's value
        "garbage",
    ]
    for i, v in enumerate(forged):
        assert await click(cards.TURN_APPROVE_ACTION, v, APPROVER, f"forged{i}") == (
            turn_actions.UNKNOWN_TURN
        )
    assert await click(cards.TURN_DENY_ACTION, forged[0], APPROVER, "forged-deny") == (
        turn_actions.UNKNOWN_TURN
    )
    forged_form = json.dumps({"turn": forged[0], "channel": CHANNEL})
    resp = await live.client.view_submission(
        cards.TURN_DENY_CALLBACK, forged_form, user_id=APPROVER
    )
    assert resp.status == 200
    (r,) = await fake.wait_for(lambda f: f.calls_to("chat.postEphemeral"))
    assert r.args["text"] == turn_actions.UNKNOWN_TURN and r.args["user"] == APPROVER
    assert not fake.calls_to("views.open"), "no deny form for an outsider or a forged value"
    assert [g.status for g in await live.gateway.gates(run_id)] == [GateStatus.PENDING] * 3
    assert cards.TURN_APPROVE_ACTION in str(live.fake.message(CHANNEL, msg.ts).blocks)  # type: ignore[union-attr]
    assert journal_lines(journal) == []


async def test_deny_all_with_a_reason_leaves_an_earlier_decision(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    told: list[str] = []
    three_deletes(
        "delete users 4 5 6",
        fake_openai,
        expect=lambda messages: told.extend(tool_contents(messages)),
    )
    run_id = await live.start_task("delete users 4 5 6")
    gates, msg = await all_message(live, run_id)
    # Someone approves the second call on its own card first.
    first = await live.gateway.decide(gates[1].gate_id, "approve", by=APPROVER2)
    assert first.applied

    async def remaining() -> Any:
        m = live.fake.message(CHANNEL, msg.ts)
        return m if m is not None and "Deny remaining 2" in str(m.blocks) else None

    msg = await wait_until(remaining)
    deny = buttons(msg)[cards.TURN_DENY_ACTION]
    await live.client.action(
        cards.TURN_DENY_ACTION, deny["value"], user_id=APPROVER, trigger_id="trig-all"
    )
    (opened,) = await live.fake.wait_for(lambda f: f.calls_to("views.open"), what="deny form")
    view = opened.args["view"]
    assert view["callback_id"] == cards.TURN_DENY_CALLBACK
    assert "Deny the 2 pending calls" in str(view["blocks"])
    values = {
        cards.REASON_BLOCK: {
            cards.REASON_ACTION: {"type": "plain_text_input", "value": "not today"}
        }
    }
    resp = await live.client.view_submission(
        view["callback_id"], view["private_metadata"], values=values, user_id=APPROVER
    )
    assert resp.status == 200 and resp.text == ""
    assert (await finished(live, run_id)).status is RunStatus.COMPLETED
    assert journal_lines(journal) == ["delete_user:5"]

    after = await live.gateway.gates(run_id)
    assert [(g.status, g.decided_by, g.reason) for g in after] == [
        (GateStatus.DENIED, APPROVER, "not today"),
        (GateStatus.APPROVED, APPROVER2, None),
        (GateStatus.DENIED, APPROVER, "not today"),
    ]
    for g in (after[0], after[2]):
        card = await live.wait_card(g.gate_id, "Denied")
        assert "*Reason:* not today" in str(card.blocks)
    assert [("declined" in t, "not today" in t) for t in told] == [
        (True, True),
        (False, False),
        (True, True),
    ]
    assert told[1] == "user 5 deleted"

    (private,) = await live.fake.wait_for(lambda f: f.calls_to("chat.postEphemeral"))
    assert private.args["user"] == APPROVER
    assert private.args["text"] == (
        "🚫 You denied 2 calls: `delete_user`, `delete_user`.\n"
        "Already decided before your click, left as it was: `delete_user` (approved by <@U0BOSS>)."
    )

    async def settled() -> Any:
        m = live.fake.message(CHANNEL, msg.ts)
        return m if m is not None and not buttons(m) else None

    done = await wait_until(settled)
    assert done.text == "☑️ 2 denied by <@U0APPROVER>; 1 was already approved by <@U0BOSS>"
    assert "*Reason:* not today" in str(done.blocks)


async def test_a_turn_with_one_gate_has_no_approve_all(
    live: BotHarness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script(
        "delete user 8",
        [calls([("delete_user", {"user_id": "8"}), ("lookup", {"key": "x"})]), reply("ok")],
    )
    run_id = await live.start_task("delete user 8")
    gate = await live.gate_of(run_id)
    await live.client.action(cards.APPROVE_ACTION, cards.button_value(gate), user_id=APPROVER)
    assert (await finished(live, run_id)).status is RunStatus.COMPLETED
    run = await live.gateway.get_run(run_id)
    assert run is not None
    thread = live.fake.thread(CHANNEL, run.origin["thread_ts"])
    assert cards.TURN_APPROVE_ACTION not in str([m.blocks for m in thread])


async def test_approve_all_is_acked_within_the_budget_when_redis_stalls(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    three_deletes("delete users 7, 8 and 9", fake_openai)
    run_id = await live.start_task("delete users 7, 8 and 9")
    _gates, msg = await all_message(live, run_id)
    value = buttons(msg)[cards.TURN_APPROVE_ACTION]["value"]
    loop = asyncio.get_running_loop()
    await live.redis.execute_command("CLIENT", "PAUSE", "2600", "WRITE")
    t0 = loop.time()
    resp = await live.client.action(
        cards.TURN_APPROVE_ACTION,
        value,
        user_id=APPROVER,
        response_url=live.fake.response_url("stalled"),
    )
    acked_after = loop.time() - t0
    assert resp.status == 200 and acked_after < 2.5, f"Slack needs its ack: {acked_after:.2f} s"

    def said(f: Any) -> list[str]:
        return [str(c.args["text"]) for c in f.responses("stalled")]

    texts = await live.fake.wait_for(lambda f: len(said(f)) >= 3 and said(f), timeout=10)
    assert texts == [
        durable_acks.NOT_RECORDED_YET.format(what="*Approve all*"),
        "✅ You approved 3 calls: `delete_user`, `delete_user`, `delete_user`.",
        durable_acks.RECORDED_NOW.format(what="*Approve all*"),
    ]
    assert (await finished(live, run_id)).status is RunStatus.COMPLETED
    assert sorted(journal_lines(journal)) == ["delete_user:7", "delete_user:8", "delete_user:9"]


def gate(i: int, status: str = "pending", by: str | None = None, **more: Any) -> Gate:
    return Gate(
        gate_id=f"00{'g' * 21}{i}",
        run_id="r-00abcdefghij",
        call_id=f"call_{i}",
        turn=1,
        index=i,
        tool="delete_user",
        args={"user_id": str(i)},
        args_hash="ab" * 32,
        status=GateStatus(status),
        created_at=1.0,
        deadline=2e9,
        timeout=300,
        decided_by=by,
        **more,
    )


def test_card_texts() -> None:
    approved = gate(0, "approved", "U1", decided_at=10.0, reason="owner agreed <here>")
    assert "\n*Reason:* owner agreed &lt;here&gt;" in cards.outcome_line(approved)
    assert "Reason" not in cards.outcome_line(gate(0, "approved", "U1", decided_at=10.0))

    def summary(*gates: Gate) -> str:
        return cards.turn_summary(list(gates))

    assert summary(*(gate(i, "denied", "U1", decided_at=9.0, reason="no") for i in range(3))) == (
        "🚫 All 3 denied by <@U1>\n*Reason:* no"
    )
    assert summary(gate(0, "expired", decided_at=5.0), gate(1, "expired", decided_at=6.0)) == (
        "⌛ All 2 expired"
    )
    assert (
        summary(
            gate(0, "approved", "U1", decided_at=10.0),
            gate(1, "denied", "U2", decided_at=5.0),
            gate(2, "expired", decided_at=4.0),
            gate(3, "cancelled", "U3", decided_at=20.0),
        )
        == "☑️ 1 approved by <@U1>; 1 was already denied by <@U2>; 1 had already expired; 1 cancelled with the run"
    )
    partly = cards.turn_card([gate(0, "approved", "U1", decided_at=1.0), gate(1), gate(2)])
    labels = [el["text"]["text"] for el in buttons(partly).values()]
    assert labels == ["Approve remaining 2", "Deny remaining 2"]
    assert "2 still wait for a decision" in str(partly.blocks)
    many = cards.turn_card([gate(i) for i in range(60)])
    confirm = buttons(many)[cards.TURN_APPROVE_ACTION]["confirm"]["text"]["text"]
    assert len(confirm) <= cards.CONFIRM_TEXT_LIMIT
    assert confirm.endswith("…and 53 more: see their cards."), confirm


async def test_a_card_click_updates_its_turns_message_without_reading_the_gate_again(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """A click on one gate's card updates the card itself; the notifier then updates the
    turn's "Approve all" message from the gate.decided event, which names the turn and how
    many gates it opened. An older core's event, without them, still gets it updated (the
    gate is read)."""
    three_deletes("delete users 7 8 9", fake_openai)
    run_id = await live.start_task("delete users 7 8 9")
    gates, msg = await all_message(live, run_id)
    await live.client.action("gate_approve", cards.button_value(gates[1]), user_id=APPROVER)
    await live.wait_card(gates[1].gate_id, "Approved")

    async def remaining() -> Any:
        m = live.fake.message(CHANNEL, msg.ts)
        return m if m is not None and "Deny remaining 2" in str(m.blocks) else None

    await wait_until(remaining)
    decided = [
        e
        for e in await all_events(live)
        if e.type is EventType.GATE_DECIDED and e.data["gate_id"] == gates[1].gate_id
    ]
    assert [(e.data["turn"], e.data["turn_gates"]) for e in decided] == [(gates[1].turn, 3)]

    # The same event as an older core wrote it, handled again with the message stale.
    ctx = live.server.context
    older = decided[0].model_copy(
        update={
            "data": {k: v for k, v in decided[0].data.items() if k not in ("turn", "turn_gates")}
        }
    )
    ident = turn_ident(run_id, gates[1].turn)
    await ctx.store.set_card_digest(ident, "stale", TURN_NS)

    def turn_updates() -> int:
        return sum(1 for c in live.fake.calls_to("chat.update") if c.args.get("ts") == msg.ts)

    before = turn_updates()
    replica = Notifier(live.gateway, ctx.publisher, ctx.store, consumer="web-older")
    assert await replica.handle_batch([older]) == [older]
    assert turn_updates() == before + 1
    assert "Deny remaining 2" in str(live.fake.message(CHANNEL, msg.ts).blocks)  # type: ignore[union-attr]
    assert journal_lines(journal) == []
