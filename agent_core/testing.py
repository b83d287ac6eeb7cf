"""A fake OpenAI-compatible Chat Completions server for tests.

:class:`FakeOpenAI` is a real HTTP server (aiohttp, in a background daemon thread with its own
event loop, on a free port of 127.0.0.1) that speaks the Chat Completions wire format. Point
any OpenAI client at :attr:`FakeOpenAI.base_url`; it serves in-process code and worker
subprocesses alike.

Answers are scripted per task::

    with FakeOpenAI() as fake:
        fake.script("delete user 42", [
            call("delete_user", {"user_id": 42}),
            reply("Done: user 42 is deleted."),
        ])

A request belongs to the script whose task equals the content of its first ``user`` message.
The step that answers it is chosen without state: its index is the number of ``assistant``
messages already in the request, so a retried or recovered request gets the same answer.

Anything unexpected (no script for the task, more turns than steps, a failing ``expect``, a
malformed conversation) is answered with an OpenAI-format error and recorded in
:attr:`FakeOpenAI.errors`; a test fixture should fail the test when that list is not empty.

Server profiles: ``FakeOpenAI(server="mistral")`` behaves like that server (see
:data:`SERVERS`). It enforces the request rules the real server documents or is known (from
public issues) to enforce on what the client sends, answering the status and error body the
real server answers and recording the violation in :attr:`FakeOpenAI.errors`; and it answers
scripted steps in that server's response shapes (its tool-call id format, extra fields,
reasoning fields, content filter annotations…). Each rule and shape names its source next to
it. ``quirks`` turns on version-specific oddities (:data:`QUIRKS`); ``upstream`` puts a relay
(LiteLLM, OpenRouter) in front of another server, whose rules then apply.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import math
import re
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, get_args

from aiohttp import web

__all__ = [
    "QUIRKS",
    "SERVERS",
    "Expect",
    "FakeOpenAI",
    "ServerName",
    "Step",
    "ToolCallSpec",
    "Violation",
    "call",
    "calls",
    "filtered",
    "raw_response",
    "reply",
    "tool_messages",
]

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
    body: str | Mapping[str, Any],
    *,
    status: int = 200,
    content_type: str | None = None,
    expect: Expect | None = None,
) -> Step:
    """A turn answered with this exact body, as odd servers and relays answer: an HTML page
    with a 200, a 200 carrying an ``error`` object, content as a list of chunks…

    A mapping is JSON-encoded (``application/json``); a string is sent as is
    (``text/html`` unless ``content_type`` says otherwise).
    """
    if isinstance(body, str):
        text, ctype = body, content_type or "text/html"
    else:
        text, ctype = json.dumps(dict(body)), content_type or "application/json"
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


# =============================================================================== server profiles
#
# Each profile: the request rules the server enforces (checked in order, the first violation
# wins), the status and body it refuses with, its tool-call id format, the extra fields and
# quirks of its responses, and its 429. Every rule and shape cites where it comes from; where
# a detail (an exact wording) is not sourced, the comment says so.

ServerName = Literal[
    "openai", "azure", "ollama", "vllm", "llamacpp", "litellm", "openrouter", "groq", "mistral"
]
SERVERS: tuple[ServerName, ...] = get_args(ServerName)
"""Every server profile :class:`FakeOpenAI` has."""

_RELAYS = ("litellm", "openrouter")

QUIRKS: Mapping[str, str] = {
    # llama-server returned arguments as a JSON object (ggml-org/llama.cpp#20198); TGI did
    # the same (huggingface/text-generation-inference#2136).
    "object_arguments": "function.arguments as a JSON object, not a string",
    # llama-server sent tool calls without an id (ggml-org/llama.cpp#11992)…
    "missing_ids": "tool calls without an id field",
    # …and with an empty one (ggml-org/llama.cpp#12279, fixed by #12292).
    "empty_ids": 'tool calls whose id is ""',
    # Ollama's OpenAI API before ollama/ollama#5995 (July 2024); vLLM with a required or named
    # tool_choice (vllm-project/vllm#25054); OpenAI's gpt-4o at times (ollama/ollama#7963).
    "stop_with_tool_calls": 'finish_reason "stop" on a turn with tool calls',
}
"""Version-specific response oddities a profile can be asked to reproduce."""

# Provider names as relays print them (OpenRouter's "provider" field, LiteLLM's exceptions).
_PROVIDER_NAMES: Mapping[str, str] = {
    "openai": "OpenAI",
    "azure": "Azure",
    "ollama": "Ollama",
    "vllm": "vLLM",
    "llamacpp": "llama.cpp",
    "groq": "Groq",
    "mistral": "Mistral",
}


@dataclass(frozen=True)
class Violation:
    """A request rule the server enforces, broken by a request, and how the server words it."""

    rule: str
    message: str
    status: int = 400
    param: str | None = None
    code: str | None = None
    type: str | None = None
    # Mistral's pydantic validation (422): where the bad field is, and its value.
    loc: tuple[Any, ...] | None = None
    input: Any = None


Rule = Callable[[list[Message], Mapping[str, Any]], Violation | None]


def _calls_of(message: Message) -> list[Message]:
    return [tc for tc in message.get("tool_calls") or [] if isinstance(tc, dict)]


def _history_arguments(messages: list[Message]) -> Iterator[tuple[int, int, Any]]:
    for i, m in enumerate(messages):
        if m.get("role") == "assistant":
            for j, tc in enumerate(_calls_of(m)):
                fn = tc.get("function")
                if isinstance(fn, dict) and "arguments" in fn:
                    yield i, j, fn["arguments"]


def _rule_tool_answers(messages: list[Message], body: Mapping[str, Any]) -> Violation | None:
    # Every tool_call id answered by a tool message, and no tool message answering nothing.
    # OpenAI's wording (BerriAI/litellm#10083, agno-agi/agno#3105). Applied to every profile:
    # it is the portable rule (Mistral: see _rule_mistral_tool_answers); that each local
    # server refuses such a history is not documented.
    problem = _check_conversation(messages)
    if problem is None:
        return None
    message, param = problem
    return Violation("tool_calls_answered", message, param=param)


def _rule_openai_null_content(messages: list[Message], body: Mapping[str, Any]) -> Violation | None:
    # An assistant message with neither content nor tool_calls: "Invalid value for 'content':
    # expected a string, got null." (docker/docker-agent#63; vercel/ai#13744).
    for i, m in enumerate(messages):
        if m.get("role") == "assistant" and m.get("content") is None and not m.get("tool_calls"):
            return Violation(
                "openai.assistant_content",
                "Invalid value for 'content': expected a string, got null.",
                param=f"messages.[{i}].content",
            )
    return None


def _rule_openai_id_length(messages: list[Message], body: Mapping[str, Any]) -> Violation | None:
    # Tool-call ids of at most 40 characters (agno-agi/agno#5382, camel-ai/camel#2215). One
    # 2026 reproduction could not trigger it (vercel/ai#17233): the limit may have been lifted.
    for i, m in enumerate(messages):
        for j, tc in enumerate(_calls_of(m)):
            cid = tc.get("id")
            if isinstance(cid, str) and len(cid) > 40:
                return Violation(
                    "openai.tool_call_id_length",
                    f"Invalid 'messages[{i}].tool_calls[{j}].id': string too long. Expected a "
                    f"string with maximum length 40, but got a string with length {len(cid)} "
                    "instead.",
                    param=f"messages[{i}].tool_calls[{j}].id",
                    code="string_above_max_length",
                )
    return None


def _rule_openai_tool_description(
    messages: list[Message], body: Mapping[str, Any]
) -> Violation | None:
    # A tool description of at most 1,024 characters (rusiaaman/wcgw#51).
    for i, t in enumerate(body.get("tools") or []):
        fn = t.get("function") if isinstance(t, dict) else None
        desc = fn.get("description") if isinstance(fn, dict) else None
        if isinstance(desc, str) and len(desc) > 1024:
            return Violation(
                "openai.tool_description_length",
                f"Invalid 'tools[{i}].function.description': string too long. Expected a string "
                f"with maximum length 1024, but got a string with length {len(desc)} instead.",
                param=f"tools[{i}].function.description",
                code="string_above_max_length",
            )
    return None


def _go_type(value: Any) -> str:
    """How Go's %T prints a decoded JSON value (for Ollama's wording)."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "float64"
    if isinstance(value, dict):
        return "map[string]interface {}"
    return type(value).__name__


def _rule_ollama_content(messages: list[Message], body: Mapping[str, Any]) -> Violation | None:
    # Ollama's OpenAI API takes content only as a string or a list of parts: null (or a
    # missing content, decoded as nil) is a 400 "invalid message content type: <nil>", tool
    # calls or not (pydantic/pydantic-ai#5206, SAIL-Research-Lab/cheetahclaws#71).
    for m in messages:
        content = m.get("content")
        if not isinstance(content, str | list):
            return Violation(
                "ollama.content_type", f"invalid message content type: {_go_type(content)}"
            )
    return None


def _rule_vllm_arguments(messages: list[Message], body: Mapping[str, Any]) -> Violation | None:
    # vLLM json.loads() every history tool call's arguments before the chat template; text
    # that is not JSON fails the whole request with a 400 carrying the decoder's message
    # (vllm-project/vllm#43995; local-inference-lab/vllm#684); "" becomes {}.
    for _i, _j, args in _history_arguments(messages):
        if isinstance(args, str) and args:
            try:
                json.loads(args)
            except (ValueError, RecursionError) as exc:
                return Violation("vllm.history_arguments", str(exc))
    return None


def _rule_llamacpp_arguments(messages: list[Message], body: Mapping[str, Any]) -> Violation | None:
    # llama-server parses every history tool call's string arguments as JSON and answers a
    # 500 "Failed to parse tool call arguments as JSON: [json.exception.parse_error.101] …"
    # on text that is not JSON (ggml-org/llama.cpp#22948, am17an/llama.cpp#43 for upstream
    # #25510, OpenHands/OpenHands#13949). The text after the prefix is nlohmann::json's and
    # only approximated here; "" is refused too (nlohmann cannot parse it; not verified).
    for _i, _j, args in _history_arguments(messages):
        if isinstance(args, str):
            try:
                json.loads(args)
            except (ValueError, RecursionError) as exc:
                line, col = getattr(exc, "lineno", 1), getattr(exc, "colno", 1)
                return Violation(
                    "llamacpp.history_arguments",
                    "Failed to parse tool call arguments as JSON: [json.exception.parse_error."
                    f"101] parse error at line {line}, column {col}: syntax error while "
                    "parsing value",
                    status=500,
                )
    return None


def _rule_llamacpp_id_types(messages: list[Message], body: Mapping[str, Any]) -> Violation | None:
    # llama-server reads a tool call's id and a tool message's tool_call_id as strings when
    # present; anything else is a 500 (sigoden/aichat#1296). nlohmann::json's type-error
    # wording.
    for m in messages:
        values = [tc["id"] for tc in _calls_of(m) if "id" in tc]
        if m.get("role") == "tool" and "tool_call_id" in m:
            values.append(m["tool_call_id"])
        for v in values:
            if not isinstance(v, str):
                return Violation(
                    "llamacpp.id_type",
                    f"[json.exception.type_error.302] type must be string, but is {_go_type(v)}",
                    status=500,
                )
    return None


_MISTRAL_ID = re.compile(r"[A-Za-z0-9]{9}")


def _rule_mistral_ids(messages: list[Message], body: Mapping[str, Any]) -> Violation | None:
    # Tool-call ids (and the tool messages' tool_call_id) of exactly 9 characters of
    # [A-Za-z0-9]: "Tool call id was … but must be a-z, A-Z, 0-9, with a length of 9."
    # (jackmpcollins/magentic#276, langchain-ai/langchain#24668, openclaw/openclaw#23740).
    for m in messages:
        ids: list[Any] = [tc.get("id") for tc in _calls_of(m)]
        if m.get("role") == "tool":
            ids.append(m.get("tool_call_id"))
        for cid in ids:
            if not (isinstance(cid, str) and _MISTRAL_ID.fullmatch(cid)):
                return Violation(
                    "mistral.tool_call_id",
                    f"Tool call id was {cid} but must be a-z, A-Z, 0-9, with a length of 9.",
                )
    return None


# The fields Mistral's message schemas accept; any other is a 422 extra_forbidden, e.g. a
# user message's "name" (Gage-Technologies/mistral-go#2, nomtek/mistralai_client_dart#44) or an
# assistant's "reasoning_content" (BerriAI/litellm#30835, charmbracelet/crush#1590). Fields from
# mistralai/client-python's models (AssistantMessage: content, tool_calls, prefix).
_MISTRAL_FIELDS: Mapping[str, frozenset[str]] = {
    "system": frozenset({"role", "content"}),
    "user": frozenset({"role", "content"}),
    "assistant": frozenset({"role", "content", "tool_calls", "prefix"}),
    "tool": frozenset({"role", "content", "tool_call_id", "name"}),
}


def _rule_mistral_extra(messages: list[Message], body: Mapping[str, Any]) -> Violation | None:
    for i, m in enumerate(messages):
        role = str(m.get("role"))
        allowed = _MISTRAL_FIELDS.get(role, frozenset(m))
        for key in m:
            if key not in allowed:
                return Violation(
                    "mistral.extra_fields",
                    "Extra inputs are not permitted",
                    status=422,
                    loc=("body", "messages", i, role, key),
                    input=m[key],
                )
    return None


def _rule_mistral_empty_assistant(
    messages: list[Message], body: Mapping[str, Any]
) -> Violation | None:
    # "Assistant message must have either content or tool_calls, but not none."
    # (OpenHands/OpenHands#8685). Content "" beside tool calls is accepted
    # (langchain-ai/langchain#21201); the 2024 "but not both" rule (#21196) is not enforced
    # any more as far as public reports show (QuantumNous/new-api#1182), so it is not here.
    for m in messages:
        if m.get("role") == "assistant" and not m.get("content") and not m.get("tool_calls"):
            return Violation(
                "mistral.empty_assistant",
                "Assistant message must have either content or tool_calls, but not none.",
            )
    return None


def _rule_mistral_tool_answers(
    messages: list[Message], body: Mapping[str, Any]
) -> Violation | None:
    # "Not the same number of function calls and responses" (mistralai/client-ts#106,
    # camel-ai/camel#1467, mistralai/client-python#234).
    if _check_conversation(messages) is None:
        return None
    return Violation(
        "mistral.tool_calls_answered", "Not the same number of function calls and responses"
    )


def _rule_mistral_order(messages: list[Message], body: Mapping[str, Any]) -> Violation | None:
    # Roles in Mistral's order: no user right after a tool result ("Unexpected role 'user'
    # after role 'tool'", NousResearch/hermes-agent#20154), no tool result but after an
    # assistant's calls or another result (charmbracelet/crush#279, relayed by OpenRouter with
    # type invalid_request_message_order, code 3230), and the last message a user or tool one
    # ("Expected last role User or Tool (or Assistant with prefix True) for serving but got
    # assistant", NEKOparapa/AiNiee#641, huggingface/smolagents#757).
    for prev, cur in itertools.pairwise(messages):
        before, role = prev.get("role"), cur.get("role")
        calling = before == "assistant" and bool(prev.get("tool_calls"))
        if (role == "user" and before == "tool") or (
            role == "tool" and before != "tool" and not calling
        ):
            return Violation(
                "mistral.role_order",
                f"Unexpected role '{role}' after role '{before}'",
                type="invalid_request_message_order",
                code="3230",
            )
    last = messages[-1] if messages else {}
    if last.get("role") not in ("user", "tool") and not (
        last.get("role") == "assistant" and last.get("prefix") is True
    ):
        return Violation(
            "mistral.last_role",
            "Expected last role User or Tool (or Assistant with prefix True) for serving but "
            f"got {last.get('role')}",
        )
    return None


def _rule_groq_unsupported(messages: list[Message], body: Mapping[str, Any]) -> Violation | None:
    # "The following fields are currently not supported and will result in a 400 error …:
    # logprobs, logit_bias, top_logprobs, messages[].name; if N is supplied, it must be equal
    # to 1" (console.groq.com/docs/openai). The docs give no wording: this one is ours.
    for key in ("logprobs", "logit_bias", "top_logprobs"):
        if key in body:
            return Violation("groq.unsupported", f"'{key}' is not supported", param=key)
    if "n" in body and body["n"] != 1:
        return Violation("groq.unsupported", "'n' : number must be at most 1", param="n")
    for i, m in enumerate(messages):
        if "name" in m:
            return Violation(
                "groq.unsupported", "'name' is not supported", param=f"messages.{i}.name"
            )
    return None


def _derive(seed: str, alphabet: str, n: int) -> str:
    """``n`` characters of ``alphabet`` derived from ``seed``: a stable, server-style id."""
    number = int.from_bytes(hashlib.sha256(seed.encode()).digest(), "big")
    out = []
    for _ in range(n):
        number, digit = divmod(number, len(alphabet))
        out.append(alphabet[digit])
    return "".join(out)


_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def _server_call_id(server: str, seed: str) -> str:
    """The tool-call id ``server`` would generate, derived from the scripted id."""
    if server == "mistral":  # 9 alphanumerics, e.g. "gdRdrvnHh" (microsoft/autogen#2892)
        return _derive(seed, _ALNUM, 9)
    if server == "ollama":  # "call_p7o2gz50" (ollama/ollama-python#667)
        return "call_" + _derive(seed, "abcdefghijklmnopqrstuvwxyz0123456789", 8)
    if server == "vllm":  # "chatcmpl-tool-3a25abfa…" (abetlen/llama-cpp-python#1784)
        return "chatcmpl-tool-" + hashlib.sha256(seed.encode()).hexdigest()[:32]
    if server == "llamacpp":  # gen_tool_call_id(): 32 random [0-9A-Za-z] (server-common.cpp)
        return _derive(seed, _ALNUM, 32)
    return seed  # OpenAI-style "call_…", as scripted


def _openai_error(v: Violation) -> tuple[int, dict[str, Any]]:
    # {"error": {"message", "type", "param", "code"}} (OpenAI; agno-agi/agno#5382).
    return v.status, _error_body(v.message, "invalid_request_error", code=v.code, param=v.param)


def _azure_error(v: Violation) -> tuple[int, dict[str, Any]]:
    # Azure's 400 adds "status" to OpenAI's shape (learn.microsoft.com content-filter docs).
    status, body = _openai_error(v)
    body["error"]["status"] = status
    return status, body


def _ollama_error(v: Violation) -> tuple[int, dict[str, Any]]:
    # {"error": {"message", "type": "invalid_request_error", "param": null, "code": null}}
    # (pydantic/pydantic-ai#5206).
    return v.status, _error_body(v.message, "invalid_request_error")


def _vllm_error(v: Violation) -> tuple[int, dict[str, Any]]:
    # {"error": {"message", "type": "BadRequestError", "param": null, "code": 400}}
    # (vllm-project/vllm#43995).
    return v.status, {
        "error": {"message": v.message, "type": "BadRequestError", "param": None, "code": v.status}
    }


def _llamacpp_error(v: Violation) -> tuple[int, dict[str, Any]]:
    # format_error_response(): {"code", "message", "type"} under "error"
    # (tools/server/server-common.cpp; ggml-org/llama.cpp#23542).
    type_ = "server_error" if v.status >= 500 else "invalid_request_error"
    return v.status, {"error": {"code": v.status, "message": v.message, "type": type_}}


def _mistral_error(v: Violation) -> tuple[int, dict[str, Any]]:
    # No "error" wrapper: {"object": "error", "message", "type", "param", "code"}; a 422's
    # message is pydantic's {"detail": [...]} (Gage-Technologies/mistral-go#2, mistralai/
    # client-ts#106). Newer answers carry a numeric code (3230, mistralai/client-python#234).
    message: Any = v.message
    if v.loc is not None:
        message = {
            "detail": [
                {"type": "extra_forbidden", "loc": list(v.loc), "msg": v.message, "input": v.input}
            ]
        }
    return v.status, {
        "object": "error",
        "message": message,
        "type": v.type or "invalid_request_error",
        "param": None,
        "code": v.code,
    }


def _groq_error(v: Violation) -> tuple[int, dict[str, Any]]:
    # {"error": {"message", "type", "code"?}} (crewAIInc/crewAI#494 shows the 429's).
    error: dict[str, Any] = {"message": v.message, "type": "invalid_request_error"}
    if v.param is not None:
        error["param"] = v.param
    return v.status, {"error": error}


def _error_text(body: Mapping[str, Any]) -> str:
    err = body.get("error")
    message = err.get("message") if isinstance(err, dict) else body.get("message")
    return message if isinstance(message, str) else json.dumps(message)


def _openrouter_relay(status: int, body: dict[str, Any], upstream: str) -> dict[str, Any]:
    # A provider's refusal comes back as "Provider returned error" with the provider's body in
    # metadata.raw (openrouter.ai/docs/api/reference/errors-and-debugging;
    # openclaw/openclaw#57672 shows Mistral's id rule relayed that way).
    return {
        "error": {
            "code": status,
            "message": "Provider returned error",
            "metadata": {"raw": json.dumps(body), "provider_name": _PROVIDER_NAMES[upstream]},
        }
    }


_LITELLM_CLASSES: Mapping[int, str] = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
}


def _litellm_relay(status: int, body: dict[str, Any], upstream: str) -> dict[str, Any]:
    # "litellm.BadRequestError: MistralException - …", code as a string
    # (BerriAI/litellm#30882, #10083; jasonacox/TinyLLM#17 for the 429's "type").
    cls = _LITELLM_CLASSES.get(status, "InternalServerError" if status >= 500 else "APIError")
    provider = _PROVIDER_NAMES[upstream].replace(".", "")
    return {
        "error": {
            "message": f"litellm.{cls}: {provider}Exception - {_error_text(body)}",
            "type": "throttling_error" if status == 429 else None,
            "param": None,
            "code": str(status),
        }
    }


_RULES: Mapping[str, tuple[Rule, ...]] = {
    "openai": (
        _rule_tool_answers,
        _rule_openai_null_content,
        _rule_openai_id_length,
        _rule_openai_tool_description,
    ),
    # Azure serves OpenAI's models behind OpenAI's validation.
    "azure": (
        _rule_tool_answers,
        _rule_openai_null_content,
        _rule_openai_id_length,
        _rule_openai_tool_description,
    ),
    "ollama": (_rule_ollama_content, _rule_tool_answers),
    "vllm": (_rule_vllm_arguments, _rule_tool_answers),
    "llamacpp": (_rule_llamacpp_id_types, _rule_llamacpp_arguments, _rule_tool_answers),
    "groq": (_rule_groq_unsupported, _rule_tool_answers),
    "mistral": (
        _rule_mistral_extra,
        _rule_mistral_ids,
        _rule_mistral_empty_assistant,
        _rule_mistral_tool_answers,
        _rule_mistral_order,
    ),
}

_REFUSALS: Mapping[str, Callable[[Violation], tuple[int, dict[str, Any]]]] = {
    "openai": _openai_error,
    "azure": _azure_error,
    "ollama": _ollama_error,
    "vllm": _vllm_error,
    "llamacpp": _llamacpp_error,
    "groq": _groq_error,
    "mistral": _mistral_error,
}


def _filter_results(category: str | None) -> dict[str, Any]:
    results: dict[str, Any] = {
        c: {"filtered": False, "severity": "safe"}
        for c in ("hate", "self_harm", "sexual", "violence")
    }
    if category is not None:
        results[category] = {"filtered": True, "severity": "high"}
    return results


def _shape(
    server: str,
    upstream: str | None,
    completion: dict[str, Any],
    step: Step,
    quirks: Collection[str],
) -> None:
    """Turn an OpenAI-shaped completion into ``server``'s shape, in place."""
    choice = completion["choices"][0]
    message = choice["message"]
    calls = message.get("tool_calls") or []
    if server == "azure":
        # prompt_filter_results beside the choices, content_filter_results in each choice,
        # one entry per category with filtered/severity (learn.microsoft.com/azure/ai-services
        # /openai/concepts/content-filter); a filtered answer has no content and
        # finish_reason "content_filter" (same page).
        completion["prompt_filter_results"] = [
            {"prompt_index": 0, "content_filter_results": _filter_results(None)}
        ]
        choice["content_filter_results"] = _filter_results(step.filter_category)
    elif server == "ollama":
        # system_fingerprint "fp_ollama"; content "" (not null) beside tool calls, each call
        # with an "index" (ollama/ollama#5995 sets Content = ""; ollama-python#667 shows a
        # call). No refusal field. Thinking is not rendered (not verified for /v1).
        completion["system_fingerprint"] = "fp_ollama"
        message.pop("refusal", None)
        if calls and message["content"] is None:
            message["content"] = ""
        for k, tc in enumerate(calls):
            tc["index"] = k
    elif server == "vllm":
        # reasoning_content on every message, null without a reasoning parser
        # (docs.vllm.ai/en/v0.8.3/features/reasoning_outputs; renamed "reasoning" in 0.11),
        # and a stop_reason beside finish_reason.
        message["reasoning_content"] = step.reasoning
        choice["stop_reason"] = None
    elif server == "llamacpp":
        # reasoning_content for thinking models (ggml-org/llama.cpp#11992 shows one), a build
        # fingerprint and "timings" (tools/server/README.md).
        completion["system_fingerprint"] = "b4761-cad53fc9"
        completion["timings"] = {
            "prompt_n": 12,
            "prompt_ms": 30.5,
            "predicted_n": 9,
            "predicted_ms": 61.2,
        }
        message.pop("refusal", None)
        if step.reasoning is not None:
            message["reasoning_content"] = step.reasoning
    elif server == "mistral":
        # content "" beside tool calls, ids of 9 alphanumerics (microsoft/autogen#2892);
        # reasoning models (Magistral) send content as typed chunks:
        # [{"type": "thinking", "thinking": [{"type": "text", "text": …}]}, {"type": "text",
        # "text": …}] (docs.mistral.ai reasoning; spring-projects/spring-ai#5020;
        # mistralai ThinkChunk). Each call carries an "index".
        message.pop("refusal", None)
        if calls and message["content"] is None:
            message["content"] = ""
        if step.reasoning is not None:
            chunks: list[dict[str, Any]] = [
                {"type": "thinking", "thinking": [{"type": "text", "text": step.reasoning}]}
            ]
            if message["content"]:
                chunks.append({"type": "text", "text": message["content"]})
            message["content"] = chunks
        for k, tc in enumerate(calls):
            tc["index"] = k
    elif server == "groq":
        # x_groq.id and timing fields in usage (console.groq.com/docs, "x_groq": {"id":
        # "req_…"}).
        message.pop("refusal", None)
        completion["x_groq"] = {"id": "req_" + _derive(completion["id"], _ALNUM[26:52], 26)}
        completion["usage"].update(
            {"queue_time": 0.01, "prompt_time": 0.009, "completion_time": 0.08, "total_time": 0.09}
        )
    elif server == "openrouter":
        # "provider" names the upstream (docs.rs openrouter Response), native_finish_reason
        # beside the normalised finish_reason (openrouter.ai/announcements/standardized-
        # finish-reasons), thinking in message.reasoning (OpenRouter reasoning tokens docs).
        completion["provider"] = _PROVIDER_NAMES[upstream or "openai"]
        choice["native_finish_reason"] = choice["finish_reason"]
        if step.reasoning is not None:
            message["reasoning"] = step.reasoning
    elif server == "litellm":
        # The proxy answers in OpenAI's shape whatever the upstream; thinking in
        # reasoning_content (its standard field, BerriAI/litellm#30835).
        if step.reasoning is not None:
            message["reasoning_content"] = step.reasoning
    if "stop_with_tool_calls" in quirks and calls:
        choice["finish_reason"] = "stop"
    for tc in calls:
        if "object_arguments" in quirks:
            try:
                parsed = json.loads(tc["function"]["arguments"])
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                tc["function"]["arguments"] = parsed
        if "missing_ids" in quirks:
            tc.pop("id", None)
        elif "empty_ids" in quirks:
            tc["id"] = ""


def _reset_value(header: str, left: float) -> str:
    """How ``header`` says "``left`` seconds" on the wire."""
    h = header.lower()
    ms = max(1, math.ceil(left * 1000))  # rounded up: a client waiting it is not early
    if h == "retry-after-ms":
        return str(ms)
    if h in ("retry-after", "x-rate-limit-reset-tokens"):  # whole seconds
        return str(math.ceil(ms / 1000))
    return f"{ms / 1000:.3f}s"  # x-ratelimit-reset-*: "6s", "1m30s", "20ms" (OpenAI, Groq)


def _too_many_requests(
    server: str, upstream: str | None, left: float, header: str | None, model: str
) -> tuple[dict[str, str], dict[str, Any]]:
    """The headers and body of ``server``'s 429 while ``left`` seconds of limit remain."""
    wait = max(1, math.ceil(left))
    body: dict[str, Any]
    if server == "groq":
        # retry-after (seconds, on 429 only) plus the x-ratelimit-* headers, which are always
        # sent (console.groq.com/docs/rate-limits, quoted in Pythagora-io/gpt-pilot#862); body
        # from crewAIInc/crewAI#494.
        headers = {
            "retry-after": str(wait),
            "x-ratelimit-limit-requests": "14400",
            "x-ratelimit-limit-tokens": "6000",
            "x-ratelimit-remaining-requests": "14399",
            "x-ratelimit-remaining-tokens": "0",
            "x-ratelimit-reset-requests": "2m59.56s",
            "x-ratelimit-reset-tokens": _reset_value("x-ratelimit-reset-tokens", left),
        }
        body = {
            "error": {
                "message": f"Rate limit reached for model `{model}` in organization `org_fake` "
                f"service tier `on_demand` on tokens per minute (TPM): Limit 6000, Used 5800, "
                f"Requested 400. Please try again in {left:.3f}s. Visit "
                "https://console.groq.com/docs/rate-limits for more information.",
                "type": "tokens",
                "code": "rate_limit_exceeded",
            }
        }
    elif server == "azure":
        # Retry-After in seconds (icereed/paperless-gpt#814, Azure/azure-rest-api-specs#24904);
        # some deployments sent only "x-rate-limit-reset-tokens: 55" (openai/openai-python#937):
        # pass that as ``header``. Body: jasonacox/TinyLLM#17.
        headers = {"retry-after": str(wait)}
        body = {
            "error": {
                "code": "429",
                "message": "Requests to the ChatCompletions_Create Operation under Azure OpenAI "
                "API version 2024-10-21 have exceeded token rate limit of your current OpenAI "
                f"S0 pricing tier. Please retry after {wait} seconds. Please go here: "
                "https://aka.ms/oai/quotaincrease if you would like to further increase the "
                "default rate limit.",
            }
        }
    elif server == "openrouter":
        # Retry-After on 429 (openrouter.ai/docs/api/errors); the provider's limit relayed as
        # "Provider returned error" with metadata.raw, provider_name and retry_after_seconds
        # (as in an OpenRouter 429 quoted in a public error log; the metadata is not in the
        # docs).
        headers = {"Retry-After": str(wait)}
        body = {
            "error": {
                "code": 429,
                "message": "Provider returned error",
                "metadata": {
                    "raw": f"{model} is temporarily rate-limited upstream. Please retry shortly.",
                    "provider_name": _PROVIDER_NAMES[upstream or "openai"],
                    "retry_after_seconds": wait,
                },
            }
        }
    else:
        # OpenAI: x-ratelimit-reset-tokens ("6m0s" style) and a TPM message
        # (BuilderIO/micro-agent#86). The other profiles have no documented 429 of their own:
        # OpenAI's stands in.
        headers = {"x-ratelimit-reset-tokens": _reset_value("x-ratelimit-reset-tokens", left)}
        body = _error_body(
            f"Rate limit reached for {model} in organization org-fake on tokens per min (TPM): "
            f"Limit 30000, Used 30000, Requested 385. Please try again in {left:.3f}s "
            "(injected by FakeOpenAI.rate_limit).",
            "tokens",
            code="rate_limit_exceeded",
        )
        if server == "litellm":
            body = _litellm_relay(429, body, upstream or "openai")
    if header is not None:  # one hint, named by the test
        headers = {header: _reset_value(header, left)}
    return headers, body


class FakeOpenAI:
    """A scripted, OpenAI-compatible Chat Completions server on 127.0.0.1.

    Use it as a context manager or call :meth:`start` / :meth:`stop`. It serves:

    - ``POST /v1/chat/completions``: scripted answers (see :meth:`script`);
    - ``GET /v1/models``: a one-model list.

    Every request needs ``Authorization: Bearer <key>`` (any non-empty key, or exactly
    ``api_key`` when given), else 401 in OpenAI's error format. With ``validate=True`` (the
    default) a request that the real server refuses (for every server: a tool call id with no
    tool message, a tool message answering no call; then the rules of ``server``) gets the
    server's refusal and is recorded in :attr:`errors`.

    ``server`` picks the profile (:data:`SERVERS`, default ``"openai"``); ``upstream`` the
    server behind a relay (``"litellm"``, ``"openrouter"``; default ``"openai"``), whose rules
    and tool-call ids apply and whose refusals come back in the relay's error shape;
    ``quirks`` the version-specific oddities to reproduce (:data:`QUIRKS`).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        model: str = "gpt-4o-mini",
        validate: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
        server: ServerName = "openai",
        upstream: ServerName | None = None,
        quirks: Collection[str] = (),
    ) -> None:
        if server not in SERVERS:
            raise ValueError(f"unknown server {server!r}; known: {', '.join(SERVERS)}")
        if upstream is not None and (server not in _RELAYS or upstream in _RELAYS):
            raise ValueError("upstream is for a relay (litellm, openrouter) in front of a server")
        unknown = sorted(set(quirks) - set(QUIRKS))
        if unknown:
            raise ValueError(f"unknown quirks {unknown}; known: {', '.join(QUIRKS)}")
        self._server: ServerName = server
        self._upstream: ServerName | None = (upstream or "openai") if server in _RELAYS else None
        self._quirks = frozenset(quirks)
        self._api_key = api_key
        self._model = model
        self._validate = validate
        self._host = host
        self._requested_port = port
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Step]] = {}
        self._requests: list[dict[str, Any]] = []
        self._errors: list[str] = []
        self._limited: tuple[float, str | None] | None = None
        self._pending_failures: list[tuple[int, float | None, dict[str, Any] | None]] = []
        self._failures_served = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FakeOpenAI:
        """Start serving in a background daemon thread; returns ``self``."""
        if self._thread is not None:
            raise RuntimeError("FakeOpenAI is already started")
        ready = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._start_site())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=serve, name="FakeOpenAI", daemon=True)
        self._thread.start()
        if not ready.wait(timeout=10):
            raise RuntimeError("FakeOpenAI did not start within 10 s")
        if failure:
            self._thread.join()
            self._thread = None
            self._loop = None
            raise RuntimeError(f"FakeOpenAI failed to start: {failure[0]!r}") from failure[0]
        return self

    async def _start_site(self) -> None:
        app = web.Application(client_max_size=256 * 1024**2)  # long histories exceed 1 MiB
        app.router.add_post("/v1/chat/completions", self._handle_chat)
        app.router.add_get("/v1/models", self._handle_models)
        app.router.add_route("*", "/{tail:.*}", self._handle_unknown)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._requested_port, reuse_address=True)
        await site.start()
        self._runner = runner
        self._port = int(runner.addresses[0][1])

    def stop(self) -> None:
        """Stop the server and join its thread. Safe to call twice."""
        thread, loop, runner = self._thread, self._loop, self._runner
        if thread is None or loop is None:
            return
        if runner is not None:
            future = asyncio.run_coroutine_threadsafe(runner.cleanup(), loop)
            future.result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        self._thread = None
        self._loop = None
        self._runner = None
        self._port = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The TCP port it listens on (only while started)."""
        if self._port is None:
            raise RuntimeError("FakeOpenAI is not started")
        return self._port

    @property
    def server(self) -> ServerName:
        """The server profile (``"openai"`` unless given)."""
        return self._server

    @property
    def upstream(self) -> ServerName | None:
        """The server behind a relay profile, else None."""
        return self._upstream

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``: pass it as the OpenAI client's ``base_url``."""
        return f"http://{self._host}:{self.port}/v1"

    # ------------------------------------------------------------------ scripting
    def script(self, task: str, steps: Sequence[Step]) -> None:
        """Script the answers for the conversation whose first user message is ``task``.

        Step ``i`` answers a request that already holds ``i`` assistant messages. Scripting
        the same task again replaces its steps.
        """
        steps = list(steps)
        for step in steps:
            if not isinstance(step, Step):
                raise TypeError(f"script steps must be Step objects, got {step!r}")
        with self._lock:
            self._scripts[task] = steps

    def fail_next(self, n: int = 1, status: int = 500, retry_after: float | None = None) -> None:
        """Answer the next ``n`` chat requests with HTTP ``status`` (an OpenAI error body).

        ``retry_after`` (seconds, may be fractional) is sent as a ``Retry-After`` header.
        The failures are counted in :attr:`failures_served` and are not :attr:`errors`.
        """
        if n < 0:
            raise ValueError("n must be >= 0")
        if status < 400:
            raise ValueError("status must be an HTTP error status")
        with self._lock:
            self._pending_failures.extend([(status, retry_after, None)] * n)

    def clear_failures(self) -> None:
        """Drop the failures still queued by :meth:`fail_next` and :meth:`error_next`, and end
        a :meth:`rate_limit`: the provider is back."""
        with self._lock:
            self._pending_failures.clear()
            self._limited = None

    def rate_limit(self, seconds: float, header: str | None = None) -> None:
        """Be over the rate limit for the next ``seconds``: every chat request gets the
        server profile's 429 (for ``"openai"``: only ``x-ratelimit-reset-tokens: <time
        left>s``, no ``Retry-After``; Groq adds ``retry-after``; Azure sends ``retry-after``).
        ``header`` sends that one hint instead (``x-ratelimit-reset-*`` as ``"2.5s"``,
        ``retry-after`` and Azure's ``x-rate-limit-reset-tokens`` in whole seconds,
        ``retry-after-ms``). Counted in :attr:`failures_served`."""
        with self._lock:
            self._limited = (time.monotonic() + seconds, header)

    def error_next(self, n: int, error: Mapping[str, Any]) -> None:
        """Answer the next ``n`` chat requests with a 200 whose body is ``{"error": error}``,
        as OpenRouter relays a provider's failure. Counted like :meth:`fail_next`."""
        if n < 0:
            raise ValueError("n must be >= 0")
        with self._lock:
            self._pending_failures.extend([(200, None, {"error": dict(error)})] * n)

    def reset(self) -> None:
        """Forget scripts, recorded requests, errors and pending or served failures."""
        with self._lock:
            self._scripts.clear()
            self._requests.clear()
            self._errors.clear()
            self._pending_failures.clear()
            self._limited = None
            self._failures_served = 0

    # ------------------------------------------------------------------ records
    @property
    def requests(self) -> list[dict[str, Any]]:
        """A snapshot of every chat request body received, in order (failed ones too)."""
        with self._lock:
            return list(self._requests)

    def requests_for(self, task: str) -> list[dict[str, Any]]:
        """The recorded chat request bodies whose first user message is ``task``."""
        return [body for body in self.requests if _task_of(body) == task]

    @property
    def errors(self) -> list[str]:
        """A snapshot of the unexpected requests seen, each described in one string."""
        with self._lock:
            return list(self._errors)

    @property
    def failures_served(self) -> int:
        """How many injected failures (:meth:`fail_next`) have been answered."""
        with self._lock:
            return self._failures_served

    # ------------------------------------------------------------------ handlers
    def _check_auth(self, request: web.Request) -> web.Response | None:
        header = request.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            return web.json_response(
                _error_body(
                    "You didn't provide an API key. You need to provide your API key in an "
                    "Authorization header using Bearer auth (i.e. Authorization: Bearer "
                    "YOUR_KEY).",
                    "invalid_request_error",
                ),
                status=401,
            )
        if self._api_key is not None and key != self._api_key:
            return web.json_response(
                _error_body(
                    "Incorrect API key provided.",
                    "invalid_request_error",
                    code="invalid_api_key",
                ),
                status=401,
            )
        return None

    def _unexpected(
        self, problem: str, *, status: int = 500, param: str | None = None
    ) -> web.Response:
        with self._lock:
            self._errors.append(problem)
        type_ = "server_error" if status >= 500 else "invalid_request_error"
        return web.json_response(
            _error_body(f"FakeOpenAI: {problem}", type_, param=param),
            status=status,
            # The problem is in the test's script or the agent, not transient: a retry
            # would only repeat it, so tell OpenAI's clients not to.
            headers={"x-should-retry": "false"},
        )

    async def _handle_unknown(self, request: web.Request) -> web.Response:
        if (denied := self._check_auth(request)) is not None:
            return denied
        return self._unexpected(f"no such endpoint: {request.method} {request.path}", status=404)

    async def _handle_models(self, request: web.Request) -> web.Response:
        if (denied := self._check_auth(request)) is not None:
            return denied
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self._model, "object": "model", "created": 0, "owned_by": "fake"}],
            }
        )

    async def _handle_chat(self, request: web.Request) -> web.Response:
        if (denied := self._check_auth(request)) is not None:
            return denied
        try:
            body = await request.json()
        except ValueError:
            return self._unexpected("request body is not JSON", status=400)
        if not isinstance(body, dict):
            return self._unexpected("request body is not a JSON object", status=400)

        with self._lock:
            self._requests.append(body)
            failure = self._pending_failures.pop(0) if self._pending_failures else None
            limited = self._limited
            left = limited[0] - time.monotonic() if limited is not None else 0.0
            if failure is not None or left > 0:
                self._failures_served += 1
        if failure is not None:
            return self._injected_failure(*failure)
        if limited is not None and left > 0:
            headers, limit_body = _too_many_requests(
                self._server,
                self._upstream,
                left,
                limited[1],
                str(body.get("model") or self._model),
            )
            return web.json_response(limit_body, status=429, headers=headers)

        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return self._unexpected("request has no 'messages' list", status=400, param="messages")
        if not body.get("model"):
            return self._unexpected("request has no 'model'", status=400, param="model")
        if body.get("stream"):
            return self._unexpected("streaming is not supported", status=400, param="stream")
        if self._validate and (refused := self._refusal(messages, body)) is not None:
            return refused

        task = _task_of(body)
        if task is None:
            return self._unexpected("request has no user message")
        with self._lock:
            steps = self._scripts.get(task)
        if steps is None:
            return self._unexpected(f"no script for task {task!r}")
        index = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        if index >= len(steps):
            return self._unexpected(
                f"task {task!r}: request with {index} assistant message(s) but the script "
                f"has only {len(steps)} step(s)"
            )
        step = steps[index]
        if step.expect is not None:
            try:
                step.expect(messages)
            except AssertionError as exc:
                return self._unexpected(
                    f"task {task!r} step {index}: expect failed: {exc or 'AssertionError'}\n"
                    + traceback.format_exc()
                )
            except Exception as exc:
                return self._unexpected(
                    f"task {task!r} step {index}: expect raised {exc!r}\n" + traceback.format_exc()
                )
        if step.raw is not None:
            status, ctype, text = step.raw
            return web.Response(status=status, content_type=ctype, text=text)
        return web.json_response(self._completion(body, step))

    def _refusal(self, messages: list[Any], body: Mapping[str, Any]) -> web.Response | None:
        """The server's refusal when the request breaks one of its rules, else None."""
        if not all(isinstance(m, dict) for m in messages):
            problem = _check_conversation(messages)
            assert problem is not None
            return self._unexpected(problem[0], status=400, param=problem[1])
        rules_of = self._upstream or self._server
        violation = next(
            (v for rule in _RULES[rules_of] if (v := rule(messages, body)) is not None), None
        )
        if violation is None:
            return None
        status, error = _REFUSALS[rules_of](violation)
        name = self._server if self._upstream is None else f"{self._server}→{self._upstream}"
        if self._server == "openrouter":
            error = _openrouter_relay(status, error, rules_of)
        elif self._server == "litellm":
            error = _litellm_relay(status, error, rules_of)
        with self._lock:
            self._errors.append(
                f"{name} refuses this request ({violation.rule}): {violation.message}"
                + (f" at {list(violation.loc)}" if violation.loc else "")
            )
        return web.json_response(error, status=status)

    def _injected_failure(
        self, status: int, retry_after: float | None, body_200: dict[str, Any] | None
    ) -> web.Response:
        if body_200 is not None:
            return web.json_response(body_200, status=status)
        headers: dict[str, str] = {}
        if retry_after is not None:
            headers["Retry-After"] = (
                str(int(retry_after)) if float(retry_after).is_integer() else str(retry_after)
            )
        if status == 429:
            body = _error_body(
                "Rate limit reached (injected by FakeOpenAI.fail_next).",
                "requests",
                code="rate_limit_exceeded",
            )
        else:
            body = _error_body(
                f"The server had an error while processing your request (injected "
                f"{status} by FakeOpenAI.fail_next).",
                "server_error" if status >= 500 else "invalid_request_error",
            )
        return web.json_response(body, status=status, headers=headers)

    def _completion(self, body: Mapping[str, Any], step: Step) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": step.content,
            "refusal": None,
        }
        ids_of = self._upstream or self._server
        if step.tool_calls:
            message["tool_calls"] = [
                {
                    "id": tc.id if tc.explicit_id else _server_call_id(ids_of, tc.id),
                    "type": "function",
                    "function": {"name": tc.name, "arguments": tc.arguments},
                }
                for tc in step.tool_calls
            ]
        prompt_tokens = _rough_tokens(body.get("messages"))
        completion_tokens = _rough_tokens(message)
        completion: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model") or self._model),
            "system_fingerprint": "fp_fake",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": step.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        _shape(self._server, self._upstream, completion, step, self._quirks)
        return completion
