"""What the fake Slack Web API keeps, and the interface of the two stores that keep it.

:class:`playground.slack_api.WebApi` is one implementation of the Web API; it reads and writes
a :class:`State`: in Redis for the playground (:class:`playground.store.Store`, so a restart
shows the same conversation), in memory for the tests' fake Slack (``tests/slack_fake``).
Both keep the same things with the same rules: messages (top level, thread replies, each
person's ephemeral ones), open modals, triggers (3 s, once), response URLs (30 min, 5 uses),
uploaded files, assistant threads' status lines, and each person's App Home view.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any

TRIGGER_TTL_MS = 3000  # Slack: a trigger_id opens a modal within 3 seconds, once
TRIGGER_USED = "-"  # what exchanging a trigger answers once it was already exchanged
RESPONSE_URL_TTL_S = 1800  # Slack: a response_url works for 30 minutes, 5 times
RESPONSE_URL_USES = 5


@dataclass
class Message:
    """A message as the workspace stores it."""

    channel: str
    ts: str
    text: str = ""
    blocks: list[dict[str, Any]] = field(default_factory=list)
    thread_ts: str | None = None
    user: str = ""
    bot_id: str | None = None
    metadata: dict[str, Any] | None = None
    updated: int = 0
    # Set on an ephemeral message: the one person who sees it.
    ephemeral_to: str | None = None
    # The files it shares (files.completeUploadExternal), as the Web API shows them.
    files: list[dict[str, Any]] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.channel}:{self.ts}"

    @property
    def is_reply(self) -> bool:
        return self.thread_ts is not None and self.thread_ts != self.ts

    def dump(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def load(cls, raw: str) -> Message:
        return cls(**json.loads(raw))


@dataclass(frozen=True)
class SharedFile:
    """A file once shared: its name, title and size (what a message's ``files`` shows)."""

    name: str
    title: str
    size: int


class State(ABC):
    """The workspace's state, as :class:`~playground.slack_api.WebApi` reads and writes it."""

    # ------------------------------------------------------------------ messages
    @abstractmethod
    async def next_ts(self) -> str:
        """A message ts in Slack's format (``1764600000.000100``), strictly increasing."""

    @abstractmethod
    async def add(self, msg: Message) -> None:
        """Store a new message (top level, thread reply, or one person's ephemeral)."""

    @abstractmethod
    async def save(self, msg: Message) -> None:
        """Write back a changed message (an update)."""

    @abstractmethod
    async def get(self, channel: str, ts: str) -> Message | None: ...

    @abstractmethod
    async def delete(self, msg: Message) -> None: ...

    @abstractmethod
    async def has_messages(self, channel: str) -> bool:
        """Whether anything was ever posted (and is still there) in ``channel``."""

    @abstractmethod
    async def reply_stats(self, channel: str, root: str) -> tuple[int, list[str], str | None]:
        """(reply count, who replied (up to 5), latest reply ts) of a thread."""

    @abstractmethod
    async def window(
        self, channel: str, root: str | None, *, oldest: float, latest: float, inclusive: bool
    ) -> list[Message]:
        """Top-level messages (``root`` None) or a thread's replies with a ts in the range;
        never ephemeral ones."""

    # ------------------------------------------------------------------ modals, triggers, response URLs
    @abstractmethod
    async def save_view(self, view_id: str, user: str, view: dict[str, Any]) -> None: ...

    @abstractmethod
    async def get_view(self, view_id: str) -> tuple[str, dict[str, Any]] | None:
        """(the person it is open for, the view)."""

    @abstractmethod
    async def drop_view(self, view_id: str) -> None: ...

    @abstractmethod
    async def save_home(self, user: str, view: dict[str, Any]) -> None:
        """The App Home view last published for ``user`` (views.publish)."""

    @abstractmethod
    async def home(self, user: str) -> dict[str, Any] | None:
        """The App Home view published for ``user``, if any."""

    @abstractmethod
    async def issue_trigger(self, trigger_id: str, user: str) -> None: ...

    @abstractmethod
    async def exchange_trigger(self, trigger_id: str) -> str | None:
        """The person a trigger was issued to, marking it used (atomically): ``None`` once
        expired or never issued, :data:`TRIGGER_USED` when it was already exchanged."""

    @abstractmethod
    async def issue_response_url(self, token: str, context: dict[str, Any]) -> None:
        """``context``: ``user``, ``channel``, ``thread_ts``, ``message_ts`` of the URL."""

    @abstractmethod
    async def use_response_url(self, token: str) -> dict[str, Any] | None:
        """The context of a response URL, counting one use; None once expired or used up."""

    # ------------------------------------------------------------------ files
    @abstractmethod
    async def new_file(self, file_id: str, key: str, filename: str, length: int) -> None:
        """A file announced by files.getUploadURLExternal (``key``: its upload URL's secret)."""

    @abstractmethod
    async def upload_file(self, file_id: str, key: str, data: bytes) -> bool:
        """Keep the bytes POSTed to the file's upload URL; False for an unknown URL or a file
        already shared."""

    @abstractmethod
    async def share_file(
        self, file_id: str, title: str, channel: str | None, thread_ts: str | None
    ) -> SharedFile | None:
        """Mark an uploaded file shared (once; ``channel`` None: shared nowhere, private);
        None when it was never uploaded, is unknown, or was shared already."""

    @abstractmethod
    async def file_content(self, file_id: str) -> tuple[str, bytes] | None:
        """A shared file's name and bytes."""

    # ------------------------------------------------------------------ assistant threads
    @abstractmethod
    async def set_status(self, channel: str, thread_ts: str, status: str) -> None:
        """An assistant thread's status line ("" clears it)."""

    @abstractmethod
    async def status(self, channel: str, thread_ts: str) -> str:
        """The thread's status line now ("" for none)."""
