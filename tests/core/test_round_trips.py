"""The round trips of a pause and of a resume, pinned (issue 21's floor): the worker's
commands for a turn that asks two gated calls, both approved, counted on a real Redis.

* pause: the stream read, ACQUIRE_LEASE (lease, begin; the history read by an LRANGE in
  the same pipeline), the model call, RECORD_TURN (the turn recorded, its gates opened,
  the job finished);
* resume: the stream read, ACQUIRE_LEASE (lease, the turn and its gates read, both calls
  claimed), the tools run together, FINISH_TURN (their results; the history read by an
  LRANGE in the same pipeline), the model call, RECORD_TURN (the answer, the run finished,
  the job finished).
"""

from __future__ import annotations

from pathlib import Path

from openai import AsyncOpenAI
from redis.asyncio import Redis

from agent_core import Agent, ApprovalRequest, Gateway, Keys, RunStatus, Verdict, approve, approver
from agent_core.connections import create_redis
from agent_core.scripts import Scripts
from agent_core.streams import StreamConsumer
from agent_core.testing import FakeOpenAI, calls, reply, tool_messages
from agent_core.worker import Worker
from tests.agents import delete_user, read_journal, strict
from tests.core.conftest import core_settings
from tests.core.test_script_files import script_names
from tests.redis_counting import record

# The resume's floor on the worker; a pipeline is one entry, its commands joined by "+".
RESUME_FLOOR = ["XREADGROUP", "acquire_lease", "finish_turn+LRANGE", "record_turn"]


async def _one_job(w: Worker, reader: StreamConsumer, log: list[str]) -> list[str]:
    """The worker's commands for the next job: the read that delivered it, then its work."""
    for _ in range(100):
        log.clear()
        msgs = await reader.read(count=1, block_ms=50)
        if msgs:
            break
    assert msgs, "no job"
    reads = [c for c in log if c == "XREADGROUP"]
    log.clear()
    await w._handle(reader, msgs[0])
    return reads[-1:] + log


class _Counted:
    """A worker on a client that records each command (a script by its name)."""

    def __init__(self, redis: Redis, redis_url: str, base_url: str, agent: Agent = strict) -> None:
        self.settings = core_settings(redis_url, base_url)
        self.keys = Keys(self.settings.key_prefix, self.settings.shards)
        self.scripts = Scripts(redis, self.keys)
        self.log: list[str] = []
        self.redis = create_redis(redis_url)
        record(self.redis, self.log, "agent_core")
        self.client = AsyncOpenAI(api_key="sk-test", base_url=base_url, max_retries=0)
        self.worker = Worker(self.redis, agent, self.client, self.settings)
        [self.reader] = self.worker.readers
        self.gateway = Gateway(redis, self.keys, agent_name=agent.name)

    async def load_scripts(self, redis: Redis) -> None:
        for n in script_names("agent_core"):  # loaded already: no NOSCRIPT round trip counted
            await redis.script_load(self.scripts.source(n))

    async def job(self) -> list[str]:
        return await _one_job(self.worker, self.reader, self.log)

    async def approve_all(self, redis: Redis, run_id: str) -> None:
        for gid in sorted(await redis.smembers(self.keys.run_gates(run_id))):
            assert (await self.gateway.decide(gid, "approve", by="U2")).applied

    async def close(self) -> None:
        for r in self.worker.runners.values():
            await r.endpoint.aclose()
        await self.client.close()
        await self.redis.aclose()


async def test_a_pause_takes_3_round_trips_and_a_resume_4_on_the_worker(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    fake_openai.script(
        "two deletes",
        [
            calls([("delete_user", {"user_id": "1"}), ("delete_user", {"user_id": "2"})]),
            reply("Done."),
        ],
    )
    w = _Counted(redis, redis_url, fake_openai.base_url)
    await w.load_scripts(redis)
    keys, gw = w.keys, w.gateway
    try:
        run = await gw.start_run("two deletes", requested_by="U1")

        pause = await w.job()
        assert pause == ["XREADGROUP", "acquire_lease+LRANGE", "record_turn"], pause
        got = await gw.get_run(run.run_id)
        assert got is not None and got.status is RunStatus.AWAITING_APPROVAL
        await w.approve_all(redis, run.run_id)

        resume = await w.job()
        assert resume == RESUME_FLOOR, resume
        done = await gw.get_run(run.run_id)
        assert done is not None and done.status is RunStatus.COMPLETED and done.final == "Done."
        assert sorted(read_journal(str(journal))) == ["delete_user:1", "delete_user:2"]
        told = tool_messages(fake_openai.requests_for("two deletes")[-1]["messages"])
        assert [m["content"].split("\n")[0] for m in told] == ["user 1 deleted", "user 2 deleted"]
        # Nothing left behind: the job acknowledged and deleted, the lease released.
        assert await redis.xlen(keys.jobs(keys.shard_of(run.run_id))) == 0
        assert await redis.hget(keys.run(run.run_id), "lease_until") == "0"
    finally:
        await w.close()


async def test_a_mixed_turn_runs_its_ungated_call_first_then_pauses(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """An ungated call and a gated one in a turn: the ungated call is claimed and completed
    on its own before the gate opens (2 round trips), then OPEN_GATES and FINISH_JOB; the
    resume takes the floor again."""
    fake_openai.script(
        "mixed",
        [calls([("lookup", {"key": "a"}), ("delete_user", {"user_id": "3"})]), reply("Done.")],
    )
    w = _Counted(redis, redis_url, fake_openai.base_url)
    await w.load_scripts(redis)
    try:
        run = await w.gateway.start_run("mixed", requested_by="U1")
        pause = await w.job()
        assert pause == [
            "XREADGROUP",
            "acquire_lease+LRANGE",
            "record_turn",
            "claim_call",
            "complete_call",
            "open_gates",
            "finish_job",
        ], pause
        await w.approve_all(redis, run.run_id)
        resume = await w.job()
        assert resume == RESUME_FLOOR, resume
        assert read_journal(str(journal)) == ["lookup:a", "delete_user:3"]
    finally:
        await w.close()


@approver(name="yes")
def _yes(call: ApprovalRequest) -> Verdict:
    return approve("fine")


ruled = Agent(name="ruled", instructions="Test.", tools=[delete_user], approvers=[_yes])


async def test_gates_a_rule_decides_are_not_read_back(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """A rule approves both calls as their gates open (in RECORD_TURN, which hands the turn
    and its gates back): no pause, each call claimed and completed on its own."""
    fake_openai.script(
        "ruled",
        [
            calls([("delete_user", {"user_id": "1"}), ("delete_user", {"user_id": "2"})]),
            reply("Done."),
        ],
    )
    w = _Counted(redis, redis_url, fake_openai.base_url, ruled)
    await w.load_scripts(redis)
    try:
        run = await w.gateway.start_run("ruled", requested_by="U1")
        whole = await w.job()
        per_call = ["claim_call", "complete_call"]
        assert whole == [
            "XREADGROUP",
            "acquire_lease+LRANGE",
            "record_turn",
            *per_call,
            *per_call,
            "finish_turn+LRANGE",
            "record_turn",
        ], whole
        done = await w.gateway.get_run(run.run_id)
        assert done is not None and done.status is RunStatus.COMPLETED
        assert read_journal(str(journal)) == ["delete_user:1", "delete_user:2"]
    finally:
        await w.close()
