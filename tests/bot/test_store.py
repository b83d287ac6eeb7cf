"""Card records: a call's outcome is stored atomically, and a cancel's guess never replaces it."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from agent_core import Keys
from bot.cards import ToolResult
from bot.store import Store

NEVER_RAN = ToolResult(ok=False, skipped="the run was cancelled before this call ran")
RAN = ToolResult(ok=True, output="user 7 deleted")


async def test_a_cancels_guess_is_stored_only_while_no_outcome_is(redis: Redis) -> None:
    keys = Keys("t")
    store = Store(redis, keys)
    first, second = keys.new_gate_id(1), keys.new_gate_id(2)

    assert await store.set_result_unless_known(first, NEVER_RAN)
    assert (await store.card(first)).result == NEVER_RAN
    await store.set_result(first, RAN)  # the call's own outcome replaces the guess
    assert not await store.set_result_unless_known(first, NEVER_RAN)
    assert (await store.card(first)).result == RAN
    assert 0 < await redis.ttl(store.card_key(first))

    # Racing guesses, in any order around the outcome: a guess before it is replaced, a
    # guess after it is refused, so the outcome stands.
    for _ in range(20):
        await asyncio.gather(
            *(store.set_result_unless_known(second, NEVER_RAN) for _ in range(10)),
            store.set_result(second, RAN),
            *(store.set_result_unless_known(second, NEVER_RAN) for _ in range(10)),
        )
        assert (await store.card(second)).result == RAN
        await redis.delete(store.card_key(second))
