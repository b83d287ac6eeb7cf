"""Several agents behind one slash command: ``/agent billing …``, help, workers, /healthz."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from agent_core import Run, RunStatus
from agent_core.examples.billing import agent as billing
from agent_core.testing import FakeOpenAI, call, reply
from bot.directory import AgentDirectory, AgentEntry
from tests.agents import ops
from tests.bot.conftest import (
    CHANNEL,
    REQUESTER,
    BotHarness,
    Workers,
    wait_until,
)
from tests.bot.test_conversations import ephemerals, send_event
from tests.bot.test_mentions import BOT, mention


@pytest.fixture
async def multi(make_multi: Callable[..., Awaitable[BotHarness]]) -> BotHarness:
    return await make_multi()


async def alive(bot: BotHarness, n: int = 1) -> None:
    """Wait until ``n`` workers have announced themselves."""

    async def seen() -> bool:
        return (await bot.server.agents.workers(fresh=True)).alive >= n

    await wait_until(seen)


async def reply_to(bot: BotHarness, text: str, name: str, user: str = REQUESTER) -> str:
    """``/agent <text>``; the reply it got (the ack's text, else the response_url's)."""
    body = bot.client.command_body(
        text, user_id=user, channel_id=CHANNEL, response_url=bot.fake.response_url(name)
    )
    resp = await bot.client.post(body)
    assert resp.status == 200, resp.text
    if resp.text:
        return str(resp.json()["text"])
    (r,) = await bot.fake.wait_for(lambda f: f.responses(name), what=f"the reply to {text!r}")
    return str(r.args["text"])


async def run_of(bot: BotHarness, task: str) -> Run:
    async def started() -> list[Run]:
        return [r for r in await bot.gateway.runs_for_user(REQUESTER, limit=50) if r.task == task]

    runs: list[Run] = await wait_until(started)
    return runs[0]


async def healthz(bot: BotHarness) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.get(bot.server.url + "/healthz") as r:
        return r.status, json.loads(await r.text())


# --------------------------------------------------------------------------- routing
def test_routing_picks_a_configured_agent_by_its_first_word() -> None:
    d = AgentDirectory([AgentEntry("ops"), AgentEntry("billing", "Invoices")])
    assert d.route("billing refund order 7").agent == AgentEntry("billing", "Invoices")
    assert d.route("billing refund order 7").task == "refund order 7"
    assert d.route("  Billing:  refund  ").task == "refund"
    assert d.route("BILLING refund").named
    assert d.route("billing\nrefund\n order 7").task == "refund\n order 7"
    assert d.route("billings refund").agent == AgentEntry("ops")
    assert d.route("refund billing 7").task == "refund billing 7"
    assert not d.route("refund billing 7").named
    assert AgentDirectory().route("billing x").agent is None
    # With one agent there is nothing to pick: its name as a first word is part of the task.
    one = AgentDirectory([AgentEntry("ops")])
    assert one.route("ops is down: restart web").task == "ops is down: restart web"
    assert not one.route("ops is down").named


async def test_a_named_agent_runs_with_its_instructions_and_tools(
    multi: BotHarness, workers: Workers, fake_openai: FakeOpenAI
) -> None:
    workers([ops, billing])
    await alive(multi)
    fake_openai.script(
        "refund order 7",
        [call("refund", {"order_id": "7", "amount_cents": 4900, "reason": "broken"}), reply("ok")],
    )
    fake_openai.script("look up k1", [call("lookup", {"key": "k1"}), reply("found k1")])
    await multi.client.command("billing refund order 7", user_id=REQUESTER, channel_id=CHANNEL)
    await multi.client.command("look up k1", user_id=REQUESTER, channel_id=CHANNEL)

    run = await run_of(multi, "refund order 7")
    assert run.agent == "billing"
    gate = await multi.gate_of(run.run_id)
    assert (gate.tool, gate.agent) == ("refund", "billing")
    card = await multi.card(gate.gate_id)
    assert "billing" in str(card.blocks), "the card names the agent"
    [first, *_] = fake_openai.requests_for("refund order 7")
    assert first["messages"][0] == {"role": "system", "content": billing.instructions}
    assert [t["function"]["name"] for t in first["tools"]] == ["get_invoice", "refund"]

    default = await run_of(multi, "look up k1")
    assert default.agent == "test-ops"
    done = await multi.gateway.wait(default.run_id, timeout=10)
    assert done.final == "found k1"
    [first, *_] = fake_openai.requests_for("look up k1")
    assert first["messages"][0]["content"] == ops.instructions
    assert "lookup" in [t["function"]["name"] for t in first["tools"]]


async def test_help_lists_the_agents_and_the_default(multi: BotHarness) -> None:
    text = await reply_to(multi, "help", "help")
    assert text.startswith("*Agents*\n• `test-ops` (default) — no description\n")
    assert f"• `billing` — {billing.description}" in text
    assert "e.g. `/agent billing &lt;task&gt;`; without a name, `test-ops` does the task" in text
    assert "*Usage*" in text and "`/agent status`" in text
    assert "What should `billing` do?" in await reply_to(multi, "Billing", "empty")
    assert await multi.gateway.runs_for_user(REQUESTER) == []


async def test_a_task_for_an_agent_no_live_worker_serves_is_refused_at_once(
    multi: BotHarness, workers: Workers
) -> None:
    workers([ops])
    await alive(multi)
    text = await reply_to(multi, "billing refund order 7", "refused")
    assert text == (
        "No worker serves the agent `billing` right now (the live workers serve `test-ops`), "
        "so the task was not started. Ask whoever runs the workers to add it to AGENTS there."
    )
    assert await multi.gateway.runs_for_user(REQUESTER) == []
    assert not multi.fake.calls_to("chat.postMessage"), "nothing posted in the channel"


async def test_a_queued_run_of_an_agent_the_worker_lacks_fails_and_slack_shows_it(
    multi: BotHarness, workers: Workers, fake_openai: FakeOpenAI
) -> None:
    """No worker yet: the task is queued (and the person told); the worker that comes up
    serves only ops, so it fails the billing run with a clear error, shown in the thread."""
    text = await reply_to(multi, "billing refund order 7", "queued")
    assert text.startswith("⚠️ No worker is running right now: your task is queued")
    run = await run_of(multi, "refund order 7")
    assert (run.status, run.agent) == (RunStatus.QUEUED, "billing")
    workers([ops])
    done = await multi.gateway.wait(run.run_id, timeout=10)
    assert done.status is RunStatus.FAILED
    assert done.error is not None and "no agent named 'billing'" in done.error
    thread = str(run.origin["thread_ts"])
    await multi.fake.wait_for(
        lambda f: any(
            "The run failed" in m.text and "billing" in m.text for m in f.thread(CHANNEL, thread)
        ),
        what="the failure in the run's thread",
    )
    assert fake_openai.requests == []


async def test_a_mention_routes_like_the_command(
    multi: BotHarness, workers: Workers, fake_openai: FakeOpenAI
) -> None:
    workers([ops])
    await alive(multi)
    fake_openai.script("look up k2", [reply("k2 found")])
    await send_event(multi, mention(f"<@{BOT}> test-ops look up k2"))
    run = await run_of(multi, "look up k2")
    assert run.agent == "test-ops"
    await send_event(multi, mention(f"<@{BOT}> billing refund order 9"))
    await multi.fake.wait_for(
        lambda f: any(
            "No worker serves the agent `billing`" in a["text"] for a in ephemerals(multi)
        ),
        what="the refusal",
    )
    await send_event(multi, mention(f"<@{BOT}> billing"))
    await multi.fake.wait_for(
        lambda f: any(
            f"What should `billing` do? Write the task after its name: "
            f"`<@{BOT}> billing &lt;task&gt;`" in a["text"]
            for a in ephemerals(multi)
        ),
        what="the question",
    )
    assert [r.task for r in await multi.gateway.runs_for_user(REQUESTER)] == ["look up k2"]


# --------------------------------------------------------------------------- /healthz
async def test_healthz_reports_no_workers_then_workers_with_their_agents(
    multi: BotHarness, workers: Workers
) -> None:
    status, body = await healthz(multi)
    assert status == 200 and body["ok"] is True and body["status"] == "degraded"
    assert body["workers"] == {
        "alive": 0,
        "agents": [],
        "missing_agents": ["test-ops", "billing"],
        "problem": (
            "no worker is alive under KEY_PREFIX=t: runs stay queued until one starts. Check "
            "that the workers run, and that they and this process use the same KEY_PREFIX and "
            "REDIS_URL"
        ),
    }
    workers([ops])

    async def one() -> dict[str, Any] | None:
        _, body = await healthz(multi)
        return body if body["workers"]["alive"] == 1 else None

    body = await wait_until(one)
    assert body["status"] == "degraded"
    assert body["workers"]["agents"] == ["test-ops"]
    assert body["workers"]["missing_agents"] == ["billing"]
    assert "no live worker serves the agent billing" in body["workers"]["problem"]
    workers([ops, billing])

    async def two() -> dict[str, Any] | None:
        _, body = await healthz(multi)
        return body if body["workers"]["alive"] == 2 else None

    body = await wait_until(two)
    assert body == {
        "ok": True,
        "status": "ok",
        "workers": {
            "alive": 2,
            "agents": ["billing", "test-ops"],
            "missing_agents": [],
            "problem": None,
        },
    }


async def test_healthz_names_the_prefix_and_shards_the_workers_use(
    multi: BotHarness, workers: Workers
) -> None:
    workers([ops, billing], KEY_PREFIX="prod")

    async def elsewhere() -> dict[str, Any] | None:
        _, body = await healthz(multi)
        return body if body["workers"].get("other_prefixes") else None

    body = await wait_until(elsewhere)
    assert body["status"] == "degraded" and body["workers"]["alive"] == 0
    assert body["workers"]["other_prefixes"] == ["prod"]
    assert body["workers"]["problem"].endswith(
        "(workers found under KEY_PREFIX=prod; this process uses KEY_PREFIX=t)"
    )
    workers([ops, billing], SHARDS=4)
    await alive(multi)
    _, body = await healthz(multi)
    assert body["workers"]["shards"] == [4]
    assert body["workers"]["problem"].startswith(
        "workers use SHARDS=4 but this process uses SHARDS=16: runs in shards they do not read "
        "stay queued"
    )


async def test_the_web_warns_at_start_when_no_worker_shows_up(
    make_multi: Callable[..., Awaitable[BotHarness]],
    workers: Workers,
    caplog: pytest.LogCaptureFixture,
) -> None:
    workers([ops], KEY_PREFIX="prod")
    caplog.set_level(logging.INFO, logger="bot")
    lonely = await make_multi(workers_grace=0.3)

    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    await wait_until(lambda: asyncio.sleep(0, warned()))
    [line] = [m for m in warned() if m.startswith("workers:")]
    assert "no worker is alive under KEY_PREFIX=t" in line
    assert "workers found under KEY_PREFIX=prod" in line
    await lonely.close()
    caplog.clear()
    workers([ops, billing])
    await make_multi(workers_grace=5)
    await wait_until(
        lambda: asyncio.sleep(
            0, [r for r in caplog.records if "workers: 1 alive" in r.getMessage()]
        )
    )
    assert not warned()
