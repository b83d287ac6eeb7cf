"""Which shard a new run goes to.

On one Redis node every shard is on the same server: a shard at random. On Redis Cluster a
master is chosen at random first, then one of the shards whose slot that master serves, so
every master gets the same share of new runs whatever the shards' tags and however the
slots were moved since. The slot table is the cluster client's own (redis-py keeps it up to
date from MOVED replies and refreshes after failovers), read again at most every
:data:`REFRESH_SECONDS`; it costs no Redis command. Runs started with an idempotency key do
not come here (their shard is the key's), nor do child runs (their parent's shard).
"""

from __future__ import annotations

import secrets
import time

from redis.asyncio import Redis

from .keys import Keys
from .streams import is_cluster

REFRESH_SECONDS = 1.0


class ShardPicker:
    """Chooses the shard of each new run for one client and one deployment's keys."""

    def __init__(self, redis: Redis, keys: Keys, *, refresh: float = REFRESH_SECONDS) -> None:
        self.redis = redis
        self.keys = keys
        self.refresh = refresh
        self._groups: list[list[int]] = []
        self._read_at = -float("inf")

    def pick(self) -> int:
        """A master at random among those serving some shard, then one of its shards; a shard
        at random on one node or while the slot table is unknown."""
        if is_cluster(self.redis):
            now = time.monotonic()
            if now - self._read_at >= self.refresh:
                self._groups = self.shards_by_master()
                self._read_at = now
            if self._groups:
                return secrets.choice(secrets.choice(self._groups))
        return secrets.randbelow(self.keys.shards)

    def shards_by_master(self) -> list[list[int]]:
        """The shards each master serves now (as the client knows it), masters serving none
        left out; empty when any shard's slot is not known."""
        manager = getattr(self.redis, "nodes_manager", None)
        if manager is None:
            return []
        by_master: dict[str, list[int]] = {}
        for shard in self.keys.all_shards():
            try:
                node = manager.get_node_from_slot(self.keys.slot(shard))
            except Exception:  # SlotNotCoveredError, or a table being rebuilt
                return []
            if node is None:
                return []
            by_master.setdefault(node.name, []).append(shard)
        return list(by_master.values())
