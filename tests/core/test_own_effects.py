"""Invariant 11: a retried script recognises its own earlier effect.

A script's reply can be lost after Redis applied it (a master killed, a connection dropped):
the client retries it. The retry must answer as the first run did, never turn the caller's
own claim, decision, lease or step into someone else's. Scripts are run twice here with the
same identity on a real Redis; and a worker's claim is sent through a proxy that loses the
reply after Redis applied it (tests/tcp_proxy.py), so that redis-py's own retry runs it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis

from agent_core import Keys, RunStatus, create_redis
from agent_core.script_replies import (
    Cancelled,
    CancelOutcome,
    Claim,
    ClaimOutcome,
    DecideOutcome,
    LeaseStatus,
)
from agent_core.scripts import Scripts
from agent_core.testing import FakeOpenAI, call, reply, tool_messages
from tests.agents import ops, read_journal
from tests.core.conftest import core_settings
from tests.core.harness import Harness
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(60)


async def paused_run_in_tools(h: Harness, redis: Redis) -> tuple[str, str, str]:
    """A run at turn 1 in phase `tools` with one ready call ``c1``, leased: (run id, turn
    key, fence)."""
    run = await h.gateway.start_run("retries", requested_by="U1")
    k = h.keys
    rk, tk = k.run(run.run_id), k.turn(run.run_id, 1)
    await redis.hset(rk, mapping={"status": "running", "turn": 1, "phase": "tools"})
    await redis.hset(tk, mapping={"state:c1": "ready"})
    res = await Scripts(redis, k).acquire_lease(run.run_id, lease_ms=60_000, worker="w1")
    assert res.status is LeaseStatus.OK
    return run.run_id, tk, res.fence


async def test_a_claim_run_again_by_the_same_attempt_is_the_callers_own(
    observer: Harness, redis: Redis
) -> None:
    rid, tk, fence = await paused_run_in_tools(observer, redis)
    scripts = Scripts(redis, observer.keys)

    async def claim(attempt: str) -> Claim:
        return await scripts.claim_call(rid, 1, fence, "c1", idempotent=False, attempt=attempt)

    assert await claim("attempt-a") == Claim(ClaimOutcome.OK, "ready")
    # The same attempt again (its first reply lost): the claim is its own.
    assert await claim("attempt-a") == Claim(ClaimOutcome.YOURS)
    # Any other attempt finds the call claimed by someone who did not report: in doubt.
    assert await claim("attempt-b") == Claim(ClaimOutcome.NO, "claimed")
    assert await redis.hget(tk, "state:c1") == "claimed"


@pytest.fixture
def lossy(redis_url: str) -> Iterator[TcpProxy]:
    parts = urlsplit(redis_url)
    with TcpProxy(parts.port or 6379, parts.hostname or "127.0.0.1") as proxy:
        yield proxy


async def test_a_claim_whose_reply_is_lost_runs_the_call_once_and_reports_it(
    redis: Redis,
    redis_url: str,
    lossy: TcpProxy,
    fake_openai: FakeOpenAI,
    journal: Path,
) -> None:
    """The worker's claim (taken with the lease by the resume job's ACQUIRE_LEASE) reaches
    Redis, its reply is lost, redis-py sends it again: the worker runs the approved call
    (once) and the model gets its output, not "in doubt"."""
    fake_openai.script("lost claim", [call("delete_user", {"user_id": "7"}), reply("done")])
    # Loaded first, so that the claim that is applied is the one whose reply is lost (the
    # start job's lease is taken before the proxy is told to lose a reply).
    acquire = Scripts(redis, Keys()).source("acquire_lease")
    sha = await redis.script_load(acquire)
    assert sha == hashlib.sha1(acquire.encode()).hexdigest()
    through_proxy = create_redis(lossy.url_for(redis_url))
    h = Harness(through_proxy, core_settings(lossy.url_for(redis_url), fake_openai.base_url), ops)
    h.start_worker()
    try:
        run = await h.gateway.start_run("lost claim", requested_by="U1")
        [opened] = await h.opened_gates(run.run_id, 1)
        lossy.lose_reply(sha.encode())
        assert (await h.gateway.decide(opened.data["gate_id"], "approve", by="U2")).applied
        done = await h.wait_finished(run.run_id)
        assert lossy.lost == 1, "the claim's reply was lost once"
        assert done.status is RunStatus.COMPLETED
        assert read_journal(str(journal)) == ["delete_user:7"]
        executed = await h.wait_event(run.run_id, "tool.executed")
        assert (executed.data["ok"], executed.data["in_doubt"]) == (True, False)
        told = tool_messages(fake_openai.requests_for("lost claim")[-1]["messages"])
        assert [m["content"] for m in told] == ["user 7 deleted"]
    finally:
        await h.close()
        await through_proxy.aclose()


async def test_every_script_a_retry_could_misreport_answers_as_its_first_run(
    observer: Harness, redis: Redis
) -> None:
    """Lease, model turn, tools turn, decision, cancel, job: each run twice with the same
    identity, the second as if the first reply was lost."""
    k: Keys = observer.keys
    scripts = Scripts(redis, k)
    run = await observer.gateway.start_run("twice", requested_by="U1")
    rid, shard = run.run_id, k.shard_of(run.run_id)

    # The lease: the same attempt gets its fence back, not "busy" until the lease runs out.
    async def acquire(attempt: str) -> tuple[LeaseStatus, str]:
        res = await scripts.acquire_lease(
            rid, lease_ms=60_000, worker="w1", begin_agent="a", attempt=attempt
        )
        return res.status, res.fence

    first = await acquire("lease-1")
    again = await acquire("lease-1")
    assert first == again and first[0] is LeaseStatus.OK, (first, again)
    assert (await acquire("x"))[0] is LeaseStatus.BUSY
    fence = first[1]

    # A model turn recorded (then a turn closed): the retry gets the run back, not 0 (which
    # the runner reads as "cancelled meanwhile", leaving the run with nothing to move it).
    async def record() -> dict[str, str] | None:
        step = await scripts.record_turn(
            {"run_id": rid},
            0,
            fence,
            assistant=json.dumps({"role": "assistant", "content": "", "tool_calls": []}),
            done=False,
            final="",
            completed="{}",
            now="1",
            fields=["order", "[]"],
        )
        assert not step.lost
        return step.run

    assert await record() is not None
    again_record = await record()
    assert again_record is not None and again_record["phase"] == "tools", again_record
    assert await redis.llen(k.history(rid)) == 2, "the assistant message once"

    async def finish() -> dict[str, str] | None:
        step = await scripts.finish_turn(rid, 1, fence, "2", [], read=False)
        assert not step.lost
        return step.run

    assert await finish() is not None
    again_finish = await finish()
    assert again_finish is not None and again_finish["phase"] == "model", again_finish

    # The job finished and the lease released: a retry is done too, not "lease lost".
    jobs = k.jobs(shard)
    await redis.xgroup_create(jobs, "workers", id="0", mkstream=True)
    job_id = await redis.xadd(jobs, {"type": "start", "run_id": rid})
    await redis.xreadgroup("workers", "w1", {jobs: ">"})
    assert await scripts.finish_job(jobs, "workers", job_id, rid, fence) is True
    assert await scripts.finish_job(jobs, "workers", job_id, rid, fence) is True

    # A cancel: the retry is told it cancelled, not that the run had "already cancelled".
    async def cancel(attempt: str) -> Cancelled:
        return await scripts.cancel_run(
            rid, {}, 1, [], by="U1", reason="", told="", attempt=attempt
        )

    assert await cancel("cancel-1") == Cancelled(CancelOutcome.CANCELLED)
    assert await cancel("cancel-1") == Cancelled(CancelOutcome.CANCELLED)
    assert await cancel("cancel-2") == Cancelled(CancelOutcome.FINISHED, "cancelled")


async def test_a_decision_run_again_by_the_same_attempt_is_told_it_decided(
    harness: Harness, redis: Redis, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script("decide twice", [call("delete_user", {"user_id": "3"}), reply("ok")])
    run = await harness.gateway.start_run("decide twice", requested_by="U1")
    [opened] = await harness.opened_gates(run.run_id, 1)
    gid, scripts = opened.data["gate_id"], Scripts(redis, harness.keys)

    async def decide(attempt: str) -> DecideOutcome:
        res, _ = await scripts.decide_gate(
            gid, run.run_id, "approved", by="U2", reason="", attempt=attempt, seen_hash=""
        )
        return res.outcome

    first, again, other = await decide("click-1"), await decide("click-1"), await decide("click-2")
    assert (first, again, other) == (
        DecideOutcome.APPLIED,
        DecideOutcome.APPLIED,
        DecideOutcome.DECIDED,
    )
    decided = [
        e
        for e in await harness.events()
        if e.type.value == "gate.decided" and e.data["gate_id"] == gid
    ]
    assert len(decided) == 1, "announced once"
    await harness.wait_finished(run.run_id)


async def test_a_lease_that_ran_out_with_no_one_taking_over_is_taken_up_again(
    observer: Harness, redis: Redis
) -> None:
    """A worker cut off from Redis for longer than its lease (its master failing over) finds
    its lease run out but its fence still current: its renewal takes it up again and its
    writes land. Once another worker has taken the run over, neither does."""
    rid, _, _ = await paused_run_in_tools(observer, redis)
    scripts, rk = Scripts(redis, observer.keys), observer.keys.run(rid)
    await scripts.release_lease(rid, await redis.hget(rk, "fence"))
    res = await scripts.acquire_lease(rid, lease_ms=50, worker="w1")
    fence = res.fence
    await asyncio.sleep(0.1)  # the lease runs out; nobody takes the run over
    assert await scripts.renew_lease(rid, fence, 60_000) is True

    async def claim(attempt: str) -> Claim:
        return await scripts.claim_call(rid, 1, fence, "c1", idempotent=False, attempt=attempt)

    assert await claim("a1") == Claim(ClaimOutcome.OK, "ready")
    # Run out again, and taken over this time: the old holder is refused from then on.
    await redis.hset(rk, "lease_until", "1")
    taken = await scripts.acquire_lease(rid, lease_ms=60_000, worker="w2")
    assert taken.status is LeaseStatus.OK and taken.previous_owner == "w1"
    assert await scripts.renew_lease(rid, fence, 60_000) is False
    assert await claim("a2") == Claim(ClaimOutcome.LOST)
