"""The App Home's listeners: ``app_home_opened``, and the "Open thread" link on Home.

Approve and Deny on Home are the cards' buttons, handled in :mod:`bot.actions`.
"""

from __future__ import annotations

from typing import Any

from slack_bolt.async_app import AsyncApp

from .acking import at_ack
from .context import BotContext
from .home_view import HOME_THREAD_ACTION


def register(app: AsyncApp, ctx: BotContext) -> None:
    """Register before :func:`bot.actions.register`, whose last listener takes every other
    button."""
    home = ctx.home

    @app.event("app_home_opened")
    @at_ack(ctx)
    async def on_home_opened(ack: Any, event: dict[str, Any]) -> None:
        await ack()
        user = event.get("user")
        # The Messages tab fires it too: only the Home tab has a view to publish.
        if home is None or event.get("tab") != "home" or not isinstance(user, str) or not user:
            return
        async with ctx.busy():
            await home.opened(user)

    @app.block_action(HOME_THREAD_ACTION)
    @at_ack(ctx)
    async def on_open_thread(ack: Any) -> None:
        await ack()  # a link button: Slack opens the link, and still tells the app
