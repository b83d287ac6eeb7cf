"""A sub-agent's approval in Slack: its card is in the parent's thread, marked with the
path from the top agent, and the thread tells the parent's story, not the child's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_core import RunStatus
from agent_core.testing import FakeOpenAI, call, reply
from bot import cards
from tests.agents import desk
from tests.bot.conftest import (
    APPROVER,
    CHANNEL,
    REQUESTER,
    BotHarness,
    core_settings,
    journal_lines,
    wait_until,
)
from tests.core.harness import Harness


async def test_a_nested_approval_is_shown_and_decided_in_the_parents_thread(
    bot: BotHarness, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    bot.gateway.agent_name = desk.name
    bot.core = Harness(bot.redis, core_settings(redis_url, fake_openai.base_url), desk)
    bot.core.start_worker()
    fake_openai.script(
        "refund order 7 for the customer",
        [call("billing", {"task": "refund order 7"}), reply("Billing refunded order 7.")],
    )
    fake_openai.script("refund order 7", [call("refund", {"order": 7}), reply("Refunded.")])
    run_id = await bot.start_task("refund order 7 for the customer")

    async def child_gate() -> Any:
        children = await bot.redis.smembers(bot.keys.children(run_id))
        for child in children:
            gates = await bot.gateway.pending_gates(child)
            if gates and await bot.redis.hget(
                bot.keys.ext("slack-card", gates[0].gate_id, bot.keys.shard_of(child)), "ts"
            ):
                return gates[0]
        return None

    gate = await wait_until(child_gate, timeout=15)
    run = await bot.gateway.get_run(run_id)
    assert run is not None
    card = await bot.card(gate.gate_id)
    assert (card.channel, card.thread_ts) == (CHANNEL, run.origin["thread_ts"])
    assert "Asked by a sub-agent: desk → billing → refund(order=7)" in str(card.blocks)
    assert f"<@{REQUESTER}>" in str(card.blocks), "requested by the person who asked desk"
    # The root message is the parent's: the child's run never rewrites it.
    root = bot.fake.message(CHANNEL, run.origin["thread_ts"])
    assert root is not None and "refund order 7 for the customer" in root.text

    resp = await bot.client.action(
        "gate_approve", cards.button_value(gate), user_id=APPROVER, message_ts=card.ts
    )
    assert resp.status == 200

    async def done() -> Any:
        r = await bot.gateway.get_run(run_id)
        return r if r is not None and r.status.finished else None

    finished = await wait_until(done, timeout=15)
    assert finished.status is RunStatus.COMPLETED
    assert journal_lines(journal) == ["refund:7"]
    msg = await bot.wait_card(gate.gate_id, "order 7 refunded")
    assert "gate_approve" not in str(msg.blocks)

    def answers() -> list[str]:
        return [m.text for m in bot.fake.thread(CHANNEL, run.origin["thread_ts"])]

    async def answered() -> Any:
        texts = answers()
        return texts if any("Billing refunded order 7." in t for t in texts) else None

    texts = await wait_until(answered, timeout=10)
    # Only the parent's answer is posted; the sub-agent's answer went to the parent's model.
    assert not any(t.startswith("Refunded.") for t in texts)
    root = bot.fake.message(CHANNEL, run.origin["thread_ts"])
    assert root is not None and "refund order 7 for the customer" in root.text
    # The root message is updated right after the answer is posted (same event).
    await bot.fake.wait_for(
        lambda f: f.shows(CHANNEL, run.origin["thread_ts"], f"Run `{run_id}` · ✅ completed")
    )


async def test_cancelling_the_parent_tells_a_childs_approved_call_it_never_ran(
    bot: BotHarness, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """Found by the soak: the child's run.cancelled was skipped whole, so an approved call
    of the cancelled child kept saying "Running…"."""
    from agent_core.testing import calls

    bot.gateway.agent_name = desk.name
    bot.core = Harness(bot.redis, core_settings(redis_url, fake_openai.base_url), desk)
    bot.core.start_worker()
    fake_openai.script("two refunds please", [call("billing", {"task": "refund 3 and 4"})])
    fake_openai.script(
        "refund 3 and 4", [calls([("refund", {"order": 3}), ("refund", {"order": 4})])]
    )
    run_id = await bot.start_task("two refunds please")

    async def two_cards() -> Any:
        for child in await bot.redis.smembers(bot.keys.children(run_id)):
            gates = await bot.gateway.pending_gates(child)
            posted = [
                g
                for g in gates
                if await bot.redis.hget(
                    bot.keys.ext("slack-card", g.gate_id, bot.keys.shard_of(child)), "ts"
                )
            ]
            if len(posted) == 2:
                return posted
        return None

    first, _second = await wait_until(two_cards, timeout=15)
    card = await bot.card(first.gate_id)
    resp = await bot.client.action(
        "gate_approve", cards.button_value(first), user_id=APPROVER, message_ts=card.ts
    )
    assert resp.status == 200
    await bot.wait_card(first.gate_id, "Approved")
    await bot.gateway.cancel_run(run_id, by=REQUESTER)
    msg = await bot.wait_card(first.gate_id, "cancelled before this call started")
    assert "Running" not in str(msg.blocks)
    assert journal_lines(journal) == []
