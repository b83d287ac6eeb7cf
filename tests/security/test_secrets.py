"""Secrets never reach logs, error messages or Slack, on the happy path and on every error.

The real ``web`` and ``worker`` processes run with ``LOG_LEVEL=DEBUG`` and distinctive secret
values: the Slack bot token and signing secret, the OpenAI API key, and a Redis password (a
private ``redis-server`` with ``requirepass``; the fake Slack and fake OpenAI servers check
the token and key they receive). The test drives a run to completion and then makes things
fail: Slack API errors (5xx, permanent errors), model API errors (5xx after retries, an
unexpected request), signed garbage that makes Bolt raise, dropped Redis connections and a
Redis that refuses the password for a while. Afterwards it greps the combined output of both
processes, and every message and reply posted to the fake Slack, for each secret.

Startup failures are covered too: an unreachable Redis and a wrong Redis password, for both
processes. (tests/core/test_settings.py and tests/bot/test_settings.py cover invalid values
and a token Slack rejects.)
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from agent_core.keys import Keys
from agent_core.testing import FakeOpenAI, call, reply
from bot import cards
from tests.bot.conftest import APPROVER, CHANNEL, REQUESTER, wait_until
from tests.redis_server import RedisServer, free_port
from tests.security.seen import button_value
from tests.slack_fake import FakeSlack, SlackClient

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
_TAG = secrets.token_hex(6)
BOT_TOKEN = f"xoxb-botTOKEN{_TAG}"
SIGNING_SECRET = f"signingSECRET{_TAG}"
OPENAI_KEY = f"sk-openaiKEY{_TAG}"
REDIS_PASSWORD = f"redisPASSWORD{_TAG}"
SECRETS = {
    "SLACK_BOT_TOKEN": BOT_TOKEN,
    "SLACK_SIGNING_SECRET": SIGNING_SECRET,
    "OPENAI_API_KEY": OPENAI_KEY,
    "Redis password": REDIS_PASSWORD,
}


def leaks(text: str) -> list[str]:
    """The names of the secrets found in ``text`` (whole, or their distinctive middle)."""
    found = []
    for name, value in SECRETS.items():
        core = value.split(_TAG)[0][-8:] + _TAG  # e.g. "otTOKEN" + tag: catches cut copies
        if value in text or core in text:
            found.append(name)
    return found


@dataclass
class Processes:
    redis: RedisServer
    redis_url: str
    fake_slack: FakeSlack
    fake_openai: FakeOpenAI
    web_url: str
    web: subprocess.Popen[bytes]
    worker: subprocess.Popen[bytes]
    logs: dict[str, Path]

    def output(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.logs.values())


def env_for(redis_url: str, **extra: str) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": str(ROOT),
        "REDIS_URL": redis_url,
        "KEY_PREFIX": "sec",
        "AGENT": "tests.agents:ops",
        "LOG_LEVEL": "DEBUG",
        "OPENAI_API_KEY": OPENAI_KEY,
        "OPENAI_MODEL": "fake-model",
        "OPENAI_MAX_RETRIES": "1",
        "WORKER_LEASE": "1",
        "SWEEP_INTERVAL": "0.2",
        "SLACK_BOT_TOKEN": BOT_TOKEN,
        "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "APPROVERS": APPROVER,
    }
    env.update(extra)
    return env


def spawn(module: str, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def end(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.fixture
def password_redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        import redis as redis_sync

        with redis_sync.Redis(port=server.port) as r:
            r.config_set("requirepass", REDIS_PASSWORD)
        yield server
    finally:
        # SIGTERM: redis-server needs no password to stop.
        server.close()


@pytest.fixture
async def processes(password_redis: RedisServer, tmp_path: Path) -> AsyncIterator[Processes]:
    redis_url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{password_redis.port}/0"
    with FakeSlack(token=BOT_TOKEN) as fake_slack, FakeOpenAI(api_key=OPENAI_KEY) as fake_openai:
        port = free_port()
        base = env_for(
            redis_url,
            OPENAI_BASE_URL=fake_openai.base_url,
            SLACK_API_URL=fake_slack.base_url,
            PORT=str(port),
            TEST_JOURNAL=str(tmp_path / "journal.txt"),
        )
        logs = {"web": tmp_path / "web.log", "worker": tmp_path / "worker.log"}
        web = spawn("bot", base, logs["web"])
        worker = spawn("agent_core.worker", base, logs["worker"])
        url = f"http://127.0.0.1:{port}"
        try:

            async def healthy() -> bool:
                assert web.poll() is None, logs["web"].read_text()
                assert worker.poll() is None, logs["worker"].read_text()
                try:
                    async with aiohttp.ClientSession() as s, s.get(url + "/healthz") as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

            await wait_until(healthy, timeout=30, interval=0.05)
            yield Processes(
                password_redis, redis_url, fake_slack, fake_openai, url, web, worker, logs
            )
        finally:
            end(web)
            end(worker)


async def test_no_secret_in_logs_errors_or_slack_messages(processes: Processes) -> None:
    p = processes
    fake, model = p.fake_slack, p.fake_openai
    slack = SlackClient(p.web_url + "/slack/events", SIGNING_SECRET, fake=fake)
    admin = aioredis.Redis(port=p.redis.port, password=REDIS_PASSWORD, decode_responses=True)
    try:
        # The happy path: a run through a gate, approved.
        model.script("ok task", [call("delete_user", {"user_id": "1"}), reply("done")])
        assert (await slack.command("ok task", user_id=REQUESTER, channel_id=CHANNEL)).status == 200
        gate_id = await wait_until(lambda: first_gate(admin), timeout=15)
        await fake.wait_for(lambda f: f.calls_to("chat.postMessage"))
        # Slack failing while the card is updated: 5xx (retried later), then a permanent error.
        fake.fail_next("chat.update", 2, status=500, retry_after=None, error="internal_error")
        fake.error_next("chat.update", "invalid_auth")  # after the two 5xx: a permanent one
        value = await button_value(fake, gate_id)  # what a click on the card sends
        click = await slack.action(cards.APPROVE_ACTION, value, user_id=APPROVER)
        assert click.status == 200
        await wait_until(lambda: run_done(admin, "ok task"), timeout=20)
        await fake.wait_for(lambda f: len([c for c in f.calls_to("chat.update") if not c.ok]) >= 3)

        # The model failing: 5xx after the retry, and a request nobody scripted.
        model.fail_next(4, status=500)
        await slack.command("model down task", user_id=REQUESTER, channel_id=CHANNEL)
        await slack.command("unscripted task", user_id=REQUESTER, channel_id=CHANNEL)
        await wait_until(lambda: run_done(admin, "model down task"), timeout=20)
        await wait_until(lambda: run_done(admin, "unscripted task"), timeout=20)

        # Requests that fail: forged, malformed, and signed garbage that makes Bolt raise.
        assert (await slack.post(slack.command_body("x"), secret="wrong")).status == 401
        assert (await slack.post("payload=%7Bnot+json")).status == 400
        await slack.payload({"type": "view_submission", "view": {"callback_id": "x"}})
        await slack.payload({"type": "block_actions", "actions": [{"action_id": 5}]})

        # Redis dropping every connection, then refusing the password for a moment.
        await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        await asyncio.sleep(0.3)
        await admin.config_set("requirepass", "another-password-for-a-while")
        await admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
        await slack.command("status", user_id=REQUESTER, response_url=fake.response_url("st"))
        await asyncio.sleep(1.0)
        await admin.config_set("requirepass", REDIS_PASSWORD)
        await wait_until(lambda: healthz(p.web_url), timeout=15)
    finally:
        await admin.aclose()
        p.web.send_signal(signal.SIGTERM)
        p.worker.send_signal(signal.SIGTERM)
        p.web.wait(15)
        p.worker.wait(15)

    output = p.output()
    assert "DEBUG" in output and "web ready" in output, "the processes logged at DEBUG"
    assert "model API error" in output or "run.failed" in output or "failed" in output
    assert "AuthenticationError" in output or "Redis unavailable" in output, (
        "the Redis outage was logged"
    )
    assert leaks(output) == [], f"secrets in the logs: {leaks(output)}"
    posted = json.dumps([c.args for c in fake.calls], default=str)
    assert "The run failed" in posted, "the model errors reached Slack"
    assert leaks(posted) == [], f"secrets sent to Slack: {leaks(posted)}"
    assert not model.errors or all(not leaks(e) for e in model.errors)


KEYS = Keys("sec")


async def first_gate(admin: aioredis.Redis) -> str | None:
    for shard in KEYS.all_shards():
        ids = await admin.zrange(KEYS.deadlines(shard), 0, 0)
        if ids:
            return str(ids[0])
    return None


async def run_done(admin: aioredis.Redis, task: str) -> bool:
    ids = [
        r
        for s in KEYS.all_shards()
        for r in await admin.zrange(KEYS.user_runs(REQUESTER, s), 0, -1)
    ]
    for run_id in ids:
        run: dict[str, Any] = await admin.hgetall(KEYS.run(run_id))
        if run.get("task") == task:
            return run.get("status") in ("completed", "failed", "cancelled")
    return False


async def healthz(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(url + "/healthz") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


def test_startup_failures_never_print_the_redis_password(
    password_redis: RedisServer, tmp_path: Path
) -> None:
    dead = free_port()
    cases = {
        "web, Redis unreachable": ("bot", f"redis://:{REDIS_PASSWORD}@127.0.0.1:{dead}/0"),
        "web, wrong password": (
            "bot",
            f"redis://:{REDIS_PASSWORD}x@127.0.0.1:{password_redis.port}/0",
        ),
        "worker, wrong password": (
            "agent_core.worker",
            f"redis://default:{REDIS_PASSWORD}x@127.0.0.1:{password_redis.port}/0",
        ),
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", module],
            cwd=ROOT,
            env=env_for(
                url,
                SLACK_API_URL="http://127.0.0.1:9/api/",
                OPENAI_BASE_URL="http://127.0.0.1:9/v1",
            ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (module, url) in cases.items()
    }
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=30)
            assert proc.returncode == 2, (name, err)
            last = err.strip().splitlines()[-1]
            assert last.startswith("config error: REDIS_URL: cannot reach Redis at redis://"), (
                name,
                last,
            )
            assert ":***@" in last, (name, last)
            assert leaks(out + err) == [], (name, out + err)
    finally:
        for proc in procs.values():
            end(proc)
