"""A minimal LangGraph checkpointer on plain Redis (no RedisJSON, no RediSearch): the fallback.

The pause benchmark runs LangGraph on ``langgraph-checkpoint-redis``'s real saver, on the Redis
Stack server of :mod:`tests.bench.stack`. When Redis Stack cannot be prepared or started (the
reason is reported), or with ``--stand-in``, LangGraph runs on this saver instead and its rows
are labelled "[stand-in saver]". It follows the layout of LangGraph's own savers
(``InMemorySaver``, the Postgres saver): one blob per *changed* channel version, the checkpoint
without its channel values, and the pending writes per checkpoint. It is deliberately lean
(one pipelined round trip per put, three per read), so it flatters LangGraph rather than
penalises it. Enough for ``ainvoke``/interrupt/resume; listing and deletion are not needed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.memory import InMemorySaver
from redis.asyncio import Redis


def _pack(typed: tuple[str, bytes]) -> bytes:
    return typed[0].encode() + b"\x00" + typed[1]


def _unpack(raw: bytes) -> tuple[str, bytes]:
    t, _, data = raw.partition(b"\x00")
    return t.decode(), data


class PlainRedisSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpoints in plain Redis strings and hashes (``redis`` with bytes replies)."""

    def __init__(self, redis: Redis, prefix: str = "lg") -> None:
        super().__init__()
        self.redis = redis
        self.prefix = prefix

    # --- keys -------------------------------------------------------------------------
    def _latest(self, thread: str, ns: str) -> str:
        return f"{self.prefix}:{thread}:{ns}:latest"

    def _cp(self, thread: str, ns: str, cp_id: str) -> str:
        return f"{self.prefix}:{thread}:{ns}:cp:{cp_id}"

    def _blob(self, thread: str, ns: str, channel: str, version: str | int | float) -> str:
        return f"{self.prefix}:{thread}:{ns}:blob:{channel}:{version}"

    def _writes(self, thread: str, ns: str, cp_id: str) -> str:
        return f"{self.prefix}:{thread}:{ns}:writes:{cp_id}"

    # --- the async API LangGraph uses -------------------------------------------------
    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        c = checkpoint.copy()
        thread = config["configurable"]["thread_id"]
        ns = config["configurable"].get("checkpoint_ns", "")
        values: dict[str, Any] = c.pop("channel_values")  # type: ignore[misc]
        parent = config["configurable"].get("checkpoint_id") or ""
        async with self.redis.pipeline(transaction=True) as pipe:
            for ch, ver in new_versions.items():
                blob = _pack(self.serde.dumps_typed(values[ch])) if ch in values else b"empty\x00"
                pipe.set(self._blob(thread, ns, ch, ver), blob)
            pipe.hset(
                self._cp(thread, ns, checkpoint["id"]),
                mapping={
                    "checkpoint": _pack(self.serde.dumps_typed(c)),
                    "metadata": _pack(
                        self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))
                    ),
                    "parent": parent,
                },
            )
            pipe.set(self._latest(thread, ns), checkpoint["id"])
            await pipe.execute()
        return {
            "configurable": {
                "thread_id": thread,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint["id"],
            }
        }

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        thread = config["configurable"]["thread_id"]
        ns = config["configurable"].get("checkpoint_ns", "")
        cp_id = config["configurable"]["checkpoint_id"]
        mapping: dict[str, bytes] = {}
        for idx, (ch, value) in enumerate(writes):
            widx = WRITES_IDX_MAP.get(ch, idx)
            mapping[f"{task_id}\x00{widx}\x00{ch}\x00{task_path}"] = _pack(
                self.serde.dumps_typed(value)
            )
        if mapping:
            await self.redis.hset(self._writes(thread, ns, cp_id), mapping=mapping)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread = config["configurable"]["thread_id"]
        ns = config["configurable"].get("checkpoint_ns", "")
        cp_id = get_checkpoint_id(config)
        if not cp_id:
            raw_id = await self.redis.get(self._latest(thread, ns))
            if raw_id is None:
                return None
            cp_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._cp(thread, ns, cp_id))
            pipe.hgetall(self._writes(thread, ns, cp_id))
            saved, raw_writes = await pipe.execute()
        if not saved:
            return None
        checkpoint: Checkpoint = self.serde.loads_typed(_unpack(saved[b"checkpoint"]))
        versions = checkpoint["channel_versions"]
        channels = list(versions)
        blobs = (
            await self.redis.mget([self._blob(thread, ns, ch, versions[ch]) for ch in channels])
            if channels
            else []
        )
        values: dict[str, Any] = {}
        for ch, raw in zip(channels, blobs, strict=True):
            if raw is None:
                continue
            typed = _unpack(raw)
            if typed[0] != "empty":
                values[ch] = self.serde.loads_typed(typed)
        pending = []
        for field, raw in sorted(raw_writes.items(), key=lambda kv: kv[0]):
            task_id, _, ch, _ = field.decode().split("\x00")
            pending.append((task_id, ch, self.serde.loads_typed(_unpack(raw))))
        parent = saved.get(b"parent", b"").decode()
        return CheckpointTuple(
            config={
                "configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": cp_id}
            },
            checkpoint={**checkpoint, "channel_values": values},
            metadata=self.serde.loads_typed(_unpack(saved[b"metadata"])),
            pending_writes=pending,
            parent_config=(
                {
                    "configurable": {
                        "thread_id": thread,
                        "checkpoint_ns": ns,
                        "checkpoint_id": parent,
                    }
                }
                if parent
                else None
            ),
        )

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        if config is not None and (t := await self.aget_tuple(config)) is not None:
            yield t

    def get_next_version(self, current: str | None, channel: None) -> str:
        return InMemorySaver.get_next_version(self, current, channel)  # type: ignore[arg-type]
