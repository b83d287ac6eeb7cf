"""A run that fails closes its pending gates: their cards and late clicks say so.

The core's side (issue 7 contract) is written here as the core writes it: the gate hash
becomes ``cancelled`` with ``decided_by`` "", ``reason`` "the run failed: <error>",
``closed_by_failure`` "1", and a ``gate.decided`` event carries ``"run_failed": true``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from agent_core.testing import FakeOpenAI, call, reply
from bot import cards
from tests.bot.conftest import APPROVER, BotHarness, journal_lines


async def close_by_failure(bot: BotHarness, gate_id: str, run_id: str, error: str) -> None:
    gate = await bot.gateway.get_gate(gate_id)
    assert gate is not None
    await bot.redis.hset(
        bot.keys.gate(gate_id),
        mapping={
            "status": "cancelled",
            "decided_by": "",
            "decided_at": f"{time.time():.6f}",
            "reason": f"the run failed: {error}",
            "closed_by_failure": "1",
        },
    )
    data = {"run_id": run_id, "gate_id": gate_id, "run_failed": True, "origin": gate.origin}
    await bot.redis.xadd(
        bot.keys.events(bot.keys.shard_of(run_id)),
        {"type": "gate.decided", "run_id": run_id, "data": json.dumps(data)},
    )


async def test_a_gate_closed_by_a_failed_run_tells_the_card_and_late_clickers(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "delete user 90"
    fake_openai.script(task, [call("delete_user", {"user_id": "90"}), reply("never")])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    await close_by_failure(live, gate.gate_id, run_id, "model <!here> unavailable")

    msg = await live.wait_card(gate.gate_id, "*Closed*")
    blocks = json.dumps(msg.blocks, ensure_ascii=False)
    assert "✖️ *Closed* — the run failed: model &lt;!here&gt; unavailable; not executed" in blocks
    assert cards.APPROVE_ACTION not in blocks, "no buttons on a closed gate"
    assert "Cancelled" not in blocks, "nobody cancelled it"

    fake = live.fake
    await live.client.action(
        cards.APPROVE_ACTION,
        cards.button_value(gate),
        user_id=APPROVER,
        response_url=fake.response_url("late"),
    )
    (r,) = await fake.wait_for(lambda f: f.responses("late"), what="the late-click notice")
    text = r.args["text"]
    assert "closed" in text and "the run failed: model &lt;!here&gt; unavailable" in text, text
    assert "not executed" in text
    assert journal_lines(journal) == []
