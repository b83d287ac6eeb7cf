"""Reminders and escalation in the core: the options, FIRE_NUDGE, and the sweeper firing each
step once (two sweepers at once, a worker restarted), never after a decision."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

import pytest
from redis.asyncio import Redis

from agent_core import (
    Agent,
    ConfigError,
    Gate,
    GateStatus,
    Keys,
    Settings,
    ToolDefinitionError,
    tool,
)
from agent_core.nudges import Nudges, NudgeSweeper
from agent_core.runner import Runner
from agent_core.script_replies import NudgeOutcome
from agent_core.testing import FakeOpenAI, call, reply
from tests.core.conftest import core_settings
from tests.core.harness import Harness
from tests.core.test_promises import take_lease


@tool(requires_approval=True, remind_after=0.4, escalate_after=0.8, escalate_to="S0LEADS, U0BOSS")
def drop_table(name: str) -> str:
    """Drop a table."""
    return f"dropped {name}"


@tool(requires_approval=True)
def restart(service: str) -> str:
    """Restart a service (its agent's and the settings' nudges apply)."""
    return f"restarted {service}"


@tool(requires_approval=True, remind_after=0)
def quiet(service: str) -> str:
    """Never reminded (0: off), whatever the agent says."""
    return f"quiet {service}"


dba = Agent(name="dba", instructions="x", tools=[drop_table, restart, quiet], remind_after=20)


def nudge_settings(redis_url: str, base_url: str, **extra: object) -> Settings:
    return core_settings(redis_url, base_url, APPROVAL_TIMEOUT=30, **extra)


async def open_gate(h: Harness, fake: FakeOpenAI, task: str, tool_name: str = "drop_table") -> Gate:
    fake.script(
        task,
        [
            call(tool_name, {"name": "users"} if tool_name == "drop_table" else {"service": "db"}),
            reply("ok"),
        ],
    )
    run = await h.gateway.start_run(
        task, requested_by="U1", origin={"channel": "C1", "thread_ts": "1.0"}
    )
    [g] = await h.opened_gates(run.run_id, 1)
    gate = await h.gateway.get_gate(g.data["gate_id"])
    assert gate is not None
    return gate


def nudge_events(h: Harness, gate_id: str) -> list[str]:
    return [
        e.type.value
        for e in h._seen
        if e.data.get("gate_id") == gate_id and e.type.value.startswith("gate.")
    ]


async def entries(redis: Redis, h: Harness, gate: Gate) -> list[str]:
    found: list[str] = await redis.zrange(h.keys.nudges(h.keys.shard_of(gate.gate_id)), 0, -1)
    return [m for m in found if m.endswith(gate.gate_id)]


def noop(name: str) -> str:
    """Do nothing."""
    return name


# --- options ---------------------------------------------------------------------------
def test_options_are_checked_where_they_are_given() -> None:
    t = tool(requires_approval=True, remind_after=timedelta(minutes=2))(noop)
    assert t.nudges == Nudges(remind_after=120.0)
    with pytest.raises(ToolDefinitionError, match="tool noop: escalate_after needs escalate_to"):
        tool(escalate_after=60)(noop)
    with pytest.raises(ToolDefinitionError, match="escalate_to needs escalate_after"):
        tool(escalate_to="S1")(noop)
    with pytest.raises(ToolDefinitionError, match="remind_after must be a number of seconds"):
        tool(remind_after=-1)(noop)
    with pytest.raises(ToolDefinitionError, match="escalate_to: entry 2 is not a user or group id"):
        tool(escalate_after=60, escalate_to=["S1", "not an id"])(noop)
    with pytest.raises(ValueError, match="agent 'a': escalate_after needs escalate_to"):
        Agent(name="a", instructions="x", escalate_after=timedelta(seconds=5))


def test_settings_read_and_check_the_defaults(redis_url: str) -> None:
    s = nudge_settings(
        redis_url, "http://x/", REMIND_AFTER=10, ESCALATE_AFTER=20, ESCALATE_TO="S1, U2"
    )
    assert s.nudges == Nudges(10.0, 20.0, ("S1", "U2"))
    cases = {
        "ESCALATE_AFTER needs ESCALATE_TO: whom to escalate to": {"ESCALATE_AFTER": 60},
        "ESCALATE_TO needs ESCALATE_AFTER: when to escalate": {"ESCALATE_TO": "S1"},
        "REMIND_AFTER (30 s) is not shorter than APPROVAL_TIMEOUT (30 s), so it would never fire": {
            "REMIND_AFTER": 30
        },
        "ESCALATE_TO is invalid: entry 1 is not a user or group id": {
            "ESCALATE_AFTER": 5,
            "ESCALATE_TO": "@sre",
        },
    }
    for line, env in cases.items():
        with pytest.raises(ConfigError) as exc:
            nudge_settings(redis_url, "http://x/", **env)
        assert str(exc.value).startswith(line), exc.value


def test_the_most_specific_level_wins_and_zero_turns_a_step_off(redis_url: str) -> None:
    settings = Nudges(remind_after=10, escalate_after=25, escalate_to=("S9",))
    base = dba.nudges.over(settings)
    assert drop_table.nudges.over(base) == Nudges(0.4, 0.8, ("S0LEADS", "U0BOSS"))
    assert restart.nudges.over(base) == Nudges(20.0, 25.0, ("S9",))  # the agent's, the settings'
    assert quiet.nudges.over(base).gate_fields() == {
        "remind_after": "",
        "escalate_after": "25",
        "escalate_to": '["S9"]',
    }


def test_a_step_that_could_never_fire_stops_the_worker_at_start(
    redis: Redis, redis_url: str
) -> None:
    late = tool(requires_approval=True, escalate_after=90, escalate_to="S1")(noop)
    agent = Agent(name="late", instructions="x", tools=[late], approval_timeout=60)
    settings = nudge_settings(redis_url, "http://x/")
    with pytest.raises(ConfigError) as exc:
        Runner(redis, Keys("t"), agent, None, model="m", approval_timeout=300)  # type: ignore[arg-type]
    assert str(exc.value) == (
        "agent 'late', tool noop: escalate_after (90 s) is not shorter than the approval "
        "timeout (60 s), so it would never fire; make it shorter, or 0 for none"
    )
    short = Agent(name="short", instructions="x", approval_timeout=10)
    with pytest.raises(ConfigError, match=r"agent 'short': REMIND_AFTER \(20 s\) is not shorter"):
        Runner(redis, Keys("t"), short, None, model="m", approval_timeout=300, nudges=Nudges(20))  # type: ignore[arg-type]
    assert settings.nudges == Nudges()


# --- the sweeper ------------------------------------------------------------------------
@pytest.fixture
async def nh(redis: Redis, redis_url: str, fake_openai: FakeOpenAI) -> AsyncIterator[Harness]:
    """A harness with short steps (0.4 s reminder, 0.8 s escalation); its workers are the
    test's to start."""
    h = Harness(redis, nudge_settings(redis_url, fake_openai.base_url), dba)
    yield h
    await h.close()


async def test_each_step_fires_once_with_two_sweepers(
    nh: Harness, redis: Redis, fake_openai: FakeOpenAI
) -> None:
    h = nh
    h.start_worker()
    h.start_worker()  # two sweepers at once
    gate = await open_gate(h, fake_openai, "drop")
    assert gate.remind_at == pytest.approx(gate.created_at + 0.4, abs=1e-3)
    assert gate.escalate_at == pytest.approx(gate.created_at + 0.8, abs=1e-3)
    assert gate.escalate_to == ["S0LEADS", "U0BOSS"]
    assert gate.extra_approvers() == []  # not escalated yet
    assert sorted(await entries(redis, h, gate)) == [
        f"escalate:{gate.gate_id}",
        f"remind:{gate.gate_id}",
    ]
    reminded = await h.wait_event(gate.run_id, "gate.reminded")
    escalated = await h.wait_event(gate.run_id, "gate.escalated")
    await asyncio.sleep(0.3)  # both sweepers had further passes
    await h.events()
    assert nudge_events(h, gate.gate_id) == ["gate.opened", "gate.reminded", "gate.escalated"]
    assert reminded.data["step"] == "remind" and reminded.data["origin"]["channel"] == "C1"
    assert escalated.data["escalate_to"] == ["S0LEADS", "U0BOSS"]
    after = await h.gateway.get_gate(gate.gate_id)
    assert after is not None and after.status.value == "pending"
    assert after.reminded_at == pytest.approx(reminded.data["at"])
    assert after.reminded_at is not None and after.reminded_at >= gate.remind_at  # type: ignore[operator]
    assert after.escalated_at == pytest.approx(escalated.data["at"])
    assert after.extra_approvers() == ["S0LEADS", "U0BOSS"]
    assert await entries(redis, h, gate) == []


async def test_a_worker_restart_loses_no_step(
    nh: Harness, redis: Redis, fake_openai: FakeOpenAI
) -> None:
    h = nh
    first = h.start_worker()
    gate = await open_gate(h, fake_openai, "restart me")
    first.stop()
    await asyncio.wait_for(h.workers[0][1], 10)  # stopped before either step was due
    await asyncio.sleep(1.0)  # both are past due: nobody swept
    await h.events()
    assert nudge_events(h, gate.gate_id) == ["gate.opened"]
    h.start_worker()  # a new worker finds them in Redis
    await h.wait_event(gate.run_id, "gate.escalated")
    await asyncio.sleep(0.2)
    await h.events()
    assert nudge_events(h, gate.gate_id) == ["gate.opened", "gate.reminded", "gate.escalated"]


async def test_nothing_fires_after_a_decision(
    nh: Harness, redis: Redis, fake_openai: FakeOpenAI
) -> None:
    h = nh
    h.start_worker()
    gate = await open_gate(h, fake_openai, "decide first")
    res = await h.gateway.decide(gate.gate_id, "approve", by="U2")
    assert res.applied
    assert await entries(redis, h, gate) == []  # DECIDE_GATE removed both steps
    await h.wait_finished(gate.run_id)
    await asyncio.sleep(1.0)  # past both steps
    await h.events()
    assert nudge_events(h, gate.gate_id) == ["gate.opened", "gate.decided"]
    after = await h.gateway.get_gate(gate.gate_id)
    assert after is not None and after.reminded_at is None and after.escalated_at is None
    assert after.extra_approvers() == []


async def test_a_cancelled_or_failed_run_leaves_no_step_behind(
    nh: Harness, redis: Redis, fake_openai: FakeOpenAI
) -> None:
    """Closing a run's pending gate (cancel, failure) drops its reminder and escalation, as a
    decision does: none is left in the shard's sorted set to wait for its time."""
    h = nh
    h.start_worker()
    cancelled = await open_gate(h, fake_openai, "cancel me")
    failed = await open_gate(h, fake_openai, "fail me")
    for gate in (cancelled, failed):
        assert sorted(await entries(redis, h, gate)) == [
            f"escalate:{gate.gate_id}",
            f"remind:{gate.gate_id}",
        ]
    await h.gateway.cancel_run(cancelled.run_id, by="U1")
    worker, _ = h.workers[0]
    fence = await take_lease(redis, h.keys, failed.run_id)
    assert await worker.runner.fail(failed.run_id, "the model endpoint is gone", fence)
    for gate in (cancelled, failed):
        closed = await h.gateway.get_gate(gate.gate_id)
        assert closed is not None and closed.status is GateStatus.CANCELLED
        assert await entries(redis, h, gate) == []


async def test_the_sweeper_wakes_for_the_nearest_step(
    nh: Harness, redis: Redis, fake_openai: FakeOpenAI
) -> None:
    h = nh
    worker = h.start_worker()
    gate = await open_gate(h, fake_openai, "wake")
    _moved, more, next_in = await worker._sweep_once()
    sec, usec = await redis.time()
    assert not more
    assert next_in is not None and gate.remind_at is not None
    # The reminder, not the expiry 30 s away, sets the next wake-up.
    assert next_in == pytest.approx(gate.remind_at - (sec + usec / 1e6), abs=0.05)


# --- FIRE_NUDGE ---------------------------------------------------------------------------
@pytest.fixture
async def idle(redis: Redis, redis_url: str, fake_openai: FakeOpenAI) -> Callable[[], Harness]:
    """A harness whose worker opens the gate and is then stopped: the test sweeps itself."""
    made: list[Harness] = []

    def make() -> Harness:
        h = Harness(redis, nudge_settings(redis_url, fake_openai.base_url), dba)
        made.append(h)
        return h

    yield make  # type: ignore[misc]
    for h in made:
        await h.close()


async def opened_then_idle(h: Harness, fake: FakeOpenAI, task: str) -> Gate:
    w = h.start_worker()
    gate = await open_gate(h, fake, task)
    w.stop()
    await asyncio.wait_for(h.workers[-1][1], 10)
    return gate


async def test_fire_nudge_fires_once_and_only_when_due(
    idle: Callable[[], Harness], fake_openai: FakeOpenAI, redis: Redis
) -> None:
    h = idle()
    gate = await opened_then_idle(h, fake_openai, "fire")
    scripts = h.gateway.scripts
    assert (await scripts.fire_nudge(gate.gate_id, "remind")).outcome is NudgeOutcome.NOT_DUE
    await asyncio.sleep(0.45)
    fired = await scripts.fire_nudge(gate.gate_id, "remind")
    assert fired.outcome is NudgeOutcome.FIRED and fired.gate is not None
    assert fired.gate["reminded_at"]
    assert (await scripts.fire_nudge(gate.gate_id, "remind")).outcome is NudgeOutcome.GONE
    with pytest.raises(Exception, match="FIRE_NUDGE: bad step"):
        await scripts.fire_nudge(gate.gate_id, "nag")
    await h.events()
    assert nudge_events(h, gate.gate_id) == ["gate.opened", "gate.reminded"]


async def test_fire_nudge_refuses_a_closed_or_late_gate(
    idle: Callable[[], Harness], fake_openai: FakeOpenAI, redis: Redis
) -> None:
    h = idle()
    closed = await opened_then_idle(h, fake_openai, "closed")
    await h.gateway.cancel_run(closed.run_id, by="U1")
    assert await entries(redis, h, closed) == []  # closing dropped both steps
    # An entry left behind anyway (by a core from before closing dropped them): it is due,
    # refused, and dropped.
    nudges = h.keys.nudges(h.keys.shard_of(closed.gate_id))
    await redis.zadd(nudges, {f"remind:{closed.gate_id}": closed.created_at + 0.4})
    await asyncio.sleep(0.45)
    res = await h.gateway.scripts.fire_nudge(closed.gate_id, "remind")
    assert res.outcome is NudgeOutcome.NOT_PENDING
    assert await entries(redis, h, closed) == []  # dropped

    late = await opened_then_idle(h, fake_openai, "late")
    await redis.hset(h.keys.gate(late.gate_id), "deadline", f"{late.created_at + 0.1:.6f}")
    await asyncio.sleep(0.45)
    res = await h.gateway.scripts.fire_nudge(late.gate_id, "remind")
    assert res.outcome is NudgeOutcome.LATE
    await h.events()
    assert "gate.reminded" not in nudge_events(h, closed.gate_id) + nudge_events(h, late.gate_id)


async def test_decisions_racing_the_reminder_never_see_it_after(
    idle: Callable[[], Harness], fake_openai: FakeOpenAI, redis: Redis
) -> None:
    h = idle()
    gates = [await opened_then_idle(h, fake_openai, f"race {i}") for i in range(8)]
    offsets = [-0.02, -0.01, -0.005, 0.0, 0.0, 0.005, 0.01, 0.02]

    async def decide_near(gate: Gate, offset: float) -> None:
        sec, usec = await redis.time()
        assert gate.remind_at is not None
        await asyncio.sleep(max(0.0, gate.remind_at - (sec + usec / 1e6) + offset))
        await h.gateway.decide(gate.gate_id, "deny", by="U2")

    sweeper = NudgeSweeper(redis, h.keys)

    async def sweep_hard() -> None:
        for _ in range(60):
            await sweeper.sweep()
            await asyncio.sleep(0.005)

    await asyncio.gather(
        *(decide_near(g, o) for g, o in zip(gates, offsets, strict=True)),
        sweep_hard(),
        sweep_hard(),
    )
    await h.events()
    for g in gates:
        seen = nudge_events(h, g.gate_id)
        assert seen in (
            ["gate.opened", "gate.decided"],
            ["gate.opened", "gate.reminded", "gate.decided"],
        ), seen
        after = await h.gateway.get_gate(g.gate_id)
        assert after is not None
        assert (after.reminded_at is not None) == ("gate.reminded" in seen)
        assert await entries(redis, h, g) == []
