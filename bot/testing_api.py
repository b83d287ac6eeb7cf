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
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass
from typing import Any

from playground.wire import MAX_BLOCKS_CHARS, MAX_PAGE
from playground.wire import blocks_problem as _blocks_problem
from playground.wire import cursor as _cursor
from playground.wire import cursor_offset as _cursor_offset
from playground.wire import metadata_problem as _metadata_problem
from playground.wire import truthy as _truthy

__all__ = ["MAX_BLOCKS_CHARS", "MAX_PAGE", "SlackMessage", "WebApiMethods"]
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
        if msg.updates:
            out["edited"] = {"user": msg.user, "ts": msg.ts}
        if with_metadata and msg.metadata:
            out["metadata"] = msg.metadata
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
