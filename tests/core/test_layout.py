"""A deployment whose keys are in the old layout (``{t:3}`` tags) on one Redis: this version
refuses to start on it, and ``python -m agent_core.migrate_layout`` moves its keys (RENAMENX),
stops cleanly midway and finishes when run again; afterwards its paused runs are decided by
the gate ids they had and resume. Run again after an old process wrote beside live runs, it
merges the old keys into the live ones, or refuses naming the keys it cannot merge. The same
on Redis Cluster: tests/cluster/test_layout.py; through Slack, with the web process:
tests/bot/test_layout.py; the merge rules: tests/core/test_layout_merge.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from redis.asyncio import Redis

from agent_core import ConfigError, InvalidState, Keys, RunStatus, layout
from agent_core.presence import announce, presence_key
from agent_core.testing import FakeOpenAI, call, reply
from agent_core.worker import Worker
from tests.agents import ops
from tests.core.conftest import core_settings
from tests.core.harness import Harness
from tests.old_layout import (
    approve_and_finish,
    assert_live_state_kept,
    finish_live_state,
    live_state_and_old_writes,
    paused_old_deployment,
)


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
        "agent_core.migrate_layout` once, then start them again"
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


async def test_old_keys_written_after_the_upgrade_are_merged_into_the_live_state(
    redis: Redis,
    redis_url: str,
    fake_openai: FakeOpenAI,
    journal: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An old worker that ran for a moment after the upgrade left its streams (with their
    consumer groups), a paused run and its index entries in the shard of live runs. Running
    the migration again merges them: the new layout's jobs stream, deadlines and active runs
    keep what they held, and gain the old run's entries, once, even across a crash."""
    s = core_settings(redis_url, fake_openai.base_url)
    live = await live_state_and_old_writes(redis, ops, s, fake_openai, monkeypatch)
    keys = live.keys
    problem = await layout.old_layout_problem(redis, keys)
    assert problem is not None and "Redis holds runs in the old key layout" in problem

    dry = await layout.migrate(redis, keys, dry_run=True)
    assert dry.merged[live.shard] >= 3, dry  # at least its jobs, active runs and deadlines

    async def crash(moved: int) -> None:
        raise Crash  # after merging, before deleting the old names

    with pytest.raises(Crash):
        await layout.migrate(redis, keys, checkpoint=crash)
    report = await layout.migrate(redis, keys)
    assert report.merged == dry.merged, "merged again, nothing twice"
    assert (await layout.migrate(redis, keys)).total == 0, "a second run moves nothing"
    assert await layout.old_layout_problem(redis, keys) is None
    assert not [k async for k in redis.scan_iter(match="{t*:ext:layout:*")], "no record left"
    await assert_live_state_kept(redis, live)

    h = Harness(redis, s, ops)
    h.start_worker()
    try:
        await finish_live_state(h.gateway, live, journal)
    finally:
        await h.close()


async def test_a_key_in_both_layouts_that_cannot_be_merged_is_named_and_nothing_moves(
    redis: Redis,
    redis_url: str,
    fake_openai: FakeOpenAI,
    journal: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slash command retried by Slack reached this version's web and an old one: the same
    trigger id started a run in each layout. The migration cannot tell which run the trigger
    names: it refuses, naming the key, and changes nothing; once a person deleted one name,
    it moves everything."""
    s = core_settings(redis_url, fake_openai.base_url)
    keys = Keys(s.key_prefix, s.shards)
    h = Harness(redis, s, ops)
    fake_openai.script("delete user 9", [call("delete_user", {"user_id": "9"}), reply("gone")])
    new_run = await h.gateway.start_run("delete user 9", "U1", idempotency_key="trigger-0")
    old = await paused_old_deployment(redis, ops, s, fake_openai, monkeypatch, runs=1)
    (old_run,) = old.gates
    shard = keys.shard_for("trigger-0")
    old_start, new_start = old.keys.start_key("trigger-0"), keys.start_key("trigger-0")
    assert await redis.get(old_start) == old_run and await redis.get(new_start) == new_run.run_id
    before = {k: await redis.type(k) for k in await redis.keys("*")}

    refusal = re.escape(
        "1 key(s) of KEY_PREFIX=t exist in both layouts with different contents, which cannot "
        "be merged; nothing was moved:\n"
        f"  {old_start} (string, expires in 864XX s) and {new_start} (string) differ\n"
        "keep one name of each pair (DEL the other; a key that expires soon can be waited "
        "for), then run this again"
    ).replace("XX", "[0-9][0-9]")
    for dry_run in (True, False):
        with pytest.raises(InvalidState, match=f"^{refusal}$"):
            await layout.migrate(redis, keys, dry_run=dry_run)
        assert {k: await redis.type(k) for k in await redis.keys("*")} == before
    assert not await redis.exists(layout.marker_key(keys))
    assert old_start.startswith(f"{{t:{shard}}}")

    await redis.delete(old_start)  # the person keeps the run this version started
    report = await layout.migrate(redis, keys)
    old_names = [k for k in before if k.startswith("{t:") and k.split("}")[0].count(":") == 1]
    assert report.total == len(old_names) - 1, report
    assert report.merged == {shard: 3}, report  # its jobs, active runs and U1's runs
    assert await layout.old_layout_problem(redis, keys) is None
    assert await redis.get(new_start) == new_run.run_id
    h.start_worker()
    try:
        assert (await h.gateway.decide(old.gates[old_run], "approve", by="U2")).applied
        done = await h.gateway.wait(old_run, timeout=30)
        assert done.status is RunStatus.COMPLETED and done.final == "user 0 gone", done
    finally:
        await h.close()
