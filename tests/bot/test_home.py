"""App Home: each approver's Home lists what they may decide, and a click there follows every
rule a card click follows (bot/home.py, bot/actions.py).

The bot, worker, Redis and the fake Slack are real; Home is opened and clicked with the
payloads Slack sends (``app_home_opened``; ``block_actions`` from a ``home`` view, which carry
no channel and no response_url), and what each person sees is read back from the fake
Slack's views.publish.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agent_core import Gate, GateStatus, RunStatus
from agent_core.testing import FakeOpenAI, call, calls, reply
from bot import cards
from bot.home_view import HOME_THREAD_ACTION, MAX_VIEW_BLOCKS, PendingItem, home_view
from tests.bot.conftest import (
    APPROVER,
    APPROVER2,
    GROUP_MEMBER,
    REQUESTER,
    STRANGER,
    BotHarness,
    journal_lines,
    wait_until,
)
from tests.bot.test_conversations import send_event, status_is
from tests.bot.test_requesters import answered_then_reply
from tests.slack_fake import FakeSlack


# --------------------------------------------------------------------------- helpers
async def open_home(bot: BotHarness, user: str, tab: str = "home") -> None:
    """``user`` opens the app's Home tab (Slack sends ``app_home_opened``; also for the
    Messages tab, with ``tab`` "messages")."""
    event = {
        "type": "app_home_opened",
        "user": user,
        "channel": "D0" + user[2:],
        "tab": tab,
        "event_ts": f"{time.time():.6f}",
    }
    resp = await send_event(bot, event)
    assert resp.status == 200, resp.text


async def home(bot: BotHarness, user: str) -> dict[str, Any] | None:
    """The Home view Slack shows ``user`` now."""
    return await bot.fake.store.home(user)


def text_of(view: dict[str, Any] | None) -> str:
    return json.dumps(view["blocks"] if view else [], ensure_ascii=False)


def buttons(view: dict[str, Any] | None, gate_id: str) -> dict[str, dict[str, Any]]:
    """The buttons Home shows for a gate: action id → button."""
    for block in (view or {}).get("blocks", []):
        if block.get("type") == "actions" and block.get("block_id") == f"home:{gate_id}":
            return {b["action_id"]: b for b in block["elements"]}
    return {}


async def home_shows(
    bot: BotHarness, user: str, needle: str, timeout: float = 10.0
) -> dict[str, Any]:
    async def shown() -> dict[str, Any] | None:
        view = await home(bot, user)
        return view if needle in text_of(view) else None

    try:
        found: dict[str, Any] = await wait_until(shown, timeout=timeout)
    except AssertionError:
        raise AssertionError(
            f"{user}'s Home never showed {needle!r}; it shows {text_of(await home(bot, user))}"
        ) from None
    return found


async def home_lacks(bot: BotHarness, user: str, needle: str) -> dict[str, Any]:
    async def gone() -> dict[str, Any] | None:
        view = await home(bot, user)
        return view if view is not None and needle not in text_of(view) else None

    found: dict[str, Any] = await wait_until(gone)
    return found


async def home_click(
    bot: BotHarness, action: str, value: str, user: str, trigger_id: str | None = None
) -> None:
    """``user`` clicks a button on their Home, with the payload Slack sends for a view."""
    payload = bot.client.action_payload(action, value, user_id=user, trigger_id=trigger_id)
    for key in ("channel", "message", "response_url"):
        payload.pop(key)
    view = await home(bot, user) or {"id": "V0HOME", "type": "home", "blocks": []}
    payload["container"] = {"type": "view", "view_id": view.get("id", "V0HOME")}
    payload["view"] = {**view, "type": "home"}
    resp = await bot.client.payload(payload)
    assert resp.status == 200, resp.text


async def gated(bot: BotHarness, fake_openai: FakeOpenAI, task: str, user_id: str) -> Gate:
    fake_openai.script(task, [call("delete_user", {"user_id": "7"}), reply("user 7 deleted")])
    run_id = await bot.start_task(task, user_id=user_id)
    return await bot.gate_of(run_id)


async def status_of(bot: BotHarness, gate: Gate) -> GateStatus:
    g = await bot.gateway.get_gate(gate.gate_id)
    assert g is not None
    return g.status


# --------------------------------------------------------------------------- listing
async def test_home_lists_exactly_what_each_person_may_decide(
    live: BotHarness, fake_openai: FakeOpenAI
) -> None:
    await open_home(live, APPROVER2, tab="messages")  # the Messages tab has no view
    for user in (APPROVER, GROUP_MEMBER, STRANGER, REQUESTER):
        await open_home(live, user)
        await home_shows(live, user, "Nothing waits for you")

    gate = await gated(live, fake_openai, "delete user 7", REQUESTER)

    # Refreshed when the gate opened, without anyone opening Home again.
    view = await home_shows(live, APPROVER, "delete_user")
    shown = buttons(view, gate.gate_id)
    assert shown[cards.APPROVE_ACTION]["value"] == cards.button_value(gate)
    assert shown[cards.DENY_ACTION]["value"] == cards.button_value(gate)
    assert gate.run_id in text_of(view) and f"<@{REQUESTER}>" in text_of(view)
    assert "Waiting for your decision (1)" in text_of(view)
    card = await live.card(gate.gate_id)
    link = shown[HOME_THREAD_ACTION]["url"]
    assert link.endswith(
        f"/p{card.ts.replace('.', '')}?thread_ts={card.thread_ts}&cid={card.channel}"
    )

    member = await home_shows(live, GROUP_MEMBER, "delete_user")
    assert set(buttons(member, gate.gate_id)) >= {cards.APPROVE_ACTION, cards.DENY_ACTION}

    # The requester may deny their own run's call, not approve it; a stranger sees nothing.
    mine = await home_shows(live, REQUESTER, "delete_user")
    assert set(buttons(mine, gate.gate_id)) == {cards.DENY_ACTION, HOME_THREAD_ACTION}
    assert "you may deny it, not approve it" in text_of(mine)
    stranger = await home(live, STRANGER)
    assert "delete_user" not in text_of(stranger) and "Nothing waits for you" in text_of(stranger)

    # Opening Home publishes it for that person, with the pending gate.
    assert await home(live, APPROVER2) is None
    await open_home(live, APPROVER2)
    assert buttons(await home_shows(live, APPROVER2, "delete_user"), gate.gate_id)


async def test_a_burst_of_gates_costs_at_most_one_publish_per_person_per_second(
    live: BotHarness, fake_openai: FakeOpenAI
) -> None:
    await open_home(live, APPROVER)
    await home_shows(live, APPROVER, "Nothing waits for you")
    task = "delete six users"
    fake_openai.script(
        task,
        [calls([("delete_user", {"user_id": str(i)}) for i in range(6)]), reply("done")],
    )
    run_id = await live.start_task(task)
    await home_shows(live, APPROVER, "Waiting for your decision (6)")
    gates = await live.gateway.pending_gates(run_id)
    assert len(gates) == 6

    published = [
        c.at for c in live.fake.calls_to("views.publish") if c.args.get("user_id") == APPROVER
    ]
    # Six gate.opened events (and the opening of Home), far fewer publishes, a second apart:
    # each takes a 1 s lease first; the answers' times differ from the leases' by how long
    # rendering and Slack took (at most the first's and the last's count, hence the margin).
    assert len(published) <= 4, published
    span = published[-1] - published[0]
    assert span >= (len(published) - 1) * 1.0 - 0.5, published


# --------------------------------------------------------------------------- clicking
async def test_approve_on_home_decides_once_and_moves_to_the_last_decisions(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    for user in (APPROVER, APPROVER2):
        await open_home(live, user)
    gate = await gated(live, fake_openai, "delete user 7", REQUESTER)
    await home_shows(live, APPROVER, "delete_user")
    await home_shows(live, APPROVER2, "delete_user")

    await home_click(live, cards.APPROVE_ACTION, cards.button_value(gate), APPROVER)
    await status_is(live, gate.run_id, RunStatus.COMPLETED)
    assert journal_lines(journal).count("delete_user:7") == 1
    await live.wait_card(gate.gate_id, "Approved")

    view = await home_shows(live, APPROVER, "✅ Approved")
    assert not buttons(view, gate.gate_id)
    assert "Waiting for your decision (0)" in text_of(view)
    # The other approver's Home drops it too (it was decided elsewhere).
    other = await home_lacks(live, APPROVER2, f"home:{gate.gate_id}")
    assert "You have not decided anything yet" in text_of(other)

    # A replayed click (Slack retries, a double click, a forged copy) decides nothing more.
    await home_click(live, cards.APPROVE_ACTION, cards.button_value(gate), APPROVER2)
    seen = await home_shows(live, APPROVER2, "Already approved by")
    assert f"<@{APPROVER}>" in text_of(seen)
    decided = await live.gateway.get_gate(gate.gate_id)
    assert decided is not None and decided.decided_by == APPROVER
    assert journal_lines(journal).count("delete_user:7") == 1
    assert not live.fake.calls_to("chat.postEphemeral")  # told on Home, not in a channel


async def test_home_clicks_follow_every_rule_a_card_click_follows(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    gate = await gated(live, fake_openai, "delete user 7", REQUESTER)
    value = cards.button_value(gate)

    # A non-approver's click (a button they were never shown: a forged payload).
    await home_click(live, cards.APPROVE_ACTION, value, STRANGER)
    await home_shows(live, STRANGER, "not on the approver list")
    # The requester's own approval.
    await home_click(live, cards.APPROVE_ACTION, value, REQUESTER)
    await home_shows(live, REQUESTER, "You asked for this run")
    # A stale arguments hash.
    await home_click(live, cards.APPROVE_ACTION, f"{gate.gate_id}:sha256:0000stale", APPROVER)
    await home_shows(live, APPROVER, "do not match")
    # A gate that does not exist.
    await home_click(live, cards.APPROVE_ACTION, "00" + "x" * 22 + ":h", APPROVER2)
    await home_shows(live, APPROVER2, "does not exist")
    assert await status_of(live, gate) is GateStatus.PENDING
    assert journal_lines(journal) == []

    # Deny from Home opens the same reason form; its submission decides once.
    await home_click(live, cards.DENY_ACTION, value, APPROVER, trigger_id="trig-home")
    (opened,) = await live.fake.wait_for(lambda f: f.calls_to("views.open"), what="deny form")
    form = opened.args["view"]
    assert form["callback_id"] == cards.DENY_CALLBACK
    values = {cards.REASON_BLOCK: {cards.REASON_ACTION: {"value": "not today"}}}
    for _ in range(2):  # the second is a replay
        resp = await live.client.view_submission(
            form["callback_id"], form["private_metadata"], values=values, user_id=APPROVER
        )
        assert resp.status == 200
    await status_is(live, gate.run_id, RunStatus.COMPLETED)
    decided = await live.gateway.get_gate(gate.gate_id)
    assert decided is not None and decided.status is GateStatus.DENIED
    assert decided.decided_by == APPROVER and decided.reason == "not today"
    view = await home_shows(live, APPROVER, "Already denied by")
    assert "🚫 Denied" in text_of(view) and "not today" in text_of(view)
    assert "do not match" not in text_of(view)  # an earlier click's notice is gone
    assert journal_lines(journal) == []
    assert not live.fake.calls_to("chat.postEphemeral")


async def test_a_thread_reply_requester_cannot_approve_on_home(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    # The approver asked for the deletion in the thread: a requester, like the starter.
    fake_openai.script(
        "tidy up",
        [reply("Anything else?"), call("delete_user", {"user_id": "9"}), reply("gone")],
    )
    for user in (APPROVER, APPROVER2):
        await open_home(live, user)
    run_id, _ts = await answered_then_reply(
        live, "tidy up", REQUESTER, "Anything else?", "delete user 9", APPROVER
    )
    gate = await live.gate_of(run_id)
    assert APPROVER in gate.requesters

    mine = await home_shows(live, APPROVER, "delete_user")
    assert cards.APPROVE_ACTION not in buttons(mine, gate.gate_id)
    await home_click(live, cards.APPROVE_ACTION, cards.button_value(gate), APPROVER)
    await home_shows(live, APPROVER, "one of its requesters: someone else has to approve it")
    assert await status_of(live, gate) is GateStatus.PENDING

    other = await home_shows(live, APPROVER2, "delete_user")
    assert cards.APPROVE_ACTION in buttons(other, gate.gate_id)
    await home_click(live, cards.APPROVE_ACTION, cards.button_value(gate), APPROVER2)
    await status_is(live, run_id, RunStatus.COMPLETED)
    assert journal_lines(journal).count("delete_user:9") == 1


# --------------------------------------------------------------------------- the view itself
def _gate(i: int, status: GateStatus = GateStatus.PENDING) -> Gate:
    now = time.time()
    return Gate(
        gate_id=f"00{i:022d}",
        run_id="r-00abcdefghij",
        call_id=f"c{i}",
        turn=1,
        tool="delete_user",
        args={"user_id": str(i), "note": "x" * 500},
        args_hash=f"sha256:{i:064d}",
        status=status,
        requested_by=REQUESTER,
        requesters=[REQUESTER, *[f"U0T{j}" for j in range(10)]],
        origin={"channel": "C0CHAN", "thread_ts": "1.0"},
        created_at=now,
        deadline=now + 60,
        timeout=60,
        decided_by=APPROVER if status is not GateStatus.PENDING else None,
        decided_at=now if status is not GateStatus.PENDING else None,
        reason="r" * 400 if status is GateStatus.DENIED else None,
    )


async def test_a_full_home_stays_within_slacks_limits(fake_slack: FakeSlack) -> None:
    from bot.app import make_web_client
    from tests.bot.conftest import bot_settings

    pending = [
        PendingItem(_gate(i), approve=True, thread="https://x/archives/C/p1") for i in range(60)
    ]
    decided = [_gate(100 + i, GateStatus.DENIED) for i in range(20)]
    view = home_view(pending, decided, notice="n" * 2000)
    assert len(view["blocks"]) <= MAX_VIEW_BLOCKS
    assert "…and 40 more" in text_of(view)
    client = make_web_client(bot_settings(fake_slack, SLACK_MAX_RETRIES=0))
    resp = await client.views_publish(user_id=APPROVER, view=view)
    assert resp["ok"] and resp["view"]["type"] == "home"


async def test_the_fake_refuses_what_slack_refuses_in_views_publish(fake_slack: FakeSlack) -> None:
    from slack_sdk.errors import SlackApiError

    from bot.app import make_web_client
    from tests.bot.conftest import bot_settings

    client = make_web_client(bot_settings(fake_slack, SLACK_MAX_RETRIES=0))
    section = {"type": "section", "text": {"type": "mrkdwn", "text": "hi"}}

    async def error(**kwargs: Any) -> str:
        try:
            await client.views_publish(**kwargs)
        except SlackApiError as exc:
            return str(exc.response["error"])
        return "ok"

    assert await error(user_id=APPROVER, view={"type": "modal", "blocks": [section]}) == (
        "invalid_arguments"
    )
    too_many = {"type": "home", "blocks": [section] * (MAX_VIEW_BLOCKS + 1)}
    assert await error(user_id=APPROVER, view=too_many) == "invalid_blocks"
    big = {
        "type": "home",
        "blocks": [{**section, "text": {"type": "mrkdwn", "text": "x" * 2900}}] * 90,
    }
    assert await error(user_id=APPROVER, view=big) == "view_too_large"
    first = await client.views_publish(user_id=APPROVER, view={"type": "home", "blocks": [section]})
    old_hash = first["view"]["hash"]
    assert await error(user_id=APPROVER, view={"type": "home", "blocks": []}, hash=old_hash) == "ok"
    assert await error(user_id=APPROVER, view={"type": "home", "blocks": []}, hash=old_hash) == (
        "hash_conflict"
    )
    fake_slack.api.home_tab_enabled = False
    try:
        assert await error(user_id=APPROVER, view={"type": "home", "blocks": []}) == "not_enabled"
    finally:
        fake_slack.api.home_tab_enabled = True


async def test_a_view_rendered_from_older_gates_never_overwrites_a_newer_one(
    live: BotHarness, fake_openai: FakeOpenAI, make_bot: Callable[..., Awaitable[BotHarness]]
) -> None:
    """Two web replicas publish the same person's Home. One reads the gates, the gate is
    decided and the other publishes the newer view; the first one's publish, from the older
    gates, must not put the decided gate back as pending."""
    other = await make_bot()
    await open_home(live, APPROVER)
    gate = await gated(live, fake_openai, "delete user 7", REQUESTER)
    await home_shows(live, APPROVER, "delete_user")
    slow, fast = live.server.context.home, other.server.context.home
    assert slow is not None and fast is not None
    hashes = await slow._hashes([APPROVER])  # what a slow replica read...
    stale = await slow.pending_gates()
    assert [g.gate_id for g in stale] == [gate.gate_id]

    await home_click(live, cards.APPROVE_ACTION, cards.button_value(gate), APPROVER)
    await status_is(live, gate.run_id, RunStatus.COMPLETED)
    fast.touch([APPROVER], force=True)  # ...while another publishes the newer view
    await home_lacks(live, APPROVER, f"home:{gate.gate_id}")
    await slow._publish(APPROVER, stale, hashes[APPROVER], force=True)

    # Slack refused the older view (hash_conflict); it was read and rendered again.
    refused = [c for c in live.fake.calls_to("views.publish") if not c.ok]
    assert [c.response.get("error") for c in refused] == ["hash_conflict"]
    await asyncio.sleep(slow.interval + 0.5)
    view = await home_lacks(live, APPROVER, f"home:{gate.gate_id}")
    assert "✅ Approved" in text_of(view) and "Waiting for your decision (0)" in text_of(view)


async def test_a_decider_who_never_opened_home_gets_their_view_when_they_open_it(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """Only the views of people who open Home are kept fresh (rendering one reads every
    shard's pending gates: the Slack bench's web spent 14% of its CPU on views nobody looked
    at). A card click by someone who never opened Home publishes nothing; their first look
    shows the decision."""
    await open_home(live, APPROVER2)
    gate = await gated(live, fake_openai, "delete user 7 from the card", REQUESTER)
    await home_shows(live, APPROVER2, "delete_user")
    await live.client.action(cards.APPROVE_ACTION, cards.button_value(gate), user_id=APPROVER)
    await status_is(live, gate.run_id, RunStatus.COMPLETED)
    await home_lacks(live, APPROVER2, f"home:{gate.gate_id}")  # the viewer's view follows
    await asyncio.sleep(1.2)  # past the 1 s lease: a publish due would have happened
    to_decider = [c for c in live.fake.calls_to("views.publish") if c.args["user_id"] == APPROVER]
    assert to_decider == []

    await open_home(live, APPROVER)
    view = await home_shows(live, APPROVER, "✅ Approved")
    assert "Waiting for your decision (0)" in text_of(view)
