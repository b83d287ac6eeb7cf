"""Gate decisions: exactly once under concurrency, against the expiry, for unknown ids."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from redis.asyncio import Redis

from agent_core import Decision, GateNotFound, GateStatus, InvalidState, RunNotFound, RunStatus
from agent_core.testing import FakeOpenAI, call, reply
from tests.agents import ops, read_journal
from tests.core.conftest import core_settings
from tests.core.harness import Harness


async def test_twenty_concurrent_decisions_one_winner(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path, redis: Redis
) -> None:
    fake_openai.script("race", [call("delete_user", {"user_id": "5"}), reply("done")])
    run = await harness.gateway.start_run("race", requested_by="U1")
    [g] = await harness.opened_gates(run.run_id, 1)
    gate_id = g.data["gate_id"]
    results = await asyncio.gather(
        *(
            harness.gateway.decide(
                gate_id, Decision.APPROVE if i % 2 else Decision.DENY, by=f"U{i}", reason=f"r{i}"
            )
            for i in range(20)
        )
    )
    winners = [r for r in results if r.applied]
    assert len(winners) == 1
    first = winners[0].gate
    for r in results:  # every loser is told who decided first, and what
        assert (r.gate.status, r.gate.decided_by, r.gate.reason) == (
            first.status,
            first.decided_by,
            first.reason,
        )
    await harness.wait_finished(run.run_id)
    decided = [e for e in await harness.events() if e.type.value == "gate.decided"]
    assert len(decided) == 1
    # Finished jobs are deleted from the stream: count what was ever added (start + resume).
    jobs = harness.keys.jobs(harness.keys.shard_of(run.run_id))
    assert (await redis.xinfo_stream(jobs))["entries-added"] == 2
    expected = ["delete_user:5"] if first.status is GateStatus.APPROVED else []
    assert read_journal(str(journal)) == expected


async def test_clicks_racing_the_expiry_end_with_one_decision(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    h = Harness(redis, core_settings(redis_url, fake_openai.base_url, APPROVAL_TIMEOUT=0.5), ops)
    h.start_worker()
    h.start_worker()  # two sweepers
    try:
        runs = []
        for i in range(8):
            fake_openai.script(f"exp {i}", [call("delete_user", {"user_id": str(i)}), reply("ok")])
            runs.append(await h.gateway.start_run(f"exp {i}", requested_by="U1"))
        gates = {}
        for r in runs:
            [g] = await h.opened_gates(r.run_id, 1)
            gates[r.run_id] = g.data
        results: dict[str, list[tuple[bool, str]]] = {}

        async def click_near_deadline(run_id: str, offset: float) -> None:
            data = gates[run_id]
            sec, usec = await redis.time()
            await asyncio.sleep(max(0.0, data["deadline"] - (sec + usec / 1e6) + offset))
            outs = await asyncio.gather(
                *(h.gateway.decide(data["gate_id"], "approve", by=f"U{k}") for k in range(3))
            )
            results[run_id] = [(o.applied, o.gate.status.value) for o in outs]

        offsets = [-0.02, -0.01, -0.005, 0.0, 0.0, 0.005, 0.01, 0.02]
        await asyncio.gather(
            *(click_near_deadline(r.run_id, o) for r, o in zip(runs, offsets, strict=False))
        )
        for r in runs:
            await h.wait_finished(r.run_id)
        events = await h.events()
        log = read_journal(str(journal))
        for r in runs:
            decided = [e for e in events if e.run_id == r.run_id and e.type.value == "gate.decided"]
            assert len(decided) == 1, decided
            status = decided[0].data["status"]
            assert status in ("approved", "expired")
            clicks = results[r.run_id]
            assert all(s == status for _, s in clicks)  # every clicker is told the one outcome
            assert sum(applied for applied, s in clicks if s == "approved") == (
                1 if status == "approved" else 0
            )
            uid = gates[r.run_id]["args"]["user_id"]
            assert log.count(f"delete_user:{uid}") == (1 if status == "approved" else 0)
    finally:
        await h.close()


async def test_a_click_after_the_deadline_is_an_expiry_not_an_approval(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    # No sweeper runs here: the gate is past its deadline when the click arrives.
    h = Harness(redis, core_settings(redis_url, fake_openai.base_url, APPROVAL_TIMEOUT=0.2), ops)
    worker = h.start_worker()
    fake_openai.script("late", [call("delete_user", {"user_id": "9"}), reply("expired")])
    try:
        run = await h.gateway.start_run("late", requested_by="U1")
        [g] = await h.opened_gates(run.run_id, 1)
        worker.stop()
        await asyncio.sleep(0.3)
        res = await h.gateway.decide(g.data["gate_id"], "approve", by="U2")
        assert res.applied and res.gate.status is GateStatus.EXPIRED
        assert res.gate.decided_by is None
        assert await h.gateway.expire(g.data["gate_id"]) is not None  # already decided
    finally:
        await h.close()
    assert read_journal(str(journal)) == []


async def test_expiring_a_gate_before_its_deadline_does_nothing(
    harness: Harness, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script("early", [call("delete_user", {"user_id": "1"})])
    run = await harness.gateway.start_run("early", requested_by="U1")
    [g] = await harness.opened_gates(run.run_id, 1)
    assert await harness.gateway.expire(g.data["gate_id"]) is None
    gate = await harness.gateway.get_gate(g.data["gate_id"])
    assert gate is not None and gate.status is GateStatus.PENDING


async def test_a_decision_naming_another_run_never_touches_it(
    harness: Harness, fake_openai: FakeOpenAI
) -> None:
    """A forged or stale run id is refused by the script (nothing written anywhere); the
    gate's own run is then read and the gate decided once, never the other run's gate."""
    fake_openai.script("whose", [call("delete_user", {"user_id": "1"}), reply("done")])
    fake_openai.script("other", [call("delete_user", {"user_id": "2"}), reply("ok")])
    run = await harness.gateway.start_run("whose", requested_by="U1")
    other = await harness.gateway.start_run("other", requested_by="U1")
    [g] = await harness.opened_gates(run.run_id, 1)
    [o] = await harness.opened_gates(other.run_id, 1)
    gate_id, other_gate = g.data["gate_id"], o.data["gate_id"]
    other_key = harness.keys.run(other.run_id)
    assert await harness.redis.hget(other_key, "pending") == "1"
    res = await harness.gateway.decide(gate_id, "approve", by="U2", run_id=other.run_id)
    assert res.applied and res.gate.status is GateStatus.APPROVED
    assert res.gate.gate_id == gate_id and res.gate.run_id == run.run_id
    assert await harness.redis.hget(other_key, "pending") == "1"
    untouched = await harness.gateway.get_gate(other_gate)
    assert untouched is not None and untouched.status is GateStatus.PENDING
    # Malformed or of another shard: not even tried; decided already: told so.
    for wrong in (other.run_id, "r-" + gate_id[:2] + "x" * 10, "not a run"):
        again = await harness.gateway.decide(gate_id, "deny", by="U3", run_id=wrong)
        assert not again.applied and again.gate.decided_by == "U2"
    # A Gate object that names another run (stale, or forged): the same.
    [pending] = await harness.gateway.pending_gates(other.run_id)
    forged = pending.model_copy(update={"run_id": run.run_id})
    res = await harness.gateway.decide(forged, "deny", by="U2", reason="no")
    assert res.applied and res.gate.status is GateStatus.DENIED
    assert res.gate.run_id == other.run_id
    assert (await harness.wait_finished(run.run_id)).status is RunStatus.COMPLETED
    assert (await harness.wait_finished(other.run_id)).status is RunStatus.COMPLETED


@pytest.mark.parametrize(
    "gate_id", ["", "x", "A" * 24, "../../etc/passwd", "a" * 5000, "{t}:gate:x", "é" * 24]
)
async def test_unknown_or_malformed_gate_ids(harness: Harness, gate_id: str) -> None:
    with pytest.raises(GateNotFound):
        await harness.gateway.decide(gate_id, "approve", by="U1")
    assert await harness.gateway.get_gate(gate_id) is None


async def test_decision_values_and_deciders_are_checked(harness: Harness) -> None:
    with pytest.raises(ValueError):
        await harness.gateway.decide("A" * 24, "maybe", by="U1")
    with pytest.raises(ValueError):
        await harness.gateway.decide("A" * 24, "approve", by="")


async def test_cancel_unknown_or_finished_runs(harness: Harness, fake_openai: FakeOpenAI) -> None:
    with pytest.raises(RunNotFound):
        await harness.gateway.cancel_run("r-000000000000", by="U1")
    with pytest.raises(RunNotFound):
        await harness.gateway.cancel_run("not a run id", by="U1")
    assert await harness.gateway.get_run("nope") is None
    fake_openai.script("quick", [reply("hi")])
    run = await harness.gateway.start_run("quick", requested_by="U1")
    assert (await harness.wait_finished(run.run_id)).status is RunStatus.COMPLETED
    with pytest.raises(InvalidState, match="completed"):
        await harness.gateway.cancel_run(run.run_id, by="U1")


async def test_start_run_rejects_bad_tasks(harness: Harness) -> None:
    with pytest.raises(ValueError, match="empty"):
        await harness.gateway.start_run("   ", requested_by="U1")
    with pytest.raises(ValueError, match="longer"):
        await harness.gateway.start_run("x" * 20_001, requested_by="U1")


async def test_runs_for_user_newest_first(harness: Harness, fake_openai: FakeOpenAI) -> None:
    fake_openai.script("a", [reply("a")])
    fake_openai.script("b", [reply("b")])
    r1 = await harness.gateway.start_run("a", requested_by="U7")
    r2 = await harness.gateway.start_run("b", requested_by="U7")
    runs = await harness.gateway.runs_for_user("U7")
    assert [r.run_id for r in runs] == [r2.run_id, r1.run_id]
    assert await harness.gateway.runs_for_user("U8") == []
    for r in (r1, r2):
        await harness.wait_finished(r.run_id)
