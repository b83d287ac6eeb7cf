"""The real ``web`` process (``python -m bot``): serves signed requests, /healthz, SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from redis.asyncio import Redis

from agent_core import Gateway, Keys
from tests.bot.conftest import APPROVER, CHANNEL, PREFIX, REQUESTER, SIGNING_SECRET, wait_until
from tests.slack_fake import FakeSlack, SlackClient

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def web_process(
    redis_url: str, fake_slack: FakeSlack, tmp_path: Path
) -> AsyncIterator[tuple[str, subprocess.Popen[bytes], Path]]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLACK_")}
    env.update(
        {
            "REDIS_URL": redis_url,
            "KEY_PREFIX": PREFIX,
            "AGENT": "tests.agents:ops",
            "SLACK_BOT_TOKEN": fake_slack.token,
            "SLACK_SIGNING_SECRET": SIGNING_SECRET,
            "SLACK_API_URL": fake_slack.base_url.rstrip("/"),
            "APPROVERS": APPROVER,
            "PORT": str(port),
            "LOG_LEVEL": "DEBUG",
        }
    )
    log = tmp_path / "web.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bot"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"

    async def healthy() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            async with aiohttp.ClientSession() as s, s.get(url + "/healthz") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False

    try:
        await wait_until(healthy, timeout=30, interval=0.1)
        yield url, proc, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


async def test_web_process_serves_slack(
    web_process: tuple[str, subprocess.Popen[bytes], Path], fake_slack: FakeSlack, redis: Redis
) -> None:
    url, proc, log = web_process
    slack = SlackClient(url + "/slack/events", SIGNING_SECRET, fake=fake_slack)
    assert (await slack.command("help")).status == 200
    forged = await slack.post(slack.command_body("rm -rf /"), secret="not-the-secret")
    assert forged.status == 401

    resp = await slack.command("look up the answer", user_id=REQUESTER, channel_id=CHANNEL)
    assert resp.status == 200
    gateway = Gateway(redis, Keys(PREFIX))
    runs = await wait_until(lambda: gateway.runs_for_user(REQUESTER))
    assert runs[0].task == "look up the answer" and runs[0].agent == "test-ops"
    await fake_slack.wait_for(
        lambda f: any(run.run_id in str(m.blocks) for m in f.messages for run in runs)
    )

    proc.send_signal(signal.SIGTERM)
    for _ in range(100):
        if proc.poll() is not None:
            break
        await asyncio.sleep(0.1)
    assert proc.returncode == 0, log.read_text()
    output = log.read_text()
    assert fake_slack.token not in output and SIGNING_SECRET not in output, "no secrets in logs"
    assert "web ready" in output
    # uvloop is a dependency on Linux, and EVENT_LOOP's default (auto) takes it.
    assert "one Redis, uvloop)" in output, output
    assert "will be unused" not in output, "Bolt read SLACK_BOT_TOKEN from the environment"
