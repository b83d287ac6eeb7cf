"""The playground's Slack: files as slack_sdk's files_upload_v2 sends them, shown on the page
as a link to their content, and Slack's posting limit per channel."""

from __future__ import annotations

import pytest
from playwright.async_api import Page, expect
from slack_sdk.errors import SlackApiError

from playground.wire import PostRateLimit
from tests.playground.server_env import CH, RILEY, TOKEN, Env, env

__all__ = ["env"]  # the fixture, from server_env


async def test_an_uploaded_file_is_shown_in_its_thread_with_a_link(env: Env) -> None:
    root = await env.say("the task")
    text = "## Report\n" + "line with <angle> & ampersand\n" * 5000 + "END"
    resp = await env.slack.files_upload_v2(
        channel=CH,
        thread_ts=root["ts"],
        filename="answer-r-1.md",
        title="Answer of run r-1",
        content=text,
    )
    assert resp["ok"] and resp["file"]["title"] == "Answer of run r-1"
    thread = await env.thread(RILEY, root["ts"])
    (shared,) = [m for m in thread["replies"] if m["files"]]
    (f,) = shared["files"]
    assert f["title"] == "Answer of run r-1" and f["name"] == "answer-r-1.md"
    assert f["size"] == len(text.encode())
    async with env.http.get(env.url + f["url"]) as r:
        assert r.status == 200 and r.content_type == "text/plain"
        assert await r.text() == text, "the link gives the whole file"
    # As the Web API shows it to the bot.
    got = await env.slack.conversations_replies(channel=CH, ts=root["ts"])
    assert got["messages"][-1]["files"][0]["id"] == f["id"]


async def test_file_refusals(env: Env) -> None:
    url = await env.slack.files_getUploadURLExternal(filename="a.txt", length=3)
    with pytest.raises(SlackApiError) as exc:  # never uploaded
        await env.slack.files_completeUploadExternal(files=[{"id": url["file_id"]}], channel_id=CH)
    assert exc.value.response["error"] == "file_not_found"
    async with env.http.post(url["upload_url"] + "x", data=b"abc") as r:
        assert r.status == 404
    async with env.http.post(url["upload_url"], data=b"abc") as r:
        assert r.status == 200
    with pytest.raises(SlackApiError) as exc:
        await env.slack.files_completeUploadExternal(
            files=[{"id": url["file_id"]}], channel_id="C0ELSEWHERE"
        )
    assert exc.value.response["error"] == "channel_not_found"
    await env.slack.files_completeUploadExternal(files=[{"id": url["file_id"]}], channel_id=CH)
    with pytest.raises(SlackApiError) as exc:  # only once
        await env.slack.files_completeUploadExternal(files=[{"id": url["file_id"]}], channel_id=CH)
    assert exc.value.response["error"] == "file_not_found"
    async with env.http.get(f"{env.url}/files/FNOPE/a.txt") as r:
        assert r.status == 404


async def test_posting_is_limited_per_channel_as_slack_does(env: Env) -> None:
    env.pg.api.post_limit = PostRateLimit(per_second=1.0, burst=2)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    statuses = []
    for i in range(3):
        body = {"channel": CH, "text": f"m{i}"}
        async with env.http.post(
            f"{env.url}/api/chat.postMessage", json=body, headers=headers
        ) as r:
            statuses.append((r.status, r.headers.get("Retry-After"), (await r.json())["ok"]))
    assert statuses == [(200, None, True), (200, None, True), (429, "1", False)]
    assert [m["text"] for m in await env.history(RILEY)] == ["m0", "m1"]


async def test_the_page_shows_a_shared_file_as_an_attachment(env: Env, own_page: Page) -> None:
    root = await env.say("Task started by Riley: write the report")
    text = "## Report\n" + "a long line of the report\n" * 2000
    await env.slack.files_upload_v2(
        channel=CH,
        thread_ts=root["ts"],
        filename="answer-r-1.md",
        title="Answer of run r-1",
        content=text,
    )
    await own_page.goto(f"{env.url}/?as={RILEY}")
    msg = own_page.locator("#messages .msg", has_text="write the report")
    await msg.locator(".replies-link").click()
    card = own_page.locator("#thread-replies a.file-card")
    await expect(card).to_contain_text("Answer of run r-1")
    await expect(card).to_contain_text("answer-r-1.md")
    href = await card.get_attribute("href")
    assert href is not None
    async with env.http.get(env.url + href) as r:
        assert await r.text() == text
