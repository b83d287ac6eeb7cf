"""Thread replies: a person's reply in a run's thread continues the run's conversation.

Slack sends each message of the channels the bot is in (Events API ``message``, the
``message.channels`` and ``message.groups`` subscriptions). A reply whose thread is a run's
(the root message ``/agent`` posted) goes to :meth:`Gateway.continue_run`: a finished run
starts its next turn, a working one queues it (the author is told privately, in the thread),
a cancelled one refuses (ditto). Everything else (bots, this app, edits, joins, other
threads) is ignored without a word. Each event is handled once: Slack's retries and
duplicate deliveries carry the same ``event_id``.
"""

from __future__ import annotations

import logging
from typing import Any

from slack_bolt.async_app import AsyncApp, AsyncBoltContext

from agent_core.exceptions import InvalidState, RunNotFound
from agent_core.models import ContinueOutcome

from .acking import at_ack
from .cards import clip_escaped
from .context import BotContext
from .publisher import slack_error

log = logging.getLogger(__name__)

EVENT_NS = "slack-event"
EVENT_TTL_SECONDS = 3600  # Slack retries for about an hour at most
# Subtypes that are still a person's plain reply ("also send to channel").
_REPLY_SUBTYPES = frozenset({"thread_broadcast"})

QUEUED = (
    "The agent is still working on run `{run}`, so your message was queued: it gets it at "
    "its next step, after the current one."
)
CANCELLED = (
    "Run `{run}` was cancelled, so it does not continue. "
    "Start a new one with `{command} &lt;task&gt;`."
)
GONE = (
    "Run `{run}` is no longer kept, so it cannot continue. "
    "Start a new one with `{command} &lt;task&gt;`."
)
TOO_LONG = "Your message was not passed on to run `{run}`: {why}."


def reply_of(event: dict[str, Any], bot_user_id: str | None) -> tuple[str, str, str, str] | None:
    """(channel, thread_ts, user, text) of a person's reply in a thread, or None."""
    if event.get("type") != "message" or event.get("bot_id"):
        return None
    subtype = event.get("subtype")
    if subtype is not None and subtype not in _REPLY_SUBTYPES:
        return None  # edits, deletions, joins, bot messages, …
    channel, thread_ts, ts = event.get("channel"), event.get("thread_ts"), event.get("ts")
    user, text = event.get("user"), event.get("text")
    if not all(isinstance(v, str) and v for v in (channel, thread_ts, user, text)):
        return None
    if thread_ts == ts or (bot_user_id and user == bot_user_id):
        return None  # a root message, or this app's own
    return str(channel), str(thread_ts), str(user), str(text)


class Conversations:
    """What a thread reply does."""

    def __init__(self, ctx: BotContext) -> None:
        self.ctx = ctx

    async def on_reply(self, channel: str, thread_ts: str, user: str, text: str) -> None:
        ctx = self.ctx
        run_id = await ctx.store.run_of_thread(channel, thread_ts)
        if run_id is None:
            log.debug("a reply in a thread that is no run's (%s %s) ignored", channel, thread_ts)
            return
        run = clip_escaped(run_id, 100)
        command = ctx.settings.slash_command
        try:
            outcome = await ctx.gateway.continue_run(run_id, text, by=user)
        except InvalidState:
            say = CANCELLED.format(run=run, command=command)
        except RunNotFound:
            say = GONE.format(run=run, command=command)
        except ValueError as exc:
            say = TOO_LONG.format(run=run, why=exc)
        else:
            log.info("run %s continued by %s (%s)", run_id, user, outcome.value)
            if outcome is not ContinueOutcome.QUEUED:
                return  # the run's answer comes in the thread
            say = QUEUED.format(run=run)
        await self._tell(user, channel, thread_ts, say)

    async def _tell(self, user: str, channel: str, thread_ts: str, text: str) -> None:
        """A message only ``user`` sees, in the thread."""
        try:
            await self.ctx.client.chat_postEphemeral(
                channel=channel, user=user, text=text, thread_ts=thread_ts
            )
        except Exception as exc:
            log.warning("could not tell %s: %s", user, slack_error(exc))


def register(app: AsyncApp, ctx: BotContext) -> None:
    conversations = Conversations(ctx)

    @app.event("message")
    @at_ack(ctx)
    async def on_message(
        ack: Any, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext
    ) -> None:
        await ack()
        reply = reply_of(event, context.bot_user_id)
        if reply is None:
            return
        event_id = body.get("event_id")
        async with ctx.busy():
            # Slack's retries (X-Slack-Retry-Num) and duplicates carry the same event_id.
            if isinstance(event_id, str) and event_id:
                if not await ctx.store.first_time(EVENT_NS, event_id, EVENT_TTL_SECONDS):
                    log.info("event %s already handled (a retry)", event_id)
                    return
            await conversations.on_reply(*reply)
