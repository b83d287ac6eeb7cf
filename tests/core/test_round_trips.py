"""The round trips of a pause and of a resume, pinned (issue 21's floor): the worker's
commands for a turn that asks two gated calls, both approved, counted on a real Redis.

* pause: the stream read, ACQUIRE_LEASE (lease, begin, the history read), the model call,
  RECORD_TURN (the turn recorded, its gates opened, the job finished);
* resume: the stream read, ACQUIRE_LEASE (lease, the turn and its gates read, both calls
  claimed), the tools run together, FINISH_TURN (their results, the history read), the
  model call, RECORD_TURN (the answer, the run finished, the job finished).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI
from redis.asyncio import Redis
from redis.asyncio.connection import Connection

from agent_core import Gateway, Keys, RunStatus
from agent_core.connections import create_redis
from agent_core.scripts import Scripts
from agent_core.streams import StreamConsumer
from agent_core.testing import FakeOpenAI, calls, reply, tool_messages
from agent_core.worker import Worker
from tests.agents import read_journal, strict
from tests.core.conftest import core_settings
from tests.core.test_script_files import script_names


def _recording(log: list[str], names: dict[str, str]) -> type[Connection]:
    class Recording(Connection):
        def pack_command(self, *args: Any) -> Any:
            name = str(args[0]).upper()
            if name in ("EVALSHA", "EVAL"):
                sha = args[1] if name == "EVALSHA" else hashlib.sha1(str(args[1]).encode())
                name = names.get(sha if isinstance(sha, str) else sha.hexdigest(), name)
            log.append(name)
            return super().pack_command(*args)

        def pack_commands(self, commands: Any) -> Any:
            log.append("PIPELINE")
            return super().pack_commands(commands)

    return Recording


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
    settings = core_settings(redis_url, fake_openai.base_url)
    keys = Keys(settings.key_prefix, settings.shards)
    scripts = Scripts(redis, keys)
    names = {
        hashlib.sha1(scripts.source(n).encode()).hexdigest(): n for n in script_names("agent_core")
    }
    for n in script_names("agent_core"):  # loaded already: no NOSCRIPT round trip counted
        await redis.script_load(scripts.source(n))
    log: list[str] = []
    worker_redis = create_redis(redis_url)
    worker_redis.connection_pool.connection_class = _recording(log, names)
    client = AsyncOpenAI(api_key="sk-test", base_url=settings.openai_base_url, max_retries=0)
    w = Worker(worker_redis, strict, client, settings)
    try:
        [reader] = w.readers
        gw = Gateway(redis, keys, agent_name=strict.name)
        run = await gw.start_run("two deletes", requested_by="U1")

        pause = await _one_job(w, reader, log)
        assert pause == ["XREADGROUP", "acquire_lease", "record_turn"], pause
        got = await gw.get_run(run.run_id)
        assert got is not None and got.status is RunStatus.AWAITING_APPROVAL
        for gid in sorted(await redis.smembers(keys.run_gates(run.run_id))):
            assert (await gw.decide(gid, "approve", by="U2")).applied

        resume = await _one_job(w, reader, log)
        assert resume == ["XREADGROUP", "acquire_lease", "finish_turn", "record_turn"], resume
        done = await gw.get_run(run.run_id)
        assert done is not None and done.status is RunStatus.COMPLETED and done.final == "Done."
        assert sorted(read_journal(str(journal))) == ["delete_user:1", "delete_user:2"]
        told = tool_messages(fake_openai.requests_for("two deletes")[-1]["messages"])
        assert [m["content"].split("\n")[0] for m in told] == ["user 1 deleted", "user 2 deleted"]
        # Nothing left behind: the job acknowledged and deleted, the lease released.
        jobs = keys.jobs(keys.shard_of(run.run_id))
        assert await redis.xlen(jobs) == 0
        assert await redis.hget(keys.run(run.run_id), "lease_until") == "0"
    finally:
        for r in w.runners.values():
            await r.endpoint.aclose()
        await client.close()
        await worker_redis.aclose()
