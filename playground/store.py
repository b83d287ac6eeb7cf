"""The playground's workspace state in Redis: messages, threads, ephemeral messages, modals,
uploaded files, status lines (the :class:`~playground.state.State` the Web API keeps).

Everything lives under one key prefix (``{playground:playground}`` from the launcher) in Redis,
so a restart of ``make run`` shows the same conversation. Messages are JSON in one hash,
keyed ``channel:ts``; sorted sets (score = the ts) index a channel's top-level messages, each
thread's replies, and the ephemeral messages each person was shown.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import redis.asyncio as aioredis

from agent_core.script_loader import ScriptSet

from .state import (
    RESPONSE_URL_TTL_S,
    RESPONSE_URL_USES,
    TRIGGER_TTL_MS,
    TRIGGER_USED,
    Message,
    SharedFile,
    State,
)

__all__ = [
    "RESPONSE_URL_TTL_S",
    "RESPONSE_URL_USES",
    "TRIGGER_TTL_MS",
    "TRIGGER_USED",
    "Message",
    "Store",
]


class PlaygroundScripts(ScriptSet):
    """The playground's scripts (``playground/lua/``), one method each."""

    package = "playground"

    async def next_ts(self, last_ts_key: str) -> str:
        """NEXT_TS: a new message ts, strictly increasing."""
        return _text(await self._run("next_ts", [last_ts_key], []))

    async def use_response_url(self, context_key: str) -> str | None:
        """USE_RESPONSE_URL: the URL's context, one use counted; None when used up."""
        raw = await self._run("use_response_url", [context_key], [])
        return _text(raw) if raw else None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


FILE_TTL_S = 3600  # a file announced but never shared is forgotten (Slack discards it)


class Store(State):
    """The playground's state in Redis (see the module docstring)."""

    def __init__(self, redis: aioredis.Redis, prefix: str = "playground") -> None:
        self.redis = redis
        self.p = prefix
        self._scripts = PlaygroundScripts(redis)

    # ------------------------------------------------------------------ keys
    def _msgs(self) -> str:
        return f"{self.p}:msgs"

    def _top(self, channel: str) -> str:
        return f"{self.p}:top:{channel}"

    def _thread(self, channel: str, root: str) -> str:
        return f"{self.p}:thread:{channel}:{root}"

    def _eph(self, channel: str, root: str | None, user: str) -> str:
        return f"{self.p}:eph:{channel}:{root or '-'}:{user}"

    # ------------------------------------------------------------------ messages
    async def next_ts(self) -> str:
        return await self._scripts.next_ts(f"{self.p}:last_ts")

    async def add(self, msg: Message) -> None:
        """Store a new message and index it (top level, thread, or one person's ephemerals)."""
        score = float(msg.ts)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._msgs(), msg.key, msg.dump())
            if msg.ephemeral_to:
                root = msg.thread_ts if msg.is_reply else None
                pipe.zadd(self._eph(msg.channel, root, msg.ephemeral_to), {msg.key: score})
            elif msg.is_reply:
                assert msg.thread_ts is not None
                pipe.zadd(self._thread(msg.channel, msg.thread_ts), {msg.ts: score})
            else:
                pipe.zadd(self._top(msg.channel), {msg.ts: score})
            await pipe.execute()

    async def save(self, msg: Message) -> None:
        """Write back a changed message (an update); its indexes do not change."""
        await self.redis.hset(self._msgs(), msg.key, msg.dump())

    async def get(self, channel: str, ts: str) -> Message | None:
        raw = await self.redis.hget(self._msgs(), f"{channel}:{ts}")
        return Message.load(raw) if raw else None

    async def has_messages(self, channel: str) -> bool:
        return bool(await self.redis.exists(self._top(channel)))

    async def delete(self, msg: Message) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hdel(self._msgs(), msg.key)
            if msg.ephemeral_to:
                root = msg.thread_ts if msg.is_reply else None
                pipe.zrem(self._eph(msg.channel, root, msg.ephemeral_to), msg.key)
            elif msg.is_reply:
                assert msg.thread_ts is not None
                pipe.zrem(self._thread(msg.channel, msg.thread_ts), msg.ts)
            else:
                pipe.zrem(self._top(msg.channel), msg.ts)
            await pipe.execute()

    async def _many(self, keys: list[str]) -> list[Message]:
        if not keys:
            return []
        raws = await self.redis.hmget(self._msgs(), keys)
        return [Message.load(r) for r in raws if r]

    async def top_level(
        self, channel: str, *, limit: int, before: str | None = None, viewer: str | None = None
    ) -> tuple[list[Message], bool]:
        """The newest ``limit`` top-level messages before ``before``, oldest first, with the
        ephemeral ones ``viewer`` was shown in that range; and whether older ones exist."""
        hi = f"({before}" if before else "+inf"
        tss = await self.redis.zrevrangebyscore(self._top(channel), hi, "-inf", 0, limit + 1)
        more = len(tss) > limit
        tss = tss[:limit]
        found = await self._many([f"{channel}:{ts}" for ts in tss])
        if viewer:
            lo = f"({tss[-1]}" if more and tss else "-inf"
            eph = await self.redis.zrangebyscore(self._eph(channel, None, viewer), lo, hi)
            found += await self._many(list(eph))
        found.sort(key=lambda m: float(m.ts))
        return found, more

    async def replies(self, channel: str, root: str, viewer: str | None = None) -> list[Message]:
        """A thread's replies, oldest first (with ``viewer``'s ephemeral ones in it)."""
        tss = await self.redis.zrange(self._thread(channel, root), 0, -1)
        found = await self._many([f"{channel}:{ts}" for ts in tss])
        if viewer:
            found += await self._many(
                list(await self.redis.zrange(self._eph(channel, root, viewer), 0, -1))
            )
        found.sort(key=lambda m: float(m.ts))
        return found

    async def reply_stats(self, channel: str, root: str) -> tuple[int, list[str], str | None]:
        """(reply count, who replied (up to 5), latest reply ts) of a thread."""
        key = self._thread(channel, root)
        count = int(await self.redis.zcard(key))
        if not count:
            return 0, [], None
        last = await self.redis.zrange(key, -20, -1)
        users: list[str] = []
        for m in await self._many([f"{channel}:{ts}" for ts in last]):
            if m.user and m.user not in users:
                users.append(m.user)
        return count, users[:5], str(last[-1])

    async def window(
        self, channel: str, root: str | None, *, oldest: float, latest: float, inclusive: bool
    ) -> list[Message]:
        """Top-level messages (``root`` None) or a thread's replies with a ts in the range."""
        lo = str(oldest) if inclusive else f"({oldest}"
        hi = ("+inf" if latest == float("inf") else str(latest)) if inclusive else f"({latest}"
        if latest == float("inf"):
            hi = "+inf"
        key = self._top(channel) if root is None else self._thread(channel, root)
        tss = await self.redis.zrangebyscore(key, lo, hi)
        return await self._many([f"{channel}:{ts}" for ts in tss])

    # ------------------------------------------------------------------ modals, triggers, response URLs
    async def save_view(self, view_id: str, user: str, view: dict[str, Any]) -> None:
        await self.redis.hset(
            f"{self.p}:views", view_id, json.dumps({"user": user, "view": view}, ensure_ascii=False)
        )

    async def get_view(self, view_id: str) -> tuple[str, dict[str, Any]] | None:
        raw = await self.redis.hget(f"{self.p}:views", view_id)
        if not raw:
            return None
        data = json.loads(raw)
        return str(data["user"]), dict(data["view"])

    async def drop_view(self, view_id: str) -> None:
        await self.redis.hdel(f"{self.p}:views", view_id)

    async def save_home(self, user: str, view: dict[str, Any]) -> None:
        await self.redis.hset(f"{self.p}:homes", user, json.dumps(view, ensure_ascii=False))

    async def home(self, user: str) -> dict[str, Any] | None:
        raw = await self.redis.hget(f"{self.p}:homes", user)
        return dict(json.loads(raw)) if raw else None

    async def issue_trigger(self, trigger_id: str, user: str) -> None:
        await self.redis.set(f"{self.p}:trigger:{trigger_id}", user, px=TRIGGER_TTL_MS)

    async def exchange_trigger(self, trigger_id: str) -> str | None:
        """The person a trigger was issued to, marking it used (atomically): ``None`` once
        expired or never issued, :data:`TRIGGER_USED` when it was already exchanged."""
        user = await self.redis.set(
            f"{self.p}:trigger:{trigger_id}", TRIGGER_USED, xx=True, keepttl=True, get=True
        )
        return str(user) if user else None

    async def issue_response_url(self, token: str, context: dict[str, Any]) -> None:
        await self.redis.set(
            f"{self.p}:respond:{token}",
            json.dumps({**context, "left": RESPONSE_URL_USES}),
            ex=RESPONSE_URL_TTL_S,
        )

    async def use_response_url(self, token: str) -> dict[str, Any] | None:
        """The context of a response URL, counting one use; None once expired or used up."""
        raw = await self._scripts.use_response_url(f"{self.p}:respond:{token}")
        if not raw:
            return None
        data: dict[str, Any] = json.loads(raw)
        data["left"] -= 1
        return data

    # ------------------------------------------------------------------ files
    def _file(self, file_id: str) -> str:
        return f"{self.p}:file:{file_id}"

    async def new_file(self, file_id: str, key: str, filename: str, length: int) -> None:
        """A file announced by files.getUploadURLExternal (``key``: its upload URL's secret)."""
        await self.redis.hset(
            self._file(file_id),
            mapping={"key": key, "filename": filename, "length": str(length), "state": "new"},
        )
        await self.redis.expire(self._file(file_id), FILE_TTL_S)

    async def upload_file(self, file_id: str, key: str, data: bytes) -> bool:
        """Keep the bytes POSTed to the file's upload URL; False for an unknown URL or a file
        already shared."""
        found = await self.redis.hgetall(self._file(file_id))
        if not found or found.get("key") != key or found.get("state") == "shared":
            return False
        encoded = base64.b64encode(data).decode()
        await self.redis.hset(self._file(file_id), mapping={"data": encoded, "state": "uploaded"})
        return True

    async def share_file(
        self, file_id: str, title: str, channel: str | None, thread_ts: str | None
    ) -> SharedFile | None:
        found = await self.redis.hgetall(self._file(file_id))
        if found.get("state") != "uploaded":
            return None
        name = found.get("filename") or file_id
        where = {"channel": channel or "", "thread_ts": thread_ts or ""}
        await self.redis.hset(
            self._file(file_id), mapping={"state": "shared", "title": title, **where}
        )
        await self.redis.persist(self._file(file_id))
        return SharedFile(name, title or name, len(self._data(found)))

    async def file_content(self, file_id: str) -> tuple[str, bytes] | None:
        """A shared file's name and bytes."""
        found = await self.redis.hgetall(self._file(file_id))
        if found.get("state") != "shared":
            return None
        return found.get("filename") or file_id, self._data(found)

    @staticmethod
    def _data(found: dict[str, str]) -> bytes:
        return base64.b64decode(found.get("data") or "")

    # ------------------------------------------------------------------ status lines
    async def set_status(self, channel: str, thread_ts: str, status: str) -> None:
        if status:
            await self.redis.hset(f"{self.p}:status", f"{channel}:{thread_ts}", status)
        else:
            await self.redis.hdel(f"{self.p}:status", f"{channel}:{thread_ts}")

    async def status(self, channel: str, thread_ts: str) -> str:
        return str(await self.redis.hget(f"{self.p}:status", f"{channel}:{thread_ts}") or "")

    async def first_event(self, event_id: str) -> bool:
        return bool(await self.redis.set(f"{self.p}:event:{event_id}", "1", nx=True, ex=3600))
