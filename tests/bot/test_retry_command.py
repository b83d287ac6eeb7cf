"""``/agent retry <run id>``: a run whose model call kept failing is continued from its last
durable step (``Gateway.retry_run``), never re-running a call that ran. Who may: the run's
requester or an approver, as for ``cancel`` (Slack Connect users included).

The whole path: the fake OpenAI server answers 503 past the retry budget after an approved
call ran, the worker fails the run retryably, Slack shows how to retry, the command retries,
the run completes, and the journal shows the call ran once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent_core import RunStatus
from agent_core.testing import FakeOpenAI, call, raw_response, reply
from bot import cards
from tests.bot.conftest import (
    APPROVER,
    CHANNEL,
    REQUESTER,
    STRANGER,
    BotHarness,
    journal_lines,
    wait_until,
)

OTHER_TEAM = "T0OTHERORG"
FLAKY_MODEL = {"OPENAI_MAX_RETRIES": 1, "OPENAI_RETRY_BUDGET": 5}
# Azure's answer when its content filter blocks a completion: a retry cannot fix it.
FILTERED = {
    "id": "chatcmpl-filtered",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "fake-model",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": None},
            "finish_reason": "content_filter",
        }
    ],
}


async def run_status(bot: BotHarness, run_id: str, status: RunStatus, timeout: float = 20) -> Any:
    async def reached() -> Any:
        run = await bot.gateway.get_run(run_id)
        return run if run is not None and run.status is status else None

    return await wait_until(reached, timeout=timeout)


async def command(bot: BotHarness, text: str, user: str, name: str, **kw: Any) -> str:
    """``/agent <text>`` as ``user``; the reply it got (ack or response_url)."""
    fake = bot.fake
    body = bot.client.command_body(text, user_id=user, response_url=fake.response_url(name), **kw)
    resp = await bot.client.post(body)
    assert resp.status == 200, resp.text
    if resp.text:
        return str(resp.json()["text"])
    (r,) = await fake.wait_for(lambda f: f.responses(name), what=f"the reply to {text!r}")
    return str(r.args["text"])


async def failed_after_approval(
    bot: BotHarness, fake_openai: FakeOpenAI, task: str, user_id: str
) -> tuple[str, str]:
    """A run whose gated call was approved and ran, then whose model kept answering 503:
    failed, retryable. Returns the run id and its root message's ts."""
    fake_openai.script(task, [call("delete_user", {"user_id": user_id}), reply("user gone")])
    run_id = await bot.start_task(task)
    gate = await bot.gate_of(run_id)
    fake_openai.fail_next(50, status=503)
    await bot.client.action(cards.APPROVE_ACTION, cards.button_value(gate), user_id=APPROVER)
    failed = await run_status(bot, run_id, RunStatus.FAILED)
    assert failed.retryable, failed
    return run_id, str(failed.origin["thread_ts"])


async def test_a_failed_run_is_retried_from_slack_and_its_call_runs_once(
    make_bot: Any, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    bot: BotHarness = await make_bot(APPROVERS="*")
    bot.start_worker(redis_url, fake_openai.base_url, **FLAKY_MODEL)
    fake = bot.fake
    run_id, root_ts = await failed_after_approval(bot, fake_openai, "delete user 90", "90")
    assert journal_lines(journal) == ["delete_user:90"]
    hint = f"/agent retry {run_id}"

    # Slack says how to retry: in the thread, and on the root message's status line.
    def failure_told(f: Any) -> Any:
        return [m for m in f.thread(CHANNEL, root_ts) if "The run failed" in m.text]

    (failure,) = await fake.wait_for(failure_told, what="the failure in the thread")
    assert "HTTP 503" in failure.text and hint in failure.text
    await fake.wait_for(lambda f: f.shows(CHANNEL, root_ts, f"retry with `{hint}`"))

    # Someone from another workspace may not, under APPROVERS=* (as for cancel).
    text = await command(bot, f"retry {run_id}", "U0EXTERNAL", "ext", team_id=OTHER_TEAM)
    assert text == "Only the person who started this run or an approver can retry it."
    assert (await bot.gateway.get_run(run_id)).status is RunStatus.FAILED  # type: ignore[union-attr]

    fake_openai.clear_failures()  # the provider is back
    text = await command(bot, f"retry {run_id}", "U0INSIDER", "retry")
    assert text.startswith(f"Retrying run `{run_id}`."), text
    done = await run_status(bot, run_id, RunStatus.COMPLETED)
    assert done.final == "user gone"
    assert journal_lines(journal) == ["delete_user:90"], "the approved call did not run again"

    def retried_told(f: Any) -> Any:
        return [m for m in f.thread(CHANNEL, root_ts) if "Retried* by <@U0INSIDER>" in m.text]

    await fake.wait_for(retried_told, what="the retry in the thread")
    await fake.wait_for(lambda f: f.shows(CHANNEL, root_ts, "completed"), what="completed")
    assert not fake.shows(CHANNEL, root_ts, "retry with"), "a completed run offers no retry"

    text = await command(bot, f"retry {run_id}", REQUESTER, "again")
    assert text == f"Run `{run_id}` is ✅ completed; only a failed run can be retried."


async def test_a_failure_a_retry_cannot_fix_is_not_offered_nor_retried(
    live: BotHarness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """The provider's content filter fails the run for good: no retry hint anywhere, and
    ``retry`` says why. A stranger is refused before that; the requester may ask."""
    task = "say something filtered"
    fake_openai.script(task, [raw_response(FILTERED)])
    run_id = await live.start_task(task)
    failed = await run_status(live, run_id, RunStatus.FAILED)
    assert not failed.retryable
    root_ts = str(failed.origin["thread_ts"])

    def failure_told(f: Any) -> Any:
        return [m for m in f.thread(CHANNEL, root_ts) if "The run failed" in m.text]

    (failure,) = await live.fake.wait_for(failure_told, what="the failure in the thread")
    assert "retry" not in failure.text
    await live.fake.wait_for(lambda f: f.shows(CHANNEL, root_ts, "failed"), what="failed")
    assert not live.fake.shows(CHANNEL, root_ts, "retry with")

    text = await command(live, f"retry {run_id}", STRANGER, "stranger")
    assert text == "Only the person who started this run or an approver can retry it."
    text = await command(live, f"retry {run_id}", REQUESTER, "own")
    assert text.startswith(f"Run `{run_id}` failed in a way a retry cannot fix"), text
    assert "/agent &lt;task&gt;" in text
    run = await live.gateway.get_run(run_id)
    assert run is not None and run.status is RunStatus.FAILED


async def test_retry_of_a_live_run_and_of_an_unknown_one(
    live: BotHarness, fake_openai: FakeOpenAI
) -> None:
    task = "wait for approval"
    fake_openai.script(task, [call("delete_user", {"user_id": "91"}), reply("ok")])
    run_id = await live.start_task(task)
    await live.gate_of(run_id)
    text = await command(live, f"retry {run_id}", APPROVER, "live")
    assert text == f"Run `{run_id}` is 🔐 awaiting approval; only a failed run can be retried."
    run = await live.gateway.get_run(run_id)
    assert run is not None and run.status is RunStatus.AWAITING_APPROVAL

    text = await command(live, "retry r-000000000000", REQUESTER, "unknown")
    assert text == "There is no run `r-000000000000`. `/agent status` lists yours."
    assert "Which run? Use `/agent retry &lt;run id&gt;`" in await command(
        live, "retry", REQUESTER, "x"
    )
    usage = await command(live, "help", REQUESTER, "help")
    assert "`/agent retry &lt;run id&gt;`" in usage
    runs = await live.gateway.runs_for_user(REQUESTER, limit=50)
    assert [r.run_id for r in runs] == [run_id], "nothing was started"
