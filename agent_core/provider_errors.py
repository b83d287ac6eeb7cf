"""What a model provider's error says, whatever its shape, and what it means for the run.

Providers word errors in different JSON shapes: OpenAI's ``{"error": {"message", "code"}}``,
Mistral's unwrapped ``{"object": "error", "message": {"detail": [...]}}``, Gemini's list
``[{"error": {"code", "message", "status"}}]``, xAI's ``{"code": "...", "error": "..."}``,
OpenRouter's ``"Provider returned error"`` with the provider's own body in
``metadata.raw``. :func:`error_message` finds the provider's own words in any of them.

:func:`api_failure` turns a failed call into the run's error and says whether
``/agent retry`` may fix it. Every failure that reaches it has not been retried, or was
retried as long as the budget allowed (429, 5xx): a 4xx is never retried automatically
(see :func:`agent_core.retries.retryable`). A retry is offered when something outside the
run can change (the key, the model name, the account's balance, the provider coming back);
not when the run's own history is what the provider refuses (its content inspection or
moderation, a request too large), since a retry would send the same history again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Imported where a failure is read (api_failure): openai takes most of a second to
    # import, and a process that never calls a model (web, agent-audit, --help) needs none.
    import openai

MESSAGE_LIMIT = 600
"""The most characters of a provider's message the run's error keeps."""

# Codes that name a provider's content inspection of the request: Azure's prompt filter
# (learn.microsoft.com content-filter docs), Alibaba Qwen's (data_inspection_failed, as
# answered by DashScope's compatible mode).
_INSPECTION_CODES = frozenset({"content_filter", "data_inspection_failed"})
# DeepSeek's inspection answers a 400 with this message alone
# (deepseek-ai/awesome-deepseek-integration#13, 666ghj/BettaFish#108).
_INSPECTION_MESSAGES = ("Content Exists Risk",)


def _clip(text: str, limit: int = MESSAGE_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _detail(detail: Any) -> str | None:
    """Pydantic's ``{"detail": [{"msg", "loc"}]}`` (Mistral's 422) in one line."""
    if not isinstance(detail, list):
        return None
    parts = []
    for d in detail[:3]:
        if isinstance(d, dict) and isinstance(d.get("msg"), str):
            loc = d.get("loc")
            where = ".".join(str(p) for p in loc) if isinstance(loc, list) else ""
            parts.append(f"{d['msg']}: {where}" if where else d["msg"])
    return "; ".join(parts) or None


def _message_of(err: Any, depth: int = 0) -> str | None:
    """The human message inside one error value (an object, a string, a list of them)."""
    if depth > 4 or err is None:
        return None
    if isinstance(err, str):
        stripped = err.strip()
        if stripped[:1] in ("{", "["):  # an upstream body relayed as text (metadata.raw)
            try:
                inner = _message_of(json.loads(stripped), depth + 1)
            except (ValueError, RecursionError):
                inner = None
            if inner:
                return inner
        return stripped or None
    if isinstance(err, list):
        found = [m for e in err[:3] if (m := _message_of(e, depth + 1))]
        return "; ".join(found) or None
    if not isinstance(err, dict):
        return str(err)
    if "error" in err and err["error"] not in (None, "", {}):
        return _message_of(err["error"], depth + 1)
    message = err.get("message")
    text: str | None
    if isinstance(message, dict | list):
        text = _detail(message.get("detail")) if isinstance(message, dict) else None
        text = text or _message_of(message, depth + 1)
    elif isinstance(message, str) and message.strip():
        text = message.strip()
    else:
        text = _detail(err.get("detail")) or (
            err["detail"] if isinstance(err.get("detail"), str) else None
        )
    if text is None:
        return None
    meta = err.get("metadata")
    raw = meta.get("raw") if isinstance(meta, dict) else None
    if raw:  # OpenRouter: "Provider returned error", the provider's words in metadata.raw
        upstream = _message_of(raw, depth + 1)
        name = meta.get("provider_name") if isinstance(meta, dict) else None
        if upstream and upstream != text:
            text = f"{text} ({name}: {upstream})" if name else f"{text}: {upstream}"
    status = err.get("status")  # Google's RESOURCE_EXHAUSTED, INVALID_ARGUMENT
    if isinstance(status, str) and status.isupper() and status not in text:
        text = f"{text} ({status})"
    return text


def error_message(body: Any, limit: int = MESSAGE_LIMIT) -> str | None:
    """The provider's own message in an error body of any shape, on one line and at most
    ``limit`` characters; None when the body carries no message."""
    found = _message_of(body)
    return _clip(found, limit) if found else None


def _error_object(body: Any) -> dict[str, Any]:
    """The first error object of a body (OpenAI's ``error``, Gemini's list, Mistral's body)."""
    if isinstance(body, list) and body:
        body = body[0]
    if isinstance(body, dict):
        inner = body.get("error")
        return inner if isinstance(inner, dict) else body
    return {}


def _code(body: Any) -> str:
    code = _error_object(body).get("code")
    return str(code) if code is not None else ""


def billing(body: Any) -> bool:
    """An answer that says the account is out of credits, balance or quota (a 402, or
    OpenAI's 429 ``insufficient_quota``): waiting does not help, topping up does."""
    return _code(body) == "insufficient_quota"


def inspection(body: Any) -> bool:
    """The provider's content inspection refused the request (its content, not its form)."""
    err = _error_object(body)
    inner = err.get("innererror")
    if _code(body) in _INSPECTION_CODES or (
        isinstance(inner, dict) and inner.get("code") == "ResponsibleAIPolicyViolation"
    ):
        return True
    return error_message(body) in _INSPECTION_MESSAGES


def moderation(body: Any) -> bool:
    """A 403 from a moderation step (OpenRouter's: ``metadata.reasons``, ``flagged_input``)
    rather than a key without access."""
    err = _error_object(body)
    meta = err.get("metadata")
    if isinstance(meta, dict) and ("reasons" in meta or "flagged_input" in meta):
        return True
    text = (error_message(body) or "").lower()
    return "moderation" in text or "flagged" in text


@dataclass(frozen=True)
class Failure:
    """What the run's error says, and whether ``/agent retry`` may fix it."""

    message: str
    retryable: bool


def classify(status: int | None, body: Any, text: str) -> Failure:
    """The run's failure for an error answered with HTTP ``status`` (or a relayed code),
    ``body`` its decoded JSON and ``text`` what to show of it."""
    cause, retryable = None, True
    if status == 402 or billing(body):
        cause = "the model provider's account is out of credits or balance; top it up first"
    elif status == 401:
        cause = "the model provider refused the API key (OPENAI_API_KEY)"
    elif status == 403 and moderation(body):
        cause = "the model provider's moderation flagged the request; it would be again"
        retryable = False
    elif status == 403:
        cause = "the API key may not use this model or endpoint"
    elif status == 404:
        cause = "no such model or endpoint: check OPENAI_MODEL and OPENAI_BASE_URL"
    elif status == 413:
        cause = "the request is too large for the model provider; it would be again"
        retryable = False
    elif status == 400 and inspection(body):
        cause = "the model provider's content inspection refused the request; it would again"
        retryable = False
    return Failure(f"{text} — {cause}" if cause else text, retryable)


def _body_of(exc: openai.APIStatusError) -> Any:
    """The whole decoded body (the client keeps only its ``error`` part in ``exc.body``)."""
    try:
        return exc.response.json()
    except (ValueError, RecursionError, UnicodeDecodeError):
        return exc.body


def api_failure(exc: openai.APIError) -> Failure:
    """The run's failure for a model call that ended in ``exc``."""
    import openai  # loaded already: the call that failed was made with it

    kind = type(exc).__name__
    if not isinstance(exc, openai.APIStatusError):
        return Failure(f"model API error ({kind}) {exc.message}", True)
    status = exc.status_code
    body = _body_of(exc)
    text = error_message(body)
    if text is None:
        raw = body if isinstance(body, str) else ""
        head = raw[:200].lstrip().lower()
        if head.startswith(("<!doctype", "<html")) or "<html" in head:
            text = "an HTML page, not an API error: check OPENAI_BASE_URL"
        else:
            text = _clip(raw) or "no error message"
    code = _code(body)
    if code and code != str(status) and code not in text:
        text = f"{text} (code {_clip(code, 80)})"
    return classify(status, body, f"model API error ({kind}) HTTP {status}: {text}")
