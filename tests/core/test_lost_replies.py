"""A retried script recognises its own earlier effect (invariant 11): retry, cancel, fail.

redis-py sends a command again after a connection error. When the first run of a script was
applied and only its reply was lost, the second run used to find the run already moved and
answer "not failed" to the user whose retry was queued, "already cancelled" to the user who
cancelled it, and "already finished" to the worker that failed it (which then skipped its
cancel of the run's sub-agents). Each call now carries an attempt id, recorded with the
change; a re-run of the same attempt answers as the first run did.

The scripts are run twice with the same attempt and with another one; then the whole path
through the Gateway, with the reply lost for real by a TCP proxy between the client and
redis-server (tests/tcp_proxy.py), and redis-py's own retry.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis

from agent_core import Gateway, InvalidState, Keys, RunStatus
from agent_core.connections import create_redis
from agent_core.script_replies import FailOutcome
from agent_core.scripts import Scripts
from agent_core.testing import FakeOpenAI, call, raw_response, reply
from agent_core.worker import Worker
from tests.agents import desk, ops, read_journal
from tests.core.conftest import core_settings
from tests.core.harness import Harness
from tests.core.test_failed_parents import paused_on_child
from tests.core.test_promises import take_lease
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(60)

UNAVAILABLE = {"error": {"message": "overloaded", "type": "server_error", "code": None}}


@pytest.fixture
async def h(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> AsyncIterator[Harness]:
    """Workers of the ops agent whose model calls give up quickly (a retryable failure)."""
    settings = core_settings(
        redis_url, fake_openai.base_url, OPENAI_MAX_RETRIES=1, OPENAI_RETRY_BUDGET=2
    )
    harness = Harness(redis, settings, ops)
    harness.start_worker()
    try:
        yield harness
    finally:
        await harness.close()


@pytest.fixture
def proxy(redis_url: str) -> Iterator[TcpProxy]:
    port = urlsplit(redis_url).port
    assert port is not None
    with TcpProxy(port) as p:
        yield p


@pytest.fixture
async def lossy(proxy: TcpProxy, redis_url: str) -> AsyncIterator[Redis]:
    """A client as the gateway's processes make them, through the proxy."""
    client = create_redis(proxy.url_for(redis_url))
    try:
        yield client
    finally:
        await client.aclose()


async def lose_next_reply(proxy: TcpProxy, redis: Redis, script: str) -> None:
    """Lose the answer to the next run of ``script`` (loaded first: a NOSCRIPT answer lost
    instead would prove nothing)."""
    sha = await redis.script_load(script)
    proxy.lose_reply(b"EVALSHA", sha.encode())


async def paused(h: Harness, fake_openai: FakeOpenAI, task: str) -> tuple[str, str]:
    """A run paused on one gate: (run id, gate id)."""
    fake_openai.script(task, [call("delete_user", {"user_id": "4"}), reply("deleted")])
    run = await h.gateway.start_run(task, requested_by="U1")
    [opened] = await h.opened_gates(run.run_id, 1)
    return run.run_id, opened.data["gate_id"]


async def failed_retryably(h: Harness, fake_openai: FakeOpenAI, task: str) -> str:
    fake_openai.script(task, [raw_response(UNAVAILABLE, status=503)])
    run = await h.gateway.start_run(task, requested_by="U1")
    failed = await h.wait_finished(run.run_id, timeout=20)
    assert failed.status is RunStatus.FAILED and failed.retryable
    return run.run_id


async def count(h: Harness, run_id: str, type_: str) -> int:
    await asyncio.sleep(0.2)
    return sum(1 for e in await h.events() if e.run_id == run_id and e.type.value == type_)


# ------------------------------------------------------------------------ the scripts alone
async def test_a_cancel_run_again_with_its_attempt_answers_cancelled_by_you(
    h: Harness, fake_openai: FakeOpenAI, journal: Path
) -> None:
    run_id, gate_id = await paused(h, fake_openai, "cancel me")
    first = await h.gateway.cancel_run(run_id, by="U1", attempt="c-1")
    again = await h.gateway.cancel_run(run_id, by="U1", attempt="c-1")
    assert (first.status, first.cancelled_by) == (RunStatus.CANCELLED, "U1")
    assert (again.status, again.cancelled_by) == (RunStatus.CANCELLED, "U1")
    with pytest.raises(InvalidState, match="has already cancelled"):
        await h.gateway.cancel_run(run_id, by="U2", attempt="c-2")
    assert await count(h, run_id, "run.cancelled") == 1
    decided = [e for e in await h.events() if e.type.value == "gate.decided"]
    assert [e.data["status"] for e in decided if e.data["gate_id"] == gate_id] == ["cancelled"]
    assert read_journal(str(journal)) == []


async def test_a_retry_run_again_with_its_attempt_answers_queued_and_queues_once(
    h: Harness, fake_openai: FakeOpenAI, redis: Redis
) -> None:
    run_id = await failed_retryably(h, fake_openai, "retry me")
    await h.close()  # no worker: the retried run stays queued
    first = await h.gateway.retry_run(run_id, by="U1", attempt="r-1")
    again = await h.gateway.retry_run(run_id, by="U1", attempt="r-1")
    assert first.status is again.status is RunStatus.QUEUED
    with pytest.raises(InvalidState, match="is queued; only a failed run can be retried"):
        await h.gateway.retry_run(run_id, by="U2", attempt="r-2")
    assert await redis.hget(h.keys.run(run_id), "retries") == "1"
    assert await count(h, run_id, "run.retried") == 1
    jobs = await redis.xrange(h.keys.jobs(h.keys.shard_of(run_id)))
    assert [f["type"] for _, f in jobs if f.get("run_id") == run_id] == ["start"]


async def test_a_retry_run_again_after_the_run_failed_anew_queues_nothing(
    h: Harness, fake_openai: FakeOpenAI, redis: Redis
) -> None:
    """Between the lost reply and the re-run, the retried run already failed again (its
    model is still down). The re-run must not retry it a second time."""
    run_id = await failed_retryably(h, fake_openai, "still down")
    asked = len(fake_openai.requests_for("still down"))
    # Accepted (no error); the live worker may have taken it up already when it is read.
    await h.gateway.retry_run(run_id, by="U1", attempt="r-1")
    assert await redis.hget(h.keys.run(run_id), "retries") == "1"
    for _ in range(400):
        if await redis.hget(h.keys.run(run_id), "status") == "failed":
            break
        await asyncio.sleep(0.05)
    asked_again = len(fake_openai.requests_for("still down"))
    assert asked_again > asked
    again = await h.gateway.retry_run(run_id, by="U1", attempt="r-1")
    assert again.status is RunStatus.FAILED
    await asyncio.sleep(0.5)
    assert await redis.hget(h.keys.run(run_id), "retries") == "1"
    assert await count(h, run_id, "run.retried") == 1
    assert len(fake_openai.requests_for("still down")) == asked_again


async def test_fail_run_again_with_its_attempt_answers_failed(
    h: Harness, fake_openai: FakeOpenAI, redis: Redis
) -> None:
    run_id, gate_id = await paused(h, fake_openai, "fail me")
    k = h.keys
    fence = await take_lease(redis, k, run_id)
    data = json.dumps({"run_id": run_id, "error": "boom", "retryable": False})

    async def fail(attempt: str) -> FailOutcome:
        return await Scripts(redis, k).fail_run(
            run_id,
            {},
            1,
            [gate_id],
            fence=fence,
            error="boom",
            data=data,
            now="1",
            retryable=False,
            told="",
            not_run="not run",
            in_doubt="?",
            attempt=attempt,
        )

    assert [await fail("f-1"), await fail("f-1"), await fail("f-2")] == [
        FailOutcome.FAILED,
        FailOutcome.FAILED,
        FailOutcome.FINISHED,
    ]
    assert await count(h, run_id, "run.failed") == 1
    assert await redis.hget(k.gate(gate_id), "status") == "cancelled"


# ------------------------------------------------------------ a reply lost on the network
async def test_a_cancel_whose_reply_was_lost_tells_the_user_they_cancelled_it(
    h: Harness, fake_openai: FakeOpenAI, redis: Redis, proxy: TcpProxy, lossy: Redis
) -> None:
    run_id, gate_id = await paused(h, fake_openai, "cancel over a bad link")
    gateway = Gateway(lossy, h.keys)
    await lose_next_reply(proxy, redis, Scripts(redis, Keys()).source("cancel_run"))
    run = await gateway.cancel_run(run_id, by="U1")
    assert proxy.lost == 1, "the first reply was lost and redis-py ran the script again"
    assert (run.status, run.cancelled_by) == (RunStatus.CANCELLED, "U1")
    assert await count(h, run_id, "run.cancelled") == 1
    assert await redis.hget(h.keys.gate(gate_id), "status") == "cancelled"


async def test_a_retry_whose_reply_was_lost_is_queued_once_and_runs(
    h: Harness, fake_openai: FakeOpenAI, redis: Redis, proxy: TcpProxy, lossy: Redis
) -> None:
    run_id = await failed_retryably(h, fake_openai, "retry over a bad link")
    fake_openai.script("retry over a bad link", [reply("back")])  # the provider is back
    gateway = Gateway(lossy, h.keys)
    await lose_next_reply(proxy, redis, Scripts(redis, Keys()).source("retry_run"))
    await gateway.retry_run(run_id, by="U1")
    assert proxy.lost == 1
    done = await h.gateway.wait(run_id, timeout=15)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "back")
    assert await redis.hget(h.keys.run(run_id), "retries") == "1"
    assert await count(h, run_id, "run.retried") == 1


async def test_a_failure_whose_reply_was_lost_still_cancels_the_sub_agent(
    redis: Redis,
    redis_url: str,
    fake_openai: FakeOpenAI,
    journal: Path,
    proxy: TcpProxy,
    lossy: Redis,
) -> None:
    """The worker failing a parent (on a client whose FAIL_RUN reply is lost) must still
    learn that it failed it, and so cancel the sub-agent's run that waits for approval."""
    h = Harness(redis, core_settings(redis_url, fake_openai.base_url), desk)
    h.start_worker()
    try:
        fake_openai.script("refund 3 via billing", [call("billing", {"task": "refund order 3"})])
        fake_openai.script("refund order 3", [call("refund", {"order": 3})])
        run_id, child, gate_id, _cid = await paused_on_child(h, "refund 3 via billing")
        fence = await take_lease(redis, h.keys, run_id)
        runner = Worker(lossy, desk, h.client, h.settings).runner
        await lose_next_reply(proxy, redis, Scripts(redis, Keys()).source("fail_run"))
        assert await runner.fail(run_id, "the job kept crashing", fence) is True
        assert proxy.lost == 1
        sub = await h.gateway.get_run(child)
        assert sub is not None and sub.status is RunStatus.CANCELLED
        assert await redis.hget(h.keys.gate(gate_id), "status") == "cancelled"
        assert read_journal(str(journal)) == []
    finally:
        await h.close()
