"""The fake Slack's message metadata, history and held answers, through slack_sdk over HTTP."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from tests.slack_fake import FakeSlack

META = {"event_type": "approval_gate", "event_payload": {"gate_id": "g1"}}


@pytest.fixture
def api(fake_slack: FakeSlack) -> AsyncWebClient:
    return AsyncWebClient(token=fake_slack.token, base_url=fake_slack.base_url)


async def test_metadata_is_returned_only_when_asked_for(api: AsyncWebClient) -> None:
    root = await api.chat_postMessage(channel="C1", text="root")
    card = await api.chat_postMessage(
        channel="C1", thread_ts=root["ts"], text="card", metadata=META
    )
    plain = await api.conversations_replies(channel="C1", ts=root["ts"])
    assert [m["ts"] for m in plain["messages"]] == [root["ts"], card["ts"]]
    assert all("metadata" not in m for m in plain["messages"])
    assert plain["messages"][0]["reply_count"] == 1
    assert plain["messages"][1]["thread_ts"] == root["ts"]
    full = await api.conversations_replies(channel="C1", ts=root["ts"], include_all_metadata=True)
    assert full["messages"][1]["metadata"] == META and full["messages"][1]["bot_id"]
    # chat.update without metadata keeps it
    await api.chat_update(channel="C1", ts=card["ts"], text="decided")
    again = await api.conversations_replies(channel="C1", ts=card["ts"], include_all_metadata=True)
    assert again["messages"][1]["metadata"] == META


async def test_history_pages_top_level_messages_newest_first(api: AsyncWebClient) -> None:
    posted = [(await api.chat_postMessage(channel="C2", text=f"m{i}"))["ts"] for i in range(3)]
    await api.chat_postMessage(channel="C2", thread_ts=posted[0], text="a reply")
    seen: list[str] = []
    cursor = None
    while True:
        page = await api.conversations_history(channel="C2", limit=2, cursor=cursor)
        seen += [m["ts"] for m in page["messages"]]
        cursor = page["response_metadata"]["next_cursor"]
        assert bool(cursor) == page["has_more"]
        if not cursor:
            break
    assert seen == posted[::-1]
    newer = await api.conversations_history(channel="C2", oldest=posted[0])
    assert [m["ts"] for m in newer["messages"]] == posted[:0:-1]


async def test_slack_errors(api: AsyncWebClient, fake_slack: FakeSlack) -> None:
    with pytest.raises(SlackApiError) as err:
        await api.conversations_replies(channel="C3", ts="1.000001")
    assert err.value.response["error"] == "thread_not_found"
    with pytest.raises(SlackApiError) as err:
        await api.chat_postMessage(channel="C3", text="x", metadata={"event_type": "x"})
    assert err.value.response["error"] == "invalid_metadata_format"
    fake_slack.block_channel("C4")
    with pytest.raises(SlackApiError) as err:
        await api.conversations_history(channel="C4")
    assert err.value.response["error"] == "not_in_channel"


async def test_channel_membership_is_answered_as_slack_does(
    api: AsyncWebClient, fake_slack: FakeSlack
) -> None:
    """chat.postMessage's documented errors for a channel the app cannot post in: a public
    channel it is not in (``not_in_channel``), a private one (``channel_not_found``, as if it
    did not exist), an archived one (``is_archived``, for updates too, while reading works)."""
    kept = await api.chat_postMessage(channel="C0ARCH", text="before")

    async def error(**kwargs: object) -> str:
        with pytest.raises(SlackApiError) as err:
            await api.chat_postMessage(text="x", **kwargs)  # type: ignore[arg-type]
        return str(err.value.response["error"])

    fake_slack.remove_bot("C0PUB")
    fake_slack.remove_bot("G0PRIV", private=True)
    fake_slack.archive_channel("C0ARCH")
    assert await error(channel="C0PUB") == "not_in_channel"
    assert await error(channel="G0PRIV") == "channel_not_found"
    assert await error(channel="C0ARCH") == "is_archived"
    for channel, expected in (("C0PUB", "not_in_channel"), ("G0PRIV", "channel_not_found")):
        with pytest.raises(SlackApiError) as err:
            await api.conversations_history(channel=channel)
        assert err.value.response["error"] == expected
    with pytest.raises(SlackApiError) as err:
        await api.chat_update(channel="C0ARCH", ts=kept["ts"], text="after")
    assert err.value.response["error"] == "is_archived"
    history = await api.conversations_history(channel="C0ARCH")
    assert [m["text"] for m in history["messages"]] == ["before"]
    fake_slack.invite_bot("C0PUB")
    assert (await api.chat_postMessage(channel="C0PUB", text="joined"))["ok"]


async def test_a_held_answer_comes_after_the_message_is_posted(
    api: AsyncWebClient, fake_slack: FakeSlack
) -> None:
    fake_slack.hold("chat.postMessage", when=lambda args: "metadata" in args)
    await api.chat_postMessage(channel="C5", text="not held")
    posting = asyncio.ensure_future(api.chat_postMessage(channel="C5", text="held", metadata=META))
    await fake_slack.wait_for(lambda f: f.held == 1)
    assert [m.text for m in fake_slack.messages] == ["not held", "held"]
    assert not posting.done()
    fake_slack.release()
    resp = await asyncio.wait_for(posting, timeout=5)
    assert resp["ts"] == fake_slack.messages[-1].ts and fake_slack.held == 0


async def test_files_upload_v2_shares_the_file_in_the_thread(
    api: AsyncWebClient, fake_slack: FakeSlack
) -> None:
    """slack_sdk's files_upload_v2: an upload URL, the bytes POSTed there, then the share; the
    thread shows a message with the file, and the file holds the bytes."""
    root = await api.chat_postMessage(channel="C1", text="root")
    text = "é" * 70_000 + "\nend"
    resp = await api.files_upload_v2(
        channel="C1", thread_ts=root["ts"], filename="answer.md", title="Answer", content=text
    )
    assert resp["ok"] and resp["file"]["title"] == "Answer"
    (f,) = fake_slack.files
    assert f.text == text and f.length == len(text.encode()) and f.completed
    (shared,) = fake_slack.thread("C1", root["ts"])
    assert shared.files[0]["id"] == f.id and shared.files[0]["name"] == "answer.md"
    assert shared.files[0]["size"] == len(text.encode())
    got = await api.conversations_replies(channel="C1", ts=root["ts"])
    assert got["messages"][1]["files"][0]["title"] == "Answer"
    assert [c.method for c in fake_slack.calls][-3:-1] == [
        f"upload:{f.id}",
        "files.completeUploadExternal",
    ]


async def test_file_refusals(api: AsyncWebClient, fake_slack: FakeSlack) -> None:
    with pytest.raises(SlackApiError) as exc:
        await api.files_getUploadURLExternal(filename="", length=3)
    assert exc.value.response["error"] == "invalid_arguments"
    url = await api.files_getUploadURLExternal(filename="a.txt", length=3)
    with pytest.raises(SlackApiError) as exc:  # never uploaded
        await api.files_completeUploadExternal(files=[{"id": url["file_id"]}], channel_id="C1")
    assert exc.value.response["error"] == "file_not_found"
    async with aiohttp.ClientSession() as http:
        async with http.post(url["upload_url"] + "x", data=b"abc") as r:
            assert r.status == 404, "an upload URL never given"
        async with http.post(url["upload_url"], data=b"abc") as r:
            assert r.status == 200 and (await r.text()).startswith("OK")
    done = await api.files_completeUploadExternal(files=[{"id": url["file_id"]}], channel_id="C1")
    assert done["files"][0]["id"] == url["file_id"]
    with pytest.raises(SlackApiError) as exc:  # only once
        await api.files_completeUploadExternal(files=[{"id": url["file_id"]}], channel_id="C1")
    assert exc.value.response["error"] == "file_not_found"


async def test_posting_is_limited_per_channel_as_slack_does(
    api: AsyncWebClient, fake_slack: FakeSlack
) -> None:
    """About one chat.postMessage a second per channel: the next one is refused with HTTP 429
    and Retry-After, and not posted; another channel is not affected."""
    fake_slack.limit_posts(per_second=1.0, burst=1)
    await api.chat_postMessage(channel="C1", text="first")
    with pytest.raises(SlackApiError) as exc:
        await api.chat_postMessage(channel="C1", text="too soon")
    assert exc.value.response.status_code == 429
    assert exc.value.response.headers["Retry-After"] == "1"
    assert [m.text for m in fake_slack.messages] == ["first"]
    await api.chat_postMessage(channel="C2", text="elsewhere")
    await asyncio.sleep(1.05)
    await api.chat_postMessage(channel="C1", text="later")
    assert [m.text for m in fake_slack.messages] == ["first", "elsewhere", "later"]
