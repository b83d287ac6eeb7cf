"""Gateway.continue_run with a dedupe key: a message is added to a run once.

The key (a chat message's id) is recorded by the script that records the message, so a
message delivered twice (two events for one Slack message, a retry) joins the history once,
and a message that started the run is seen when it comes again as a reply. A call retried
after a lost reply (redis-py sends the same script and arguments again) gets its own
outcome back, not "duplicate".
"""

from __future__ import annotations

import pytest

from agent_core import ContinueOutcome, InvalidState, RunStatus, run_control
from agent_core.testing import FakeOpenAI, call, reply
from tests.core.harness import Harness


async def continued_events(harness: Harness, run_id: str) -> int:
    stream = harness.keys.events(harness.keys.shard_of(run_id))
    entries = await harness.redis.xrange(stream)
    return sum(
        1 for _, f in entries if f.get("type") == "run.continued" and f.get("run_id") == run_id
    )


def user_contents(history: list[dict[str, str]]) -> list[str]:
    return [m["content"] for m in history if m["role"] == "user"]


async def test_a_message_with_a_dedupe_key_is_added_once(
    harness: Harness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script("hello", [reply("hi"), reply("bye")])
    gw = harness.gateway
    run = await gw.start_run("hello", requested_by="U1")
    await harness.wait_finished(run.run_id)

    first = await gw.continue_run(run.run_id, "say bye", by="U2", dedupe_key="msg:C1:1.5")
    assert first is ContinueOutcome.STARTED
    assert (await gw.wait(run.run_id, timeout=10)).final == "bye"
    again = await gw.continue_run(run.run_id, "say bye", by="U2", dedupe_key="msg:C1:1.5")
    assert again is ContinueOutcome.DUPLICATE

    assert (await gw.get_run(run.run_id)).status is RunStatus.COMPLETED  # type: ignore[union-attr]
    assert user_contents(await gw.history(run.run_id)) == ["hello", "say bye"]
    assert await continued_events(harness, run.run_id) == 1
    assert len(fake_openai.requests_for("hello")) == 2


async def test_the_message_that_started_a_run_is_seen_when_it_comes_again_as_a_reply(
    harness: Harness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script("look up 7", [reply("7 is Ada")])
    gw = harness.gateway
    run = await gw.start_run("look up 7", requested_by="U1", idempotency_key="msg:C1:2.5")
    await harness.wait_finished(run.run_id)

    got = await gw.continue_run(run.run_id, "look up 7", by="U1", dedupe_key="msg:C1:2.5")
    assert got is ContinueOutcome.DUPLICATE
    assert user_contents(await gw.history(run.run_id)) == ["look up 7"]
    assert await continued_events(harness, run.run_id) == 0


async def test_a_retried_call_gets_its_own_outcome_back(
    harness: Harness, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_openai.script("count", [reply("1"), reply("2")])
    gw = harness.gateway
    run = await gw.start_run("count", requested_by="U1")
    await harness.wait_finished(run.run_id)
    # A retry after a lost reply sends the same script and arguments: the same token.
    monkeypatch.setattr(run_control.secrets, "token_hex", lambda n: "0123456789abcdef")
    for _ in range(2):
        got = await gw.continue_run(run.run_id, "go on", by="U1", dedupe_key="msg:C1:3.5")
        assert got is ContinueOutcome.STARTED
    assert user_contents(await gw.history(run.run_id)) == ["count", "go on"]
    await gw.wait(run.run_id, timeout=10)

    # The same for a refusal: a cancelled run answers the retry as it answered the call.
    # (It waits for approval when cancelled: a run the worker already finished cannot be.)
    fake_openai.script("delete 1", [call("delete_user", {"user_id": "1"}), reply("x")])
    cancelled = await gw.start_run("delete 1", requested_by="U1")
    await gw.wait(cancelled.run_id, RunStatus.AWAITING_APPROVAL, timeout=10)
    await gw.cancel_run(cancelled.run_id, by="U1")
    for _ in range(2):
        with pytest.raises(InvalidState):
            await gw.continue_run(cancelled.run_id, "go on", by="U1", dedupe_key="msg:C1:4.5")
    monkeypatch.undo()
    got = await gw.continue_run(cancelled.run_id, "go on", by="U1", dedupe_key="msg:C1:4.5")
    assert got is ContinueOutcome.DUPLICATE
    # The key lives in the run's shard (one slot with the run's keys), for a day.
    seen = harness.keys.seen_key("msg:C1:4.5", harness.keys.shard_of(cancelled.run_id))
    assert 0 < await harness.redis.ttl(seen) <= 86_400


async def test_a_bad_dedupe_key_is_refused(harness: Harness, fake_openai: FakeOpenAI) -> None:
    # The harness's worker may take the run up before the test ends: it gets an answer.
    fake_openai.script("anything", [reply("ok")])
    gw = harness.gateway
    run = await gw.start_run("anything", requested_by="U1")
    for bad in ("", "x" * 201):
        with pytest.raises(ValueError, match="dedupe_key"):
            await gw.continue_run(run.run_id, "hi", by="U1", dedupe_key=bad)
