"""Test doubles for Slack: a fake Web API server and a client that signs like Slack.

:class:`FakeSlack` is a real HTTP server (aiohttp, in a daemon thread with its own event
loop, on a free port of 127.0.0.1). Point ``SLACK_API_URL`` at :attr:`FakeSlack.base_url`;
it serves in-process code and ``python -m bot`` subprocesses alike. It records every call
with its arguments (blocks and views parsed), keeps the messages it was asked to post and
update (so a test can look at a card as a user would see it), checks Block Kit with
``slack_sdk.models.blocks`` and answers ``invalid_blocks`` like Slack, keeps uploaded files
(``files_upload_v2``), enforces Slack's posting limit when asked (:meth:`FakeSlack.limit_posts`:
about one ``chat.postMessage`` a second per channel, else HTTP 429 with ``Retry-After``), and
can inject HTTP 429 (with ``Retry-After``) or ``ok: false`` errors for the next calls of a method, or
:meth:`FakeSlack.hold` the answers of calls it has carried out (a caller killed while it
waits has had its message posted, and never learns where). The Web API methods it serves
are in :mod:`bot.testing_api`; those of assistant threads, and the person's side of such a
thread (the events Slack sends), in :mod:`bot.testing_assistant`.

:class:`SlackClient` sends slash commands, ``block_actions`` and ``view_submission``
payloads to the bot's ``/slack/events`` exactly as Slack does: form-encoded and signed
(``v0=`` HMAC-SHA256 of ``v0:{timestamp}:{body}``), and Events API callbacks as JSON.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web

from agent_core.testing.server import ThreadedServer
from playground.wire import UPLOAD_PATH, PostRateLimit, read_args, read_upload, sign

from .testing_api import MAX_BLOCKS_CHARS, FakeFile, SlackMessage, WebApiMethods
from .testing_api import _blocks_problem as _blocks_problem  # tests/bot/test_cards.py
from .testing_assistant import AssistantSide

__all__ = [
    "MAX_BLOCKS_CHARS",
    "FakeFile",
    "FakeSlack",
    "HttpResult",
    "SlackCall",
    "SlackClient",
    "SlackMessage",
    "sign",
]


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


class FakeSlack(AssistantSide, WebApiMethods, ThreadedServer):
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
        self.validate_blocks = validate_blocks
        self._lock = threading.Lock()
        self._calls: list[SlackCall] = []
        self._messages: dict[tuple[str, str], SlackMessage] = {}
        self._faults: dict[str, list[_Fault]] = {}
        self._usergroups: dict[str, list[str]] = {}
        self._unreachable_channels: dict[str, str] = {}
        self._ts = itertools.count(1)
        self._last_ts = 0.0
        self._holds: list[_Hold] = []
        self._drops: dict[str, int] = {}
        self._held = 0
        self._sockets: list[web.WebSocketResponse] = []
        self._users: dict[str, str] = {}
        self._handles: dict[str, str] = {}
        self._statuses: dict[tuple[str, str], str] = {}
        self._files: dict[str, FakeFile] = {}
        self._post_limit: PostRateLimit | None = None

    # ------------------------------------------------------------------ routes
    def make_app(self) -> web.Application:
        """The Web API, ``response_url`` and Socket Mode routes."""
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._handle_api)
        app.router.add_post("/respond/{name}", self._handle_respond)
        app.router.add_post(UPLOAD_PATH + "{key}", self._handle_upload)
        app.router.add_get("/files/{file_id}/{name}", self._handle_file)
        app.router.add_get("/socket", self._handle_socket)
        return app

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
        with self._lock:
            self._calls.clear()
            self._messages.clear()
            self._faults.clear()
            self._usergroups.clear()
            self._unreachable_channels.clear()
            self._users.clear()
            self._handles.clear()
            self._statuses.clear()
            self._files.clear()
            self._post_limit = None

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
        with self._lock:
            self._post_limit = PostRateLimit(per_second, burst)

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
        with self._lock:
            self._usergroups[group_id] = list(users)
            self._handles[group_id] = handle or group_id.lower()

    def set_user(self, user_id: str, name: str) -> None:
        """A person ``users.info`` knows, shown as ``name``."""
        with self._lock:
            self._users[user_id] = name

    def block_channel(self, channel: str, error: str = "not_in_channel") -> None:
        """Make posting to ``channel`` fail like a channel the bot is not in."""
        with self._lock:
            self._unreachable_channels[channel] = error

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
    def messages(self) -> list[SlackMessage]:
        with self._lock:
            return list(self._messages.values())

    @property
    def files(self) -> list[FakeFile]:
        """Every file the bot uploaded (shared or not), in upload order."""
        with self._lock:
            return list(self._files.values())

    def message(self, channel: str, ts: str) -> SlackMessage | None:
        with self._lock:
            return self._messages.get((channel, ts))

    def shows(self, channel: str, ts: str, needle: str) -> bool:
        """Whether the message's current blocks (or text) contain ``needle``."""
        msg = self.message(channel, ts)
        if msg is None:
            return False
        return needle in json.dumps(msg.blocks, ensure_ascii=False) or needle in msg.text

    def thread(self, channel: str, thread_ts: str) -> list[SlackMessage]:
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

    def _api_chat_postMessage(self, args: dict[str, Any]) -> dict[str, Any]:
        """As Slack: the app's reply in a thread also clears that thread's status line."""
        body = super()._api_chat_postMessage(args)
        if body.get("ok") and args.get("thread_ts"):
            self._clear_status(str(args["channel"]), str(args["thread_ts"]))
        return body

    # ------------------------------------------------------------------ handlers
    async def _handle_upload(self, request: web.Request) -> web.Response:
        """An upload URL from files.getUploadURLExternal: Slack answers 200 with a short text."""
        data = await read_upload(request, 1 << 30)
        key = request.match_info["key"]
        ok = data is not None and self.uploaded(key, data)
        self._record(SlackCall(f"upload:{key.split('.', 1)[0]}", {}, None, 200 if ok else 404, {}))
        if not ok:
            return web.Response(status=404, text="upload_url_not_found")
        return web.Response(text=f"OK - {len(data or b'')}")

    async def _handle_file(self, request: web.Request) -> web.Response:
        """A shared file's ``url_private``: its bytes (Slack asks for the bot token)."""
        auth = request.headers.get("Authorization", "")
        with self._lock:
            found = self._files.get(request.match_info["file_id"])
        if auth != f"Bearer {self.token}" or found is None or not found.completed:
            return web.Response(status=404)
        return web.Response(body=found.data or b"", content_type="text/plain")

    async def _handle_respond(self, request: web.Request) -> web.Response:
        try:
            args = await request.json()
        except (ValueError, json.JSONDecodeError):
            args = {"_raw": await request.text()}
        body = {"ok": True}
        self._record(SlackCall(f"response_url:{request.match_info['name']}", args, None, 200, body))
        return web.json_response(body)

    async def _handle_api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        args = await read_args(request)
        auth = request.headers.get("Authorization", "")
        token = auth[7:] if auth.lower().startswith("bearer ") else args.get("token")
        with self._lock:
            queue = self._faults.get(method) or []
            fault = next((f for f in queue if f.when is None or f.when(args)), None)
            if fault is not None:
                queue.remove(fault)
            limit = self._post_limit if method == "chat.postMessage" else None
        if fault is None and limit is not None and token == self.token:
            wait = limit.take(str(args.get("channel") or ""))
            if wait is not None:
                fault = _Fault(429, "ratelimited", wait)
        if fault is not None and fault.status != 200:
            headers = {}
            if fault.retry_after is not None:
                headers["Retry-After"] = str(int(fault.retry_after))
            body = {"ok": False, "error": fault.error}
            self._record(SlackCall(method, args, token, fault.status, body))
            return web.json_response(body, status=fault.status, headers=headers)
        if fault is not None:
            body = {"ok": False, "error": fault.error}
        elif method == "apps.connections.open":
            ok = token == self.app_token
            body = (
                {"ok": True, "url": self.url.replace("http", "ws", 1) + "/socket"}
                if ok
                else {"ok": False, "error": "invalid_auth"}
            )
        elif token != self.token:
            body = {"ok": False, "error": "not_authed" if not token else "invalid_auth"}
        else:
            handler = getattr(self, "_api_" + method.replace(".", "_"), None)
            body = handler(args) if handler else {"ok": False, "error": "unknown_method"}
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
        envelope_id = f"env-{next(self._ts)}-{time.time_ns()}"
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
            {"type": "hello", "num_connections": 1, "connection_info": {"app_id": "A0APP"}}
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


# ---------------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class HttpResult:
    status: int
    text: str
    headers: Mapping[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.text) if self.text else None


class SlackClient:
    """Sends requests to the bot the way Slack does (form-encoded and signed)."""

    def __init__(
        self,
        url: str,
        signing_secret: str,
        *,
        team_id: str = "T0TEST",
        command: str = "/agent",
        fake: FakeSlack | None = None,
    ) -> None:
        self.url = url
        self.signing_secret = signing_secret
        self.team_id = team_id
        self.command_name = command
        self.fake = fake
        self._n = itertools.count(1)

    async def post(
        self,
        body: str,
        *,
        content_type: str = "application/x-www-form-urlencoded",
        timestamp: str | None = None,
        secret: str | None = None,
        signature: str | None = None,
        path: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> HttpResult:
        """POST ``body`` signed with ``secret`` (default: the real one) at ``timestamp``."""
        ts = timestamp if timestamp is not None else str(int(time.time()))
        sig = signature if signature is not None else sign(secret or self.signing_secret, ts, body)
        headers = {
            "Content-Type": content_type,
            "X-Slack-Request-Timestamp": ts,
            "X-Slack-Signature": sig,
            **(headers or {}),
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.url + path, data=body.encode(), headers=headers) as resp,
        ):
            return HttpResult(resp.status, await resp.text(), dict(resp.headers))

    def _response_url(self, name: str | None) -> str:
        if self.fake is None:
            return "https://hooks.slack.com/actions/T0TEST/1/fake"
        return self.fake.response_url(name or f"r{next(self._n)}")

    def command_body(
        self,
        text: str,
        *,
        user_id: str = "U0REQ",
        channel_id: str = "C0CHAN",
        response_url: str | None = None,
        command: str | None = None,
        team_id: str | None = None,
    ) -> str:
        return urlencode(
            {
                "token": "deprecated-verification-token",
                "team_id": team_id or self.team_id,
                "team_domain": "fake",
                "channel_id": channel_id,
                "channel_name": "general",
                "user_id": user_id,
                "user_name": user_id.lower(),
                "command": command or self.command_name,
                "text": text,
                "api_app_id": "A0APP",
                "is_enterprise_install": "false",
                "response_url": response_url or self._response_url(None),
                "trigger_id": f"trigger-{next(self._n)}",
            }
        )

    async def event(
        self, event: dict[str, Any], *, event_id: str | None = None, retry: int = 0
    ) -> HttpResult:
        """An Events API ``event_callback`` carrying ``event``, as JSON; ``retry`` > 0 adds
        the headers of Slack's retries (``X-Slack-Retry-Num``, ``X-Slack-Retry-Reason``)."""
        body = {
            "token": "deprecated-verification-token",
            "team_id": self.team_id,
            "api_app_id": "A0APP",
            "event": event,
            "type": "event_callback",
            "event_id": event_id or f"Ev{next(self._n):08d}{time.time_ns() % 10**6:06d}",
            "event_time": int(time.time()),
        }
        headers = {}
        if retry:
            headers = {"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_timeout"}
        return await self.post(json.dumps(body), content_type="application/json", headers=headers)

    async def command(self, text: str, **kwargs: Any) -> HttpResult:
        """A slash command, e.g. ``await slack.command("delete user 42", user_id="U1")``."""
        return await self.post(self.command_body(text, **kwargs))

    def action_payload(
        self,
        action_id: str,
        value: str,
        *,
        user_id: str = "U0APPROVER",
        channel_id: str = "C0CHAN",
        message_ts: str = "1700000000.000100",
        trigger_id: str | None = None,
        response_url: str | None = None,
        block_id: str = "gate",
    ) -> dict[str, Any]:
        return {
            "type": "block_actions",
            "team": {"id": self.team_id, "domain": "fake"},
            "user": {"id": user_id, "username": user_id.lower(), "team_id": self.team_id},
            "api_app_id": "A0APP",
            "token": "deprecated-verification-token",
            "container": {
                "type": "message",
                "message_ts": message_ts,
                "channel_id": channel_id,
                "is_ephemeral": False,
            },
            "trigger_id": trigger_id or f"trigger-{next(self._n)}",
            "channel": {"id": channel_id, "name": "general"},
            "message": {"type": "message", "ts": message_ts, "text": "card", "blocks": []},
            "response_url": response_url or self._response_url(None),
            "actions": [
                {
                    "type": "button",
                    "action_id": action_id,
                    "block_id": block_id,
                    "value": value,
                    "text": {"type": "plain_text", "text": action_id},
                    "action_ts": f"{time.time():.6f}",
                }
            ],
        }

    async def action(self, action_id: str, value: str, **kwargs: Any) -> HttpResult:
        """A button click (``block_actions``), e.g. ``await slack.action("gate_approve", gid)``."""
        return await self.payload(self.action_payload(action_id, value, **kwargs))

    def view_payload(
        self,
        callback_id: str,
        private_metadata: str,
        values: dict[str, dict[str, dict[str, Any]]] | None = None,
        *,
        user_id: str = "U0APPROVER",
    ) -> dict[str, Any]:
        return {
            "type": "view_submission",
            "team": {"id": self.team_id, "domain": "fake"},
            "user": {"id": user_id, "username": user_id.lower(), "team_id": self.team_id},
            "api_app_id": "A0APP",
            "token": "deprecated-verification-token",
            "trigger_id": f"trigger-{next(self._n)}",
            "view": {
                "id": "V0VIEW",
                "type": "modal",
                "callback_id": callback_id,
                "private_metadata": private_metadata,
                "state": {"values": values or {}},
                "hash": "1",
            },
            "response_urls": [],
        }

    async def view_submission(
        self, callback_id: str, private_metadata: str, **kwargs: Any
    ) -> HttpResult:
        """A modal submission; ``values`` as in ``view.state.values``."""
        return await self.payload(self.view_payload(callback_id, private_metadata, **kwargs))

    async def payload(self, payload: dict[str, Any], **kwargs: Any) -> HttpResult:
        """Any interactivity payload, sent as ``payload=<json>``."""
        return await self.post(urlencode({"payload": json.dumps(payload)}), **kwargs)
