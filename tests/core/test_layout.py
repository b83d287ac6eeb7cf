"""A deployment whose keys are in the old layout (``{t:3}`` tags) on one Redis: this version
refuses to start on it, and ``python -m agent_core.migrate_layout`` moves its keys (RENAME),
stops cleanly midway and finishes when run again; afterwards its paused runs are decided by
the gate ids they had and resume. The same on Redis Cluster: tests/cluster/test_layout.py;
through Slack, with the web process: tests/bot/test_layout.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio import Redis

from agent_core import ConfigError, InvalidState, Keys, layout
from agent_core.presence import announce, presence_key
from agent_core.testing import FakeOpenAI
from agent_core.worker import Worker
from tests.agents import ops
from tests.core.conftest import core_settings
from tests.core.harness import Harness
from tests.old_layout import approve_and_finish, paused_old_deployment


class Crash(Exception):
    """The migration process dying midway."""


async def test_a_migration_stopped_midway_finishes_when_run_again(
    redis: Redis,
    redis_url: str,
    fake_openai: FakeOpenAI,
    journal: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    s = core_settings(redis_url, fake_openai.base_url)
    keys = Keys(s.key_prefix, s.shards)
    old = await paused_old_deployment(redis, ops, s, fake_openai, monkeypatch)
    before = sorted(await redis.keys("{t:*"))
    assert all(k.split("}")[0].count(":") == 1 for k in before), "all in the old layout"
    ttls = {k: await redis.pttl(k) for k in before if ":start:" in k}
    assert len(ttls) == 4 and all(t > 0 for t in ttls.values())

    # This version refuses to start on it, with one line naming the fix.
    h = Harness(redis, s, ops)
    with pytest.raises(ConfigError) as refused:
        await Worker(redis, ops, h.client, s).run()
    assert str(refused.value) == (
        "KEY_PREFIX=t: Redis holds runs in the old key layout ({t:N} hash tags), which this "
        "version would not see; stop every web and worker, run `python -m "
        "agent_core.migrate_layout` (`make migrate-layout`) once, then start them again"
    )
    # A worker that is still alive (one of the old version, say) makes it refuse.
    assert await announce(redis, keys, "old-worker", ["test-ops"], every=10)
    with pytest.raises(InvalidState, match="1 worker\\(s\\) alive under KEY_PREFIX=t"):
        await layout.migrate(redis, keys)
    await redis.delete(presence_key(keys))  # it stopped
    # Another SHARDS would put the keys where this deployment's processes do not look.
    for shards, seen in ((8, "8 shards and more"), (32, "16 shards")):
        with pytest.raises(InvalidState, match=f"are those of {seen}, not of SHARDS={shards}"):
            await layout.migrate(redis, Keys(s.key_prefix, shards))
    dry = await layout.migrate(redis, keys, dry_run=True)
    assert dry.total == len(before) and sorted(await redis.keys("{t:*")) == before

    async def crash_after_7(moved: int) -> None:
        if moved >= 7:
            raise Crash

    with pytest.raises(Crash):
        await layout.migrate(redis, keys, batch=3, checkpoint=crash_after_7)
    problem = await layout.old_layout_problem(redis, keys)
    assert problem is not None and "did not finish" in problem
    with pytest.raises(ConfigError, match="did not finish"):
        await Worker(redis, ops, h.client, s).run()

    rest = await layout.migrate(redis, keys)
    assert rest.total == len(before) - 9, "the 3 batches of 3 before the crash stayed moved"
    assert (await layout.migrate(redis, keys)).total == 0, "a second run moves nothing"
    assert await layout.old_layout_problem(redis, keys) is None

    def renamed(name: str) -> str:
        shard = int(name[len("{t:") : name.index("}")])
        return keys.tag(shard) + name[name.index("}") + 1 :]

    assert sorted(await redis.keys("{t:*")) == sorted(map(renamed, before))
    for name, ttl in ttls.items():
        assert 0 < await redis.pttl(renamed(name)) <= ttl, "the start keys keep their TTL"

    # This version now starts, and the gates opened before are decided by their ids.
    h.start_worker()
    try:
        await approve_and_finish(h.gateway, old, journal)
    finally:
        await h.close()
