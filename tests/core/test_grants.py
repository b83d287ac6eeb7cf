"""Allow for this thread (agent_core.grants): an approval that records a grant, which
approves the thread's later matching calls at OPEN_GATES, and nothing elsewhere."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agent_core import Agent, GateStatus, RunStatus, ToolDefinitionError, tool
from agent_core.audit import entries, verify_shard
from agent_core.grants import allow_for_of, grant_note
from agent_core.script_replies import RevokeOutcome
from agent_core.testing import FakeOpenAI, call, reply, tool_messages
from tests.agents import read_journal, shipping
from tests.core.harness import Harness

pytestmark = pytest.mark.timeout(60)
PAUSED_OR_DONE = ("awaiting_approval", "completed", "failed", "cancelled")


@pytest.fixture
async def h(agent_harness: Callable[[Agent], Harness]) -> Harness:
    return agent_harness(shipping)


async def _first(
    h: Harness, fake_openai: FakeOpenAI, task: str, *steps: Any, by: str = "U1"
) -> tuple[str, str]:
    fake_openai.script(task, list(steps))
    run = await h.gateway.start_run(task, requested_by=by)
    [g] = await h.opened_gates(run.run_id, 1)
    return run.run_id, g.data["gate_id"]


async def _grant(h: Harness, gid: str, by: str = "U2", **kw: Any) -> Any:
    gate = await h.gateway.get_gate(gid)
    assert gate is not None
    return await h.gateway.grants.approve_and_allow(
        gid, by, args_hash=gate.args_hash, allow_self_approval=False, **kw
    )


async def _next_gate(h: Harness, run_id: str, n: int) -> Any:
    """The run's ``n``-th gate, once the run paused for a person or finished."""
    await h.gateway.wait(run_id, PAUSED_OR_DONE, timeout=10)
    gates = await h.gateway.gates(run_id)
    assert len(gates) >= n, gates
    return gates[n - 1]


async def test_a_grant_decides_a_later_call_in_the_thread_and_the_model_is_told(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    seen: list[str] = []

    def told(messages: list[dict[str, Any]]) -> None:
        seen.append(tool_messages(messages)[-1]["content"])

    run_id, gid = await _first(
        h,
        fake_openai,
        "ship 1",
        call("ship", {"env": "staging", "version": 1}),
        reply("shipped 1"),
        call("ship", {"env": "staging", "version": 2}),
        reply("shipped 2", expect=told),
    )
    made = await _grant(h, gid, field="env", value="staging")
    assert made.decision is not None and made.decision.applied
    grant = made.grant
    assert grant is not None
    assert (grant.scope, grant.agent, grant.tool, grant.granted_by) == (
        run_id,
        "shipping",
        "ship",
        "U2",
    )
    assert (grant.field, grant.value, grant.gate_id) == ("env", "staging", gid)
    assert 3590 < grant.expires_at - grant.created_at <= 3601
    gate = made.decision.gate
    assert (gate.status, gate.decided_by, gate.granted) == (
        GateStatus.APPROVED,
        "U2",
        grant.grant_id,
    )
    created = await h.wait_event(run_id, "grant.created")
    assert (created.data["id"], created.data["granted_by"]) == (grant.grant_id, "U2")
    assert (await h.gateway.wait(run_id, timeout=10)).final == "shipped 1"

    # The same requester continues the thread: the grant decides, nobody is asked.
    await h.gateway.continue_run(run_id, "ship 2 too", by="U1")
    done = await h.gateway.wait(run_id, timeout=10)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "shipped 2")
    second = await _next_gate(h, run_id, 2)
    assert (second.status, second.decided_by) == (GateStatus.APPROVED, f"grant:{grant.grant_id}")
    assert (second.grant_id, second.granted_by) == (grant.grant_id, "U2")
    assert second.grant_until == pytest.approx(grant.expires_at, abs=0.01)
    note = grant_note("U2", "ship", grant.expires_at, grant.created_at)
    assert seen == [f"shipped 2 to staging\n\nApproved by {note}."]
    assert note.startswith("U2's grant (allow `ship` in this thread until ")
    assert read_journal(str(journal)) == ["ship:staging:1", "ship:staging:2"]


async def test_a_grant_decides_nothing_in_another_thread_agent_tool_or_outside_its_constraint(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    run_id, gid = await _first(
        h,
        fake_openai,
        "ship a",
        call("ship", {"env": "staging", "version": 1}),
        reply("one"),
        call("ship", {"env": "prod", "version": 2}),
        reply("two"),
        call("flush", {"cache": "staging"}),
        reply("three"),
    )
    made = await _grant(h, gid, field="env", value="staging")
    assert made.grant is not None
    await h.gateway.wait(run_id, timeout=10)
    # Outside the constraint (env=prod): a person is asked.
    await h.gateway.continue_run(run_id, "prod now", by="U1")
    prod = await _next_gate(h, run_id, 2)
    assert (prod.status, prod.grant_id) == (GateStatus.PENDING, "")
    await h.gateway.decide(prod.gate_id, "deny", by="U2", reason="not prod")
    await h.gateway.wait(run_id, timeout=10)
    # Another tool of the thread: asked.
    await h.gateway.continue_run(run_id, "flush", by="U1")
    flush = await _next_gate(h, run_id, 3)
    assert (flush.tool, flush.status) == ("flush", GateStatus.PENDING)
    # Another thread of the same agent and requester: asked.
    other, other_gid = await _first(
        h,
        fake_openai,
        "ship b",
        call("ship", {"env": "staging", "version": 1}),
        reply("b"),
        call("ship", {"env": "staging", "version": 1}),
        reply("b2"),
    )
    assert (await h.gateway.get_gate(other_gid)).status is GateStatus.PENDING  # type: ignore[union-attr]
    assert other != run_id
    # A grant of another agent (a sub-agent with a tool of the same name) decides nothing.
    other_grant = (await _grant(h, other_gid)).grant
    assert other_grant is not None
    await h.gateway.wait(other, timeout=10)
    key = h.keys.grants(other)
    raw = str(await h.redis.hget(key, other_grant.grant_id))
    await h.redis.hset(key, other_grant.grant_id, raw.replace('"agent":"shipping"', '"agent":"x"'))
    await h.gateway.continue_run(other, "ship b again", by="U1")
    assert (await _next_gate(h, other, 2)).status is GateStatus.PENDING
    assert read_journal(str(journal)) == ["ship:staging:1", "ship:staging:1"]


async def test_a_revoked_grant_asks_again_and_an_expired_one_too(
    h: Harness, fake_openai: FakeOpenAI
) -> None:
    run_id, gid = await _first(
        h,
        fake_openai,
        "ship r",
        call("ship", {"env": "staging", "version": 1}),
        reply("one"),
        call("ship", {"env": "staging", "version": 2}),
        reply("two"),
        call("ship", {"env": "staging", "version": 3}),
        reply("three"),
    )
    grant = (await _grant(h, gid)).grant
    assert grant is not None
    assert [g.grant_id for g in await h.gateway.grants.live()] == [grant.grant_id]
    await h.gateway.wait(run_id, timeout=10)
    assert await h.gateway.grants.revoke(grant.grant_id, "U3") is RevokeOutcome.REVOKED
    assert await h.gateway.grants.revoke(grant.grant_id, "U3") is RevokeOutcome.ENDED
    revoked = await h.wait_event(run_id, "grant.revoked")
    assert (revoked.data["grant_id"], revoked.data["by"]) == (grant.grant_id, "U3")
    assert await h.gateway.grants.live() == []
    await h.gateway.continue_run(run_id, "again", by="U1")
    again = await _next_gate(h, run_id, 2)
    assert (again.status, again.grant_id) == (GateStatus.PENDING, "")

    # A second grant, made to expire now: the next call asks again.
    second = (await _grant(h, again.gate_id)).grant
    assert second is not None
    await h.gateway.wait(run_id, timeout=10)
    key = h.keys.grants(run_id)
    raw = await h.redis.hget(key, second.grant_id)
    await h.redis.hset(
        key,
        second.grant_id,
        raw.replace(  # type: ignore[union-attr]
            f'"expires_at":{second.expires_at:.14g}', '"expires_at":1'
        ),
    )
    stored = await h.gateway.grants.get(second.grant_id)
    assert stored is not None and stored.expires_at == 1 and not stored.live()
    await h.gateway.continue_run(run_id, "third", by="U1")
    third = await _next_gate(h, run_id, 3)
    assert (third.status, third.grant_id) == (GateStatus.PENDING, "")


async def test_a_requester_cannot_grant_to_themselves_nor_through_a_grant(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    run_id, gid = await _first(
        h,
        fake_openai,
        "ship s",
        call("ship", {"env": "staging", "version": 1}),
        reply("one"),
        call("ship", {"env": "staging", "version": 2}),
        reply("two"),
    )
    # The requester's own "approve & allow" (a forged click) is refused, nothing recorded.
    mine = await _grant(h, gid, by="U1")
    assert mine.grant is None and mine.refused == "requester"
    assert await h.redis.hlen(h.keys.grants(run_id)) == 0
    # U2 grants; then U2 speaks in the thread and becomes a requester: their grant no
    # longer decides the thread's calls.
    assert (await _grant(h, gid, by="U2")).grant is not None
    await h.gateway.wait(run_id, timeout=10)
    await h.gateway.continue_run(run_id, "ship 2 please", by="U2")
    later = await _next_gate(h, run_id, 2)
    assert (later.status, later.grant_id) == (GateStatus.PENDING, "")
    assert read_journal(str(journal)) == ["ship:staging:1"]


async def test_a_tool_without_allow_for_cannot_be_granted_and_bad_constraints_are_refused(
    agent_harness: Callable[[Agent], Harness], fake_openai: FakeOpenAI
) -> None:
    from tests.agents import ops

    h = agent_harness(ops)
    fake_openai.script("delete 7", [call("delete_user", {"user_id": "7"}), reply("ok")])
    run = await h.gateway.start_run("delete 7", requested_by="U1")
    [g] = await h.opened_gates(run.run_id, 1)
    gid = g.data["gate_id"]
    refused = await _grant(h, gid)
    assert (refused.decision, refused.grant, refused.refused) == (None, None, "not_allowed")
    assert (await h.gateway.get_gate(gid)).status is GateStatus.PENDING  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="not an argument"):
        await _grant(h, gid, field="nope", value="x")
    with pytest.raises(ValueError, match="is not"):
        await _grant(h, gid, field="user_id", value="8")


def test_allow_for_is_refused_with_a_quorum_and_checked() -> None:
    with pytest.raises(ToolDefinitionError, match="allow_for cannot be combined with approvals"):

        @tool(requires_approval=True, approvals=2, allow_for=60)
        def two(x: int) -> str:
            return ""

    with pytest.raises(ToolDefinitionError, match="allow_for must be a number of seconds"):

        @tool(requires_approval=True, allow_for=-1)
        def bad(x: int) -> str:
            return ""

    @tool(requires_approval=True, allow_for=0)
    def off(x: int) -> str:
        return ""

    @tool(requires_approval=True)
    def unset(x: int) -> str:
        return ""

    # The agent's allow_for is for the tools that set none; 0 on a tool turns it off.
    agent = Agent(name="a", instructions="i", tools=[off, unset], allow_for=timedelta(minutes=5))
    assert (allow_for_of(agent, off), allow_for_of(agent, unset)) == (0.0, 300.0)
    with pytest.raises(ValueError, match="agent 'b': allow_for cannot be combined"):
        Agent(name="b", instructions="i", tools=[unset], approvals=2, allow_for=60)


async def test_grants_die_with_the_threads_retention(h: Harness, fake_openai: FakeOpenAI) -> None:
    run_id, gid = await _first(
        h, fake_openai, "ship p", call("ship", {"env": "staging", "version": 1}), reply("one")
    )
    grant = (await _grant(h, gid)).grant
    assert grant is not None
    await h.gateway.wait(run_id, timeout=10)
    assert await h.gateway.purge_finished(0) == 1
    assert await h.redis.exists(h.keys.grants(run_id)) == 0
    assert await h.gateway.grants.get(grant.grant_id) is None
    assert await h.gateway.grants.live() == []


async def test_a_grant_in_a_sub_agents_call_decides_its_next_call_in_the_same_thread(
    agent_harness: Callable[[Agent], Harness], fake_openai: FakeOpenAI, journal: Path
) -> None:
    from tests.agents import ship_desk

    h = agent_harness(ship_desk)
    fake_openai.script(
        "release twice",
        [
            call("shipping", {"task": "ship 1 to staging"}),
            call("shipping", {"task": "ship 2 to staging"}),
            reply("both out"),
        ],
    )
    for n in (1, 2):
        fake_openai.script(
            f"ship {n} to staging",
            [call("ship", {"env": "staging", "version": n}), reply(f"shipped {n}")],
        )
    run = await h.gateway.start_run("release twice", requested_by="U1")
    gates: list[Any] = []

    async def nested() -> list[Any]:
        for _ in range(200):
            for e in await h.events(block_ms=100):
                origin = e.data.get("origin") or {}
                if e.type.value == "gate.opened" and origin.get("parent_run") == run.run_id:
                    gates.append(e)
            if gates:
                return gates
        raise AssertionError("no nested gate")

    [first] = await nested()
    made = await _grant(h, first.data["gate_id"])
    assert made.grant is not None and made.grant.scope == run.run_id  # the thread's top run
    assert made.grant.agent == "shipping"
    done = await h.gateway.wait(run.run_id, timeout=20)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "both out")
    await h.events(block_ms=100)
    by_grant = [
        e
        for e in h._seen
        if e.type.value == "gate.decided" and e.data.get("by") == f"grant:{made.grant.grant_id}"
    ]
    assert len(by_grant) == 1 and by_grant[0].run_id != first.run_id  # the second child's
    assert by_grant[0].data["granted_by"] == "U2"
    assert read_journal(str(journal)) == ["ship:staging:1", "ship:staging:2"]


async def test_racing_grants_and_approvals_give_one_decision_and_at_most_one_grant(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    run_id, gid = await _first(
        h, fake_openai, "ship race", call("ship", {"env": "staging", "version": 1}), reply("ok")
    )
    gate = await h.gateway.get_gate(gid)
    assert gate is not None
    results = await asyncio.gather(
        _grant(h, gid, by="U2"),
        _grant(h, gid, by="U3"),
        h.gateway.decide(gid, "approve", by="U4", args_hash=gate.args_hash),
    )
    grants, plain = results[:2], results[2]
    applied = [r.decision.applied for r in grants if r.decision] + [plain.applied]
    assert applied.count(True) == 1
    made = [r.grant for r in grants if r.grant is not None]
    assert len(made) == (0 if plain.applied else 1)
    assert await h.redis.hlen(h.keys.grants(run_id)) == len(made)
    await h.gateway.wait(run_id, timeout=10)
    assert read_journal(str(journal)) == ["ship:staging:1"]


async def test_the_audit_trail_records_the_grant_what_it_decided_and_its_revocation(
    h: Harness, fake_openai: FakeOpenAI
) -> None:
    run_id, gid = await _first(
        h,
        fake_openai,
        "ship audit",
        call("ship", {"env": "staging", "version": 1}),
        reply("one"),
        call("ship", {"env": "staging", "version": 2}),
        reply("two"),
    )
    grant = (await _grant(h, gid, field="env", value="staging")).grant
    assert grant is not None
    await h.gateway.wait(run_id, timeout=10)
    await h.gateway.continue_run(run_id, "again", by="U1")
    await h.gateway.wait(run_id, ("completed",), timeout=10)
    second = await _next_gate(h, run_id, 2)
    assert await h.gateway.grants.revoke(grant.grant_id, "U3") is RevokeOutcome.REVOKED
    shard = h.keys.shard_of(run_id)
    trail = [e async for e in entries(h.redis, h.keys, shard) if e.get("run_id") == run_id]
    got = [(e.kind, e.get("gate_id"), e.get("by")) for e in trail]
    assert got == [
        ("opened", gid, "U1"),
        ("approved", gid, "U2"),
        ("granted", gid, "U2"),
        ("executed", gid, ""),
        ("opened", second.gate_id, "U1"),
        ("approved", second.gate_id, f"grant:{grant.grant_id}"),
        ("executed", second.gate_id, ""),
        ("revoked", gid, "U3"),
    ]
    granted, revoked = trail[2], trail[-1]
    assert (granted.get("grant_id"), granted.get("field"), granted.get("value")) == (
        grant.grant_id,
        "env",
        '"staging"',
    )
    assert float(granted.get("until")) == pytest.approx(grant.expires_at, abs=0.01)
    assert (revoked.get("grant_id"), revoked.get("granted_by")) == (grant.grant_id, "U2")
    assert (await verify_shard(h.redis, h.keys, shard)).problems == []
