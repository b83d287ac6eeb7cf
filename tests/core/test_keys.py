"""Shards' hash tags: each hashes to the first slot of its own slice of the 16384 slots, so an
even split of the slots over any number of masters gives each floor or ceil(SHARDS / M)."""

from __future__ import annotations

import math
import time

import pytest

from agent_core.keys import SLOTS, Keys, first_slot
from tests.redis_cluster import key_slot


def even_split(masters: int) -> list[tuple[int, int]]:
    """The slot ranges ``redis-cli --cluster create`` gives ``masters`` masters."""
    per = SLOTS / masters
    ranges, first, cursor = [], 0, 0.0
    for i in range(masters):
        last = math.floor(cursor + per - 1 + 0.5)  # C's lround
        if last > SLOTS - 1 or i == masters - 1:
            last = SLOTS - 1
        ranges.append((first, last))
        first, cursor = last + 1, cursor + per
    return ranges


@pytest.mark.parametrize("shards", [1, 2, 3, 16, 64])
def test_every_tag_hashes_to_the_first_slot_of_its_slice(shards: int) -> None:
    for prefix in ("agw", "t", "prod-eu.2"):
        keys = Keys(prefix, shards)
        for shard in keys.all_shards():
            slot = key_slot(keys.run(keys.new_run_id(shard)))
            assert slot == keys.slot(shard) == first_slot(shard, shards)
            assert slot * shards // SLOTS == shard, "inside its own slice"
            assert key_slot(keys.jobs(shard)) == key_slot(keys.gate(keys.new_gate_id(shard)))
            assert keys.shard_of_stream(keys.events(shard)) == shard
        for masters in range(1, 9):
            counts = [
                sum(1 for s in keys.all_shards() if lo <= keys.slot(s) <= hi)
                for lo, hi in even_split(masters)
            ]
            assert sum(counts) == shards
            assert set(counts) <= {shards // masters, -(-shards // masters)}, (masters, counts)


def test_1296_shards_are_cheap_and_balanced() -> None:
    started = time.perf_counter()
    keys = Keys("agw", 1296)
    tags = [keys.tag(s) for s in keys.all_shards()]
    assert time.perf_counter() - started < 1.0
    assert len(set(tags)) == 1296
    for shard in (0, 1, 35, 36, 647, 1000, 1294, 1295):
        assert key_slot(keys.deadlines(shard)) == first_slot(shard, 1296)
        assert keys.shard_of(keys.new_run_id(shard)) == shard
    for masters in (3, 5, 7):
        counts = [
            sum(1 for s in keys.all_shards() if lo <= keys.slot(s) <= hi)
            for lo, hi in even_split(masters)
        ]
        assert max(counts) - min(counts) <= 1, counts


def test_tags_are_fixed_and_the_legacy_layout_is_unchanged() -> None:
    # Key names of deployments: a change here strands their runs (see agent_core.layout).
    keys = Keys("agw")
    assert [keys.tag(s) for s in (0, 3, 15)] == ["{agw:0:04rw}", "{agw:3:04mz}", "{agw:15:0211}"]
    assert keys.jobs(3) == "{agw:3:04mz}:jobs"
    old = Keys("agw", legacy=True)
    assert old.jobs(3) == "{agw:3}:jobs" and old.shard_of_stream("{agw:3}:events") == 3
    assert old.run("r-03abcdefghij") == "{agw:3}:run:r-03abcdefghij"
    assert keys.ext("slack-lock", "x") == old.ext("slack-lock", "x") == "{agw}:ext:slack-lock:x"
    for bad in ("{agw:3}:jobs", "{agw:16:0000}:jobs", "{agw:3:0000}:jobs", "{other:3:04mz}:x"):
        with pytest.raises(ValueError):
            keys.shard_of_stream(bad)
    with pytest.raises(ValueError):
        old.shard_of_stream("{agw:3:04mz}:jobs")
