"""What one model turn stores in the history, and what its answer shows.

The assistant message is stored as the provider sent it, less what the runner rebuilds
(content as text, tool calls validated and given ids every server accepts): the provider's
own fields stay, on the message and on each tool call, and go back in every later request.
Some providers refuse a history without them (DeepSeek's ``reasoning_content`` on a turn
that called tools, Gemini's ``extra_content.google.thought_signature`` on a tool call). The
reasoning text is never the answer: the answer is the message's ``content`` alone, less a
leading ``<think>…</think>`` block.

What reasoning costs in the stored history: it is kept only on the turns that call tools
or answer tool results (a turn answering the user directly keeps none), verbatim, since
DeepSeek requires it so: its length in bytes plus about 40 (a character outside ASCII is
stored escaped, 6 bytes). It is bounded by the provider's output limit per turn (DeepSeek:
``max_tokens``, which counts the reasoning) and by ``MAX_TURNS`` turns per leg of a run.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from typing import Any

from .completions import Completion

_ID_ALPHABET = string.ascii_letters + string.digits


def new_call_id(taken: set[str]) -> str:
    """A tool-call id every server accepts (9 characters of [A-Za-z0-9], Mistral's rule),
    unique among ``taken``."""
    while True:
        cid = "".join(secrets.choice(_ID_ALPHABET) for _ in range(9))
        if cid not in taken:
            return cid


def unusable_answer(c: Completion) -> str | None:
    """Why a final answer cannot be shown as an answer (a provider's filter), or None."""
    if c.finish_reason == "content_filter" and not (c.content or "").strip():
        return (
            "the model provider's content filter blocked the answer (finish_reason "
            "content_filter); nothing was answered"
        )
    return None


# Thinking inline at the start of the content, as reasoning models write it when the server
# does not split it out (vLLM without a reasoning parser, llama.cpp with
# --reasoning-format none): never part of the answer shown.
_THINK = re.compile(r"\A\s*<think>.*?</think>\s*", re.DOTALL)


def final_text(c: Completion) -> tuple[str, bool]:
    """The final answer as the user should read it, and whether it was cut off. The
    reasoning is never part of it."""
    text = _THINK.sub("", c.content or "", count=1)
    if not text.strip() and c.refusal:
        return f"The model refused: {c.refusal}", False
    if c.finish_reason == "length":
        return text + "\n\n[cut off: the answer reached the model's output limit]", True
    if c.finish_reason == "content_filter":
        return text + "\n\n[cut off by the model provider's content filter]", True
    return text, False


def json_object_or_empty(arguments: str) -> str:
    """``arguments`` when it is a JSON object, else ``"{}"`` (the model was told it was not)."""
    try:
        parsed = json.loads(arguments)
    except (ValueError, RecursionError):
        return "{}"
    return arguments if isinstance(parsed, dict) else "{}"


def assistant_message(
    c: Completion, history: list[bytes], wire_calls: list[dict[str, Any]]
) -> dict[str, Any]:
    """The assistant message to store for completion ``c``, given the history it answered
    (as stored) and its calls as planned (``wire_calls``, each with the call's own fields)."""
    message: dict[str, Any] = {"role": "assistant", "content": c.content}
    if wire_calls or (history and json.loads(history[-1]).get("role") == "tool"):
        # DeepSeek: "between two user messages, if the model performed a tool call", every
        # assistant message there must carry its reasoning_content back.
        message.update(c.extra)
    if wire_calls:
        message["tool_calls"] = wire_calls
        if message["content"] is None:
            message["content"] = ""  # Ollama refuses a null content in the history
    return message
