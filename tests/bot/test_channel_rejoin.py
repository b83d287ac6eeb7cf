"""A card in an approval channel whose update Slack refused while the app was out of the
channel (found by the soak, tests/soak/promises.py) is remembered as stale for that channel
(bot/rejoin.py), and shown again from the gate's state once the app is back: when Slack
tells the app it joined (``member_joined_channel``, signed), or when a later update in that
channel goes through. A forged event, another person's join and a replayed event change
nothing more."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from agent_core import Decision, Gate, Keys, RunStatus
from agent_core.testing import FakeOpenAI, call, reply
from bot import cards
from bot.store import CARD_NS, NOTE_NS, RECORD_TTL_SECONDS, RUN_NS, STALE_MAX, Store
from tests.agents import FINANCE_CHANNEL
from tests.bot.conftest import APPROVER, CHANNEL, BotHarness, wait_until
from tests.bot.test_approval_channels import FIN_MEMBER, finished, money, pay, thread_line

__all__ = ["money"]  # the fixture, used by name


def store_of(bot: BotHarness) -> Store:
    return Store(bot.redis, bot.keys)


async def denied_while_out(bot: BotHarness, fake_openai: FakeOpenAI) -> tuple[Gate, Any]:
    """A gate whose card is in the finance channel, denied while the app is out of it: the
    card's update is refused (its record then marked stale); the gate and the card."""
    gate = await pay(bot, fake_openai)
    card = await bot.card(gate.gate_id)
    assert card.channel == FINANCE_CHANNEL and cards.APPROVE_ACTION in str(card.blocks)
    bot.fake.remove_bot(FINANCE_CHANNEL)
    await bot.gateway.decide(
        gate.gate_id, Decision.DENY, by=FIN_MEMBER, reason="not now", run_id=gate.run_id
    )
    assert await finished(bot, gate.run_id) is RunStatus.COMPLETED
    await thread_line(bot, gate, "denied")  # the line in the task's thread tells it

    async def marked() -> bool:
        refused = any(
            not c.ok and c.args.get("ts") == card.ts for c in bot.fake.calls_to("chat.update")
        )
        marks = await store_of(bot).stale_cards(FINANCE_CHANNEL)
        return refused and f"{CARD_NS}:{gate.gate_id}" in [m for m, _ in marks]

    await wait_until(marked)
    return gate, card


def updates_of(bot: BotHarness, ts: str) -> list[Any]:
    return [c for c in bot.fake.calls_to("chat.update") if c.args.get("ts") == ts and c.ok]


async def test_a_card_in_the_channel_shows_its_outcome_once_the_app_is_back(
    money: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    gate, card = await denied_while_out(money, fake_openai)
    assert cards.APPROVE_ACTION in str(money.fake.message(FINANCE_CHANNEL, card.ts).blocks)
    money.fake.invite_bot(FINANCE_CHANNEL)
    resp = await money.client.member_joined(FINANCE_CHANNEL, money.fake.bot_user_id)
    assert resp.status == 200
    done = await money.wait_card(gate.gate_id, "Denied")
    assert done.ts == card.ts, "the card itself, updated in place"
    assert cards.APPROVE_ACTION not in str(done.blocks)
    assert cards.DENY_ACTION not in str(done.blocks)
    assert "not now" in str(done.blocks)

    async def cleared() -> bool:
        return not await store_of(money).stale_cards(FINANCE_CHANNEL)

    await wait_until(cleared)
    # Slack delivers an event again when its answer was late: nothing is sent again.
    sent = len(updates_of(money, card.ts))
    resp = await money.client.member_joined(FINANCE_CHANNEL, money.fake.bot_user_id, retry=1)
    assert resp.status == 200
    again = await money.client.member_joined(FINANCE_CHANNEL, money.fake.bot_user_id)
    assert again.status == 200
    await money.server.context.drain()  # the handlers' work after their ack
    assert len(updates_of(money, card.ts)) == sent
    assert money.fake.message(FINANCE_CHANNEL, card.ts).text == done.text


async def test_a_forged_join_or_another_persons_join_shows_nothing_again(
    money: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    gate, card = await denied_while_out(money, fake_openai)
    money.fake.invite_bot(FINANCE_CHANNEL)
    bot_user = money.fake.bot_user_id
    sent = len(updates_of(money, card.ts))
    forged = await money.client.member_joined(FINANCE_CHANNEL, bot_user, secret="not-the-secret")
    assert forged.status == 401
    unsigned = await money.client.member_joined(FINANCE_CHANNEL, bot_user, signature="")
    assert unsigned.status == 401
    # Signed, but someone else joined (or the event names the app in another channel).
    other = await money.client.member_joined(FINANCE_CHANNEL, FIN_MEMBER)
    assert other.status == 200
    elsewhere = await money.client.member_joined("C0ELSEWHERE", bot_user)
    assert elsewhere.status == 200
    bad = await money.client.event({"type": "member_joined_channel", "user": bot_user})
    assert bad.status == 200
    # A join the app is told of is handled after its ack: once that work is done, the card
    # in the channel is as it was, and still marked stale.
    await money.server.context.drain()
    marks = await store_of(money).stale_cards(FINANCE_CHANNEL)
    assert [m for m, _ in marks] == [f"{CARD_NS}:{gate.gate_id}"]
    shown = money.fake.message(FINANCE_CHANNEL, card.ts)
    assert cards.APPROVE_ACTION in str(shown.blocks)
    assert len(updates_of(money, card.ts)) == sent, "not updated since the app was removed"
    # The real join, once: shown.
    await money.client.member_joined(FINANCE_CHANNEL, bot_user)
    done = await money.wait_card(gate.gate_id, "Denied")
    assert cards.APPROVE_ACTION not in str(done.blocks)


async def test_a_later_update_in_the_channel_shows_its_stale_cards_again(
    money: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """No join event reached the app (Socket Mode down, the event lost): the next card
    posted in the channel brings the stale one up to date."""
    gate, _ = await denied_while_out(money, fake_openai)
    money.fake.invite_bot(FINANCE_CHANNEL)
    second = await pay(money, fake_openai, task="pay invoice 8")
    assert (await money.card(second.gate_id)).channel == FINANCE_CHANNEL
    done = await money.wait_card(gate.gate_id, "Denied")
    assert cards.APPROVE_ACTION not in str(done.blocks)


async def test_stale_marks_are_bounded_expire_and_survive_a_refusal_during_a_refresh(
    redis: Redis,
) -> None:
    store = Store(redis, Keys("rejoin-test"))
    channel = "C0STALE"
    for i in range(5):
        await store.mark_stale(channel, f"g{i}")
    await store.mark_stale(channel, "g1", NOTE_NS)
    key = store.stale_key(channel)
    assert 0 < await redis.ttl(key) <= RECORD_TTL_SECONDS
    marks = await store.stale_cards(channel)
    assert len(marks) == 6
    # A card marked again while being shown (Slack still refused) keeps its mark.
    await store.mark_stale(channel, "g0")
    assert await store.clear_stale(channel, marks) == 5
    assert [m for m, _ in await store.stale_cards(channel)] == [f"{CARD_NS}:g0"]
    # Bounded: the newest STALE_MAX marks are kept.
    await redis.delete(key)
    for i in range(STALE_MAX + 5):
        await store.mark_stale(channel, f"x{i}")
    kept = [m for m, _ in await store.stale_cards(channel)]
    assert len(kept) == STALE_MAX
    assert f"{CARD_NS}:x{STALE_MAX + 4}" in kept and f"{CARD_NS}:x4" not in kept


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ({"user": "U0BOT", "channel": "C0FIN"}, "C0FIN"),
        ({"user": "U0BOT", "channel": "G0PRIVATE"}, "G0PRIVATE"),
        ({"user": "U0SOMEONE", "channel": "C0FIN"}, None),
        ({"user": "U0BOT"}, None),
        ({"user": "U0BOT", "channel": "not a channel"}, None),
        ({"channel": "C0FIN"}, None),
    ],
)
def test_only_the_apps_own_join_counts(event: dict[str, Any], expected: str | None) -> None:
    from bot.rejoin import joined_channel

    assert joined_channel(event, "U0BOT") == expected
    assert joined_channel(event, None) is None, "the app's own id unknown: nothing"


async def test_the_root_message_shows_the_runs_outcome_once_the_app_is_back(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """The task's own channel: the app removed while a run waits, the run then decided and
    finished. Slack refuses the root message's update too; it is marked stale like a card
    and shows the outcome once the app is back (it had kept saying the run was waiting)."""
    task = "delete user 8 while the app is out"
    fake_openai.script(task, [call("delete_user", {"user_id": "8"}), reply("not deleted")])
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    run = await live.gateway.get_run(run_id)
    assert run is not None
    root = str(run.origin["thread_ts"])
    await live.fake.wait_for(lambda f: f.shows(CHANNEL, root, "awaiting approval"))
    live.fake.remove_bot(CHANNEL)
    await live.gateway.decide(gate, Decision.DENY, by=APPROVER, reason="no")
    assert await finished(live, run_id) is RunStatus.COMPLETED

    async def marked() -> bool:
        marks = [m for m, _ in await store_of(live).stale_cards(CHANNEL)]
        return f"{RUN_NS}:{run_id}" in marks

    await wait_until(marked)
    assert live.fake.shows(CHANNEL, root, "awaiting approval"), "Slack kept the old one"

    live.fake.invite_bot(CHANNEL)
    resp = await live.client.member_joined(CHANNEL, live.fake.bot_user_id)
    assert resp.status == 200
    await live.fake.wait_for(lambda f: f.shows(CHANNEL, root, "completed"), what="root shown")
    assert not live.fake.shows(CHANNEL, root, "awaiting approval")
