"""A decision whose caller knows the gate's run is one round trip to Redis (counted on a
real redis-server by a connection class that counts what it sends)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest

from agent_core import Gate, GateStatus, Gateway
from agent_core.connections import create_redis
from agent_core.testing import FakeOpenAI, calls, reply
from tests.bench.common import Traffic, count_traffic
from tests.core.harness import Harness


@pytest.fixture
async def counted(harness: Harness, redis_url: str) -> AsyncIterator[tuple[Gateway, Traffic]]:
    """A gateway of its own on a client whose every command sent is counted."""
    traffic = Traffic()
    redis = count_traffic(create_redis(redis_url), traffic)
    try:
        yield Gateway(redis, harness.keys, agent_name=harness.agent.name), traffic
    finally:
        await redis.aclose()


async def paused(harness: Harness, fake: FakeOpenAI, task: str, n: int) -> list[Gate]:
    """A run paused on ``n`` gates, as :meth:`Gateway.pending_gates` returns them."""
    fake.script(
        task, [calls([("delete_user", {"user_id": str(i)}) for i in range(n)]), reply("done")]
    )
    run = await harness.gateway.start_run(task, requested_by="U1")
    await harness.opened_gates(run.run_id, n)
    gates = await harness.gateway.pending_gates(run.run_id)
    assert len(gates) == n
    return gates


async def trips(traffic: Traffic, decision: Awaitable[Any]) -> int:
    """The round trips ``decision`` takes."""
    before = traffic.round_trips
    await decision
    return traffic.round_trips - before


async def test_a_decision_with_its_run_known_is_one_round_trip(
    harness: Harness, fake_openai: FakeOpenAI, counted: tuple[Gateway, Traffic]
) -> None:
    gw, traffic = counted
    warm, by_gate, by_run, by_id, forged, late = await paused(harness, fake_openai, "six", 6)
    await gw.decide(warm, "approve", by="U2")  # the script is in the server's cache now
    assert await trips(traffic, gw.decide(by_gate, "approve", by="U2")) == 1
    assert (
        await trips(traffic, gw.decide(by_run.gate_id, "approve", "U2", run_id=by_run.run_id)) == 1
    )
    # Without its run: the gate's run is read first.
    assert await trips(traffic, gw.decide(by_id.gate_id, "approve", by="U2")) == 2
    # A run that is not the gate's: refused by the script, then the gate's run, once.
    # (A well-formed run id of the gate's shard; one of another shard is not even tried.)
    stale = forged.model_copy(update={"run_id": "r-" + forged.gate_id[:2] + "x" * 10})
    assert await trips(traffic, gw.decide(stale, "approve", by="U2")) == 3
    other = (await paused(harness, fake_openai, "other", 1))[0]
    wrong = forged.model_copy(update={"run_id": other.run_id})
    assert await trips(traffic, gw.decide(wrong, "approve", by="U2")) <= 3
    after = await gw.get_gate(forged.gate_id)
    assert after is not None and after.status is GateStatus.APPROVED
    mine = await gw.get_gate(other.gate_id)
    assert mine is not None and mine.status is GateStatus.PENDING
    # Decided already (a second click): one round trip, told who was first.
    before = traffic.round_trips
    res = await gw.decide(by_gate, "deny", by="U3")
    assert traffic.round_trips - before == 1 and not res.applied
    assert res.gate.decided_by == "U2"
    assert await trips(traffic, gw.decide(late, "approve", by="U2")) == 1
    await harness.wait_finished(warm.run_id)


async def test_deciding_a_turn_of_gates_reads_no_run(
    harness: Harness, fake_openai: FakeOpenAI, counted: tuple[Gateway, Traffic]
) -> None:
    gw, traffic = counted
    [warm] = await paused(harness, fake_openai, "one", 1)
    await gw.decide(warm, "approve", by="U2")
    gates = await paused(harness, fake_openai, "three", 3)
    before = traffic.round_trips
    results = await gw.decide_many(gates, "approve", by="U2")
    assert traffic.round_trips - before == 3  # one per gate, no HGET first
    assert all(r.applied for r in results)
    assert [r.gate.gate_id for r in results] == [g.gate_id for g in gates]
    await harness.wait_finished(gates[0].run_id)
