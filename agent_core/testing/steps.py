"""Scripted steps for :class:`~agent_core.testing.FakeOpenAI`, and the conversation checks.

:class:`Step` and :class:`ToolCallSpec` are one scripted assistant turn; :func:`reply`,
:func:`call`, :func:`calls`, :func:`filtered` and :func:`raw_response` build them, and
:func:`tool_messages` helps an ``expect``. The helpers below them read a request's task and
check its tool conversation the way the real API does.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]
Expect = Callable[[list[Message]], None]
"""A check run on the request's ``messages`` before a step answers; it raises to fail."""

_call_ids = itertools.count(1)


def _next_call_id() -> str:
    return f"call_{next(_call_ids)}"


@dataclass(frozen=True)
class ToolCallSpec:
    """One tool call of a scripted assistant turn.

    ``arguments`` is the exact string sent on the wire (normally JSON, but any string, to
    test how an agent handles invalid JSON).
    """

    name: str
    arguments: str
    id: str
    # False when the fake chose the id: a server profile then answers in its own id format.
    explicit_id: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Step:
    """One scripted assistant turn: a text reply and/or tool calls.

    Build steps with :func:`reply`, :func:`call` and :func:`calls`.
    """

    content: str | None
    tool_calls: tuple[ToolCallSpec, ...] = ()
    expect: Expect | None = field(default=None, compare=False)
    # (status, content type, body): sent as is instead of a completion (see raw_response).
    raw: tuple[int, str, str] | None = None
    # Reasoning ("thinking") text, rendered the way the server profile sends it.
    reasoning: str | None = None
    # finish_reason override ("length", "content_filter"…).
    finish: str | None = None
    # The content-filter category that fired (see filtered()).
    filter_category: str | None = None

    @property
    def finish_reason(self) -> str:
        """``finish`` when given, else ``"tool_calls"`` when the turn calls tools, else
        ``"stop"``."""
        if self.finish is not None:
            return self.finish
        return "tool_calls" if self.tool_calls else "stop"


def _encode_args(args: Mapping[str, Any] | str) -> str:
    if isinstance(args, str):
        return args
    return json.dumps(dict(args), separators=(",", ":"))


def reply(
    text: str,
    *,
    reasoning: str | None = None,
    finish: str | None = None,
    expect: Expect | None = None,
) -> Step:
    """A turn that answers with ``text`` and no tool call (``finish_reason="stop"`` unless
    ``finish`` says otherwise). ``reasoning`` is sent the way the server profile sends a
    reasoning model's thinking."""
    return Step(content=text, expect=expect, reasoning=reasoning, finish=finish)


def filtered(
    partial: str | None = None, *, category: str = "violence", expect: Expect | None = None
) -> Step:
    """A turn the provider's content filter stopped (``finish_reason="content_filter"``):
    no content, or the ``partial`` text that came before the filter fired. The Azure profile
    also marks ``category`` as filtered in ``content_filter_results``."""
    return Step(content=partial, finish="content_filter", filter_category=category, expect=expect)


def raw_response(
    body: str | Mapping[str, Any] | Sequence[Any],
    *,
    status: int = 200,
    content_type: str | None = None,
    expect: Expect | None = None,
) -> Step:
    """A turn answered with this exact body, as odd servers and relays answer: an HTML page
    with a 200, a 200 carrying an ``error`` object, content as a list of chunks, an error
    body that is a JSON list (Gemini)…

    A mapping or a list is JSON-encoded (``application/json``); a string is sent as is
    (``text/html`` unless ``content_type`` says otherwise).
    """
    if isinstance(body, str):
        text, ctype = body, content_type or "text/html"
    elif isinstance(body, Mapping):
        text, ctype = json.dumps(dict(body)), content_type or "application/json"
    else:
        text, ctype = json.dumps(list(body)), content_type or "application/json"
    return Step(content=None, raw=(status, ctype, text), expect=expect)


def call(
    name: str,
    args: Mapping[str, Any] | str,
    id: str | None = None,
    *,
    content: str | None = None,
    reasoning: str | None = None,
    expect: Expect | None = None,
) -> Step:
    """A turn with a single tool call.

    ``args`` given as a mapping is JSON-encoded; given as a ``str`` it is sent raw. ``id``
    defaults to a process-unique ``call_<n>``, fixed when the step is built, so a repeated
    request gets the same id (a server profile sends it in its own id format). ``content``
    is optional text sent beside the call.
    """
    spec = ToolCallSpec(
        name=name,
        arguments=_encode_args(args),
        id=_next_call_id() if id is None else id,
        explicit_id=id is not None,
    )
    return Step(content=content, tool_calls=(spec,), expect=expect, reasoning=reasoning)


def calls(
    specs: Iterable[tuple[str, Mapping[str, Any] | str] | tuple[str, Mapping[str, Any] | str, str]],
    *,
    content: str | None = None,
    reasoning: str | None = None,
    expect: Expect | None = None,
) -> Step:
    """A turn with several tool calls, given as ``(name, args)`` or ``(name, args, id)``.

    A call without an id gets a process-unique ``call_<n>``, fixed when the step is built
    (a server profile sends it in its own id format); an explicit id is sent as given (empty
    or repeated, as some servers do).
    """
    tool_calls = tuple(
        ToolCallSpec(
            name=spec[0],
            arguments=_encode_args(spec[1]),
            id=spec[2] if len(spec) > 2 else _next_call_id(),
            explicit_id=len(spec) > 2,
        )
        for spec in specs
    )
    if not tool_calls:
        raise ValueError("calls() needs at least one (name, args) pair")
    return Step(content=content, tool_calls=tool_calls, expect=expect, reasoning=reasoning)


def tool_messages(messages: Sequence[Message]) -> list[Message]:
    """The messages with ``role == "tool"``, in order (handy inside an ``expect``)."""
    return [m for m in messages if m.get("role") == "tool"]


def _text_of(content: Any) -> str | None:
    """The text of a message's content: a string, or a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return None


def _task_of(body: Mapping[str, Any]) -> str | None:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            return _text_of(message.get("content"))
    return None


def _check_conversation(messages: list[Any]) -> tuple[str, str] | None:
    """The 400 the real API gives to a malformed tool conversation, as (message, param).

    Every tool call id of an assistant message must be answered by a ``tool`` message before
    the next non-tool message, and every ``tool`` message must answer such a call.
    """
    open_ids: list[str] = []
    open_index = -1
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            return (
                f"Invalid value for 'messages[{index}]': expected an object with a role.",
                f"messages.[{index}]",
            )
        role = message["role"]
        if role == "tool":
            tool_call_id = message.get("tool_call_id")
            if tool_call_id not in open_ids:
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{index}].role",
                )
            open_ids.remove(tool_call_id)
            continue
        if open_ids:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(open_ids)}",
                f"messages.[{open_index}].role",
            )
        if role == "assistant":
            open_ids = [
                str(tc.get("id")) for tc in message.get("tool_calls") or [] if isinstance(tc, dict)
            ]
            open_index = index
    if open_ids:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            f"response messages: {', '.join(open_ids)}",
            f"messages.[{open_index}].role",
        )
    return None


def _error_body(
    message: str, type_: str, *, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _rough_tokens(value: Any) -> int:
    return max(1, len(json.dumps(value, default=str)) // 4)
