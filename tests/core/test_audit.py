"""The audit trail (agent_core.audit): each gate event recorded once, in a hash chain that
verifies, breaks when an entry is removed or forged in Redis, and survives trimming."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis

from agent_core import Agent, Decision, tool
from agent_core.audit import AuditEntry, entries, read_heads, trim, verify_shard
from agent_core.testing import FakeOpenAI, call, reply
from tests.agents import quorum, read_journal, told_exactly
from tests.core.conftest import core_settings
from tests.core.harness import Harness
from tests.core.workers import WorkerProcess, wait_journal

pytestmark = pytest.mark.timeout(60)


async def trail(h: Harness, gate_id: str) -> list[AuditEntry]:
    shard = h.keys.shard_of(gate_id)
    return [e async for e in entries(h.redis, h.keys, shard) if e.get("gate_id") == gate_id]


async def verified(h: Harness, shard: int) -> list[str]:
    return (await verify_shard(h.redis, h.keys, shard)).problems


async def gated_run(h: Harness, fake: FakeOpenAI, task: str, user: str = "5") -> tuple[str, str]:
    fake.script(task, [call("delete_user", {"user_id": user}), reply("done")])
    run = await h.gateway.start_run(task, requested_by="U1")
    [g] = await h.opened_gates(run.run_id, 1)
    return run.run_id, g.data["gate_id"]


async def test_an_approved_call_is_opened_approved_and_executed_once_each(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    h = harness
    run_id, gid = await gated_run(h, fake_openai, "audit approve")
    gate = await h.gateway.get_gate(gid)
    assert gate is not None
    await h.gateway.decide(gid, Decision.APPROVE, by="U2", reason="fine")
    await h.gateway.decide(gid, Decision.APPROVE, by="U3")  # decided already: no entry
    await h.wait_finished(run_id)
    assert read_journal(str(journal)) == ["delete_user:5"]
    got = await trail(h, gid)
    assert [(e.kind, e.get("by")) for e in got] == [
        ("opened", "U1"),
        ("approved", "U2"),
        ("executed", ""),
    ]
    for e in got:
        assert (e.get("run_id"), e.get("tool"), e.get("args_hash")) == (
            run_id,
            "delete_user",
            gate.args_hash,
        )
    assert got[1].get("reason") == "fine"
    assert await verified(h, h.keys.shard_of(gid)) == []


async def test_a_denied_expired_and_cancelled_gate_each_get_their_entry_and_no_outcome(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    from tests.agents import ops

    h = Harness(redis, core_settings(redis_url, fake_openai.base_url, APPROVAL_TIMEOUT=2), ops)
    h.start_worker()
    try:
        r1, denied = await gated_run(h, fake_openai, "audit deny", "1")
        r2, expired = await gated_run(h, fake_openai, "audit expire", "2")
        r3, closed = await gated_run(h, fake_openai, "audit cancel", "3")
        await h.gateway.decide(denied, Decision.DENY, by="U2", reason="no")
        await h.gateway.cancel_run(r3, by="U9", reason="enough")
        for r in (r1, r2, r3):
            await h.wait_finished(r)
        assert [(e.kind, e.get("by"), e.get("reason")) for e in await trail(h, denied)] == [
            ("opened", "U1", ""),
            ("denied", "U2", "no"),
        ]
        assert [e.kind for e in await trail(h, expired)] == ["opened", "expired"]
        assert [(e.kind, e.get("by")) for e in await trail(h, closed)] == [
            ("opened", "U1"),
            ("closed", "U9"),
        ]
        assert read_journal(str(journal)) == []
        for shard in {h.keys.shard_of(g) for g in (denied, expired, closed)}:
            assert await verified(h, shard) == []
    finally:
        await h.close()


async def test_a_quorum_records_each_counted_approval_then_the_decision(
    agent_harness: Callable[[Agent], Harness], fake_openai: FakeOpenAI
) -> None:
    h = agent_harness(quorum)
    fake_openai.script("audit wire", [call("wire", {"amount": 500}), reply("sent")])
    run = await h.gateway.start_run("audit wire", requested_by="U1")
    [g] = await h.opened_gates(run.run_id, 1)
    gid = g.data["gate_id"]
    first = await h.gateway.decide(gid, "approve", by="U2")
    assert first.counted
    again = await h.gateway.decide(gid, "approve", by="U2")  # counts once: no entry
    assert again.refused
    refused = await h.gateway.decide(gid, "approve", by="U1", allow_self_approval=False)
    assert refused.refused
    await h.gateway.decide(gid, "approve", by="U3")
    await h.wait_finished(run.run_id)
    assert [(e.kind, e.get("by")) for e in await trail(h, gid)] == [
        ("opened", "U1"),
        ("counted", "U2"),
        ("approved", "U3"),
        ("executed", ""),
    ]


@tool(requires_approval=True, remind_after=0.3, escalate_after=0.6, escalate_to="S0LEADS")
def drop_table(name: str) -> str:
    """Drop a table."""
    return f"dropped {name}"


async def test_a_reminder_and_an_escalation_are_recorded_once(
    agent_harness: Callable[[Agent], Harness], fake_openai: FakeOpenAI
) -> None:
    h = agent_harness(Agent(name="dba", instructions="x", tools=[drop_table]))
    fake_openai.script("audit nudge", [call("drop_table", {"name": "t"}), reply("ok")])
    run = await h.gateway.start_run("audit nudge", requested_by="U1")
    [g] = await h.opened_gates(run.run_id, 1)
    gid = g.data["gate_id"]
    await h.wait_event(run.run_id, "gate.escalated")
    await h.gateway.decide(gid, "deny", by="U2")
    await h.wait_finished(run.run_id)
    got = await trail(h, gid)
    assert [e.kind for e in got] == ["opened", "reminded", "escalated", "denied"]
    assert got[2].get("to") == '["S0LEADS"]'


async def test_removing_or_forging_an_entry_breaks_the_chain_and_names_it(
    harness: Harness, fake_openai: FakeOpenAI
) -> None:
    h = harness
    gids = []
    for i in range(3):
        run_id, gid = await gated_run(h, fake_openai, f"audit chain {i}", str(i))
        gids.append(gid)
        await h.gateway.decide(gid, "deny", by="U2")
        await h.wait_finished(run_id)
    # Put every gate in one shard's view: check the shards that have entries.
    shards = {h.keys.shard_of(g) for g in gids}
    for shard in shards:
        assert await verified(h, shard) == []
    shard = h.keys.shard_of(gids[0])
    stream = h.keys.audit(shard)
    got = [e async for e in entries(h.redis, h.keys, shard)]
    assert len(got) >= 2
    # Remove the first entry: the second no longer follows the (empty) anchor.
    victim, after = got[0], got[1]
    await h.redis.xdel(stream, victim.id)
    problems = await verified(h, shard)
    assert len(problems) == 1 and f"entry {after.id}" in problems[0], problems
    # Put a forged copy back (by someone else) at the end: it does not follow the head.
    forged = dict(victim.fields)
    forged["by"] = "U666"
    new_id = await h.redis.xadd(stream, forged)  # type: ignore[arg-type]
    problems = await verified(h, shard)
    assert any(f"entry {new_id}" in p for p in problems), problems
    assert any("head" in p for p in problems), problems


async def test_removing_the_last_entry_is_seen_at_the_head_and_by_kept_heads(
    harness: Harness, fake_openai: FakeOpenAI
) -> None:
    h = harness
    run_id, gid = await gated_run(h, fake_openai, "audit tail")
    await h.gateway.decide(gid, "deny", by="U2")
    await h.wait_finished(run_id)
    shard = h.keys.shard_of(gid)
    kept = await read_heads(h.redis, h.keys)
    last = [e async for e in entries(h.redis, h.keys, shard)][-1]
    assert last.kind == "denied"
    await h.redis.xdel(h.keys.audit(shard), last.id)
    problems = await verified(h, shard)
    assert len(problems) == 1 and "head" in problems[0], problems
    # An attacker also moving the head back: the heads kept outside Redis still see it.
    prev = [e async for e in entries(h.redis, h.keys, shard)][-1]
    await h.redis.hset(h.keys.audit_head(shard), mapping={"id": prev.id, "hash": prev.hash})
    assert await verified(h, shard) == []
    found = await verify_shard(h.redis, h.keys, shard, kept)
    assert len(found.problems) == 1 and f"entry {last.id}" in found.problems[0], found


async def test_trimming_by_age_keeps_the_chain_verifiable(
    harness: Harness, fake_openai: FakeOpenAI
) -> None:
    h = harness
    run_id, old = await gated_run(h, fake_openai, "audit old")
    await h.gateway.decide(old, "deny", by="U2")
    await h.wait_finished(run_id)
    await asyncio.sleep(1.2)  # the cut lies between the two gates' entries
    run_id, new = await gated_run(h, fake_openai, "audit new")
    await h.gateway.decide(new, "deny", by="U2")
    await h.wait_finished(run_id)
    removed = await trim(h.gateway.scripts, retention=1.0)
    assert removed >= 2
    assert await trail(h, old) == []
    assert [e.kind for e in await trail(h, new)] == ["opened", "denied"]
    for shard in h.keys.all_shards():
        assert await verified(h, shard) == []
    # Everything trimmed: the next entry still follows the anchor.
    await asyncio.sleep(1.1)
    await trim(h.gateway.scripts, retention=1.0)
    assert await trail(h, new) == []
    run_id, last = await gated_run(h, fake_openai, "audit after")
    await h.gateway.decide(last, "deny", by="U2")
    await h.wait_finished(run_id)
    for shard in h.keys.all_shards():
        assert await verified(h, shard) == []


async def test_memory_per_approved_and_executed_call(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, capsys: pytest.CaptureFixture[str]
) -> None:
    """What docs/operations/audit.md says one approved call costs: its 3 entries (opened,
    approved, executed) in one shard's stream, by MEMORY USAGE."""
    from tests.agents import ops

    h = Harness(redis, core_settings(redis_url, fake_openai.base_url, SHARDS=1), ops)
    h.start_worker()
    try:
        stream = h.keys.audit(0)

        async def calls(n: int, first: int) -> None:
            for i in range(first, first + n):
                run_id, gid = await gated_run(h, fake_openai, f"audit mem {i}", str(1000 + i))
                await h.gateway.decide(gid, "approve", by="U0APPROVER", reason="ok")
                await h.wait_finished(run_id)

        await calls(20, 0)  # past the stream's first node
        before = int(await redis.memory_usage(stream, samples=0) or 0)
        await calls(100, 20)
        after = int(await redis.memory_usage(stream, samples=0) or 0)
        per_call = (after - before) / 100
        with capsys.disabled():
            print(f"\naudit trail: {per_call:.0f} bytes per approved and executed call")
        assert 300 < per_call < 2000, per_call
        assert await verified(h, 0) == []
    finally:
        await h.close()


async def test_a_call_left_in_doubt_by_a_killed_worker_has_one_outcome_entry(
    spawn: Callable[..., WorkerProcess],
    observer: Harness,
    fake_openai: FakeOpenAI,
    redis_url: str,
    journal: Path,
) -> None:
    fake_openai.script("audit doubt", [call("transfer", {"amount": 5}), reply("unknown")])
    first = spawn(redis_url, TEST_SLOW_SECONDS="60")
    run = await observer.gateway.start_run("audit doubt", requested_by="U1")
    [g] = await observer.opened_gates(run.run_id, 1)
    gid = g.data["gate_id"]
    await observer.gateway.decide(gid, "approve", by="U2")
    await wait_journal(journal, "transfer:start:5")
    first.kill()
    spawn(redis_url)
    await observer.wait_finished(run.run_id, timeout=20)
    assert [(e.kind, e.get("by")) for e in await trail(observer, gid)] == [
        ("opened", "U1"),
        ("approved", "U2"),
        ("in_doubt", ""),
    ]
    assert await verified(observer, observer.keys.shard_of(gid)) == []


async def test_verify_on_a_live_trail_finds_nothing_wrong(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI
) -> None:
    """Entries appended (and trimmed) while verify reads are no break."""
    from tests.agents import ops

    h = Harness(redis, core_settings(redis_url, fake_openai.base_url, SHARDS=1), ops)
    h.start_worker()
    try:
        for i in range(3):
            run_id, gid = await gated_run(h, fake_openai, f"audit live {i}", str(i))
            await h.gateway.decide(gid, "deny", by="U2")
            await h.wait_finished(run_id)
        done = asyncio.Event()

        async def writer() -> None:
            for i in range(3, 13):
                run_id, gid = await gated_run(h, fake_openai, f"audit live {i}", str(i))
                await h.gateway.decide(gid, "deny", by="U2")
                await h.wait_finished(run_id)
                if i == 8:
                    await trim(h.gateway.scripts, retention=0.2)
            done.set()

        task = asyncio.create_task(writer())
        checks = 0
        while not done.is_set():
            assert await verified(h, 0) == []
            checks += 1
            await asyncio.sleep(0)
        await task
        assert checks > 1
        assert await verified(h, 0) == []
    finally:
        await h.close()


async def test_a_failed_run_records_its_closed_gate_and_its_calls_never_run_or_in_doubt(
    harness: Harness, fake_openai: FakeOpenAI, redis: Redis
) -> None:
    """FAIL_RUN (the dead-letter path) with four gated calls: one claimed by a dead worker
    (in_doubt), one approved not started (not_run), one denied (no outcome), one pending
    (closed)."""
    from agent_core.testing import calls
    from agent_core.worker import Worker
    from tests.core.test_failed_turns import stop
    from tests.core.test_promises import take_lease

    h = harness
    fake_openai.script(
        "audit four",
        [
            calls(
                [
                    ("sync_mirror", {"name": "m1"}),
                    ("delete_user", {"user_id": "a"}),
                    ("delete_user", {"user_id": "b"}),
                    ("delete_user", {"user_id": "c"}),
                ]
            ),
            reply("reported"),
        ],
    )
    run = await h.gateway.start_run("audit four", requested_by="U1")
    opened = await h.opened_gates(run.run_id, 4)
    await stop(h, h.workers[0][0])
    sync, a, b, c = (e.data for e in opened)
    await h.gateway.decide(sync["gate_id"], "approve", by="U2")
    await h.gateway.decide(a["gate_id"], "approve", by="U2")
    await h.gateway.decide(b["gate_id"], "deny", by="U2")
    fence = await take_lease(redis, h.keys, run.run_id)
    await redis.hset(h.keys.run(run.run_id), "status", "running")
    await redis.hset(h.keys.turn(run.run_id, 1), f"state:{sync['call_id']}", "claimed")
    runner = Worker(redis, h.agent, h.client, h.settings).runner
    assert await runner.fail(run.run_id, "the job kept crashing", fence)
    kinds = {g["gate_id"]: [e.kind for e in await trail(h, g["gate_id"])] for g in (sync, a, b, c)}
    assert kinds == {
        sync["gate_id"]: ["opened", "approved", "in_doubt"],
        a["gate_id"]: ["opened", "approved", "not_run"],
        b["gate_id"]: ["opened", "denied"],
        c["gate_id"]: ["opened", "closed"],
    }
    [closed] = [e for e in await trail(h, c["gate_id"]) if e.kind == "closed"]
    assert closed.get("reason") == "the run failed: the job kept crashing"
    assert await verified(h, h.keys.shard_of(run.run_id)) == []


async def test_an_approved_call_of_a_cancelled_run_is_recorded_as_never_run(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    from tests.core.test_failed_turns import stop

    h = harness
    run_id, gid = await gated_run(h, fake_openai, "audit cancel approved")
    await stop(h, h.workers[0][0])  # the resume job waits: the call never starts
    await h.gateway.decide(gid, "approve", by="U2")
    await h.gateway.cancel_run(run_id, by="U9")
    assert [(e.kind, e.get("by")) for e in await trail(h, gid)] == [
        ("opened", "U1"),
        ("approved", "U2"),
        ("not_run", "U9"),
    ]
    assert read_journal(str(journal)) == []


async def test_a_gated_sub_agent_call_records_its_childs_end_once(
    agent_harness: Callable[[Agent], Harness], fake_openai: FakeOpenAI
) -> None:
    """A gated agent-as-tool call's outcome comes through its child run's report (not
    COMPLETE_CALL): one ``executed`` when the child answers, one ``failed`` when it fails."""
    from agent_core.testing import filtered
    from tests.agents import editing

    h = agent_harness(editing)
    fake_openai.script(
        "audit researcher", [call("researcher", {"task": "who runs Acme"}), reply("ok")]
    )
    fake_openai.script("who runs Acme", [reply("Ada runs Acme.")])
    fake_openai.script(
        "audit researcher fails", [call("researcher", {"task": "say filtered"}), reply("no")]
    )
    fake_openai.script("say filtered", [filtered()])
    ok = await h.gateway.start_run("audit researcher", requested_by="U1")
    bad = await h.gateway.start_run("audit researcher fails", requested_by="U1")
    [g_ok] = await h.opened_gates(ok.run_id, 1)
    [g_bad] = await h.opened_gates(bad.run_id, 1)
    for g in (g_ok, g_bad):
        assert (await h.gateway.decide(g.data["gate_id"], "approve", by="U2")).applied
    for run in (ok, bad):
        await h.wait_finished(run.run_id, timeout=20)
    got = {g.run_id: await trail(h, g.data["gate_id"]) for g in (g_ok, g_bad)}
    assert [(e.kind, e.get("by")) for e in got[ok.run_id]] == [
        ("opened", "U1"),
        ("approved", "U2"),
        ("executed", ""),
    ]
    assert [e.kind for e in got[bad.run_id]] == ["opened", "approved", "failed"]
    for run in (ok, bad):
        [child] = await h.redis.smembers(h.keys.children(run.run_id))
        outcome = got[run.run_id][-1]
        assert (outcome.get("run_id"), outcome.get("tool")) == (run.run_id, "researcher")
        assert outcome.get("child_run") == child
    for shard in {h.keys.shard_of(r.run_id) for r in (ok, bad)}:
        assert await verified(h, shard) == []


@pytest.mark.parametrize("cancelled", ["child", "parent"])
async def test_a_cancelled_gated_sub_agent_call_records_failed_once(
    agent_harness: Callable[[Agent], Harness], fake_openai: FakeOpenAI, cancelled: str
) -> None:
    """The child (or its parent, which cancels it) cancelled while the child waits on its
    own gate: the parent's approved call ends ``failed``, once, beside the child's own
    gate's ``closed``."""
    from tests.agents import billing
    from tests.core.test_subagents import child_gate

    front = Agent(
        name="audit_front",
        instructions="You ask billing, with an approval.",
        tools=[billing.as_tool(requires_approval=True)],
    )
    h = agent_harness(front)
    fake_openai.script(
        "audit billing cancel", [call("billing", {"task": "refund 9"}), reply("stopped")]
    )
    fake_openai.script("refund 9", [call("refund", {"order": 9}), reply("never")])
    run = await h.gateway.start_run("audit billing cancel", requested_by="U1")
    [g] = await h.opened_gates(run.run_id, 1)
    gid = g.data["gate_id"]
    await h.gateway.decide(gid, "approve", by="U2")
    child, own = await child_gate(h, run.run_id)  # the child's refund, on this thread
    await h.gateway.cancel_run(child if cancelled == "child" else run.run_id, by="U9")
    await h.wait_finished(run.run_id, timeout=20)
    await h.wait_finished(child, timeout=20)
    got = await trail(h, gid)
    assert [e.kind for e in got] == ["opened", "approved", "failed"]
    assert got[-1].get("after_cancel") == ("true" if cancelled == "parent" else "false")
    assert [e.kind for e in await trail(h, own["gate_id"])] == ["opened", "closed"]
    assert await verified(h, h.keys.shard_of(gid)) == []


async def test_an_approved_call_whose_arguments_changed_is_recorded_as_not_run(
    harness: Harness, fake_openai: FakeOpenAI, journal: Path, redis: Redis
) -> None:
    """The arguments the approver saw no longer match the call's (changed in Redis while the
    run waited): the approval is not applied, and the trail says ``not_run``, once."""
    import json

    from agent_core.messages import args_changed
    from tests.core.test_failed_turns import start, stop

    h = harness
    fake_openai.script(
        "audit changed",
        [
            call("delete_user", {"user_id": "5"}),
            reply("ok", expect=told_exactly(args_changed("delete_user"))),
        ],
    )
    run = await h.gateway.start_run("audit changed", requested_by="U1")
    [g] = await h.opened_gates(run.run_id, 1)
    gid, cid = g.data["gate_id"], g.data["call_id"]
    await stop(h, h.workers[0][0])  # the resume job waits until the arguments changed
    await h.gateway.decide(gid, "approve", by="U2")
    tkey = h.keys.turn(run.run_id, 1)
    stored = json.loads(await redis.hget(tkey, f"call:{cid}"))
    await redis.hset(tkey, f"call:{cid}", json.dumps({**stored, "args": {"user_id": "6"}}))
    start(h, h.agent)
    await h.wait_finished(run.run_id)
    assert read_journal(str(journal)) == []
    assert [(e.kind, e.get("by")) for e in await trail(h, gid)] == [
        ("opened", "U1"),
        ("approved", "U2"),
        ("not_run", ""),
    ]
    assert await verified(h, h.keys.shard_of(gid)) == []
