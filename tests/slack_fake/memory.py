"""The fake Slack's state in memory: the playground's :class:`~playground.state.State`, kept in
this process instead of Redis, for the tests' :class:`~tests.slack_fake.FakeSlack`.

The rules are the Redis store's (``tests/playground/test_stores.py`` runs the same checks on
both), with one leniency a test needs: a ``trigger_id`` or ``response_url`` the fake
never issued (tests make them up in the payloads they send) is taken as issued just now to
nobody in particular; a trigger whose id starts with ``expired`` is taken as expired. Either
is still used up as Slack uses it (a trigger once).

The server thread writes, the test thread reads (:meth:`MemoryStore.messages`, ...): one lock
guards it all, and what is stored is a copy, replaced as a whole on each write.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass
from typing import Any

from playground.state import (
    RESPONSE_URL_TTL_S,
    RESPONSE_URL_USES,
    TRIGGER_TTL_MS,
    TRIGGER_USED,
    Message,
    SharedFile,
    State,
)


@dataclass
class FakeFile:
    """A file uploaded with files.getUploadURLExternal, its bytes, and where it was shared."""

    id: str
    filename: str
    length: int
    key: str  # the secret part of its upload URL
    data: bytes | None = None  # None until uploaded
    title: str = ""
    completed: bool = False
    channel: str | None = None
    thread_ts: str | None = None
    ts: str | None = None  # the message that shares it

    @property
    def text(self) -> str:
        """The content as text (UTF-8)."""
        return (self.data or b"").decode("utf-8", "replace")


class MemoryStore(State):
    """The workspace's state in memory (see the module docstring)."""

    def __init__(self, *, lenient: bool = True) -> None:
        self.lenient = lenient
        self._lock = threading.Lock()
        self._messages: dict[tuple[str, str], Message] = {}
        self._views: dict[str, tuple[str, dict[str, Any]]] = {}
        self._homes: dict[str, dict[str, Any]] = {}
        self._triggers: dict[str, tuple[str, float]] = {}  # id → (user, expires at)
        self._response_urls: dict[str, tuple[dict[str, Any], float]] = {}
        self._files: dict[str, FakeFile] = {}
        self._statuses: dict[tuple[str, str], str] = {}
        self._last_ts = 0.0

    def clear(self) -> None:
        with self._lock:
            for kept in (self._messages, self._views, self._triggers, self._response_urls):
                kept.clear()
            self._homes.clear()
            self._files.clear()
            self._statuses.clear()

    # ------------------------------------------------------------------ what tests read
    def messages(self) -> list[Message]:
        """Every message but the ephemeral ones, in the order they were posted."""
        with self._lock:
            return [m for m in self._messages.values() if not m.ephemeral_to]

    def message(self, channel: str, ts: str) -> Message | None:
        with self._lock:
            return self._messages.get((channel, ts))

    def files(self) -> list[FakeFile]:
        with self._lock:
            return list(self._files.values())

    def status_now(self, channel: str, thread_ts: str) -> str:
        with self._lock:
            return self._statuses.get((channel, thread_ts), "")

    def new_ts(self) -> str:
        """A message timestamp as Slack makes them: unix time, unique and increasing."""
        with self._lock:
            self._last_ts = max(time.time(), self._last_ts + 0.000001)
            return f"{self._last_ts:.6f}"

    def put(self, msg: Message) -> None:
        """Store a message (new or changed) at once, from any thread."""
        with self._lock:
            self._messages[(msg.channel, msg.ts)] = copy.deepcopy(msg)

    # ------------------------------------------------------------------ messages
    async def next_ts(self) -> str:
        return self.new_ts()

    async def add(self, msg: Message) -> None:
        self.put(msg)
        with self._lock:
            for f in msg.files:  # a file shared in a message: remember which
                if (found := self._files.get(str(f.get("id")))) is not None:
                    found.ts = msg.ts

    async def save(self, msg: Message) -> None:
        self.put(msg)

    async def get(self, channel: str, ts: str) -> Message | None:
        with self._lock:
            found = self._messages.get((channel, ts))
            return copy.deepcopy(found) if found is not None else None

    async def delete(self, msg: Message) -> None:
        with self._lock:
            self._messages.pop((msg.channel, msg.ts), None)

    def _shown(self, channel: str, root: str | None) -> list[Message]:
        """Top-level messages (``root`` None) or a thread's replies; never ephemeral ones."""
        return [
            m
            for m in self._messages.values()
            if m.channel == channel
            and not m.ephemeral_to
            and (not m.is_reply if root is None else m.is_reply and m.thread_ts == root)
        ]

    async def has_messages(self, channel: str) -> bool:
        with self._lock:
            return bool(self._shown(channel, None))

    async def reply_stats(self, channel: str, root: str) -> tuple[int, list[str], str | None]:
        with self._lock:
            replies = sorted(self._shown(channel, root), key=lambda m: float(m.ts))
        if not replies:
            return 0, [], None
        users: list[str] = []
        for m in replies[-20:]:
            if m.user and m.user not in users:
                users.append(m.user)
        return len(replies), users[:5], replies[-1].ts

    async def window(
        self, channel: str, root: str | None, *, oldest: float, latest: float, inclusive: bool
    ) -> list[Message]:
        def keep(m: Message) -> bool:
            ts = float(m.ts)
            return oldest <= ts <= latest if inclusive else oldest < ts < latest

        with self._lock:
            return [copy.deepcopy(m) for m in self._shown(channel, root) if keep(m)]

    # ------------------------------------------------------------------ modals, triggers, response URLs
    async def save_view(self, view_id: str, user: str, view: dict[str, Any]) -> None:
        with self._lock:
            self._views[view_id] = (user, copy.deepcopy(view))

    async def get_view(self, view_id: str) -> tuple[str, dict[str, Any]] | None:
        with self._lock:
            found = self._views.get(view_id)
            return (found[0], copy.deepcopy(found[1])) if found else None

    async def drop_view(self, view_id: str) -> None:
        with self._lock:
            self._views.pop(view_id, None)

    async def save_home(self, user: str, view: dict[str, Any]) -> None:
        with self._lock:
            self._homes[user] = copy.deepcopy(view)

    async def home(self, user: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._homes.get(user)
            return copy.deepcopy(found) if found is not None else None

    async def issue_trigger(self, trigger_id: str, user: str) -> None:
        with self._lock:
            self._triggers[trigger_id] = (user, time.monotonic() + TRIGGER_TTL_MS / 1000)

    async def exchange_trigger(self, trigger_id: str) -> str | None:
        now = time.monotonic()
        with self._lock:
            found = self._triggers.get(trigger_id)
            if found is None and self.lenient and not trigger_id.startswith("expired"):
                found = ("", now + TRIGGER_TTL_MS / 1000)
            if found is None or found[1] < now:
                return None
            self._triggers[trigger_id] = (TRIGGER_USED, found[1])
            return found[0]

    async def issue_response_url(self, token: str, context: dict[str, Any]) -> None:
        with self._lock:
            self._response_urls[token] = (
                {**context, "left": RESPONSE_URL_USES},
                time.monotonic() + RESPONSE_URL_TTL_S,
            )

    async def use_response_url(self, token: str) -> dict[str, Any] | None:
        now = time.monotonic()
        with self._lock:
            found = self._response_urls.get(token)
            if found is None:
                return {} if self.lenient else None
            context, expires = found
            if expires < now or context["left"] <= 0:
                return None
            context = {**context, "left": context["left"] - 1}
            self._response_urls[token] = (context, expires)
            return dict(context)

    # ------------------------------------------------------------------ files
    async def new_file(self, file_id: str, key: str, filename: str, length: int) -> None:
        with self._lock:
            self._files[file_id] = FakeFile(file_id, filename, length, key)

    async def upload_file(self, file_id: str, key: str, data: bytes) -> bool:
        with self._lock:
            found = self._files.get(file_id)
            if found is None or found.key != key or found.completed:
                return False
            found.data = data
            return True

    async def share_file(
        self, file_id: str, title: str, channel: str | None, thread_ts: str | None
    ) -> SharedFile | None:
        with self._lock:
            found = self._files.get(file_id)
            if found is None or found.data is None or found.completed:
                return None
            found.title, found.completed = title or found.filename, True
            found.channel, found.thread_ts = channel, thread_ts
            return SharedFile(found.filename, found.title, len(found.data))

    async def file_content(self, file_id: str) -> tuple[str, bytes] | None:
        with self._lock:
            found = self._files.get(file_id)
            if found is None or not found.completed:
                return None
            return found.filename, found.data or b""

    # ------------------------------------------------------------------ assistant threads
    async def set_status(self, channel: str, thread_ts: str, status: str) -> None:
        with self._lock:
            if status:
                self._statuses[(channel, thread_ts)] = status
            else:
                self._statuses.pop((channel, thread_ts), None)

    async def status(self, channel: str, thread_ts: str) -> str:
        return self.status_now(channel, thread_ts)
