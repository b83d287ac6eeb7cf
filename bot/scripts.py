"""The bot's Lua scripts (per-name locks and card records), each a file of ``bot/lua/`` with
a KEYS/ARGV/returns header, run by :class:`BotScripts`: one method per script, which builds
its KEYS and ARGV and types its reply (see :mod:`agent_core.script_loader`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio import Redis

from agent_core.script_loader import ScriptSet


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _pairs(flat: list[Any]) -> dict[str, str]:
    return {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


class BotScripts(ScriptSet):
    """The bot's scripts on one client."""

    package = "bot"

    def __init__(self, redis: Redis) -> None:
        super().__init__(redis)

    async def lock_and_read(
        self,
        lock_key: str,
        token: str,
        ttl_ms: int,
        read: Sequence[str] = (),
        *,
        write_first: Mapping[str, str] | None = None,
        write_ttl: int = 0,
    ) -> list[dict[str, str]] | None:
        """LOCK_AND_READ: the hashes ``read`` (as the lock is taken), or None when another
        holder has the lock. ``write_first``: fields written into ``read[0]`` before (then
        expiring after ``write_ttl`` seconds), whether the lock is free or not."""
        args: list[str | int] = [token, ttl_ms, ""]
        if write_first:
            if not read:
                raise ValueError("write_first needs a hash to write into: read[0]")
            args[2] = write_ttl
            for field, value in write_first.items():
                args += [field, value]
        got = await self._run("lock_and_read", [lock_key, *read], args)
        if not got:
            return None
        return [_pairs(flat) for flat in got[1:]]

    async def renew_lock(self, lock_key: str, token: str, ttl_ms: int) -> bool:
        """RENEW_LOCK: True if this token still held the lock, renewed."""
        return bool(await self._run("renew_lock", [lock_key], [token, ttl_ms]))

    async def release_lock(self, lock_key: str, token: str) -> bool:
        """RELEASE_LOCK: True if this token held the lock, released."""
        return bool(await self._run("release_lock", [lock_key], [token]))

    async def release_after_writes(
        self, lock_key: str, token: str, ttl: int, writes: Mapping[str, Mapping[str, str]]
    ) -> bool:
        """RELEASE_AFTER_WRITES: ``writes`` (hash -> fields, each hash then expiring after
        ``ttl`` seconds), then the lock released if still this token's."""
        args: list[str | int] = [token, ttl]
        for fields in writes.values():
            args.append(len(fields))
            for name, value in fields.items():
                args += [name, value]
        return bool(await self._run("release_after_writes", [lock_key, *writes], args))

    async def save_card(self, card_key: str, channel: str, ts: str, digest: str, ttl: int) -> bool:
        """SAVE_CARD: True when the message became the card, False when it joined
        ``others``."""
        return bool(await self._run("save_card", [card_key], [channel, ts, digest, ttl]))

    async def set_result_if_none(self, card_key: str, ttl: int, fields: Mapping[str, str]) -> bool:
        """SET_RESULT_IF_NONE: True when stored (the card had no outcome yet)."""
        flat = [x for kv in fields.items() for x in kv]
        return bool(await self._run("set_result_if_none", [card_key], [ttl, *flat]))

    async def mark_stale(self, stale_key: str, member: str, at: float, most: int, ttl: int) -> int:
        """MARK_STALE: the number of stale cards the channel now has."""
        return int(await self._run("mark_stale", [stale_key], [member, f"{at:.6f}", most, ttl]))

    async def clear_stale(self, stale_key: str, marks: Sequence[tuple[str, float]]) -> int:
        """CLEAR_STALE: the number of marks removed (those not marked again meanwhile)."""
        if not marks:
            return 0
        flat: list[str] = [x for member, score in marks for x in (member, repr(score))]
        return int(await self._run("clear_stale", [stale_key], flat))
