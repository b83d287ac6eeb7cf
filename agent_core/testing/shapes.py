"""The response shapes of :class:`~agent_core.testing.FakeOpenAI`'s server profiles.

Each server's tool-call id format, its refusal bodies (and how a relay wraps them), the extra
fields and reasoning of its completions, and its 429. Every shape cites its source beside it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

from agent_core.testing.servers import _PROVIDER_NAMES, Violation, thought_signature
from agent_core.testing.steps import Step, _error_body


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
    if server == "anthropic":  # "toolu_01UsBRMJWT8xAssuztCGEZNu" (anthropic-sdk-python#461)
        return "toolu_01" + _derive(seed, _ALNUM, 22)
    # OpenAI-style "call_…", as scripted. Gemini's format is not documented beyond the
    # placeholder "function-call-1" of its thought-signatures page.
    return seed


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


def _error_text(body: Any) -> str:
    if isinstance(body, list):  # Google's list of errors
        body = body[0] if body else {}
    err = body.get("error")
    message = err.get("message") if isinstance(err, dict) else body.get("message")
    return message if isinstance(message, str) else json.dumps(message)


def _openrouter_relay(status: int, body: Any, upstream: str) -> dict[str, Any]:
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


def _litellm_relay(status: int, body: Any, upstream: str) -> dict[str, Any]:
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


def _deepseek_error(v: Violation) -> tuple[int, dict[str, Any]]:
    # {"error": {"message", "type": "invalid_request_error", "param": null, "code":
    # "invalid_request_error"}} (AstrBot#4174, 666ghj/BettaFish#108).
    return v.status, _error_body(v.message, "invalid_request_error", code="invalid_request_error")


_GOOGLE_STATUS: Mapping[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def _google_error(status: int, message: str) -> list[dict[str, Any]]:
    # Gemini's OpenAI endpoint answers errors as a JSON list of Google error objects:
    # [{"error": {"code", "message", "status"}}] (discuss.ai.google.dev/t/…/109823 for a 400,
    # n4ze3m/page-assist#406 for a 429); status names from google.rpc.Code.
    return [
        {
            "error": {
                "code": status,
                "message": message,
                "status": _GOOGLE_STATUS.get(status, "UNKNOWN"),
            }
        }
    ]


def _gemini_error(v: Violation) -> tuple[int, Any]:
    return v.status, _google_error(v.status, v.message)


def _anthropic_error(v: Violation) -> tuple[int, dict[str, Any]]:
    # The Claude API's error body, which its OpenAI layer keeps "consistent" with OpenAI's
    # (an "error" object with "type" and "message"; platform.claude.com/docs/…/openai-sdk,
    # "Error message compatibility"; the body as anthropics/claude-code#41628 quotes it).
    return v.status, {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": v.message},
        "request_id": "req_011CfakeRequest0000000000",
    }


_REFUSALS: Mapping[str, Callable[[Violation], tuple[int, Any]]] = {
    "openai": _openai_error,
    "azure": _azure_error,
    "ollama": _ollama_error,
    "vllm": _vllm_error,
    "llamacpp": _llamacpp_error,
    "groq": _groq_error,
    "mistral": _mistral_error,
    "deepseek": _deepseek_error,
    "gemini": _gemini_error,
    "anthropic": _anthropic_error,
}


def _documented_failure(server: str, status: int) -> Any:
    """The body ``server`` answers an injected ``status`` with, where it is documented
    (else None: OpenAI's shape stands in)."""
    if server == "anthropic" and status == 529:
        # 529 overloaded_error: "Anthropic's API is temporarily overloaded"
        # (platform.claude.com/docs/en/api/errors); body as anthropics/claude-code#41628 and
        # cline/cline#52 quote it.
        return {
            "type": "error",
            "error": {"type": "overloaded_error", "message": "Overloaded"},
            "request_id": "req_011CfakeRequest0000000000",
        }
    if server == "deepseek" and status == 402:
        # "402 - Insufficient Balance" (api-docs.deepseek.com/quick_start/error_codes); body
        # as Aider-AI/aider#4851 quotes it.
        return {
            "error": {
                "message": "Insufficient Balance",
                "type": "unknown_error",
                "param": None,
                "code": "invalid_request_error",
            }
        }
    if server == "gemini":
        if status == 429:
            return _google_error(429, "Resource has been exhausted (e.g. check quota).")
        return _google_error(status, f"Injected {status} by FakeOpenAI.fail_next.")
    return None


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
    thinking: bool = True,
) -> None:
    """Turn an OpenAI-shaped completion into ``server``'s shape, in place. ``thinking``:
    the request left DeepSeek's thinking mode on."""
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
    elif server == "deepseek":
        # Thinking mode: reasoning_content "at the same level as content", "" when the model
        # did not think aloud; usage with reasoning_tokens and the cache hit/miss counts
        # (api-docs.deepseek.com/guides/thinking_mode and /api/create-chat-completion).
        message.pop("refusal", None)
        if thinking:
            message["reasoning_content"] = step.reasoning or ""
        usage = completion["usage"]
        usage["prompt_cache_hit_tokens"] = 0
        usage["prompt_cache_miss_tokens"] = usage["prompt_tokens"]
        usage["completion_tokens_details"] = {
            "reasoning_tokens": len(step.reasoning or "") // 4 if thinking else 0
        }
    elif server == "gemini":
        # One thought signature per function-calling step, on its first call, under
        # extra_content.google (ai.google.dev/gemini-api/docs/thought-signatures, "OpenAI
        # compatibility"). Thoughts are not returned unless include_thoughts is asked for
        # (ai.google.dev/gemini-api/docs/openai); no refusal field.
        message.pop("refusal", None)
        if calls:
            calls[0]["extra_content"] = {
                "google": {"thought_signature": thought_signature(calls[0]["function"]["name"])}
            }
    elif server == "anthropic":
        # "the OpenAI SDK won't return Claude's detailed thought process"; refusal and
        # system_fingerprint "Always empty" (platform.claude.com/docs/…/openai-sdk).
        message["refusal"] = None
        completion["system_fingerprint"] = None
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
) -> tuple[dict[str, str], Any]:
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
    elif server == "gemini":
        # A list of Google errors, no hint header (n4ze3m/page-assist#406 quotes the 429 of
        # the OpenAI endpoint: "Resource has been exhausted (e.g. check quota).").
        headers = {}
        list_body = _google_error(429, "Resource has been exhausted (e.g. check quota).")
        if header is not None:
            headers = {header: _reset_value(header, left)}
        return headers, list_body
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
