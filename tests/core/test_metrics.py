"""``GET /metrics`` of the worker: gates, jobs, takeovers, dead letters and the model, as a
Prometheus scrape sees them. Counters are process-wide (every worker of the test process adds
to them), so each test checks how much they grew."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from agent_core import Agent, ConfigError, Decision, Keys, RunStatus, metrics
from agent_core.script_replies import Lease, LeaseStatus
from agent_core.scripts import Scripts
from agent_core.testing import FakeOpenAI, call, calls, reply
from agent_core.worker import Worker
from tests.agents import ops
from tests.core.conftest import core_settings
from tests.core.harness import Harness
from tests.redis_server import free_port
from tests.scrape import Samples, scrape

MakeWorker = Callable[..., Awaitable[tuple[Harness, str]]]
SHARDS = 16


@pytest.fixture
async def metered(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> AsyncIterator[MakeWorker]:
    """``await metered(**settings)``: a harness whose worker serves /metrics, and its URL."""
    made: list[Harness] = []

    async def make(start: bool = True, agent: Agent = ops, **overrides: Any) -> tuple[Harness, str]:
        overrides.setdefault("METRICS_PORT", free_port())
        settings = core_settings(redis_url, fake_openai.base_url, **overrides)
        h = Harness(redis, settings, agent)
        made.append(h)
        url = f"http://127.0.0.1:{settings.metrics_port}/metrics"
        if start:
            await start_serving(h, url)
        return h, url

    yield make
    for h in made:
        await h.close()


async def start_serving(h: Harness, url: str) -> None:
    h.start_worker()
    for _ in range(200):
        try:
            await scrape(url)
            return
        except OSError:
            await asyncio.sleep(0.02)
    raise AssertionError(f"{url} never answered")


async def test_gates_opened_and_decided_by_outcome(
    metered: MakeWorker, fake_openai: FakeOpenAI
) -> None:
    h, url = await metered()
    fake_openai.script("approve it", [call("delete_user", {"user_id": "1"}), reply("done")])
    fake_openai.script("deny it", [call("delete_user", {"user_id": "2"}), reply("kept")])
    before = await scrape(url)
    approved = await h.gateway.start_run("approve it", requested_by="U1")
    denied = await h.gateway.start_run("deny it", requested_by="U1")
    [g1] = await h.opened_gates(approved.run_id, 1)
    [g2] = await h.opened_gates(denied.run_id, 1)
    await asyncio.sleep(0.2)
    assert (await h.gateway.decide(g1.data["gate_id"], Decision.APPROVE, by="U2")).applied
    assert (await h.gateway.decide(g2.data["gate_id"], Decision.DENY, by="U2")).applied
    # A second click changes nothing, and counts nothing.
    assert not (await h.gateway.decide(g1.data["gate_id"], Decision.DENY, by="U3")).applied
    await h.wait_finished(approved.run_id)
    await h.wait_finished(denied.run_id)
    after = await scrape(url)

    assert after.since(before, "agw_gates_opened_total") == 2
    for outcome, n in (("approved", 1), ("denied", 1), ("expired", 0), ("cancelled", 0)):
        assert after.since(before, "agw_gates_decided_total", outcome=outcome) == n, outcome
    for outcome in ("approved", "denied"):
        h_ = "agw_gate_decision_seconds"
        assert after.since(before, f"{h_}_count", outcome=outcome) == 1
        assert 0.2 <= after.since(before, f"{h_}_sum", outcome=outcome) < 10
        assert after.since(before, f"{h_}_bucket", outcome=outcome, le="1.0") == 1
        assert after.since(before, f"{h_}_bucket", outcome=outcome, le="+Inf") == 1
    # Two model calls per run, each timed.
    assert after.since(before, "agw_model_request_seconds_count") == 4
    assert "sk-test-not-a-secret" not in after.text


async def test_a_gate_a_grant_approves_as_it_opens_counts_as_opened_and_approved(
    metered: MakeWorker, fake_openai: FakeOpenAI
) -> None:
    """Approve & allow, then the thread's next matching call opens approved by the grant:
    two gates opened, two approved; only the person's decision is timed."""
    from tests.agents import shipping

    h, url = await metered(agent=shipping)
    fake_openai.script(
        "ship twice",
        [
            call("ship", {"env": "staging", "version": 1}),
            reply("one"),
            call("ship", {"env": "staging", "version": 2}),
            reply("two"),
        ],
    )
    before = await scrape(url)
    run = await h.gateway.start_run("ship twice", requested_by="U1")
    [g] = await h.opened_gates(run.run_id, 1)
    made = await h.gateway.grants.approve_and_allow(
        g.data["gate_id"], "U2", args_hash=g.data["args_hash"]
    )
    assert made.grant is not None
    await h.wait_finished(run.run_id)
    await h.gateway.continue_run(run.run_id, "ship 2 too", by="U1")
    done = await h.gateway.wait(run.run_id, timeout=10)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "two")
    [_, second] = await h.gateway.gates(run.run_id)
    assert second.decided_by == f"grant:{made.grant.grant_id}"
    after = await scrape(url)
    assert after.since(before, "agw_gates_opened_total") == 2
    for outcome, n in (("approved", 2), ("denied", 0), ("expired", 0), ("cancelled", 0)):
        assert after.since(before, "agw_gates_decided_total", outcome=outcome) == n, outcome
    assert after.since(before, "agw_gate_decision_seconds_count", outcome="approved") == 1


async def test_an_expired_gate_is_counted_with_its_wait(
    metered: MakeWorker, fake_openai: FakeOpenAI
) -> None:
    h, url = await metered(APPROVAL_TIMEOUT=1)
    fake_openai.script("let it expire", [call("delete_user", {"user_id": "3"}), reply("ok")])
    before = await scrape(url)
    run = await h.gateway.start_run("let it expire", requested_by="U1")
    done = await h.wait_finished(run.run_id)
    assert done.status is RunStatus.COMPLETED
    after = await scrape(url)
    assert after.since(before, "agw_gates_decided_total", outcome="expired") == 1
    waited = after.since(before, "agw_gate_decision_seconds_sum", outcome="expired")
    assert 1 <= waited < 5
    assert after.since(before, "agw_gate_decision_seconds_bucket", outcome="expired", le="5.0") == 1
    assert after.since(before, "agw_gate_decision_seconds_bucket", outcome="expired", le="1.0") == 0


async def test_gates_closed_by_a_cancel_or_a_failure_count_as_cancelled(
    metered: MakeWorker, fake_openai: FakeOpenAI, redis: Redis
) -> None:
    h, url = await metered()
    two = calls([("delete_user", {"user_id": "4"}), ("delete_user", {"user_id": "5"})])
    fake_openai.script("cancel it", [two])
    fake_openai.script("fail it", [call("delete_user", {"user_id": "6"})])
    before = await scrape(url)
    run = await h.gateway.start_run("cancel it", requested_by="U1")
    g4, _g5 = await h.opened_gates(run.run_id, 2)
    assert (await h.gateway.decide(g4.data["gate_id"], Decision.APPROVE, by="U2")).applied
    await h.gateway.cancel_run(run.run_id, by="U1")
    middle = await scrape(url)
    assert middle.since(before, "agw_gates_decided_total", outcome="approved") == 1
    assert middle.since(before, "agw_gates_decided_total", outcome="cancelled") == 1, (
        "only the gate still pending"
    )
    assert middle.since(before, "agw_gate_decision_seconds_count", outcome="approved") == 1

    # A run failed by its worker closes its pending gates too.
    failing = await h.gateway.start_run("fail it", requested_by="U1")
    await h.opened_gates(failing.run_id, 1)
    worker = h.workers[0][0]
    lease = await take_lease(redis, h.keys, failing.run_id)
    assert await worker.runner.fail(failing.run_id, "the test failed it", lease)
    after = await scrape(url)
    assert after.since(middle, "agw_gates_decided_total", outcome="cancelled") == 1
    assert after.since(before, "agw_gates_opened_total") == 3


async def take_lease(
    redis: Redis, keys: Keys, run_id: str, owner: str = "test", ms: int = 10_000
) -> str:
    for _ in range(200):
        res = await Scripts(redis, keys).acquire_lease(run_id, lease_ms=ms, worker=owner)
        if res.status is LeaseStatus.OK:
            return res.fence
        await asyncio.sleep(0.02)
    raise AssertionError(f"the lease of run {run_id} was never free")


async def test_acquire_lease_names_the_owner_it_took_over_from(
    redis: Redis, metered: MakeWorker
) -> None:
    h, _url = await metered(start=False)
    run = await h.gateway.start_run("nothing", requested_by="U1")
    scripts = Scripts(redis, h.keys)

    async def acquire(owner: str, ms: int = 100) -> Lease:
        return await scripts.acquire_lease(run.run_id, lease_ms=ms, worker=owner)

    ok = LeaseStatus.OK
    first = await acquire("a")
    assert first.status is ok and first.previous_owner == "", "a run never leased: no takeover"
    assert (await acquire("b")).status is LeaseStatus.BUSY
    await scripts.release_lease(run.run_id, first.fence)
    second = await acquire("b")
    assert second.status is ok and second.previous_owner == "", "a released lease: no takeover"
    await asyncio.sleep(0.15)
    third = await acquire("b")
    assert third.status is ok and third.previous_owner == "", "its own lease, run out: no takeover"
    await asyncio.sleep(0.15)
    fourth = await acquire("c")
    assert fourth.status is ok and fourth.previous_owner == "b", "b's lease ran out unreleased"
    assert int(fourth.fence) == int(first.fence) + 3, "the fence goes on as before"


async def test_a_run_taken_over_from_a_dead_worker_is_counted(
    metered: MakeWorker, fake_openai: FakeOpenAI, redis: Redis
) -> None:
    h, url = await metered(start=False)
    fake_openai.script("orphan", [reply("recovered")])
    run = await h.gateway.start_run("orphan", requested_by="U1")
    # A worker took the run's lease and died: nobody released it.
    await Scripts(redis, h.keys).acquire_lease(run.run_id, lease_ms=300, worker="dead-worker")
    before = Samples.parse((await metrics.render()).decode())
    await start_serving(h, url)
    done = await h.wait_finished(run.run_id)
    assert done.status is RunStatus.COMPLETED
    after = await scrape(url)
    assert after.since(before, "agw_run_takeovers_total") == 1


async def test_dead_letters_are_counted(metered: MakeWorker, redis: Redis) -> None:
    h, url = await metered()
    before = await scrape(url)
    dead = h.keys.dead_jobs(0)
    await redis.xadd(h.keys.jobs(0), {"type": "explode", "run_id": "r-000000000000"})
    for _ in range(200):
        if await redis.xlen(dead):
            break
        await asyncio.sleep(0.02)
    after = await scrape(url)
    assert after.since(before, "agw_dead_letters_total", reason="malformed") == 1
    assert after.since(before, "agw_dead_letters_total", reason="too_many_deliveries") == 0


async def test_model_errors_by_kind(metered: MakeWorker, fake_openai: FakeOpenAI) -> None:
    h, url = await metered()  # OPENAI_MAX_RETRIES=2: three attempts
    fake_openai.script("flaky", [reply("fine")])
    fake_openai.fail_next(1, status=429, retry_after=0.01)
    fake_openai.fail_next(1, status=503, retry_after=0.01)
    before = await scrape(url)
    run = await h.gateway.start_run("flaky", requested_by="U1")
    assert (await h.wait_finished(run.run_id)).status is RunStatus.COMPLETED
    mid = await scrape(url)
    assert mid.since(before, "agw_model_errors_total", kind="rate_limited") == 1
    assert mid.since(before, "agw_model_errors_total", kind="retryable") == 1
    assert mid.since(before, "agw_model_errors_total", kind="exhausted") == 0
    assert mid.since(before, "agw_model_request_seconds_count") == 3

    fake_openai.script("refused", [reply("never")])
    fake_openai.fail_next(1, status=400)
    run = await h.gateway.start_run("refused", requested_by="U1")
    assert (await h.wait_finished(run.run_id)).status is RunStatus.FAILED
    fake_openai.script("down", [reply("never")])
    fake_openai.fail_next(3, status=500, retry_after=0.01)
    run = await h.gateway.start_run("down", requested_by="U1")
    assert (await h.wait_finished(run.run_id)).status is RunStatus.FAILED
    after = await scrape(url)
    assert after.since(mid, "agw_model_errors_total", kind="final") == 1
    assert after.since(mid, "agw_model_errors_total", kind="retryable") == 3
    assert after.since(mid, "agw_model_errors_total", kind="exhausted") == 1


async def test_jobs_pending_in_progress_and_oldest_age_per_shard(
    metered: MakeWorker, redis: Redis
) -> None:
    h, url = await metered(start=False)  # no worker: jobs wait
    k = h.keys
    sec, _ = await redis.time()
    waiting = 3
    # A job enqueued 5 s ago (by Redis' clock), then one now.
    await redis.xadd(k.jobs(waiting), {"type": "start", "run_id": "x"}, id=f"{sec * 1000 - 5000}-0")
    await redis.xadd(k.jobs(waiting), {"type": "start", "run_id": "y"})
    # Shard 5: one job taken by a worker (read by the group), none waiting.
    taken = 5
    await redis.xadd(k.jobs(taken), {"type": "start", "run_id": "z"})
    await redis.xgroup_create(k.jobs(taken), "workers", id="0")
    await redis.xreadgroup("workers", "w1", {k.jobs(taken): ">"}, count=1)
    await redis.xadd(k.jobs(taken), {"type": "start", "run_id": "z2"})

    got = Samples.parse((await metrics.render(redis, k)).decode())
    assert got.get("agw_jobs_pending", shard=str(waiting)) == 2
    assert got.get("agw_jobs_in_progress", shard=str(waiting)) == 0
    assert 5 <= got.get("agw_oldest_job_age_seconds", shard=str(waiting)) < 8
    assert got.get("agw_jobs_pending", shard=str(taken)) == 1
    assert got.get("agw_jobs_in_progress", shard=str(taken)) == 1
    assert 0 <= got.get("agw_oldest_job_age_seconds", shard=str(taken)) < 2, "the waiting one's"
    for s in set(range(SHARDS)) - {waiting, taken}:
        assert got.get("agw_jobs_pending", shard=str(s)) == 0
        assert got.get("agw_oldest_job_age_seconds", shard=str(s)) == 0

    # The worker's /metrics serves them too; once it has taken every job, nothing waits.
    await redis.delete(k.jobs(waiting), k.jobs(taken))
    await start_serving(h, url)
    scraped = await scrape(url)
    for s in range(SHARDS):
        assert scraped.has("agw_jobs_pending", shard=str(s))
        assert scraped.get("agw_oldest_job_age_seconds", shard=str(s)) == 0


async def test_a_metrics_port_in_use_is_a_config_error(metered: MakeWorker) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        h, _url = await metered(start=False, METRICS_PORT=busy.getsockname()[1])
        worker = Worker(h.redis, h.agent, h.client, h.settings)
        with pytest.raises(ConfigError, match=r"METRICS_PORT: cannot listen on 127\.0\.0\.1"):
            await asyncio.wait_for(worker.run(), 5)


async def test_no_metrics_server_without_a_port(metered: MakeWorker) -> None:
    h, _url = await metered(start=False, METRICS_PORT=0)
    worker = h.start_worker()
    await asyncio.sleep(0.1)
    assert await worker._serve_metrics() is None
