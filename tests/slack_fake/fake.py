"""The tests' fake Slack: the playground's Web API, in memory, with faults and a record.

:class:`FakeSlack` is a real HTTP server (aiohttp, in a daemon thread with its own event
loop, on a free port of 127.0.0.1: :class:`agent_core.testing.server.ThreadedServer`). Point
``SLACK_API_URL`` at :attr:`FakeSlack.base_url`; it serves in-process code and ``python -m
bot`` subprocesses alike. Every Web API method is answered by the one implementation the
playground serves (:class:`playground.slack_api.WebApi`: Block Kit checked with
``slack_sdk.models.blocks`` and refused with ``invalid_blocks`` like Slack, files uploaded as
``files_upload_v2`` does, modals, assistant threads, response URLs…), on a
:class:`~tests.slack_fake.memory.MemoryStore` and an open workspace (every channel exists;
:meth:`FakeSlack.set_user`, :meth:`FakeSlack.set_usergroup` and
:meth:`FakeSlack.block_channel` shape it).

What only tests need is added here: every call is recorded with its arguments (blocks and
views parsed), the messages can be looked at as a user sees them, and faults can be injected:
HTTP 429 (with ``Retry-After``) or ``ok: false`` for the next calls of a method
(:meth:`~FakeSlack.fail_next`), Slack's posting limit (:meth:`~FakeSlack.limit_posts`),
answers kept back after the call was carried out (:meth:`~FakeSlack.hold`) or never sent
(:meth:`~FakeSlack.drop_next`). It also plays the person's side of an assistant thread (the
events Slack sends) and Socket Mode.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Self

import aiohttp
from aiohttp import web

from agent_core.testing.server import ThreadedServer
from playground.slack_api import WebApi
from playground.state import Message
from playground.wire import UPLOAD_PATH, PostRateLimit, bearer, read_args, read_upload
from playground.workspace import Person, UserGroup, Workspace

from .memory import FakeFile, MemoryStore

BOT_ID = "B0BOT"
APP_ID = "A0APP"
MAX_UPLOAD_BYTES = 1 << 30


@dataclass(frozen=True)
class SlackCall:
    """One request the fake received: a Web API ``method`` or ``response_url:<name>``."""

    method: str
    args: dict[str, Any]
    token: str | None
    status: int
    response: dict[str, Any]
    at: float = field(default_factory=time.time)  # when the fake answered it

    @property
    def ok(self) -> bool:
        return self.status == 200 and bool(self.response.get("ok"))


@dataclass
class _Fault:
    status: int
    error: str
    retry_after: float | None
    when: Callable[[dict[str, Any]], bool] | None = None


@dataclass
class _Hold:
    method: str
    left: int
    when: Callable[[dict[str, Any]], bool] | None
    released: threading.Event = field(default_factory=threading.Event)


class FakeSlack(ThreadedServer):
    """A fake Slack Web API (see the module docstring)."""

    def __init__(
        self,
        *,
        token: str = "xoxb-test-token",
        app_token: str = "xapp-test-token",
        team_id: str = "T0TEST",
        bot_user_id: str = "U0BOT",
        host: str = "127.0.0.1",
        validate_blocks: bool = True,
    ) -> None:
        super().__init__(name="FakeSlack", host=host)
        self.token = token
        self.app_token = app_token
        self.team_id = team_id
        self.bot_user_id = bot_user_id
        self.workspace = Workspace(
            team_id=team_id,
            team_name="Fake Team",
            bot_user_id=bot_user_id,
            bot_id=BOT_ID,
            bot_name="agent-bot",
            app_id=APP_ID,
            url="https://fake.slack.test/",
            open_membership=True,
        )
        self.store = MemoryStore(lenient=True)
        self.api = WebApi(self.store, self.workspace, token, validate_blocks=validate_blocks)
        self._lock = threading.Lock()
        self._calls: list[SlackCall] = []
        self._faults: dict[str, list[_Fault]] = {}
        self._holds: list[_Hold] = []
        self._drops: dict[str, int] = {}
        self._held = 0
        self._sockets: list[web.WebSocketResponse] = []
        self._n = itertools.count(1)

    # ------------------------------------------------------------------ routes
    def make_app(self) -> web.Application:
        """The Web API, ``response_url``, upload, file and Socket Mode routes."""
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._handle_api)
        app.router.add_post("/respond/{name}", self._handle_respond)
        app.router.add_post(UPLOAD_PATH + "{key}", self._handle_upload)
        app.router.add_get("/files/{file_id}/{name}", self._handle_file)
        app.router.add_get("/socket", self._handle_socket)
        return app

    def start(self) -> Self:
        super().start()
        self.api.base_url = self.url  # upload and file URLs point here
        return self

    async def _on_stop(self) -> None:
        self.release()
        await self._close_sockets()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: the server's root (only while started)."""
        return f"http://{self._host}:{self.port}"

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/api/``: the value for SLACK_API_URL."""
        return self.url + "/api/"

    def response_url(self, name: str = "r") -> str:
        """A ``response_url`` for a payload; posts to it are recorded as ``response_url:<name>``."""
        return f"{self.url}/respond/{name}"

    # ------------------------------------------------------------------ set-up
    def reset(self) -> None:
        self.release()
        self.store.clear()
        self.api.post_limit = None
        with self._lock:
            self._calls.clear()
            self._faults.clear()
            self.workspace.people.clear()
            self.workspace.usergroups.clear()
            self.workspace.unreachable.clear()
            self.workspace.bot_not_in.clear()
            self.workspace.private.clear()
            self.workspace.archived.clear()

    def fail_next(
        self,
        method: str,
        n: int = 1,
        *,
        status: int = 429,
        retry_after: float | None = 1,
        error: str = "ratelimited",
        when: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        """Answer the next ``n`` calls of ``method`` (those whose arguments satisfy ``when``)
        with HTTP ``status`` (429: rate limited)."""
        fault = _Fault(status, error, retry_after, when)
        with self._lock:
            self._faults.setdefault(method, []).extend([fault] * n)

    def limit_posts(self, per_second: float = 1.0, burst: int = 1) -> None:
        """Enforce Slack's posting limit from now on (until :meth:`reset`): ``chat.postMessage``
        about once a second per channel, short bursts allowed; a post over it is answered
        HTTP 429 ``ratelimited`` with ``Retry-After``, and not carried out."""
        self.api.post_limit = PostRateLimit(per_second, burst)

    def error_next(self, method: str, error: str, n: int = 1) -> None:
        """Answer the next ``n`` calls of ``method`` with ``{"ok": false, "error": error}``."""
        self.fail_next(method, n, status=200, retry_after=None, error=error)

    def hold(
        self, method: str, n: int = 1, when: Callable[[dict[str, Any]], bool] | None = None
    ) -> None:
        """Carry out the next ``n`` calls of ``method`` (those whose arguments satisfy ``when``)
        but keep their answers back until :meth:`release`: the message is posted, the caller
        waits. Held calls are recorded as they are carried out."""
        with self._lock:
            self._holds.append(_Hold(method, n, when))

    def drop_next(self, method: str, n: int = 1) -> None:
        """Carry out the next ``n`` calls of ``method``, then cut the connection instead of
        answering: the caller sees a connection error although Slack did the work."""
        with self._lock:
            self._drops[method] = self._drops.get(method, 0) + n

    def release(self) -> None:
        """Send every held answer, and hold no more calls."""
        with self._lock:
            holds, self._holds = self._holds, []
        for h in holds:
            h.released.set()

    @property
    def held(self) -> int:
        """How many answers are being kept back right now."""
        with self._lock:
            return self._held

    def _take_hold(self, method: str, args: dict[str, Any]) -> threading.Event | None:
        with self._lock:
            for h in self._holds:
                if h.method == method and h.left > 0 and (h.when is None or h.when(args)):
                    h.left -= 1
                    self._held += 1
                    return h.released
        return None

    def set_usergroup(self, group_id: str, users: list[str], handle: str | None = None) -> None:
        """A user group and its members; ``handle`` (default: the id in lower case) is the
        name people mention it by."""
        name = handle or group_id.lower()
        self.workspace.usergroups[group_id] = UserGroup(group_id, name, name, tuple(users))

    def set_user(self, user_id: str, name: str) -> None:
        """A person ``users.info`` knows, shown as ``name``."""
        self.workspace.people[user_id] = Person(user_id, name)

    def block_channel(self, channel: str, error: str = "not_in_channel") -> None:
        """Make posting to ``channel`` fail like a channel the bot is not in."""
        self.workspace.unreachable[channel] = error

    def remove_bot(self, channel: str, *, private: bool = False) -> None:
        """The app's bot is not a member of ``channel`` (until :meth:`reset` or
        :meth:`invite_bot`): posting or reading there answers ``not_in_channel``, or for a
        ``private`` channel ``channel_not_found``, as Slack does."""
        self.workspace.bot_not_in.add(channel)
        if private:
            self.workspace.private.add(channel)

    def invite_bot(self, channel: str) -> None:
        """The app's bot joins ``channel`` (``/invite @app``). Slack then sends the app a
        ``member_joined_channel`` event: send it with
        :meth:`tests.slack_fake.client.SlackClient.member_joined` (``user``: :attr:`bot_user_id`)."""
        self.workspace.bot_not_in.discard(channel)

    def archive_channel(self, channel: str) -> None:
        """``channel`` is archived: posts and updates there answer ``is_archived``."""
        self.workspace.archived.add(channel)

    # ------------------------------------------------------------------ records
    @property
    def calls(self) -> list[SlackCall]:
        with self._lock:
            return list(self._calls)

    def calls_to(self, method: str) -> list[SlackCall]:
        return [c for c in self.calls if c.method == method]

    def responses(self, name: str | None = None) -> list[SlackCall]:
        """Posts to response URLs (all, or the one called ``name``)."""
        prefix = "response_url:" + (name or "")
        return [c for c in self.calls if c.method.startswith(prefix)]

    @property
    def messages(self) -> list[Message]:
        """The messages in every channel, as everyone sees them (not the ephemeral ones)."""
        return self.store.messages()

    @property
    def files(self) -> list[FakeFile]:
        """Every file the bot uploaded (shared or not), in upload order."""
        return self.store.files()

    def message(self, channel: str, ts: str) -> Message | None:
        return self.store.message(channel, ts)

    def shows(self, channel: str, ts: str, needle: str) -> bool:
        """Whether the message's current blocks (or text) contain ``needle``."""
        msg = self.message(channel, ts)
        if msg is None:
            return False
        return needle in json.dumps(msg.blocks, ensure_ascii=False) or needle in msg.text

    def thread(self, channel: str, thread_ts: str) -> list[Message]:
        """The replies in a thread, oldest first."""
        return [m for m in self.messages if m.channel == channel and m.thread_ts == thread_ts]

    async def wait_for(
        self, predicate: Callable[[FakeSlack], Any], timeout: float = 10.0, what: str = ""
    ) -> Any:
        """Poll until ``predicate(self)`` is truthy; returns its value."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            value = predicate(self)
            if value:
                return value
            if loop.time() > end:
                methods = [c.method for c in self.calls]
                raise AssertionError(f"timed out waiting for {what or predicate}; calls: {methods}")
            await asyncio.sleep(0.02)

    # ------------------------------------------------------------------ the person's side
    def open_assistant_thread(
        self, user_id: str, *, channel_id: str = "D0ASSIST", context_channel: str | None = None
    ) -> dict[str, Any]:
        """The person opens the app's assistant container: Slack starts a thread in their DM
        with the app (its root message, subtype ``assistant_app_thread``, is theirs) and sends
        ``assistant_thread_started``, returned here. ``context_channel``: the channel they
        are looking at."""
        ts = self.store.new_ts()
        self.store.put(Message(channel_id, ts, "New Assistant Thread", user=user_id))
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
            "event_ts": self.store.new_ts(),
        }

    def assistant_message(
        self, started: dict[str, Any], text: str, user_id: str | None = None
    ) -> dict[str, Any]:
        """The person writes ``text`` in the assistant thread: the ``message.im`` event Slack
        sends (the message is stored in the thread as well)."""
        t = started["assistant_thread"]
        user, channel, thread = user_id or t["user_id"], t["channel_id"], t["thread_ts"]
        ts = self.store.new_ts()
        self.store.put(Message(channel, ts, text, thread_ts=thread, user=user))
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
            "client_msg_id": f"msg-{next(self._n)}",
        }

    def status(self, channel: str, thread_ts: str) -> str:
        """The thread's status line as Slack shows it now ("" for none)."""
        return self.store.status_now(channel, thread_ts)

    def statuses(self, channel: str, thread_ts: str) -> list[str]:
        """Every status the app set on the thread, in order ("" clears it)."""
        return [
            str(c.args["status"])
            for c in self.calls_to("assistant.threads.setStatus")
            if c.ok and (c.args.get("channel_id"), c.args.get("thread_ts")) == (channel, thread_ts)
        ]

    # ------------------------------------------------------------------ handlers
    async def _handle_upload(self, request: web.Request) -> web.Response:
        """An upload URL from files.getUploadURLExternal: Slack answers 200 with a short text."""
        data = await read_upload(request, MAX_UPLOAD_BYTES)
        key = request.match_info["key"]
        ok = data is not None and await self.api.upload(key, data)
        self._record(SlackCall(f"upload:{key.split('.', 1)[0]}", {}, None, 200 if ok else 404, {}))
        if not ok:
            return web.Response(status=404, text="upload_url_not_found")
        return web.Response(text=f"OK - {len(data or b'')}")

    async def _handle_file(self, request: web.Request) -> web.Response:
        """A shared file's ``url_private``: its bytes (Slack asks for the bot token)."""
        found = await self.store.file_content(request.match_info["file_id"])
        if request.headers.get("Authorization", "") != f"Bearer {self.token}" or found is None:
            return web.Response(status=404)
        return web.Response(body=found[1], content_type="text/plain")

    async def _handle_respond(self, request: web.Request) -> web.Response:
        try:
            posted = await request.json()
        except (ValueError, json.JSONDecodeError):
            posted = None
        args = posted if isinstance(posted, dict) else {"_raw": await request.text()}
        name = request.match_info["name"]
        status, body = await self.api.respond(name, dict(args))
        self._record(SlackCall(f"response_url:{name}", args, None, status, body))
        return web.json_response(body, status=status)

    async def _handle_api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        args = await read_args(request)
        token = bearer(request, args)
        with self._lock:
            queue = self._faults.get(method) or []
            fault = next((f for f in queue if f.when is None or f.when(args)), None)
            if fault is not None:
                queue.remove(fault)
        if fault is not None and fault.status != 200:
            return self._refuse(method, args, token, fault.status, fault.error, fault.retry_after)
        if fault is not None:
            body: dict[str, Any] = {"ok": False, "error": fault.error}
        elif method == "apps.connections.open":
            ok = token == self.app_token
            body = (
                {"ok": True, "url": self.url.replace("http", "ws", 1) + "/socket"}
                if ok
                else {"ok": False, "error": "invalid_auth"}
            )
        else:
            body = await self.api.call(method, args, token)
            wait = body.pop("_retry_after", None)
            if wait is not None:  # over the posting limit: not carried out
                return self._refuse(method, args, token, 429, str(body["error"]), wait)
        self._record(SlackCall(method, args, token, 200, body))
        with self._lock:
            drop = self._drops.get(method, 0) > 0
            if drop:
                self._drops[method] -= 1
        if drop and request.transport is not None:
            request.transport.close()  # done, but the answer never arrives
            return web.json_response(body)
        released = self._take_hold(method, args)
        if released is not None:
            try:
                await asyncio.to_thread(released.wait)
            finally:
                with self._lock:
                    self._held -= 1
        return web.json_response(body)

    def _refuse(
        self,
        method: str,
        args: dict[str, Any],
        token: str | None,
        status: int,
        error: str,
        retry_after: float | None,
    ) -> web.Response:
        headers = {} if retry_after is None else {"Retry-After": str(int(retry_after))}
        body = {"ok": False, "error": error}
        self._record(SlackCall(method, args, token, status, body))
        return web.json_response(body, status=status, headers=headers)

    # ------------------------------------------------------------------ Socket Mode
    @property
    def socket_connections(self) -> int:
        with self._lock:
            return len(self._sockets)

    async def socket_request(
        self, type_: str, payload: dict[str, Any], timeout: float = 10.0
    ) -> dict[str, Any]:
        """Send a Socket Mode envelope to the connected app; returns its acknowledgement."""
        assert self._loop is not None, "not started"
        envelope_id = f"env-{next(self._n)}-{time.time_ns()}"
        envelope = {
            "envelope_id": envelope_id,
            "type": type_,
            "payload": payload,
            "accepts_response_payload": type_ != "events_api",
        }
        with self._lock:
            ws = self._sockets[-1]
        future = self._run_coroutine(ws.send_json(envelope))
        await asyncio.wrap_future(future)

        def acked(f: FakeSlack) -> list[SlackCall]:
            return [c for c in f.calls_to("socket_ack") if c.args.get("envelope_id") == envelope_id]

        (ack,) = await self.wait_for(acked, timeout=timeout, what=f"ack of {envelope_id}")
        args: dict[str, Any] = ack.args
        return args

    async def _handle_socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        with self._lock:
            self._sockets.append(ws)
        await ws.send_json(
            {"type": "hello", "num_connections": 1, "connection_info": {"app_id": APP_ID}}
        )
        try:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    try:
                        data = json.loads(msg.data)
                    except json.JSONDecodeError:
                        continue
                    if isinstance(data, dict) and "envelope_id" in data:
                        self._record(SlackCall("socket_ack", data, None, 200, {}))
        finally:
            with self._lock:
                if ws in self._sockets:
                    self._sockets.remove(ws)
        return ws

    async def _close_sockets(self) -> None:
        with self._lock:
            sockets = list(self._sockets)
        for ws in sockets:
            await ws.close()

    def _record(self, call: SlackCall) -> None:
        with self._lock:
            self._calls.append(call)
