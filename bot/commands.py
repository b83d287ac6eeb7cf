"""The slash command: ``/agent [<agent>] <task>``, ``help``, ``status``, ``cancel <run>``,
``retry <run>``.

With several agents (AGENTS), a first word naming one of them picks it (``/agent billing
refund order 7``); otherwise the default agent does the whole text (see :mod:`bot.directory`).
A task for an agent that the live workers do not serve is refused at once.

``/agent <task>`` is acknowledged once its run is in Redis, or after ACK_BUDGET_SECONDS
at the latest. An acknowledgement sent before the run was recorded says so (in the ack's
own ephemeral text, which nothing can lose once Slack has it), and the person is then told
through the response_url that the task started or that it did not: a task whose trigger
could not be recorded within START_DEADLINE_SECONDS of the command is given up for good.
If the process dies in between, the first message already told them what silence means.
"""

from __future__ import annotations

import asyncio
import html
import logging
import re
import secrets
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError
from slack_bolt.async_app import AsyncApp, AsyncBoltContext

from agent_core.exceptions import ChildRunSettled, InvalidState, RunNotFound
from agent_core.models import Gate, Run, RunStatus

from . import audit_view, cards, run_cards
from .acking import at_ack
from .context import BotContext
from .directory import NO_TASK, AgentEntry
from .grant_actions import GrantActions
from .publisher import can_respond, slack_error

log = logging.getLogger(__name__)

MAX_TASK_CHARS = 2000
ACK_BUDGET_SECONDS = 2.0
# A task whose command could not even be recorded this long after it arrived is given up.
START_DEADLINE_SECONDS = 30.0
# How long a slash command's trigger_id is remembered (a repeat of the same request).
TRIGGER_SECONDS = 600
_CANCEL = re.compile(r"^cancel\s+(\S+)\s*$", re.IGNORECASE)
_RETRY = re.compile(r"^retry\s+(\S+)\s*$", re.IGNORECASE)
# A tool's name or a person: one word (a longer text starting with "audit" is a task).
_AUDIT = re.compile(r"^audit(?:\s+(\S+))?\s*$", re.IGNORECASE)

NOT_RECORDED_YET = (
    "⏳ Your task has not been recorded yet: the agent backend is slow to answer. I will "
    "tell you here when it starts, or that it was not started. If you hear neither and no "
    "message for it appears in this channel within {limit}, it was not started: run the "
    "command again."
)
STARTED_LATE = "✅ Your task is recorded now and has started (run `{run}`): see its thread."
NOT_STARTED_SLOW = (
    "❌ Your task was not started: the agent backend could not record it within {limit}. "
    "Nothing will run; try the command again shortly."
)
NOT_STARTED_STOPPING = (
    "❌ Your task was not started: the server restarted before it was recorded. "
    "Nothing will run; try the command again."
)
IN_DOUBT_STOPPING = (
    "⚠️ The server restarted while recording your task. If its message in this channel does "
    "not show a run within a minute, it was not started: try the command again."
)
REPEATED = "This request was already received, so it was not started a second time."
BACKEND_DOWN = "The agent backend is unavailable right now. Try again shortly."


def fmt_seconds(seconds: float) -> str:
    return f"{seconds:.0f} seconds" if seconds < 120 else f"{seconds / 60:.0f} minutes"


@dataclass
class Progress:
    """How far one ``/agent`` command got; shared by its handler and its acknowledgement."""

    deadline: float  # loop time after which an unrecorded task is given up
    late: bool = False  # acknowledged before its run was recorded (and told so)
    committing: bool = False  # start_run was called: from here on the run may exist
    run_id: str | None = None


def parse_task(text: str) -> str:
    # Slack sends & < > as HTML entities; the agent should see what the user typed.
    return html.unescape(text).strip()


class Commands:
    def __init__(self, ctx: BotContext) -> None:
        self.ctx = ctx

    @property
    def command(self) -> str:
        return self.ctx.settings.slash_command

    def usage(self) -> str:
        """``/agent help``: the agents, then the commands."""
        agents = self.ctx.agents.help_text(self.command)
        return (
            f"{agents}\n\n{run_cards.usage(self.command)}"
            if agents
            else run_cards.usage(self.command)
        )

    def immediate_reply(self, text: str) -> str | None:
        """A reply that needs no I/O (sent with the ack), or ``None`` for real work."""
        stripped = text.strip()
        if not stripped or stripped.lower() in {"help", "usage", "-h", "--help"}:
            return self.usage()
        if stripped.lower() in ("cancel", "retry"):
            sub = stripped.lower()
            return (
                f"Which run? Use `{self.command} {sub} &lt;run id&gt;` "
                f"(see `{self.command} status`)."
            )
        if len(parse_task(stripped)) > MAX_TASK_CHARS:
            return (
                f"That task is {len(parse_task(stripped)):,} characters long; the limit is "
                f"{MAX_TASK_CHARS:,}. Please shorten it. Nothing was started."
            )
        route = self.ctx.agents.route(parse_task(stripped))
        if route.named and not route.task and _starts_a_task(stripped) and route.agent:
            return NO_TASK.format(
                agent=cards.clip_escaped(route.agent.name, 100), command=self.command
            )
        return None

    async def handle(
        self,
        body: dict[str, Any],
        respond: Any,
        started: asyncio.Event | None = None,
        progress: Progress | None = None,
        *,
        external: bool = True,
    ) -> None:
        """Run the command; ``started`` is set once a new run is durable in Redis.

        ``external``: the user belongs to another workspace (Slack Connect); ``APPROVERS=*``
        then lets them cancel others' runs only with ALLOW_EXTERNAL_APPROVERS.
        """
        try:
            await self._handle(body, respond, started, progress, external)
        finally:
            if started is not None:
                started.set()

    async def _handle(
        self,
        body: dict[str, Any],
        respond: Any,
        started: asyncio.Event | None,
        progress: Progress | None,
        external: bool = True,
    ) -> None:
        text = str(body.get("text") or "").strip()
        user_id = str(body.get("user_id") or "")
        if not user_id:
            return
        if text.lower() == "status":
            await self.status(user_id, respond)
            return
        if text.lower() == "grants":  # allow for this thread (bot/grant_actions.py)
            await GrantActions(self.ctx).list(user_id, respond, external=external)
            return
        m = _CANCEL.match(text)
        if m:
            await self.cancel(user_id, m.group(1), respond, external=external)
            return
        m = _RETRY.match(text)
        if m:
            await self.retry(user_id, m.group(1), respond, external=external)
            return
        m = _AUDIT.match(text)
        if m:  # approvers only, privately (bot.audit_view)
            arg = m.group(1) or ""
            await _reply(
                respond, await audit_view.audit_reply(self.ctx, user_id, arg, external=external)
            )
            return
        route = self.ctx.agents.route(parse_task(text))
        await self.start(body, user_id, route.task, respond, started, progress, agent=route.agent)

    async def start(
        self,
        body: dict[str, Any],
        user_id: str,
        task: str,
        respond: Any,
        started: asyncio.Event | None = None,
        progress: Progress | None = None,
        *,
        agent: AgentEntry | None = None,
    ) -> None:
        """Start a run of ``agent`` (None: the workers' default) on ``task``."""
        ctx = self.ctx
        loop = asyncio.get_running_loop()
        if progress is None:
            progress = Progress(deadline=loop.time() + START_DEADLINE_SECONDS)
        # A retried or replayed request (same signed body, within Bolt's 5-minute window)
        # carries the same trigger_id: start one run, not two. Nothing is posted or started
        # before this write went through: a Redis that stalls longer than the deadline
        # gets the task given up (the pending write dies with its connection, or lands
        # harmlessly), and the person is told.
        trigger = body.get("trigger_id")
        if isinstance(trigger, str) and trigger:
            try:
                # Claimed with this request's own token: a SET retried by the client after
                # its reply was lost finds its own claim, not "a repeated request".
                first = await asyncio.wait_for(
                    ctx.store.claim(
                        "slack-trigger", trigger, secrets.token_hex(8), TRIGGER_SECONDS
                    ),
                    timeout=max(progress.deadline - loop.time(), 0.0),
                )
            except TimeoutError:
                log.warning("a /agent command could not be recorded in time; not started")
                await _reply(respond, NOT_STARTED_SLOW.format(limit=_limit()))
                return
            if not first:
                log.warning("a repeated /agent request (same trigger_id) was ignored")
                if progress.late:
                    await _reply(respond, REPEATED)
                return
        refused, note = await ctx.agents.refusal(agent)
        if refused is not None:
            log.info("a task was refused: no live worker serves agent %s", agent and agent.name)
            await _reply(respond, refused)
            return
        channel = str(body.get("channel_id") or "")
        root = run_cards.root_message(task, user_id, None, self.command)
        try:
            resp = await ctx.client.chat_postMessage(
                channel=channel, text=root.text, blocks=root.blocks
            )
        except Exception as exc:
            err = slack_error(exc)
            log.warning("could not post the task message in %s: %s", channel, err)
            hint = (
                " Invite me to this channel first (`/invite @` the app), or use a channel I am in."
                if err in {"not_in_channel", "channel_not_found"}
                else ""
            )
            await _reply(
                respond,
                f"I could not post in this channel ({err}), so the task was not started.{hint}",
            )
            return
        channel = str(resp.get("channel") or channel)
        ts = str(resp["ts"])
        origin = {
            "channel": channel,
            "thread_ts": ts,
            "root_ts": ts,  # the thread starts with our own root message
            "team": str(body.get("team_id") or ""),
        }
        progress.committing = True
        try:
            # Keyed by the trigger id: a client retry after a lost reply starts no second run.
            trigger = str(body.get("trigger_id") or "") or None
            run = await ctx.gateway.start_run(
                task,
                requested_by=user_id,
                origin=origin,
                idempotency_key=trigger,
                agent=agent.name if agent else None,
            )
        except Exception:
            log.exception("start_run failed")
            failed = run_cards.root_not_started(task, user_id)
            try:
                await ctx.client.chat_update(
                    channel=channel, ts=ts, text=failed.text, blocks=failed.blocks
                )
            except Exception as exc:
                log.warning("could not mark the task message failed: %s", slack_error(exc))
            await _reply(
                respond,
                "The agent backend is unavailable, so the task was not started. Try again shortly.",
            )
            return
        progress.run_id = run.run_id
        if started is not None:
            started.set()
        try:
            await ctx.store.save_run_root(run.run_id, channel, ts)
            await ctx.publisher.show_run(run.run_id)
        except Exception as exc:  # the notifier updates it on the run's next event
            log.warning("root message update deferred: %s", exc)
        if progress.late:
            await _reply(respond, STARTED_LATE.format(run=cards.clip_escaped(run.run_id, 100)))
        if note is not None:
            await _reply(respond, note)

    async def status(self, user_id: str, respond: Any) -> None:
        runs = await self.ctx.gateway.runs_for_user(user_id, limit=10)
        pending: dict[str, list[Gate]] = {}
        for run in runs:
            if not run.status.finished:
                gates = await self.ctx.gateway.pending_gates(run.run_id)
                if gates:
                    pending[run.run_id] = gates
        card = run_cards.status_message(runs, pending, self.command)
        await _reply(respond, card.text, card.blocks or None)

    async def _run_for(
        self, user_id: str, run_id: str, respond: Any, verb: str, *, external: bool
    ) -> Run | None:
        """The run, if ``user_id`` may ``verb`` it (its requester or an approver); otherwise
        None, and the person has been told why."""
        shown = cards.clip_escaped(run_id, 100)
        run = await self.ctx.gateway.get_run(run_id)
        if run is None:
            await _reply(
                respond, f"There is no run `{shown}`. `{self.command} status` lists yours."
            )
            return None
        if user_id != run.requested_by and not await self.ctx.approvers.is_approver(
            user_id, external=external
        ):
            await _reply(
                respond, f"Only the person who started this run or an approver can {verb} it."
            )
            return None
        return run

    async def cancel(
        self, user_id: str, run_id: str, respond: Any, *, external: bool = True
    ) -> None:
        ctx = self.ctx
        shown = cards.clip_escaped(run_id, 100)
        run = await self._run_for(user_id, run_id, respond, "cancel", external=external)
        if run is None:
            return
        gates = await ctx.gateway.pending_gates(run.run_id)
        try:
            await ctx.gateway.cancel_run(run.run_id, by=user_id)
        except RunNotFound:
            await _reply(respond, f"There is no run `{shown}`.")
            return
        except InvalidState:
            current = await ctx.gateway.get_run(run.run_id)
            status = run_cards.run_status(current) if current else "finished"
            await _reply(
                respond, f"Run `{shown}` has already finished ({status}); nothing to cancel."
            )
            return
        await _reply(respond, f"Cancelled run `{shown}`.")
        for (
            gate
        ) in gates:  # the notifier does this too; doing it now makes the cards current sooner
            try:
                await ctx.publisher.show_gate(gate.gate_id)
            except Exception as exc:
                log.warning("card update deferred: %s", exc)

    async def retry(
        self, user_id: str, run_id: str, respond: Any, *, external: bool = True
    ) -> None:
        """Continue a failed run from its last durable step (``Gateway.retry_run``): who may
        is who may cancel it, its requester or an approver."""
        ctx = self.ctx
        shown = cards.clip_escaped(run_id, 100)
        run = await self._run_for(user_id, run_id, respond, "retry", external=external)
        if run is None:
            return
        try:
            await ctx.gateway.retry_run(run.run_id, by=user_id)
        except RunNotFound:
            await _reply(respond, f"There is no run `{shown}`.")
            return
        except ChildRunSettled as exc:
            top = cards.clip_escaped(exc.top_run, 100)
            await _reply(respond, CHILD_SETTLED.format(run=shown, top=top, command=self.command))
            return
        except InvalidState:
            current = await ctx.gateway.get_run(run.run_id)
            if current is not None and current.status is RunStatus.FAILED:
                await _reply(respond, NOT_RETRYABLE.format(run=shown, command=self.command))
            else:
                status = run_cards.run_status(current) if current else "gone"
                await _reply(
                    respond, f"Run `{shown}` is {status}; only a failed run can be retried."
                )
            return
        await _reply(respond, RETRYING.format(run=shown))
        try:  # the notifier does this too, on run.retried
            await ctx.publisher.show_run(run.run_id)
        except Exception as exc:
            log.warning("root message update deferred: %s", exc)


RETRYING = (
    "Retrying run `{run}`. It continues from its last completed step: "
    "tool calls that already ran are not run again."
)
CHILD_SETTLED = (
    "Run `{run}` is a sub-agent's run, and its parent already got its failure as the "
    "sub-agent's answer: retried alone, its answer would reach nobody. Retry the top run "
    "`{top}` instead (`{command} retry {top}`, if it failed), or reply in its thread to "
    "continue it."
)
NOT_RETRYABLE = (
    "Run `{run}` failed in a way a retry cannot fix (its error is in its thread). "
    "Start it again as a new task with `{command} &lt;task&gt;`."
)


async def _reply(respond: Any, text: str, blocks: list[dict[str, Any]] | None = None) -> None:
    if not can_respond(respond):
        return
    try:
        if blocks:
            await respond(text=text, blocks=blocks, response_type="ephemeral")
        else:
            await respond(text=text, response_type="ephemeral")
    except Exception as exc:
        log.warning("response_url failed: %s", slack_error(exc))


def _limit() -> str:
    return fmt_seconds(START_DEADLINE_SECONDS)


def _starts_a_task(text: str) -> bool:
    stripped = text.strip()
    return (
        stripped.lower() not in ("status", "grants")
        and not _CANCEL.match(stripped)
        and not _RETRY.match(stripped)
        and not _AUDIT.match(stripped)
    )


def command_is_external(body: dict[str, Any], context: AsyncBoltContext | None) -> bool:
    """The person who typed the command belongs to another workspace than the app's (Slack
    Connect). Fails closed: a payload without a team, or an unknown home team, is external."""
    auth = context.authorize_result if context is not None else None
    home = auth.team_id if auth is not None and isinstance(auth.team_id, str) else None
    team = body.get("user_team_id") or body.get("team_id")
    return not (isinstance(team, str) and team and home and team == home)


def register(app: AsyncApp, ctx: BotContext) -> None:
    commands = Commands(ctx)

    @app.command(ctx.settings.slash_command)
    @at_ack(ctx)
    async def on_command(
        ack: Any, body: dict[str, Any], respond: Any, context: AsyncBoltContext
    ) -> None:
        external = command_is_external(body, context)
        text = str(body.get("text") or "")
        reply = commands.immediate_reply(text)
        if reply is not None:
            await ack(text=reply, response_type="ephemeral")
            return
        started = asyncio.Event()
        progress = Progress(deadline=asyncio.get_running_loop().time() + START_DEADLINE_SECONDS)

        async def work() -> None:
            try:
                await commands.handle(body, respond, started, progress, external=external)
            except asyncio.CancelledError:
                # Stopped (shutdown) after telling the person "not recorded yet".
                if progress.late and progress.run_id is None:
                    why = IN_DOUBT_STOPPING if progress.committing else NOT_STARTED_STOPPING
                    await _reply(respond, why)
                raise
            except Exception as exc:
                if isinstance(exc, (RedisError, OSError)):
                    log.error(
                        "handling %s failed: %s", ctx.settings.slash_command, type(exc).__name__
                    )
                else:
                    log.exception("handling %s failed", ctx.settings.slash_command)
                if progress.run_id is None:
                    await _reply(respond, BACKEND_DOWN)

        # Acknowledged once the run is in Redis (the soak lost an acknowledged command to a
        # web crash when the ack came first), never later than ACK_BUDGET_SECONDS: then the
        # ack itself says that the task is not recorded yet, and the handler tells the rest.
        async with ctx.busy():
            task = asyncio.ensure_future(work())
            waiter = asyncio.ensure_future(started.wait())
            await asyncio.wait(
                {task, waiter}, timeout=ACK_BUDGET_SECONDS, return_when=asyncio.FIRST_COMPLETED
            )
            waiter.cancel()
            if started.is_set() or task.done() or not _starts_a_task(text):
                await ack()
            else:
                progress.late = True
                await ack(text=NOT_RECORDED_YET.format(limit=_limit()), response_type="ephemeral")
            try:
                await task
            except asyncio.CancelledError:
                task.cancel()
                await asyncio.wait({task}, timeout=5.0)
                raise
