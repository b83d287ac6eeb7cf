"""Block Kit builders: every card parses with slack_sdk and stays within Slack's limits."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from slack_sdk.models.blocks import ActionsBlock, Block, HeaderBlock, SectionBlock
from slack_sdk.models.views import View

from agent_core import Gate, GateStatus, Run, RunStatus
from bot import answers, cards, run_cards
from tests.slack_fake import MAX_BLOCKS_CHARS
from tests.slack_fake import blocks_problem as _blocks_problem

GATE_ID = "AbCdEfGhIjKlMnOpQrStUvWx"
ARGS_HASH = "ab" * 32


def make_gate(args: dict[str, Any] | None = None, **kw: Any) -> Gate:
    now = time.time()
    values: dict[str, Any] = {
        "gate_id": GATE_ID,
        "run_id": "r-abcdefghijkl",
        "call_id": "call_1",
        "turn": 1,
        "tool": "delete_user",
        "description": "Permanently delete a user.",
        "args": {"user_id": "42"} if args is None else args,
        "args_hash": ARGS_HASH,
        "status": GateStatus.PENDING,
        "agent": "ops",
        "requested_by": "U0REQ",
        "origin": {"channel": "C1", "thread_ts": "1.2"},
        "created_at": now,
        "deadline": now + 300,
        "timeout": 300.0,
    }
    values.update(kw)
    return Gate(**values)


def assert_valid_message(card: cards.Card) -> list[Block]:
    """Parse every block with slack_sdk (invalid blocks raise) and check message limits."""
    assert card.text, "the text fallback is always set"
    assert len(card.blocks) <= 50
    assert len(json.dumps(card.blocks, ensure_ascii=False)) <= MAX_BLOCKS_CHARS
    parsed = []
    for raw in card.blocks:
        block = Block.parse(raw)
        assert block is not None and type(block) is not Block, raw
        block.validate_json()
        assert block.to_dict()["type"] == raw["type"]
        parsed.append(block)
    assert _blocks_problem(card.blocks, 50) is None
    return parsed


def all_text(blocks: list[dict[str, Any]]) -> str:
    return json.dumps(blocks, ensure_ascii=False)


def actions(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for b in blocks if b["type"] == "actions"]


def test_pending_card_has_everything_an_approver_needs() -> None:
    card = cards.gate_card(make_gate())
    parsed = assert_valid_message(card)
    text = all_text(card.blocks)
    assert isinstance(parsed[0], HeaderBlock) and parsed[0].text is not None
    assert "Approval needed" in parsed[0].text.text
    for needle in (
        "ops",
        "<@U0REQ>",
        "delete_user",
        "Permanently delete a user.",
        '\\"user_id\\": \\"42\\"',
        "expires",
        "<!date^",
    ):
        assert needle in text, needle
    (row,) = actions(card.blocks)
    approve, deny = row["elements"]
    # The buttons carry the hash of the arguments on the card: a click decides only those.
    value = f"{GATE_ID}:{ARGS_HASH}"
    assert (approve["text"]["text"], approve["style"], approve["value"]) == (
        "Approve",
        "primary",
        value,
    )
    assert (deny["text"]["text"], deny["style"], deny["value"]) == ("Deny", "danger", value)
    assert cards.parse_button_value(value) == (GATE_ID, ARGS_HASH)
    assert cards.parse_button_value(GATE_ID) == (GATE_ID, None), "an old card's value"
    assert f"Arguments hash `{ARGS_HASH[:12]}`" in text
    assert "delete_user" in card.text and "<@U0REQ>" in card.text


@pytest.mark.parametrize(
    ("status", "extra", "needles"),
    [
        (GateStatus.APPROVED, {"decided_by": "U0APP"}, ["Approved", "<@U0APP>", "<!date^"]),
        (
            GateStatus.DENIED,
            {"decided_by": "U0APP", "reason": "not today"},
            ["Denied", "<@U0APP>", "not today", "not executed"],
        ),
        (
            GateStatus.EXPIRED,
            {"timeout": 300.0},
            ["Expired", "no decision within 5 min, not executed"],
        ),
        (GateStatus.CANCELLED, {"decided_by": "U0REQ"}, ["Cancelled", "<@U0REQ>", "not executed"]),
    ],
)
def test_decided_cards_tell_the_outcome_without_buttons(
    status: GateStatus, extra: dict[str, Any], needles: list[str]
) -> None:
    gate = make_gate(status=status, decided_at=time.time(), **extra)
    card = cards.gate_card(gate)
    assert_valid_message(card)
    assert not actions(card.blocks), "buttons are removed once decided"
    text = all_text(card.blocks)
    for needle in needles:
        assert needle in text, (needle, text)
    assert status.value.capitalize() in card.text or "Cancelled" in card.text


def test_tool_results_on_an_approved_card() -> None:
    gate = make_gate(status=GateStatus.APPROVED, decided_by="U0APP", decided_at=time.time())
    running = all_text(cards.gate_card(gate).blocks)
    assert "Running" in running
    ok = cards.gate_card(gate, cards.ToolResult(ok=True, output="user 42 deleted"))
    assert "Executed" in all_text(ok.blocks) and "user 42 deleted" in all_text(ok.blocks)
    failed = cards.gate_card(gate, cards.ToolResult(ok=False, output="boom"))
    assert "failed" in all_text(failed.blocks)
    doubt = cards.gate_card(gate, cards.ToolResult(ok=False, output="", in_doubt=True))
    assert "In doubt" in all_text(doubt.blocks)
    long = cards.gate_card(gate, cards.ToolResult(ok=True, output="y" * 50_000))
    assert_valid_message(long)
    assert "Output truncated: first 1,000 of 50,000 characters" in all_text(long.blocks)


def test_outcomes_after_a_cancel_are_told() -> None:
    gate = make_gate(status=GateStatus.APPROVED, decided_by="U0APP", decided_at=time.time())

    def shown(result: cards.ToolResult) -> str:
        card = cards.gate_card(gate, result)
        assert_valid_message(card)
        assert not actions(card.blocks)
        return all_text(card.blocks)

    never = shown(
        cards.ToolResult(ok=False, skipped="the run was cancelled before this call started")
    )
    assert "⏹️ *Never ran* — the run was cancelled before this call started; not executed" in never
    running = shown(cards.ToolResult(ok=False, running_at_cancel=True))
    assert "Was running when the run was cancelled" in running
    assert "its outcome will appear here" in running and "failed" not in running
    done = shown(cards.ToolResult(ok=True, output="user 42 deleted", after_cancel=True))
    assert "▶️ *Finished after the run was cancelled*" in done and "user 42 deleted" in done
    assert "*Executed*" not in done
    failed = shown(cards.ToolResult(ok=False, output="boom", after_cancel=True))
    assert "⚠️ *The tool failed after the run was cancelled*" in failed and "boom" in failed
    doubt = shown(cards.ToolResult(ok=False, in_doubt=True, after_cancel=True))
    assert "In doubt" in doubt and "after the run was cancelled" in doubt


def test_a_gate_closed_by_its_runs_failure_says_so() -> None:
    gate = make_gate(
        status=GateStatus.CANCELLED,
        decided_by=None,
        decided_at=time.time(),
        reason="the run failed: model <!here> unavailable",
        closed_by_failure=True,
    )
    card = cards.gate_card(gate)
    assert_valid_message(card)
    text = all_text(card.blocks)
    assert "✖️ *Closed* — the run failed: model &lt;!here&gt; unavailable; not executed" in text
    assert "Cancelled" not in text and "Closed" in card.blocks[0]["text"]["text"]
    assert not actions(card.blocks)
    assert card.text.startswith("Closed:")
    # A gate cancelled by a person still reads as cancelled.
    cancelled = make_gate(status=GateStatus.CANCELLED, decided_by="U0REQ", decided_at=time.time())
    assert "✖️ *Cancelled*" in all_text(cards.gate_card(cancelled).blocks)


def test_20kb_argument_is_truncated_visibly_and_fully_viewable() -> None:
    big = "x" * 20_000
    gate = make_gate({"note": big, "to": "someone@example.com"})
    card = cards.gate_card(gate)
    assert_valid_message(card)
    text = all_text(card.blocks)
    assert "Arguments truncated" in text and "of 20,0" in text
    assert "someone@example.com" in cards.pretty_args(gate.args)
    for b in card.blocks:
        if b["type"] == "section" and "text" in b:
            assert len(b["text"]["text"]) <= 3000
    (row,) = actions(card.blocks)
    assert [e["action_id"] for e in row["elements"]] == ["gate_approve", "gate_deny", "gate_args"]
    assert all(len(e["value"]) <= 2000 for e in row["elements"])

    modal = cards.args_modal(gate)
    View(**modal).validate_json()
    shown = "".join(
        b["text"]["text"].removeprefix("```\n").removesuffix("\n```")
        for b in modal["blocks"][1:]
        if b["type"] == "section"
    )
    assert shown == cards.escape(cards.pretty_args(gate.args)), "the modal holds every character"

    # Still valid once decided, with a result.
    decided = make_gate(
        {"note": big}, status=GateStatus.APPROVED, decided_by="U1", decided_at=time.time()
    )
    assert_valid_message(cards.gate_card(decided, cards.ToolResult(ok=True, output="z" * 5000)))


def test_arguments_cannot_mention_everyone_or_break_the_code_block() -> None:
    gate = make_gate({"body": "<!channel> hi & ``` bye <https://evil|click>"})
    text = all_text(cards.gate_card(gate).blocks)
    assert "<!channel>" not in text and "&lt;!channel&gt;" in text
    assert "<https://evil" not in text
    section = next(
        b for b in cards.gate_card(gate).blocks if "Arguments" in b.get("text", {}).get("text", "")
    )
    assert section["text"]["text"].count("```") == 2


def test_huge_modal_argument_is_still_valid() -> None:
    gate = make_gate({"blob": "q" * 400_000})
    modal = cards.args_modal(gate)
    View(**modal).validate_json()
    assert len(modal["blocks"]) <= 100
    assert "Still truncated" in all_text(modal["blocks"])


def test_deny_modal_is_valid() -> None:
    meta = json.dumps({"gate_id": GATE_ID, "channel": "C1"})
    modal = cards.deny_modal(make_gate(), meta)
    View(**modal).validate_json()
    assert len(modal["title"]["text"]) <= 24
    assert modal["private_metadata"] == meta and modal["callback_id"] == cards.DENY_CALLBACK


def test_root_and_status_messages_are_valid() -> None:
    now = time.time()
    run = Run(
        run_id="r-abcdefghijkl",
        agent="ops",
        task="t" * 5000,
        requested_by="U1",
        status=RunStatus.AWAITING_APPROVAL,
        created_at=now,
        updated_at=now,
    )
    assert_valid_message(run_cards.root_message(run.task, "U1", None))
    root = run_cards.root_message(run.task, "U1", run)
    assert_valid_message(root)
    assert "/agent cancel r-abcdefghijkl" in all_text(root.blocks)
    done = run.model_copy(update={"status": RunStatus.COMPLETED})
    assert "cancel" not in all_text(run_cards.root_message("x", "U1", done).blocks)
    # A finished run names the gated calls that never ran; approved ones are not counted.
    g = make_gate()
    statuses = (GateStatus.APPROVED, GateStatus.DENIED, GateStatus.EXPIRED)
    gates = [g.model_copy(update={"status": s}) for s in statuses]
    text = all_text(run_cards.root_message("x", "U1", done, gates=gates).blocks)
    assert "✅ completed · 2 calls not run: 1 denied, 1 expired" in text
    assert "not run" not in all_text(
        run_cards.root_message("x", "U1", done, gates=gates[:1]).blocks
    )
    two = [gates[1], gates[1]]
    assert "· 2 calls denied" in all_text(run_cards.root_message("x", "U1", done, gates=two).blocks)
    closed = [g.model_copy(update={"status": GateStatus.CANCELLED})]
    cancelled = run.model_copy(update={"status": RunStatus.CANCELLED})
    root = all_text(run_cards.root_message("x", "U1", cancelled, gates=closed).blocks)
    assert "✖️ cancelled · 1 call closed unanswered" in root
    # While the run is not finished, nothing is counted yet.
    assert "denied" not in all_text(run_cards.root_message("x", "U1", run, gates=two).blocks)
    runs = [run.model_copy(update={"run_id": f"r-{i:012d}"}) for i in range(20)]
    status = run_cards.status_message(runs, {runs[0].run_id: [make_gate()] * 7})
    assert_valid_message(status)
    assert "and 2 more pending" in all_text(status.blocks)
    assert "no runs" in run_cards.status_message([], {}).text


def test_a_run_paused_only_on_its_sub_agents_says_so() -> None:
    now = time.time()
    run = Run(
        run_id="r-abcdefghijkl",
        agent="desk",
        task="refund order 7",
        requested_by="U1",
        status=RunStatus.AWAITING_APPROVAL,
        created_at=now,
        updated_at=now,
        children_pending=1,
    )
    root = all_text(run_cards.root_message(run.task, "U1", run).blocks)
    assert "🧩 waiting for its sub-agent" in root and "awaiting approval" not in root
    two = run.model_copy(update={"children_pending": 2})
    assert "waiting for 2 sub-agents" in all_text(run_cards.status_message([two], {}).blocks)
    # A gate of its own open as well: it is awaiting approval.
    mixed = run.model_copy(update={"pending": 1})
    assert "awaiting approval" in all_text(run_cards.root_message(run.task, "U1", mixed).blocks)
    # Nothing left to wait for (its gates decided, its resume on the way): running again.
    resuming = run.model_copy(update={"children_pending": 0})
    root = all_text(run_cards.root_message(run.task, "U1", resuming).blocks)
    assert "⚙️ running" in root and "awaiting" not in root and "waiting" not in root


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (300, "5 min"),
        (45, "45 s"),
        (90, "90 s"),
        (7200, "2 h"),
        (3600, "1 h"),
        (5400, "90 min"),
        (1, "1 s"),
    ],
)
def test_durations(seconds: float, text: str) -> None:
    assert cards.fmt_duration(seconds) == text


@given(st.text(max_size=3000), st.integers(min_value=5, max_value=400))
@settings(max_examples=200, deadline=None)
def test_split_escaped_keeps_every_character(raw: str, limit: int) -> None:
    parts = cards.split_escaped(raw, limit)
    assert "".join(parts) == raw
    assert all(len(cards.escape(p)) <= limit for p in parts)


@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12_000))
@settings(max_examples=100, deadline=None)
def test_long_answers_are_split_not_cut(text: str) -> None:
    parts = answers.split_message(text, limit=1000)
    assert all(len(p) <= 1000 for p in parts)
    if "```" not in text:
        squash = re.compile(r"\s+")
        assert squash.sub("", "".join(parts)) == squash.sub(
            "", cards.escape(text.strip()) or "(empty)"
        )


def test_answer_messages_number_the_parts_and_balance_fences() -> None:
    text = "intro\n```\n" + "\n".join(f"line {i}" for i in range(900)) + "\n```\nend"
    post = answers.answer_post(text, "r-00abcdefghij")
    msgs = post.texts
    assert len(msgs) == 3 and post.file is None
    assert msgs[0].startswith("✅ *Answer*")
    for i, m in enumerate(msgs):
        assert m.endswith(f"_({i + 1}/{len(msgs)})_")
        assert m.count("```") % 2 == 0, "each part opens and closes its code block"
    assert "line 899" in msgs[-1] and "end" in msgs[-1]
    parts = answers.split_message(text * 3)
    assert len(parts) > 3 and all(p.count("```") % 2 == 0 for p in parts)


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=30),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=4000),
            lambda children: (
                st.lists(children, max_size=5)
                | st.dictionaries(st.text(max_size=10), children, max_size=5)
            ),
            max_leaves=30,
        ),
        max_size=8,
    ),
    st.sampled_from(list(GateStatus)),
)
@settings(max_examples=60, deadline=None)
def test_any_arguments_make_a_valid_card(args: dict[str, Any], status: GateStatus) -> None:
    gate = make_gate(args, status=status, decided_by="U1", decided_at=time.time(), reason="r" * 600)
    card = cards.gate_card(gate, cards.ToolResult(ok=True, output="o" * 3000))
    blocks = assert_valid_message(card)
    assert_valid_message(
        cards.gate_card(gate, cards.ToolResult(ok=True, output="o" * 3000), compact=True)
    )
    assert any(isinstance(b, SectionBlock) for b in blocks)
    assert bool(actions(card.blocks)) == (status is GateStatus.PENDING)
    if status is GateStatus.PENDING:
        assert isinstance(blocks[-1], ActionsBlock)


def test_fake_slack_validator_rejects_what_slack_rejects() -> None:
    """The suite's safety net works: an over-long section fails like Slack would."""
    assert (
        _blocks_problem([{"type": "section", "text": {"type": "mrkdwn", "text": "a" * 3001}}], 50)
        == "invalid_blocks"
    )
    assert _blocks_problem([{"type": "bogus"}], 50) == "invalid_blocks"
    assert _blocks_problem([{"type": "divider"}] * 51, 50) == "invalid_blocks"
