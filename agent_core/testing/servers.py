"""The server profiles of :class:`~agent_core.testing.FakeOpenAI` and their request rules.

:data:`SERVERS` names the profiles and :data:`QUIRKS` the oddities they can reproduce; each
``_rule_*`` is one request rule a server enforces, returning the :class:`Violation` it
refuses with (``_RULES`` lists them per server). How each server words its answers is in
:mod:`agent_core.testing.shapes`.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from agent_core.testing.steps import Message, _check_conversation

# =============================================================================== server profiles
#
# Each profile: the request rules the server enforces (checked in order, the first violation
# wins), the status and body it refuses with, its tool-call id format, the extra fields and
# quirks of its responses, and its 429. Every rule and shape cites where it comes from; where
# a detail (an exact wording) is not sourced, the comment says so.

ServerName = Literal[
    "openai",
    "azure",
    "ollama",
    "vllm",
    "llamacpp",
    "litellm",
    "openrouter",
    "groq",
    "mistral",
    "deepseek",
    "gemini",
    "anthropic",
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
    "deepseek": "DeepSeek",
    "gemini": "Google AI Studio",
    "anthropic": "Anthropic",
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


def _thinking(body: Mapping[str, Any]) -> bool:
    """DeepSeek's thinking mode: on unless the request turns it off ("The thinking toggle
    defaults to enabled", api-docs.deepseek.com/guides/thinking_mode)."""
    thinking = body.get("thinking")
    return not (isinstance(thinking, dict) and thinking.get("type") == "disabled")


def _rule_deepseek_reasoning(messages: list[Message], body: Mapping[str, Any]) -> Violation | None:
    # Thinking mode with tools: "Between two user messages, if the model performed a tool
    # call, the intermediate assistant's reasoning_content must participate in the context
    # concatenation and must be passed back to the API in all subsequent requests"
    # (api-docs.deepseek.com/guides/thinking_mode, "Tool Calls"); an empty one too
    # (deepseek-ai/deepseek-harness#1850). The 400's wording: AstrBot#4174, anomalyco/
    # opencode#9397 (the field name in backticks, as the docs' markdown renders it).
    if not _thinking(body):
        return None
    segment: list[int] = []
    for i, m in enumerate([*messages, {"role": "user"}]):
        if m.get("role") == "user":
            if any(_calls_of(messages[j]) for j in segment):
                for j in segment:
                    if "reasoning_content" not in messages[j]:
                        return Violation(
                            "deepseek.reasoning_content",
                            "Missing `reasoning_content` field in the assistant message at "
                            f"message index {j}. For more information, please refer to "
                            "https://api-docs.deepseek.com/guides/thinking_mode#tool-calls",
                            code="invalid_request_error",
                        )
            segment = []
        elif m.get("role") == "assistant":
            segment.append(i)
    return None


def thought_signature(name: str) -> str:
    """The thought signature the Gemini profile attaches to a call of ``name``: opaque
    base64 of about 400 characters, as real ones are ("CrICAd…": a 306-byte protobuf,
    discuss.ai.google.dev "OpenAI API compatibility broken due to thought_signature")."""
    blob = b"".join(hashlib.sha256(f"{name}:{i}".encode()).digest() for i in range(10))
    return "CrIC" + base64.b64encode(blob[:300]).decode()


def _rule_gemini_signatures(messages: list[Message], body: Mapping[str, Any]) -> Violation | None:
    # Gemini 3 through the OpenAI endpoint: each function-calling step of the current turn
    # (since the last user message) must send back the signature its first call came with,
    # in tool_calls[0].extra_content.google.thought_signature; "Missing signatures will
    # result in a 400 error"; parallel calls carry one, on the first
    # (ai.google.dev/gemini-api/docs/thought-signatures). Wording of the missing one:
    # discuss.ai.google.dev/t/…/109823; of a changed one ("Corrupted thought signature.",
    # INVALID_ARGUMENT): as public client code quotes it.
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    for i in range(last_user + 1, len(messages)):
        calls = _calls_of(messages[i])
        if messages[i].get("role") != "assistant" or not calls:
            continue
        fn = calls[0].get("function")
        name = str(fn.get("name")) if isinstance(fn, dict) else ""
        extra = calls[0].get("extra_content")
        google = extra.get("google") if isinstance(extra, dict) else None
        sent = google.get("thought_signature") if isinstance(google, dict) else None
        if sent is None:
            return Violation(
                "gemini.thought_signature",
                "Function call is missing a thought_signature in functionCall parts. This is "
                "required for tools to work correctly, and missing thought_signature may lead "
                f"to degraded model performance. Additional data, function call `default_api:"
                f"{name}` , position {i}. please refer to https://ai.google.dev/gemini-api/docs"
                "/thought-signatures for more details.",
            )
        if sent != thought_signature(name):
            return Violation("gemini.thought_signature", "Corrupted thought signature.")
    return None


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
    "deepseek": (_rule_deepseek_reasoning, _rule_tool_answers),
    "gemini": (_rule_gemini_signatures, _rule_tool_answers),
    # Anthropic's OpenAI SDK compatibility layer: no rule beyond answered tool calls is
    # documented as a refusal (platform.claude.com/docs/…/openai-sdk lists ignored fields).
    "anthropic": (_rule_tool_answers,),
}

# The fields a relay takes as its own input and does not forward to the upstream as they
# are: LiteLLM drops reasoning_content and thinking_blocks from assistant messages for
# Mistral (BerriAI/litellm#30884, fixing #30835); OpenRouter takes reasoning and
# reasoning_details back as its own ("preserving reasoning blocks",
# openrouter.ai/docs/use-cases/reasoning-tokens).
_RELAY_OWN_FIELDS: Mapping[tuple[str, str], frozenset[str]] = {
    ("litellm", "mistral"): frozenset({"reasoning_content", "thinking_blocks"}),
    **{
        ("openrouter", u): frozenset({"reasoning", "reasoning_details"})
        for u in ("openai", "azure", "ollama", "vllm", "llamacpp", "groq", "mistral")
    },
}


def forwarded(server: str, upstream: str | None, messages: list[Message]) -> list[Message]:
    """The messages as relay ``server`` forwards them to ``upstream`` (whose rules apply)."""
    drop = _RELAY_OWN_FIELDS.get((server, upstream or ""), frozenset())
    if not drop:
        return messages
    return [
        {k: v for k, v in m.items() if k not in drop} if m.get("role") == "assistant" else m
        for m in messages
    ]
