"""Shared fixtures: a real Redis and a scripted fake OpenAI server.

Redis: one private ``redis-server`` per test session on a free port (or the server named by
``TEST_REDIS_URL``, which is then FLUSHDB'ed before each test: give it a db of its own).
Each test gets a clean database. ``aof_redis`` makes private append-only servers for crash
and restart tests.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import Protocol

import pytest
import redis as redis_sync
import redis.asyncio as redis_asyncio

from agent_core.testing import FakeOpenAI
from tests.redis_server import ExternalRedis, RedisServer


class RedisServerFactory(Protocol):
    """``aof_redis(appendonly=True) -> RedisServer``: a started private server."""

    def __call__(self, *, appendonly: bool = True) -> RedisServer: ...


# --------------------------------------------------------------------------- Redis
@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | ExternalRedis]:
    """The session's Redis: a private ``redis-server``, or ``TEST_REDIS_URL`` when set."""
    external = os.environ.get("TEST_REDIS_URL")
    if external:
        yield ExternalRedis(external)
        return
    server = RedisServer(appendonly=False)
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_url(redis_server: RedisServer | ExternalRedis) -> str:
    """The URL of the session's Redis, its database flushed for this test."""
    client = redis_sync.Redis.from_url(redis_server.url)
    try:
        client.flushdb()
    finally:
        client.close()
    return redis_server.url


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[redis_asyncio.Redis]:
    """An asyncio client (``decode_responses=True``) on a clean database."""
    client = redis_asyncio.Redis.from_url(redis_url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def aof_redis() -> Iterator[RedisServerFactory]:
    """A factory of private append-only servers (``appendfsync always``), one per call.

    Each server can be ``kill()``-ed and ``start()``-ed again on the same port and directory;
    all are stopped and their directories removed at teardown.
    """
    servers: list[RedisServer] = []

    def make(*, appendonly: bool = True) -> RedisServer:
        server = RedisServer(appendonly=appendonly)
        servers.append(server)
        return server.start()

    try:
        yield make
    finally:
        for server in servers:
            server.close()


# --------------------------------------------------------------------------- OpenAI
@pytest.fixture(scope="session")
def fake_openai_server() -> Iterator[FakeOpenAI]:
    """The session's :class:`FakeOpenAI` server (use ``fake_openai`` in tests)."""
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture
def fake_openai(fake_openai_server: FakeOpenAI) -> Iterator[FakeOpenAI]:
    """The fake OpenAI server, reset for this test.

    The test fails at teardown if the server saw an unexpected request (``fake.errors``).
    """
    fake_openai_server.reset()
    yield fake_openai_server
    errors = fake_openai_server.errors
    fake_openai_server.reset()
    fail_on_fake_openai_errors(errors)


def fail_on_fake_openai_errors(errors: list[str]) -> None:
    """Fail the current test when the fake OpenAI server recorded unexpected requests."""
    if errors:
        pytest.fail(
            f"FakeOpenAI saw {len(errors)} unexpected request(s):\n" + "\n---\n".join(errors),
            pytrace=False,
        )


# --------------------------------------------------------------------------- reports
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Captured output with lone surrogates (the fuzz tests send ``\\ud800``, and Bolt logs
    the callback ids it has no listener for) is escaped, so that the report can be sent as
    UTF-8 (pytest-xdist's workers send every report to the controller)."""
    report.sections = [
        (name, text.encode("utf-8", "backslashreplace").decode("utf-8"))
        for name, text in report.sections
    ]


# --------------------------------------------------------------------------- order
# `make test` runs `-n 2 --dist loadfile`: a file runs whole on one worker, and the files are
# handed out in collection order (with --no-loadscope-reorder; xdist's default puts the files
# with the most tests first, so the few long ones, such as tests/test_wheel.py, came last and
# the other worker idled for most of their minute). The longest files go first, longest first
# (measured with `--durations`), so that the short ones fill the end; the others keep their
# order.
LONGEST_FILES = (
    "tests/test_commands.py",
    "tests/test_wheel.py",
    "tests/cluster/test_failover_bound.py",
    "tests/core/test_audit_cli.py",
    "tests/playground/test_browser_approvals.py",
    "tests/playground/test_browser.py",
    "tests/bot/test_layout.py",
    "tests/cluster/test_slack_on_cluster.py",
    "tests/security/test_secrets.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: n for n, path in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
