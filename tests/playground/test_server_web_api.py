"""The playground's Web API, as the bot calls it (tests/playground/server_env.py has the
set-up): auth, posting, updating, ephemeral messages, paging, views and people."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from playground import people
from playground import store as store_module
from tests.playground.server_env import (
    AVERY,
    BUTTONS,
    CH,
    RILEY,
    SAM,
    TOKEN,
    TS,
    Env,
    env,
    modal,
    texts,
)

__all__ = ["env"]  # the fixture, from server_env


# =========================================================================== Web API: auth
async def test_web_api_auth(env: Env) -> None:
    assert await env.api("auth.test", token=None) == {"ok": False, "error": "not_authed"}
    assert await env.api("auth.test", token="xoxb-wrong") == {"ok": False, "error": "invalid_auth"}
    assert (await env.api("chat.postMessage", token="xoxb-wrong", channel=CH, text="x"))[
        "error"
    ] == "invalid_auth"
    # The token as a form field, as some clients send it.
    fields = {"token": TOKEN, "channel": CH, "text": "by form token"}
    async with env.http.post(f"{env.url}/api/chat.postMessage", data=fields) as r:
        assert (await r.json())["ok"] is True
    async with env.stream(RILEY) as stream:
        assert await env.api("nope.method") == {"ok": False, "error": "unknown_method"}
        event, data = await stream.next()
        assert event == "notice"
        assert data["level"] == "error"
        assert data["text"].startswith("nope.method → unknown_method")
    assert texts(await env.history(RILEY)) == ["by form token"]


async def test_auth_test_through_slack_sdk(env: Env) -> None:
    resp = await env.slack.auth_test()
    assert resp["ok"] is True
    assert resp["user_id"] == people.BOT_USER_ID
    assert resp["bot_id"] == people.BOT_ID
    assert resp["team_id"] == people.TEAM_ID
    assert resp["team"] == people.TEAM_NAME
    assert resp["user"] == people.BOT_NAME
    assert resp["url"].startswith("http")
    with pytest.raises(SlackApiError) as exc:
        await AsyncWebClient(
            token="xoxb-wrong", base_url=env.url + "/api/", session=env.http
        ).auth_test()
    assert exc.value.response["error"] == "invalid_auth"


# =========================================================================== chat.postMessage
async def test_post_message_is_stored_and_shown(env: Env) -> None:
    async with env.stream(AVERY) as stream:
        sent = await env.say("Approve?", blocks=BUTTONS)
        shown = await stream.next_message()
    assert sent["ok"] is True and sent["channel"] == CH and TS.match(sent["ts"])
    assert sent["message"]["blocks"] == BUTTONS
    assert sent["message"]["bot_id"] == people.BOT_ID
    assert shown["ts"] == sent["ts"] and shown["blocks"] == BUTTONS
    assert shown["bot"] is True and shown["user_name"] == people.BOT_NAME
    assert shown["ephemeral"] is False
    [stored] = await env.history(RILEY)
    assert stored == shown


async def test_post_message_with_a_form_body(env: Env) -> None:
    out = await env.api_form(
        "chat.postMessage", {"channel": CH, "text": "form", "blocks": json.dumps(BUTTONS)}
    )
    assert out["ok"] is True
    [stored] = await env.history(RILEY)
    assert stored["blocks"] == BUTTONS and stored["text"] == "form"


async def test_thread_replies_and_reply_counts(env: Env) -> None:
    root = await env.say("Task started")
    first = await env.say("first reply", thread_ts=root["ts"])
    # A reply to a reply lands in the root's thread, as in Slack.
    second = await env.say("reply to a reply", thread_ts=first["ts"])
    assert second["message"]["thread_ts"] == root["ts"]
    [shown] = await env.history(RILEY)  # replies are not in the channel's history
    assert shown["ts"] == root["ts"]
    assert shown["reply_count"] == 2
    assert shown["latest_reply"] == second["ts"]
    assert shown["reply_users"] == [people.BOT_USER_ID]
    thread = await env.thread(AVERY, root["ts"])
    assert thread["root"]["reply_count"] == 2
    assert texts(thread["replies"]) == ["first reply", "reply to a reply"]
    assert all(r["thread_ts"] == root["ts"] for r in thread["replies"])
    # conversations.replies from any message of the thread answers the whole thread.
    resp = await env.slack.conversations_replies(channel=CH, ts=second["ts"])
    assert texts(resp["messages"]) == ["Task started", "first reply", "reply to a reply"]
    assert resp["messages"][0]["reply_count"] == 2
    hist = await env.slack.conversations_history(channel=CH)
    assert [m["ts"] for m in hist["messages"]] == [root["ts"]]
    assert hist["messages"][0]["reply_count"] == 2
    assert hist["messages"][0]["thread_ts"] == root["ts"]


async def test_replies_are_announced_with_their_root(env: Env) -> None:
    root = await env.say("Task started")
    async with env.stream(RILEY) as stream:
        reply = await env.say("a reply", thread_ts=root["ts"])
        got = await stream.next_message()
        assert got["ts"] == reply["ts"] and got["thread_ts"] == root["ts"]
        moved = await stream.next_message()
        assert moved["ts"] == root["ts"] and moved["reply_count"] == 1


@pytest.mark.parametrize(
    ("blocks", "reason"),
    [
        ([{"type": "nope"}], "block 0: unknown block type 'nope'"),
        (
            [{"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3001}}],
            "block 0 (section): text attribute cannot exceed 3000 characters",
        ),
        (  # an element inside a block: a button's label is at most 75 characters
            [
                {"type": "divider"},
                {
                    "type": "actions",
                    "elements": [
                        {
                            "type": "button",
                            "action_id": "a",
                            "text": {"type": "plain_text", "text": "x" * 76},
                        }
                    ],
                },
            ],
            "block 1 (actions): text attribute cannot exceed 75 characters",
        ),
    ],
)
async def test_invalid_blocks_are_refused_with_a_notice(
    env: Env, blocks: list[dict[str, Any]], reason: str
) -> None:
    async with env.stream(RILEY) as stream:
        with pytest.raises(SlackApiError) as exc:
            await env.say("bad", blocks=blocks)
        event, data = await stream.next()
    # The bot sees only Slack's error code; the page says which block and why.
    assert exc.value.response.data == {"ok": False, "error": "invalid_blocks"}
    assert event == "notice" and data["level"] == "error"
    assert data["text"].startswith(f"chat.postMessage → invalid_blocks: {reason}")
    assert await env.history(RILEY) == []


async def test_post_message_refusals(env: Env) -> None:
    assert (await env.api("chat.postMessage", channel="C0NOPE", text="x"))[
        "error"
    ] == "channel_not_found"
    assert (await env.api("chat.postMessage", channel=CH))["error"] == "no_text"
    assert (await env.api("chat.postMessage", channel=CH, text=""))["error"] == "no_text"
    bad_metadata = {"event_type": "gate"}  # no event_payload
    assert (await env.api("chat.postMessage", channel=CH, text="x", metadata=bad_metadata))[
        "error"
    ] == "invalid_metadata_format"
    big = [{"type": "section", "text": {"type": "mrkdwn", "text": "y" * 2900}}] * 5
    assert (await env.api("chat.postMessage", channel=CH, text="x", blocks=big))[
        "error"
    ] == "msg_blocks_too_long"
    assert await env.history(RILEY) == []


async def test_metadata_round_trip(env: Env) -> None:
    metadata = {"event_type": "approval_gate", "event_payload": {"gate": "g-1", "n": 2}}
    root = await env.say("card", metadata=metadata)
    reply = await env.say("reply card", thread_ts=root["ts"], metadata=metadata)
    plain = await env.slack.conversations_history(channel=CH)
    assert "metadata" not in plain["messages"][0]
    full = await env.slack.conversations_history(channel=CH, include_all_metadata=True)
    assert full["messages"][0]["metadata"] == metadata
    plain_replies = await env.slack.conversations_replies(channel=CH, ts=root["ts"])
    assert all("metadata" not in m for m in plain_replies["messages"])
    replies = await env.slack.conversations_replies(
        channel=CH, ts=root["ts"], include_all_metadata=True
    )
    assert [m["ts"] for m in replies["messages"]] == [root["ts"], reply["ts"]]
    assert [m["metadata"] for m in replies["messages"]] == [metadata, metadata]


# =========================================================================== chat.update
async def test_update_changes_the_message_in_place(env: Env) -> None:
    sent = await env.say("Waiting for a decision", blocks=BUTTONS)
    async with env.stream(AVERY) as stream:
        resp = await env.slack.chat_update(channel=CH, ts=sent["ts"], text="Approved by @Avery")
        shown = await stream.next_message()
    assert resp["ts"] == sent["ts"] and resp["text"] == "Approved by @Avery"
    assert shown["ts"] == sent["ts"] and shown["updated"] == 1
    assert shown["blocks"] == BUTTONS  # blocks omitted: kept
    new_blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "Approved"}}]
    await env.slack.chat_update(channel=CH, ts=sent["ts"], text="done", blocks=new_blocks)
    [stored] = await env.history(RILEY)
    assert stored["ts"] == sent["ts"] and stored["updated"] == 2
    assert stored["text"] == "done"
    # Slack gives a block sent without a block_id one of its own, and keeps the rest as sent.
    [block] = stored["blocks"]
    assert isinstance(block.pop("block_id"), str) and block == new_blocks[0]
    [wire] = (await env.slack.conversations_history(channel=CH))["messages"]
    assert wire["edited"]["ts"] == sent["ts"]


async def test_update_refusals(env: Env) -> None:
    await env.send(RILEY, "a person's message")
    [mine] = await env.history(RILEY)
    out = await env.api("chat.update", channel=CH, ts=mine["ts"], text="hijacked")
    assert out == {"ok": False, "error": "cant_update_message"}
    out = await env.api("chat.update", channel=CH, ts="1700000000.000001", text="x")
    assert out == {"ok": False, "error": "message_not_found"}
    eph = await env.slack.chat_postEphemeral(channel=CH, user=RILEY, text="only you")
    out = await env.api("chat.update", channel=CH, ts=eph["message_ts"], text="x")
    assert out == {"ok": False, "error": "message_not_found"}
    bad = await env.say("fine")
    out = await env.api("chat.update", channel=CH, ts=bad["ts"], blocks=[{"type": "nope"}])
    assert out == {"ok": False, "error": "invalid_blocks"}
    assert texts(await env.history(RILEY)) == ["a person's message", "only you", "fine"]


async def test_delete(env: Env) -> None:
    sent = await env.say("to delete")
    async with env.stream(AVERY) as stream:
        await env.slack.chat_delete(channel=CH, ts=sent["ts"])
        assert await stream.next() == ("delete", {"channel": CH, "ts": sent["ts"]})
    assert await env.history(AVERY) == []
    out = await env.api("chat.delete", channel=CH, ts=sent["ts"])
    assert out == {"ok": False, "error": "message_not_found"}


# =========================================================================== ephemeral
async def test_ephemeral_goes_to_the_named_person_only(env: Env) -> None:
    root = await env.say("Task started")
    async with env.stream(RILEY) as riley, env.stream(AVERY) as avery:
        resp = await env.slack.chat_postEphemeral(channel=CH, user=RILEY, text="Only you")
        in_thread = await env.slack.chat_postEphemeral(
            channel=CH, user=RILEY, text="Only you, in the thread", thread_ts=root["ts"]
        )
        marker = await env.say("everyone")
        got = await riley.next_message()
        assert got["ts"] == resp["message_ts"] and got["ephemeral"] is True
        assert (await riley.next_message())["ts"] == in_thread["message_ts"]
        assert (await riley.next_message())["ts"] == marker["ts"]
        # Avery's tab never gets them: the next message it gets is the public one.
        assert (await avery.next_message())["ts"] == marker["ts"]
    assert texts(await env.history(RILEY)) == ["Task started", "Only you", "everyone"]
    assert texts(await env.history(AVERY)) == ["Task started", "everyone"]
    assert texts((await env.thread(RILEY, root["ts"]))["replies"]) == ["Only you, in the thread"]
    avery_thread = await env.thread(AVERY, root["ts"])
    assert avery_thread["replies"] == [] and avery_thread["root"]["reply_count"] == 0
    # The bot never reads ephemeral messages back.
    hist = await env.slack.conversations_history(channel=CH)
    assert texts(hist["messages"]) == ["everyone", "Task started"]
    out = await env.api("chat.postEphemeral", channel=CH, user="U0NOBODY", text="x")
    assert out["error"] == "user_not_in_channel"


# =========================================================================== paging
async def test_history_pages_newest_first(env: Env) -> None:
    posted = [(await env.say(f"m{i}"))["ts"] for i in range(250)]
    pages: list[list[str]] = []
    cursor = ""
    while True:
        resp = await env.slack.conversations_history(channel=CH, limit=100, cursor=cursor)
        pages.append([m["ts"] for m in resp["messages"]])
        cursor = resp["response_metadata"]["next_cursor"]
        assert resp["has_more"] is bool(cursor)
        if not cursor:
            break
    assert [len(p) for p in pages] == [100, 100, 50]
    assert [ts for page in pages for ts in page] == posted[::-1]
    # The page shows the newest ones, oldest first, and says older ones exist.
    status, data = await env.get("/ui/history", **{"as": RILEY, "limit": "50"})
    assert status == 200 and data["has_more"] is True
    assert [m["ts"] for m in data["messages"]] == posted[-50:]
    status, data = await env.get(
        "/ui/history", **{"as": RILEY, "limit": "200", "before": posted[50]}
    )
    assert [m["ts"] for m in data["messages"]] == posted[:50] and data["has_more"] is False


async def test_replies_pages_oldest_first(env: Env) -> None:
    root = await env.say("root")
    replies = [(await env.say(f"r{i}", thread_ts=root["ts"]))["ts"] for i in range(25)]
    seen: list[str] = []
    cursor = ""
    for _ in range(10):
        resp = await env.slack.conversations_replies(
            channel=CH, ts=root["ts"], limit=10, cursor=cursor
        )
        seen += [m["ts"] for m in resp["messages"]]
        cursor = resp["response_metadata"]["next_cursor"]
        if not cursor:
            break
    assert seen == [root["ts"], *replies]


async def test_history_window(env: Env) -> None:
    ts = [(await env.say(f"m{i}"))["ts"] for i in range(5)]

    async def window(**args: Any) -> list[str]:
        resp = await env.slack.conversations_history(channel=CH, **args)
        return [m["ts"] for m in resp["messages"]]

    assert await window(oldest=ts[1], latest=ts[3]) == [ts[2]]
    assert await window(oldest=ts[1], latest=ts[3], inclusive=True) == [ts[3], ts[2], ts[1]]
    assert await window(oldest=ts[3]) == [ts[4]]
    assert await window(oldest=ts[3], inclusive=True) == [ts[4], ts[3]]
    assert await window(latest=ts[1]) == [ts[0]]
    assert await window(latest=ts[1], inclusive=True) == [ts[1], ts[0]]
    root = ts[0]
    replies = [(await env.say(f"r{i}", thread_ts=root))["ts"] for i in range(3)]
    resp = await env.slack.conversations_replies(channel=CH, ts=root, oldest=replies[0])
    assert [m["ts"] for m in resp["messages"]] == [root, *replies[1:]]
    for bad in ({"oldest": "yesterday"}, {"oldest": "nan"}, {"latest": "NaN"}):
        out = await env.api("conversations.history", channel=CH, **bad)
        assert out == {"ok": False, "error": "invalid_arguments"}
    out = await env.api("conversations.replies", channel=CH, ts=root, latest="nan")
    assert out == {"ok": False, "error": "invalid_arguments"}


@pytest.mark.parametrize(
    "cursor",
    [
        "not-a-cursor",
        base64.urlsafe_b64encode(b"next:abc").decode(),
        base64.urlsafe_b64encode(b"next:-5").decode(),
        base64.urlsafe_b64encode(b"prev:5").decode(),
    ],
)
async def test_invalid_cursor(env: Env, cursor: str) -> None:
    for i in range(3):
        await env.say(f"m{i}")
    out = await env.api("conversations.history", channel=CH, cursor=cursor)
    assert out == {"ok": False, "error": "invalid_cursor"}


async def test_reading_an_unknown_channel_or_thread(env: Env) -> None:
    assert (await env.api("conversations.history", channel="C0NOPE"))["error"] == (
        "channel_not_found"
    )
    out = await env.api("conversations.replies", channel=CH, ts="1700000000.000001")
    assert out["error"] == "thread_not_found"


# =========================================================================== views
async def test_views_open_with_the_clickers_trigger(env: Env) -> None:
    card = await env.say("Approve?", blocks=BUTTONS)
    async with env.stream(AVERY) as avery, env.stream(RILEY) as riley:
        status, data = await env.click(AVERY, card["ts"], "deny")
        assert (status, data) == (200, {"ok": True})
        trigger = env.bot.received[-1].payload()["trigger_id"]
        resp = await env.slack.views_open(trigger_id=trigger, view=modal())
        view = resp["view"]
        assert view["id"].startswith("V") and view["title"]["text"] == "Deny delete_user"
        assert view["app_id"] == people.APP_ID and view["team_id"] == people.TEAM_ID
        event, shown = await avery.next()
        assert event == "view" and shown == {"view_id": view["id"], "view": view}
        # The modal opens for the person who clicked, nowhere else.
        marker = await env.say("marker")
        assert (await riley.next_message())["ts"] == marker["ts"]
        # A trigger opens one view.
        with pytest.raises(SlackApiError) as exc:
            await env.slack.views_open(trigger_id=trigger, view=modal())
        assert exc.value.response["error"] == "exchanged_trigger_id"
    assert await env.pg.store.get_view(view["id"]) == (AVERY, view)
    for bad in ("", "1.2.nope"):
        out = await env.api("views.open", trigger_id=bad, view=modal())
        assert out == {"ok": False, "error": "expired_trigger_id"}


async def test_views_open_trigger_expires(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "TRIGGER_TTL_MS", 50)
    trigger = (await env.command(RILEY)).form()["trigger_id"]
    await asyncio.sleep(0.2)
    out = await env.api("views.open", trigger_id=trigger, view=modal())
    assert out == {"ok": False, "error": "expired_trigger_id"}


async def test_views_open_refuses_a_bad_view(env: Env) -> None:
    trigger = (await env.command(RILEY)).form()["trigger_id"]
    async with env.stream(RILEY) as stream:
        out = await env.api("views.open", trigger_id=trigger, view=modal("x" * 25))
        assert out == {"ok": False, "error": "invalid_arguments"}
        event, data = await stream.next()
        assert event == "notice" and "1-24 characters" in data["text"]
    bad_block = {**modal(), "blocks": [{"type": "input", "label": "not an object"}]}
    out = await env.api("views.open", trigger_id=trigger, view=bad_block)
    assert out == {"ok": False, "error": "invalid_blocks"}
    out = await env.api("views.open", trigger_id=trigger, view={"type": "home"})
    assert out == {"ok": False, "error": "invalid_arguments"}
    # A refused view does not use up the trigger.
    assert (await env.slack.views_open(trigger_id=trigger, view=modal()))["ok"] is True


async def test_views_update_by_view_id(env: Env) -> None:
    view = await env.open_view(RILEY, modal())
    async with env.stream(RILEY) as riley, env.stream(AVERY) as avery:
        resp = await env.slack.views_update(view_id=view["id"], view=modal("Reason, please"))
        event, shown = await riley.next()
        assert event == "view" and shown["view_id"] == view["id"]
        assert shown["view"]["title"]["text"] == "Reason, please"
        marker = await env.say("marker")
        assert (await avery.next_message())["ts"] == marker["ts"]
    assert resp["view"]["id"] == view["id"]
    found = await env.pg.store.get_view(view["id"])
    assert found is not None and found[0] == RILEY
    assert found[1]["title"]["text"] == "Reason, please"
    out = await env.api("views.update", view_id="VNOPE", view=modal())
    assert out == {"ok": False, "error": "not_found"}


# =========================================================================== people
async def test_usergroups_and_users(env: Env) -> None:
    resp = await env.slack.usergroups_users_list(usergroup=people.ONCALL_GROUP)
    assert resp["users"] == [SAM]
    out = await env.api("usergroups.users.list", usergroup="S0NOPE")
    assert out == {"ok": False, "error": "no_such_subteam"}
    user = (await env.slack.users_info(user=AVERY))["user"]
    assert user["id"] == AVERY and user["real_name"] == "Avery" and user["is_bot"] is False
    assert user["profile"]["display_name"] == "Avery"
    assert user["profile"]["title"] == people.APPROVER.title
    bot = (await env.slack.users_info(user=people.BOT_USER_ID))["user"]
    assert bot["is_bot"] is True and bot["name"] == people.BOT_NAME
    assert (await env.api("users.info", user="U0NOBODY"))["error"] == "user_not_found"
