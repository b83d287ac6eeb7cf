"""What Slack shows when a run fails where its parent or its approvals were involved.

- ``/agent retry <sub-agent's run>`` once the parent has the failure as its call's result:
  refused, naming the top run; the thread's root message keeps showing the top run.
- A run that fails in its tools phase (its resume job reached a worker that does not serve
  its agent): the approved call's card says it never ran, and a thread reply that continues
  the run does not run the old approval.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

from agent_core import RunStatus
from agent_core.testing import FakeOpenAI, call, raw_response, reply, tool_messages
from agent_core.worker import Worker
from bot import cards
from tests.agents import desk, strict
from tests.bot.conftest import (
    APPROVER,
    APPROVER2,
    CHANNEL,
    REQUESTER,
    BotHarness,
    core_settings,
    journal_lines,
)
from tests.bot.test_conversations import message, root_of, send_event, thread_shows
from tests.bot.test_retry_command import command, run_status
from tests.core.harness import Harness

UNAVAILABLE = {"error": {"message": "overloaded", "type": "server_error", "code": None}}
FLAKY = {"OPENAI_MAX_RETRIES": 1, "OPENAI_RETRY_BUDGET": 2}


def root_blocks(bot: BotHarness, ts: str) -> str:
    msg = bot.fake.message(CHANNEL, ts)
    assert msg is not None
    return msg.text + json.dumps(msg.blocks, ensure_ascii=False)


async def test_retrying_a_sub_agents_run_its_finished_parent_read_is_refused(
    bot: BotHarness, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    bot.gateway.agent_name = desk.name
    bot.core = Harness(bot.redis, core_settings(redis_url, fake_openai.base_url, **FLAKY), desk)
    bot.core.start_worker()
    task = "ask billing about item nine"
    fake_openai.script(task, [call("billing", {"task": "look up 9"}), reply("billing is down")])
    fake_openai.script("look up 9", [raw_response(UNAVAILABLE, status=503)])
    run_id = await bot.start_task(task)
    done = await run_status(bot, run_id, RunStatus.COMPLETED)
    root_ts = str(done.origin["thread_ts"])
    completed = f"Run `{run_id}` · ✅ completed"
    await bot.fake.wait_for(lambda f: f.shows(CHANNEL, root_ts, completed), what="completed")
    [child] = await bot.redis.smembers(bot.keys.children(run_id))
    fake_openai.script("look up 9", [call("lookup", {"key": "9"}), reply("9 is nine")])

    text = await command(bot, f"retry {child}", REQUESTER, "child")
    assert text == (
        f"Run `{child}` is a sub-agent's run, and its parent already got its failure as the "
        "sub-agent's answer: retried alone, its answer would reach nobody. Retry the top run "
        f"`{run_id}` instead (`/agent retry {run_id}`, if it failed), or reply in its thread "
        "to continue it."
    )
    await asyncio.sleep(0.5)
    assert (await bot.gateway.get_run(child)).status is RunStatus.FAILED  # type: ignore[union-attr]
    assert journal_lines(journal) == []
    shown = root_blocks(bot, root_ts)
    assert task in shown and completed in shown
    assert "look up 9" not in shown and child not in shown

    # Whatever asks for a sub-agent's run to be shown, the root message shows the top run.
    await bot.server.context.publisher.show_run(child)
    shown = root_blocks(bot, root_ts)
    assert task in shown and completed in shown
    assert "look up 9" not in shown and child not in shown


async def swap_worker(bot: BotHarness, agent: Any) -> None:
    """Stop the bot's worker and start one serving ``agent`` (and only it)."""
    core = bot.core
    assert core is not None
    for w, t in core.workers:
        w.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(t, 10)
    w = Worker(core.redis, agent, core.client, core.settings)
    core.workers = [(w, asyncio.create_task(w.run()))]


async def test_a_run_failed_at_resume_says_its_approved_call_never_ran_and_a_reply_keeps_it_so(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    def not_run(messages: list[dict[str, Any]]) -> None:
        [tool] = tool_messages(messages)
        assert tool["content"].startswith("Not executed: the run failed before this call ran")

    task = "delete user 77"
    fake_openai.script(
        task, [call("delete_user", {"user_id": "77"}), reply("It never ran.", expect=not_run)]
    )
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    await swap_worker(live, strict)  # the resume job reaches a worker without test-ops
    await live.client.action(cards.APPROVE_ACTION, cards.button_value(gate), user_id=APPROVER)
    await run_status(live, run_id, RunStatus.FAILED)
    msg = await live.wait_card(gate.gate_id, "Never ran")
    text = json.dumps(msg.blocks, ensure_ascii=False)
    assert "⏹️ *Never ran* — the run failed before this call started; not executed" in text
    assert "Running…" not in text

    await swap_worker(live, live.core.agent)  # type: ignore[union-attr]
    ts = await root_of(live, run_id)
    resp = await send_event(live, message(ts, "what happened?", user=APPROVER2))
    assert resp.status == 200, resp.text
    await thread_shows(live, ts, "It never ran.")
    await run_status(live, run_id, RunStatus.COMPLETED)
    await asyncio.sleep(0.3)
    assert journal_lines(journal) == [], "the approval given before the failure did not run"
    msg = await live.card(gate.gate_id)
    text = json.dumps(msg.blocks, ensure_ascii=False)
    assert "the run failed before this call started" in text and "Executed" not in text
    assert fake_openai.errors == []
