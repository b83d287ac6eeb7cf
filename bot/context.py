"""Everything a Slack handler needs, built once per process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from slack_sdk.web.async_client import AsyncWebClient

from agent_core.keys import Keys

from .approvers import Approvers
from .directory import AgentDirectory
from .home import HomeFeed
from .ports import GatewayLike
from .publisher import Publisher
from .settings import BotSettings, parse_approvers
from .store import Store

log = logging.getLogger(__name__)


class Redeliver(Exception):
    """Raised by an event's handler before its ack to leave the event unacknowledged, so
    that Slack delivers it again later (Bolt answers 500; Socket Mode sends no ack)."""


@dataclass
class BotContext:
    settings: BotSettings
    gateway: GatewayLike
    client: AsyncWebClient
    store: Store
    approvers: Approvers
    publisher: Publisher
    inflight: set[asyncio.Task[object]] = field(default_factory=set)
    agents: AgentDirectory = field(default_factory=AgentDirectory)
    """The agents ``/agent <name>`` picks from, and what the live workers serve."""
    home: HomeFeed | None = None
    """Publishes the approvers' App Home views (None: no Home)."""

    @contextlib.asynccontextmanager
    async def busy(self) -> AsyncIterator[None]:
        """Mark the work after an ``ack()`` so that shutdown waits for it.

        Slack was already told "received": stopping mid-way would drop a click.
        """
        task = asyncio.current_task()
        if task is not None:
            self.inflight.add(task)
        try:
            yield
        finally:
            if task is not None:
                self.inflight.discard(task)

    def track(self, task: asyncio.Task[Any] | asyncio.Future[Any]) -> None:
        """Keep a listener's work after its ``ack()`` (see :mod:`bot.acking`): shutdown waits
        for it, and a failure is logged."""
        self.inflight.add(task)  # type: ignore[arg-type]
        task.add_done_callback(self._tracked_done)

    def _tracked_done(self, task: asyncio.Future[Any]) -> None:
        self.inflight.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            if isinstance(exc, Redeliver):
                return  # not acknowledged on purpose: the app's error handler logs it
            log.error("a Slack handler failed after its ack", exc_info=exc)

    async def drain(self, timeout: float = 10.0) -> None:
        """Wait for acknowledged work to finish; cancel what is still running after ``timeout``."""
        pending = {t for t in self.inflight if not t.done()}
        if not pending:
            return
        _done, late = await asyncio.wait(pending, timeout=timeout)
        for t in late:
            log.warning("cancelling a Slack handler still running at shutdown")
            t.cancel()
        if late:
            await asyncio.wait(late, timeout=1.0)

    @classmethod
    def build(
        cls,
        settings: BotSettings,
        redis: aioredis.Redis,
        gateway: GatewayLike,
        client: AsyncWebClient,
        keys: Keys | None = None,
        agents: AgentDirectory | None = None,
    ) -> BotContext:
        keys = keys or getattr(gateway, "keys", None) or Keys()
        store = Store(redis, keys)
        approvers = Approvers(
            parse_approvers(settings.approvers),
            client,
            allow_self_approval=settings.allow_self_approval,
            allow_external=settings.allow_external_approvers,
        )
        publisher = Publisher(gateway, store, client, settings.slash_command)
        ctx = cls(settings, gateway, client, store, approvers, publisher)
        ctx.home = HomeFeed(gateway, store, approvers, client)
        if agents is not None:
            ctx.agents = agents
        return ctx
