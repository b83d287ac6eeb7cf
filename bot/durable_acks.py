"""Acknowledging a click once its decision is durable.

A decision is acknowledged once it is durable in Redis (one script, ~1 ms), so a web process
dying right after Slack showed the click as received cannot lose it. When Redis does not
answer within ACK_BUDGET_SECONDS, the ack still goes out, and the clicker is told that
nothing is recorded yet (a form stays open, saying so), then told once it is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from . import cards
from .acking import Flag, FormAnswer, first_of
from .clicks import channel_of, form_metadata, guard, home_clicked, tell, user_id_of
from .context import BotContext

ACK_BUDGET_SECONDS = 2.0
NOT_RECORDED_YET = (
    "⚠️ Your {what} has not been recorded yet: the approval service is not answering. The card "
    "shows the outcome once it is; if it still shows the buttons in a minute, click again."
)
NOT_RECORDED_FORM = (
    "⚠️ Your denial could not be recorded yet: the approval service is not answering. "
    "Try again in a moment."
)
RECORDED_NOW = "✅ Your {what} is recorded now."


@dataclass
class Outcome:
    """What became of one click, for the handler that must acknowledge it in time."""

    durable: Flag = field(default_factory=Flag)  # decision stored in Redis
    applied: bool = False  # this click's decision is the gate's
    channel: str | None = None  # where the clicker can be told


async def told_late(ctx: BotContext, body: dict[str, Any], answer: FormAnswer, what: str) -> None:
    """After a modal answered late (it says nothing is recorded yet): tell the person
    privately what it could not show (its errors), or that their ``what`` is recorded now."""
    user_id = user_id_of(body)
    if not answer.late or not user_id:
        return
    channel = (form_metadata(body) or {}).get("channel") or None
    if answer.errors:
        text = " ".join(answer.errors.values())
    elif answer.applied:
        text = RECORDED_NOW.format(what=what) + " You can close the form."
    else:
        return
    await tell(ctx, user_id, text, channel=channel if isinstance(channel, str) else None)


async def settled_in_time(task: asyncio.Future[None], outcome: Outcome) -> bool:
    """Wait until the click's decision is durable in Redis or its handler is done, for at
    most ACK_BUDGET_SECONDS (Slack's limit is 3 s); ``False`` if neither happened."""
    return await first_of(outcome.durable, task, ACK_BUDGET_SECONDS)


async def ack_when_durable(
    ctx: BotContext,
    ack: Any,
    body: dict[str, Any],
    respond: Any,
    what: str,
    work: Callable[[Outcome], Awaitable[None]],
) -> None:
    """Run a click's ``work`` and acknowledge the click once its decision is durable (or
    after the budget, telling the clicker their ``what`` is not recorded yet).

    Returns at the ack: the work and what follows it go on in tasks that shutdown waits for
    (``BotContext.track``), so the listener needs no task of its own to answer Slack at its
    ack (no ``at_ack``): one pass of the event loop fewer before the work starts."""
    outcome = Outcome()
    since = time.time()
    task = asyncio.ensure_future(guard(ctx, body, respond, work(outcome)))
    ctx.track(task)
    settled = await settled_in_time(task, outcome)
    await ack()
    ctx.track(
        asyncio.ensure_future(_after_click(ctx, body, respond, what, task, outcome, settled, since))
    )


async def _after_click(
    ctx: BotContext,
    body: dict[str, Any],
    respond: Any,
    what: str,
    task: asyncio.Future[None],
    outcome: Outcome,
    settled: bool,
    since: float,
) -> None:
    user_id, channel = user_id_of(body), channel_of(body)
    if not settled and user_id:
        late = NOT_RECORDED_YET.format(what=what)
        await tell(ctx, user_id, late, channel=channel, respond=respond)
    await task
    await home_clicked(ctx, body, since)
    if not settled and outcome.applied and user_id:
        now = RECORDED_NOW.format(what=what)
        await tell(ctx, user_id, now, channel=channel, respond=respond)


async def submit_when_durable(
    ctx: BotContext, ack: Any, body: dict[str, Any], work: Callable[[Outcome], Awaitable[None]]
) -> None:
    """Run a deny form's ``work`` and close the form once the denial is durable (or keep it
    open after the budget, saying so). Returns at the ack, as :func:`ack_when_durable`."""
    outcome = Outcome()
    since = time.time()
    task = asyncio.ensure_future(guard(ctx, body, None, work(outcome)))
    ctx.track(task)
    settled = await settled_in_time(task, outcome)
    if settled:
        await ack()
    else:  # the form stays open, saying so
        await ack(response_action="errors", errors={cards.REASON_BLOCK: NOT_RECORDED_FORM})
    ctx.track(asyncio.ensure_future(_after_form(ctx, body, task, outcome, settled, since)))


async def _after_form(
    ctx: BotContext,
    body: dict[str, Any],
    task: asyncio.Future[None],
    outcome: Outcome,
    settled: bool,
    since: float,
) -> None:
    await task
    await home_clicked(ctx, body, since)
    user_id = user_id_of(body)
    if not settled and outcome.applied and user_id:
        now = RECORDED_NOW.format(what="denial") + " You can close the form."
        await tell(ctx, user_id, now, channel=outcome.channel)
