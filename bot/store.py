"""Bot-owned Redis state: where each card lives, what it last showed, per-name locks.

Every key comes from ``Keys.ext`` so it shares the deployment prefix and hash tag. Any
``web`` replica can update any card because (channel, ts) live here, not in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import redis.asyncio as aioredis

from agent_core import scripts
from agent_core.keys import Keys

from .cards import ToolResult

CARD_NS = "slack-card"
RUN_NS = "slack-run"
LOCK_NS = "slack-lock"
# Bot records outlive the runs people still look at, then go away on their own.
RECORD_TTL_SECONDS = 30 * 24 * 3600
# A lock lives LOCK_TTL_MS unless its holder renews it (every third of that while it works):
# a web process killed while holding one blocks that card for seconds, not minutes.
LOCK_TTL_MS = 10_000
LOCK_WAIT_SECONDS = 3.0


class LockBusy(Exception):
    """Another process held the lock for longer than we were willing to wait."""


@dataclass(frozen=True)
class CardRecord:
    channel: str | None
    ts: str | None
    digest: str | None
    result: ToolResult | None


@dataclass(frozen=True)
class RunRecord:
    channel: str | None
    ts: str | None
    digest: str | None


class Store:
    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._release = redis.register_script(scripts.RELEASE_LOCK)
        self._renew = redis.register_script(scripts.RENEW_LOCK)

    # --- cards ------------------------------------------------------------------------
    def card_key(self, gate_id: str) -> str:
        return self.keys.ext(CARD_NS, gate_id)

    async def card(self, gate_id: str) -> CardRecord:
        h = await self._hgetall(self.card_key(gate_id))
        result = None
        if h.get("result_ok") is not None:
            result = ToolResult(
                ok=h["result_ok"] == "1",
                output=h.get("result_output", ""),
                in_doubt=h.get("result_in_doubt") == "1",
                skipped=h.get("result_skipped") or None,
            )
        return CardRecord(h.get("channel"), h.get("ts"), h.get("digest"), result)

    async def save_card(self, gate_id: str, channel: str, ts: str, digest: str) -> None:
        await self._hset(self.card_key(gate_id), {"channel": channel, "ts": ts, "digest": digest})

    async def set_card_digest(self, gate_id: str, digest: str) -> None:
        await self._hset(self.card_key(gate_id), {"digest": digest})

    async def set_result(self, gate_id: str, result: ToolResult) -> None:
        await self._hset(
            self.card_key(gate_id),
            {
                "result_ok": "1" if result.ok else "0",
                "result_output": result.output,
                "result_in_doubt": "1" if result.in_doubt else "0",
                "result_skipped": result.skipped or "",
            },
        )

    # --- runs -------------------------------------------------------------------------
    def run_key(self, run_id: str) -> str:
        return self.keys.ext(RUN_NS, run_id)

    async def run(self, run_id: str) -> RunRecord:
        h = await self._hgetall(self.run_key(run_id))
        return RunRecord(h.get("channel"), h.get("ts"), h.get("digest"))

    async def save_run_root(self, run_id: str, channel: str, ts: str) -> None:
        await self._hset(self.run_key(run_id), {"channel": channel, "ts": ts})

    async def set_run_digest(self, run_id: str, digest: str) -> None:
        await self._hset(self.run_key(run_id), {"digest": digest})

    async def posted(self, run_id: str, marker: str) -> bool:
        return bool(await self.redis.hexists(self.run_key(run_id), f"posted:{marker}"))

    async def mark_posted(self, run_id: str, marker: str, ts: str) -> None:
        await self._hset(self.run_key(run_id), {f"posted:{marker}": ts})

    async def first_time(self, namespace: str, ident: str, ttl_seconds: int = 600) -> bool:
        """True the first time ``ident`` is seen in ``namespace`` within ``ttl_seconds``."""
        key = self.keys.ext(namespace, ident)
        return bool(await self.redis.set(key, "1", nx=True, ex=ttl_seconds))

    # --- locks ------------------------------------------------------------------------
    @asynccontextmanager
    async def lock(self, name: str, wait_seconds: float = LOCK_WAIT_SECONDS) -> AsyncIterator[None]:
        """A short mutual exclusion across replicas (SET NX PX, renewed while held, released
        only by its owner). :class:`LockBusy` if another holder keeps it past ``wait_seconds``.
        """
        key = self.keys.ext(LOCK_NS, name)
        token = secrets.token_hex(8)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + wait_seconds
        delay = 0.01
        while not await self.redis.set(key, token, nx=True, px=LOCK_TTL_MS):
            if loop.time() >= give_up:
                raise LockBusy(name)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)
        renewer = asyncio.create_task(self._keep(key, token))
        try:
            yield
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            await self._release(keys=[key], args=[token])

    async def _keep(self, key: str, token: str) -> None:
        while True:
            await asyncio.sleep(LOCK_TTL_MS / 3000)
            with contextlib.suppress(aioredis.RedisError, OSError):
                await self._renew(keys=[key], args=[token, LOCK_TTL_MS])

    # --- helpers ----------------------------------------------------------------------
    async def _hgetall(self, key: str) -> dict[str, str]:
        raw = await self.redis.hgetall(key)
        return {_s(k): _s(v) for k, v in raw.items()}

    async def _hset(self, key: str, mapping: dict[str, str]) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=mapping)  # type: ignore[arg-type,unused-ignore]
            pipe.expire(key, RECORD_TTL_SECONDS)
            await pipe.execute()


def _s(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v
