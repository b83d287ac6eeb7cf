"""The Web API methods of :class:`bot.testing.FakeSlack`, in Slack's wire format.

A mixin: :class:`WebApiMethods` holds one ``_api_<method>`` per Web API method the bot
calls (``chat.postMessage`` is ``_api_chat_postMessage``); ``FakeSlack`` keeps the state
(its messages, user groups, channels it cannot reach) and serves them over HTTP. Each
handler takes the call's arguments (JSON or form fields, already merged) and returns the
JSON body Slack would answer with.

Message metadata follows Slack: ``chat.postMessage`` (and ``chat.update``) take
``metadata={"event_type": ..., "event_payload": {...}}``; ``conversations.history`` and
``conversations.replies`` return it on a message only when called with
``include_all_metadata=true``. Both read methods page with ``limit`` and an opaque
``cursor`` (``response_metadata.next_cursor``), and filter on ``oldest``/``latest``
(exclusive unless ``inclusive``).

Files go up as slack_sdk's ``files_upload_v2`` sends them: ``files.getUploadURLExternal``
(``filename``, ``length``) gives a file id and an upload URL, the bytes are POSTed there, and
``files.completeUploadExternal`` (``files=[{"id", "title"}]``, ``channel_id``, ``thread_ts``,
``initial_comment``) shares them: a message with the file in ``files`` appears in the channel
or thread. A file never uploaded, or completed twice, is ``file_not_found``.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from playground.wire import MAX_BLOCKS_CHARS, MAX_PAGE, UPLOAD_PATH, file_object
from playground.wire import blocks_problem as _blocks_problem
from playground.wire import complete_files as _complete_files
from playground.wire import cursor as _cursor
from playground.wire import cursor_offset as _cursor_offset
from playground.wire import metadata_problem as _metadata_problem
from playground.wire import truthy as _truthy
from playground.wire import upload_url_problem as _upload_url_problem

__all__ = ["MAX_BLOCKS_CHARS", "MAX_PAGE", "FakeFile", "SlackMessage", "WebApiMethods"]
APP_ID = "A0APP"
BOT_ID = "B0BOT"


@dataclass
class SlackMessage:
    """A message as the fake Slack currently shows it."""

    channel: str
    ts: str
    text: str
    blocks: list[dict[str, Any]]
    thread_ts: str | None = None
    updates: int = 0
    metadata: dict[str, Any] | None = None
    user: str = ""
    bot_id: str | None = None
    files: list[dict[str, Any]] = field(default_factory=list)  # shared files (an upload)


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


class WebApiMethods:
    """``_api_*`` handlers; mixed into ``FakeSlack``, which defines this state."""

    team_id: str
    bot_user_id: str
    validate_blocks: bool
    _lock: threading.Lock
    _messages: dict[tuple[str, str], SlackMessage]
    _usergroups: dict[str, list[str]]
    _unreachable_channels: dict[str, str]
    _ts: itertools.count[int]
    _last_ts: float
    _files: dict[str, FakeFile]

    @property
    def url(self) -> str:
        raise NotImplementedError

    def _next_ts(self) -> str:
        """A message timestamp as Slack makes them: unix time, unique and increasing."""
        with self._lock:
            self._last_ts = max(time.time(), self._last_ts + 0.000001)
            return f"{self._last_ts:.6f}"

    def _api_auth_test(self, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "ok": True,
            "url": "https://fake.slack.test/",
            "team": "Fake Team",
            "user": "agent-bot",
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": BOT_ID,
        }

    def _channel_problem(self, args: dict[str, Any]) -> str | None:
        channel = args.get("channel")
        if not channel or not isinstance(channel, str):
            return "channel_not_found"
        with self._lock:
            return self._unreachable_channels.get(channel)

    def _message_problem(self, args: dict[str, Any]) -> str | None:
        problem = self._channel_problem(args)
        if problem:
            return problem
        blocks = args.get("blocks")
        if not args.get("text") and not blocks:
            return "no_text"
        if "metadata" in args and _metadata_problem(args["metadata"]):
            return "invalid_metadata_format"
        if blocks is not None:
            return _blocks_problem(blocks, 50) if self.validate_blocks else None
        return None

    def _api_chat_postMessage(self, args: dict[str, Any]) -> dict[str, Any]:
        problem = self._message_problem(args)
        if problem:
            return {"ok": False, "error": problem}
        channel = str(args["channel"])
        ts = self._next_ts()
        msg = SlackMessage(
            channel=channel,
            ts=ts,
            text=str(args.get("text") or ""),
            blocks=list(args.get("blocks") or []),
            thread_ts=args.get("thread_ts") or None,
            metadata=args.get("metadata") or None,
            user=self.bot_user_id,
            bot_id=BOT_ID,
        )
        with self._lock:
            self._messages[(channel, ts)] = msg
            wire = self._wire(msg, True)
        return {"ok": True, "channel": channel, "ts": ts, "message": wire}

    def _api_chat_update(self, args: dict[str, Any]) -> dict[str, Any]:
        problem = self._message_problem(args)
        if problem:
            return {"ok": False, "error": problem}
        key = (str(args["channel"]), str(args.get("ts") or ""))
        with self._lock:
            msg = self._messages.get(key)
            if msg is None:
                return {"ok": False, "error": "message_not_found"}
            if "text" in args:
                msg.text = str(args.get("text") or "")
            if "blocks" in args:  # omitted keeps the old blocks; [] removes them
                msg.blocks = list(args.get("blocks") or [])
            if "metadata" in args:  # omitted keeps the old metadata
                msg.metadata = args.get("metadata") or None
            msg.updates += 1
        return {"ok": True, "channel": key[0], "ts": key[1], "text": msg.text}

    def _api_chat_postEphemeral(self, args: dict[str, Any]) -> dict[str, Any]:
        problem = self._message_problem(args)
        if problem:
            return {"ok": False, "error": problem}
        if not args.get("user"):
            return {"ok": False, "error": "user_not_in_channel"}
        return {"ok": True, "message_ts": f"{time.time():.6f}"}

    # ------------------------------------------------------------------ reading messages
    def _api_conversations_history(self, args: dict[str, Any]) -> dict[str, Any]:
        """Top-level messages of a channel, newest first (thread replies are not included)."""
        problem = self._channel_problem(args)
        if problem:
            return {"ok": False, "error": problem}
        channel = str(args["channel"])
        with self._lock:
            found = [
                m
                for m in self._messages.values()
                if m.channel == channel and (m.thread_ts is None or m.thread_ts == m.ts)
            ]
        found.sort(key=lambda m: float(m.ts), reverse=True)
        return self._page(args, _in_range(args, found), default_limit=100)

    def _api_conversations_replies(self, args: dict[str, Any]) -> dict[str, Any]:
        """A thread: its parent first, then the replies in order."""
        problem = self._channel_problem(args)
        if problem:
            return {"ok": False, "error": problem}
        channel, ts = str(args["channel"]), str(args.get("ts") or "")
        with self._lock:
            target = self._messages.get((channel, ts))
            if target is None:
                return {"ok": False, "error": "thread_not_found"}
            root = target.thread_ts or target.ts
            parent = self._messages.get((channel, root))
            replies = [
                m
                for m in self._messages.values()
                if m.channel == channel and m.thread_ts == root and m.ts != root
            ]
        replies.sort(key=lambda m: float(m.ts))
        thread = ([parent] if parent is not None else []) + _in_range(args, replies)
        return self._page(args, thread, default_limit=1000)

    def _page(
        self, args: dict[str, Any], found: list[SlackMessage], default_limit: int
    ) -> dict[str, Any]:
        try:
            limit = min(max(int(args.get("limit") or default_limit), 1), MAX_PAGE)
            start = _cursor_offset(str(args.get("cursor") or ""))
        except ValueError:
            return {"ok": False, "error": "invalid_arguments"}
        with_metadata = _truthy(args.get("include_all_metadata"))
        page = found[start : start + limit]
        more = start + limit < len(found)
        with self._lock:
            messages = [self._wire(m, with_metadata) for m in page]
        return {
            "ok": True,
            "messages": messages,
            "has_more": more,
            "response_metadata": {"next_cursor": _cursor(start + limit) if more else ""},
        }

    def _wire(self, msg: SlackMessage, with_metadata: bool) -> dict[str, Any]:
        """A message as the Web API returns it."""
        out: dict[str, Any] = {"type": "message", "text": msg.text, "ts": msg.ts}
        if msg.user:
            out["user"] = msg.user
        if msg.bot_id:
            out["bot_id"] = msg.bot_id
            out["app_id"] = APP_ID
        if msg.blocks:
            out["blocks"] = msg.blocks
        replies = sum(
            1 for m in self._messages.values() if m.channel == msg.channel and m.thread_ts == msg.ts
        )
        if msg.thread_ts:
            out["thread_ts"] = msg.thread_ts
        elif replies:
            out["thread_ts"] = msg.ts
            out["reply_count"] = replies
        if msg.files:
            out["files"] = msg.files
            out["upload"] = True
        if msg.updates:
            out["edited"] = {"user": msg.user, "ts": msg.ts}
        if with_metadata and msg.metadata:
            out["metadata"] = msg.metadata
        return out

    # ------------------------------------------------------------------ files
    def _api_files_getUploadURLExternal(self, args: dict[str, Any]) -> dict[str, Any]:
        problem = _upload_url_problem(args)
        if problem:
            return {"ok": False, "error": problem}
        file_id = f"F{next(self._ts):09d}"
        key = f"{file_id}.{secrets.token_urlsafe(12)}"
        with self._lock:
            self._files[file_id] = FakeFile(
                file_id, str(args["filename"]), int(str(args["length"])), key
            )
        return {"ok": True, "upload_url": self.url + UPLOAD_PATH + key, "file_id": file_id}

    def uploaded(self, key: str, data: bytes) -> bool:
        """The bytes POSTed to an upload URL; False for a URL we never gave (or used)."""
        with self._lock:
            found = self._files.get(key.split(".", 1)[0])
            if found is None or found.key != key or found.completed:
                return False
            found.data = data
            return True

    def _api_files_completeUploadExternal(self, args: dict[str, Any]) -> dict[str, Any]:
        wanted = _complete_files(args)
        if wanted is None:
            return {"ok": False, "error": "invalid_arguments"}
        channel = args.get("channel_id") or args.get("channels") or None
        if channel is not None:
            problem = self._channel_problem({"channel": channel})
            if problem:
                return {"ok": False, "error": problem}
        with self._lock:
            found = [self._files.get(w["id"]) for w in wanted]
            if any(f is None or f.data is None or f.completed for f in found):
                return {"ok": False, "error": "file_not_found"}
        shared: list[FakeFile] = [f for f in found if f is not None]
        for f, w in zip(shared, wanted, strict=True):
            f.title, f.completed = w["title"] or f.filename, True
        out = {"ok": True, "files": [{"id": f.id, "title": f.title} for f in shared]}
        if channel is None:
            return out  # private: not shared anywhere
        ts = self._next_ts()
        thread_ts = args.get("thread_ts") or None
        msg = SlackMessage(
            channel=str(channel),
            ts=ts,
            text=str(args.get("initial_comment") or ""),
            blocks=[],
            thread_ts=thread_ts,
            user=self.bot_user_id,
            bot_id=BOT_ID,
            files=[
                file_object(
                    f.id,
                    f.filename,
                    f.title,
                    len(f.data or b""),
                    f"{self.url}/files/{f.id}/{f.filename}",
                    time.time(),
                    self.bot_user_id,
                )
                for f in shared
            ],
        )
        with self._lock:
            self._messages[(str(channel), ts)] = msg
            for f in shared:
                f.channel, f.thread_ts, f.ts = str(channel), thread_ts, ts
        return out

    # ------------------------------------------------------------------ modals, groups
    def _api_views_open(self, args: dict[str, Any]) -> dict[str, Any]:
        if not args.get("trigger_id") or str(args["trigger_id"]).startswith("expired"):
            return {"ok": False, "error": "expired_trigger_id"}
        view = args.get("view")
        if not isinstance(view, dict):
            return {"ok": False, "error": "invalid_arguments"}
        title = (view.get("title") or {}).get("text", "")
        if not title or len(title) > 24:
            return {"ok": False, "error": "invalid_arguments"}
        if (
            len(view.get("private_metadata") or "") > 3000
            or len(view.get("callback_id") or "") > 255
        ):
            return {"ok": False, "error": "invalid_arguments"}
        problem = _blocks_problem(view.get("blocks") or [], 100, chars_limit=None)
        if problem:
            return {"ok": False, "error": problem}
        return {"ok": True, "view": {"id": f"V{next(self._ts):08d}", **view}}

    def _api_usergroups_users_list(self, args: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            users = self._usergroups.get(str(args.get("usergroup") or ""))
        if users is None:
            return {"ok": False, "error": "no_such_subteam"}
        return {"ok": True, "users": users}


def _in_range(args: dict[str, Any], found: list[SlackMessage]) -> list[SlackMessage]:
    """``oldest`` < ts < ``latest`` (``<=`` with ``inclusive``), as Slack filters."""
    inclusive = _truthy(args.get("inclusive"))
    try:
        oldest = float(args.get("oldest") or 0)
        latest = float(args.get("latest") or "inf")
    except ValueError:
        return found

    def keep(m: SlackMessage) -> bool:
        ts = float(m.ts)
        if inclusive:
            return oldest <= ts <= latest
        return oldest < ts < latest

    return [m for m in found if keep(m)]
