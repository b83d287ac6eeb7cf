"""``python -m bot`` as a real process on a private Redis, for tests that SIGKILL it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import redis.asyncio as aioredis

from agent_core import Keys
from bot.notifier import GROUP
from tests.bot.conftest import APPROVER, SIGNING_SECRET, wait_until
from tests.redis_server import free_port
from tests.slack_fake import FakeSlack

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class WebProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    @property
    def events_url(self) -> str:
        return self.url + "/slack/events"

    @property
    def consumer(self) -> str:
        """Its name in the notifier's consumer group (bot.notifier.consumer_name)."""
        return f"web-{socket.gethostname()}-{self.proc.pid}"

    def kill(self) -> None:
        """SIGKILL: the process stops wherever it is, nothing is flushed or acknowledged."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


async def start_web(
    redis_url: str, fake: FakeSlack, log: Path, prefix: str = "t", **extra: str
) -> WebProcess:
    """A ``web`` process (HTTP mode) on ``redis_url`` and the fake Slack; waits until healthy."""
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": str(ROOT),
        "REDIS_URL": redis_url,
        "KEY_PREFIX": prefix,
        "AGENT": "tests.agents:ops",
        "SLACK_BOT_TOKEN": fake.token,
        "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "SLACK_API_URL": fake.base_url,
        "APPROVERS": APPROVER,
        "PORT": str(port),
        **extra,
    }
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bot"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    web = WebProcess(proc, f"http://127.0.0.1:{port}", log)

    async def healthy() -> bool:
        assert proc.poll() is None, _text(log)
        try:
            async with aiohttp.ClientSession() as s, s.get(web.url + "/healthz") as r:
                return r.status == 200
        except aiohttp.ClientError:
            return False

    try:
        await wait_until(healthy, timeout=30, interval=0.05)
    except BaseException:
        web.kill()
        raise
    return web


def _text(path: Path) -> str:
    return path.read_text(errors="replace")


async def age_pending_events(redis: aioredis.Redis, consumer: str, prefix: str = "t") -> int:
    """Make the events a dead consumer left pending claimable at once, as they are once
    ``claim_idle_ms`` (30 s) has passed: XCLAIM them to itself with a large IDLE."""
    keys, aged = Keys(prefix), 0
    for shard in keys.all_shards():
        stream = keys.events(shard)
        pending = await redis.xpending_range(stream, GROUP, "-", "+", 1000, consumername=consumer)
        ids = [p["message_id"] for p in pending]
        if ids:
            await redis.execute_command(
                "XCLAIM", stream, GROUP, consumer, 0, *ids, "IDLE", 3_600_000, "JUSTID"
            )
        aged += len(ids)
    return aged


async def expire_locks(redis: aioredis.Redis, prefix: str = "t") -> int:
    """Let the card locks a killed process held expire now, as they do after LOCK_TTL_MS."""
    locks = await redis.keys("{" + prefix + "*:ext:slack-lock:*")
    for key in locks:
        await redis.pexpire(key, 1)
    return len(locks)
