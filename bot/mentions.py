"""Mentions and DMs: ``@agent <task>`` in a channel, or a DM to the app, starts a run.

Slack sends ``app_mention`` for a message that mentions the bot, and ``message`` (with
``channel_type: "im"``) for a message in the app's DM. The whole text, the bot's mentions
taken out, is the task (``help`` or ``status`` are tasks here too); a first word naming a
configured agent picks it, as with the slash command (``@agent billing refund order 7``, see
:mod:`bot.directory`). The run answers in a
thread under the person's message: its root message ("Task started by …") is the thread's
first reply, and its cards and answers follow. A reply in that thread continues the run
(``bot.conversations``), and so does a mention written as a reply there: Slack sends it both
as ``app_mention`` and as ``message``, and whichever comes first adds it to the run, once
(the message's id is the dedupe key, see :func:`bot.conversations.message_key`). An empty or
too long task is answered privately; bots, this app, edits and plain channel chat are
ignored. Slack's retries of one message start one run; when Redis fails, the author is told.
"""

from __future__ import annotations

import logging
import re
import secrets
from dataclasses import dataclass
from typing import Any

from slack_bolt.async_app import AsyncApp, AsyncBoltContext

from . import cards, run_cards
from .acking import Ack, ack_when_recorded, at_ack
from .commands import MAX_TASK_CHARS, parse_task
from .context import BotContext, Redeliver
from .conversations import (
    _BACKEND_ERRORS,
    MESSAGE_NS,
    UNAVAILABLE,
    Conversations,
    Reply,
    message_key,
)
from .directory import NO_TASK
from .publisher import slack_error
from .store import RECORD_TTL_SECONDS

log = logging.getLogger(__name__)

# How long a delivery's claim on a new task's message lasts: another delivery of it (Slack
# retries an event not answered within 3 s: at once, then after 1 and 5 minutes) waits that
# long for the holder, which answers within ACK_BUDGET_SECONDS unless its process died.
CLAIM_SECONDS = 10.0
_MENTION = re.compile(r"\s*<@([A-Z0-9]+)(?:\|[^>]*)?>\s*")

EMPTY = "Write the task after the mention, for example: {bot} look up user 7. Nothing was started."
TOO_LONG = (
    "That task is {n:,} characters long; the limit is {limit:,}. Please shorten it. "
    "Nothing was started."
)
NOT_POSTED = (
    "I could not post here ({err}). The task was started anyway as run `{run}`: "
    "`/agent status` shows it."
)
BACKEND_DOWN = "The agent backend is unavailable, so the task was not started. Try again shortly."


@dataclass(frozen=True)
class Ask:
    """A message that asks for a run: where it is, who wrote it, and its text."""

    channel: str
    ts: str
    thread_ts: str | None  # the thread it was written in, if any
    user: str
    text: str

    @property
    def thread(self) -> str:
        """The thread the run answers in: the message's own, or the one it is in."""
        return self.thread_ts or self.ts


def strip_mentions(text: str, bot_user_id: str | None) -> str:
    """``text`` without the bot's mentions (without the leading mention if the bot's id is
    unknown), spaces around them collapsed."""

    def drop(m: re.Match[str]) -> str:
        return " " if m.group(1) == bot_user_id else m.group(0)

    if bot_user_id is None:
        return _MENTION.sub(" ", text, count=1) if _MENTION.match(text) else text
    return _MENTION.sub(drop, text)


def ask_of(event: dict[str, Any], bot_user_id: str | None) -> Ask | None:
    """The ask in a person's own, new message (no bot, no edit, not this app's), or None."""
    if event.get("bot_id") or event.get("subtype") is not None:
        return None
    channel, ts, user, text = (event.get(k) for k in ("channel", "ts", "user", "text"))
    if not all(isinstance(v, str) and v for v in (channel, ts, user)) or not isinstance(text, str):
        return None
    if bot_user_id and user == bot_user_id:
        return None
    thread_ts = event.get("thread_ts")
    thread = thread_ts if isinstance(thread_ts, str) and thread_ts and thread_ts != ts else None
    return Ask(str(channel), str(ts), thread, str(user), text)


async def is_dm_task(event: dict[str, Any], context: AsyncBoltContext) -> bool:
    """A new message (not a thread reply) in the app's DM: a listener matcher."""
    ask = ask_of(event, context.bot_user_id)
    return event.get("channel_type") == "im" and ask is not None and ask.thread_ts is None


class Mentions:
    """What a mention or a DM does."""

    def __init__(self, ctx: BotContext) -> None:
        self.ctx = ctx
        self.conversations = Conversations(ctx)

    async def on_ask(
        self,
        ask: Ask,
        team: str,
        bot_user_id: str | None,
        ack: Ack | None = None,
    ) -> None:
        """Start a run on the ask's text (the bot's mentions taken out), answering in its
        thread; in a run's thread, add it to that run instead (as written, as the
        ``message`` event of the same message would). ``ack`` once that is recorded: the run
        is durable and its root message posted, or nothing needs starting.

        A delivery claims the message for :data:`CLAIM_SECONDS`. Slack's retry of a message
        whose web process died before the ack (``ack_when_recorded``'s budget) finds no run,
        or a run without its root message, and carries on once the claim lapsed; until then
        it is left unacknowledged (:class:`Redeliver`), for Slack to deliver again later.
        """
        ctx = self.ctx
        ident = f"{ask.channel}:{ask.ts}"
        key = message_key(ask.channel, ask.ts)
        try:
            run_id = None
            if ask.thread_ts:
                run_id = await ctx.store.run_of_thread(ask.channel, ask.thread_ts)
            claimed, started = False, None
            if run_id is None:
                claimed = await ctx.store.claim(
                    MESSAGE_NS, ident, secrets.token_hex(8), CLAIM_SECONDS
                )
                started = await ctx.gateway.started_run(key)
        except _BACKEND_ERRORS as exc:
            log.error("a message to the app was not recorded: %s", type(exc).__name__)
            if ack is not None:
                await ack()
            await self._tell(ask, UNAVAILABLE)
            return
        if run_id is not None:
            reply = Reply(ask.channel, ask.thread_ts or ask.ts, ask.ts, ask.user, ask.text)
            await self.conversations.on_reply(reply, ack, run_id=run_id)
            return
        if started is not None:
            # Slack's retry of a message whose run exists: nothing is started twice. The
            # claim's holder finishes what a dead delivery may have left (the root message).
            log.info("message %s already started run %s (a retry)", ident, started)
            if claimed:
                await self._show_started(started, ask, None, ack)
            elif ack is not None:
                await ack()
            return
        if not claimed:
            raise Redeliver(f"message {ident} is being started by another delivery")
        text = strip_mentions(ask.text, bot_user_id)
        bot = f"<@{bot_user_id}>" if bot_user_id else "@agent"
        route = ctx.agents.route(parse_task(text))
        task, agent = route.task, route.agent
        refusal = None
        if not task:
            if route.named and agent is not None:
                refusal = NO_TASK.format(agent=cards.clip_escaped(agent.name, 100), command=bot)
            else:
                refusal = EMPTY.format(bot=bot)
        elif len(task) > MAX_TASK_CHARS:
            refusal = TOO_LONG.format(n=len(task), limit=MAX_TASK_CHARS)
        note = None
        if refusal is None:
            refusal, note = await ctx.agents.refusal(agent)
        if refusal is not None:
            if ack is not None:
                await ack()
            await self._tell(ask, refusal)
            return
        origin = {"channel": ask.channel, "thread_ts": ask.thread, "team": team}
        try:
            # Durable before the ack and before anything is posted: a web process that dies
            # earlier has the event delivered again, and the message's key starts one run.
            run = await ctx.gateway.start_run(
                task,
                requested_by=ask.user,
                origin=origin,
                # The message's dedupe key: its `message` twin, if it comes as a reply to
                # this run, finds it recorded (Gateway.continue_run).
                idempotency_key=key,
                agent=agent.name if agent else None,
            )
        except Exception:
            log.exception("start_run failed")
            if ack is not None:
                await ack()
            await self._tell(ask, BACKEND_DOWN)
            return
        log.info("run %s started by %s from a message in %s", run.run_id, ask.user, ask.channel)
        await self._show_started(run.run_id, ask, note, ack)

    async def _show_started(self, run_id: str, ask: Ask, note: str | None, ack: Ack | None) -> None:
        """Link the person's thread to the run and post the run's root message there (unless
        it already is), then ``ack``."""
        ctx = self.ctx
        try:
            # Replies in the person's thread (not under the root message) continue the run.
            thread_key = ctx.store.thread_key(ask.channel, ask.thread)
            await ctx.store.redis.set(thread_key, run_id, ex=RECORD_TTL_SECONDS)
            run = None if (await ctx.store.run(run_id)).ts else await ctx.gateway.get_run(run_id)
        except Exception as exc:
            log.warning("root message not posted: %s", exc)
            run = None
        if run is None:
            if ack is not None:
                await ack()
            return
        root = run_cards.root_message(run.task, run.requested_by, run, ctx.settings.slash_command)
        try:
            resp = await ctx.client.chat_postMessage(
                channel=ask.channel, thread_ts=ask.thread, text=root.text, blocks=root.blocks
            )
        except Exception as exc:
            err = slack_error(exc)
            log.warning("could not post the task message in %s: %s", ask.channel, err)
            if ack is not None:
                await ack()
            await self._tell(ask, NOT_POSTED.format(err=err, run=cards.clip_escaped(run_id, 100)))
            return
        try:
            await ctx.store.save_run_root(run_id, ask.channel, str(resp["ts"]))
        except Exception as exc:  # the notifier updates it on the run's next event
            log.warning("root message not recorded: %s", exc)
        if ack is not None:
            await ack()
        if note is not None:
            await self._tell(ask, note)
        try:
            await ctx.publisher.show_run(run_id)
        except Exception as exc:  # the notifier updates it on the run's next event
            log.warning("root message update deferred: %s", exc)

    async def _tell(self, ask: Ask, text: str) -> None:
        """A message only the asker sees, where they asked."""
        try:
            await self.ctx.client.chat_postEphemeral(
                channel=ask.channel, user=ask.user, text=text, thread_ts=ask.thread_ts
            )
        except Exception as exc:
            log.warning("could not tell %s: %s", ask.user, slack_error(exc))


def register(app: AsyncApp, ctx: BotContext) -> None:
    """Register before ``bot.conversations``: Bolt runs the first listener that matches."""
    mentions = Mentions(ctx)

    async def handle(
        ack: Any, event: dict[str, Any], body: dict[str, Any], bot: str | None
    ) -> None:
        ask = ask_of(event, bot)
        if ask is None:
            await ack()
            return
        team = str(body.get("team_id") or "")

        async def work(ack_once: Ack) -> None:
            await mentions.on_ask(ask, team, bot, ack_once)

        async with ctx.busy():
            await ack_when_recorded(ack, work)

    @app.event("app_mention")
    @at_ack(ctx)
    async def on_mention(
        ack: Any, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext
    ) -> None:
        await handle(ack, event, body, context.bot_user_id)

    @app.event("message", matchers=[is_dm_task])
    @at_ack(ctx)
    async def on_dm(
        ack: Any, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext
    ) -> None:
        await handle(ack, event, body, context.bot_user_id)
