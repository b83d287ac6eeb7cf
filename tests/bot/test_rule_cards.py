"""A call an approver rule decided shows in Slack as decided by that rule: a card with no
buttons, naming the rule and its reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_core import RunStatus
from agent_core.testing import FakeOpenAI, call, reply
from tests.agents import ruled
from tests.bot.conftest import BotHarness, core_settings, journal_lines, wait_until
from tests.core.harness import Harness


async def test_a_rule_decision_is_shown_on_a_card_without_buttons(
    bot: BotHarness, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    bot.gateway.agent_name = ruled.name
    bot.core = Harness(bot.redis, core_settings(redis_url, fake_openai.base_url), ruled)
    bot.core.start_worker()
    fake_openai.script(
        "read users on staging",
        [call("read_table", {"env": "staging", "table": "users"}), reply("3 rows")],
    )
    run_id = await bot.start_task("read users on staging")

    async def done() -> Any:
        r = await bot.gateway.get_run(run_id)
        return r if r is not None and r.status.finished else None

    finished = await wait_until(done, timeout=15)
    assert finished.status is RunStatus.COMPLETED
    assert journal_lines(journal) == ["read_table:staging:users"]
    [gate] = await bot.gateway.gates(run_id)
    msg = await bot.wait_card(gate.gate_id, "users on staging: 3 rows")
    blocks = str(msg.blocks)
    assert "Approved* by the rule `staging_reads`" in blocks
    assert "reads on staging are fine" in blocks
    assert "gate_approve" not in blocks and "gate_deny" not in blocks
