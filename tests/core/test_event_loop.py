"""The processes' event loop: uvloop by default where installed, asyncio on request, and a
clear error when uvloop is asked for and missing."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

from agent_core import ConfigError, Gateway, Keys
from agent_core.event_loop import loop_factory, run, running_loop_name
from agent_core.testing import FakeOpenAI, reply
from tests.core.workers import WorkerProcess


async def loop_name() -> str:
    await asyncio.sleep(0)
    return running_loop_name()


def test_auto_runs_on_uvloop_where_it_is_installed() -> None:
    # uvloop is a dependency on Linux (pyproject.toml), so this machine has it.
    assert loop_factory("auto")[0] == "uvloop"
    assert run(loop_name()) == "uvloop"
    assert run(loop_name(), "uvloop") == "uvloop"


def test_asyncio_on_request() -> None:
    assert run(loop_name(), "asyncio") == "asyncio"


def test_without_uvloop_auto_falls_back_and_uvloop_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert run(loop_name(), "auto") == "asyncio"
    coro = loop_name()
    with pytest.raises(ConfigError) as err:
        run(coro, "uvloop")
    assert str(err.value).startswith("EVENT_LOOP: uvloop is not installed")
    assert coro.cr_frame is None, "the coroutine was closed, not left unawaited"


async def test_a_worker_process_on_asyncio_serves_a_run(
    redis: Redis,
    redis_url: str,
    fake_openai: FakeOpenAI,
    spawn: Callable[..., WorkerProcess],
) -> None:
    p = spawn(redis_url, EVENT_LOOP="asyncio")
    fake_openai.script("hello", [reply("hi there")])
    gw = Gateway(redis, Keys("t"))
    run_ = await gw.start_run("hello", requested_by="U1")
    assert (await gw.wait(run_.run_id, timeout=30)).final == "hi there"
    assert p.stop() == 0
    assert "16 shards, asyncio)" in p.output(), p.output()
