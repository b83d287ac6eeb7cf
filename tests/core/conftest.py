from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from agent_core import Agent, Settings
from agent_core.testing import FakeOpenAI
from tests.agents import ops
from tests.core.harness import Harness
from tests.core.workers import WorkerProcess, worker_env


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "journal.txt"
    monkeypatch.setenv("TEST_JOURNAL", str(path))
    return path


def core_settings(redis_url: str, base_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "REDIS_URL": redis_url,
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": "sk-test-not-a-secret",
        "OPENAI_MODEL": "fake-model",
        "OPENAI_MAX_RETRIES": 2,
        "KEY_PREFIX": "t",
        "APPROVAL_TIMEOUT": 30,
        "WORKER_LEASE": 1.0,
        "SWEEP_INTERVAL": 0.05,
    }
    values.update(overrides)
    return Settings.from_env(**values)


@pytest.fixture
async def agent_harness(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> AsyncIterator[Callable[[Agent], Harness]]:
    """``agent_harness(agent)``: a harness whose in-process worker serves ``agent`` on the
    fake model; every one made is closed at teardown."""
    made: list[Harness] = []

    def make(agent: Agent) -> Harness:
        h = Harness(redis, core_settings(redis_url, fake_openai.base_url), agent)
        made.append(h)
        h.start_worker()
        return h

    try:
        yield make
    finally:
        for h in reversed(made):
            await h.close()


@pytest.fixture
async def harness(agent_harness: Callable[[Agent], Harness]) -> Harness:
    return agent_harness(ops)


@pytest.fixture
def spawn(
    tmp_path: Path, fake_openai: FakeOpenAI, journal: Path
) -> Iterator[Callable[..., WorkerProcess]]:
    """Start real ``python -m agent_core.worker`` processes; all are SIGKILLed at teardown."""
    procs: list[WorkerProcess] = []

    def make(redis_url: str, **extra: str) -> WorkerProcess:
        env = worker_env(redis_url, fake_openai.base_url, journal, **extra)
        p = WorkerProcess(env, tmp_path / f"worker{len(procs)}.log")
        procs.append(p)
        return p

    yield make
    for p in procs:
        if p.proc.poll() is None:
            p.kill()


@pytest.fixture
async def observer(redis: Redis, redis_url: str, fake_openai: FakeOpenAI) -> AsyncIterator[Harness]:
    """A gateway and event reader with no worker of its own."""
    h = Harness(redis, core_settings(redis_url, fake_openai.base_url), ops)
    yield h
    await h.close()
