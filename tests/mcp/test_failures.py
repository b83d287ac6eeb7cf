"""MCP servers that die, are not there yet, or change their tools while the worker runs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from agent_core import Agent, RunStatus
from agent_core.testing import FakeOpenAI, call, calls, reply
from agent_mcp import MCPServerHTTP
from tests.core.harness import Harness
from tests.mcp.conftest import ItemsServer, effects, kill9, server_pids, stdio_items
from tests.mcp.test_flow import offered, told

RunAgent = Callable[[Agent], Awaitable[Harness]]


async def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not check():
        if loop.time() > end:
            raise AssertionError(f"not true within {timeout} s")
        await asyncio.sleep(0.02)


async def lookup_works(h: Harness, fake: FakeOpenAI, task: str, expected: str) -> None:
    fake.script(task, [call("lookup", {"key": "k"}), reply("found")])
    run = await h.gateway.start_run(task, requested_by="U1")
    done = await h.wait_finished(run.run_id)
    assert done.status is RunStatus.COMPLETED
    assert told(fake, task) == [expected]


def worker_alive(h: Harness) -> bool:
    return all(not task.done() for _, task in h.workers)


async def test_stdio_server_killed_mid_call_is_a_tool_error_and_is_respawned(
    run_agent: RunAgent, fake_openai: FakeOpenAI, journal: Path
) -> None:
    items = stdio_items("items", journal)
    h = await run_agent(Agent(name="ops", instructions="Manage items.", toolsets=[items]))
    fake_openai.script("nap", [call("slow", {"seconds": 30}), reply("It broke.")])
    run = await h.gateway.start_run("nap", requested_by="U1")
    await eventually(lambda: "slow:start" in effects(journal))
    [first] = server_pids(journal)
    kill9(first)

    done = await h.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "It broke.")
    assert told(fake_openai, "nap") == [
        "Error: the tool slow failed: MCPConnectionError: the connection to MCP server "
        "'items' broke before it answered (Connection closed); the call may or may not have "
        "taken effect on the server"
    ]
    assert worker_alive(h)
    # The next call goes to a new server process, started by the toolset.
    await lookup_works(h, fake_openai, "look", "items: value of k")
    assert len(server_pids(journal)) == 2 and server_pids(journal)[0] == first


async def test_http_server_killed_mid_call_then_down_then_back(
    run_agent: RunAgent,
    fake_openai: FakeOpenAI,
    journal: Path,
    http_items: Callable[..., ItemsServer],
) -> None:
    server = http_items("http")
    items = MCPServerHTTP("items", server.url, connect_timeout=2)
    h = await run_agent(Agent(name="ops", instructions="Manage items.", toolsets=[items]))
    fake_openai.script("nap", [call("slow", {"seconds": 30}), reply("It broke.")])
    run = await h.gateway.start_run("nap", requested_by="U1")
    await eventually(lambda: "slow:start" in effects(journal))
    server.kill()

    done = await h.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "It broke.")
    [broke] = told(fake_openai, "nap")
    assert broke.startswith(
        "Error: the tool slow failed: MCPConnectionError: the connection to MCP server 'items' "
        "broke before it answered ("
    )
    assert broke.endswith("); the call may or may not have taken effect on the server")
    # While it is down, a call is a clear error and the worker goes on.
    await lookup_works(
        h,
        fake_openai,
        "look while down",
        "Error: the tool lookup failed: MCPConnectionError: cannot reach MCP server 'items' "
        "(ConnectError: All connection attempts failed); the call was not sent",
    )
    assert worker_alive(h)
    server.start()  # the same port
    await lookup_works(h, fake_openai, "look when back", "items: value of k")


async def test_a_server_down_when_the_worker_starts_is_listed_once_it_is_up(
    run_agent: RunAgent,
    fake_openai: FakeOpenAI,
    journal: Path,
    http_items: Callable[..., ItemsServer],
) -> None:
    server = http_items("http")
    server.kill()
    items = MCPServerHTTP("items", server.url, connect_timeout=2)
    h = await run_agent(Agent(name="ops", instructions="Manage items.", toolsets=[items]))
    fake_openai.script("hello", [reply("hi")])
    run = await h.gateway.start_run("hello", requested_by="U1")
    done = await h.wait_finished(run.run_id)  # open() did not raise: the worker serves
    assert (done.status, done.final) == (RunStatus.COMPLETED, "hi")
    assert offered(fake_openai, "hello") == {}
    assert items.version == 0

    server.start()  # retried in the background
    await eventually(lambda: items.version == 1)
    await lookup_works(h, fake_openai, "look", "items: value of k")
    assert "lookup" in offered(fake_openai, "look")


@pytest.mark.parametrize(("era", "protocol"), [("modern", "2026-07-28"), ("legacy", "2025-11-25")])
async def test_tool_list_is_refreshed_when_the_server_says_it_changed(
    run_agent: RunAgent, fake_openai: FakeOpenAI, journal: Path, era: str, protocol: str
) -> None:
    items = stdio_items("items", journal, *(["--legacy"] if era == "legacy" else []))
    agent = Agent(name="ops", instructions="Manage items.", toolsets=[items])
    h = await run_agent(agent)
    fake_openai.script("grow", [call("grow", {"name": "shout"}), reply("added")])
    run = await h.gateway.start_run("grow", requested_by="U1")
    await h.wait_finished(run.run_id)
    assert "shout" not in offered(fake_openai, "grow")
    assert told(fake_openai, "grow") == ["added shout"]

    await eventually(lambda: "shout" in agent.tool_names())
    assert items.version == 2
    fake_openai.script(
        "use it",
        [calls([("shout", {"text": "hi"}), ("environment", {})]), reply("ok")],
    )
    run = await h.gateway.start_run("use it", requested_by="U1")
    await h.wait_finished(run.run_id)
    assert offered(fake_openai, "use it")["shout"]["description"] == "Echo the text."
    echoed, env = told(fake_openai, "use it")
    assert echoed == "echo: hi"
    assert json.loads(env)["protocol"] == protocol
