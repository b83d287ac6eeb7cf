"""Thread replies: a person's reply in a run's thread continues the run's conversation.

Slack sends each message of the channels the bot is in (Events API ``message``, the
``message.channels`` and ``message.groups`` subscriptions). A reply whose thread is a run's
(the root message ``/agent`` posted) goes to :meth:`Gateway.continue_run`: a finished run
starts its next turn, a working one queues it (the author is told privately, in the thread),
a cancelled one refuses (ditto). Everything else (bots, this app, edits, joins, other
threads) is ignored without a word.

Each message is handled once. Slack may deliver it again (a retry, with the same
``event_id``), and a reply that mentions the app comes twice, as ``app_mention``
(:mod:`bot.mentions`) and as ``message``, with different event ids: so the message's own id
(channel and ts, :func:`message_key`) is the dedupe key, recorded by the same Redis script
that adds the message to the run. A message that started a run (a mention) carries the same
key. The event is acknowledged once the reply is recorded (or after ACK_BUDGET_SECONDS), so
a web process that dies before leaves it to Slack's retry; a reply that could not be
recorded is not dropped in silence: its author is told, privately, to send it again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from redis.exceptions import RedisError, ResponseError
from slack_bolt.async_app import AsyncApp, AsyncBoltContext

from agent_core.exceptions import InvalidState, RunNotFound
from agent_core.models import ContinueOutcome

from .acking import Ack, ack_when_recorded, at_ack
from .cards import clip_escaped
from .context import BotContext, Redeliver
from .publisher import slack_error

log = logging.getLogger(__name__)

MESSAGE_NS = "slack-message"  # a Slack message's dedupe (and idempotency) key: see message_key
# Subtypes that are still a person's plain reply ("also send to channel").
_REPLY_SUBTYPES = frozenset({"thread_broadcast"})
# What Redis raises when it fails: an error reply (the script did not record the message),
# or no answer (it may have).
_BACKEND_ERRORS = (RedisError, OSError)

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
NOT_RECORDED = (
    "Your message was not recorded for run `{run}`: the agent backend failed, so the agent "
    "will not see it. Please send it again."
)
IN_DOUBT = (
    "Your message may not have been recorded for run `{run}`: the agent backend did not "
    "answer. If the agent does not take it up, please send it again."
)
UNAVAILABLE = (
    "The agent backend is unavailable, so your message was not recorded. Please send it "
    "again shortly."
)
# When Redis cannot even say whether a reply's thread is a run's: "tell" its author (a
# message to the app: a mention, a DM), stay "quiet" (its app_mention twin tells them), or
# leave the event unacknowledged for Slack to "redeliver" (any person's reply anywhere).
Unreachable = Literal["tell", "quiet", "redeliver"]


def message_key(channel: str, ts: str) -> str:
    """The dedupe key of a Slack message (what ``start_run`` and ``continue_run`` take):
    its channel and ts, the same whichever event delivered it."""
    return f"{MESSAGE_NS}:{channel}:{ts}"


@dataclass(frozen=True)
class Reply:
    """A person's message in a thread."""

    channel: str
    thread_ts: str
    ts: str
    user: str
    text: str

    @property
    def key(self) -> str:
        return message_key(self.channel, self.ts)


def reply_of(event: dict[str, Any], bot_user_id: str | None) -> Reply | None:
    """A person's reply in a thread, or None."""
    if event.get("type") != "message" or event.get("bot_id"):
        return None
    subtype = event.get("subtype")
    if subtype is not None and subtype not in _REPLY_SUBTYPES:
        return None  # edits, deletions, joins, bot messages, …
    channel, thread_ts, ts = event.get("channel"), event.get("thread_ts"), event.get("ts")
    user, text = event.get("user"), event.get("text")
    if not all(isinstance(v, str) and v for v in (channel, thread_ts, ts, user, text)):
        return None
    if thread_ts == ts or (bot_user_id and user == bot_user_id):
        return None  # a root message, or this app's own
    return Reply(str(channel), str(thread_ts), str(ts), str(user), str(text))


class Conversations:
    """What a thread reply does."""

    def __init__(self, ctx: BotContext) -> None:
        self.ctx = ctx

    async def on_reply(
        self,
        reply: Reply,
        ack: Ack | None = None,
        *,
        run_id: str | None = None,
        unreachable: Unreachable = "tell",
    ) -> None:
        """Add ``reply`` to its thread's run (``run_id``, when already looked up), once;
        ``ack`` as soon as that is recorded (or known not to concern a run)."""
        ctx = self.ctx
        if run_id is None:
            try:
                run_id = await ctx.store.run_of_thread(reply.channel, reply.thread_ts)
            except _BACKEND_ERRORS as exc:
                log.warning("could not look up the thread of a reply: %s", type(exc).__name__)
                if unreachable == "redeliver":
                    raise Redeliver("the thread of a reply could not be looked up") from exc
                await _acked(ack)
                if unreachable == "tell":
                    await self.tell(reply.user, reply.channel, reply.thread_ts, UNAVAILABLE)
                return
        if run_id is None:
            await _acked(ack)
            log.debug("a reply in a thread that is no run's (%s) ignored", reply.channel)
            return
        run = clip_escaped(run_id, 100)
        command = ctx.settings.slash_command
        try:
            outcome = await ctx.gateway.continue_run(
                run_id, reply.text, by=reply.user, dedupe_key=reply.key
            )
        except InvalidState:
            say = CANCELLED.format(run=run, command=command)
        except RunNotFound:
            say = GONE.format(run=run, command=command)
        except ValueError as exc:
            say = TOO_LONG.format(run=run, why=exc)
        except _BACKEND_ERRORS as exc:
            # A script error recorded nothing (the dedupe key is written last); no answer
            # may mean it did. Either way the message is not marked handled unless recorded.
            log.error("a reply to run %s was not recorded: %s", run_id, type(exc).__name__)
            failed = isinstance(exc, ResponseError)
            say = (NOT_RECORDED if failed else IN_DOUBT).format(run=run)
        else:
            if outcome is ContinueOutcome.DUPLICATE:
                await _acked(ack)
                log.info("message %s already handled (delivered again)", reply.key)
                return
            log.info("run %s continued by %s (%s)", run_id, reply.user, outcome.value)
            if outcome is not ContinueOutcome.QUEUED:
                await _acked(ack)
                return  # the run's answer comes in the thread
            say = QUEUED.format(run=run)
        await _acked(ack)
        await self.tell(reply.user, reply.channel, reply.thread_ts, say)

    async def tell(self, user: str, channel: str, thread_ts: str | None, text: str) -> None:
        """A message only ``user`` sees, in the thread."""
        try:
            await self.ctx.client.chat_postEphemeral(
                channel=channel, user=user, text=text, thread_ts=thread_ts
            )
        except Exception as exc:
            log.warning("could not tell %s: %s", user, slack_error(exc))


async def _acked(ack: Ack | None) -> None:
    if ack is not None:
        await ack()


def mentions_app(text: str, bot_user_id: str | None) -> bool:
    """The text mentions this app (Slack then also sends it as ``app_mention``)."""
    if not bot_user_id:
        return False
    return f"<@{bot_user_id}>" in text or f"<@{bot_user_id}|" in text


def register(app: AsyncApp, ctx: BotContext) -> None:
    conversations = Conversations(ctx)

    @app.event("message")
    @at_ack(ctx)
    async def on_message(
        ack: Any, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext
    ) -> None:
        reply = reply_of(event, context.bot_user_id)
        if reply is None:
            await ack()
            return
        unreachable: Unreachable = "redeliver"
        if event.get("channel_type") == "im":
            unreachable = "tell"  # a message to the app
        elif mentions_app(reply.text, context.bot_user_id):
            unreachable = "quiet"  # its app_mention twin tells the author

        async def work(ack_once: Ack) -> None:
            await conversations.on_reply(reply, ack_once, unreachable=unreachable)

        async with ctx.busy():
            await ack_when_recorded(ack, work)
