"""Slack's assistant threads ("Agents & AI Apps"): the app's split view runs tasks.

Opening the app's assistant container starts a thread in the person's DM with the app
(``assistant_thread_started``): the app greets them there and offers the agent's suggested
prompts. Their message in that thread starts a run, as a DM does (:mod:`bot.mentions`), and
a later one continues it (:mod:`bot.conversations`): the card and the answers stay in the
thread. While the run works, the thread's status line says what it is doing ("is working…",
"is waiting for approval from @Avery"), and it is cleared when the run ends: the notifier
calls :func:`show_status` after each event it handled, and only a run whose origin says
``assistant`` gets a status.

Each thread (who opened it, and its context: the channel they are looking at, updated by
``assistant_thread_context_changed``) is a record in Redis, which is also Bolt's thread
context store. Bolt's default store keeps the context in the metadata of the app's first
reply in the thread (``conversations.replies``, then ``chat.update`` on every change), and
loses a change that comes before that reply.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from redis.exceptions import RedisError
from slack_bolt.async_app import AsyncApp, AsyncBoltContext
from slack_bolt.context.assistant.thread_context import AssistantThreadContext
from slack_bolt.context.assistant.thread_context_store.async_store import (
    AsyncAssistantThreadContextStore,
)
from slack_bolt.listener_matcher.async_listener_matcher import AsyncCustomListenerMatcher
from slack_bolt.middleware.assistant.async_assistant import AsyncAssistant
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse

from agent_core.agent import Agent
from agent_core.models import Event, EventType, GateStatus, Run

from .acking import Ack, ack_when_recorded, at_ack, in_background
from .cards import escape
from .context import BotContext
from .directory import AgentEntry
from .mentions import Mentions, ask_of
from .ports import GatewayLike
from .publisher import Publisher, slack_error
from .settings import parse_approvers
from .store import RECORD_TTL_SECONDS, Store

log = logging.getLogger(__name__)

ORIGIN_KEY = "assistant"  # origin["assistant"] = True: the run answers in an assistant thread
THREAD_NS = "slack-assistant"
WORKING = "is working…"
WAITING = "is waiting for approval"
STATUS_TIMEOUT = 5.0  # seconds a status update may hold up the notifier
NAME_TTL = 600.0  # seconds a looked-up name is kept
NAME_FAILURE_TTL = 30.0
MAX_NAMES = 3
GREETING = (
    "Hi <@{user}>! {about}Tell me what to do and I will work on it in this thread; any step "
    "that needs a human's approval waits here for an approver."
)

_FINISHED = {EventType.RUN_COMPLETED, EventType.RUN_FAILED, EventType.RUN_CANCELLED}
_STARTED = {EventType.RUN_STARTED, EventType.RUN_CONTINUED, EventType.RUN_RETRIED}


class ThreadStore(AsyncAssistantThreadContextStore):
    """Assistant threads in Redis: who opened each, and its context (Bolt's context store)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def key(self, channel: str, thread_ts: str) -> str:
        ident = f"{channel}:{thread_ts}"
        return self.store.keys.ext(THREAD_NS, ident, self.store.keys.shard_for(ident))

    async def start(self, channel: str, thread_ts: str, user: str, context: dict[str, Any]) -> bool:
        """Record a new thread; False when it was recorded already (Slack retried the event)."""
        key = self.key(channel, thread_ts)
        async with self.store.redis.pipeline(transaction=True) as pipe:
            pipe.hsetnx(key, "user", user)
            pipe.hsetnx(key, "context", json.dumps(context))
            pipe.expire(key, RECORD_TTL_SECONDS)
            first, _, _ = await pipe.execute()
        return bool(first)

    async def known(self, channel: str, thread_ts: str) -> bool:
        """Whether the thread is an assistant thread (its start was recorded)."""
        return bool(await self.store.redis.exists(self.key(channel, thread_ts)))

    async def save(self, *, channel_id: str, thread_ts: str, context: dict[str, str]) -> None:
        key = self.key(channel_id, thread_ts)
        async with self.store.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, "context", json.dumps(context))
            pipe.expire(key, RECORD_TTL_SECONDS)
            await pipe.execute()

    async def find(self, *, channel_id: str, thread_ts: str) -> AssistantThreadContext | None:
        raw = await self.store.redis.hget(self.key(channel_id, thread_ts), "context")
        try:
            context = json.loads(raw) if raw else None
        except ValueError:
            return None
        if not isinstance(context, dict) or not context.get("channel_id"):
            return None
        return AssistantThreadContext(context)


class _AssistantRuns:
    """The gateway, marking the runs it starts as an assistant thread's (origin)."""

    def __init__(self, gateway: GatewayLike) -> None:
        self._gateway = gateway

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gateway, name)

    async def start_run(
        self, task: str, requested_by: str, origin: dict[str, Any] | None = None, **kw: Any
    ) -> Run:
        marked = {**(origin or {}), ORIGIN_KEY: True}
        return await self._gateway.start_run(task, requested_by, marked, **kw)


def prompts_of(agent: Agent | AgentEntry | None) -> list[dict[str, str]]:
    """The agent's suggested prompts as Slack takes them (a plain text is title and message)."""
    out: list[dict[str, str]] = []
    for p in agent.suggested_prompts if agent is not None else ():
        texts: Sequence[str] = (p,) if isinstance(p, str) else cast(tuple[str, ...], p)
        out.append({"title": texts[0], "message": texts[-1]})
    return out


class Assistant:
    """What happens in an assistant thread: its start, and the person's messages."""

    def __init__(self, ctx: BotContext, threads: ThreadStore, agent: Agent | None = None) -> None:
        self.ctx = ctx
        self.threads = threads
        self._agent = agent
        # bot.mentions starts the run (the DM path); its runs are marked as this thread's.
        marked = dataclasses.replace(ctx, gateway=cast(GatewayLike, _AssistantRuns(ctx.gateway)))
        self.mentions = Mentions(marked)

    @property
    def agent(self) -> Agent | AgentEntry | None:
        """The agent whose prompts the threads offer: the one given, or the default one."""
        return self._agent if self._agent is not None else self.ctx.agents.default

    async def is_thread(self, body: dict[str, Any]) -> bool:
        """A listener matcher: the message is in a recorded assistant thread (other DM
        threads are left to bot.conversations)."""
        event = body.get("event") or {}
        channel, thread_ts = event.get("channel"), event.get("thread_ts")
        if not (isinstance(channel, str) and isinstance(thread_ts, str)):
            return False
        try:
            return await self.threads.known(channel, thread_ts)
        except (RedisError, OSError) as exc:
            log.warning("could not tell an assistant thread (%s)", type(exc).__name__)
            return False

    async def on_thread_started(self, event: dict[str, Any]) -> None:
        """Record the thread, greet its person and offer the agent's suggested prompts."""
        thread = event.get("assistant_thread")
        if not isinstance(thread, dict):
            return
        channel, thread_ts, user = (thread.get(k) for k in ("channel_id", "thread_ts", "user_id"))
        if not all(isinstance(v, str) and v for v in (channel, thread_ts, user)):
            return
        channel, thread_ts, user = str(channel), str(thread_ts), str(user)
        context = thread.get("context")
        if not await self.threads.start(
            channel, thread_ts, user, context if isinstance(context, dict) else {}
        ):
            log.info("assistant thread %s %s already started (a retry)", channel, thread_ts)
            return
        agent = self.agent
        about = ""
        if agent is not None:
            about = escape(agent.description.strip() or f"I am the {agent.name} agent.")
        client = self.ctx.client
        try:
            text = GREETING.format(user=user, about=f"{about} " if about else "")
            await client.chat_postMessage(channel=channel, thread_ts=thread_ts, text=text)
        except Exception as exc:
            log.warning("could not greet in assistant thread %s: %s", channel, slack_error(exc))
        prompts = prompts_of(agent)
        if not prompts:
            return
        try:
            await client.assistant_threads_setSuggestedPrompts(
                channel_id=channel, thread_ts=thread_ts, prompts=prompts
            )
        except Exception as exc:
            log.warning("could not offer suggested prompts: %s", slack_error(exc))

    async def on_message(
        self,
        event: dict[str, Any],
        body: dict[str, Any],
        bot_user_id: str | None,
        ack: Ack | None = None,
    ) -> None:
        """The person's message in the thread: the first starts a run, later ones continue it
        (each message once, by its id; ``ack`` once it is recorded)."""
        ask = ask_of(event, bot_user_id)
        if ask is None or ask.thread_ts is None:
            if ack is not None:
                await ack()
            return
        await self.mentions.on_ask(ask, str(body.get("team_id") or ""), bot_user_id, ack)


class ApproverNames:
    """The names people know approvers by: a user's display name, a user group's handle."""

    def __init__(self, ctx: BotContext) -> None:
        self.client = ctx.client
        self._names: dict[str, tuple[float, str | None]] = {}
        self._groups_until = 0.0

    async def name(self, ident: str) -> str | None:
        """``@name`` for a user or user group id, or None when Slack would not say."""
        cached = self._names.get(ident)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        if ident.startswith("S"):
            await self._load_groups()
            cached = self._names.get(ident)
            return cached[1] if cached else None
        name: str | None = None
        try:
            user = (await self.client.users_info(user=ident)).get("user") or {}
            profile = user.get("profile") or {}
            found = profile.get("display_name") or user.get("real_name") or user.get("name")
            name = f"@{found}" if found else None
        except Exception as exc:
            log.warning("could not look up the name of %s: %s", ident, slack_error(exc))
        ttl = NAME_TTL if name else NAME_FAILURE_TTL
        self._names[ident] = (time.monotonic() + ttl, name)
        return name

    async def _load_groups(self) -> None:
        now = time.monotonic()
        if self._groups_until > now:
            return
        self._groups_until = now + NAME_FAILURE_TTL
        try:
            groups = (await self.client.usergroups_list()).get("usergroups") or []
        except Exception as exc:
            log.warning("could not list the user groups: %s", slack_error(exc))
            return
        self._groups_until = now + NAME_TTL
        for g in groups:
            if isinstance(g, dict) and g.get("id") and g.get("handle"):
                self._names[str(g["id"])] = (now + NAME_TTL, f"@{g['handle']}")


class StatusLine:
    """Keeps an assistant thread's status line in step with its run's events."""

    def __init__(self, ctx: BotContext) -> None:
        self.ctx = ctx
        self.names = ApproverNames(ctx)

    async def on_event(self, event: Event) -> None:
        """Set the status the event calls for; never raises (a status is only a hint)."""
        origin = event.data.get("origin")
        if not isinstance(origin, dict) or origin.get(ORIGIN_KEY) is not True:
            return
        channel, thread_ts = origin.get("channel"), origin.get("thread_ts")
        if not (isinstance(channel, str) and channel and isinstance(thread_ts, str) and thread_ts):
            return
        try:
            status = await self.status_for(event, child=bool(origin.get("parent_run")))
            if status is None:
                return
            await asyncio.wait_for(
                self.ctx.client.assistant_threads_setStatus(
                    channel_id=channel, thread_ts=thread_ts, status=status
                ),
                STATUS_TIMEOUT,
            )
        except Exception as exc:
            log.warning(
                "could not set the status of assistant thread %s %s: %s",
                channel,
                thread_ts,
                slack_error(exc),
            )

    async def status_for(self, event: Event, *, child: bool = False) -> str | None:
        """The status after ``event`` ("" clears it), or None to leave it as it is.

        ``child``: the run is a sub-agent's, whose end lets its parent work on.
        """
        t, data = event.type, event.data
        if t in _STARTED or (t is EventType.TOOL_EXECUTED and not data.get("after_cancel")):
            return WORKING
        if t is EventType.GATE_OPENED:
            asked = data.get("requesters")
            who = [str(u) for u in asked] if isinstance(asked, list) else []
            return await self.waiting([str(data.get("requested_by") or ""), *who])
        if t in (EventType.GATE_REMINDED, EventType.GATE_ESCALATED):
            # Its reply in the thread cleared the status line: still waiting, if it is.
            gate = await self.ctx.gateway.get_gate(str(data.get("gate_id") or ""))
            if gate is None or gate.status is not GateStatus.PENDING:
                return None
            return await self.waiting([gate.requested_by, *gate.requesters])
        if t is EventType.GATE_DECIDED and data.get("status") != "cancelled":
            # A turn resumes when its last gate is decided; a cancelled gate's run ends next.
            pending = await self.ctx.gateway.pending_gates(event.run_id)
            if not pending:
                return WORKING
            return await self.waiting([pending[0].requested_by, *pending[0].requesters])
        if t in _FINISHED:
            return WORKING if child else ""
        return None

    async def waiting(self, requesters: list[str]) -> str:
        """The status while a gate is open, naming the approvers as configured (the call's
        requesters left out unless they may approve their own calls): ``is waiting for
        approval from @Avery or @oncall``."""
        spec = parse_approvers(self.ctx.settings.approvers)
        if not spec or "*" in spec:
            return WAITING
        self_ok = self.ctx.settings.allow_self_approval
        named: list[str] = []
        unnamed = 0
        for ident in spec:
            if ident in requesters and not self_ok:
                continue
            name = await self.names.name(ident)
            if name:
                named.append(name)
            else:
                unnamed += 1
        if not named:
            return WAITING
        if unnamed:
            named.append("another approver")
        return f"{WAITING} from {_either(named)}"


def _either(names: list[str]) -> str:
    """Names joined as a person would: ``a``, ``a or b``, ``a, b or c``, and
    ``a, b, c or 2 others``."""
    if len(names) > MAX_NAMES:
        names = [*names[:MAX_NAMES], f"{len(names) - MAX_NAMES} others"]
    if len(names) == 1:
        return names[0]
    return f"{', '.join(names[:-1])} or {names[-1]}"


# The status line of each web process's app, found by the notifier through the publisher
# they share (BotContext.publisher).
_LINES: weakref.WeakKeyDictionary[Publisher, StatusLine] = weakref.WeakKeyDictionary()


def status_line(publisher: Publisher) -> StatusLine | None:
    """The status line of the app whose notifier posts with ``publisher``."""
    return _LINES.get(publisher)


async def show_status(publisher: Publisher, event: Event) -> None:
    """The notifier's hook, after it handled ``event``: update the status line of the run's
    assistant thread, if it has one. Never raises."""
    line = status_line(publisher)
    if line is not None:
        await line.on_event(event)


class _EventsOnly(AsyncAssistant):
    """Bolt's assistant middleware, passed by for anything but an event (an assistant
    thread only ever sends events): it matches its listeners against every request, a
    click's included (~4 % of the web process's CPU under a load of clicks)."""

    async def async_process(
        self,
        *,
        req: AsyncBoltRequest,
        resp: BoltResponse,
        next: Callable[[], Awaitable[BoltResponse]],
    ) -> BoltResponse | None:
        if req.body.get("type") != "event_callback":
            return await next()
        return await super().async_process(req=req, resp=resp, next=next)


def register(app: AsyncApp, ctx: BotContext, agent: Agent | None = None) -> Assistant:
    """Listen to assistant threads (``agent``'s prompts; default: the default agent's)."""
    threads = ThreadStore(ctx.store)
    assistant = Assistant(ctx, threads, agent)
    bolt = _EventsOnly(thread_context_store=threads)
    in_thread = AsyncCustomListenerMatcher(app_name=app.name, func=assistant.is_thread)

    # Bolt acknowledges a thread's start itself once this returns: it returns at once.
    @bolt.thread_started
    @in_background(ctx)
    async def thread_started(event: dict[str, Any]) -> None:
        async with ctx.busy():
            await assistant.on_thread_started(event)

    # A message is acknowledged once recorded (see bot.conversations), as in a DM.
    @bolt.user_message(matchers=[in_thread])  # type: ignore[arg-type]
    @at_ack(ctx)
    async def user_message(
        ack: Any, body: dict[str, Any], event: dict[str, Any], context: AsyncBoltContext
    ) -> None:
        async def work(ack_once: Ack) -> None:
            await assistant.on_message(event, body, context.bot_user_id, ack_once)

        async with ctx.busy():
            await ack_when_recorded(ack, work)

    # assistant_thread_context_changed: Bolt's own listener saves the context in `threads`.
    app.assistant(bolt)
    _LINES[ctx.publisher] = StatusLine(ctx)
    return assistant
