"""More than one approver (agent_core.quorum): counted inside DECIDE_GATE, atomically."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from agent_core import Agent, Decision, GateStatus, RunStatus, Tool, ToolDefinitionError, tool
from agent_core.testing import FakeOpenAI, call, reply, tool_messages
from tests.agents import quorum, quorum_two_rules, read_journal, told_exactly
from tests.conftest import RedisServerFactory
from tests.core.conftest import core_settings
from tests.core.harness import Harness

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def h(agent_harness: Callable[[Agent], Harness]) -> Harness:
    return agent_harness(quorum)


async def _open(h: Harness, fake_openai: FakeOpenAI, task: str, *steps: Any) -> tuple[str, str]:
    fake_openai.script(task, list(steps))
    run = await h.gateway.start_run(task, requested_by="U1")
    [g] = await h.opened_gates(run.run_id, 1)
    return run.run_id, g.data["gate_id"]


async def test_two_approvals_decide_and_the_model_is_told_both_approvers(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    run_id, gid = await _open(
        h,
        fake_openai,
        "wire 500",
        call("wire", {"amount": 500}),
        reply("sent", expect=told_exactly("wired 500\n\nApproved by U2 and U3.")),
    )
    gate = await h.gateway.get_gate(gid)
    assert gate is not None and gate.quorum is not None
    assert (gate.quorum.count, gate.quorum.groups, gate.approvals) == (2, [], [])
    first = await h.gateway.decide(gid, "approve", by="U2", args_hash=gate.args_hash)
    assert (first.applied, first.counted, first.refused) == (False, True, None)
    assert first.gate.status is GateStatus.PENDING
    assert [(a.by, a.hash, a.group) for a in first.gate.approvals] == [("U2", gate.args_hash, "")]
    approval = await h.wait_event(run_id, "gate.approval")
    assert (approval.data["by"], approval.data["count"], approval.data["needed"]) == ("U2", 1, 2)
    assert await h.status(run_id) is RunStatus.AWAITING_APPROVAL
    assert read_journal(str(journal)) == []
    second = await h.gateway.decide(gid, "approve", by="U3", args_hash=gate.args_hash)
    assert second.applied and not second.counted
    assert (second.gate.status, second.gate.decided_by) == (GateStatus.APPROVED, "U3")
    assert [a.by for a in second.gate.approvals] == ["U2", "U3"]
    done = await h.wait_finished(run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "sent")
    assert read_journal(str(journal)) == ["wire:500"]


async def test_the_same_person_counts_once_and_a_requester_never(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    run_id, gid = await _open(
        h, fake_openai, "wire 700", call("wire", {"amount": 700}), reply("sent")
    )
    assert (await h.gateway.decide(gid, "approve", by="U2")).counted
    again = await h.gateway.decide(gid, "approve", by="U2")
    assert (again.applied, again.counted, again.refused) == (False, False, "again")
    assert [a.by for a in again.gate.approvals] == ["U2"]
    # The requester (U1 started the run) is refused when self-approval is off.
    own = await h.gateway.decide(gid, "approve", by="U1", allow_self_approval=False)
    assert own.refused == "requester" and not own.applied
    assert [a.by for a in own.gate.approvals] == ["U2"]
    # Approve all (decide_many) counts the clicker once per gate, with the same checks.
    [many] = await h.gateway.decide_many([gid], "approve", by="U1", allow_self_approval=False)
    assert many.refused == "requester"
    assert (await h.gateway.get_gate(gid)).status is GateStatus.PENDING  # type: ignore[union-attr]
    [last] = await h.gateway.decide_many([gid], "approve", by="U4", allow_self_approval=False)
    assert last.applied and [a.by for a in last.gate.approvals] == ["U2", "U4"]
    await h.wait_finished(run_id)
    assert read_journal(str(journal)) == ["wire:700"]


async def test_a_requester_is_refused_on_a_single_approval_gate_too(
    h: Harness, fake_openai: FakeOpenAI
) -> None:
    run_id, gid = await _open(
        h, fake_openai, "restart api", call("restart", {"service": "api"}), reply("ok")
    )
    gate = await h.gateway.get_gate(gid)
    assert gate is not None and gate.quorum is None  # the tool's approvals=1 wins
    own = await h.gateway.decide(gid, "approve", by="U1", allow_self_approval=False)
    assert own.refused == "requester" and own.gate.status is GateStatus.PENDING
    # The starter may still deny their own run's call.
    denied = await h.gateway.decide(gid, "deny", by="U1", reason="changed my mind")
    assert denied.applied and denied.gate.status is GateStatus.DENIED
    await h.wait_finished(run_id)


async def test_one_deny_ends_a_half_met_quorum_and_the_model_is_told_who_and_why(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    run_id, gid = await _open(
        h,
        fake_openai,
        "wire 900",
        call("wire", {"amount": 900}),
        reply(
            "not sent",
            expect=told_exactly(
                "Not executed: the user U3 declined this call to wire. Their reason: too "
                "much on a Friday Do not retry this call (or an equivalent one) unless the "
                "user asks you to."
            ),
        ),
    )
    assert (await h.gateway.decide(gid, "approve", by="U2")).counted
    res = await h.gateway.decide(gid, Decision.DENY, by="U3", reason="too much on a Friday")
    assert res.applied and res.gate.status is GateStatus.DENIED
    assert res.gate.decided_by == "U3"
    late = await h.gateway.decide(gid, "approve", by="U4")
    assert not late.applied and not late.counted and late.gate.status is GateStatus.DENIED
    done = await h.wait_finished(run_id)
    assert done.final == "not sent"
    assert read_journal(str(journal)) == []


async def test_racing_last_approvals_give_one_decision_one_resume_one_execution(
    h: Harness, fake_openai: FakeOpenAI, journal: Path, redis: Redis
) -> None:
    for i in range(6):
        run_id, gid = await _open(
            h, fake_openai, f"wire {1000 + i}", call("wire", {"amount": 1000 + i}), reply("ok")
        )
        assert (await h.gateway.decide(gid, "approve", by="U2")).counted
        a, b = await asyncio.gather(
            h.gateway.decide(gid, "approve", by="U3"), h.gateway.decide(gid, "approve", by="U4")
        )
        assert [a.applied, b.applied].count(True) == 1, (a, b)
        loser = b if a.applied else a
        assert not loser.counted and loser.gate.status is GateStatus.APPROVED
        winner = a if a.applied else b
        assert [x.by for x in winner.gate.approvals] == ["U2", winner.gate.decided_by]
        await h.wait_finished(run_id)
        decided = [
            e for e in await h.events() if e.run_id == run_id and e.type.value == "gate.decided"
        ]
        assert len(decided) == 1
    # Every run: one start job and one resume job, ever (runs spread over the shards).
    added = 0
    for shard in h.keys.all_shards():
        if await redis.exists(h.keys.jobs(shard)):
            added += (await redis.xinfo_stream(h.keys.jobs(shard)))["entries-added"]
    assert added == 12
    assert sorted(read_journal(str(journal))) == [f"wire:{1000 + i}" for i in range(6)]


async def test_racing_first_approvals_both_count(h: Harness, fake_openai: FakeOpenAI) -> None:
    run_id, gid = await _open(h, fake_openai, "wire 1", call("wire", {"amount": 3000}), reply("ok"))
    a, b = await asyncio.gather(
        h.gateway.decide(gid, "approve", by="U2"), h.gateway.decide(gid, "approve", by="U2")
    )
    # Either may be first: one is counted, the other told it approved already.
    assert sorted([(a.counted, a.refused), (b.counted, b.refused)], key=str) == [
        (False, "again"),
        (True, None),
    ]
    a, b = await asyncio.gather(
        h.gateway.decide(gid, "approve", by="U3"), h.gateway.decide(gid, "approve", by="U4")
    )
    assert [a.applied, b.applied].count(True) == 1
    await h.wait_finished(run_id)


async def test_a_group_quorum_takes_one_approver_from_each_group(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    run_id, gid = await _open(
        h,
        fake_openai,
        "rotate prod",
        call("rotate_keys", {"env": "prod"}),
        reply("rotated", expect=told_exactly("keys of prod rotated\n\nApproved by U2 and U5.")),
    )
    gate = await h.gateway.get_gate(gid)
    assert gate is not None and gate.quorum is not None
    assert gate.quorum.groups == ["S0SRE", "S0SECURITY"] and gate.quorum.count == 2
    nobody = await h.gateway.decide(gid, "approve", by="U9", groups=[])
    assert nobody.refused == "not_member"
    sre = await h.gateway.decide(gid, "approve", by="U2", groups=["S0SRE"])
    assert sre.counted and sre.gate.approvals[0].group == "S0SRE"
    # Another SRE: their group has approved already.
    other_sre = await h.gateway.decide(gid, "approve", by="U3", groups=["S0SRE"])
    assert other_sre.refused == "group"
    # Someone in both groups fills the one still open.
    both = await h.gateway.decide(gid, "approve", by="U5", groups=["S0SRE", "S0SECURITY"])
    assert both.applied and both.gate.status is GateStatus.APPROVED
    assert [(a.by, a.group) for a in both.gate.approvals] == [
        ("U2", "S0SRE"),
        ("U5", "S0SECURITY"),
    ]
    await h.wait_finished(run_id)
    assert read_journal(str(journal)) == ["rotate_keys:prod"]


async def test_a_rule_adds_one_approval_and_never_completes_a_quorum(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    run_id, gid = await _open(
        h,
        fake_openai,
        "wire 50",
        call("wire", {"amount": 50}),
        reply(
            "ok",
            expect=told_exactly(
                "wired 50\n\nApproved by rule small_wires (reason: small amount) and U2."
            ),
        ),
    )
    gate = await h.gateway.get_gate(gid)
    assert gate is not None and gate.status is GateStatus.PENDING
    assert [(a.by, a.reason) for a in gate.approvals] == [("rule:small_wires", "small amount")]
    opened = await h.wait_event(run_id, "gate.opened")
    assert opened.data["approvals"][0]["by"] == "rule:small_wires"
    done = await h.gateway.decide(gid, "approve", by="U2")
    assert done.applied and done.gate.status is GateStatus.APPROVED
    await h.wait_finished(run_id)
    assert read_journal(str(journal)) == ["wire:50"]


async def test_a_rule_on_a_group_quorum_fills_no_group(h: Harness, fake_openai: FakeOpenAI) -> None:
    run_id, gid = await _open(
        h, fake_openai, "rotate staging", call("rotate_keys", {"env": "staging"}), reply("ok")
    )
    assert (await h.gateway.decide(gid, "approve", by="U2", groups=["S0SRE"])).counted
    done = await h.gateway.decide(gid, "approve", by="U3", groups=["S0SECURITY"])
    assert done.applied
    assert [a.by for a in done.gate.approvals] == ["rule:small_wires", "U2", "U3"]
    await h.wait_finished(run_id)


async def test_a_rule_may_still_deny_a_quorum_gate(h: Harness, fake_openai: FakeOpenAI) -> None:
    fake_openai.script("purge audit", [call("purge", {"table": "audit"}), reply("no")])
    run = await h.gateway.start_run("purge audit", requested_by="U1")
    done = await h.wait_finished(run.run_id)
    [gate] = await h.gateway.gates(run.run_id)
    assert (gate.status, gate.decided_by) == (GateStatus.DENIED, "rule:small_wires")
    assert gate.quorum is not None and gate.quorum.count == 2  # the agent's approvals=2
    assert done.final == "no"


async def test_two_approving_rules_add_one_approval(
    agent_harness: Callable[[Agent], Harness], fake_openai: FakeOpenAI
) -> None:
    h = agent_harness(quorum_two_rules)
    run_id, gid = await _open(h, fake_openai, "wire 60", call("wire", {"amount": 60}), reply("ok"))
    gate = await h.gateway.get_gate(gid)
    assert gate is not None and gate.status is GateStatus.PENDING
    assert [a.by for a in gate.approvals] == ["rule:small_wires"]
    assert (await h.gateway.decide(gid, "approve", by="U2")).applied
    await h.wait_finished(run_id)


async def test_expiry_ends_a_half_met_quorum(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    h = Harness(redis, core_settings(redis_url, fake_openai.base_url, APPROVAL_TIMEOUT=1), quorum)
    h.start_worker()
    try:
        run_id, gid = await _open(
            h,
            fake_openai,
            "wire 10000",
            call("wire", {"amount": 10000}),
            reply("timed out", expect=lambda m: "timed out" in tool_messages(m)[-1]["content"]),
        )
        assert (await h.gateway.decide(gid, "approve", by="U2")).counted
        done = await h.wait_finished(run_id)
        assert done.final == "timed out"
        gate = await h.gateway.get_gate(gid)
        assert gate is not None and gate.status is GateStatus.EXPIRED
        assert [a.by for a in gate.approvals] == ["U2"]  # kept, for the record
        late = await h.gateway.decide(gid, "approve", by="U3")
        assert not late.applied and late.gate.status is GateStatus.EXPIRED
    finally:
        await h.close()
    assert read_journal(str(journal)) == []


async def test_a_half_met_quorum_survives_a_redis_restart_from_its_aof(
    aof_redis: RedisServerFactory, fake_openai: FakeOpenAI, journal: Path
) -> None:
    server = aof_redis()
    client = Redis.from_url(server.url, decode_responses=True)
    h = Harness(client, core_settings(server.url, fake_openai.base_url), quorum)
    h.start_worker()
    try:
        run_id, gid = await _open(
            h,
            fake_openai,
            "wire 4242",
            call("wire", {"amount": 4242}),
            reply("ok", expect=told_exactly("wired 4242\n\nApproved by U2 and U3.")),
        )
        assert (await h.gateway.decide(gid, "approve", by="U2")).counted
        await h.close()
        await client.aclose()
        server.kill()  # SIGKILL: only the append-only file survives
        await asyncio.sleep(0.3)
        server.start()
        client = Redis.from_url(server.url, decode_responses=True)
        h = Harness(client, core_settings(server.url, fake_openai.base_url), quorum)
        h.start_worker()
        gate = await h.gateway.get_gate(gid)
        assert gate is not None and gate.status is GateStatus.PENDING
        assert [a.by for a in gate.approvals] == ["U2"]
        assert (await h.gateway.decide(gid, "approve", by="U2")).refused == "again"
        assert (await h.gateway.decide(gid, "approve", by="U3")).applied
        done = await h.wait_finished(run_id, timeout=20)
        assert done.status is RunStatus.COMPLETED
    finally:
        await h.close()
        await client.aclose()
    assert read_journal(str(journal)) == ["wire:4242"]


def test_approvals_options_are_checked_with_clear_errors() -> None:
    def f(x: int) -> str:
        return ""

    assert Tool.from_function(f, approvals=2).approvals == 2
    assert Tool.from_function(f, approvals=["S0SRE"]).approvals == ("S0SRE",)
    for bad, message in [
        (0, "tool f: approvals must be between 1 and 10, not 0"),
        (11, "tool f: approvals must be between 1 and 10, not 11"),
        (True, "tool f: approvals must be a number of approvers"),
        ("S0SRE", "tool f: approvals must be a number of approvers"),
        (
            ["U123"],
            "tool f: approvals lists user-group IDs (S followed by capitals and digits, as S0SRE); 'U123' is not one",
        ),
        (["S0SRE", "S0SRE"], "tool f: approvals names a user group twice"),
        ([], "tool f: approvals lists 1 to 10 user groups"),
    ]:
        with pytest.raises(ToolDefinitionError) as err:
            tool(approvals=bad)(f)  # type: ignore[arg-type]
        assert str(err.value).startswith(message), err.value
    with pytest.raises(
        ValueError, match=r"^agent 'a': approvals must be between 1 and 10, not 20$"
    ):
        Agent(name="a", instructions="", approvals=20)


async def test_a_retried_approval_recognises_its_own_count(
    h: Harness, fake_openai: FakeOpenAI
) -> None:
    """A counted approval whose reply was lost, sent again with the same attempt, is told
    `counted` again and writes nothing more (invariant 11); the completing one, `applied`."""
    run_id, gid = await _open(
        h, fake_openai, "wire 3100", call("wire", {"amount": 3100}), reply("ok")
    )
    mine = {"by": "U2", "reason": "", "attempt": "click-a", "seen_hash": ""}
    first, _ = await h.gateway.scripts.decide_gate(gid, run_id, "approved", **mine)
    again, _ = await h.gateway.scripts.decide_gate(gid, run_id, "approved", **mine)
    assert (first.outcome.value, again.outcome.value) == ("counted", "counted")
    gate = await h.gateway.get_gate(gid)
    assert gate is not None and [a.by for a in gate.approvals] == ["U2"]
    events = [e for e in await h.events() if e.run_id == run_id]
    assert [e.type.value for e in events].count("gate.approval") == 1
    last = {"by": "U3", "reason": "", "attempt": "click-b", "seen_hash": ""}
    done, _ = await h.gateway.scripts.decide_gate(gid, run_id, "approved", **last)
    retry, _ = await h.gateway.scripts.decide_gate(gid, run_id, "approved", **last)
    assert (done.outcome.value, retry.outcome.value) == ("applied", "applied")
    await h.wait_finished(run_id)
