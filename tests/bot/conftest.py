"""Fixtures for the Slack bot: a fake Slack, the bot's web server in-process, a worker.

The bot runs for real (aiohttp server on a free port, Bolt, the notifier consuming the
events stream); requests reach it signed, over HTTP, as Slack sends them. The worker is the
core's, in-process, against the fake OpenAI server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from redis.asyncio import Redis

from agent_core import Agent, Gate, Gateway, Keys, Run, Settings
from agent_core.examples.billing import agent as billing
from agent_core.testing import FakeOpenAI
from agent_core.worker import Worker
from bot.server import BotServer
from bot.settings import BotSettings, load_settings
from tests.agents import ops
from tests.core.harness import Harness
from tests.slack_fake import FakeSlack, SlackClient

SIGNING_SECRET = "test-signing-secret-not-real"
APPROVER = "U0APPROVER"
APPROVER2 = "U0BOSS"
REQUESTER = "U0REQ"
STRANGER = "U0NOBODY"
GROUP = "S0GROUP"
GROUP_MEMBER = "U0INGROUP"
CHANNEL = "C0CHAN"
PREFIX = "t"


@pytest.fixture(scope="session")
def fake_slack_server() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        yield fake


@pytest.fixture
def fake_slack(fake_slack_server: FakeSlack) -> Iterator[FakeSlack]:
    """The fake Slack Web API, reset for this test; the approver group holds GROUP_MEMBER."""
    fake_slack_server.reset()
    fake_slack_server.set_usergroup(GROUP, [GROUP_MEMBER])
    yield fake_slack_server
    fake_slack_server.reset()


@pytest.fixture(autouse=True)
def _hermetic_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("SLACK_") or name in (
            "APPROVERS",
            "ALLOW_SELF_APPROVAL",
            "ALLOW_EXTERNAL_APPROVERS",
            "SLASH_COMMAND",
        ):
            monkeypatch.delenv(name)


def bot_settings(fake: FakeSlack, **overrides: Any) -> BotSettings:
    values: dict[str, Any] = {
        "SLACK_BOT_TOKEN": fake.token,
        "SLACK_SIGNING_SECRET": SIGNING_SECRET,
        "SLACK_API_URL": fake.base_url,
        "APPROVERS": f"{APPROVER},{APPROVER2},{GROUP}",
        "SLACK_MAX_RETRIES": 3,
    }
    values.update(overrides)
    return load_settings(**values)


def core_settings(redis_url: str, base_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "REDIS_URL": redis_url,
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": "sk-test-not-a-secret",
        "OPENAI_MODEL": "fake-model",
        "OPENAI_MAX_RETRIES": 2,
        "KEY_PREFIX": PREFIX,
        "APPROVAL_TIMEOUT": 30,
        "WORKER_LEASE": 1.0,
        "SWEEP_INTERVAL": 0.05,
    }
    values.update(overrides)
    return Settings.from_env(**values)


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file the test agent's tools append to: one line per side effect."""
    path = tmp_path / "journal.txt"
    monkeypatch.setenv("TEST_JOURNAL", str(path))
    return path


def journal_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


class BotHarness:
    """The bot (in-process web server + notifier), optionally with a worker."""

    def __init__(self, redis: Redis, fake: FakeSlack, settings: BotSettings) -> None:
        self.redis = redis
        self.fake = fake
        self.settings = settings
        self.keys = Keys(PREFIX)
        self.gateway = Gateway(redis, self.keys, agent_name=ops.name)
        self.server = BotServer(
            settings,
            redis,
            self.gateway,
            host="127.0.0.1",
            port=0,
            notifier_consumer="web-test",
            notifier_block_ms=100,
        )
        self.core: Harness | None = None
        self.slack: SlackClient | None = None

    async def start(self) -> BotHarness:
        await self.server.start()
        self.slack = SlackClient(
            self.server.url + "/slack/events",
            SIGNING_SECRET,
            command=self.settings.slash_command,
            fake=self.fake,
        )
        return self

    def start_worker(self, redis_url: str, openai_url: str, **overrides: Any) -> Harness:
        self.core = Harness(self.redis, core_settings(redis_url, openai_url, **overrides), ops)
        self.core.start_worker()
        return self.core

    async def close(self) -> None:
        await self.server.stop()
        if self.core is not None:
            await self.core.close()

    # --- helpers ----------------------------------------------------------------------
    @property
    def client(self) -> SlackClient:
        assert self.slack is not None
        return self.slack

    async def start_task(self, task: str, user_id: str = REQUESTER) -> str:
        """``/agent <task>``; waits for the root message and returns the run id."""
        resp = await self.client.command(task, user_id=user_id, channel_id=CHANNEL)
        assert resp.status == 200, resp.text

        async def started() -> list[Run]:
            runs = await self.gateway.runs_for_user(user_id, limit=50)
            return [r for r in runs if r.task == task]

        runs: list[Run] = await wait_until(started)
        return runs[0].run_id

    async def gate_of(self, run_id: str, timeout: float = 10.0) -> Gate:
        """The first gate of the run, once its card is on Slack."""

        async def card_posted() -> Gate | None:
            gates = await self.gateway.pending_gates(run_id) or await self._all_gates(run_id)
            for g in gates:
                if await self.redis.hget(
                    self.keys.ext("slack-card", g.gate_id, self.keys.shard_of(g.gate_id)), "ts"
                ):
                    return g
            return None

        try:
            gate: Gate = await wait_until(card_posted, timeout=timeout)
        except AssertionError:
            # What a person would look at: the run, its gates, and Slack's recent answers.
            run = await self.gateway.get_run(run_id)
            gates = await self._all_gates(run_id)
            calls = [(c.method, c.status, c.response.get("error")) for c in self.fake.calls[-15:]]
            raise AssertionError(
                f"no card for run {run_id} within {timeout} s: run {run!r}; gates {gates!r}; "
                f"last Slack calls {calls}"
            ) from None
        return gate

    async def _all_gates(self, run_id: str) -> list[Gate]:
        return await self.gateway.gates(run_id)

    async def card(self, gate_id: str) -> Any:
        """The gate's card as the fake Slack shows it now."""
        h = await self.redis.hgetall(
            self.keys.ext("slack-card", gate_id, self.keys.shard_of(gate_id))
        )
        assert h, f"no card for gate {gate_id}"
        msg = self.fake.message(h["channel"], h["ts"])
        assert msg is not None
        return msg

    async def wait_card(self, gate_id: str, needle: str, timeout: float = 10.0) -> Any:
        """Wait until the card's blocks contain ``needle``; returns the message."""

        async def has() -> Any:
            msg = await self.card(gate_id)
            return msg if needle in str(msg.blocks) else None

        try:
            return await wait_until(has, timeout=timeout)
        except AssertionError:
            msg = await self.card(gate_id)
            raise AssertionError(f"card never showed {needle!r}; it shows {msg.blocks}") from None


async def notifier_ready(bot: BotHarness) -> None:
    """Wait until the notifier's group exists on every shard's events stream."""
    streams = [bot.keys.events(s) for s in bot.keys.all_shards()]

    async def ready() -> bool:
        return int(await bot.redis.exists(*streams)) == len(streams)

    await wait_until(ready)


async def wait_until(
    probe: Callable[[], Awaitable[Any]], timeout: float = 10.0, interval: float = 0.02
) -> Any:
    """Poll ``probe`` until it returns something truthy."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if loop.time() > end:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


Workers = Callable[..., Worker]


@pytest.fixture
async def make_bot(
    redis: Redis, fake_slack: FakeSlack
) -> AsyncIterator[Callable[..., Awaitable[BotHarness]]]:
    """``await make_bot(**setting_overrides)``: a started bot, stopped at teardown."""
    made: list[BotHarness] = []

    async def make(**overrides: Any) -> BotHarness:
        h = BotHarness(redis, fake_slack, bot_settings(fake_slack, **overrides))
        made.append(h)
        return await h.start()

    yield make
    for h in reversed(made):
        await h.close()


@pytest.fixture
async def bot(make_bot: Callable[..., Awaitable[BotHarness]]) -> BotHarness:
    return await make_bot()


@pytest.fixture
async def workers(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> AsyncIterator[Workers]:
    """``workers(agents, **settings)``: a Worker task of this loop, stopped at teardown."""
    client = AsyncOpenAI(api_key="sk-test-not-a-secret", base_url=fake_openai.base_url)
    running: list[tuple[Worker, asyncio.Task[None]]] = []

    def start(agents: Sequence[Agent], **overrides: Any) -> Worker:
        w = Worker(
            redis, list(agents), client, core_settings(redis_url, fake_openai.base_url, **overrides)
        )
        running.append((w, asyncio.create_task(w.run())))
        return w

    yield start
    for w, _ in running:
        w.stop()
    for _, t in running:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(t, 10)
    await client.close()


@pytest.fixture
async def make_multi(
    redis: Redis, fake_slack: FakeSlack
) -> AsyncIterator[Callable[..., Awaitable[BotHarness]]]:
    """``await make_multi(agents=[ops, billing], **server_kwargs)``: a started bot whose
    ``/agent`` picks among ``agents``."""
    made: list[BotHarness] = []

    async def make(agents: Sequence[Agent] = (ops, billing), **kwargs: Any) -> BotHarness:
        h = BotHarness(redis, fake_slack, bot_settings(fake_slack))
        h.server = BotServer(
            h.settings,
            redis,
            h.gateway,
            host="127.0.0.1",
            port=0,
            notifier_consumer="web-test",
            notifier_block_ms=100,
            agents=agents,
            **kwargs,
        )
        made.append(h)
        return await h.start()

    yield make
    for h in reversed(made):
        await h.close()


@pytest.fixture
async def live(
    bot: BotHarness, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> BotHarness:
    """The bot plus an in-process worker on the fake OpenAI server."""
    bot.start_worker(redis_url, fake_openai.base_url)
    return bot
