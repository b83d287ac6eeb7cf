"""The slash command: ``/agent <task>``, ``help``, ``status``, ``cancel <run>``."""

from __future__ import annotations

import asyncio
import html
import logging
import re
from typing import Any

from redis.exceptions import RedisError
from slack_bolt.async_app import AsyncApp

from agent_core.exceptions import InvalidState, RunNotFound
from agent_core.models import Gate

from . import cards
from .context import BotContext
from .publisher import slack_error

log = logging.getLogger(__name__)

MAX_TASK_CHARS = 2000
ACK_BUDGET_SECONDS = 2.0
_CANCEL = re.compile(r"^cancel\s+(\S+)\s*$", re.IGNORECASE)


def parse_task(text: str) -> str:
    # Slack sends & < > as HTML entities; the agent should see what the user typed.
    return html.unescape(text).strip()


class Commands:
    def __init__(self, ctx: BotContext) -> None:
        self.ctx = ctx

    @property
    def command(self) -> str:
        return self.ctx.settings.slash_command

    def immediate_reply(self, text: str) -> str | None:
        """A reply that needs no I/O (sent with the ack), or ``None`` for real work."""
        stripped = text.strip()
        if not stripped or stripped.lower() in {"help", "usage", "-h", "--help"}:
            return cards.usage(self.command)
        if stripped.lower() == "cancel":
            return f"Which run? Use `{self.command} cancel <run id>` (see `{self.command} status`)."
        if len(parse_task(stripped)) > MAX_TASK_CHARS:
            return (
                f"That task is {len(parse_task(stripped)):,} characters long; the limit is "
                f"{MAX_TASK_CHARS:,}. Please shorten it. Nothing was started."
            )
        return None

    async def handle(
        self, body: dict[str, Any], respond: Any, started: asyncio.Event | None = None
    ) -> None:
        """Run the command; ``started`` is set once a new run is durable in Redis."""
        try:
            await self._handle(body, respond, started)
        finally:
            if started is not None:
                started.set()

    async def _handle(
        self, body: dict[str, Any], respond: Any, started: asyncio.Event | None
    ) -> None:
        text = str(body.get("text") or "").strip()
        user_id = str(body.get("user_id") or "")
        if not user_id:
            return
        if text.lower() == "status":
            await self.status(user_id, respond)
            return
        m = _CANCEL.match(text)
        if m:
            await self.cancel(user_id, m.group(1), respond)
            return
        await self.start(body, user_id, parse_task(text), respond, started)

    async def start(
        self,
        body: dict[str, Any],
        user_id: str,
        task: str,
        respond: Any,
        started: asyncio.Event | None = None,
    ) -> None:
        ctx = self.ctx
        # A replayed request (same signed body, within Bolt's 5-minute window) carries the
        # same trigger_id: start one run, not two.
        trigger = body.get("trigger_id")
        if isinstance(trigger, str) and trigger:
            if not await ctx.store.first_time("slack-trigger", trigger):
                log.warning("a repeated /agent request (same trigger_id) was ignored")
                return
        channel = str(body.get("channel_id") or "")
        root = cards.root_message(task, user_id, None, self.command)
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
        origin = {"channel": channel, "thread_ts": ts, "team": str(body.get("team_id") or "")}
        try:
            run = await ctx.gateway.start_run(task, requested_by=user_id, origin=origin)
        except Exception:
            log.exception("start_run failed")
            failed = cards.root_not_started(task, user_id)
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
        if started is not None:
            started.set()
        await ctx.store.save_run_root(run.run_id, channel, ts)
        try:
            await ctx.publisher.show_run(run.run_id)
        except Exception as exc:
            log.warning("root message update deferred: %s", exc)

    async def status(self, user_id: str, respond: Any) -> None:
        runs = await self.ctx.gateway.runs_for_user(user_id, limit=10)
        pending: dict[str, list[Gate]] = {}
        for run in runs:
            if not run.status.finished:
                gates = await self.ctx.gateway.pending_gates(run.run_id)
                if gates:
                    pending[run.run_id] = gates
        card = cards.status_message(runs, pending, self.command)
        await _reply(respond, card.text, card.blocks or None)

    async def cancel(self, user_id: str, run_id: str, respond: Any) -> None:
        ctx = self.ctx
        shown = cards.clip_escaped(run_id, 100)
        run = await ctx.gateway.get_run(run_id)
        if run is None:
            await _reply(
                respond, f"There is no run `{shown}`. `{self.command} status` lists yours."
            )
            return
        if user_id != run.requested_by and not await ctx.approvers.is_approver(user_id):
            await _reply(
                respond, "Only the person who started this run or an approver can cancel it."
            )
            return
        gates = await ctx.gateway.pending_gates(run.run_id)
        try:
            await ctx.gateway.cancel_run(run.run_id, by=user_id)
        except RunNotFound:
            await _reply(respond, f"There is no run `{shown}`.")
            return
        except InvalidState:
            current = await ctx.gateway.get_run(run.run_id)
            status = cards.status_label(current.status) if current else "finished"
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


async def _reply(respond: Any, text: str, blocks: list[dict[str, Any]] | None = None) -> None:
    if respond is None:
        return
    try:
        if blocks:
            await respond(text=text, blocks=blocks, response_type="ephemeral")
        else:
            await respond(text=text, response_type="ephemeral")
    except Exception as exc:
        log.warning("response_url failed: %s", slack_error(exc))


def register(app: AsyncApp, ctx: BotContext) -> None:
    commands = Commands(ctx)

    @app.command(ctx.settings.slash_command)
    async def on_command(ack: Any, body: dict[str, Any], respond: Any) -> None:
        reply = commands.immediate_reply(str(body.get("text") or ""))
        if reply is not None:
            await ack(text=reply, response_type="ephemeral")
            return
        started = asyncio.Event()

        async def work() -> None:
            try:
                await commands.handle(body, respond, started)
            except (RedisError, OSError) as exc:
                log.error("handling %s failed: %s", ctx.settings.slash_command, type(exc).__name__)
                await _reply(
                    respond, "The agent backend is unavailable right now. Try again shortly."
                )

        # Acknowledged once the run is in Redis (the soak lost an acknowledged command to a
        # web crash when the ack came first), never later than ACK_BUDGET_SECONDS.
        async with ctx.busy():
            task = asyncio.ensure_future(work())
            waiter = asyncio.ensure_future(started.wait())
            await asyncio.wait(
                {task, waiter}, timeout=ACK_BUDGET_SECONDS, return_when=asyncio.FIRST_COMPLETED
            )
            waiter.cancel()
            await ack()
            await task
