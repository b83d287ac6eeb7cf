"""Edit & approve in Slack: the card's button, the modal, its errors, the decided card and
what the model reads. The bot, a worker, Redis, the fake Slack and the fake model run for
real; the modal is submitted as Slack submits it (``view_submission``)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agent_core import GateStatus, RunStatus
from agent_core.testing import FakeOpenAI, call, reply, tool_messages
from bot import cards, edit_view
from tests.agents import editing
from tests.bot.conftest import (
    APPROVER,
    CHANNEL,
    REQUESTER,
    STRANGER,
    BotHarness,
    Workers,
    journal_lines,
    wait_until,
)
from tests.bot.test_home import home_click, home_shows, open_home
from tests.slack_fake import FakeSlack

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def ebot(make_multi: Callable[..., Awaitable[BotHarness]], workers: Workers) -> BotHarness:
    """The bot serving the ``editing`` agent, and a worker running it."""
    workers([editing])
    return await make_multi(agents=[editing])


async def finished(bot: BotHarness, run_id: str) -> Any:
    async def done() -> Any:
        run = await bot.gateway.get_run(run_id)
        return run if run is not None and run.status.finished else None

    return await wait_until(done, timeout=15)


async def open_modal(bot: BotHarness, value: str, user: str, trigger: str) -> dict[str, Any]:
    """``user`` clicks Edit & approve; the modal views.open received."""
    resp = await bot.client.action(edit_view.EDIT_ACTION, value, user_id=user, trigger_id=trigger)
    assert resp.status == 200, resp.text

    def opened(f: FakeSlack) -> list[Any]:
        return [c for c in f.calls_to("views.open") if c.args["trigger_id"] == trigger]

    (call_,) = await bot.fake.wait_for(opened, what="edit modal")
    view: dict[str, Any] = call_.args["view"]
    return view


def inputs(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["block_id"]: b["element"] for b in view["blocks"] if b["type"] == "input"}


def values(**fields: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    return {edit_view.ARG_BLOCK + k: {edit_view.VALUE: v} for k, v in fields.items()}


def number(v: str) -> dict[str, Any]:
    return {"type": "number_input", "value": v}


def choice(v: str) -> dict[str, Any]:
    return {
        "type": "static_select",
        "selected_option": {"text": {"type": "plain_text", "text": v}, "value": json.dumps(v)},
    }


YES = {
    "type": "checkboxes",
    "selected_options": [{"text": {"type": "plain_text", "text": "Yes"}, "value": "true"}],
}
TAGS_NULL = {"type": "plain_text_input", "value": "null"}


async def test_edit_and_approve_runs_the_edit_shows_the_change_and_tells_the_model(
    ebot: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    original = {
        "order_id": "A-7",
        "amount_cents": 4900,
        "reason": "other",
        "notify": True,
        "tags": None,
    }
    edited = {**original, "amount_cents": 2500, "reason": "late"}

    def canon(a: dict[str, Any]) -> str:
        return json.dumps(a, sort_keys=True, separators=(",", ":"))

    expected = (
        f"refunded 2500 on A-7 (late)\n\nApproved by {APPROVER} with edited arguments: "
        f"{canon(edited)}; the original request was {canon(original)}."
    )
    fake_openai.script(
        "refund A-7",
        [
            call("refund_order", {"order_id": "A-7", "amount_cents": 4900}),
            reply(
                "refunded",
                expect=lambda m: tool_messages(m)[-1]["content"] == expected,
            ),
        ],
    )
    run_id = await ebot.start_task("refund A-7")
    gate = await ebot.gate_of(run_id)
    card = await ebot.wait_card(gate.gate_id, "Edit & approve")
    assert edit_view.EDIT_ACTION in str(card.blocks)
    view = await open_modal(ebot, cards.button_value(gate), APPROVER, "trig-e1")
    assert view["callback_id"] == edit_view.EDIT_CALLBACK
    assert 'Not editable: `order_id` = "A-7"' in str(view["blocks"])
    els = inputs(view)
    assert list(els) == ["arg:amount_cents", "arg:reason", "arg:notify", "arg:tags"]
    assert (els["arg:tags"]["type"], els["arg:tags"]["initial_value"]) == (
        "plain_text_input",
        "null",
    )
    assert els["arg:tags"]["multiline"] is True
    assert (els["arg:amount_cents"]["type"], els["arg:amount_cents"]["initial_value"]) == (
        "number_input",
        "4900",
    )
    assert els["arg:amount_cents"]["is_decimal_allowed"] is False
    assert els["arg:reason"]["type"] == "static_select"
    assert [o["value"] for o in els["arg:reason"]["options"]] == ['"damaged"', '"late"', '"other"']
    assert els["arg:reason"]["initial_option"]["value"] == '"other"'
    assert els["arg:notify"]["type"] == "checkboxes" and els["arg:notify"]["initial_options"]

    # An invalid edit keeps the modal open, the error on its field; nothing is decided.
    bad = values(amount_cents=number("25.5"), reason=choice("late"), notify=YES)
    resp = await ebot.client.view_submission(
        edit_view.EDIT_CALLBACK, view["private_metadata"], values=bad, user_id=APPROVER
    )
    assert resp.status == 200
    assert resp.json() == {
        "response_action": "errors",
        "errors": {"arg:amount_cents": "Not a whole number."},
    }
    bad = values(amount_cents=number("-1"), reason=choice("whim"), notify=YES)
    resp = await ebot.client.view_submission(
        edit_view.EDIT_CALLBACK, view["private_metadata"], values=bad, user_id=APPROVER
    )
    assert resp.json() == {
        "response_action": "errors",
        "errors": {"arg:reason": 'must be one of "damaged", "late", "other"'},
    }
    assert (await ebot.gateway.get_gate(gate.gate_id)).status is GateStatus.PENDING  # type: ignore[union-attr]

    good = values(amount_cents=number("2500"), reason=choice("late"), notify=YES)
    resp = await ebot.client.view_submission(
        edit_view.EDIT_CALLBACK, view["private_metadata"], values=good, user_id=APPROVER
    )
    assert resp.status == 200 and resp.text == ""
    done = await finished(ebot, run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "refunded")
    assert journal_lines(journal) == ["refund_order:A-7:2500:late:True"]
    decided = await ebot.gateway.get_gate(gate.gate_id)
    assert decided is not None and decided.edited_by == APPROVER
    card = await ebot.wait_card(gate.gate_id, "Edited")
    shown = str(card.blocks)
    assert "`amount_cents`: 4900 → 2500" in shown and '`reason`: "other" → "late"' in shown
    assert edit_view.EDIT_ACTION not in shown


async def test_who_may_not_approve_may_not_edit_even_with_a_forged_submission(
    ebot: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script(
        "refund A-8", [call("refund_order", {"order_id": "A-8", "amount_cents": 4900}), reply("x")]
    )
    run_id = await ebot.start_task("refund A-8", user_id=APPROVER)  # an approver asks
    gate = await ebot.gate_of(run_id)
    await ebot.wait_card(gate.gate_id, "Edit & approve")
    # A stranger's click opens nothing.
    resp = await ebot.client.action(
        edit_view.EDIT_ACTION,
        cards.button_value(gate),
        user_id=STRANGER,
        trigger_id="trig-s",
        response_url=ebot.fake.response_url("stranger"),
    )
    assert resp.status == 200
    (told,) = await ebot.fake.wait_for(lambda f: f.responses("stranger"))
    assert "not" in told.args["text"].lower()
    assert not [c for c in ebot.fake.calls_to("views.open") if c.args["trigger_id"] == "trig-s"]
    # Forged submissions (no modal was ever opened for them) decide nothing.
    meta = json.dumps({"gate_id": gate.gate_id, "channel": CHANNEL, "args_hash": gate.args_hash})
    good = values(amount_cents=number("1"), reason=choice("late"), notify=YES)
    for who in (STRANGER, REQUESTER, APPROVER):  # APPROVER asked for this run
        resp = await ebot.client.view_submission(
            edit_view.EDIT_CALLBACK, meta, values=good, user_id=who
        )
        assert resp.status == 200 and resp.text == ""

    def told(user: str) -> Any:
        def find(f: FakeSlack) -> list[str]:
            return [
                c.args["text"] for c in f.calls_to("chat.postEphemeral") if c.args["user"] == user
            ]

        return ebot.fake.wait_for(find, what=f"reply to {user}")

    assert (await told(STRANGER)) == [
        "You are not on the approver list for this agent (APPROVERS)."
    ]
    assert (await told(REQUESTER)) == [
        "You are not on the approver list for this agent (APPROVERS)."
    ]
    [own] = await told(APPROVER)
    assert own.startswith("You asked for this run"), own
    g = await ebot.gateway.get_gate(gate.gate_id)
    assert g is not None and g.status is GateStatus.PENDING and g.edited_args is None
    assert journal_lines(journal) == []


async def test_a_tool_that_allows_no_edits_has_no_button_and_refuses_a_forged_edit(
    ebot: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script("delete 5", [call("delete_user", {"user_id": "5"}), reply("x")])
    run_id = await ebot.start_task("delete 5")
    gate = await ebot.gate_of(run_id)
    card = await ebot.wait_card(gate.gate_id, "Approve")
    assert edit_view.EDIT_ACTION not in str(card.blocks)
    meta = json.dumps({"gate_id": gate.gate_id, "channel": CHANNEL, "args_hash": gate.args_hash})
    forged = {"arg:user_id": {"value": {"type": "plain_text_input", "value": "6"}}}
    resp = await ebot.client.view_submission(
        edit_view.EDIT_CALLBACK, meta, values=forged, user_id=APPROVER
    )
    assert resp.status == 200 and resp.text == ""
    g = await ebot.gateway.get_gate(gate.gate_id)
    assert g is not None and g.status is GateStatus.PENDING
    # A quorum's gate: the tool says editable, the card does not offer it.
    fake_openai.script("wire 9", [call("big_wire", {"amount": 9}), reply("x")])
    run2 = await ebot.start_task("wire 9")
    g2 = await ebot.gate_of(run2)
    card2 = await ebot.wait_card(g2.gate_id, "Approve")
    assert edit_view.EDIT_ACTION not in str(card2.blocks)
    assert journal_lines(journal) == []


async def test_edit_and_approve_from_home(
    ebot: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script(
        "refund A-11",
        [call("refund_order", {"order_id": "A-11", "amount_cents": 4900}), reply("ok")],
    )
    run_id = await ebot.start_task("refund A-11")
    gate = await ebot.gate_of(run_id)
    await open_home(ebot, APPROVER)
    view = await home_shows(ebot, APPROVER, "refund_order")
    assert edit_view.EDIT_ACTION in json.dumps(view)
    await home_click(ebot, edit_view.EDIT_ACTION, cards.button_value(gate), APPROVER, "trig-h")

    def opened(f: FakeSlack) -> list[Any]:
        return [c for c in f.calls_to("views.open") if c.args["trigger_id"] == "trig-h"]

    (call_,) = await ebot.fake.wait_for(opened, what="edit modal from Home")
    modal = call_.args["view"]
    good = values(amount_cents=number("100"), reason=choice("damaged"), notify=YES)
    resp = await ebot.client.view_submission(
        edit_view.EDIT_CALLBACK, modal["private_metadata"], values=good, user_id=APPROVER
    )
    assert resp.status == 200 and resp.text == ""
    done = await finished(ebot, run_id)
    assert done.status is RunStatus.COMPLETED
    assert journal_lines(journal) == ["refund_order:A-11:100:damaged:True"]
    await home_shows(ebot, APPROVER, "Nothing waits for you right now.")
