"""Calling the model: one Chat Completions request, retried within a budget, abandoned as
soon as the worker's lease on the run is known to be lost."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import openai

from . import retries
from .completions import Completion, ModelResponseError, parse_completion, parse_text_body
from .exceptions import LeaseLost
from .model_http import ModelEndpoint

log = logging.getLogger("agent_core.runner")


def _error_kind(exc: openai.APIError) -> str:
    if isinstance(exc, openai.RateLimitError):
        return "rate_limited"
    return "retryable" if retries.retryable(exc) else "final"


async def complete(
    endpoint: ModelEndpoint,
    request: bytes,
    run_id: str = "",
    lost: asyncio.Event | None = None,
    model_retries: int = 10,
    retry_budget: float = 120.0,
) -> Completion:
    """One completion. Rate limits, server errors, timeouts, connection errors and
    provider failures relayed in a 200 are tried again, waiting what the server asked
    (Retry-After, retry-after-ms, x-ratelimit-reset-*) or backing off, at most
    ``model_retries`` times and within ``retry_budget`` seconds in all."""
    from . import metrics  # on first use: `import agent_core` loads no prometheus_client

    loop = asyncio.get_running_loop()
    give_up = loop.time() + retry_budget
    attempt = 0
    while True:
        started = loop.time()
        try:
            # Not chat.completions.create(): its parameter transform walks every message
            # in Python (~160 ms of event-loop time at 1,000 messages, measured); the
            # history is already plain JSON, posted as it is (model_http). The body is read
            # as plain JSON and checked here: a 200 is not always a completion.
            body = await _post_unless_lost(endpoint, request, run_id, lost)
            metrics.MODEL_SECONDS.observe(loop.time() - started)
            if isinstance(body, str):
                body = parse_text_body(body)
            return parse_completion(body)
        except ValueError as exc:  # a body labelled JSON that is not JSON
            metrics.MODEL_ERRORS.labels("final").inc()
            raise ModelResponseError(
                f"the model endpoint returned invalid JSON ({exc}); check OPENAI_BASE_URL"
            ) from exc
        except ModelResponseError as exc:
            metrics.MODEL_ERRORS.labels("retryable" if exc.retryable else "final").inc()
            if not exc.retryable:
                raise
            error: Exception = exc
            wait = retries.backoff(attempt)
        except openai.APIError as exc:
            metrics.MODEL_SECONDS.observe(loop.time() - started)
            metrics.MODEL_ERRORS.labels(_error_kind(exc)).inc()
            if not retries.retryable(exc):
                raise
            error, wait = exc, retries.wait_for(exc, attempt)
        if attempt >= model_retries or loop.time() + wait > give_up:
            metrics.MODEL_ERRORS.labels("exhausted").inc()
            raise error
        if lost is not None and lost.is_set():
            raise LeaseLost(run_id)
        log.info("model call failed (%s); retrying in %.1f s", type(error).__name__, wait)
        if lost is None:
            await asyncio.sleep(wait)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lost.wait(), timeout=wait)
            if lost.is_set():
                raise LeaseLost(run_id)
        attempt += 1


async def _post_unless_lost(
    endpoint: ModelEndpoint, request: bytes, run_id: str, lost: asyncio.Event | None
) -> Any:
    """The model call, abandoned (LeaseLost) as soon as the lease is known to be lost:
    another worker owns the run, and nothing this one learns could be recorded."""
    call = endpoint.post(request)
    if lost is None:
        return await call
    if lost.is_set():
        call.close()
        raise LeaseLost(run_id)
    posting = asyncio.ensure_future(call)
    watching = asyncio.ensure_future(lost.wait())
    try:
        await asyncio.wait({posting, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
    if not posting.done():
        posting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await posting
        raise LeaseLost(run_id)
    return posting.result()
