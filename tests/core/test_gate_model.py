"""Property test: the gate scripts against a model of the state machine.

Random interleavings of approve / deny / expire / cancel, each possibly run twice (a client
retrying after a lost reply), on runs with one to three gates. After every program the Redis
state must equal the model's: one decision per gate, the first one; one resume job exactly
when the last gate of a turn was decided (never after a cancel); deadlines and pending counts
consistent; one gate.decided event per decided gate.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from agent_core import GateStatus, Gateway, InvalidState, Keys, RunStatus
from agent_core.runner import Runner
from agent_core.script_replies import Began, LeaseStatus
from agent_core.scripts import Scripts
from tests.agents import ops

Op = tuple[str, int, str, bool]  # (kind, gate index, user, repeat)

ops_strategy = st.lists(
    st.tuples(
        st.sampled_from(["approve", "deny", "expire", "cancel"]),
        st.integers(0, 2),
        st.sampled_from(["U1", "U2", "U3"]),
        st.booleans(),
    ),
    max_size=12,
)


async def lease(redis: Redis, keys: Keys, run_id: str) -> str:
    """Take the run's lease as a worker does (ACQUIRE_LEASE): the fence token."""
    res = await Scripts(redis, keys).acquire_lease(run_id, lease_ms=60_000, worker="test")
    assert res.status is LeaseStatus.OK, res
    return res.fence


async def open_run(redis: Redis, gw: Gateway, runner: Runner, n: int) -> tuple[str, list[str]]:
    """A run paused at turn 1 on n gates, opened by the real OPEN_GATES script."""
    run = await gw.start_run("model", requested_by="U0")
    k = gw.keys
    await redis.hset(k.run(run.run_id), mapping={"status": "running", "turn": 1, "phase": "tools"})
    calls = [
        {
            "id": f"c{i}",
            "name": "delete_user",
            "args": {"user_id": str(i)},
            "gate_id": k.new_gate_id(k.shard_of(run.run_id)),
        }
        for i in range(n)
    ]
    await redis.hset(
        k.turn(run.run_id, 1), mapping={f"state:{c['id']}": "needs_gate" for c in calls}
    )
    fence = await lease(redis, k, run.run_id)
    h = await redis.hgetall(k.run(run.run_id))
    await runner._open_gates(h, 1, calls, fence)
    return run.run_id, [c["gate_id"] for c in calls]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(n=st.integers(1, 3), program=ops_strategy)
async def test_gate_scripts_match_the_model(redis: Redis, n: int, program: list[Op]) -> None:
    await redis.flushdb()
    keys = Keys("m")
    gw = Gateway(redis, keys, agent_name="model")
    runner = Runner(redis, keys, ops, client=None, model="m", approval_timeout=60)  # type: ignore[arg-type]
    run_id, gates = await open_run(redis, gw, runner, n)

    model: dict[str, tuple[str, str]] = {g: ("pending", "") for g in gates}
    run_cancelled = False
    expect_resume = False
    for kind, idx, user, repeat in program:
        gid = gates[idx % n]
        for attempt in range(2 if repeat else 1):
            if kind == "cancel":
                if run_cancelled:
                    try:
                        await gw.cancel_run(run_id, by=user)
                        raise AssertionError("cancelling a cancelled run must fail")
                    except InvalidState:
                        continue
                if expect_resume:
                    # The run was resumed (it would be running): cancelling then is a
                    # different path, covered elsewhere. Stop the program here.
                    break
                await gw.cancel_run(run_id, by=user)
                run_cancelled = True
                for g, (st_, _) in model.items():
                    if st_ == "pending":
                        model[g] = ("cancelled", user)
                continue
            if kind == "expire":
                await redis.hset(keys.gate(gid), "deadline", "1")  # time passes for this gate
                res = await gw.expire(gid)
                want, by = "expired", ""
            else:
                res = await gw.decide(gid, kind, by=user)
                want, by = ("approved" if kind == "approve" else "denied"), user
            assert res is not None
            first = model[gid][0] == "pending" and attempt == 0
            # A person's click after a forced-past deadline is an expiry too.
            if kind != "expire" and float(await redis.hget(keys.gate(gid), "deadline")) <= 1:
                want, by = "expired", ""
            if first:
                model[gid] = (want, by)
                assert res.applied
                if all(s != "pending" for s, _ in model.values()) and not run_cancelled:
                    expect_resume = True
            else:
                assert not res.applied
            assert (res.gate.status.value, res.gate.decided_by or "") == model[gid]

    # The state in Redis is the model's.
    for gid in gates:
        gate = await gw.get_gate(gid)
        assert gate is not None
        assert (gate.status.value, gate.decided_by or "") == model[gid]
    pending = [g for g, (s, _) in model.items() if s == "pending"]
    shard = keys.shard_of(run_id)
    assert sorted(await redis.zrange(keys.deadlines(shard), 0, -1)) == sorted(pending)
    run = await gw.get_run(run_id)
    assert run is not None
    if run_cancelled:
        assert run.status is RunStatus.CANCELLED and run.pending == 0
    else:
        assert run.status is RunStatus.AWAITING_APPROVAL
        assert run.pending == len(pending)
    jobs = [f for _, f in await redis.xrange(keys.jobs(shard))]
    resumes = [j for j in jobs if j["type"] == "resume"]
    assert len(resumes) == (1 if expect_resume else 0)
    events: list[dict[str, Any]] = [
        json.loads(f["data"])
        for _, f in await redis.xrange(keys.events(shard))
        if f["type"] == "gate.decided"
    ]
    decided = {g for g, (s, _) in model.items() if s != "pending"}
    assert sorted(e["gate_id"] for e in events) == sorted(decided)
    for e in events:
        assert (e["status"], e["by"]) == model[e["gate_id"]]
    assert all(GateStatus(s) for s, _ in model.values())


async def test_a_resume_job_names_its_turn_and_the_lease_reads_it(redis: Redis) -> None:
    """The last decision's resume job names the turn; taking the lease for it (as the
    worker does) reads that turn's calls in the same script, and only while the run is at
    that turn with its tools to run."""
    keys = Keys("t")
    gw = Gateway(redis, keys)
    runner = Runner(redis, keys, ops, client=None, model="m", approval_timeout=3600)  # type: ignore[arg-type]
    run_id, gate_ids = await open_run(redis, gw, runner, 2)
    fence = await redis.hget(keys.run(run_id), "fence")
    scripts = Scripts(redis, keys)
    await scripts.release_lease(run_id, fence)  # the opener's
    for g in gate_ids:
        await gw.decide(g, "approve", by="U1")
    jobs = await redis.xrange(keys.jobs(keys.shard_of(run_id)))
    resume = [f for _, f in jobs if f["type"] == "resume"]
    assert resume == [
        {"type": "resume", "run_id": run_id, "turn": "1", "gates": " ".join(gate_ids)}
    ]

    async def acquire(turn: str) -> Began:
        res = await scripts.acquire_lease(
            run_id, lease_ms=60_000, worker="w1", begin_agent=ops.name, turn=turn
        )
        assert res.status is LeaseStatus.OK and res.began is not None, res
        await scripts.release_lease(run_id, res.fence)
        return res.began

    began = await acquire("1")
    assert began.status == "running"
    turn = began.turn
    assert turn is not None
    assert turn == await redis.hgetall(keys.turn(run_id, 1))
    assert {turn["state:c0"], turn["state:c1"]} == {"gated"}
    assert (await acquire("2")).turn is None, "another turn: not read"
    await redis.hset(keys.run(run_id), "phase", "model")
    assert (await acquire("1")).turn is None, "no tools to run: not read"
