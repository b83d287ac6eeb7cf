"""How long to wait before calling the model again, from what the server said.

Servers say it in different ways: ``Retry-After`` (seconds or an HTTP date),
``retry-after-ms``, or OpenAI/Groq/Azure's ``x-ratelimit-reset-requests`` and
``x-ratelimit-reset-tokens`` (``6s``, ``1m30s``, ``20ms``, ``2m59.56s``). Without a hint the
wait grows exponentially. The caller stops once the total would exceed its retry budget.
"""

from __future__ import annotations

import email.utils
import random
import re
import time
from collections.abc import Mapping

import openai

from . import provider_errors

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_BACKOFF = 20.0


def parse_duration(text: str) -> float | None:
    """``"1m30s"`` → 90.0, ``"20ms"`` → 0.02, ``"6"`` → 6.0; None when unreadable."""
    text = text.strip().lower()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text.replace(" ", ""):
        return None
    return sum(float(n) * _UNITS[u] for n, u in parts)


def hinted_wait(headers: Mapping[str, str]) -> float | None:
    """The wait the server asked for, in seconds, or None when it gave no hint."""
    lower = {k.lower(): v for k, v in headers.items()}
    ms = lower.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    after = lower.get("retry-after")
    if after is not None:
        seconds = parse_duration(after)
        if seconds is not None:
            return seconds
        try:
            when = email.utils.parsedate_to_datetime(after)
            return max(0.0, when.timestamp() - time.time())
        except (TypeError, ValueError):
            pass
    resets = [
        parse_duration(lower[h])
        for h in (
            "x-ratelimit-reset-requests",
            "x-ratelimit-reset-tokens",
            "x-rate-limit-reset-requests",  # Azure spells it with a hyphen (seconds)
            "x-rate-limit-reset-tokens",
        )
        if h in lower
    ]
    known = [r for r in resets if r is not None]
    return max(known) if known else None


def backoff(attempt: int) -> float:
    """Exponential backoff with jitter: about 0.5, 1, 2, 4 … seconds, at most MAX_BACKOFF."""
    base = min(0.5 * 2.0**attempt, MAX_BACKOFF)
    return float(base * (0.8 + 0.4 * random.random()))


def retryable(exc: BaseException) -> bool:
    """Errors worth calling the model again for: rate limits, server errors, timeouts and
    connection errors (OpenAI's own client retries the same). Never a 4xx that names its
    cause (402 credits, 403, 413, a content inspection's 400): the same request would get
    the same answer. A 429 that says the account is out of quota is not a rate limit."""
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        if exc.status_code == 429 and provider_errors.billing(exc.body):
            return False
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500
    return False


def body_hint(body: object) -> float | None:
    """A wait named in an error body: OpenRouter relays ``error.metadata.retry_after_seconds``."""
    err = body.get("error", body) if isinstance(body, dict) else None
    meta = err.get("metadata") if isinstance(err, dict) else None
    value = meta.get("retry_after_seconds") if isinstance(meta, dict) else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except (TypeError, ValueError):
        return None


def wait_for(exc: BaseException, attempt: int) -> float:
    """How long to wait after ``exc`` on the ``attempt``-th retry (0 for the first)."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    hint = hinted_wait(headers) if headers is not None else None
    if hint is None:
        hint = body_hint(getattr(exc, "body", None))
    return hint if hint is not None else backoff(attempt)
