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

from agent_core import Keys, RunStatus, create_redis, scripts, stopping
from agent_core.testing import FakeOpenAI, call, reply, tool_messages
from tests.agents import ops, read_journal
from tests.core.conftest import core_settings
from tests.core.harness import Harness
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(60)


async def paused_run_in_tools(h: Harness, redis: Redis) -> tuple[str, str, str]:
    """A run at turn 1 in phase `tools` with one ready call ``c1``, leased: (run key, turn
    key, fence)."""
    run = await h.gateway.start_run("retries", requested_by="U1")
    k = h.keys
    rk, tk = k.run(run.run_id), k.turn(run.run_id, 1)
    await redis.hset(rk, mapping={"status": "running", "turn": 1, "phase": "tools"})
    await redis.hset(tk, mapping={"state:c1": "ready"})
    res = await redis.eval(scripts.ACQUIRE_LEASE, 1, rk, 60_000, "w1")
    assert res[0] == "ok"
    return rk, tk, str(res[1])


async def test_a_claim_run_again_by_the_same_attempt_is_the_callers_own(
    observer: Harness, redis: Redis
) -> None:
    rk, tk, fence = await paused_run_in_tools(observer, redis)
    claim = (scripts.CLAIM_CALL, 2, rk, tk, fence, "1", "c1", "0")
    assert await redis.eval(*claim, "attempt-a") == ["ok", "ready"]
    # The same attempt again (its first reply lost): the claim is its own.
    assert await redis.eval(*claim, "attempt-a") == ["yours"]
    # Any other attempt finds the call claimed by someone who did not report: in doubt.
    assert await redis.eval(*claim, "attempt-b") == ["no", "claimed"]
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
    """The worker's claim reaches Redis, its reply is lost, redis-py sends it again: the
    worker runs the approved call (once) and the model gets its output, not "in doubt"."""
    fake_openai.script("lost claim", [call("delete_user", {"user_id": "7"}), reply("done")])
    # Loaded first, so that the claim that is applied is the one whose reply is lost.
    sha = await redis.script_load(scripts.CLAIM_CALL)
    assert sha == hashlib.sha1(scripts.CLAIM_CALL.encode()).hexdigest()
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
    run = await observer.gateway.start_run("twice", requested_by="U1")
    rid, shard = run.run_id, k.shard_of(run.run_id)
    rk, events = k.run(rid), k.events(shard)

    # The lease: the same attempt gets its fence back, not "busy" until the lease runs out.
    acquire = (scripts.ACQUIRE_LEASE, 2, rk, events, 60_000, "w1", "a", "", "lease-1")
    first = await redis.eval(*acquire)
    again = await redis.eval(*acquire)
    assert first[:2] == again[:2] and first[0] == "ok", (first, again)
    assert (await redis.eval(scripts.ACQUIRE_LEASE, 2, rk, events, 60_000, "w1", "a", "", "x"))[
        0
    ] == "busy"
    fence = str(first[1])

    # A model turn recorded (then a turn closed): the retry gets the run back, not 0 (which
    # the runner reads as "cancelled meanwhile", leaving the run with nothing to move it).
    record = (
        scripts.RECORD_TURN,
        7,
        rk,
        k.history(rid),
        k.turn(rid, 1),
        events,
        k.finished(shard),
        k.active(shard),
        k.run_inbox(rid),
        fence,
        "0",
        json.dumps({"role": "assistant", "content": "", "tool_calls": []}),
        "tools",
        "",
        "{}",
        "1",
        "order",
        "[]",
    )
    assert isinstance(await redis.eval(*record), list)
    again_record = await redis.eval(*record)
    assert isinstance(again_record, list) and "tools" in again_record, again_record
    assert await redis.llen(k.history(rid)) == 2, "the assistant message once"
    finish = (scripts.FINISH_TURN, 2, rk, k.history(rid), fence, "1", "2")
    assert isinstance(await redis.eval(*finish), list)
    again_finish = await redis.eval(*finish)
    assert isinstance(again_finish, list) and "model" in again_finish, again_finish

    # The job finished and the lease released: a retry is done too, not "lease lost".
    jobs = k.jobs(shard)
    await redis.xgroup_create(jobs, "workers", id="0", mkstream=True)
    job_id = await redis.xadd(jobs, {"type": "start", "run_id": rid})
    await redis.xreadgroup("workers", "w1", {jobs: ">"})
    finish_job = (scripts.FINISH_JOB, 2, jobs, rk, "workers", job_id, fence)
    assert await redis.eval(*finish_job) == 1
    assert await redis.eval(*finish_job) == 1

    # A cancel: the retry is told it cancelled, not that the run had "already cancelled".
    cancel = (
        stopping.CANCEL_RUN,
        10,
        rk,
        k.deadlines(shard),
        events,
        k.run_gates(rid),
        k.finished(shard),
        k.active(shard),
        k.turn(rid, 1),
        rk,
        rk,
        jobs,
        "U1",
        "",
        rid,
        "1",
        "",
    )
    assert await redis.eval(*cancel, "cancel-1") == ["cancelled"]
    assert await redis.eval(*cancel, "cancel-1") == ["cancelled"]
    assert await redis.eval(*cancel, "cancel-2") == ["finished", "cancelled"]


async def test_a_decision_run_again_by_the_same_attempt_is_told_it_decided(
    harness: Harness, redis: Redis, fake_openai: FakeOpenAI
) -> None:
    fake_openai.script("decide twice", [call("delete_user", {"user_id": "3"}), reply("ok")])
    run = await harness.gateway.start_run("decide twice", requested_by="U1")
    [opened] = await harness.opened_gates(run.run_id, 1)
    gid, k = opened.data["gate_id"], harness.keys
    shard = k.shard_of(gid)
    keys = (k.gate(gid), k.run(run.run_id), k.deadlines(shard), k.jobs(shard), k.events(shard))
    decide = (scripts.DECIDE_GATE, 5, *keys, gid, "approved", "U2", "")
    first = await redis.eval(*decide, "click-1", run.run_id, "")
    again = await redis.eval(*decide, "click-1", run.run_id, "")
    other = await redis.eval(*decide, "click-2", run.run_id, "")
    assert (first[0], again[0], other[0]) == ("applied", "applied", "decided")
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
    rk, tk, _ = await paused_run_in_tools(observer, redis)
    await redis.eval(scripts.RELEASE_LEASE, 1, rk, await redis.hget(rk, "fence"))
    res = await redis.eval(scripts.ACQUIRE_LEASE, 1, rk, 50, "w1")
    fence = str(res[1])
    await asyncio.sleep(0.1)  # the lease runs out; nobody takes the run over
    assert await redis.eval(scripts.RENEW_LEASE, 1, rk, fence, 60_000) == 1
    claim = (scripts.CLAIM_CALL, 2, rk, tk, fence, "1", "c1", "0", "a1")
    assert await redis.eval(*claim) == ["ok", "ready"]
    # Run out again, and taken over this time: the old holder is refused from then on.
    await redis.hset(rk, "lease_until", "1")
    taken = await redis.eval(scripts.ACQUIRE_LEASE, 1, rk, 60_000, "w2")
    assert taken[0] == "ok" and taken[2] == "w1"
    assert await redis.eval(scripts.RENEW_LEASE, 1, rk, fence, 60_000) == 0
    assert await redis.eval(*claim[:-1], "a2") == ["lost"]
