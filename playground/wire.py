"""Slack's wire rules, shared by the playground's Web API and the tests' Slack client.

What Slack accepts (Block Kit checked with ``slack_sdk``'s models, message metadata, the size
limits), how it signs the requests it sends (``v0=`` HMAC-SHA256 of ``v0:{timestamp}:{body}``),
how the Web API reads a call's arguments (JSON or form fields, JSON-encoded ``blocks``/``view``
fields), how it pages (an opaque ``cursor``), the per-channel posting limit, and file uploads.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import mimetypes
import threading
import time
from collections.abc import Callable
from typing import Any

from aiohttp import BodyPartReader, web
from slack_sdk.errors import SlackObjectFormationError
from slack_sdk.models.blocks import Block

# Slack has refused messages with about this many characters of blocks (msg_blocks_too_long).
MAX_BLOCKS_CHARS = 13_000
# Slack's own bound on a page of conversations.history / conversations.replies.
MAX_PAGE = 999
# The most blocks a message (50) and a modal (100) may hold.
MAX_MESSAGE_BLOCKS = 50
MAX_VIEW_BLOCKS = 100
# An App Home view: at most 100 blocks (as a modal) and 250 kB (views.publish: view_too_large).
MAX_HOME_BYTES = 250_000
# assistant.threads.setSuggestedPrompts takes up to four prompts; setStatus rotates through
# up to ten loading_messages.
MAX_SUGGESTED_PROMPTS = 4
MAX_LOADING_MESSAGES = 10
# The required arguments of the assistant.threads.* methods (setSuggestedPrompts takes an
# optional thread_ts: without it, the prompts go to the channel's latest thread).
ASSISTANT_REQUIRED = {
    "assistant.threads.setStatus": ("channel_id", "thread_ts", "status"),
    "assistant.threads.setSuggestedPrompts": ("channel_id", "prompts"),
    "assistant.threads.setTitle": ("channel_id", "thread_ts", "title"),
}


def sign(secret: str, timestamp: str, body: str) -> str:
    """The ``X-Slack-Signature`` header Slack sends for ``body`` at ``timestamp``."""
    base = f"v0:{timestamp}:{body}".encode()
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def blocks_problem(
    blocks: Any, max_blocks: int, chars_limit: int | None = MAX_BLOCKS_CHARS
) -> str | None:
    """``None`` when Slack would accept these blocks, else the error Slack would give."""
    return blocks_detail(blocks, max_blocks, chars_limit)[0]


def blocks_detail(
    blocks: Any, max_blocks: int, chars_limit: int | None = MAX_BLOCKS_CHARS
) -> tuple[str | None, str]:
    """Like :func:`blocks_problem`, with a sentence saying which block is wrong and why."""
    if not isinstance(blocks, list):
        return "invalid_blocks", "blocks must be a list"
    if len(blocks) > max_blocks:
        return "invalid_blocks", f"{len(blocks)} blocks; at most {max_blocks} are allowed"
    if chars_limit is not None:
        size = len(json.dumps(blocks, ensure_ascii=False))
        if size > chars_limit:
            return "msg_blocks_too_long", f"{size} characters of blocks (limit ~{chars_limit})"
    for i, b in enumerate(blocks):
        kind: Any = b.get("type") if isinstance(b, dict) else None
        try:
            parsed = Block.parse(b)
            if parsed is None or type(parsed) is Block:
                return "invalid_blocks", f"block {i}: unknown block type {kind!r}"
            # to_dict() validates the block and every element in it (validate_json() checks
            # only the block's own fields: a button's 76-character label would pass).
            parsed.to_dict()
        except (SlackObjectFormationError, KeyError, TypeError, ValueError) as exc:
            return "invalid_blocks", f"block {i} ({kind}): {exc}"
    return None, ""


def metadata_problem(metadata: Any) -> bool:
    """Whether Slack would refuse ``metadata`` (it needs event_type and an event_payload)."""
    return not (
        isinstance(metadata, dict)
        and isinstance(metadata.get("event_type"), str)
        and metadata["event_type"]
        and isinstance(metadata.get("event_payload"), dict)
    )


async def read_args(request: web.Request) -> dict[str, Any]:
    """A Web API call's arguments: query, then JSON or form fields; JSON-encoded fields decoded."""
    args: dict[str, Any] = dict(request.query)
    ctype = request.headers.get("Content-Type", "")
    if request.can_read_body:
        if "application/json" in ctype:
            try:
                data = await request.json()
                if isinstance(data, dict):
                    args.update(data)
            except (ValueError, json.JSONDecodeError):
                args["_raw"] = await request.text()
        else:
            args.update(dict(await request.post()))
    for key in ("blocks", "view", "attachments", "metadata", "prompts", "loading_messages"):
        if isinstance(args.get(key), str):
            try:
                args[key] = json.loads(args[key])
            except json.JSONDecodeError:
                pass
    return args


def assistant_problem(method: str, args: dict[str, Any]) -> str | None:
    """``None`` when Slack would accept this ``assistant.threads.*`` call's arguments, else
    the error it gives: ``invalid_arguments`` for a missing or malformed one (a ``status`` may
    be empty: that clears it), too many prompts or loading messages included."""
    for name in ASSISTANT_REQUIRED[method]:
        value = args.get(name)
        if name == "status" and value == "":
            continue
        if name != "prompts" and (not isinstance(value, str) or not value):
            return "invalid_arguments"
    if method == "assistant.threads.setSuggestedPrompts":
        prompts = args.get("prompts")
        if not isinstance(prompts, list) or not 0 < len(prompts) <= MAX_SUGGESTED_PROMPTS:
            return "invalid_arguments"
        for p in prompts:
            if not isinstance(p, dict) or not all(
                isinstance(p.get(k), str) and p[k] for k in ("title", "message")
            ):
                return "invalid_arguments"
    loading = args.get("loading_messages")
    if loading is not None and (
        not isinstance(loading, list)
        or len(loading) > MAX_LOADING_MESSAGES
        or not all(isinstance(m, str) for m in loading)
    ):
        return "invalid_arguments"
    return None


def bearer(request: web.Request, args: dict[str, Any]) -> str | None:
    """The token of a Web API call: ``Authorization: Bearer …`` or a ``token`` argument."""
    auth = request.headers.get("Authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:]
    token = args.get("token")
    return str(token) if token else None


def truthy(v: Any) -> bool:
    return v is True or str(v).lower() in ("1", "true")


def cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"next:{offset}".encode()).decode()


def cursor_offset(value: str) -> int:
    """The offset an opaque cursor stands for; ``ValueError`` for a cursor we never gave."""
    if not value:
        return 0
    try:
        raw = base64.urlsafe_b64decode(value.encode()).decode()
    except (ValueError, UnicodeDecodeError):
        raise ValueError("invalid cursor") from None
    if not raw.startswith("next:") or not raw[5:].isdigit():  # never a negative offset
        raise ValueError("invalid cursor")
    return int(raw[5:])


# ---------------------------------------------------------------------------------- rate limits
class PostRateLimit:
    """Slack's limit on ``chat.postMessage``: about one message a second per channel, short
    bursts allowed; a post over it is answered HTTP 429 with ``Retry-After`` (whole seconds).

    A token bucket per channel: ``burst`` posts at once, refilled at ``per_second``.
    """

    def __init__(
        self,
        per_second: float = 1.0,
        burst: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_second = per_second
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, channel: str) -> int | None:
        """``None`` when a post to ``channel`` may go now (it is counted); otherwise the
        ``Retry-After`` to answer with, in whole seconds (at least 1)."""
        with self._lock:
            now = self._clock()
            tokens, at = self._buckets.get(channel, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.per_second)
            if tokens >= 1.0:
                self._buckets[channel] = (tokens - 1.0, now)
                return None
            self._buckets[channel] = (tokens, now)
            return max(1, math.ceil((1.0 - tokens) / self.per_second))


# ---------------------------------------------------------------------------------- files
# files.getUploadURLExternal → POST the bytes to the upload URL → files.completeUploadExternal
# (what slack_sdk's files_upload_v2 does). Slack answers an upload with HTTP 200 and a short
# text; a file that was never uploaded, or is completed twice, cannot be shared.
UPLOAD_PATH = "/upload/v1/"


def upload_url_problem(args: dict[str, Any]) -> str | None:
    """``None`` when Slack would give an upload URL for these arguments, else its error."""
    filename, length = args.get("filename"), args.get("length")
    if not isinstance(filename, str) or not filename.strip():
        return "invalid_arguments"
    try:
        n = int(str(length))
    except ValueError:
        return "invalid_arguments"
    return None if n >= 0 else "invalid_arguments"


def complete_files(args: dict[str, Any]) -> list[dict[str, str]] | None:
    """The ``files`` argument of files.completeUploadExternal (a JSON array of ``{id,
    title?}``, as a string or already decoded); ``None`` when malformed."""
    raw = args.get("files")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            return None
    if not isinstance(raw, list) or not raw:
        return None
    out: list[dict[str, str]] = []
    for f in raw:
        if not isinstance(f, dict) or not isinstance(f.get("id"), str) or not f["id"]:
            return None
        title = f.get("title")
        out.append({"id": f["id"], "title": title if isinstance(title, str) else ""})
    return out


async def read_upload(request: web.Request, limit: int) -> bytes | None:
    """The bytes POSTed to an upload URL: the raw body, or the first file of a multipart
    form (Slack takes either); ``None`` when over ``limit`` bytes."""
    if request.content_type.startswith("multipart/"):
        reader = await request.multipart()
        async for part in reader:
            if isinstance(part, BodyPartReader) and (part.filename or part.name == "file"):
                data = await part.read(decode=False)
                return bytes(data) if len(data) <= limit else None
        return b""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def file_object(
    file_id: str, name: str, title: str, size: int, url: str, created: float, user: str
) -> dict[str, Any]:
    """A file as the Web API shows it in a message's ``files`` (the fields the bot and the page
    read)."""
    mimetype = mimetypes.guess_type(name)[0] or "text/plain"
    return {
        "id": file_id,
        "created": int(created),
        "name": name,
        "title": title or name,
        "mimetype": mimetype,
        "filetype": name.rsplit(".", 1)[-1].lower() if "." in name else "text",
        "size": size,
        "user": user,
        "url_private": url,
        "url_private_download": url,
    }
