"""An old-layout deployment (keys under ``{t:3}`` tags) upgraded through Slack: the new web and
worker processes refuse to start with one line naming the fix, the migration command refuses
while a worker is alive, then moves every key, and a card posted before the upgrade decides
its gate by the same gate id; ``/healthz`` reports keys in the old layout."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from redis.asyncio import Redis

from agent_core import Gateway, Keys, RunStatus, layout
from agent_core.presence import announce, presence_key
from agent_core.testing import FakeOpenAI, call, reply
from bot import cards
from bot.server import BotServer
from tests.agents import ops
from tests.bot.conftest import (
    APPROVER,
    PREFIX,
    SIGNING_SECRET,
    BotHarness,
    bot_settings,
    core_settings,
    journal_lines,
    wait_until,
)
from tests.bot.test_args_hash import button_values
from tests.core.workers import REPO, worker_env
from tests.old_layout import old_worker
from tests.slack_fake import FakeSlack

FIX = "stop every web and worker, run `python -m agent_core.migrate_layout`"


async def run(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def web_env(redis_url: str, fake: FakeSlack) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLACK_")}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env.update(
        REDIS_URL=redis_url,
        KEY_PREFIX=PREFIX,
        AGENT="tests.agents:ops",
        SLACK_BOT_TOKEN=fake.token,
        SLACK_SIGNING_SECRET=SIGNING_SECRET,
        SLACK_API_URL=fake.base_url.rstrip("/"),
        APPROVERS=APPROVER,
        PORT=str(port),
        PYTHONPATH=str(REPO),
    )
    return env


async def test_an_old_layout_deployment_is_upgraded_and_its_posted_card_still_decides(
    redis: Redis,
    redis_url: str,
    fake_slack: FakeSlack,
    fake_openai: FakeOpenAI,
    journal: Path,
    monkeypatch: pytest.MonkeyPatch,
    make_bot: Callable[..., Awaitable[BotHarness]],
) -> None:
    task = "delete user 81"
    fake_openai.script(task, [call("delete_user", {"user_id": "81"}), reply("user 81 gone")])
    # The previous version's web and worker: a run paused on its gate, the card posted.
    old = BotHarness(redis, fake_slack, bot_settings(fake_slack))
    old.keys = Keys(PREFIX, legacy=True)
    old.gateway = Gateway(redis, old.keys, agent_name=ops.name)
    old.server = BotServer(
        old.settings,
        redis,
        old.gateway,
        host="127.0.0.1",
        port=0,
        notifier_consumer="web-test",
        notifier_block_ms=100,
    )
    await old.start()
    # A long approval timeout: the migration's subprocesses below may take many seconds on a
    # loaded machine, and the gate must still be pending when the old card is clicked.
    worker, openai = old_worker(
        redis,
        ops,
        core_settings(redis_url, fake_openai.base_url, APPROVAL_TIMEOUT=600),
        monkeypatch,
    )
    working = asyncio.create_task(worker.run())
    try:
        run_id = await old.start_task(task)
        gate = await old.gate_of(run_id)
        buttons = button_values((await old.card(gate.gate_id)).blocks)
    finally:
        worker.stop()
        await asyncio.wait_for(working, 15)
        await old.close()
        await openai.close()

    # This version's processes refuse to start, each with one line naming the fix.
    refusals = await asyncio.gather(
        run([sys.executable, "-m", "bot"], web_env(redis_url, fake_slack)),
        run(
            [sys.executable, "-m", "agent_core.worker"],
            worker_env(redis_url, fake_openai.base_url, journal),
        ),
    )
    for code, _out, err in refusals:
        assert code == 2, err
        assert err.splitlines() == [
            "config error: KEY_PREFIX=t: Redis holds runs in the old key layout ({t:N} hash "
            f"tags), which this version would not see; {FIX} once, then start them again"
        ]

    # The migration refuses while a worker is alive (one of the old version, still running,
    # say), then moves every key.
    assert await announce(redis, Keys(PREFIX), "old-worker", ["test-ops"], every=10)
    env = worker_env(redis_url, fake_openai.base_url, journal)
    migrate = [sys.executable, "-m", "agent_core.migrate_layout"]
    code, _out, err = await run(migrate, env)
    assert code == 1 and "1 worker(s) alive under KEY_PREFIX=t" in err and "--force" in err, err
    await redis.delete(presence_key(Keys(PREFIX)))  # it stopped
    code, out, err = await run(migrate, env)
    assert code == 0, err
    lines = out.splitlines()
    shard = old.keys.shard_of(run_id)
    new = Keys(PREFIX)
    assert any(
        line.startswith(f"shard {shard}: {{t:{shard}}} -> {new.tag(shard)}: ") for line in lines
    ), out
    assert lines[-1].startswith("moved ") and lines[-1].endswith("; start web and workers now")
    code, out, _err = await run(migrate, env)
    assert code == 0 and out.splitlines()[-1] == (
        "nothing to move: no key of KEY_PREFIX=t is in the old layout"
    )

    # This version: the card posted before the upgrade decides the gate, once.
    bot = await make_bot()
    bot.start_worker(redis_url, fake_openai.base_url)
    await bot.client.action(cards.APPROVE_ACTION, buttons[cards.APPROVE_ACTION], user_id=APPROVER)

    async def finished() -> Any:
        r = await bot.gateway.get_run(run_id)
        return r if r is not None and r.status.finished else None

    done = await wait_until(finished, timeout=15)
    assert done.status is RunStatus.COMPLETED and done.final == "user 81 gone"
    assert journal_lines(journal) == ["delete_user:81"]
    await bot.wait_card(gate.gate_id, "Approved")


async def test_healthz_reports_keys_in_the_old_layout(
    redis: Redis, make_bot: Callable[..., Awaitable[BotHarness]]
) -> None:
    # Written by a process of the previous version after this one started.
    await redis.xadd(Keys(PREFIX, legacy=True).jobs(5), {"kind": "start"})
    bot = await make_bot()
    async with aiohttp.ClientSession() as s, s.get(bot.server.url + "/healthz") as r:
        status, body = r.status, json.loads(await r.text())
    assert status == 200 and body["status"] == "degraded", body
    assert body["layout"] == await layout.old_layout_problem(redis, bot.keys)
    assert body["layout"].startswith("KEY_PREFIX=t: Redis holds runs in the old key layout")
