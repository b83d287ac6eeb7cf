"""The approver sees what they approve, everywhere: "Approve all" lists each call with its
arguments, an answer's heading tells what became of the calls, a decided card gives no
advice about a button it no longer has, help texts show their placeholders, and counts
agree with their nouns."""

from __future__ import annotations

import html
import re
import time
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_core import Decision, Gate, GateStatus, Run, RunStatus
from agent_core.testing import FakeOpenAI, calls, reply
from bot import answers, cards, conversations, directory, run_cards
from bot.commands import NOT_RETRYABLE, Commands
from tests.bot.conftest import APPROVER, CHANNEL, BotHarness, wait_until

_TOKEN = re.compile(r"<([^<>]*)>")


def as_slack_shows(mrkdwn: str) -> str:
    """What a person reads: ``<…>`` is a link, mention or command (shown by its label, else
    its target, without the brackets), then ``&lt;``/``&gt;``/``&amp;`` are decoded."""

    def token(m: re.Match[str]) -> str:
        inner = m.group(1)
        target, _, label = inner.partition("|")
        return label or target

    return html.unescape(_TOKEN.sub(token, mrkdwn))


def gate(i: int, args: dict[str, Any], status: str = "pending", **more: Any) -> Gate:
    return Gate(
        gate_id=f"00{'g' * 21}{i}",
        run_id="r-00abcdefghij",
        call_id=f"call_{i}",
        turn=1,
        index=i,
        tool="delete_user",
        args=args,
        args_hash="ab" * 32,
        status=GateStatus(status),
        created_at=1.0,
        deadline=2e9,
        timeout=300,
        **more,
    )


def approve_all_confirm(gates: list[Gate]) -> dict[str, Any]:
    card = cards.turn_card(gates)
    (actions,) = [b for b in card.blocks if b["type"] == "actions"]
    (approve,) = [e for e in actions["elements"] if e["action_id"] == cards.TURN_APPROVE_ACTION]
    confirm: dict[str, Any] = approve["confirm"]
    return confirm


# ----------------------------------------------------------------------------- Approve all
def test_approve_all_confirmation_tells_the_calls_apart() -> None:
    confirm = approve_all_confirm([gate(i, {"user_id": str(40 + i)}) for i in range(3)])
    text = confirm["text"]["text"]
    shown = as_slack_shows(text)
    for uid in ("40", "41", "42"):
        assert f'delete_user(user_id="{uid}")' in shown, shown
    assert "more" not in shown and len(text) <= cards.CONFIRM_TEXT_LIMIT
    assert confirm["title"]["text"] == "Approve 3 tool calls?"
    partly = [gate(0, {"user_id": "1"}, "approved", decided_by="U1", decided_at=1.0)]
    partly.append(gate(1, {"user_id": "2"}))
    one = approve_all_confirm(partly)
    assert one["title"]["text"] == "Approve 1 tool call?"
    assert 'user_id="2"' in one["text"]["text"] and 'user_id="1"' not in one["text"]["text"]
    # The turn's message itself lists every call, and what became of the decided ones.
    head = cards.turn_card(partly).blocks[0]["text"]["text"]
    assert '`delete_user(user_id="1")` — approved by <@U1>' in head
    assert '`delete_user(user_id="2")`' in head


def test_long_arguments_are_shortened_but_still_tell_the_calls_apart() -> None:
    body = "x" * 5000
    gates = [
        gate(i, {"to": f"customer{i}@example.org", "subject": f"Invoice {i}", "body": body})
        for i in range(3)
    ]
    text = approve_all_confirm(gates)["text"]["text"]
    assert len(text) <= cards.CONFIRM_TEXT_LIMIT
    lines = [ln for ln in text.split("\n") if ln.startswith("• ")]
    assert len(lines) == 3 and len(set(lines)) == 3, lines
    assert all("…" in ln for ln in lines), "a shortened call says so"


@given(
    st.lists(
        st.dictionaries(
            st.text(min_size=1, max_size=12),
            st.text(max_size=300) | st.integers(),
            max_size=4,
        ),
        min_size=2,
        max_size=40,
    )
)
@settings(max_examples=60, deadline=None)
def test_the_confirmation_is_truthful_and_fits(arg_sets: list[dict[str, Any]]) -> None:
    """Within Slack's 300 characters, every listed line is a pending call with its arguments,
    in call order, and "and N more" counts exactly the ones left out."""
    gates = [gate(i, a) for i, a in enumerate(arg_sets)]
    text = approve_all_confirm(gates)["text"]["text"]
    assert len(text) <= cards.CONFIRM_TEXT_LIMIT
    listed = [ln for ln in text.split("\n") if ln.startswith("• ")]
    more = re.search(r"…and (\d+) more", text)
    assert len(listed) + (int(more.group(1)) if more else 0) == len(gates)
    for ln, g in zip(listed, gates, strict=False):
        call = ln.removeprefix("• ").removeprefix("`")
        assert call.startswith(f"{g.tool}("), "each call with its arguments"
        first = next(iter(g.args), None)
        if first is not None and len(call) > len(g.tool) + 1 + len(cards.escape(first)) + 2:
            assert call[len(g.tool) + 1 :].startswith(cards.escape(first)), (call, first)


# ----------------------------------------------------------------------------- answers
async def test_the_answer_after_a_denial_is_not_headed_as_a_success(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "delete users 5 and 6"
    fake_openai.script(
        task,
        [
            calls([("delete_user", {"user_id": "5"}), ("delete_user", {"user_id": "6"})]),
            reply("I deleted user 5; deleting user 6 was declined."),
        ],
    )
    run_id = await live.start_task(task)
    gates = await wait_until(lambda: _two_pending(live, run_id))
    await live.gateway.decide(gates[0].gate_id, Decision.APPROVE, by=APPROVER)
    await live.gateway.decide(gates[1].gate_id, Decision.DENY, by=APPROVER)
    run = await live.gateway.get_run(run_id)
    assert run is not None
    thread = run.origin["thread_ts"]

    def answer(f: Any) -> list[Any]:
        return [m for m in f.thread(CHANNEL, thread) if "deleting user 6 was declined" in m.text]

    (msg,) = await live.fake.wait_for(answer, timeout=15, what="the answer")
    assert msg.text.startswith("🚫 *Answer* — 1 call denied, not run\n"), msg.text
    assert "✅" not in msg.text


async def _two_pending(bot: BotHarness, run_id: str) -> list[Gate] | None:
    gates = await bot.gateway.pending_gates(run_id)
    return gates if len(gates) == 2 else None


def test_answer_headings_match_the_outcome() -> None:
    assert answers.heading(answers.Outcomes()) == "✅ *Answer*"
    assert answers.heading(answers.Outcomes(expired=2)) == "⌛ *Answer* — 2 calls expired, not run"
    assert answers.heading(answers.Outcomes(cancelled=1)) == (
        "✖️ *Answer* — 1 call cancelled, not run"
    )
    assert answers.heading(answers.Outcomes(failed=1)) == "⚠️ *Answer* — 1 call failed"
    assert answers.heading(answers.Outcomes(denied=1, expired=1, in_doubt=1)) == (
        "⚠️ *Answer* — 1 call denied, not run; 1 call expired, not run; 1 call in doubt"
    )
    ran = gate(0, {}, "approved", decided_by="U1")
    outcomes = answers.Outcomes()
    outcomes.add(ran, cards.ToolResult(ok=False, output="boom"))
    outcomes.add(gate(1, {}, "cancelled", closed_by_failure=True), None)
    outcomes.add(ran, cards.ToolResult(ok=True, output="done"))
    assert (outcomes.failed, outcomes.cancelled, outcomes.denied) == (1, 1, 0)


# ----------------------------------------------------------------------------- closed cards
def test_a_decided_card_gives_no_advice_about_a_button_it_no_longer_has() -> None:
    big = {"user_id": "42", "note": "n" * 12_000}
    pending = cards.gate_card(gate(0, big))
    assert "View all arguments* before deciding" in str(pending.blocks)
    assert cards.ARGS_ACTION in str(pending.blocks)
    for status in ("expired", "denied", "approved", "cancelled"):
        closed = cards.gate_card(gate(0, big, status, decided_by="U1", decided_at=5.0))
        shown = str(closed.blocks)
        assert cards.ARGS_ACTION not in shown, "the button is gone"
        assert "View all arguments" not in shown and "before deciding" not in shown, status
        assert "Arguments truncated" in shown, "it still says the arguments were cut"
        compact = str(cards.gate_card(gate(0, big, status), compact=True).blocks)
        assert "before deciding" not in compact


# ----------------------------------------------------------------------------- help texts
def test_help_texts_show_their_placeholders() -> None:
    usage = as_slack_shows(run_cards.usage("/agent"))
    for line in ("/agent <task>", "/agent cancel <run id>", "/agent retry <run id>"):
        assert line in usage, usage
    assert "/agent <task>" in as_slack_shows(run_cards.status_message([], {}).text)
    for template in (conversations.CANCELLED, conversations.GONE, NOT_RETRYABLE):
        text = template.format(run="r-1", command="/agent")
        assert "/agent <task>" in as_slack_shows(text), text
    no_task = directory.NO_TASK.format(agent="billing", command="/agent")
    assert "/agent billing <task>" in as_slack_shows(no_task)


async def test_help_and_which_run_as_the_person_sees_them(bot: BotHarness) -> None:
    commands = Commands(bot.server.context)
    help_text = commands.immediate_reply("help")
    assert help_text is not None and "/agent cancel <run id>" in as_slack_shows(help_text)
    which = commands.immediate_reply("cancel")
    assert which is not None and "/agent cancel <run id>" in as_slack_shows(which)


# ----------------------------------------------------------------------------- counts
def test_counts_agree_with_their_nouns() -> None:
    now = time.time()
    run = Run(
        run_id="r-abcdefghijkl",
        agent="ops",
        task="t",
        requested_by="U1",
        status=RunStatus.AWAITING_APPROVAL,
        created_at=now,
        updated_at=now,
    )
    one = str(run_cards.status_message([run], {run.run_id: [gate(0, {})]}).blocks)
    assert "1 run shown · 1 pending approval'" in one, one
    six = str(run_cards.status_message([run, run], {run.run_id: [gate(0, {})] * 6}).blocks)
    assert "…and 1 more pending approval\\n" in six or "…and 1 more pending approval'" in six
    assert "2 runs shown · 6 pending approvals" in six
