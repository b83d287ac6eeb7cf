"""The Bolt app: wires slash commands and interactivity to the handlers."""

from __future__ import annotations

import logging
from typing import Any

import redis.asyncio as aioredis
from slack_bolt.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.async_handler import RetryState
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
)
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from agent_core import metrics
from agent_core.agent import Agent

from . import (
    actions,
    assistant,
    bolt_compat,
    commands,
    conversations,
    grant_actions,
    home_listeners,
    mentions,
    quiet,
    rejoin,
)
from .context import BotContext, Redeliver
from .ports import GatewayLike
from .publisher import slack_error
from .settings import BotSettings

log = logging.getLogger(__name__)


class MeteredWebClient(AsyncWebClient):
    """The Web API client, counting calls and failures (``agw_slack_api_*``)."""

    async def api_call(self, api_method: str, **kwargs: Any) -> AsyncSlackResponse:
        method = metrics.label(api_method)
        metrics.SLACK_CALLS.labels(method).inc()
        try:
            return await super().api_call(api_method, **kwargs)
        except SlackApiError as exc:
            metrics.SLACK_ERRORS.labels(method, metrics.label(slack_error(exc))).inc()
            raise
        except Exception as exc:
            metrics.SLACK_ERRORS.labels(method, type(exc).__name__).inc()
            raise


class MeteredRateLimitHandler(AsyncRateLimitErrorRetryHandler):
    """slack_sdk's retry on 429, counting every 429 (``agw_slack_api_rate_limited_total``),
    the retried ones too."""

    async def can_retry_async(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        # With an error, `response` is the previous attempt's, already counted.
        if error is None and response is not None and response.status_code == 429:
            method = request.url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
            metrics.SLACK_RATE_LIMITED.labels(metrics.label(method)).inc()
        return await super().can_retry_async(
            state=state, request=request, response=response, error=error
        )


def make_web_client(settings: BotSettings, timeout: int = 15) -> AsyncWebClient:
    """The Web API client: SLACK_API_URL, retries on connection errors and on 429, metered."""
    return MeteredWebClient(
        token=settings.slack_bot_token.get_secret_value(),
        base_url=settings.slack_api_url,
        timeout=timeout,
        # Passing retry_handlers replaces slack_sdk's defaults, so the connection handler is listed too.
        retry_handlers=[
            AsyncConnectionErrorRetryHandler(max_retry_count=2),
            MeteredRateLimitHandler(max_retry_count=settings.slack_max_retries),
        ],
    )


def create_app(
    settings: BotSettings,
    redis: aioredis.Redis,
    gateway: GatewayLike,
    web_client: AsyncWebClient,
    *,
    context: BotContext | None = None,
    agent: Agent | None = None,
) -> AsyncApp:
    """A Bolt ``AsyncApp`` with every listener registered.

    The app does not verify signatures (``bot.bolt_compat``): dispatch only requests
    verified first, as :func:`bot.server.build_web_app` does. Bolt calls ``auth.test`` once, on the first request, with ``web_client`` (so a fake
    Slack has to answer it). ``agent`` offers its suggested prompts in assistant threads
    (default: the agent AGENT names).
    """
    ctx = context or BotContext.build(settings, redis, gateway, web_client)
    secret = settings.slack_signing_secret
    with bolt_compat.unseen_by_bolt():
        app = AsyncApp(
            client=web_client,
            signing_secret=secret.get_secret_value() if secret is not None else "",
            # Off: bot.server verifies every HTTP request's signature on its raw bytes before
            # Bolt sees it (see bot.bolt_compat); Socket Mode requests are not signed.
            request_verification_enabled=bolt_compat.BOLT_VERIFIES_REQUESTS,
            # Bolt answers when a listener returns; each returns at its ack() (bot.acking).
            process_before_response=True,
            name="agent-approvals",
        )
    # Bolt tries every listener in order until one matches (each try builds its arguments):
    # the card's buttons, the busiest requests, come first.
    actions.register(app, ctx)
    commands.register(app, ctx)
    quiet.register(app)
    home_listeners.register(app, ctx)
    grant_actions.register(app, ctx)
    mentions.register(app, ctx)  # before conversations: its DM listener is checked first
    conversations.register(app, ctx)
    rejoin.register(app, ctx)  # the app back in a channel: its stale cards shown again
    actions.register_fallback(app, ctx)  # last: it takes any button
    # A Bolt middleware: it sees assistant-thread events before the listeners above.
    assistant.register(app, ctx, agent)

    @app.error
    async def on_error(error: Exception, body: dict[str, Any]) -> None:
        kind = body.get("type") or ("command" if "command" in body else "unknown")
        if isinstance(error, Redeliver):
            log.warning("a %s request was left for Slack to deliver again: %s", kind, error)
            return
        log.error("handler failed for a %s request: %s", kind, type(error).__name__, exc_info=error)

    return app


def main() -> None:
    """Entry point of the ``web`` process (also ``python -m bot``)."""
    from .server import main as server_main

    server_main()
