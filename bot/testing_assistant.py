"""The person's side of Slack's assistant threads, for :class:`bot.testing.FakeSlack`.

A mixin, like :mod:`bot.testing_api`: the ``assistant.threads.*`` Web API methods
(``setStatus``, ``setSuggestedPrompts``, ``setTitle``) and the name look-ups the status line
uses (``users.info``, ``usergroups.list``), in Slack's wire format; and what a person does in
the app's assistant container (:meth:`~AssistantSide.open_assistant_thread`,
:meth:`~AssistantSide.assistant_message`), as the events Slack sends. The thread's root
message is stored as Slack creates it (the person's, subtype ``assistant_app_thread``), and
its status line is kept as Slack shows it: set, cleared by an empty status, and cleared when
the app posts in the thread.
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any

from playground.wire import assistant_problem

from .testing_api import SlackMessage

if TYPE_CHECKING:
    from .testing import SlackCall


class AssistantSide:
    """Mixed into ``FakeSlack`` (before ``WebApiMethods``), which defines this state."""

    team_id: str
    _lock: threading.Lock
    _messages: dict[tuple[str, str], SlackMessage]
    _ts: itertools.count[int]
    _users: dict[str, str]
    _handles: dict[str, str]
    _statuses: dict[tuple[str, str], str]

    if TYPE_CHECKING:  # FakeSlack's (declared only: a definition here would shadow them)

        def _next_ts(self) -> str: ...

        def calls_to(self, method: str) -> list[SlackCall]: ...

    # ------------------------------------------------------------------ assistant threads
    def open_assistant_thread(
        self, user_id: str, *, channel_id: str = "D0ASSIST", context_channel: str | None = None
    ) -> dict[str, Any]:
        """The person opens the app's assistant container: Slack starts a thread in their DM
        with the app (its root message, subtype ``assistant_app_thread``, is theirs) and sends
        ``assistant_thread_started``, returned here. ``context_channel``: the channel they
        are looking at."""
        ts = self._next_ts()
        root = SlackMessage(channel_id, ts, "New Assistant Thread", [], user=user_id)
        with self._lock:
            self._messages[(channel_id, ts)] = root
        return self._thread_event(
            "assistant_thread_started", user_id, channel_id, ts, context_channel
        )

    def assistant_context(self, started: dict[str, Any], context_channel: str) -> dict[str, Any]:
        """``assistant_thread_context_changed`` for that thread: its person moved to
        ``context_channel`` with the container open."""
        t = started["assistant_thread"]
        return self._thread_event(
            "assistant_thread_context_changed",
            t["user_id"],
            t["channel_id"],
            t["thread_ts"],
            context_channel,
        )

    def _thread_event(
        self, type_: str, user_id: str, channel_id: str, thread_ts: str, context: str | None
    ) -> dict[str, Any]:
        ctx = {"channel_id": context, "team_id": self.team_id} if context else {}
        return {
            "type": type_,
            "assistant_thread": {
                "user_id": user_id,
                "context": ctx,
                "channel_id": channel_id,
                "thread_ts": thread_ts,
            },
            "event_ts": self._next_ts(),
        }

    def assistant_message(
        self, started: dict[str, Any], text: str, user_id: str | None = None
    ) -> dict[str, Any]:
        """The person writes ``text`` in the assistant thread: the ``message.im`` event Slack
        sends (the message is stored in the thread as well)."""
        t = started["assistant_thread"]
        user, channel, thread = user_id or t["user_id"], t["channel_id"], t["thread_ts"]
        ts = self._next_ts()
        with self._lock:
            self._messages[(channel, ts)] = SlackMessage(channel, ts, text, [], thread, user=user)
        return {
            "type": "message",
            "user": user,
            "text": text,
            "ts": ts,
            "thread_ts": thread,
            "channel": channel,
            "channel_type": "im",
            "event_ts": ts,
            "team": self.team_id,
            "client_msg_id": f"msg-{next(self._ts)}",
        }

    def status(self, channel: str, thread_ts: str) -> str:
        """The thread's status line as Slack shows it now ("" for none)."""
        with self._lock:
            return self._statuses.get((channel, thread_ts), "")

    def statuses(self, channel: str, thread_ts: str) -> list[str]:
        """Every status the app set on the thread, in order ("" clears it)."""
        return [
            str(c.args["status"])
            for c in self.calls_to("assistant.threads.setStatus")
            if c.ok and (c.args.get("channel_id"), c.args.get("thread_ts")) == (channel, thread_ts)
        ]

    def _assistant_refusal(self, method: str, args: dict[str, Any]) -> dict[str, Any] | None:
        problem = assistant_problem(method, args)
        if problem is None:
            channel, thread = str(args["channel_id"]), args.get("thread_ts")
            with self._lock:
                if not any(m.channel == channel for m in self._messages.values()):
                    problem = "channel_not_found"
                elif thread is not None and (channel, str(thread)) not in self._messages:
                    problem = "invalid_thread_ts"
        return None if problem is None else {"ok": False, "error": problem}

    def _api_assistant_threads_setStatus(self, args: dict[str, Any]) -> dict[str, Any]:
        refused = self._assistant_refusal("assistant.threads.setStatus", args)
        if refused:
            return refused
        key, status = (str(args["channel_id"]), str(args["thread_ts"])), str(args["status"])
        with self._lock:
            if status:
                self._statuses[key] = status
            else:
                self._statuses.pop(key, None)
        return {"ok": True}

    def _api_assistant_threads_setSuggestedPrompts(self, args: dict[str, Any]) -> dict[str, Any]:
        return self._assistant_refusal("assistant.threads.setSuggestedPrompts", args) or {
            "ok": True
        }

    def _api_assistant_threads_setTitle(self, args: dict[str, Any]) -> dict[str, Any]:
        return self._assistant_refusal("assistant.threads.setTitle", args) or {"ok": True}

    def _clear_status(self, channel: str, thread_ts: str) -> None:
        """As Slack does when the app posts a reply in the thread."""
        with self._lock:
            self._statuses.pop((channel, thread_ts), None)

    def _api_users_info(self, args: dict[str, Any]) -> dict[str, Any]:
        user = str(args.get("user") or "")
        with self._lock:
            name = self._users.get(user)
        if name is None:
            return {"ok": False, "error": "user_not_found"}
        profile = {"real_name": name, "display_name": name}
        return {
            "ok": True,
            "user": {
                "id": user,
                "team_id": self.team_id,
                "name": name.lower(),
                "real_name": name,
                "is_bot": False,
                "profile": profile,
            },
        }

    def _api_usergroups_list(self, args: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            groups = [
                {"id": gid, "team_id": self.team_id, "handle": h, "name": h, "is_usergroup": True}
                for gid, h in self._handles.items()
            ]
        return {"ok": True, "usergroups": groups}
