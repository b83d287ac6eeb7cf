"""The two stores of the one fake Slack Web API keep the same rules: the playground's in Redis
(:class:`playground.store.Store`) and the tests' in memory
(:class:`tests.slack_fake.MemoryStore`, strict here: nothing taken as issued)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from agent_core import create_redis
from playground.state import TRIGGER_USED, Message, SharedFile, State
from playground.store import Store
from tests.slack_fake import MemoryStore

CH = "C0PGGENERAL"
RILEY, AVERY = "U0PGRILEY", "U0PGAVERY"


@pytest.fixture(params=["redis", "memory"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[State]:
    if request.param == "memory":
        yield MemoryStore(lenient=False)
        return
    client = create_redis(request.getfixturevalue("redis_url"))
    try:
        yield Store(client, f"pgstores-{uuid.uuid4().hex[:10]}")
    finally:
        await client.aclose()


async def add(
    store: State, text: str, *, thread_ts: str | None = None, to: str | None = None
) -> Message:
    msg = Message(CH, await store.next_ts(), text, thread_ts=thread_ts, user=RILEY, ephemeral_to=to)
    await store.add(msg)
    return msg


async def test_messages_threads_and_ephemerals(store: State) -> None:
    assert not await store.has_messages(CH)
    await add(store, "only Avery sees this", to=AVERY)
    assert not await store.has_messages(CH), "an ephemeral message is not in the channel"
    root = await add(store, "root", thread_ts=None)
    later = await add(store, "later")
    reply = await add(store, "reply", thread_ts=root.ts)
    await add(store, "ephemeral reply", thread_ts=root.ts, to=RILEY)
    assert await store.has_messages(CH)
    assert float(root.ts) < float(later.ts) < float(reply.ts)

    def texts(found: list[Message]) -> list[str]:
        return sorted(m.text for m in found)

    async def everything(root: str | None) -> list[str]:
        return texts(await store.window(CH, root, oldest=0, latest=float("inf"), inclusive=False))

    assert await everything(None) == ["later", "root"]
    assert await everything(root.ts) == ["reply"]
    only_later = await store.window(
        CH, None, oldest=float(root.ts), latest=float(later.ts), inclusive=True
    )
    assert texts(only_later) == ["later", "root"]
    exclusive = await store.window(
        CH, None, oldest=float(root.ts), latest=float(later.ts), inclusive=False
    )
    assert exclusive == []
    assert await store.reply_stats(CH, root.ts) == (1, [RILEY], reply.ts)
    assert await store.reply_stats(CH, later.ts) == (0, [], None)

    changed = await store.get(CH, root.ts)
    assert changed == root
    assert changed is not None
    changed.text, changed.updated = "edited", 1
    assert (await store.get(CH, root.ts)) == root, "nothing changes before it is saved"
    await store.save(changed)
    assert await store.get(CH, root.ts) == changed
    await store.delete(changed)
    assert await store.get(CH, root.ts) is None


async def test_views_triggers_and_response_urls(store: State) -> None:
    view = {"type": "modal", "title": {"type": "plain_text", "text": "t"}}
    await store.save_view("V1", RILEY, view)
    assert await store.get_view("V1") == (RILEY, view)
    await store.drop_view("V1")
    assert await store.get_view("V1") is None

    await store.issue_trigger("t1", RILEY)
    assert await store.exchange_trigger("t1") == RILEY
    assert await store.exchange_trigger("t1") == TRIGGER_USED
    assert await store.exchange_trigger("never-issued") is None

    context = {"user": RILEY, "channel": CH, "thread_ts": None, "message_ts": None}
    await store.issue_response_url("tok", context)
    uses = [await store.use_response_url("tok") for _ in range(6)]
    assert [u["left"] if u else None for u in uses] == [4, 3, 2, 1, 0, None]
    assert uses[0] == {**context, "left": 4}
    assert await store.use_response_url("unknown") is None


async def test_files_are_shared_once_and_statuses_clear(store: State) -> None:
    await store.new_file("F1", "F1.secret", "answer.md", 5)
    assert not await store.upload_file("F1", "F1.wrong", b"hello")
    assert await store.share_file("F1", "", CH, None) is None, "nothing uploaded yet"
    assert await store.file_content("F1") is None
    assert await store.upload_file("F1", "F1.secret", b"hello")
    assert await store.share_file("F1", "", CH, "1.000001") == SharedFile(
        "answer.md", "answer.md", 5
    )
    assert await store.share_file("F1", "again", CH, None) is None, "shared once"
    assert not await store.upload_file("F1", "F1.secret", b"other"), "no upload once shared"
    assert await store.file_content("F1") == ("answer.md", b"hello")

    assert await store.status(CH, "1.000001") == ""
    await store.set_status(CH, "1.000001", "is thinking…")
    assert await store.status(CH, "1.000001") == "is thinking…"
    await store.set_status(CH, "1.000001", "")
    assert await store.status(CH, "1.000001") == ""
