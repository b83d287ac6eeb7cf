"""``GET /metrics`` of the web process: a gate decided by a click, Slack calls, errors and
429s, and the job gauges, as a Prometheus scrape sees them. Counters are process-wide, so
each test checks how much they grew."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from slack_sdk.errors import SlackApiError

from agent_core.testing import FakeOpenAI, call, reply
from bot import cards
from tests.bot.conftest import APPROVER, CHANNEL, SIGNING_SECRET, BotHarness, wait_until
from tests.scrape import Samples, scrape
from tests.slack_fake import FakeSlack

POST = "chat.postMessage"


async def metrics_of(bot: BotHarness) -> Samples:
    return await scrape(bot.server.url + "/metrics")


async def test_a_clicked_gate_and_the_slack_calls_it_took(
    live: BotHarness, fake_openai: FakeOpenAI, fake_slack: FakeSlack
) -> None:
    task = "delete user 77"
    fake_openai.script(task, [call("delete_user", {"user_id": "77"}), reply("gone")])
    before = await metrics_of(live)
    # The root message is rate limited once, then goes through (slack_sdk retries it).
    fake_slack.fail_next(POST, 1, retry_after=0)
    run_id = await live.start_task(task)
    gate = await live.gate_of(run_id)
    card = await live.card(gate.gate_id)
    resp = await live.client.action(
        "gate_approve", cards.button_value(gate), user_id=APPROVER, message_ts=card.ts
    )
    assert resp.status == 200
    await live.wait_card(gate.gate_id, "Executed")

    async def finished() -> bool:
        run = await live.gateway.get_run(run_id)
        return run is not None and run.status.finished

    await wait_until(finished, timeout=15)
    # The answer is posted by the notifier after the run finished, and counted once Slack
    # answered: read the metrics once both are done.
    await fake_slack.wait_for(
        lambda f: any("gone" in str(c.args.get("text")) for c in f.calls_to(POST)),
        what="the answer",
    )

    async def counted() -> Samples | None:
        now = await metrics_of(live)
        done = now.since(before, "agw_slack_api_calls_total", method=POST) >= 3
        return now if done else None

    after = await wait_until(counted, timeout=10)

    assert after.since(before, "agw_gates_opened_total") == 1
    assert after.since(before, "agw_gates_decided_total", outcome="approved") == 1
    assert after.since(before, "agw_gate_decision_seconds_count", outcome="approved") == 1
    assert after.since(before, "agw_slack_api_rate_limited_total", method=POST) == 1
    # Every chat.postMessage Slack received is one call, except the retried 429.
    posts = len(fake_slack.calls_to(POST))
    assert posts >= 3, "the root message, the card, the answer"
    assert after.since(before, "agw_slack_api_calls_total", method=POST) == posts - 1
    assert after.since(before, "agw_slack_api_calls_total", method="chat.update") >= 1
    assert not after.grown(before, "agw_slack_api_errors_total"), "no call failed"
    for shard in range(live.keys.shards):
        assert after.has("agw_jobs_pending", shard=str(shard))
    for secret in (fake_slack.token, SIGNING_SECRET):
        assert secret not in after.text


async def test_slack_errors_by_method_and_error(
    make_bot: Callable[..., Awaitable[BotHarness]], fake_slack: FakeSlack
) -> None:
    bot = await make_bot(SLACK_MAX_RETRIES=0)
    client = bot.server.client
    before = await metrics_of(bot)
    fake_slack.fail_next(POST, 1, retry_after=0)
    with pytest.raises(SlackApiError):
        await client.chat_postMessage(channel=CHANNEL, text="rate limited for good")
    fake_slack.error_next(POST, "channel_not_found")
    with pytest.raises(SlackApiError):
        await client.chat_postMessage(channel=CHANNEL, text="nowhere")
    await client.chat_postMessage(channel=CHANNEL, text="fine")
    after = await metrics_of(bot)

    assert after.since(before, "agw_slack_api_calls_total", method=POST) == 3
    assert after.since(before, "agw_slack_api_rate_limited_total", method=POST) == 1
    errors = "agw_slack_api_errors_total"
    assert after.since(before, errors, method=POST, error="ratelimited") == 1
    assert after.since(before, errors, method=POST, error="channel_not_found") == 1
