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
- :func:`ack_when_recorded`: for an event whose message must not be lost (a thread reply):
  Slack gets its ack once the message is in Redis, or after ACK_BUDGET_SECONDS, so a web
  process that dies before has the event delivered again (Slack retries unanswered events).
- :func:`answer_form`: for a modal's submission that decides (Approve & allow, Edit &
  approve): answered once the decision is durable or the input is found invalid (its
  errors shown in the modal), or after ACK_BUDGET_SECONDS with the modal kept open saying
  nothing is recorded yet (Slack wants a view_submission answered within 3 s).

Each waits for "acknowledged, or the work ended" with :func:`first_of`, which the moment
comes wakes directly: no waiter task and no ``asyncio.wait``, each of which added a pass
through the event loop's queue between a durable decision and Slack's answer (on a busy web
process, a few milliseconds each).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .context import BotContext, Redeliver

log = logging.getLogger(__name__)

Listener = TypeVar("Listener", bound=Callable[..., Awaitable[None]])
Ack = Callable[[], Awaitable[None]]

ACK_BUDGET_SECONDS = 2.0  # Slack retries an event not answered within 3 s


class Flag(asyncio.Event):
    """An :class:`asyncio.Event` that :func:`first_of` can wait on beside a task."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        if self.is_set():
            return
        super().set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def add_callback(self, callback: Callable[[], None]) -> None:
        if self.is_set():
            callback()
        else:
            self._callbacks.append(callback)

    def remove_callback(self, callback: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._callbacks.remove(callback)


async def first_of(flag: Flag, task: asyncio.Future[Any], timeout: float | None = None) -> bool:
    """Wait until ``flag`` is set or ``task`` is done, at most ``timeout`` seconds; whether
    either happened. Whichever comes first wakes the caller itself (one pass of the event
    loop), and nothing is left behind to cancel."""
    if flag.is_set() or task.done():
        return True
    woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_: object = None) -> None:
        if not woken.done():
            woken.set_result(None)

    flag.add_callback(wake)
    task.add_done_callback(wake)
    try:
        async with asyncio.timeout(timeout):
            await woken
    except TimeoutError:
        pass
    finally:
        flag.remove_callback(wake)
        task.remove_done_callback(wake)
    return flag.is_set() or task.done()


def at_ack(ctx: BotContext) -> Callable[[Listener], Listener]:
    """Make a listener return to Bolt when it calls ``ack()`` (or ends, or fails before)."""

    def decorate(listener: Listener) -> Listener:
        @functools.wraps(listener)  # Bolt reads the argument names through __wrapped__
        async def wrapper(**kwargs: Any) -> None:
            acked = Flag()
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
            await first_of(acked, task)
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


async def ack_when_recorded(
    ack: Ack, work: Callable[[Ack], Awaitable[None]], budget: float = ACK_BUDGET_SECONDS
) -> None:
    """Run ``work(ack_once)`` and acknowledge when it calls ``ack_once`` (its message is
    recorded, or nothing needs recording), when it ends, or after ``budget`` seconds, whichever
    comes first; then wait for it to end. A :class:`Redeliver` raised before the ack leaves
    the event unacknowledged."""
    acked = Flag()

    async def ack_once() -> None:
        if not acked.is_set():
            acked.set()
            await ack()

    task = asyncio.ensure_future(work(ack_once))
    await first_of(acked, task, budget)
    if task.done() and not acked.is_set() and not task.cancelled():
        exc = task.exception()
        if isinstance(exc, Redeliver):
            raise exc
    await ack_once()
    await task


FormErrors = dict[str, str]


class FormAnswer:
    """The answer to one view_submission, given at most once (see :func:`answer_form`):
    ``await answer()`` closes the modal, ``await answer(errors)`` keeps it open showing them.
    ``late``: the budget ran out first (the modal said nothing is recorded yet); ``errors``:
    those the work found too late to show in the modal; ``applied``: set by the work when
    its decision was made."""

    def __init__(self, ack: Callable[..., Awaitable[Any]]) -> None:
        self._ack = ack
        self.sent = Flag()
        self.late = False
        self.errors: FormErrors | None = None
        self.applied = False

    async def __call__(self, errors: FormErrors | None = None) -> None:
        if self.sent.is_set():
            if errors:
                self.errors = errors
            return
        self.sent.set()
        if errors:
            await self._ack(response_action="errors", errors=errors)
        else:
            await self._ack()


async def answer_form(
    ack: Callable[..., Awaitable[Any]],
    work: Callable[[FormAnswer], Awaitable[None]],
    *,
    late: FormErrors,
    failed: FormErrors,
    budget: float = ACK_BUDGET_SECONDS,
) -> FormAnswer:
    """Run ``work(answer)`` for a modal's submission and answer Slack when it calls
    ``answer`` (its decision is durable, or its input is invalid), when it ends (the modal
    closes), or after ``budget`` seconds with ``late`` (the modal stays open, saying so),
    whichever comes first; then wait for it to end. A failure of the work is answered with
    ``failed`` when still in time (else kept in ``errors``)."""
    answer = FormAnswer(ack)
    task = asyncio.ensure_future(work(answer))
    await first_of(answer.sent, task, budget)
    if not answer.sent.is_set() and not task.done():
        answer.late = True
        await answer(late)
    try:
        await task
    except Exception as exc:  # never leave the modal without an answer
        log.error("handling a form failed: %s", type(exc).__name__)
        await answer(failed)
    await answer()  # ended without answering: the modal closes
    return answer
