"""A card in an approval channel whose update Slack refused while the app was out of the
channel (found by the soak, tests/soak/promises.py): once the app is back, the card should
show the gate's outcome. Today it keeps what it showed, live buttons included, until someone
clicks it (the click is refused, and refreshes the card); the thread line tells the truth."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_core import Decision, RunStatus
from agent_core.testing import FakeOpenAI
from bot import cards
from tests.agents import FINANCE_CHANNEL
from tests.bot.conftest import BotHarness, wait_until
from tests.bot.test_approval_channels import FIN_MEMBER, finished, money, pay, thread_line

__all__ = ["money"]  # the fixture, used by name


@pytest.mark.xfail(
    strict=True,
    reason="known issue: a card in the approval channel that Slack refused to update while the "
    "app was out of the channel keeps its buttons once the app is back",
)
async def test_a_card_in_the_channel_shows_its_outcome_once_the_app_is_back(
    money: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    gate = await pay(money, fake_openai)
    card = await money.card(gate.gate_id)
    assert card.channel == FINANCE_CHANNEL and cards.APPROVE_ACTION in str(card.blocks)
    money.fake.remove_bot(FINANCE_CHANNEL)
    await money.gateway.decide(
        gate.gate_id, Decision.DENY, by=FIN_MEMBER, reason="not now", run_id=gate.run_id
    )
    assert await finished(money, gate.run_id) is RunStatus.COMPLETED
    await thread_line(money, gate, "denied")  # the line in the task's thread tells it

    async def refused() -> bool:
        return any(
            not c.ok and c.args.get("ts") == card.ts for c in money.fake.calls_to("chat.update")
        )

    await wait_until(refused)
    money.fake.invite_bot(FINANCE_CHANNEL)
    done = await money.wait_card(gate.gate_id, "Denied")
    assert cards.APPROVE_ACTION not in str(done.blocks)
