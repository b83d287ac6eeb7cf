"""The playground's HTTP server: the Slack Web API, response URLs, the page and its UI API.

Routes (127.0.0.1 only; who may call them: :mod:`playground.guard`):

- ``/api/{method}``: the Web API the bot calls (:class:`playground.slack_api.WebApi`);
- ``POST /upload/v1/{key}``: the upload URL ``files.getUploadURLExternal`` hands out, and
  ``GET /files/{id}/{name}``: a shared file's content (the page links to it);
- ``POST /respond/{token}``: the ``response_url`` of a slash command or a click;
- ``GET /``, ``/static/…``: the page (its HTML carries the session token);
- the page's UI API, JSON, with the session token: ``GET /ui/state``, ``GET /ui/history?as=U&limit=&before=``,
  ``GET /ui/thread?as=U&ts=``, ``POST /ui/send`` ``{as, text, thread_ts?}``, ``POST /ui/action``
  ``{as, container, action}``, ``POST /ui/view/submit`` ``{as, view_id, values}``,
  ``POST /ui/view/close`` ``{as, view_id}``, and ``GET /ui/stream?as=U``: Server-Sent Events
  ``message``, ``delete``, ``view``, ``view_closed``, ``notice``, ``ping``.

What a person does on the page becomes the request Slack would send the bot
(:mod:`playground.outbound`); what the bot answers is shown the way Slack shows it.
"""

from __future__ import annotations

import asyncio
import html
import logging
import re
import secrets
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

from aiohttp import web

from . import guard, people
from .blockkit import find_element, view_state
from .hub import Hub
from .outbound import Answer, Sender, new_trigger_id
from .slack_api import WebApi
from .store import Message, Store
from .wire import (
    MAX_MESSAGE_BLOCKS,
    UPLOAD_PATH,
    PostRateLimit,
    bearer,
    blocks_detail,
    read_args,
    read_upload,
)

log = logging.getLogger(__name__)

# Package data (pyproject's package-data ships static/*). aiohttp serves a directory, which an
# installed package (a wheel unpacked in site-packages, or the source tree) always is.
STATIC = Path(str(resources.files(__package__ or "playground") / "static"))
TOKEN_SLOT = "{{PLAYGROUND_TOKEN}}"  # in index.html: replaced with the session token
PING_SECONDS = 15.0
HISTORY_PAGE = 50
MAX_UPLOAD_BYTES = 64 * 1024 * 1024


@dataclass
class PageInfo:
    """What the page says about this playground."""

    command: str = "/agent"
    model_scripted: bool = True
    model_label: str = ""
    model_hint: str = ""
    examples: list[str] = field(default_factory=list)
    # Events the app subscribes to (its manifest's bot_events): only these are sent.
    bot_events: frozenset[str] = frozenset()


class BadRequest(Exception):
    """A UI request the page should not have sent; answered 400 with the message."""


class Playground:
    """State and handlers of one playground server."""

    def __init__(
        self,
        store: Store,
        sender: Sender,
        token: str,
        info: PageInfo,
        post_limit: PostRateLimit | None = None,
    ) -> None:
        """``post_limit``: limit chat.postMessage per channel as Slack does (None: no limit)."""
        self.store = store
        self.hub = Hub()
        self.api = WebApi(store, people.WORKSPACE, token, hub=self.hub, post_limit=post_limit)
        self.sender = sender
        self.info = info
        self.response_base = ""  # http://127.0.0.1:PORT, set once listening
        # What the page sends back on every UI call (guard.TOKEN_HEADER): only the page's
        # own HTML carries it, so another web page cannot drive the playground.
        self.session_token = guard.new_token()
        self._page = (
            (STATIC / "index.html").read_text().replace(TOKEN_SLOT, html.escape(self.session_token))
        )

    @property
    def response_base(self) -> str:
        """``http://127.0.0.1:PORT``, set once listening (response and upload URLs use it)."""
        return self.api.base_url

    @response_base.setter
    def response_base(self, url: str) -> None:
        self.api.base_url = url

    # ------------------------------------------------------------------ the app
    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=2 * 1024 * 1024, middlewares=[guard.middleware(self.session_token)]
        )
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_post("/respond/{token}", self._respond)
        app.router.add_post(UPLOAD_PATH + "{key}", self._upload)
        app.router.add_get("/files/{file_id}/{name}", self._file)
        app.router.add_get("/", self._index)
        app.router.add_static("/static/", STATIC, show_index=False)
        app.router.add_get("/ui/state", self._state)
        app.router.add_get("/ui/history", self._history)
        app.router.add_get("/ui/thread", self._thread)
        app.router.add_get("/ui/stream", self._stream)
        app.router.add_post("/ui/send", self._send)
        app.router.add_post("/ui/action", self._action)
        app.router.add_post("/ui/view/submit", self._view_submit)
        app.router.add_post("/ui/view/close", self._view_close)
        app.router.add_post("/ui/home", self._home)
        app.router.add_get("/ui/home", self._home_view)
        app.on_shutdown.append(self._shutdown)
        return app

    async def _shutdown(self, app: web.Application) -> None:
        self.hub.close()
        await self.sender.close()

    # ------------------------------------------------------------------ Web API
    async def _api(self, request: web.Request) -> web.Response:
        args = await read_args(request)
        method = request.match_info["method"]
        out = await self.api.call(method, args, bearer(request, args))
        wait = out.pop("_retry_after", None)
        if wait is not None:
            return web.json_response(out, status=429, headers={"Retry-After": str(wait)})
        return web.json_response(out)

    async def _upload(self, request: web.Request) -> web.Response:
        """An upload URL: Slack answers 200 with a short text."""
        data = await read_upload(request, MAX_UPLOAD_BYTES)
        if data is None:
            return web.Response(status=413, text="file_too_large")
        if not await self.api.upload(request.match_info["key"], data):
            return web.Response(status=404, text="upload_url_not_found")
        return web.Response(text=f"OK - {len(data)}")

    async def _file(self, request: web.Request) -> web.Response:
        """A shared file, as text when it is (the page opens it in a tab)."""
        found = await self.store.file_content(request.match_info["file_id"])
        if found is None:
            raise web.HTTPNotFound()
        name, data = found
        try:
            data.decode("utf-8")
            ctype = "text/plain"
        except UnicodeDecodeError:
            ctype = "application/octet-stream"
        disposition = "inline" if ctype == "text/plain" else "attachment"
        return web.Response(
            body=data,
            content_type=ctype,
            charset="utf-8" if ctype == "text/plain" else None,
            headers={
                "Content-Disposition": f"{disposition}; filename*=UTF-8''{quote(name)}",
                "X-Content-Type-Options": "nosniff",
            },
        )

    async def _respond(self, request: web.Request) -> web.Response:
        args = await read_args(request)
        status, body = await self.api.respond(request.match_info["token"], args)
        if status == 404:
            return web.Response(status=404, text=str(body["error"]))
        return web.json_response(body, status=status)

    async def _response_url(self, user: str, msg: Message | None) -> str:
        token = secrets.token_urlsafe(18)
        thread = None
        if msg is not None:
            thread = msg.thread_ts if msg.is_reply else (msg.thread_ts or None)
        await self.store.issue_response_url(
            token,
            {
                "user": user,
                "channel": msg.channel if msg is not None else people.CHANNEL_ID,
                "thread_ts": thread,
                "message_ts": msg.ts if msg is not None else None,
            },
        )
        return f"{self.response_base}/respond/{token}"

    # ------------------------------------------------------------------ page
    async def _index(self, request: web.Request) -> web.Response:
        return web.Response(
            text=self._page,
            content_type="text/html",
            headers={"Cache-Control": "no-store"},
        )

    async def _state(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "team": {"id": people.TEAM_ID, "name": people.TEAM_NAME},
                "channel": {"id": people.CHANNEL_ID, "name": people.CHANNEL_NAME},
                "channels": [{"id": c, "name": n} for c, n in people.CHANNELS.items()],
                "bot": {"id": people.BOT_USER_ID, "name": people.BOT_NAME},
                "users": [{"id": p.id, "name": p.name, "title": p.title} for p in people.PEOPLE],
                "default_user": people.REQUESTER.id,
                "usergroups": [
                    {"id": g.id, "handle": g.handle, "name": g.name, "users": list(g.members)}
                    for g in people.USERGROUPS.values()
                ],
                "model": {
                    "scripted": self.info.model_scripted,
                    "label": self.info.model_label,
                    "hint": self.info.model_hint,
                },
                "command": self.info.command,
                "examples": self.info.examples,
            }
        )

    def _as(self, value: Any) -> str:
        if not isinstance(value, str) or people.person(value) is None:
            raise BadRequest("unknown user: choose one of the playground's people")
        return value

    def _channel(self, value: Any) -> str:
        """The channel a page request names (the main one when it names none)."""
        if value is None or value == "":
            return people.CHANNEL_ID
        if not isinstance(value, str) or value not in people.CHANNELS:
            raise BadRequest("unknown channel: choose one of the playground's channels")
        return value

    async def _history(self, request: web.Request) -> web.Response:
        try:
            viewer = self._as(request.query.get("as"))
            channel = self._channel(request.query.get("channel"))
        except BadRequest as exc:
            return _bad(str(exc))
        try:
            limit = min(max(int(request.query.get("limit") or HISTORY_PAGE), 1), 200)
        except ValueError:
            return _bad("limit must be a number")
        before = request.query.get("before") or None
        if before is not None and not re.fullmatch(r"\d+\.\d+", before):
            return _bad("before must be a message ts")
        found, more = await self.store.top_level(channel, limit=limit, before=before, viewer=viewer)
        messages = [await self.api.present(m) for m in found]
        return web.json_response({"messages": messages, "has_more": more})

    async def _thread(self, request: web.Request) -> web.Response:
        try:
            viewer = self._as(request.query.get("as"))
            channel = self._channel(request.query.get("channel"))
        except BadRequest as exc:
            return _bad(str(exc))
        root = await self.store.get(channel, request.query.get("ts") or "")
        if root is not None and root.is_reply and root.thread_ts:
            root = await self.store.get(channel, root.thread_ts)
        if root is None or root.ephemeral_to:
            return web.json_response({"error": "thread_not_found"}, status=404)
        replies = await self.store.replies(channel, root.ts, viewer)
        return web.json_response(
            {
                "root": await self.api.present(root),
                "replies": [await self.api.present(m) for m in replies],
            }
        )

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        try:
            viewer = self._as(request.query.get("as"))
        except BadRequest as exc:
            return _bad(str(exc))
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        await resp.prepare(request)
        sub = self.hub.subscribe(viewer)
        try:
            await resp.write(b"retry: 1000\n\n")
            while True:
                try:
                    item = await asyncio.wait_for(sub.queue.get(), PING_SECONDS)
                except TimeoutError:
                    item = ("ping", "{}")
                if item is None:
                    break
                event, data = item
                await resp.write(f"event: {event}\ndata: {data}\n\n".encode())
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.hub.unsubscribe(sub)
        return resp

    # ------------------------------------------------------------------ what people do
    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError:
            raise BadRequest("the body must be JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        return body

    async def _send(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            user = self._as(body.get("as"))
            text = body.get("text")
            if not isinstance(text, str) or not text.strip():
                raise BadRequest("nothing to send")
            thread = body.get("thread_ts")
            if thread is not None and not (
                isinstance(thread, str) and re.fullmatch(r"\d+\.\d+", thread)
            ):
                raise BadRequest("thread_ts must be a message ts")
        except BadRequest as exc:
            return _bad(str(exc))
        text = text.strip()
        if text.startswith("/"):
            return web.json_response(await self._command(user, text))
        return web.json_response(await self._message(user, text, thread))

    async def _command(self, user: str, text: str) -> dict[str, Any]:
        command, _, rest = text.partition(" ")
        if command != self.info.command:
            return {
                "ok": False,
                "error": f"{command} is not a valid command. Try {self.info.command} help.",
            }
        trigger = new_trigger_id()
        await self.store.issue_trigger(trigger, user)
        answer = await self.sender.command(
            user=user,
            command=command,
            text=rest.strip(),
            response_url=await self._response_url(user, None),
            trigger_id=trigger,
        )
        await self._show_ack(user, None, answer, command)
        return {"ok": True}

    async def _show_ack(self, user: str, thread: str | None, answer: Answer, what: str) -> None:
        """Show what Slack shows for a slash command's HTTP answer."""
        if answer.status != 200:
            error = answer.error or (
                "http_service_error" if answer.status >= 500 else "http_client_error"
            )
            await self._ephemeral(
                user, thread, f'{what} failed with the error "{error}"', slackbot=True
            )
            return
        data = answer.json()
        if isinstance(data, dict) and (data.get("text") or data.get("blocks")):
            problem, detail = blocks_detail(data.get("blocks") or [], MAX_MESSAGE_BLOCKS)
            if problem:
                self.hub.publish(
                    "notice", {"level": "error", "text": f"{what} answer → {problem}: {detail}"}
                )
                return
            in_channel = data.get("response_type") == "in_channel"
            content = {**data, "channel": people.CHANNEL_ID, "thread_ts": thread}
            await self.api.post(
                self.api.bot_message(content, ephemeral_to=None if in_channel else user)
            )
        elif data is None and answer.body.strip():
            await self._ephemeral(user, thread, answer.body.strip())

    async def _ephemeral(
        self, user: str, thread: str | None, text: str, slackbot: bool = False
    ) -> None:
        await self.api.post(
            Message(
                channel=people.CHANNEL_ID,
                ts="",
                text=text,
                thread_ts=thread,
                user="USLACKBOT" if slackbot else people.BOT_USER_ID,
                bot_id=None if slackbot else people.BOT_ID,
                ephemeral_to=user,
            )
        )

    async def _message(self, user: str, text: str, thread: str | None) -> dict[str, Any]:
        if thread is not None:
            root = await self.store.get(people.CHANNEL_ID, thread)
            if root is None or root.ephemeral_to:
                return {"ok": False, "error": "that thread does not exist"}
        wire_text = html.escape(text, quote=False)
        wire_text = re.sub(rf"@{people.BOT_NAME}\b", f"<@{people.BOT_USER_ID}>", wire_text)
        for p in people.PEOPLE:
            wire_text = re.sub(rf"@{p.name}\b", f"<@{p.id}>", wire_text)
        mentioned = f"<@{people.BOT_USER_ID}>" in wire_text
        msg = await self.api.post(
            Message(channel=people.CHANNEL_ID, ts="", text=wire_text, thread_ts=thread, user=user)
        )
        event: dict[str, Any] = {
            "type": "message",
            "channel": msg.channel,
            "user": user,
            "text": msg.text,
            "ts": msg.ts,
            "event_ts": msg.ts,
            "channel_type": "channel",
            "team": people.TEAM_ID,
            "client_msg_id": secrets.token_hex(16),
        }
        if msg.thread_ts:
            event["thread_ts"] = msg.thread_ts
        if "message.channels" in self.info.bot_events:
            await self._deliver(user, event)
        if mentioned and "app_mention" in self.info.bot_events:
            await self._deliver(user, {**event, "type": "app_mention"})
        return {"ok": True}

    async def _deliver(self, user: str, event: dict[str, Any]) -> None:
        answer = await self.sender.event(event)
        if answer.status != 200:
            why = answer.error or f"HTTP {answer.status}"
            self.hub.publish(
                "notice",
                {"level": "error", "text": f"event {event['type']} → the app answered {why}"},
            )

    async def _action(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            user = self._as(body.get("as"))
            container = body.get("container")
            action = body.get("action")
            if not isinstance(container, dict) or not isinstance(action, dict):
                raise BadRequest("container and action are required")
        except BadRequest as exc:
            return _bad(str(exc))
        trigger = new_trigger_id()
        if container.get("type") == "view":
            view_id = str(container.get("view_id") or "")
            found = await self.store.get_view(view_id)
            home = await self.store.home(user) if found is None else None
            if home is not None and home.get("id") == view_id:
                found = (user, home)  # a click on the person's own Home tab
            if found is None or found[0] != user:
                return _bad("no such open view")
            view = found[1]
            element = find_element(view.get("blocks") or [], action)
            if element is None:
                return _bad("no such element in that view")
            await self.store.issue_trigger(trigger, user)
            payload = self.sender.block_actions(
                user=user,
                action=element,
                trigger_id=trigger,
                container={"type": "view", "view_id": view_id},
                view=view,
            )
            answer = await self.sender.interaction(payload)
            return web.json_response(_interaction_result(answer))
        channel = str(container.get("channel") or "")
        msg = await self.store.get(channel, str(container.get("ts") or ""))
        if msg is None or (msg.ephemeral_to and msg.ephemeral_to != user):
            return _bad("no such message")
        element = find_element(msg.blocks, action)
        if element is None:
            return _bad("no such element in that message")
        await self.store.issue_trigger(trigger, user)
        cont: dict[str, Any] = {
            "type": "message",
            "message_ts": msg.ts,
            "channel_id": msg.channel,
            "is_ephemeral": msg.ephemeral_to is not None,
        }
        if msg.thread_ts:
            cont["thread_ts"] = msg.thread_ts
        payload = self.sender.block_actions(
            user=user,
            action=element,
            trigger_id=trigger,
            container=cont,
            message=self.api.wire(msg, False),
            response_url=await self._response_url(user, msg),
        )
        answer = await self.sender.interaction(payload)
        return web.json_response(_interaction_result(answer))

    async def _view_submit(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            user = self._as(body.get("as"))
            view_id = str(body.get("view_id") or "")
            values = body.get("values") or {}
            if not isinstance(values, dict):
                raise BadRequest("values must be an object")
        except BadRequest as exc:
            return _bad(str(exc))
        found = await self.store.get_view(view_id)
        if found is None or found[0] != user:
            return _bad("no such open view")
        view = found[1]
        state, errors = view_state(view, values)
        if errors:  # Slack's client checks these before sending anything
            return web.json_response({"ok": True, "closed": False, "errors": errors})
        payload = self.sender.view_payload("view_submission", user=user, view=view, values=state)
        answer = await self.sender.interaction(payload)
        if answer.status != 200:
            return web.json_response(
                {"ok": False, "error": "We had some trouble connecting. Try again?"}
            )
        data = answer.json()
        action = data.get("response_action") if isinstance(data, dict) else None
        if action == "errors":
            errs = data.get("errors") if isinstance(data, dict) else None
            return web.json_response({"ok": True, "closed": False, "errors": errs or {}})
        if (
            action in ("update", "push")
            and isinstance(data, dict)
            and isinstance(data.get("view"), dict)
        ):
            if (problem := self.api.view_problem(data["view"])) is not None:
                self.hub.publish(
                    "notice",
                    {
                        "level": "error",
                        "text": f"view_submission answer → {problem['error']}: "
                        f"{problem.get('_detail', '')}",
                    },
                )
                return web.json_response(
                    {"ok": False, "error": "We had some trouble connecting. Try again?"}
                )
            new = self.api.full_view(view_id, dict(data["view"]))
            await self.store.save_view(view_id, user, new)
            return web.json_response({"ok": True, "closed": False, "view": new})
        await self.store.drop_view(view_id)
        self.hub.publish("view_closed", {"view_id": view_id}, to=user)
        return web.json_response({"ok": True, "closed": True})

    async def _home(self, request: web.Request) -> web.Response:
        """The person opens the app's Home tab: Slack tells the app (``app_home_opened``, when
        its manifest subscribes to it); the view published for them so far, if any, is shown
        at once, and every later views.publish reaches the page as a ``home`` event."""
        try:
            body = await self._body(request)
            user = self._as(body.get("as"))
        except BadRequest as exc:
            return _bad(str(exc))
        view = await self.store.home(user)
        if "app_home_opened" in self.info.bot_events:
            event: dict[str, Any] = {
                "type": "app_home_opened",
                "user": user,
                "channel": "D" + user[1:],
                "tab": "home",
                "event_ts": f"{time.time():.6f}",
            }
            if view is not None:
                event["view"] = view
            await self._deliver(user, event)
        return web.json_response({"ok": True, "view": view})

    async def _home_view(self, request: web.Request) -> web.Response:
        """The view published for the person so far (the page reloads it on reconnecting)."""
        try:
            user = self._as(request.query.get("as"))
        except BadRequest as exc:
            return _bad(str(exc))
        return web.json_response({"ok": True, "view": await self.store.home(user)})

    async def _view_close(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            user = self._as(body.get("as"))
        except BadRequest as exc:
            return _bad(str(exc))
        view_id = str(body.get("view_id") or "")
        found = await self.store.get_view(view_id)
        if found is None or found[0] != user:
            return web.json_response({"ok": True})
        await self.store.drop_view(view_id)
        self.hub.publish("view_closed", {"view_id": view_id}, to=user)
        if found[1].get("notify_on_close"):
            payload = self.sender.view_payload("view_closed", user=user, view=found[1], values={})
            await self.sender.interaction(payload)
        return web.json_response({"ok": True})


def _bad(message: str) -> web.Response:
    return web.json_response({"ok": False, "error": message}, status=400)


def _interaction_result(answer: Answer) -> dict[str, Any]:
    if answer.status == 200:
        return {"ok": True}
    why = answer.error or f"HTTP {answer.status}"
    return {"ok": False, "error": f"The app did not respond ({why})."}


def bot_events(manifest: str) -> frozenset[str]:
    """The ``settings.event_subscriptions.bot_events`` of a Slack app manifest (YAML), read
    line by line: the playground sends only the events the app subscribed to, as Slack does."""
    events: set[str] = set()
    inside, indent = False, 0
    for line in manifest.splitlines():
        stripped = line.split("#", 1)[0].rstrip()
        if not stripped.strip():
            continue
        depth = len(stripped) - len(stripped.lstrip())
        if stripped.strip() == "bot_events:":
            inside, indent = True, depth
            continue
        if inside:
            item = stripped.strip()
            if item.startswith("- ") and depth >= indent:
                events.add(item[2:].strip().strip("'\""))
            elif depth <= indent:
                inside = False
    return frozenset(events)
