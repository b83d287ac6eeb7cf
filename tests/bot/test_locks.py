"""Card locks: mutual exclusion across web replicas that a stuck holder cannot keep."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from agent_core import Keys
from bot.scripts import BotScripts
from bot.store import LockBusy, Store


async def test_a_holder_stuck_past_the_bound_is_cancelled_and_the_lock_freed(
    redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    keys = Keys("t")
    stuck = Store(redis, keys, lock_max_hold=0.5)
    other = Store(redis, keys)
    never = asyncio.Event()
    cancelled = False

    async def holder() -> None:
        nonlocal cancelled
        async with stuck.lock("gate:00abc"):
            try:
                await never.wait()  # a call that never returns
            except asyncio.CancelledError:
                cancelled = True
                raise

    task = asyncio.create_task(holder())
    await asyncio.sleep(0.1)
    with pytest.raises(LockBusy):
        async with other.lock("gate:00abc", wait_seconds=0.1):
            pass
    with pytest.raises(TimeoutError):
        await task
    assert cancelled
    assert "held for over 0.5 s: its holder was cancelled" in caplog.text
    async with other.lock("gate:00abc", wait_seconds=0.5):
        pass  # free again, without waiting for the TTL


async def test_a_timeout_inside_the_section_is_not_reported_as_a_stuck_holder(
    redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(redis, Keys("t"))
    with pytest.raises(TimeoutError):
        async with store.lock("gate:00abd"):
            raise TimeoutError("Slack took too long")
    assert "holder was cancelled" not in caplog.text


class _SwallowingScripts(BotScripts):
    """Scripts whose lock renewal swallows a cancellation, as redis-py's client has been seen
    to do when one lands inside a command."""

    async def renew_lock(self, lock_key: str, token: str, ttl_ms: int) -> bool:
        try:
            await asyncio.sleep(2.0)
        except asyncio.CancelledError:
            pass  # swallowed: the caller goes on
        return True


async def test_a_renewal_that_swallows_its_cancellation_does_not_hold_the_lock(
    redis: Redis,
) -> None:
    """Seen in the Slack bench: a renewer whose cancel was swallowed kept renewing, and the
    holder waited for it forever; the card never updated again."""
    keys = Keys("t")
    store = Store(redis, keys)
    store.scripts = _SwallowingScripts(redis)
    loop = asyncio.get_running_loop()
    async with store.lock("gate:00abe"):
        await asyncio.sleep(3.6)  # the first renewal (every 3.3 s) is under way
        leaving = loop.time()
    assert loop.time() - leaving < 1.5, "the holder left within the bound"
    other = Store(redis, keys)
    async with other.lock("gate:00abe", wait_seconds=0.2):
        pass  # released, not renewed by the swallowing renewer
    await asyncio.sleep(2.5)
    assert await redis.exists(keys.ext("slack-lock", "gate:00abe", 0)) == 0


async def test_a_lock_reads_as_it_is_taken_and_writes_as_it_is_released(redis: Redis) -> None:
    keys = Keys("t")
    store, other = Store(redis, keys), Store(redis, keys)
    gate_id = keys.new_gate_id(3)
    card = store.card_key(gate_id)
    await redis.hset(card, mapping={"channel": "C1", "ts": "1.2", "digest": "old"})
    async with store.lock(f"gate:{gate_id}", read=[card, keys.gate(gate_id)]) as held:
        assert held.read == [{"channel": "C1", "ts": "1.2", "digest": "old"}, {}]
        # Exclusive like a plain lock, whichever way it is taken.
        with pytest.raises(LockBusy):
            async with other.lock(f"gate:{gate_id}", wait_seconds=0.05, read=[card]):
                pass
        held.write_at_release(card, {"digest": "new", "shown": "approved"})
        assert await redis.hget(card, "digest") == "old", "written at the release, not before"
    assert await redis.hgetall(card) == {
        "channel": "C1",
        "ts": "1.2",
        "digest": "new",
        "shown": "approved",
    }
    assert 0 < await redis.ttl(card), "the record keeps an expiry"
    assert not await redis.exists(store.lock_key(f"gate:{gate_id}")), "released"

    # A section that fails still records what it did, and frees the lock.
    with pytest.raises(RuntimeError):
        async with store.lock(f"gate:{gate_id}", read=[card]) as held:
            held.write_at_release(card, {"digest": "after-a-failure"})
            raise RuntimeError("Slack answered, then something broke")
    assert await redis.hget(card, "digest") == "after-a-failure"
    async with other.lock(f"gate:{gate_id}", wait_seconds=0.05):
        pass


async def test_a_lock_taken_again_with_its_own_token_is_its_holders(redis: Redis) -> None:
    """Taking a lock is retried when its reply is lost (a failover): the retry finds the lock
    held by its own token, and has it, instead of waiting for itself until the lock's TTL."""
    keys = Keys("t")
    key = Store(redis, keys).lock_key(f"gate:{keys.new_gate_id(3)}")
    take = BotScripts(redis).lock_and_read
    assert await take(key, "token-1", 10_000) == []
    assert await take(key, "token-1", 10_000) == [], (
        "the first take's reply was lost: it is its own"
    )
    assert await take(key, "token-2", 10_000) is None


async def test_fields_written_as_the_lock_is_taken_are_written_even_when_it_is_busy(
    redis: Redis,
) -> None:
    """A call's outcome is stored in the round trip that takes its card's lock, before the
    card's record is read: the read shows it, and a busy lock (the event tried again later)
    does not lose it."""
    keys = Keys("t")
    store = Store(redis, keys)
    gate_id = keys.new_gate_id(3)
    card, lock = store.card_key(gate_id), store.lock_key(f"gate:{gate_id}")
    take = BotScripts(redis).lock_and_read
    assert await take(lock, "other-holder", 10_000) == []
    ran = {"result_ok": "1", "result_output": "deleted"}
    busy = await take(lock, "token", 10_000, [card], write_first=ran, write_ttl=60)
    assert busy is None
    assert await redis.hgetall(card) == ran and 0 < await redis.ttl(card) <= 60
    await redis.delete(lock)
    again = {"result_ok": "0", "result_output": "failed"}
    assert await take(lock, "token", 10_000, [card], write_first=again, write_ttl=60) == [again]
    with pytest.raises(ValueError, match="write_first needs a hash"):
        await take(lock, "token", 10_000, write_first=again, write_ttl=60)
