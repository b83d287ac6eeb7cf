"""Answering Slack the moment a listener calls ``ack()``.

Bolt (with ``process_before_response=False``) runs a listener as a task and looks every
10 ms for its ``ack()``: every answer came ~10 ms late. The app runs with
``process_before_response=True`` instead, where Bolt answers once the listener returns, and
each listener is wrapped here so that it *returns* as soon as it acks: the rest of its work
goes on in a task that shutdown waits for (``BotContext.inflight``), as before.

- :func:`at_ack`: for listeners that call ``ack()`` themselves (commands, buttons, forms,
  and the events the bot acks early).
- :func:`in_background`: for listeners Bolt acknowledges itself after they return (the
  assistant's): they return at once and work in the background.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .context import BotContext

log = logging.getLogger(__name__)

Listener = TypeVar("Listener", bound=Callable[..., Awaitable[None]])


def at_ack(ctx: BotContext) -> Callable[[Listener], Listener]:
    """Make a listener return to Bolt when it calls ``ack()`` (or ends, or fails before)."""

    def decorate(listener: Listener) -> Listener:
        @functools.wraps(listener)  # Bolt reads the argument names through __wrapped__
        async def wrapper(**kwargs: Any) -> None:
            acked = asyncio.Event()
            ack = kwargs.get("ack")
            if ack is not None:

                async def ack_now(*args: Any, **kw: Any) -> Any:
                    try:
                        return await ack(*args, **kw)
                    finally:
                        acked.set()

                kwargs["ack"] = ack_now
            task = asyncio.ensure_future(listener(**kwargs))
            ctx.track(task)
            waiter = asyncio.ensure_future(acked.wait())
            try:
                await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
            if task.done() and not acked.is_set():
                task.result()  # a failure before the ack is Bolt's to report

        return wrapper  # type: ignore[return-value]

    return decorate


def in_background(ctx: BotContext) -> Callable[[Listener], Listener]:
    """Make a listener that Bolt acknowledges itself return at once, working on in a task."""

    def decorate(listener: Listener) -> Listener:
        @functools.wraps(listener)
        async def wrapper(**kwargs: Any) -> None:
            ctx.track(asyncio.ensure_future(listener(**kwargs)))

        return wrapper  # type: ignore[return-value]

    return decorate
