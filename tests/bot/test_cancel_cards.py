"""A cancel, end to end with the core's worker: each approved call's card tells what became
of it (never ran; running at the cancel, then how it finished).

The run is cancelled through ``/agent cancel`` (signed), the worker is the core's, Redis and
the fake Slack server are real; the tool's side effects go to the journal.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent_core.testing import FakeOpenAI, call, calls, reply
from bot import cards
from tests.bot.conftest import APPROVER, REQUESTER, BotHarness, journal_lines, wait_until


async def test_an_approved_call_that_never_started_says_never_ran(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "two deletions, one approved, then cancel"
    fake_openai.script(
        task,
        [
            calls([("delete_user", {"user_id": "a"}), ("delete_user", {"user_id": "b"})]),
            reply("never"),
        ],
    )
    run_id = await live.start_task(task, user_id=REQUESTER)

    async def two_cards() -> list[Any]:
        gates = await live.gateway.pending_gates(run_id)
        k = live.keys
        posted = [
            g
            for g in gates
            if await live.redis.hget(k.ext("slack-card", g.gate_id, k.shard_of(g.gate_id)), "ts")
        ]
        return posted if len(posted) == 2 else []

    first, second = await wait_until(two_cards)
    # The turn waits for both decisions: the approved call does not start yet.
    await live.client.action(cards.APPROVE_ACTION, cards.button_value(first), user_id=APPROVER)
    await live.wait_card(first.gate_id, "Approved* by")
    await live.client.command(f"cancel {run_id}", user_id=REQUESTER)
    await live.wait_card(second.gate_id, "Cancelled")
    msg = await live.wait_card(first.gate_id, "Never ran")
    text = json.dumps(msg.blocks, ensure_ascii=False)
    assert "⏹️ *Never ran* — the run was cancelled before this call started; not executed" in text
    assert "Running…" not in text
    assert journal_lines(journal) == []


async def test_a_call_running_at_the_cancel_shows_it_then_how_it_finished(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_SLOW_SECONDS", "2")
    task = "slow transfer, cancelled while it runs"
    fake_openai.script(task, [call("transfer", {"amount": 5}), reply("never")])
    run_id = await live.start_task(task, user_id=REQUESTER)
    gate = await live.gate_of(run_id)
    await live.client.action(cards.APPROVE_ACTION, cards.button_value(gate), user_id=APPROVER)

    async def started() -> bool:
        return journal_lines(journal) == ["transfer:start:5"]

    await wait_until(started)
    await live.client.command(f"cancel {run_id}", user_id=REQUESTER)
    msg = await live.wait_card(gate.gate_id, "Was running when the run was cancelled")
    assert "its outcome will appear here" in json.dumps(msg.blocks, ensure_ascii=False)
    msg = await live.wait_card(gate.gate_id, "Finished after the run was cancelled", timeout=15)
    text = json.dumps(msg.blocks, ensure_ascii=False)
    assert "transferred 5" in text and "Was running" not in text and "*Executed*" not in text
    assert journal_lines(journal) == ["transfer:start:5", "transfer:end:5"], "ran once"
