"""The playground's page side, without a browser (tests/playground/server_env.py has the
set-up): the UI API and the signed requests it sends the bot, response_url, view
submissions, bad input, and the events a manifest subscribes to."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.webhook.async_client import AsyncWebhookClient

from playground import people
from playground.launcher import slack_manifest
from playground.outbound import ACK_TIMEOUT
from playground.server import bot_events
from tests.playground.server_env import (
    AVERY,
    BUTTONS,
    CH,
    MORGAN,
    RILEY,
    SAM,
    TS,
    Env,
    Reply,
    env,
    json_reply,
    modal,
    texts,
    without_ids,
)

__all__ = ["env"]  # the fixture, from server_env


# =========================================================================== /ui/send
async def test_command_is_sent_signed_as_slack_does(env: Env) -> None:
    got = await env.command(RILEY, "/agent   delete user 42 ")
    assert got.signed
    assert got.headers["X-Slack-Signature"].startswith("v0=")
    assert abs(int(got.headers["X-Slack-Request-Timestamp"]) - time.time()) < 60
    form = got.form()
    assert form["command"] == "/agent"
    assert form["text"] == "delete user 42"
    assert form["user_id"] == RILEY and form["user_name"] == "riley"
    assert form["channel_id"] == CH and form["team_id"] == people.TEAM_ID
    assert form["api_app_id"] == people.APP_ID
    assert form["response_url"].startswith(f"{env.url}/respond/")
    assert re.fullmatch(r"\d+\.\d+\.[0-9a-f]{32}", form["trigger_id"])
    # Bolt acknowledged with an empty body: nothing is shown.
    assert await env.history(RILEY) == []


async def test_command_answer_becomes_an_ephemeral_message(env: Env) -> None:
    env.bot.answer(json_reply({"text": "Usage: /agent <task>", "response_type": "ephemeral"}))
    async with env.stream(RILEY) as riley, env.stream(AVERY) as avery:
        await env.command(RILEY, "/agent help")
        shown = await riley.next_message()
        marker = await env.say("marker")
        assert (await avery.next_message())["ts"] == marker["ts"]
    assert shown["text"] == "Usage: /agent <task>" and shown["ephemeral"] is True
    assert shown["user"] == people.BOT_USER_ID
    assert texts(await env.history(RILEY)) == ["Usage: /agent <task>", "marker"]
    assert texts(await env.history(AVERY)) == ["marker"]
    # in_channel: everyone sees it.
    env.bot.answer(json_reply({"text": "For everyone", "response_type": "in_channel"}))
    await env.command(RILEY)
    assert texts(await env.history(AVERY)) == ["marker", "For everyone"]
    # A plain-text body is shown to the person as is.
    env.bot.answer(Reply(200, "plain words"))
    await env.command(RILEY)
    assert texts(await env.history(RILEY))[-1] == "plain words"
    assert texts(await env.history(AVERY)) == ["marker", "For everyone"]


async def test_command_answer_with_bad_blocks_is_a_notice(env: Env) -> None:
    env.bot.answer(json_reply({"text": "x", "blocks": [{"type": "nope"}]}))
    async with env.stream(RILEY) as riley:
        await env.command(RILEY)
        event, data = await riley.next()
    assert event == "notice"
    assert data["text"].startswith("/agent answer → invalid_blocks: block 0")
    assert await env.history(RILEY) == []


async def test_command_failure_is_shown_as_slack_does(env: Env) -> None:
    env.bot.answer(Reply(500, "boom"))
    await env.command(RILEY)
    [shown] = await env.history(RILEY)
    assert shown["text"] == '/agent failed with the error "http_service_error"'
    assert shown["ephemeral"] is True and shown["user"] == "USLACKBOT" and not shown["bot"]
    assert await env.history(AVERY) == []


async def test_command_ack_timeout(env: Env) -> None:
    env.bot.answer(Reply(delay=ACK_TIMEOUT + 1))
    started = time.monotonic()
    await env.command(RILEY)
    assert ACK_TIMEOUT - 0.1 < time.monotonic() - started < ACK_TIMEOUT + 1.5
    [shown] = await env.history(RILEY)
    assert shown["text"] == '/agent failed with the error "operation_timeout"'
    assert shown["ephemeral"] is True


async def test_command_with_the_bot_down(env: Env) -> None:
    env.pg.sender.events_url = "http://127.0.0.1:9/slack/events"  # nothing listens there
    assert await env.send(RILEY, "/agent status") == {"ok": True}
    [shown] = await env.history(RILEY)
    assert shown["text"].startswith('/agent failed with the error "dispatch_failed')


async def test_unknown_command_sends_nothing(env: Env) -> None:
    out = await env.send(RILEY, "/nope do it")
    assert out == {"ok": False, "error": "/nope is not a valid command. Try /agent help."}
    assert env.bot.received == []
    assert await env.history(RILEY) == []


async def test_plain_message_is_not_an_event_without_a_subscription(env: Env) -> None:
    assert await env.send(RILEY, "hello @agent <b>&") == {"ok": True}
    assert env.bot.received == []
    [shown] = await env.history(AVERY)
    assert shown["user"] == RILEY and shown["user_name"] == "Riley" and not shown["bot"]
    # Stored as Slack sends it: escaped, with the mention as <@U…>.
    assert shown["text"] == f"hello <@{people.BOT_USER_ID}> &lt;b&gt;&amp;"


async def test_message_event_when_subscribed(env: Env) -> None:
    env.pg.info.bot_events = frozenset({"message.channels"})
    root = await env.say("root")
    assert await env.send(AVERY, "hi @Riley", thread_ts=root["ts"]) == {"ok": True}
    [got] = env.bot.received
    envelope = got.envelope()
    assert envelope["type"] == "event_callback"
    assert envelope["team_id"] == people.TEAM_ID and envelope["api_app_id"] == people.APP_ID
    assert envelope["event_id"].startswith("Ev")
    assert envelope["authorizations"][0]["user_id"] == people.BOT_USER_ID
    event = envelope["event"]
    assert event["type"] == "message" and event["channel"] == CH
    assert event["user"] == AVERY and event["text"] == f"hi <@{RILEY}>"
    assert event["thread_ts"] == root["ts"] and TS.match(event["ts"])
    assert event["channel_type"] == "channel"
    # No mention of the bot, no app_mention (and it is not subscribed anyway).
    assert len(env.bot.received) == 1


async def test_app_mention_only_when_subscribed(env: Env) -> None:
    env.pg.info.bot_events = frozenset({"app_mention"})
    await env.send(RILEY, "no mention here")
    assert env.bot.received == []
    await env.send(RILEY, "@agent status please")
    [got] = env.bot.received
    event = got.envelope()["event"]
    assert event["type"] == "app_mention" and event["user"] == RILEY
    assert event["text"] == f"<@{people.BOT_USER_ID}> status please"
    # Both subscribed: the message, then the mention, as two requests.
    env.pg.info.bot_events = frozenset({"app_mention", "message.channels"})
    await env.send(RILEY, "hey @agent")
    kinds = [r.envelope()["event"]["type"] for r in env.bot.received[1:]]
    assert kinds == ["message", "app_mention"]


async def test_event_refused_by_the_bot_is_a_notice(env: Env) -> None:
    env.pg.info.bot_events = frozenset({"message.channels"})
    env.bot.answer(Reply(500))
    async with env.stream(RILEY) as riley:
        await env.send(RILEY, "hello")
        assert (await riley.next_message())["text"] == "hello"
        event, data = await riley.next()
    assert event == "notice" and data["text"] == "event message → the app answered HTTP 500"


async def test_sending_in_a_thread_that_does_not_exist(env: Env) -> None:
    out = await env.send(RILEY, "hi", thread_ts="1700000000.000001")
    assert out == {"ok": False, "error": "that thread does not exist"}
    assert await env.history(RILEY) == []


# =========================================================================== /ui/action
async def test_action_payload_is_built_from_the_stored_message(env: Env) -> None:
    root = await env.say("Task started")
    card = await env.say("Approve?", blocks=BUTTONS, thread_ts=root["ts"])
    # The page claims another value: the bot gets the button's real one.
    status, data = await env.click(AVERY, card["ts"], value="gate-9:approve", style="danger")
    assert (status, data) == (200, {"ok": True})
    [got] = env.bot.received
    assert got.signed
    payload = got.payload()
    assert payload["type"] == "block_actions"
    assert payload["user"]["id"] == AVERY and payload["user"]["username"] == "avery"
    assert payload["team"]["id"] == people.TEAM_ID
    assert payload["api_app_id"] == people.APP_ID
    assert payload["channel"]["id"] == CH
    [action] = payload["actions"]
    assert action["value"] == "gate-1:approve"
    assert action["style"] == "primary"
    assert action["action_id"] == "approve" and action["block_id"] == "decide"
    assert action["type"] == "button" and action["text"]["text"] == "Approve"
    assert float(action["action_ts"]) > 0
    assert payload["container"] == {
        "type": "message",
        "message_ts": card["ts"],
        "channel_id": CH,
        "is_ephemeral": False,
        "thread_ts": root["ts"],
    }
    assert payload["message"]["ts"] == card["ts"]
    assert payload["message"]["blocks"] == BUTTONS
    assert payload["message"]["thread_ts"] == root["ts"]
    assert payload["response_url"].startswith(f"{env.url}/respond/")
    assert re.fullmatch(r"\d+\.\d+\.[0-9a-f]{32}", payload["trigger_id"])


async def test_action_refusals(env: Env) -> None:
    card = await env.say("Approve?", blocks=BUTTONS)
    eph = await env.slack.chat_postEphemeral(channel=CH, user=RILEY, text="x", blocks=BUTTONS)
    # Someone else's ephemeral message.
    status, data = await env.click(AVERY, eph["message_ts"])
    assert status == 400 and data["error"] == "no such message"
    # An element the message does not have.
    status, data = await env.click(AVERY, card["ts"], "delete_everything")
    assert status == 400 and data["error"] == "no such element in that message"
    status, data = await env.click(AVERY, card["ts"], "approve", block_id="other")
    assert status == 400
    # A message that does not exist.
    status, data = await env.click(AVERY, "1700000000.000001")
    assert status == 400
    assert env.bot.received == []
    # The person the ephemeral message was for can click it.
    status, data = await env.click(RILEY, eph["message_ts"])
    assert (status, data) == (200, {"ok": True})
    assert env.bot.received[-1].payload()["container"]["is_ephemeral"] is True


async def test_action_the_bot_fails(env: Env) -> None:
    card = await env.say("Approve?", blocks=BUTTONS)
    env.bot.answer(Reply(500))
    status, data = await env.click(AVERY, card["ts"])
    assert status == 200
    assert data == {"ok": False, "error": "The app did not respond (HTTP 500)."}


async def test_action_in_a_view(env: Env) -> None:
    view = modal()
    view["blocks"].append(
        {
            "type": "actions",
            "block_id": "more",
            "elements": [
                {
                    "type": "static_select",
                    "action_id": "pick",
                    "placeholder": {"type": "plain_text", "text": "Pick"},
                    "options": [
                        {"text": {"type": "plain_text", "text": "A"}, "value": "a"},
                        {"text": {"type": "plain_text", "text": "B"}, "value": "b"},
                    ],
                }
            ],
        }
    )
    opened = await env.open_view(RILEY, view)
    container = {"type": "view", "view_id": opened["id"]}
    action = {"action_id": "pick", "block_id": "more", "selected_option": {"value": "b"}}
    body = {"as": RILEY, "container": container, "action": action}
    assert await env.post("/ui/action", body) == (200, {"ok": True})
    payload = env.bot.received[-1].payload()
    assert payload["container"] == container and payload["view"]["id"] == opened["id"]
    assert payload["actions"][0]["selected_option"]["value"] == "b"
    assert payload["actions"][0]["selected_option"]["text"]["text"] == "B"
    assert "response_url" not in payload
    # An option the select does not have; someone else's view.
    bad = {**body, "action": {**action, "selected_option": {"value": "z"}}}
    assert (await env.post("/ui/action", bad))[0] == 400
    assert (await env.post("/ui/action", {**body, "as": AVERY}))[0] == 400


async def test_home_tab_for_the_acting_person(env: Env) -> None:
    """Opening Home tells the app (app_home_opened, when subscribed); views.publish reaches
    that person's page; a click on Home is a block_actions from a ``home`` view, theirs only."""
    env.pg.info.bot_events = frozenset({"app_home_opened"})
    assert await env.post("/ui/home", {"as": AVERY}) == (200, {"ok": True, "view": None})
    event = env.bot.received[-1].envelope()["event"]
    assert (event["type"], event["user"], event["tab"]) == ("app_home_opened", AVERY, "home")

    async with env.stream(AVERY) as page:
        resp = await env.slack.views_publish(
            user_id=AVERY, view={"type": "home", "blocks": BUTTONS}
        )
        published = dict(resp["view"])
        assert published["type"] == "home" and published["id"]
        kind, data = await page.next()
        assert kind == "home" and data["user"] == AVERY and data["view"]["id"] == published["id"]

    status, shown = await env.post("/ui/home", {"as": AVERY})
    assert status == 200 and shown["view"]["blocks"] == published["blocks"]
    received = len(env.bot.received)
    assert await env.get("/ui/home", **{"as": AVERY}) == (200, shown)  # read only
    assert await env.get("/ui/home", **{"as": RILEY}) == (200, {"ok": True, "view": None})
    assert len(env.bot.received) == received
    assert env.bot.received[-1].envelope()["event"]["view"]["id"] == published["id"]

    container = {"type": "view", "view_id": published["id"]}
    action = {"action_id": "approve", "block_id": "decide"}
    body = {"as": AVERY, "container": container, "action": action}
    assert await env.post("/ui/action", body) == (200, {"ok": True})
    payload = env.bot.received[-1].payload()
    assert payload["container"] == container and payload["view"]["type"] == "home"
    assert payload["user"]["id"] == AVERY and "response_url" not in payload
    # Someone else's Home.
    assert (await env.post("/ui/action", {**body, "as": RILEY}))[0] == 400

    # Slack's refusals: someone outside the workspace, a view that is not a Home view.
    with pytest.raises(SlackApiError) as outsider:
        await env.slack.views_publish(user_id="U0NOBODY", view={"type": "home", "blocks": []})
    assert outsider.value.response["error"] == "invalid_arguments"
    with pytest.raises(SlackApiError) as modal_view:
        await env.slack.views_publish(user_id=AVERY, view=modal())
    assert modal_view.value.response["error"] == "invalid_arguments"


# =========================================================================== response_url
async def clicked(env: Env, who: str = AVERY) -> tuple[str, str, str]:
    """(root ts, card ts, response_url) after ``who`` clicks a card in a thread."""
    root = await env.say("Task started")
    card = await env.say("Approve?", blocks=BUTTONS, thread_ts=root["ts"])
    assert (await env.click(who, card["ts"]))[0] == 200
    return root["ts"], card["ts"], str(env.bot.received[-1].payload()["response_url"])


async def test_response_url_default_is_ephemeral_in_the_thread(env: Env) -> None:
    root, _card, url = await clicked(env)
    hook = AsyncWebhookClient(url, session=env.http)
    async with env.stream(RILEY) as riley, env.stream(AVERY) as avery:
        resp = await hook.send(text="Only approvers can decide")
        shown = await avery.next_message()
        marker = await env.say("marker")
        assert (await riley.next_message())["ts"] == marker["ts"]
    assert resp.status_code == 200
    assert shown["text"] == "Only approvers can decide" and shown["ephemeral"] is True
    assert shown["thread_ts"] == root
    assert texts((await env.thread(AVERY, root))["replies"]) == [
        "Approve?",
        "Only approvers can decide",
    ]
    assert texts((await env.thread(RILEY, root))["replies"]) == ["Approve?"]
    assert "Only approvers can decide" not in texts(await env.history(AVERY))


async def test_response_url_in_channel(env: Env) -> None:
    root, _card, url = await clicked(env)
    resp = await AsyncWebhookClient(url, session=env.http).send(
        text="For all", response_type="in_channel"
    )
    assert resp.status_code == 200
    replies = (await env.thread(RILEY, root))["replies"]
    assert texts(replies) == ["Approve?", "For all"] and replies[1]["ephemeral"] is False
    # A command's response_url, in the channel.
    cmd_url = (await env.command(RILEY)).form()["response_url"]
    await AsyncWebhookClient(cmd_url, session=env.http).send(
        text="Started", response_type="in_channel"
    )
    assert texts(await env.history(AVERY)) == ["Task started", "Started"]


async def test_response_url_replace_original(env: Env) -> None:
    _root, card, url = await clicked(env)
    done = [{"type": "section", "text": {"type": "mrkdwn", "text": "Approved by <@U0PGAVERY>"}}]
    async with env.stream(RILEY) as riley:
        resp = await AsyncWebhookClient(url, session=env.http).send(
            text="Approved", blocks=done, replace_original=True
        )
        shown = await riley.next_message()
    assert resp.status_code == 200
    assert shown["ts"] == card and without_ids(shown["blocks"]) == done and shown["updated"] == 1
    stored = await env.pg.store.get(CH, card)
    assert stored is not None and stored.text == "Approved" and without_ids(stored.blocks) == done


async def test_response_url_delete_original(env: Env) -> None:
    root, card, url = await clicked(env)
    async with env.stream(RILEY) as riley:
        resp = await AsyncWebhookClient(url, session=env.http).send(delete_original=True)
        assert await riley.next() == ("delete", {"channel": CH, "ts": card})
    assert resp.status_code == 200
    assert await env.pg.store.get(CH, card) is None
    assert (await env.thread(RILEY, root))["replies"] == []


async def test_response_url_refusals(env: Env) -> None:
    _root, _card, url = await clicked(env)
    async with env.http.post(f"{env.url}/respond/not-a-token", json={"text": "x"}) as r:
        assert r.status == 404
    async with env.http.post(url, json={"blocks": [{"type": "nope"}]}) as r:
        assert r.status == 400 and (await r.json())["error"] == "invalid_blocks"
    async with env.http.post(url, json={}) as r:
        assert r.status == 400 and (await r.json())["error"] == "no_text"


async def test_response_url_works_five_times(env: Env) -> None:
    _root, _card, url = await clicked(env)
    hook = AsyncWebhookClient(url, session=env.http)
    statuses = [(await hook.send(text=f"use {i}")).status_code for i in range(6)]
    assert statuses == [200, 200, 200, 200, 200, 404]


async def test_response_url_five_uses_even_at_once(env: Env) -> None:
    _root, _card, url = await clicked(env)
    hook = AsyncWebhookClient(url, session=env.http)
    results = await asyncio.gather(*(hook.send(text=f"use {i}") for i in range(12)))
    assert sorted(r.status_code for r in results) == [200] * 5 + [404] * 7


# =========================================================================== views: submit
async def test_view_submit_required_field_empty(env: Env) -> None:
    view = await env.open_view(RILEY, modal())
    sent = len(env.bot.received)
    body = {"as": RILEY, "view_id": view["id"], "values": {"reason": {"text": {"value": "  "}}}}
    status, data = await env.post("/ui/view/submit", body)
    assert status == 200
    assert data == {
        "ok": True,
        "closed": False,
        "errors": {"reason": "Please fill out this field."},
    }
    too_long = {**body, "values": {"reason": {"text": {"value": "x" * 201}}}}
    status, data = await env.post("/ui/view/submit", too_long)
    assert data["errors"] == {"reason": "Please enter at most 200 characters."}
    assert len(env.bot.received) == sent  # Slack's client checks these itself


async def test_view_submit_sends_the_state(env: Env) -> None:
    view = await env.open_view(RILEY, modal())
    values = {"reason": {"text": {"value": "too risky"}}}
    status, data = await env.post(
        "/ui/view/submit", {"as": RILEY, "view_id": view["id"], "values": values}
    )
    assert (status, data) == (200, {"ok": True, "closed": True})
    payload = env.bot.received[-1].payload()
    assert payload["type"] == "view_submission" and payload["user"]["id"] == RILEY
    assert payload["view"]["id"] == view["id"]
    assert payload["view"]["callback_id"] == "deny_reason"
    assert payload["view"]["private_metadata"] == "gate-1"
    assert payload["view"]["state"]["values"] == {
        "reason": {"text": {"type": "plain_text_input", "value": "too risky"}},
        "note": {"text": {"type": "plain_text_input", "value": None}},
    }
    assert await env.pg.store.get_view(view["id"]) is None
    # The view is gone: submitting again is refused.
    status, data = await env.post(
        "/ui/view/submit", {"as": RILEY, "view_id": view["id"], "values": values}
    )
    assert status == 400


async def test_view_submit_errors_from_the_bot(env: Env) -> None:
    view = await env.open_view(RILEY, modal())
    env.bot.answer(json_reply({"response_action": "errors", "errors": {"reason": "Say more"}}))
    values = {"reason": {"text": {"value": "no"}}}
    body = {"as": RILEY, "view_id": view["id"], "values": values}
    assert await env.post("/ui/view/submit", body) == (
        200,
        {"ok": True, "closed": False, "errors": {"reason": "Say more"}},
    )
    assert await env.pg.store.get_view(view["id"]) is not None  # the modal stays open


async def test_view_submit_update(env: Env) -> None:
    view = await env.open_view(RILEY, modal())
    new = modal("Are you sure?")
    env.bot.answer(json_reply({"response_action": "update", "view": new}))
    body = {"as": RILEY, "view_id": view["id"], "values": {"reason": {"text": {"value": "ok"}}}}
    status, data = await env.post("/ui/view/submit", body)
    assert status == 200 and data["ok"] is True and data["closed"] is False
    assert data["view"]["id"] == view["id"]
    assert data["view"]["title"]["text"] == "Are you sure?"
    found = await env.pg.store.get_view(view["id"])
    assert found is not None and found[1]["title"]["text"] == "Are you sure?"


async def test_view_submit_the_bot_fails(env: Env) -> None:
    view = await env.open_view(RILEY, modal())
    env.bot.answer(Reply(500))
    body = {"as": RILEY, "view_id": view["id"], "values": {"reason": {"text": {"value": "x"}}}}
    status, data = await env.post("/ui/view/submit", body)
    assert status == 200 and data["ok"] is False
    assert await env.pg.store.get_view(view["id"]) is not None


async def test_view_submit_by_someone_else(env: Env) -> None:
    view = await env.open_view(RILEY, modal())
    body = {"as": AVERY, "view_id": view["id"], "values": {"reason": {"text": {"value": "x"}}}}
    status, data = await env.post("/ui/view/submit", body)
    assert status == 400 and data["error"] == "no such open view"


@pytest.mark.parametrize("notify", [True, False])
async def test_view_close(env: Env, notify: bool) -> None:
    view = await env.open_view(RILEY, modal(notify=notify))
    sent = len(env.bot.received)
    # Someone else cannot close it.
    assert await env.post("/ui/view/close", {"as": AVERY, "view_id": view["id"]}) == (
        200,
        {"ok": True},
    )
    assert await env.pg.store.get_view(view["id"]) is not None
    assert await env.post("/ui/view/close", {"as": RILEY, "view_id": view["id"]}) == (
        200,
        {"ok": True},
    )
    assert await env.pg.store.get_view(view["id"]) is None
    if notify:
        [got] = env.bot.received[sent:]
        payload = got.payload()
        assert payload["type"] == "view_closed" and payload["user"]["id"] == RILEY
        assert payload["view"]["id"] == view["id"] and payload["is_cleared"] is False
    else:
        assert env.bot.received[sent:] == []


# =========================================================================== bad input
@pytest.mark.parametrize(
    ("method", "path", "body", "error"),
    [
        ("POST", "/ui/send", {"as": "U0NOBODY", "text": "hi"}, "unknown user"),
        ("POST", "/ui/send", {"text": "hi"}, "unknown user"),
        ("POST", "/ui/send", "not json", "the body must be JSON"),
        ("POST", "/ui/send", ["a", "list"], "the body must be a JSON object"),
        ("POST", "/ui/send", {"as": RILEY, "text": "   "}, "nothing to send"),
        ("POST", "/ui/send", {"as": RILEY, "text": "hi", "thread_ts": "abc"}, "thread_ts"),
        ("POST", "/ui/send", {"as": RILEY, "text": "hi", "thread_ts": 17.5}, "thread_ts"),
        ("POST", "/ui/action", "{", "the body must be JSON"),
        ("POST", "/ui/action", {"as": RILEY}, "container and action are required"),
        ("POST", "/ui/action", {"as": "nobody", "container": {}, "action": {}}, "unknown user"),
        ("POST", "/ui/view/submit", {"as": RILEY, "view_id": "V1", "values": "x"}, "values"),
        ("POST", "/ui/view/submit", {"as": RILEY, "view_id": "VNOPE"}, "no such open view"),
        ("POST", "/ui/view/close", "[", "the body must be JSON"),
        ("GET", "/ui/history?as=U0NOBODY", None, "unknown user"),
        ("GET", "/ui/history?as=U0PGRILEY&before=abc", None, "before must be a message ts"),
        ("GET", "/ui/thread", None, "unknown user"),
        ("GET", "/ui/stream?as=", None, "unknown user"),
    ],
)
async def test_bad_ui_requests(env: Env, method: str, path: str, body: Any, error: str) -> None:
    if method == "GET":
        async with env.http.get(env.url + path, headers=env.token) as r:
            status, data = r.status, await r.json()
    else:
        status, data = await env.post(path, body)
    assert status == 400
    assert data["ok"] is False and error in data["error"]
    assert env.bot.received == []
    assert await env.history(RILEY) == []
    assert await env.pg.store.redis.keys(f"{env.pg.store.p}:msgs") == []


async def test_page_and_state(env: Env) -> None:
    async with env.http.get(env.url + "/") as r:
        assert r.status == 200 and "text/html" in r.headers["Content-Type"]
    status, state = await env.get("/ui/state")
    assert status == 200
    assert state["channel"] == {"id": CH, "name": people.CHANNEL_NAME}
    assert [u["id"] for u in state["users"]] == [RILEY, AVERY, SAM, MORGAN]
    assert state["default_user"] == RILEY and state["command"] == "/agent"
    assert state["usergroups"][0]["users"] == [SAM]
    status, data = await env.get("/ui/thread", **{"as": RILEY, "ts": "1700000000.000001"})
    assert (status, data) == (404, {"error": "thread_not_found"})


# =========================================================================== bot_events()
def test_bot_events_from_a_manifest_snippet() -> None:
    manifest = """
display_information:
  name: Agent
settings:
  event_subscriptions:
    request_url: https://example.com/slack/events
    bot_events:
      - app_mention        # when someone @mentions the bot
      - "message.channels"
    user_events:
      - reaction_added
  interactivity:
    is_enabled: true
"""
    assert bot_events(manifest) == frozenset({"app_mention", "message.channels"})
    same_indent = "settings:\n  event_subscriptions:\n    bot_events:\n    - app_mention\n"
    assert bot_events(same_indent) == frozenset({"app_mention"})
    assert bot_events("settings:\n  interactivity:\n    is_enabled: true\n") == frozenset()


def test_the_real_manifest_subscribes_to_thread_replies() -> None:
    # The playground sends the bot what Slack would: the events its manifest subscribes to.
    assert bot_events(slack_manifest()) == {
        "app_home_opened",
        "app_mention",
        "assistant_thread_context_changed",
        "assistant_thread_started",
        "member_joined_channel",
        "message.channels",
        "message.groups",
        "message.im",
    }
