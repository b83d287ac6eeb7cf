"""The playground's workspace state in a real Redis: message timestamps, the channel's pages
with each person's ephemeral messages, threads, triggers and response URLs."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from agent_core import create_redis
from playground import store as store_module
from playground.store import TRIGGER_USED, Message, Store

CH = "C0PGGENERAL"
RILEY, AVERY = "U0PGRILEY", "U0PGAVERY"


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[Store]:
    """A store on a client made as the launcher makes it (a bounded, blocking pool)."""
    client = create_redis(redis_url)
    try:
        yield Store(client, f"pgtest-{uuid.uuid4().hex[:10]}")
    finally:
        await client.aclose()


async def add(
    store: Store,
    text: str,
    *,
    thread_ts: str | None = None,
    to: str | None = None,
    user: str = "U0PGBOT",
) -> Message:
    msg = Message(
        channel=CH,
        ts=await store.next_ts(),
        text=text,
        thread_ts=thread_ts,
        user=user,
        ephemeral_to=to,
    )
    await store.add(msg)
    return msg


async def test_next_ts_is_unique_and_increasing_under_concurrency(store: Store) -> None:
    before = await store.next_ts()
    many = await asyncio.gather(*(store.next_ts() for _ in range(200)))
    after = await store.next_ts()
    assert all(re.fullmatch(r"\d{10}\.\d{6}", ts) for ts in many)
    assert len(set(many)) == 200
    # Every one is a distinct float too (the sorted sets score by float(ts)).
    assert len({float(ts) for ts in many}) == 200
    assert float(before) < min(map(float, many)) and max(map(float, many)) < float(after)
    sequential = [await store.next_ts() for _ in range(50)]
    assert sequential == sorted(sequential, key=float)
    assert len(set(sequential)) == 50


async def test_prefixes_do_not_mix(redis: Redis) -> None:
    a, b = Store(redis, "pgtest-a"), Store(redis, "pgtest-b")
    await add(a, "in a")
    assert (await b.top_level(CH, limit=10))[0] == []
    assert [m.text for m in (await a.top_level(CH, limit=10))[0]] == ["in a"]


async def test_message_round_trip(store: Store) -> None:
    msg = Message(
        channel=CH,
        ts=await store.next_ts(),
        text="héllo <@U0PGRILEY>",
        blocks=[{"type": "divider"}],
        user="U0PGBOT",
        bot_id="B0PGBOT",
        metadata={"event_type": "gate", "event_payload": {"id": 1}},
    )
    await store.add(msg)
    assert await store.get(CH, msg.ts) == msg
    msg.text, msg.updated = "changed", 1
    await store.save(msg)
    assert await store.get(CH, msg.ts) == msg
    await store.delete(msg)
    assert await store.get(CH, msg.ts) is None
    assert (await store.top_level(CH, limit=10))[0] == []


async def test_top_level_pages_with_the_viewers_ephemerals(store: Store) -> None:
    # Public messages p0..p5, with ephemeral ones in between: e_r* for Riley, e_a for Avery.
    order: list[Message] = []
    for i in range(6):
        order.append(await add(store, f"p{i}"))
        if i in (0, 2, 4):
            order.append(await add(store, f"e_r{i}", to=RILEY))
        if i == 3:
            order.append(await add(store, "e_a", to=AVERY))
    root = order[0]
    await add(store, "a reply", thread_ts=root.ts)  # replies are not top level
    await add(store, "an ephemeral reply", thread_ts=root.ts, to=RILEY)

    page, more = await store.top_level(CH, limit=2, viewer=RILEY)
    assert [m.text for m in page] == ["p4", "e_r4", "p5"] and more
    page2, more = await store.top_level(CH, limit=2, viewer=RILEY, before=page[0].ts)
    assert [m.text for m in page2] == ["p2", "e_r2", "p3"] and more
    page3, more = await store.top_level(CH, limit=2, viewer=RILEY, before=page2[0].ts)
    assert [m.text for m in page3] == ["p0", "e_r0", "p1"] and not more

    everything, more = await store.top_level(CH, limit=50, viewer=AVERY)
    assert [m.text for m in everything] == ["p0", "p1", "p2", "p3", "e_a", "p4", "p5"]
    assert not more
    nobody, _ = await store.top_level(CH, limit=50)
    assert [m.text for m in nobody] == [f"p{i}" for i in range(6)]
    # An exact page: nothing older, so has_more is False.
    exact, more = await store.top_level(CH, limit=6)
    assert len(exact) == 6 and not more


async def test_replies_with_the_viewers_ephemerals(store: Store) -> None:
    root = await add(store, "root")
    r1 = await add(store, "r1", thread_ts=root.ts, user=RILEY)
    await add(store, "only Riley", thread_ts=root.ts, to=RILEY)
    await add(store, "only Avery", thread_ts=root.ts, to=AVERY)
    r2 = await add(store, "r2", thread_ts=root.ts, user=AVERY)
    assert [m.text for m in await store.replies(CH, root.ts, RILEY)] == [
        "r1",
        "only Riley",
        "r2",
    ]
    assert [m.text for m in await store.replies(CH, root.ts)] == ["r1", "r2"]
    # Ephemeral replies are not counted.
    assert await store.reply_stats(CH, root.ts) == (2, [RILEY, AVERY], r2.ts)
    assert await store.reply_stats(CH, r1.ts) == (0, [], None)


async def test_window_bounds(store: Store) -> None:
    ts = [(await add(store, f"m{i}")).ts for i in range(4)]

    async def window(oldest: float, latest: float, inclusive: bool) -> list[str]:
        found = await store.window(CH, None, oldest=oldest, latest=latest, inclusive=inclusive)
        return [m.ts for m in found]

    inf = float("inf")
    assert await window(float(ts[0]), float(ts[3]), False) == ts[1:3]
    assert await window(float(ts[0]), float(ts[3]), True) == ts
    assert await window(0, inf, False) == ts
    assert await window(float(ts[2]), inf, False) == [ts[3]]
    assert await window(float(ts[2]), inf, True) == ts[2:]


async def test_views(store: Store) -> None:
    view = {"type": "modal", "id": "V1", "title": {"type": "plain_text", "text": "Ré"}}
    await store.save_view("V1", RILEY, view)
    assert await store.get_view("V1") == (RILEY, view)
    await store.drop_view("V1")
    assert await store.get_view("V1") is None


async def test_a_trigger_is_exchanged_once(store: Store) -> None:
    await store.issue_trigger("t1", RILEY)
    assert await store.exchange_trigger("t1") == RILEY
    assert await store.exchange_trigger("t1") == TRIGGER_USED
    assert await store.exchange_trigger("never-issued") is None
    # Exchanging never creates a trigger.
    assert await store.redis.exists(f"{store.p}:trigger:never-issued") == 0
    # At once: one exchange wins.
    await store.issue_trigger("t2", AVERY)
    results = await asyncio.gather(*(store.exchange_trigger("t2") for _ in range(10)))
    assert sorted(results) == sorted([AVERY] + [TRIGGER_USED] * 9)


async def test_a_trigger_expires(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "TRIGGER_TTL_MS", 30)
    await store.issue_trigger("t", RILEY)
    await asyncio.sleep(0.1)
    assert await store.exchange_trigger("t") is None


async def test_a_response_url_works_five_times(store: Store) -> None:
    context = {"user": RILEY, "channel": CH, "thread_ts": None, "message_ts": "1.000001"}
    await store.issue_response_url("tok", context)
    ttl = await store.redis.ttl(f"{store.p}:respond:tok")
    assert 0 < ttl <= store_module.RESPONSE_URL_TTL_S
    uses = [await store.use_response_url("tok") for _ in range(6)]
    assert [u["left"] if u else None for u in uses] == [4, 3, 2, 1, 0, None]
    assert uses[0] == {**context, "left": 4}
    # Counting a use keeps the 30-minute expiry.
    assert 0 < await store.redis.ttl(f"{store.p}:respond:tok") <= ttl
    assert await store.use_response_url("unknown") is None


async def test_a_response_url_five_times_at_once(store: Store) -> None:
    await store.issue_response_url("tok", {"user": RILEY, "channel": CH})
    results = await asyncio.gather(*(store.use_response_url("tok") for _ in range(20)))
    used = [r for r in results if r is not None]
    assert sorted(r["left"] for r in used) == [0, 1, 2, 3, 4]
