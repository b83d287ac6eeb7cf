"""Several agents in one deployment: AGENTS, load_agents, and the workers' presence."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from agent_core import Agent, ConfigError, Gateway, Keys, RunStatus, Settings
from agent_core import presence as presence_mod
from agent_core.examples import billing as billing_example
from agent_core.presence import announce, check, live_workers, other_prefixes, presence_key
from agent_core.settings import load_agents, parse_agents
from agent_core.testing import FakeOpenAI, call, reply
from agent_core.worker import Worker
from tests.agents import ops
from tests.core.conftest import core_settings
from tests.core.workers import WorkerProcess

BILLING = "agent_core.examples.billing:agent"
OPS = "tests.agents:ops"
ALIASES = {
    str(f.validation_alias).upper()
    for f in Settings.model_fields.values()
    if f.validation_alias is not None
}

# Agents the name checks import (load_agent imports them by path from this module).
ops_twin = Agent(name="test-ops", instructions="Another agent with the same name.")
ops_upper = Agent(name="TEST-OPS", instructions="Differs only in case.")
spaced = Agent(name="my ops", instructions="A name with a space.")
_inner = Agent(name="billing", instructions="Not the example's billing agent.")
calls_a_billing = Agent(name="front", instructions="Calls a sub-agent.", tools=[_inner])
not_an_agent = "just a string"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper() in ALIASES:
            monkeypatch.delenv(name)


def settings(**env: Any) -> Settings:
    return Settings.from_env(REDIS_URL="redis://127.0.0.1:1/0", **env)


# --------------------------------------------------------------------------- AGENTS
def test_agents_is_parsed_with_whitespace_and_the_first_is_the_default() -> None:
    s = settings(AGENTS=f" {OPS} ,\t{BILLING}, ")
    assert s.agents == [OPS, BILLING]
    assert s.agents_variable == "AGENTS"
    assert [a.name for a in load_agents(s)] == ["test-ops", "billing"]
    assert parse_agents("a.b:c") == ["a.b:c"]


def test_agent_alone_still_works_and_is_the_default() -> None:
    assert settings().agents == ["agent_core.examples.ops:agent"]
    s = settings(AGENT=OPS)
    assert (s.agents, s.agents_variable) == ([OPS], "AGENT")
    assert load_agents(s) == [ops]


def test_agent_and_agents_together_is_one_line_naming_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENT", OPS)
    monkeypatch.setenv("AGENTS", BILLING)
    with pytest.raises(ConfigError) as info:
        Settings.from_env(REDIS_URL="redis://127.0.0.1:1/0")
    assert str(info.value) == (
        "AGENT and AGENTS are both set: set only one (AGENTS lists every agent, the first "
        "being the default; AGENT names a single agent)"
    )
    monkeypatch.setenv("AGENT", "")  # empty is unset
    assert Settings.from_env(REDIS_URL="redis://127.0.0.1:1/0").agents == [BILLING]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (f"{OPS},sk-secret value", "entry 2 is not package.module:attribute"),
        (f"{OPS}, {BILLING},{OPS}", "entry 3 repeats entry 1"),
        (" , ,", "lists no agent"),
    ],
)
def test_a_bad_agents_value_is_one_line_that_never_echoes_it(value: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings(AGENTS=value)
    assert str(info.value) == (
        f"AGENTS is invalid: {why} — the agents to run, comma-separated "
        "package.module:attribute paths (the first is the default); instead of AGENT"
    )
    assert "secret" not in str(info.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            f"{OPS},nope.mod:x",
            "AGENTS is invalid: no module named 'nope.mod' (in AGENTS: nope.mod:x). The worker",
        ),
        (
            f"{OPS},tests.core.test_agents:missing",
            "AGENTS is invalid: module 'tests.core.test_agents' has no attribute 'missing' "
            "(in AGENTS: tests.core.test_agents:missing)",
        ),
        (
            "tests.core.test_agents:not_an_agent",
            "AGENTS is invalid: 'tests.core.test_agents:not_an_agent' is a str, not an Agent",
        ),
        (
            f"{OPS},tests.core.test_agents:ops_twin",
            "AGENTS is invalid: tests.agents:ops and tests.core.test_agents:ops_twin are two "
            "different agents named 'test-ops'; give each agent its own name",
        ),
        (
            f"{OPS},tests.core.test_agents:ops_upper",
            "AGENTS is invalid: tests.agents:ops and tests.core.test_agents:ops_upper differ "
            "only in case; give each agent its own name",
        ),
        (
            f"{OPS},tests.core.test_agents:spaced",
            "AGENTS is invalid: the agent of tests.core.test_agents:spaced is named 'my ops'; "
            "`/agent <name> <task>` picks an agent by one word",
        ),
        (
            f"{BILLING},tests.core.test_agents:calls_a_billing",
            "AGENTS is invalid: two different agents are named 'billing' "
            "(agent_core.examples.billing:agent and a sub-agent of "
            "tests.core.test_agents:calls_a_billing); give each agent its own name",
        ),
    ],
)
def test_load_agents_errors_name_agents_in_one_line(value: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_agents(settings(AGENTS=value))
    message = str(info.value)
    assert message.startswith(expected), message
    assert "\n" not in message


def test_with_agent_the_errors_still_name_agent() -> None:
    with pytest.raises(ConfigError, match=r"^AGENT is invalid: no module named 'nope'"):
        load_agents(settings(AGENT="nope:x"))
    assert load_agents(settings(AGENT="tests.core.test_agents:spaced"))[0].name == "my ops"


def test_the_billing_example_is_self_contained() -> None:
    agent = billing_example.agent
    assert agent.description and agent.name == "billing"
    assert agent.tool_names() == ["get_invoice", "refund"]
    look, refund = agent.get_tool("get_invoice"), agent.get_tool("refund")
    assert look is not None and refund is not None
    assert not agent.requires_approval(look, {"order_id": "7"})
    assert agent.requires_approval(refund, {})


# --------------------------------------------------------------------------- presence
@pytest.fixture
async def workers(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> AsyncIterator[Callable[..., Worker]]:
    """``workers(agents, **settings)``: a Worker task of this loop, stopped at teardown."""
    client = AsyncOpenAI(api_key="sk-test-not-a-secret", base_url=fake_openai.base_url)
    running: list[tuple[Worker, asyncio.Task[None]]] = []

    def start(agents: Sequence[Agent], **overrides: object) -> Worker:
        s = core_settings(redis_url, fake_openai.base_url, **overrides)
        w = Worker(redis, list(agents), client, s)
        running.append((w, asyncio.create_task(w.run())))
        return w

    yield start
    for w, _ in running:
        w.stop()
    for _, t in running:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(t, 10)
    await client.close()


async def until(probe: Callable[[], object], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not await probe():  # type: ignore[misc]
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_a_worker_announces_itself_with_every_agent_it_serves(
    redis: Redis, workers: Callable[..., Worker]
) -> None:
    keys = Keys("t")
    report = await check(redis, keys, ["test-ops", "billing"])
    assert report.alive == 0 and report.missing_agents == ["test-ops", "billing"]
    assert report.problem is not None and "no worker is alive under KEY_PREFIX=t" in report.problem
    w = workers([ops, calls_a_billing])

    async def seen() -> bool:
        return bool(await live_workers(redis, keys))

    await until(seen)
    [me] = await live_workers(redis, keys)
    assert me.name == w.name and me.shards == 16
    assert me.agents == ("billing", "front", "test-ops"), "sub-agents are served too"
    assert me.seen_at >= me.started_at > 0
    report = await check(redis, keys, ["test-ops", "billing", "ledger"])
    assert report.missing_agents == ["ledger"]
    assert report.problem == (
        "no live worker serves the agent ledger: its runs fail. Add it to AGENTS on the workers"
    )
    assert report.as_dict()["agents"] == ["billing", "front", "test-ops"]
    ttl = await redis.pttl(presence_key(keys))
    assert 0 < ttl <= 31_000, "the hash expires when no worker refreshes it"
    # Housekeeping refreshes it, keeping started_at.
    await w.housekeeping()
    [again] = await live_workers(redis, keys)
    assert again.started_at == me.started_at and again.seen_at >= me.seen_at


async def test_a_stopped_worker_withdraws_at_once(
    redis: Redis, workers: Callable[..., Worker]
) -> None:
    keys = Keys("t")
    w = workers([ops])

    async def seen() -> bool:
        return bool(await live_workers(redis, keys))

    await until(seen)
    task = next(t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "Worker.run")
    w.stop()
    await asyncio.wait_for(task, 15)
    assert await live_workers(redis, keys) == [], "gone without waiting to go stale"


async def test_stale_workers_are_ignored_then_pruned(redis: Redis) -> None:
    keys = Keys("t")
    assert await announce(redis, keys, "quick", ["a"], every=0.1)
    assert [w.name for w in await live_workers(redis, keys)] == ["quick"]
    await redis.hset(presence_key(keys), "garbage", "{not json")
    await asyncio.sleep(0.4)  # more than 3 intervals of 0.1 s
    assert await live_workers(redis, keys) == []
    assert await announce(redis, keys, "slow", ["b"], every=10)
    assert await redis.hkeys(presence_key(keys)) == ["slow"], "stale and garbage pruned"
    dead = Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
    try:
        assert not await announce(dead, keys, "x", ["a"], every=1), "never raises"
    finally:
        await dead.aclose()


async def test_shards_and_prefix_mismatches_are_named(
    redis: Redis, workers: Callable[..., Worker]
) -> None:
    workers([ops], KEY_PREFIX="foo")
    web = Keys("bar")

    async def elsewhere() -> bool:
        return await other_prefixes(redis, web) == ["foo"]

    await until(elsewhere)
    report = await check(redis, web, ["test-ops"])
    assert report.other_prefixes == ["foo"]
    assert report.problem == (
        "no worker is alive under KEY_PREFIX=bar: runs stay queued until one starts. Check "
        "that the workers run, and that they and this process use the same KEY_PREFIX and "
        "REDIS_URL (workers found under KEY_PREFIX=foo; this process uses KEY_PREFIX=bar)"
    )
    assert (await check(redis, web, look_elsewhere=False)).other_prefixes == []
    foo16 = Keys("foo", 32)
    report = await check(redis, foo16, ["test-ops"])
    assert report.other_shards == [16]
    assert report.problem is not None and report.problem.startswith(
        "workers use SHARDS=16 but this process uses SHARDS=32"
    )
    assert report.as_dict()["shards"] == [16]


async def test_prefix_of_reads_only_presence_keys() -> None:
    assert presence_mod.prefix_of("{agw}:ext:presence:workers") == "agw"
    assert presence_mod.prefix_of("{agw:3}:ext:presence:workers") is None
    assert presence_mod.prefix_of("{agw}:ext:lock:x") is None


# --------------------------------------------------------------------------- runs
async def test_a_worker_runs_each_agent_with_its_own_instructions_and_tools(
    redis: Redis, workers: Callable[..., Worker], fake_openai: FakeOpenAI
) -> None:
    workers([ops, billing_example.agent])
    gw = Gateway(redis, Keys("t"), agent_name="test-ops")
    fake_openai.script("invoice 8", [call("get_invoice", {"order_id": "8"}), reply("open")])
    fake_openai.script("look k", [call("lookup", {"key": "k"}), reply("found")])
    billing = await gw.start_run("invoice 8", requested_by="U1", agent="billing")
    default = await gw.start_run("look k", requested_by="U1")
    assert (await gw.wait(billing.run_id, timeout=10)).final == "open"
    assert (await gw.wait(default.run_id, timeout=10)).final == "found"
    [first, *_] = fake_openai.requests_for("invoice 8")
    assert first["messages"][0]["content"] == billing_example.agent.instructions
    assert [t["function"]["name"] for t in first["tools"]] == ["get_invoice", "refund"]
    [first, *_] = fake_openai.requests_for("look k")
    assert first["messages"][0]["content"] == ops.instructions


async def test_a_run_of_an_agent_no_worker_serves_fails_with_a_clear_error(
    redis: Redis, workers: Callable[..., Worker]
) -> None:
    workers([ops])
    gw = Gateway(redis, Keys("t"), agent_name="test-ops")
    run = await gw.start_run("refund order 7", requested_by="U1", agent="billing")
    done = await gw.wait(run.run_id, timeout=10)
    assert done.status is RunStatus.FAILED
    assert done.error is not None and "no agent named 'billing'" in done.error
    assert "AGENTS" in done.error


async def test_the_worker_process_serves_every_agent_of_agents(
    redis: Redis,
    redis_url: str,
    fake_openai: FakeOpenAI,
    spawn: Callable[..., WorkerProcess],
) -> None:
    p = spawn(redis_url, AGENT="", AGENTS=f"{OPS}, {BILLING}")
    keys = Keys("t")

    async def announced() -> bool:
        assert p.proc.poll() is None, p.output()
        return bool(await live_workers(redis, keys))

    await until(announced, timeout=30)
    [w] = await live_workers(redis, keys)
    assert w.agents == ("billing", "test-ops")
    fake_openai.script("invoice 7", [call("get_invoice", {"order_id": "7"}), reply("paid")])
    gw = Gateway(redis, keys)
    run = await gw.start_run("invoice 7", requested_by="U1", agent="billing")
    assert (await gw.wait(run.run_id, timeout=15)).final == "paid"
    assert p.stop() == 0
    assert "serving agents 'test-ops', 'billing'" in p.output()
    assert "one Redis, 16 shards, uvloop)" in p.output(), p.output()


def test_the_worker_process_refuses_agent_and_agents_together(
    redis_url: str, fake_openai: FakeOpenAI, spawn: Callable[..., WorkerProcess]
) -> None:
    p = spawn(redis_url, AGENTS=f"{OPS},{BILLING}")  # worker_env sets AGENT too
    p.proc.wait(30)
    assert p.stop() == 2
    out = p.output()
    assert out.strip() == (
        "config error: AGENT and AGENTS are both set: set only one (AGENTS lists every agent, "
        "the first being the default; AGENT names a single agent)"
    )
