"""Fuzzing every inbound Slack payload the bot parses, through the real Bolt app over HTTP.

Each request is signed with the real secret (an unsigned one never reaches the parsers: see
tests/bot/test_http.py) and sent to the bot's aiohttp server: slash commands (form fields),
``block_actions`` and ``view_submission`` (``payload=<json>``). Pending gates of two paused
runs sit in Redis (:class:`tests.fuzz.pool.GatePool`). After each request and the work the
bot does after its ``ack()``:

- the answer is 200, 400 (malformed) or 404 (unhandled), never 500, and nothing was logged
  at ERROR (a handler that raised);
- a gate left ``pending`` only if the request named it (or named its run, for ``cancel``),
  and only by a user who may make that decision.

"Slack-shaped" strategies keep the JSON types Slack always sends where Bolt's own matchers
read them (``type``, ``actions[].action_id``, ``view.type``, ...) and fuzz everything else,
including all the fields our handlers read. ``test_any_json_*`` puts any JSON anywhere, in
a form's ``payload`` field or as a JSON body. Bolt's own matchers raise on some of those
shapes (the cases at the end, found here): the web refuses them as malformed (400).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from bot import cards
from tests.bot.conftest import (
    APPROVER,
    APPROVER2,
    CHANNEL,
    GROUP_MEMBER,
    REQUESTER,
    STRANGER,
    BotHarness,
)
from tests.fuzz.pool import GatePool, settle
from tests.security.seen import gate_buttons
from tests.slack_fake import FakeSlack

FUZZ = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# --------------------------------------------------------------------------- strategies
text = st.text(max_size=60)
users = st.one_of(
    st.sampled_from([APPROVER, APPROVER2, GROUP_MEMBER, REQUESTER, STRANGER, "", "W0OTHER"]),
    text,
)
channels = st.one_of(st.sampled_from([CHANNEL, "C0OTHER", ""]), text)
json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=30)
)
json_any = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


def response_urls(fake: FakeSlack) -> st.SearchStrategy[str]:
    # Only loopback URLs: the bot posts to whatever response_url a payload carries. (A dead
    # port works too, but slack_sdk retries a refused connection after 0.5 s: too slow here.)
    return st.sampled_from([fake.response_url("fz"), "", "not a url", "ftp://127.0.0.1/x"])


def gate_values(pool: GatePool, fake: FakeSlack | None = None) -> st.SearchStrategy[Any]:
    """A button value / gate id: one of the pool's, what a button on its card sends, a
    lookalike, or anything."""
    ids = pool.gate_ids
    shown = sorted(
        {
            str(e["value"])
            for m in (fake.messages if fake is not None else [])
            for g in ids
            for action in (cards.APPROVE_ACTION, cards.DENY_ACTION)
            for e in gate_buttons(m, g, action)
        }
    )
    real = st.sampled_from(ids + shown)
    return st.one_of(
        real,
        real.map(lambda g: g + "x"),
        real.map(lambda g: g[:-1]),
        real.map(lambda g: g.lower() if g != g.lower() else g.upper()),
        st.builds(lambda: secrets.token_urlsafe(18)),
        text,
        json_any,
    )


# --------------------------------------------------------------------------- fixtures
@pytest.fixture
async def pool(bot: BotHarness, redis: Redis) -> AsyncIterator[GatePool]:
    pool = await GatePool(redis, bot.gateway, slack=bot.server.client).fill()
    await pool.carded()  # so that what the buttons send can be drawn too
    yield pool


@pytest.fixture
def error_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING)
    return caplog


async def check(
    bot: BotHarness,
    pool: GatePool,
    raw: str,
    status: int,
    user: str | None,
    logs: pytest.LogCaptureFixture | None,
    allowed: tuple[int, ...] = (200, 400, 404),
) -> None:
    assert status in allowed, (status, raw[:500])
    await settle(bot)
    problems = await pool.judge(raw, user)
    assert not problems, (problems, raw[:500])
    if logs is not None:
        errors = [r for r in logs.records if r.levelno >= logging.ERROR]
        logs.clear()
        assert not errors, ([r.getMessage() for r in errors], raw[:500])


# --------------------------------------------------------------------------- slash commands
@FUZZ
@given(data=st.data())
async def test_slash_command_forms(
    bot: BotHarness, pool: GatePool, error_logs: pytest.LogCaptureFixture, data: st.DataObject
) -> None:
    run_ids = pool.run_ids
    task = data.draw(
        st.one_of(
            text,
            st.sampled_from(["", "help", "status", "STATUS ", "cancel", "cancel  "]),
            st.sampled_from(run_ids).map(lambda r: f"cancel {r}"),
            st.sampled_from(run_ids).map(lambda r: f"cancel {r} now"),
            text.map(lambda t: f"cancel {t}"),
            st.text(min_size=1990, max_size=2010),
            st.sampled_from(["&lt;@U0APPROVER&gt; &amp;", "<!channel>", "```", "*x*"]),
        ),
        label="text",
    )
    user = data.draw(users, label="user_id")
    fields: dict[str, Any] = {
        "token": "deprecated-verification-token",
        "team_id": data.draw(st.sampled_from(["T0TEST", "T0OTHER", ""]) | text),
        "channel_id": data.draw(channels),
        "user_id": user,
        "command": data.draw(st.sampled_from(["/agent", "/agent", "/other", "", "agent"])),
        "text": task,
        "response_url": data.draw(response_urls(bot.fake)),
        "trigger_id": data.draw(text),
    }
    # Slack always sends every field; a fuzzed request may lack some, or carry extras.
    dropped = data.draw(st.sets(st.sampled_from(sorted(fields))), label="dropped")
    for name in dropped:
        fields.pop(name)
    fields.update(data.draw(st.dictionaries(text.filter(lambda k: k not in fields), text)))
    raw = urlencode(fields)
    resp = await bot.client.post(raw)
    await check(bot, pool, raw, resp.status, user, error_logs)


@pytest.mark.parametrize("field", ["event", "message", "view", "authorizations"])
async def test_a_command_form_with_a_field_bolt_reads_as_an_object_is_malformed(
    bot: BotHarness, pool: GatePool, error_logs: pytest.LogCaptureFixture, field: str
) -> None:
    """Found by the fuzzer above: ``event=<text>`` in a slash command's form made Bolt's
    middleware fail (AttributeError), answered 500 and logged as an error."""
    fields = {
        "token": "deprecated-verification-token",
        "team_id": "T0TEST",
        "channel_id": CHANNEL,
        "user_id": REQUESTER,
        "command": "/agent",
        "text": "delete user 9",
        "response_url": bot.fake.response_url("object-field"),
        "trigger_id": "13345224609.738474920.8088930838d88f008e0",
        field: "R»ª W&",
    }
    raw = urlencode(fields)
    resp = await bot.client.post(raw)
    assert (resp.status, resp.json()) == (400, {"error": "malformed payload"})
    await check(bot, pool, raw, resp.status, REQUESTER, error_logs, allowed=(400,))
    assert not bot.fake.responses("object-field"), "nothing was started or said"


# --------------------------------------------------------------------------- block_actions
@FUZZ
@given(data=st.data())
async def test_block_actions_payloads(
    bot: BotHarness, pool: GatePool, error_logs: pytest.LogCaptureFixture, data: st.DataObject
) -> None:
    user = data.draw(users, label="user")
    payload = bot.client.action_payload(
        data.draw(
            st.sampled_from(
                [cards.APPROVE_ACTION, cards.DENY_ACTION, cards.ARGS_ACTION, "other", ""]
            )
            | text,
            label="action_id",
        ),
        "placeholder",
        user_id=user,
        channel_id=data.draw(channels),
        message_ts=data.draw(text),
        trigger_id=data.draw(st.sampled_from(["trig", "expired-trigger"]) | text),
        response_url=data.draw(response_urls(bot.fake)),
        block_id=data.draw(text),
    )
    action = payload["actions"][0]
    action["value"] = data.draw(gate_values(pool, bot.fake), label="value")
    if data.draw(st.booleans(), label="mangle"):
        # What our handlers read, in every shape: user, container, channel, more actions.
        payload["user"] = data.draw(
            st.sampled_from([{}, {"id": ""}, {"id": None}, {"name": APPROVER}])
            | st.fixed_dictionaries({"id": users}),
            label="user object",
        )
        payload["container"] = data.draw(
            st.none() | st.just({}) | st.fixed_dictionaries({"channel_id": json_any}),
            label="container",
        )
        payload["channel"] = data.draw(
            st.fixed_dictionaries({"id": text}) | st.just({}), label="channel"
        )
        extra = data.draw(
            st.lists(
                st.fixed_dictionaries(
                    {"action_id": text, "value": gate_values(pool, bot.fake), "block_id": text}
                ),
                max_size=3,
            ),
            label="more actions",
        )
        payload["actions"] = [action, *extra]
        for key in data.draw(st.sets(st.sampled_from(["message", "team", "trigger_id"]))):
            payload.pop(key, None)
    raw = urlencode({"payload": json.dumps(payload)})
    resp = await bot.client.post(raw)
    who = payload["user"].get("id") if isinstance(payload.get("user"), dict) else None
    await check(bot, pool, raw, resp.status, who if isinstance(who, str) else None, error_logs)


# --------------------------------------------------------------------------- view_submission
@FUZZ
@given(data=st.data())
async def test_view_submission_payloads(
    bot: BotHarness, pool: GatePool, error_logs: pytest.LogCaptureFixture, data: st.DataObject
) -> None:
    user = data.draw(users, label="user")
    meta = data.draw(
        st.one_of(
            st.fixed_dictionaries({"gate_id": gate_values(pool), "channel": channels}).map(
                json.dumps
            ),
            st.fixed_dictionaries({"gate_id": gate_values(pool)}).map(json.dumps),
            json_any.map(json.dumps),
            text,
            st.just(""),
        ),
        label="private_metadata",
    )
    reason = st.fixed_dictionaries({"type": st.just("plain_text_input"), "value": json_any})
    values = data.draw(
        st.one_of(
            st.fixed_dictionaries(
                {cards.REASON_BLOCK: st.fixed_dictionaries({cards.REASON_ACTION: reason})}
            ),
            st.dictionaries(text, st.dictionaries(text, st.dictionaries(text, json_any))),
            st.just({}),
        ),
        label="state.values",
    )
    payload = bot.client.view_payload(
        data.draw(st.sampled_from([cards.DENY_CALLBACK, "other"]) | text, label="callback_id"),
        meta,
        values,
        user_id=user,
    )
    if data.draw(st.booleans(), label="mangle"):
        view = payload["view"]
        for key in data.draw(st.sets(st.sampled_from(["state", "private_metadata", "hash"]))):
            view.pop(key, None)
        if data.draw(st.booleans()):
            view["state"] = data.draw(json_any)
        payload["user"] = data.draw(
            st.sampled_from([{}, {"id": ""}, {"id": None}]) | st.fixed_dictionaries({"id": users})
        )
    raw = urlencode({"payload": json.dumps(payload)})
    resp = await bot.client.post(raw)
    who = payload["user"].get("id")
    await check(bot, pool, raw, resp.status, who if isinstance(who, str) else None, error_logs)


# --------------------------------------------------------------------------- any JSON anywhere
TYPES = [
    "block_actions",
    "view_submission",
    "view_closed",
    "shortcut",
    "block_suggestion",
    # Legacy types this app never produces; answered quietly (bot/quiet.py).
    "interactive_message",
    "dialog_submission",
    "dialog_cancellation",
    "dialog_suggestion",
    "workflow_step_edit",
]
KEYS = ["user", "team", "channel", "container", "actions", "view", "message", "enterprise"]


@FUZZ
@given(data=st.data())
async def test_any_json_moves_no_gate_and_never_stops_the_server(
    bot: BotHarness, pool: GatePool, data: st.DataObject
) -> None:
    values = st.one_of(json_any, gate_values(pool, bot.fake))
    payload: dict[str, Any] = {"type": data.draw(st.sampled_from(TYPES) | json_any)}
    payload.update(data.draw(st.dictionaries(st.sampled_from(KEYS) | text, values, max_size=6)))
    if data.draw(st.booleans()):
        payload["actions"] = data.draw(
            st.lists(st.dictionaries(st.sampled_from(["action_id", "value"]), values), max_size=3)
        )
    if data.draw(st.booleans()):
        payload["view"] = data.draw(
            st.dictionaries(
                st.sampled_from(["type", "callback_id", "private_metadata", "state"]), values
            )
        )
    payload.pop("response_url", None)
    payload.pop("response_urls", None)
    as_form = data.draw(st.booleans())
    raw = urlencode({"payload": json.dumps(payload)}) if as_form else json.dumps(payload)
    # A JSON body is read as JSON with either content type (Bolt looks for a leading "{").
    json_type = not as_form and data.draw(st.booleans(), label="application/json")
    resp = await bot.client.post(
        raw, content_type="application/json" if json_type else "application/x-www-form-urlencoded"
    )
    user = payload.get("user")
    who = user.get("id") if isinstance(user, dict) else user
    await check(bot, pool, raw, resp.status, who if isinstance(who, str) else None, None)
    assert (await bot.client.command("help")).status == 200, "still serving"


# --------------------------------------------------------------------------- unsigned ssl_check
SSL_FIELDS = st.sampled_from(["ssl_check", "token", "payload", "command", "text", "user_id"])


@FUZZ
@given(data=st.data())
async def test_unsigned_bodies_are_refused_unless_exactly_the_ssl_check(
    bot: BotHarness, pool: GatePool, data: st.DataObject
) -> None:
    """Slack's unsigned ``ssl_check=1&token=…`` gets an empty 200; any other unsigned form,
    however close, gets 401 and moves nothing."""
    fields = data.draw(
        st.lists(st.tuples(SSL_FIELDS | text, st.sampled_from(["1", "0", ""]) | text), max_size=4)
    )
    if data.draw(st.booleans(), label="starts with ssl_check=1"):
        fields.insert(0, ("ssl_check", "1"))
    raw = urlencode(fields)
    names = [k for k, _ in fields]
    exact = (
        ("ssl_check", "1") in fields
        and names.count("ssl_check") == 1
        and names.count("token") <= 1
        and set(names) <= {"ssl_check", "token"}
    )
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            bot.client.url,
            data=raw.encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        ) as resp,
    ):
        status, body = resp.status, await resp.text()
    assert (status, body) == (200, "") if exact else status == 401, (raw, status, body)
    await check(bot, pool, raw, status, None, None, allowed=(200, 401))
    assert await pool.changes() == {}


# --------------------------------------------------------------------------- found by fuzzing
# Bolt's matchers index signed payloads without checking their JSON types (KeyError,
# TypeError, AttributeError inside App.async_dispatch): the web answered 500 and logged a
# traceback until bc43c31, which checks their shape first.


BOLT_500_CASES = {
    "view without type": {"type": "view_submission", "view": {"callback_id": cards.DENY_CALLBACK}},
    "view not an object": {"type": "view_submission", "view": 5},
    "action_id not a string": {"type": "block_actions", "actions": [{"action_id": 5}]},
    "actions not a list": {"type": "block_actions", "actions": "x"},
    "view_closed, view not an object": {"type": "view_closed", "view": 5},
    "block_suggestion, action_id not a string": {"type": "block_suggestion", "action_id": 5},
}


async def test_signed_payloads_of_unexpected_types_are_malformed_not_500(bot: BotHarness) -> None:
    answers = {name: (await bot.client.payload(p)).status for name, p in BOLT_500_CASES.items()}
    assert all(status in (400, 404) for status in answers.values()), answers


# Found by test_any_json_* once the cases above were fixed (bc43c31): Bolt's matchers read
# actions[0] (IndexError), and a JSON body (not payload=...) was never checked.
ALSO_500 = {
    "form, empty actions": urlencode(
        {"payload": json.dumps({"type": "block_actions", "actions": []})}
    ),
    "JSON body, empty actions": json.dumps({"type": "block_actions", "actions": []}),
    "JSON body, action_id not a string": json.dumps(
        {"type": "block_actions", "actions": [{"action_id": 5}]}
    ),
}


async def test_these_signed_bodies_are_malformed_not_500(
    bot: BotHarness, pool: GatePool, error_logs: pytest.LogCaptureFixture
) -> None:
    for name, raw in ALSO_500.items():
        for content_type in ("application/x-www-form-urlencoded", "application/json"):
            if content_type == "application/json" and not raw.startswith("{"):
                continue
            resp = await bot.client.post(raw, content_type=content_type)
            assert (resp.status, resp.json()) == (400, {"error": "malformed payload"}), name
            await check(bot, pool, raw, resp.status, None, error_logs)
    assert not await pool.changes(), "nothing was decided"


# A deny reason holding a lone surrogate (JSON \ud800) made Gateway.decide raise
# UnicodeEncodeError (redis-py encodes arguments as strict UTF-8) after the ack, silently; and
# because it raised within Bolt's 10 ms ack-polling interval, Bolt's asyncio_runner overwrote
# the ack with None, so Slack got 404 after 3 s. Fixed in bc43c31 (reasons are cleaned).


async def test_lone_surrogates_elsewhere_in_payloads_are_harmless(
    bot: BotHarness, pool: GatePool, error_logs: pytest.LogCaptureFixture
) -> None:
    """JSON may carry lone surrogate escapes (\\ud800), which no UTF-8 encoder accepts."""
    bad = "\ud800x"
    for where in ("user", "metadata-channel", "metadata-gate", "value", "callback"):
        gate = pool.gates[0]
        gate_id = gate.gate_id + bad if where == "metadata-gate" else gate.gate_id
        meta = {"gate_id": gate_id, "channel": bad if where == "metadata-channel" else CHANNEL}
        values = {cards.REASON_BLOCK: {cards.REASON_ACTION: {"value": "no"}}}
        if where == "value":
            payload = bot.client.action_payload(
                cards.APPROVE_ACTION, gate.gate_id + bad, user_id=APPROVER
            )
        else:
            payload = bot.client.view_payload(
                bad if where == "callback" else cards.DENY_CALLBACK,
                json.dumps(meta),
                values,
                user_id=bad if where == "user" else APPROVER,
            )
        raw = urlencode({"payload": json.dumps(payload)})  # ensure_ascii: sent as \ud800
        resp = await bot.client.post(raw)
        await check(bot, pool, raw, resp.status, APPROVER, error_logs)
    # "metadata-channel" named the gate, by an approver: it was denied, as it should be.


async def test_a_lone_surrogate_in_a_deny_reason_still_denies(
    bot: BotHarness, pool: GatePool, error_logs: pytest.LogCaptureFixture
) -> None:
    gate = pool.gates[0]
    meta = json.dumps({"gate_id": gate.gate_id, "channel": CHANNEL})
    values = {cards.REASON_BLOCK: {cards.REASON_ACTION: {"value": "\ud800 no"}}}
    payload = bot.client.view_payload(cards.DENY_CALLBACK, meta, values, user_id=APPROVER)
    resp = await asyncio.wait_for(bot.client.payload(payload), timeout=2.0)
    assert resp.status == 200
    await settle(bot)
    assert (await pool.changes()).get(gate, ("",))[0] == "denied"
    assert not [r for r in error_logs.records if r.levelno >= logging.ERROR]
