"""The Slack Web API methods the bot calls, in Slack's wire format: the one fake Slack.

The playground serves it (its state in Redis, :mod:`playground.store`); the tests' fake Slack
serves it too (its state in memory, ``tests/slack_fake``), adding only what tests need on top
(injected faults, held answers, a record of every call). Each ``_api_<method>``
(``chat.postMessage`` is ``_api_chat_postMessage``) takes the call's arguments and returns the
JSON body Slack would answer with; what changed is stored (a :class:`~playground.state.State`)
and published to the page (:mod:`playground.hub`). A refused call (``invalid_blocks``,
``expired_trigger_id``…) is also shown on the page, with the reason, as Slack would show it to
the developer: the bot itself sees only the error code. Who is in the workspace (team, bot,
people, groups, channels) is a :class:`~playground.workspace.Workspace`.

Message metadata follows Slack: ``chat.postMessage`` (and ``chat.update``) take
``metadata={"event_type": ..., "event_payload": {...}}``; ``conversations.history`` and
``conversations.replies`` return it only when called with ``include_all_metadata=true``. Both
page with ``limit`` and an opaque ``cursor``, and filter on ``oldest``/``latest`` (exclusive
unless ``inclusive``). Slack gives a block sent without a ``block_id`` one of its own, puts a
reply to a reply in the same thread, and clears an assistant thread's status line when the app
posts in it; so does this.

With a :class:`~playground.wire.PostRateLimit`, ``chat.postMessage`` is limited per channel as
Slack limits it (HTTP 429 with ``Retry-After``). Files are uploaded as ``files_upload_v2`` does
(``files.getUploadURLExternal``, a POST to the upload URL, ``files.completeUploadExternal``)
and shown on the page as an attachment that links to the content.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from .hub import Hub
from .state import TRIGGER_USED, Message, State
from .wire import (
    ASSISTANT_REQUIRED,
    MAX_HOME_BYTES,
    MAX_MESSAGE_BLOCKS,
    MAX_PAGE,
    MAX_VIEW_BLOCKS,
    UPLOAD_PATH,
    PostRateLimit,
    assistant_problem,
    blocks_detail,
    complete_files,
    cursor,
    cursor_offset,
    file_object,
    metadata_problem,
    truthy,
    upload_url_problem,
)
from .workspace import Workspace

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


def _fail(error: str, detail: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"ok": False, "error": error}
    if detail:
        out["_detail"] = detail  # stripped before answering; shown on the page
    return out


class WebApi:
    """The Web API (see the module docstring)."""

    def __init__(
        self,
        store: State,
        workspace: Workspace,
        token: str,
        *,
        hub: Hub | None = None,
        post_limit: PostRateLimit | None = None,
        validate_blocks: bool = True,
        home_tab_enabled: bool = True,
    ) -> None:
        """``hub``: where the page hears of changes (none: nobody listens); ``post_limit``:
        limit chat.postMessage per channel as Slack does; ``validate_blocks`` False: take any
        blocks (a benchmark's shortcut, never Slack's); ``home_tab_enabled`` False: the app's
        manifest has no Home tab (views.publish answers ``not_enabled``)."""
        self.store = store
        self.workspace = workspace
        self.hub = hub or Hub()
        self.token = token
        self.post_limit = post_limit
        self.validate_blocks = validate_blocks
        self.home_tab_enabled = home_tab_enabled
        self.base_url = ""  # http://127.0.0.1:PORT once listening (upload URLs point there)

    async def call(self, method: str, args: dict[str, Any], token: str | None) -> dict[str, Any]:
        """Answer one call; the body Slack would send (HTTP 200 in every case, as Slack)."""
        if not token:
            out = _fail("not_authed")
        elif not secrets.compare_digest(token, self.token):
            out = _fail("invalid_auth")
        elif (wait := self._over_limit(method, args)) is not None:
            # Answered HTTP 429 with Retry-After (see the server); the bot waits and retries.
            return {"ok": False, "error": "ratelimited", "_retry_after": wait}
        else:
            handler: Handler | None = getattr(self, "_api_" + method.replace(".", "_"), None)
            if handler is None:
                out = _fail("unknown_method", f"this fake Slack does not implement {method}")
            else:
                out = await handler(args)
        detail = out.pop("_detail", "")
        if not out.get("ok") and method != "auth.test":
            text = f"{method} → {out.get('error')}" + (f": {detail}" if detail else "")
            log.warning("Web API call refused: %s", text)
            self.hub.publish("notice", {"level": "error", "text": text})
        return out

    def _over_limit(self, method: str, args: dict[str, Any]) -> int | None:
        if self.post_limit is None or method != "chat.postMessage":
            return None
        return self.post_limit.take(str(args.get("channel") or ""))

    # ------------------------------------------------------------------ presenting
    async def present(self, msg: Message) -> dict[str, Any]:
        """A message as the page shows it (see the UI API in :mod:`playground.server`)."""
        count, latest = 0, None
        users: list[str] = []
        if not msg.is_reply and not msg.ephemeral_to:
            count, users, latest = await self.store.reply_stats(msg.channel, msg.ts)
        return {
            "channel": msg.channel,
            "ts": msg.ts,
            "thread_ts": msg.thread_ts,
            "user": msg.user,
            "user_name": self.workspace.display_name(msg.user),
            "bot": msg.bot_id is not None,
            "text": msg.text,
            "blocks": msg.blocks,
            "reply_count": count,
            "reply_users": users,
            "latest_reply": latest,
            "ephemeral": msg.ephemeral_to is not None,
            "updated": msg.updated,
            # The page links to the playground's copy (url_private needs the bot token).
            "files": [
                {
                    "id": f.get("id"),
                    "name": f.get("name"),
                    "title": f.get("title"),
                    "size": f.get("size"),
                    "url": f"/files/{f.get('id')}/{quote(str(f.get('name')), safe='')}",
                }
                for f in msg.files
            ],
        }

    async def announce(self, msg: Message) -> None:
        """Publish a new or changed message, and its thread's root (whose reply count moved)."""
        if not self.hub.listening:
            return  # no page open (the tests' fake Slack never has one)
        self.hub.publish("message", await self.present(msg), to=msg.ephemeral_to)
        if msg.is_reply and not msg.ephemeral_to and msg.thread_ts:
            root = await self.store.get(msg.channel, msg.thread_ts)
            if root is not None:
                self.hub.publish("message", await self.present(root))

    async def post(self, msg: Message) -> Message:
        """Store a message given its content (ts assigned here) and publish it."""
        msg.blocks = with_block_ids(msg.blocks)
        msg.ts = await self.store.next_ts()
        if msg.thread_ts is not None:
            root = await self.store.get(msg.channel, msg.thread_ts)
            # Replying to a reply lands in the same thread, as in Slack.
            if root is not None and root.is_reply:
                msg.thread_ts = root.thread_ts
        await self.store.add(msg)
        await self.announce(msg)
        return msg

    def bot_message(
        self,
        args: dict[str, Any],
        *,
        ephemeral_to: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Message:
        """A new message from the bot with the content of a call's (or an answer's)
        arguments: ``channel``, ``text``, ``blocks``, ``thread_ts``; its ts is given when it
        is posted."""
        return Message(
            channel=str(args.get("channel") or ""),
            ts="",
            text=str(args.get("text") or ""),
            blocks=list(args.get("blocks") or []),
            thread_ts=str(args["thread_ts"]) if args.get("thread_ts") else None,
            user=self.workspace.bot_user_id,
            bot_id=self.workspace.bot_id,
            metadata=metadata,
            ephemeral_to=ephemeral_to,
        )

    def wire(self, msg: Message, with_metadata: bool) -> dict[str, Any]:
        """A message as the Web API returns it (without its thread's reply counts)."""
        out: dict[str, Any] = {"type": "message", "text": msg.text, "ts": msg.ts}
        if msg.user:
            out["user"] = msg.user
        if msg.bot_id:
            out["bot_id"] = msg.bot_id
            out["app_id"] = self.workspace.app_id
        if msg.blocks:
            out["blocks"] = msg.blocks
        if msg.thread_ts:
            out["thread_ts"] = msg.thread_ts
        if msg.files:
            out["files"] = msg.files
            out["upload"] = True
        if msg.updated:
            out["edited"] = {"user": msg.user, "ts": msg.ts}
        if with_metadata and msg.metadata:
            out["metadata"] = msg.metadata
        return out

    # ------------------------------------------------------------------ checks
    def _content_problem(self, args: dict[str, Any]) -> dict[str, Any] | None:
        channel = args.get("channel")
        if (error := self.workspace.channel_problem(channel)) is not None:
            return _fail(error, f"no channel {str(channel)[:40]!r} the bot can post to")
        blocks = args.get("blocks")
        if not args.get("text") and not blocks:
            return _fail("no_text")
        if "metadata" in args and metadata_problem(args["metadata"]):
            return _fail("invalid_metadata_format")
        if blocks is not None and self.validate_blocks:
            error, detail = blocks_detail(blocks, MAX_MESSAGE_BLOCKS)
            if error:
                return _fail(error, detail)
        return None

    # ------------------------------------------------------------------ messages
    async def _api_auth_test(self, args: dict[str, Any]) -> dict[str, Any]:
        ws = self.workspace
        return {
            "ok": True,
            "url": ws.url,
            "team": ws.team_name,
            "user": ws.bot_name,
            "team_id": ws.team_id,
            "user_id": ws.bot_user_id,
            "bot_id": ws.bot_id,
            "is_enterprise_install": False,
        }

    async def _api_chat_postMessage(self, args: dict[str, Any]) -> dict[str, Any]:
        if (problem := self._content_problem(args)) is not None:
            return problem
        msg = await self.post(self.bot_message(args, metadata=args.get("metadata") or None))
        if msg.thread_ts:  # as Slack: the app's reply in a thread clears its status line
            await self.store.set_status(msg.channel, msg.thread_ts, "")
        return {"ok": True, "channel": msg.channel, "ts": msg.ts, "message": self.wire(msg, True)}

    async def _api_chat_update(self, args: dict[str, Any]) -> dict[str, Any]:
        if (problem := self._content_problem(args)) is not None:
            return problem
        msg = await self.store.get(str(args["channel"]), str(args.get("ts") or ""))
        if msg is None or msg.ephemeral_to:
            return _fail("message_not_found")
        if msg.user != self.workspace.bot_user_id:
            return _fail("cant_update_message", "the bot can only update its own messages")
        if "text" in args:
            msg.text = str(args.get("text") or "")
        if "blocks" in args:  # omitted keeps the old blocks; [] removes them
            msg.blocks = with_block_ids(list(args.get("blocks") or []))
        if "metadata" in args:  # omitted keeps the old metadata
            msg.metadata = args.get("metadata") or None
        msg.updated += 1
        await self.store.save(msg)
        await self.announce(msg)
        return {"ok": True, "channel": msg.channel, "ts": msg.ts, "text": msg.text}

    async def _api_chat_postEphemeral(self, args: dict[str, Any]) -> dict[str, Any]:
        if (problem := self._content_problem(args)) is not None:
            return problem
        user = str(args.get("user") or "")
        if not self.workspace.is_member(user):
            return _fail("user_not_in_channel")
        msg = await self.post(self.bot_message(args, ephemeral_to=user))
        return {"ok": True, "message_ts": msg.ts}

    async def _api_chat_delete(self, args: dict[str, Any]) -> dict[str, Any]:
        msg = await self.store.get(str(args.get("channel") or ""), str(args.get("ts") or ""))
        if msg is None or msg.ephemeral_to:
            return _fail("message_not_found")
        if msg.user != self.workspace.bot_user_id:
            return _fail("cant_delete_message")
        await self.store.delete(msg)
        self.hub.publish("delete", {"channel": msg.channel, "ts": msg.ts})
        return {"ok": True, "channel": msg.channel, "ts": msg.ts}

    # ------------------------------------------------------------------ reading messages
    async def _page(
        self, args: dict[str, Any], found: list[Message], default_limit: int
    ) -> dict[str, Any]:
        try:
            limit = min(max(int(args.get("limit") or default_limit), 1), MAX_PAGE)
            start = cursor_offset(str(args.get("cursor") or ""))
        except ValueError:
            return _fail("invalid_cursor")
        with_metadata = truthy(args.get("include_all_metadata"))
        page = found[start : start + limit]
        more = start + limit < len(found)
        messages = [self.wire(m, with_metadata) for m in page]
        for wire, m in zip(messages, page, strict=True):
            if not m.is_reply:
                count, users, latest = await self.store.reply_stats(m.channel, m.ts)
                if count:
                    wire.update(
                        thread_ts=m.ts, reply_count=count, reply_users=users, latest_reply=latest
                    )
        return {
            "ok": True,
            "messages": messages,
            "has_more": more,
            "response_metadata": {"next_cursor": cursor(start + limit) if more else ""},
        }

    def _range(self, args: dict[str, Any]) -> tuple[float, float, bool] | None:
        try:
            oldest = float(args.get("oldest") or 0)
            latest = float(args.get("latest") or "inf")
        except ValueError:
            return None
        if math.isnan(oldest) or math.isnan(latest):  # Redis refuses a NaN bound
            return None
        return oldest, latest, truthy(args.get("inclusive"))

    def _read_problem(self, args: dict[str, Any]) -> dict[str, Any] | None:
        """The refusal of a conversations.history/replies call's channel or range."""
        if (error := self.workspace.channel_problem(args.get("channel"), write=False)) is not None:
            return _fail(error)
        if self._range(args) is None:
            return _fail("invalid_arguments", "oldest/latest must be timestamps")
        return None

    async def _window(self, args: dict[str, Any], root: str | None) -> list[Message]:
        """The call's top-level messages (``root`` None) or replies, in its range."""
        window = self._range(args)
        assert window is not None, "checked by _read_problem"
        oldest, latest, inclusive = window
        channel = str(args["channel"])
        return await self.store.window(
            channel, root, oldest=oldest, latest=latest, inclusive=inclusive
        )

    async def _api_conversations_history(self, args: dict[str, Any]) -> dict[str, Any]:
        """Top-level messages, newest first (thread replies are not included)."""
        if (problem := self._read_problem(args)) is not None:
            return problem
        found = await self._window(args, None)
        found.sort(key=lambda m: float(m.ts), reverse=True)
        return await self._page(args, found, default_limit=100)

    async def _api_conversations_replies(self, args: dict[str, Any]) -> dict[str, Any]:
        """A thread: its parent first, then the replies in order."""
        if (problem := self._read_problem(args)) is not None:
            return problem
        channel = str(args["channel"])
        target = await self.store.get(channel, str(args.get("ts") or ""))
        if target is None or target.ephemeral_to:
            return _fail("thread_not_found")
        root_ts = target.thread_ts if target.is_reply and target.thread_ts else target.ts
        parent = await self.store.get(channel, root_ts)
        replies = await self._window(args, root_ts)
        replies.sort(key=lambda m: float(m.ts))
        return await self._page(args, ([parent] if parent else []) + replies, default_limit=1000)

    # ------------------------------------------------------------------ response URLs
    async def respond(self, token: str, args: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """A post to a ``response_url``: (the HTTP status, the JSON body) Slack answers. The
        answer replaces or deletes the message clicked (``replace_original``,
        ``delete_original``), or is posted: to the person alone unless ``in_channel``."""
        ctx = await self.store.use_response_url(token)
        if ctx is None:
            return 404, {"ok": False, "error": "expired_url"}
        if isinstance(args.get("payload"), str):  # some clients post payload=<json>
            with contextlib.suppress(ValueError, TypeError):
                args = dict(json.loads(args["payload"]))
        user, channel = str(ctx.get("user") or ""), str(ctx.get("channel") or "")
        message_ts = ctx.get("message_ts")
        original = await self.store.get(channel, str(message_ts)) if message_ts else None
        if truthy(args.get("delete_original")):
            if original is not None:
                await self.store.delete(original)
                self.hub.publish(
                    "delete", {"channel": channel, "ts": original.ts}, to=original.ephemeral_to
                )
            return 200, {"ok": True}
        if args.get("blocks") is not None:
            error, detail = blocks_detail(args["blocks"], MAX_MESSAGE_BLOCKS)
            if error:
                text = f"response_url → {error}: {detail}"
                self.hub.publish("notice", {"level": "error", "text": text})
                return 400, {"ok": False, "error": error}
        if not args.get("text") and not args.get("blocks"):
            return 400, {"ok": False, "error": "no_text"}
        if truthy(args.get("replace_original")) and original is not None:
            original.text = str(args.get("text") or "")
            original.blocks = with_block_ids(list(args.get("blocks") or []))
            original.updated += 1
            await self.store.save(original)
            await self.announce(original)
            return 200, {"ok": True}
        if not (user and channel):
            return 200, {"ok": True}  # a URL whose context nobody gave: nowhere to show it
        in_channel = args.get("response_type") == "in_channel"
        thread = args.get("thread_ts") or ctx.get("thread_ts")
        content = {**args, "channel": channel, "thread_ts": thread}
        await self.post(self.bot_message(content, ephemeral_to=None if in_channel else user))
        return 200, {"ok": True}

    # ------------------------------------------------------------------ modals
    def view_problem(self, view: Any) -> dict[str, Any] | None:
        if not isinstance(view, dict) or view.get("type") != "modal":
            return _fail("invalid_arguments", "view must be a modal")
        title = (view.get("title") or {}).get("text", "")
        if not title or len(title) > 24:
            return _fail("invalid_arguments", "view.title must be 1-24 characters")
        if len(view.get("private_metadata") or "") > 3000:
            return _fail("invalid_arguments", "private_metadata is over 3,000 characters")
        if len(view.get("callback_id") or "") > 255:
            return _fail("invalid_arguments", "callback_id is over 255 characters")
        error, detail = blocks_detail(view.get("blocks") or [], MAX_VIEW_BLOCKS, None)
        if error:
            return _fail(error, detail)
        return None

    def full_view(self, view_id: str, view: dict[str, Any]) -> dict[str, Any]:
        ws = self.workspace
        return {
            **view,
            "id": view_id,
            "team_id": ws.team_id,
            "app_id": ws.app_id,
            "bot_id": ws.bot_id,
            "hash": secrets.token_hex(8),
            "state": {"values": {}},
        }

    async def _api_views_open(self, args: dict[str, Any]) -> dict[str, Any]:
        if (problem := self.view_problem(args.get("view"))) is not None:
            return problem  # checked first: a refused view does not use up the trigger
        trigger = str(args.get("trigger_id") or "")
        user = await self.store.exchange_trigger(trigger) if trigger else None
        if user is None:
            return _fail("expired_trigger_id", "a trigger_id works for 3 seconds, once")
        if user == TRIGGER_USED:
            return _fail("exchanged_trigger_id", "this trigger_id already opened a view")
        view_id = "V" + secrets.token_hex(5).upper()
        view = self.full_view(view_id, dict(args["view"]))
        await self.store.save_view(view_id, user, view)
        self.hub.publish("view", {"view_id": view_id, "view": view}, to=user)
        return {"ok": True, "view": view}

    async def _api_views_update(self, args: dict[str, Any]) -> dict[str, Any]:
        view_id = str(args.get("view_id") or "")
        found = await self.store.get_view(view_id) if view_id else None
        if found is None:
            return _fail("not_found", "no open view with that view_id")
        if (problem := self.view_problem(args.get("view"))) is not None:
            return problem
        user, _old = found
        view = self.full_view(view_id, dict(args["view"]))
        await self.store.save_view(view_id, user, view)
        self.hub.publish("view", {"view_id": view_id, "view": view}, to=user)
        return {"ok": True, "view": view}

    _api_views_push = _api_views_open

    # ------------------------------------------------------------------ App Home
    async def _api_views_publish(self, args: dict[str, Any]) -> dict[str, Any]:
        """Publish a person's Home tab: a ``home`` view (at most 100 blocks, 250 kB), checked
        against ``hash`` when given (``hash_conflict`` unless it is the current view's)."""
        user = str(args.get("user_id") or "")
        if not self.workspace.is_member(user):
            return _fail("invalid_arguments", "invalid `user_id`")
        if not self.home_tab_enabled:
            return _fail("not_enabled", "the app's Home tab is not enabled (app_home)")
        view = args.get("view")
        if not isinstance(view, dict) or view.get("type") != "home":
            return _fail("invalid_arguments", "views.publish takes a view of type home")
        if len(json.dumps(view, ensure_ascii=False).encode()) > MAX_HOME_BYTES:
            return _fail("view_too_large", "a Home view may be at most 250 kB")
        for field, limit in (("private_metadata", 3000), ("callback_id", 255)):
            if len(str(view.get(field) or "")) > limit:
                return _fail("invalid_arguments", f"{field} is over {limit:,} characters")
        error, detail = blocks_detail(view.get("blocks") or [], MAX_VIEW_BLOCKS, None)
        if error:
            return _fail(error, detail)
        old = await self.store.home(user)
        wanted = args.get("hash")
        if wanted and (old is None or old.get("hash") != wanted):
            return _fail("hash_conflict", "the Home view changed since that hash")
        view_id = str(old["id"]) if old else "V" + secrets.token_hex(5).upper()
        full = self.full_view(
            view_id, {**view, "blocks": with_block_ids(list(view.get("blocks") or []))}
        )
        await self.store.save_home(user, full)
        self.hub.publish("home", {"user": user, "view": full}, to=user)
        return {"ok": True, "view": full}

    async def _api_chat_getPermalink(self, args: dict[str, Any]) -> dict[str, Any]:
        """A message's link: ``{workspace url}archives/{channel}/p{ts without the dot}``,
        with the thread for a reply."""
        channel = args.get("channel")
        if (error := self.workspace.channel_problem(channel, write=False)) is not None:
            return _fail(error)
        msg = await self.store.get(str(channel), str(args.get("message_ts") or ""))
        if msg is None or msg.ephemeral_to:
            return _fail("message_not_found")
        link = f"{self.workspace.url}archives/{msg.channel}/p{msg.ts.replace('.', '')}"
        if msg.is_reply:
            link += f"?thread_ts={msg.thread_ts}&cid={msg.channel}"
        return {"ok": True, "channel": msg.channel, "permalink": link}

    # ------------------------------------------------------------------ assistant threads
    async def _assistant_call(self, method: str, args: dict[str, Any]) -> dict[str, Any] | None:
        """The refusal of an ``assistant.threads.*`` call, or None when it is accepted."""
        if (problem := assistant_problem(method, args)) is not None:
            needs = ", ".join(ASSISTANT_REQUIRED[method])
            return _fail(problem, f"{method} takes {needs} (1 to 4 prompts, 10 loading messages)")
        channel = args["channel_id"]
        if self.workspace.channel_problem(channel) or not await self.store.has_messages(channel):
            return _fail("channel_not_found")
        thread_ts = args.get("thread_ts")
        if thread_ts is not None and await self.store.get(channel, str(thread_ts)) is None:
            return _fail("invalid_thread_ts")
        return None

    async def _api_assistant_threads_setStatus(self, args: dict[str, Any]) -> dict[str, Any]:
        if (problem := await self._assistant_call("assistant.threads.setStatus", args)) is not None:
            return problem
        # An empty status clears it.
        await self.store.set_status(args["channel_id"], args["thread_ts"], str(args["status"]))
        return {"ok": True}

    async def _api_assistant_threads_setSuggestedPrompts(
        self, args: dict[str, Any]
    ) -> dict[str, Any]:
        method = "assistant.threads.setSuggestedPrompts"
        return await self._assistant_call(method, args) or {"ok": True}

    async def _api_assistant_threads_setTitle(self, args: dict[str, Any]) -> dict[str, Any]:
        return await self._assistant_call("assistant.threads.setTitle", args) or {"ok": True}

    # ------------------------------------------------------------------ files
    async def _api_files_getUploadURLExternal(self, args: dict[str, Any]) -> dict[str, Any]:
        if (problem := upload_url_problem(args)) is not None:
            return _fail(problem, "files.getUploadURLExternal takes a filename and a length")
        file_id = "F" + secrets.token_hex(5).upper()
        key = f"{file_id}.{secrets.token_urlsafe(12)}"
        await self.store.new_file(file_id, key, str(args["filename"]), int(str(args["length"])))
        return {"ok": True, "upload_url": self.base_url + UPLOAD_PATH + key, "file_id": file_id}

    async def upload(self, key: str, data: bytes) -> bool:
        """The bytes POSTed to an upload URL; False for a URL never given (or already used)."""
        return await self.store.upload_file(key.split(".", 1)[0], key, data)

    async def _api_files_completeUploadExternal(self, args: dict[str, Any]) -> dict[str, Any]:
        wanted = complete_files(args)
        if wanted is None:
            return _fail("invalid_arguments", "files must be a JSON array of {id, title}")
        channel = args.get("channel_id") or args.get("channels") or None
        if channel is not None and (error := self.workspace.channel_problem(channel)):
            return _fail(error, f"no channel {str(channel)[:40]!r} the bot can post to")
        thread_ts = str(args["thread_ts"]) if channel and args.get("thread_ts") else None
        shared: list[dict[str, Any]] = []
        for w in wanted:
            found = await self.store.share_file(w["id"], w["title"], channel, thread_ts)
            if found is None:
                return _fail("file_not_found", f"{w['id']} was not uploaded (or already shared)")
            url = f"{self.base_url}/files/{w['id']}/{quote(found.name, safe='')}"
            bot = self.workspace.bot_user_id
            shared.append(
                file_object(w["id"], found.name, found.title, found.size, url, time.time(), bot)
            )
        if channel is not None:
            content = {"channel": channel, "text": args.get("initial_comment") or ""}
            msg = self.bot_message({**content, "thread_ts": thread_ts})
            msg.files = shared
            await self.post(msg)
        return {"ok": True, "files": [{"id": f["id"], "title": f["title"]} for f in shared]}

    # ------------------------------------------------------------------ people
    async def _api_usergroups_list(self, args: dict[str, Any]) -> dict[str, Any]:
        groups = [
            {
                "id": g.id,
                "team_id": self.workspace.team_id,
                "handle": g.handle,
                "name": g.name,
                "is_usergroup": True,
            }
            for g in self.workspace.usergroups.values()
        ]
        return {"ok": True, "usergroups": groups}

    async def _api_usergroups_users_list(self, args: dict[str, Any]) -> dict[str, Any]:
        group = self.workspace.usergroups.get(str(args.get("usergroup") or ""))
        if group is None:
            return _fail("no_such_subteam")
        return {"ok": True, "users": list(group.members)}

    async def _api_users_info(self, args: dict[str, Any]) -> dict[str, Any]:
        found = self.workspace.user_info(str(args.get("user") or ""))
        if found is None:
            return _fail("user_not_found")
        return {"ok": True, "user": found}


def with_block_ids(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The blocks with a ``block_id`` on each, as Slack stores them: it makes one up (a few
    random characters) for a block sent without one."""
    return [
        b
        if not isinstance(b, dict) or b.get("block_id")
        else {**b, "block_id": secrets.token_urlsafe(4)[:5]}
        for b in blocks
    ]
