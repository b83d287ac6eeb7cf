"""Consumes the events stream and keeps Slack in step with the runs.

Runs inside every ``web`` process as one consumer of the ``bot`` group, so replicas share
the events and a crashed replica's unacknowledged events are claimed by another. An event
is acknowledged only after Slack shows it, or when Slack refused for good (logged): a
transient failure leaves it pending to be delivered again, which is safe because every
handler is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from typing import Any

from redis.exceptions import RedisError

from agent_core.models import Event, EventType, GateStatus

from . import assistant, cards
from .ports import EventConsumerLike, GatewayLike
from .publisher import Publisher, TransientSlackError
from .store import LockBusy, Store

log = logging.getLogger(__name__)

GROUP = "bot"
NEVER_RAN = "the run was cancelled before this call started"
# An event that could not be shown (its card's lock busy, Redis or Slack failing) is tried
# again by the same loop after these pauses (seconds), instead of waiting, pending, until the
# group claims it again after 30 s idle; after the last one it is left to that claim.
RETRY_PAUSES = (1.0, 2.0, 4.0, 8.0)


def consumer_name() -> str:
    return f"web-{socket.gethostname()}-{os.getpid()}"


class Notifier:
    def __init__(
        self,
        gateway: GatewayLike,
        publisher: Publisher,
        store: Store,
        *,
        consumer: str | None = None,
        group: str = GROUP,
        batch: int = 50,
        block_ms: int = 1000,
        concurrency: int = 1,
    ) -> None:
        self.gateway = gateway
        self.publisher = publisher
        self.store = store
        self.consumer = consumer or consumer_name()
        self.group = group
        self.batch = batch
        self.block_ms = block_ms
        self.concurrency = concurrency
        self.handled = 0

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Read and handle events until ``stop`` is set (or the task is cancelled): one loop
        per reader (one in all on a single Redis node, one per shard on Redis Cluster)."""
        stop = stop or asyncio.Event()
        sources = self.gateway.event_consumers(group=self.group, consumer=self.consumer)
        loops = [asyncio.create_task(self._loop(source, stop)) for source in sources]
        try:
            await asyncio.gather(*loops)
        finally:
            for task in loops:
                task.cancel()
            for task in loops:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _loop(self, source: EventConsumerLike, stop: asyncio.Event) -> None:
        stopping = asyncio.create_task(stop.wait())
        backoff = 0.5
        # Events that failed, by stream and id: (the event, its failures, when to try again).
        later: dict[str, tuple[Event, int, float]] = {}
        loop = asyncio.get_running_loop()
        try:
            while not stop.is_set():
                if later:
                    await self._retry_due(source, later)
                block_ms = self.block_ms
                if later:  # wake up for the next retry
                    wait = min(due for _, _, due in later.values()) - loop.time()
                    block_ms = max(1, min(block_ms, int(wait * 1000)))
                reading = asyncio.create_task(source.read(count=self.batch, block_ms=block_ms))
                await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not reading.done():
                    # Stopping: let the blocked read end by itself (cancelling it mid-command
                    # would strand its connection), then handle what it brought.
                    await asyncio.wait({reading}, timeout=self.block_ms / 1000 + 1)
                    if not reading.done():
                        reading.cancel()
                        with contextlib.suppress(asyncio.CancelledError, RedisError, OSError):
                            await reading
                        break
                try:
                    events = reading.result()
                except Exception as exc:  # Redis, or the client's state: the loop outlives it
                    log.warning(
                        "reading events failed (%s); retrying in %.1f s",
                        type(exc).__name__,
                        backoff,
                    )
                    await _sleep_or_stop(stop, backoff)
                    backoff = min(backoff * 2, 10.0)
                    continue
                backoff = 0.5
                # Delivered to us: handle them even when stopping.
                handled = await self.handle_batch(events)
                await _ack(source, handled)
                _defer(later, events, handled, loop.time())
        finally:
            stopping.cancel()

    async def _retry_due(
        self, source: EventConsumerLike, later: dict[str, tuple[Event, int, float]]
    ) -> None:
        """Handle again the failed events whose pause is over (in stream order)."""
        now = asyncio.get_running_loop().time()
        due = [e for e, _, at in later.values() if at <= now]
        due.sort(key=lambda e: (e.stream, _id_key(e.id)))
        if not due:
            return
        failures = {_key(e): later.pop(_key(e))[1] for e in due}
        handled = await self.handle_batch(due)
        await _ack(source, handled)
        _defer(later, due, handled, asyncio.get_running_loop().time(), failures)

    async def handle_batch(self, events: list[Event]) -> list[Event]:
        """Handle a batch of events; the events that may be acknowledged.

        The events of one Slack thread are handled in order (its cards and messages keep
        their order); those of different threads side by side, up to ``concurrency`` at a
        time (NOTIFIER_CONCURRENCY). One at a time is the default: a click's own card is
        updated by its handler, and on a busy web process more notifier tasks took the event
        loop from the clicks (the Slack bench on 2 cores: ack p99 at 100 clicks/s 41 ms with
        1, 64 with 4, 254 with 16). Raise it where Slack's latency, not CPU, holds the
        notifier back (each event waits on the Web API).

        A card or root message that a later event of the batch updates again is updated
        once, by that later event: every update renders the current state from Redis, so
        the last one shows everything before it. A web process that falls behind thus does
        less work per event instead of more (a click's ``gate.decided`` and its
        ``tool.executed`` often arrive together then). If that later event fails, it is
        delivered again and its update still shows both.
        """
        gates = [_gate_shown(e) for e in events]
        runs = [_run_shown(e) for e in events]
        ok = [False] * len(events)

        async def in_order(indexes: list[int]) -> None:
            for i in indexes:
                skip_gate = gates[i] is not None and gates[i] in gates[i + 1 :]
                skip_run = runs[i] is not None and runs[i] in runs[i + 1 :]
                ok[i] = await self.handle_safely(events[i], skip_gate=skip_gate, skip_run=skip_run)

        if self.concurrency == 1:  # the stream's order, and no task per thread
            await in_order(list(range(len(events))))
        else:
            threads: dict[str, list[int]] = {}
            for i, event in enumerate(events):
                threads.setdefault(_thread_of(event), []).append(i)
            slots = asyncio.Semaphore(self.concurrency)

            async def thread(indexes: list[int]) -> None:
                async with slots:
                    await in_order(indexes)

            await asyncio.gather(*(thread(ix) for ix in threads.values()))
        return [e for e, done in zip(events, ok, strict=True) if done]

    async def handle_safely(
        self, event: Event, *, skip_gate: bool = False, skip_run: bool = False
    ) -> bool:
        """Handle one event; ``True`` when it may be acknowledged."""
        try:
            await self.handle(event, skip_gate=skip_gate, skip_run=skip_run)
        except (TransientSlackError, LockBusy, RedisError, OSError) as exc:
            log.warning("event %s (%s) will be retried: %s", event.id, event.type.value, exc)
            return False
        except Exception:
            # Left pending: the core's delivery limit moves it to the dead-letter stream.
            log.exception("event %s (%s) failed", event.id, event.type.value)
            return False
        self.handled += 1
        return True

    async def handle(
        self, event: Event, *, skip_gate: bool = False, skip_run: bool = False
    ) -> None:
        """Show one event in Slack. ``skip_gate``/``skip_run``: the gate's card or the run's
        root message is left to a later event that updates it again (see handle_batch)."""
        data = event.data
        origin: dict[str, Any] = data.get("origin") or {}
        if not isinstance(origin, dict) or not origin.get("channel"):
            return  # not started from Slack
        t = event.type
        if origin.get("parent_run") and t.value.startswith("run."):
            # A sub-agent's run: it has no root message, and its outcome reaches the thread
            # as its parent's tool result. Its gates and calls are shown like the parent's,
            # so a cancel still tells its approved calls' cards that they never ran.
            if t is EventType.RUN_CANCELLED:
                await self._approved_calls_at_cancel(event.run_id, data)
            return
        if t is EventType.GATE_OPENED:
            gate_id = str(data["gate_id"])
            await self.publisher.show_gate(gate_id)
            if _int(data.get("turn_gates")) >= 2:
                await self.publisher.show_turn(
                    event.run_id, _int(data.get("turn")), post_for=gate_id
                )
            # The root message says the run awaits approval (not "running") while it does.
            await self._show_run(event.run_id, skip_run or bool(origin.get("parent_run")))
        elif t is EventType.GATE_DECIDED:
            gate_id = str(data["gate_id"])
            if skip_gate or await self._shows(gate_id, data.get("status")):
                # Its card is left to a later event, or the click that decided it already
                # updated it: not its turn's message.
                gate = await self.gateway.get_gate(gate_id)
            else:
                gate = await self.publisher.show_gate(gate_id)
            # Its turn's "Approve all" message, if the turn opened more than one gate.
            if gate is not None and gate.turn_gates != 1:
                await self.publisher.show_turn(gate.run_id, gate.turn)
            # The root message: running again once nothing awaits a person.
            await self._show_run(event.run_id, skip_run or bool(origin.get("parent_run")))
        elif t is EventType.TOOL_EXECUTED:
            await self._tool_executed(event.run_id, data, origin, skip_gate=skip_gate)
        elif t in (EventType.RUN_STARTED, EventType.RUN_CONTINUED):
            await self._show_run(event.run_id, skip_run)
        elif t is EventType.RUN_COMPLETED:
            texts = cards.answer_messages(str(data.get("final") or ""))
            # A continued run answers once per continuation (turns_from tells them apart).
            leg = _int(data.get("turns_from"))
            marker = f"final-{leg}" if leg else "final"
            await self.publisher.post_in_thread(
                event.run_id, origin, marker, texts, show_run=not skip_run
            )
        elif t is EventType.RUN_FAILED:
            retry = None
            if data.get("retryable") is True:
                retry = f"{self.publisher.command} retry {cards.clip_escaped(event.run_id, 100)}"
            text = cards.run_failed_message(str(data.get("error") or ""), retry)
            # A retried run may fail again: one message per failure (per event).
            marker = f"failed:{event.id}"
            await self.publisher.post_in_thread(
                event.run_id, origin, marker, [text], show_run=not skip_run
            )
        elif t is EventType.RUN_RETRIED:
            text = cards.run_retried_message(data.get("by"))
            marker = f"retried:{event.id}"
            await self.publisher.post_in_thread(
                event.run_id, origin, marker, [text], show_run=not skip_run
            )
        elif t is EventType.RUN_CANCELLED:
            text = cards.run_cancelled_message(data.get("by"), data.get("reason"))
            await self.publisher.post_in_thread(
                event.run_id, origin, "cancelled", [text], show_run=not skip_run
            )
            await self._approved_calls_at_cancel(event.run_id, data)
        # After Slack shows the event: the app's post in a thread clears its status line.
        await assistant.show_status(self.publisher, event)

    async def _shows(self, gate_id: str, status: object) -> bool:
        """Whether the gate's card was last updated to show ``status`` (a decision's click
        updates its card itself, before this event arrives)."""
        rec = await self.store.card(gate_id)
        return bool(rec.ts and rec.digest and isinstance(status, str) and rec.shown == status)

    async def _show_run(self, run_id: str, skip: bool) -> None:
        if not skip:
            await self.publisher.show_run(run_id)

    async def _approved_calls_at_cancel(self, run_id: str, data: dict[str, Any]) -> None:
        """The approved calls of a cancelled run: the core lists those that never ran and
        those still running at the cancel; their cards say so instead of "Running…"."""
        never_ran, running = _gate_ids(data.get("never_ran")), _gate_ids(data.get("running"))
        if never_ran is None and running is None:
            await self._approved_but_never_run(run_id)  # an event from an older core
            return
        for gate_id in never_ran or []:
            await self._mark_unless_known(gate_id, cards.ToolResult(ok=False, skipped=NEVER_RAN))
        for gate_id in running or []:
            await self._mark_unless_known(
                gate_id, cards.ToolResult(ok=False, running_at_cancel=True)
            )

    async def _approved_but_never_run(self, run_id: str) -> None:
        """Without the core's lists, a guess: an approved call with no outcome yet never ran."""
        for gate in await self.gateway.gates(run_id):
            if gate.status is GateStatus.APPROVED:
                await self._mark_unless_known(
                    gate.gate_id,
                    cards.ToolResult(
                        ok=False, skipped="the run was cancelled before this call ran"
                    ),
                )

    async def _mark_unless_known(self, gate_id: str, result: cards.ToolResult) -> None:
        """Store ``result`` unless the call's outcome (its tool.executed) is already there,
        then show the card. Shown either way: a result found stored may be this event's own,
        stored by an earlier delivery that could not show it (the card's lock busy, the
        process killed); showing what is already shown costs nothing (the card's digest)."""
        await self.store.set_result_unless_known(gate_id, result)
        await self.publisher.show_gate(gate_id)

    async def _tool_executed(
        self, run_id: str, data: dict[str, Any], origin: dict[str, Any], *, skip_gate: bool
    ) -> None:
        ok = bool(data.get("ok"))
        in_doubt = bool(data.get("in_doubt"))
        gate_id = data.get("gate_id")
        if gate_id:
            result = cards.ToolResult(
                ok=ok,
                output=str(data.get("output") or ""),
                in_doubt=in_doubt,
                after_cancel=bool(data.get("after_cancel")),
            )
            # The outcome replaces whatever the cancel left ("never ran", "was running").
            await self.store.set_result(str(gate_id), result)
            if not skip_gate:
                await self.publisher.show_gate(str(gate_id))
            return
        text = cards.tool_message(str(data.get("tool") or "tool"), ok, in_doubt)
        marker = f"tool:{data.get('call_id') or ''}"
        await self.publisher.post_in_thread(run_id, origin, marker, [text])


async def _ack(source: EventConsumerLike, handled: list[Event]) -> None:
    try:
        await source.ack_many(handled)
    except (RedisError, OSError) as exc:
        log.warning("ack of %d event(s) failed: %s", len(handled), type(exc).__name__)


def _defer(
    later: dict[str, tuple[Event, int, float]],
    events: list[Event],
    handled: list[Event],
    now: float,
    failures: dict[str, int] | None = None,
) -> None:
    """Schedule the events that failed for another try (see RETRY_PAUSES)."""
    done = {_key(e) for e in handled}
    for event in events:
        if _key(event) in done:
            continue
        n = (failures or {}).get(_key(event), 0)
        if n < len(RETRY_PAUSES):
            later[_key(event)] = (event, n + 1, now + RETRY_PAUSES[n])


def _key(event: Event) -> str:
    return f"{event.stream}\n{event.id}"


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return (int(ms), int(seq or 0)) if ms.isdigit() and (seq or "0").isdigit() else (0, 0)


def _thread_of(event: Event) -> str:
    """The Slack thread an event shows in (a sub-agent's run shows in its parent's)."""
    origin = event.data.get("origin")
    if isinstance(origin, dict):
        channel, ts = origin.get("channel"), origin.get("thread_ts")
        if isinstance(channel, str) and isinstance(ts, str) and channel and ts:
            return f"{channel}:{ts}"
    return f"run:{event.run_id}"


def _gate_shown(event: Event) -> str | None:
    """The gate whose card ``event`` updates (not posts), if any."""
    if event.type in (EventType.GATE_DECIDED, EventType.TOOL_EXECUTED):
        gate_id = event.data.get("gate_id")
        return gate_id if isinstance(gate_id, str) and gate_id else None
    return None


_ROOT_UPDATES = frozenset(
    t for t in EventType if t.value.startswith("run.") or t.value.startswith("gate.")
)


def _run_shown(event: Event) -> str | None:
    """The run whose root message ``event`` updates, if any (a sub-agent's run has none)."""
    origin = event.data.get("origin")
    if event.type not in _ROOT_UPDATES or not isinstance(origin, dict):
        return None
    return None if origin.get("parent_run") else event.run_id


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _gate_ids(value: object) -> list[str] | None:
    """A list of gate ids from an event (``None`` when the event does not carry it)."""
    if value == {}:
        return []  # how Lua's cjson encodes an empty table
    if not isinstance(value, list):
        return None
    return [v for v in value if isinstance(v, str) and v]


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        pass
