"""Reading a Chat Completions response, whatever the server behind ``OPENAI_BASE_URL`` sent.

A 200 answer is not always a usable completion: a wrong base URL returns an HTML page, a
relay returns ``{"error": ...}``, some servers send ``content`` as a list of typed chunks or
``arguments`` as an object. :func:`parse_completion` turns the body into a
:class:`Completion` or raises :class:`ModelResponseError` with a message that names what was
wrong, so the run fails at once with that message instead of being retried as a crash.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from . import provider_errors

# Things that look like credentials, as providers echo them (masked or not) in errors.
_SECRETS = re.compile(
    r"\b(?:sk|rk|pk|xai)-[A-Za-z0-9_\-*.…]{6,}"  # OpenAI-style and xAI keys, masked too
    r"|\bAIza[A-Za-z0-9_\-]{20,}"  # Google API keys (Gemini)
    r"|\bxox[abposr]-[A-Za-z0-9\-]+"  # Slack tokens
    r"|\bxapp-[A-Za-z0-9\-]+"
    r"|(?i:bearer)\s+[A-Za-z0-9_\-.=:+/]{8,}"
)


class ModelResponseError(Exception):
    """The model endpoint answered, but not with a usable completion.

    ``retryable`` when the body reports a provider failure worth trying again at once (a
    relayed 5xx or 429); ``fixable`` unless a later retry of the run would get the same
    answer (a relayed moderation or content-inspection refusal).
    """

    def __init__(self, message: str, *, retryable: bool = False, fixable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.fixable = fixable


def redact_secrets(text: str) -> str:
    """``text`` with anything that looks like an API key or token replaced by ``[redacted]``."""
    return _SECRETS.sub("[redacted]", text)


# The fields of OpenAI's assistant message and tool call that the runner reads or rebuilds
# itself, or that are output only (``annotations``, ``audio``; ``index`` of a streamed or
# Ollama/Mistral call). Any other field is the provider's and is kept as it came.
_MESSAGE_FIELDS = frozenset(
    {"role", "content", "tool_calls", "refusal", "annotations", "audio", "function_call"}
)
_CALL_FIELDS = frozenset({"id", "type", "function", "index"})


@dataclass(frozen=True)
class ToolCall:
    """One tool call requested by the model (``arguments`` as JSON text). ``extra``: the
    provider's own fields of the call (Gemini's ``extra_content``), verbatim."""

    id: str
    name: str
    arguments: str
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class Completion:
    """The first choice of a completion, as the runner needs it. ``extra``: the provider's
    own fields of the message (DeepSeek's ``reasoning_content``), verbatim."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    refusal: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def clean_text(text: str) -> str:
    """``text`` with lone surrogates (which no UTF-8 encoder, nor Redis, accepts) replaced."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def parse_text_body(text: str) -> Any:
    """The JSON of a 200 response that was not labelled JSON; :class:`ModelResponseError`
    when it is not JSON at all (an HTML page from a wrong base URL or a relay)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    head = text[:200].lstrip().lower()
    if head.startswith(("<!doctype", "<html", "<head", "<body")) or "<html" in head:
        what = "HTML"
    elif not text.strip():
        what = "an empty body"
    else:
        what = "text"
    raise ModelResponseError(f"the model endpoint returned {what}, not JSON; check OPENAI_BASE_URL")


def parse_completion(data: Any) -> Completion:
    """The first choice of a Chat Completions response body (already decoded from JSON)."""
    if not isinstance(data, dict):
        raise ModelResponseError(
            f"the model endpoint returned a JSON {type(data).__name__}, not a completion object"
        )
    err = data.get("error")
    if err and not data.get("choices"):
        raise _relayed(err)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ModelResponseError("the response had no choices")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise ModelResponseError("the response's first choice is not an object")
    choice_error = choice.get("error")
    if choice_error or choice.get("finish_reason") == "error":
        # OpenRouter: a failure during generation comes back in a 200, inside the choice.
        if choice_error:
            raise _relayed(choice_error)
        raise ModelResponseError("the model provider returned an error: unknown", retryable=True)
    msg = choice.get("message")
    if not isinstance(msg, dict):
        raise ModelResponseError("the response's first choice has no message")
    content = _content(msg.get("content"))
    raw_calls = msg.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise ModelResponseError("the message's tool_calls is not a list")
    calls = [_tool_call(i, c) for i, c in enumerate(raw_calls)]
    reason = choice.get("finish_reason")
    refusal = msg.get("refusal")
    return Completion(
        content=content,
        tool_calls=calls,
        finish_reason=reason if isinstance(reason, str) else None,
        refusal=clean_text(refusal) if isinstance(refusal, str) and refusal else None,
        extra={k: v for k, v in msg.items() if k not in _MESSAGE_FIELDS},
    )


def _content(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return None if value is None else clean_text(value)
    if isinstance(value, list):
        # Typed chunks (Mistral's reasoning models): keep the text, leave thinking out.
        texts: list[str] = []
        for chunk in value:
            if isinstance(chunk, str):
                texts.append(chunk)
            elif isinstance(chunk, dict) and chunk.get("type") in (None, "text", "output_text"):
                text = chunk.get("text")
                if isinstance(text, str):
                    texts.append(text)
        return clean_text("".join(texts))
    raise ModelResponseError(
        f"the message's content is a {type(value).__name__}, not text or a list of chunks"
    )


def _tool_call(index: int, value: Any) -> ToolCall:
    if not isinstance(value, dict):
        raise ModelResponseError(f"tool call {index} is not an object")
    fn = value.get("function")
    if not isinstance(fn, dict):
        raise ModelResponseError(f"tool call {index} has no function")
    name = fn.get("name")
    if not isinstance(name, str):
        raise ModelResponseError(f"tool call {index} has no function name")
    args = fn.get("arguments")
    if args is None:
        args = ""
    elif isinstance(args, dict):  # some llama.cpp and TGI versions send an object
        args = json.dumps(args, ensure_ascii=False)
    elif not isinstance(args, str):
        raise ModelResponseError(
            f"tool call {index} ({name[:64]}) has arguments of type {type(args).__name__}"
        )
    call_id = value.get("id")
    return ToolCall(
        id=call_id if isinstance(call_id, str) else "",
        name=clean_text(name),
        arguments=clean_text(args),
        extra={k: v for k, v in value.items() if k not in _CALL_FIELDS},
    )


def _error_text(err: Any) -> str:
    text = provider_errors.error_message(err) or json.dumps(err)[:300]
    code = err.get("code") if isinstance(err, dict) else None
    return f"{text} (code {code})" if code not in (None, "") else text


def _relayed(err: Any) -> ModelResponseError:
    """A provider's failure relayed in a 200 (OpenRouter), with its code as the status."""
    code = err.get("code") if isinstance(err, dict) else None
    try:
        status: int | None = int(code)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        status = None
    failure = provider_errors.classify(
        status, err, f"the model provider returned an error: {_error_text(err)}"
    )
    return ModelResponseError(failure.message, retryable=_retryable(err), fixable=failure.retryable)


def _retryable(err: Any) -> bool:
    code = err.get("code") if isinstance(err, dict) else None
    try:
        n = int(code)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return code in ("rate_limit_exceeded", "server_error", "overloaded")
    return n == 429 or 500 <= n <= 599
