"""Consumes the events stream and keeps Slack in step with the runs.

Runs inside every ``web`` process as one consumer of the ``bot`` group, so replicas share
the events and a crashed replica's unacknowledged events are claimed by another. An event
is acknowledged only after Slack shows it, or when Slack refused for good (logged): a
transient failure leaves it pending to be delivered again, which is safe because every
handler is idempotent.

Each Slack thread has a lane of its own (see :class:`_Lanes`): its events are handled in
order, one at a time, while other threads' go on. Reading does not wait for the events read
before: a thread held up by Slack (a long answer, a 429 with ``Retry-After``) delays only
itself, never a new card in another thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import RedisError

from agent_core.models import Event, EventType, GateStatus

from . import answers, assistant, cards, run_cards
from .home import HomeFeed
from .nudges import ESCALATE, REMIND, Nudger
from .ports import EventConsumerLike, GatewayLike
from .publisher import Publisher, RateLimited, TransientSlackError, raising_rate_limits
from .store import LockBusy, Store

log = logging.getLogger(__name__)

GROUP = "bot"
NEVER_RAN = "the run was cancelled before this call started"
NEVER_RAN_FAILED = "the run failed before this call started"
# A 429 on an event is waited out (its Retry-After) and the event tried again this many
# times before it is left pending, to be delivered again later.
RATE_LIMIT_RETRIES = 8
# Events held (read, not yet done) past which reading pauses: Slack is refusing everything.
MAX_HELD = 2000
# Held events are marked as still being worked on this often, so that no other replica
# claims them (nor this one reclaims them, which would count a delivery) while they wait.
TOUCH_SECONDS = 5.0
# An event that could not be shown (its card's lock busy, Redis or Slack failing) is tried
# again in its lane after these pauses (seconds), instead of waiting, pending, until the
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
        home: HomeFeed | None = None,
        approvers: Sequence[str] = (),
    ) -> None:
        """``home``: the App Home views to refresh when a gate opens or is decided.
        ``concurrency`` (NOTIFIER_CONCURRENCY): events of different threads handled at
        the same moment. One is the default: a click's own card is updated by its handler,
        and on a busy web process more notifier tasks took the event loop from the clicks
        (the Slack bench on 2 cores: ack p99 at 100 clicks/s 41 ms with 1, 64 with 4, 254
        with 16). A thread waiting out a 429 holds no slot. ``approvers``: whom a reminder
        mentions (APPROVERS)."""
        self.gateway = gateway
        self.publisher = publisher
        self.store = store
        self.consumer = consumer or consumer_name()
        self.group = group
        self.batch = batch
        self.block_ms = block_ms
        self.concurrency = concurrency
        self.home = home
        self.nudger = Nudger(publisher, store, approvers)
        self.handled = 0

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Read and handle events until ``stop`` is set (or the task is cancelled): one loop
        per reader (one in all on a single Redis node, one per shard on Redis Cluster)."""
        stop = stop or asyncio.Event()
        sources = self.gateway.event_consumers(group=self.group, consumer=self.consumer)
        slots = asyncio.Semaphore(self.concurrency)
        loops = [asyncio.create_task(self._loop(source, stop, slots)) for source in sources]
        try:
            await asyncio.gather(*loops)
        finally:
            for task in loops:
                task.cancel()
            for task in loops:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _loop(
        self, source: EventConsumerLike, stop: asyncio.Event, slots: asyncio.Semaphore
    ) -> None:
        acks: list[Event] = []
        ack_wanted = asyncio.Event()

        def done(event: Event, ok: bool) -> None:
            if ok:
                acks.append(event)
                ack_wanted.set()

        lanes = _Lanes(self, slots, done, stop)
        closing = asyncio.Event()
        acker = asyncio.create_task(self._ack_loop(source, acks, ack_wanted, closing))
        stopping = asyncio.create_task(stop.wait())
        backoff = 0.5
        touched = time.monotonic()
        try:
            while not stop.is_set():
                if time.monotonic() - touched >= TOUCH_SECONDS:
                    touched = time.monotonic()
                    await _touch(source, lanes.held_since(touched - TOUCH_SECONDS))
                if lanes.held >= MAX_HELD:
                    await lanes.wait_for_room(timeout=1.0)
                    continue
                reading = asyncio.create_task(source.read(count=self.batch, block_ms=self.block_ms))
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
                # Delivered to us: handled even when stopping (a wait on a 429 then ends).
                lanes.add(events)
            await lanes.drain()
        finally:
            stopping.cancel()
            await lanes.close()
            # Not cancelled: a cancel that lands inside redis-py's XACK can be swallowed
            # there, leaving the task waiting forever. It acknowledges what is left and ends.
            closing.set()
            ack_wanted.set()
            await acker

    async def _ack_loop(
        self,
        source: EventConsumerLike,
        acks: list[Event],
        wanted: asyncio.Event,
        closing: asyncio.Event,
    ) -> None:
        """Acknowledge handled events as they are done: those done while an XACK was on its
        way go together in the next one. Once ``closing``, acknowledge what is left and end."""
        while True:
            await wanted.wait()
            wanted.clear()
            await _ack(source, acks)
            if closing.is_set():
                return

    async def handle_batch(self, events: list[Event]) -> list[Event]:
        """Handle ``events`` as the loop does (a lane per Slack thread); the events that may
        be acknowledged.

        A card or root message that a later event of its thread, already read, updates
        again is updated once, by that later event: every update renders the current state
        from Redis, so the last one shows everything before it. A web process that falls
        behind thus does less work per event instead of more (a click's ``gate.decided``
        and its ``tool.executed`` often arrive together then). If that later event fails,
        it is delivered again and its update still shows both.
        """
        ok: set[tuple[str, str]] = set()

        def done(event: Event, success: bool) -> None:
            if success:
                ok.add((event.stream, event.id))

        lanes = _Lanes(
            self, asyncio.Semaphore(self.concurrency), done, asyncio.Event(), retry=False
        )
        try:
            lanes.add(events)
            await lanes.drain()
        finally:
            await lanes.close()
        return [e for e in events if (e.stream, e.id) in ok]

    async def handle_safely(
        self, event: Event, *, skip_gate: bool = False, skip_run: bool = False
    ) -> bool:
        """Handle one event; ``True`` when it may be acknowledged."""
        return await self._attempt(event, skip_gate=skip_gate, skip_run=skip_run) is True

    async def _attempt(
        self, event: Event, *, skip_gate: bool = False, skip_run: bool = False
    ) -> bool | float:
        """Handle one event: ``True`` when it may be acknowledged, ``False`` when it must be
        delivered again, or the seconds Slack asked us to wait before trying it again."""
        try:
            await self.handle(event, skip_gate=skip_gate, skip_run=skip_run)
        except RateLimited as exc:
            log.info(
                "event %s (%s) waits %.0f s: %s", event.id, event.type.value, exc.retry_after, exc
            )
            return exc.retry_after
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
            elif t is EventType.RUN_FAILED:
                await self._approved_calls_at_failure(data)
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
            turn: tuple[str, int] | None = None  # (run, turn) whose message shows the gate
            if skip_gate or await self._shows(gate_id, data.get("status")):
                # Its card is left to a later event, or the click that decided it updated
                # it (in this process: waited for, see _Lanes; elsewhere: its record says
                # so): not its turn's message. The event says which turn (and how
                # many gates it opened); an older core's does not, so the gate is read.
                turn_gates = data.get("turn_gates")
                if isinstance(turn_gates, int) and isinstance(data.get("turn"), int):
                    if turn_gates != 1:
                        turn = (event.run_id, data["turn"])
                else:
                    gate = await self.gateway.get_gate(gate_id)
                    if gate is not None and gate.turn_gates != 1:
                        turn = (gate.run_id, gate.turn)
            else:
                gate = await self.publisher.show_gate(gate_id)
                if gate is not None and gate.turn_gates != 1:
                    turn = (gate.run_id, gate.turn)
            # Its turn's "Approve all" message, if the turn opened more than one gate.
            if turn is not None:
                await self.publisher.show_turn(*turn)
            # The root message: running again once nothing awaits a person.
            await self._show_run(event.run_id, skip_run or bool(origin.get("parent_run")))
        elif t in (EventType.GATE_REMINDED, EventType.GATE_ESCALATED):
            gate_id = str(data["gate_id"])
            await self.publisher.show_gate(gate_id)  # its line: what fired, what comes next
            await self.nudger.announce(
                gate_id, REMIND if t is EventType.GATE_REMINDED else ESCALATE
            )
        elif t is EventType.GATE_APPROVAL and not skip_gate:  # a quorum's approval counted
            gate = await self.publisher.show_gate(str(data["gate_id"]))
            if gate is not None and gate.turn_gates != 1:
                await self.publisher.show_turn(gate.run_id, gate.turn)
        elif t is EventType.TOOL_EXECUTED:
            await self._tool_executed(event.run_id, data, origin, skip_gate=skip_gate)
        elif t in (EventType.RUN_STARTED, EventType.RUN_CONTINUED):
            await self._show_run(event.run_id, skip_run)
        elif t is EventType.RUN_COMPLETED:
            # A continued run answers once per continuation (turns_from tells them apart).
            leg = _int(data.get("turns_from"))
            outcomes = await answers.leg_outcomes(self.gateway, self.store, event.run_id, leg)
            post = answers.answer_post(
                str(data.get("final") or ""), event.run_id, answers.heading(outcomes)
            )
            marker = f"final-{leg}" if leg else "final"
            await self.publisher.post_in_thread(
                event.run_id, origin, marker, post.texts, show_run=not skip_run, file=post.file
            )
        elif t is EventType.RUN_FAILED:
            retry = None
            if data.get("retryable") is True:
                retry = f"{self.publisher.command} retry {cards.clip_escaped(event.run_id, 100)}"
            text = run_cards.run_failed_message(str(data.get("error") or ""), retry)
            # A retried run may fail again: one message per failure (per event).
            marker = f"failed:{event.id}"
            await self.publisher.post_in_thread(
                event.run_id, origin, marker, [text], show_run=not skip_run
            )
            await self._approved_calls_at_failure(data)
        elif t is EventType.RUN_RETRIED:
            text = run_cards.run_retried_message(data.get("by"))
            marker = f"retried:{event.id}"
            await self.publisher.post_in_thread(
                event.run_id, origin, marker, [text], show_run=not skip_run
            )
        elif t is EventType.RUN_CANCELLED:
            text = run_cards.run_cancelled_message(data.get("by"), data.get("reason"))
            await self.publisher.post_in_thread(
                event.run_id, origin, "cancelled", [text], show_run=not skip_run
            )
            await self._approved_calls_at_cancel(event.run_id, data)
        # After Slack shows the event: the app's post in a thread clears its status line.
        await assistant.show_status(self.publisher, event)
        if self.home is not None:  # coalesced, best effort: never fails the event
            await self.home.on_event(event)

    async def click_showed(self, event: Event) -> bool:
        """For a gate.decided event: whether the click that made the decision, in this
        process, updated the card to show it (waited for: bot/refreshing.py)."""
        if event.type is not EventType.GATE_DECIDED:
            return False
        gate_id = event.data.get("gate_id")
        if not isinstance(gate_id, str) or not gate_id:
            return False
        return await self.publisher.refreshes.shows(gate_id, event.data.get("status"))

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

    async def _approved_calls_at_failure(self, data: dict[str, Any]) -> None:
        """The approved calls of a failed run that never ran, or were left in doubt by a
        worker that stopped: the core lists them; their cards say so instead of
        "Running…"."""
        for gate_id in _gate_ids(data.get("never_ran")) or []:
            await self._mark_unless_known(
                gate_id, cards.ToolResult(ok=False, skipped=NEVER_RAN_FAILED)
            )
        for gate_id in _gate_ids(data.get("in_doubt")) or []:
            await self._mark_unless_known(gate_id, cards.ToolResult(ok=False, in_doubt=True))

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
            # The outcome replaces whatever the cancel left ("never ran", "was running"),
            # stored as the card's lock is taken when the card is updated now.
            if skip_gate:
                await self.store.set_result(str(gate_id), result)
            else:
                await self.publisher.show_gate(str(gate_id), result=result)
            return
        text = run_cards.tool_message(str(data.get("tool") or "tool"), ok, in_doubt)
        marker = f"tool:{data.get('call_id') or ''}"
        await self.publisher.post_in_thread(run_id, origin, marker, [text])


class _Lane:
    """One Slack thread's events, in order, and how many of them update each card and root
    message (the first one's update is left to a later one, see Notifier.handle_batch)."""

    def __init__(self) -> None:
        self.events: deque[Event] = deque()
        self.shown: dict[str, int] = {}

    def push(self, event: Event) -> None:
        self.events.append(event)
        for name in _shown(event):
            self.shown[name] = self.shown.get(name, 0) + 1

    def pop(self) -> Event:
        event = self.events.popleft()
        for name in _shown(event):
            self.shown[name] -= 1
        return event

    def updated_later(self, event: Event) -> tuple[bool, bool]:
        """Whether a later event of the lane updates ``event``'s card, and its root message."""
        gate, run = _gate_shown(event), _run_shown(event)
        return (
            gate is not None and self.shown.get(f"gate:{gate}", 0) > 1,
            run is not None and self.shown.get(f"run:{run}", 0) > 1,
        )


class _Lanes:
    """A lane per Slack thread: its events handled in order, one at a time; lanes side by
    side, at most ``slots`` of them handling an event at the same moment. An event Slack
    answers with a 429 waits out its Retry-After without a slot and is tried again (up to
    RATE_LIMIT_RETRIES times; once stopping, not at all): the other lanes go on meanwhile.
    With ``retry``, an event that failed otherwise (a card lock busy, Redis or Slack failing)
    is tried again after each of RETRY_PAUSES the same way. ``done(event, ok)`` is called as
    each event is done (``ok``: it may be acknowledged)."""

    def __init__(
        self,
        notifier: Notifier,
        slots: asyncio.Semaphore,
        done: Callable[[Event, bool], None],
        stop: asyncio.Event,
        *,
        retry: bool = True,
    ) -> None:
        self.notifier = notifier
        self.slots = slots
        self.done = done
        self.stop = stop
        self.retry_pauses = RETRY_PAUSES if retry else ()
        self._lanes: dict[str, _Lane] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # (stream, id) → (when read, event): ids are per stream, and two shards' streams
        # often give the same id to entries added in the same millisecond.
        self._held: dict[tuple[str, str], tuple[float, Event]] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._room = asyncio.Event()

    @property
    def held(self) -> int:
        """Events read and not done yet."""
        return len(self._held)

    def held_since(self, before: float) -> list[Event]:
        """The held events read before ``before`` (``time.monotonic``)."""
        return [e for at, e in self._held.values() if at <= before]

    def add(self, events: list[Event]) -> None:
        for event in events:
            if (event.stream, event.id) in self._held:
                continue  # already in a lane (claimed back from this very consumer)
            self._held[event.stream, event.id] = (time.monotonic(), event)
            key = _thread_of(event)
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = _Lane()
            lane.push(event)
            if key not in self._tasks:
                self._idle.clear()
                self._tasks[key] = asyncio.create_task(self._run(key, lane))

    async def drain(self) -> None:
        """Until every lane is done."""
        await self._idle.wait()

    async def wait_for_room(self, timeout: float) -> None:
        self._room.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._room.wait(), timeout)

    async def close(self) -> None:
        """Cancel the lanes still running (their events stay pending)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, key: str, lane: _Lane) -> None:
        try:
            with raising_rate_limits():
                while lane.events:
                    event = lane.events[0]
                    ok = await self._one(event, lane)
                    lane.pop()
                    self._held.pop((event.stream, event.id), None)
                    self._room.set()
                    self.done(event, ok)
        finally:
            # Cancelled (or broken): what is left stays pending in Redis, untouched from now
            # on, and is delivered again.
            for event in lane.events:
                self._held.pop((event.stream, event.id), None)
            self._lanes.pop(key, None)
            self._tasks.pop(key, None)
            if not self._tasks:
                self._idle.set()

    async def _one(self, event: Event, lane: _Lane) -> bool:
        limited = failed = 0
        # Waited for without a slot: other threads' events go on meanwhile.
        clicked = await self.notifier.click_showed(event)
        while True:
            skip_gate, skip_run = lane.updated_later(event)
            skip_gate = skip_gate or clicked
            async with self.slots:
                result = await self.notifier._attempt(event, skip_gate=skip_gate, skip_run=skip_run)
            if result is True:
                return True
            if self.stop.is_set():
                return False
            if result is False:
                if failed == len(self.retry_pauses):
                    return False  # left pending: delivered again when the group claims it
                pause = self.retry_pauses[failed]
                failed += 1
            else:
                if limited == RATE_LIMIT_RETRIES:
                    log.warning(
                        "event %s (%s) left pending: Slack keeps rate-limiting",
                        event.id,
                        event.type.value,
                    )
                    return False
                pause = result
                limited += 1
            await _sleep_or_stop(self.stop, pause)


async def _ack(source: EventConsumerLike, acks: list[Event]) -> None:
    """Acknowledge (and forget) the events in ``acks``; on failure they stay pending in Redis
    and are delivered again."""
    if not acks:
        return
    batch = acks[:]
    del acks[:]
    try:
        await source.ack_many(batch)
    except Exception as exc:  # Redis, or the client's state: the acknowledging goes on
        log.warning("ack of %d event(s) failed: %s", len(batch), type(exc).__name__)


async def _touch(source: EventConsumerLike, events: list[Event]) -> None:
    """Tell the group these events are still being worked on (their idle time starts again)."""
    if not events:
        return
    try:
        await source.touch_many(events)
    except Exception as exc:  # as for _ack
        log.warning("touching %d held event(s) failed: %s", len(events), type(exc).__name__)


def _shown(event: Event) -> list[str]:
    gate, run = _gate_shown(event), _run_shown(event)
    return [n for n in (gate and f"gate:{gate}", run and f"run:{run}") if n]


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
    if event.type in (EventType.GATE_DECIDED, EventType.TOOL_EXECUTED, EventType.GATE_APPROVAL):
        gate_id = event.data.get("gate_id")
        return gate_id if isinstance(gate_id, str) and gate_id else None
    return None


# A reminder or an escalation changes the card only, not the run's root message.
_ROOT_UPDATES = frozenset(
    t
    for t in EventType
    if (t.value.startswith("run.") or t.value.startswith("gate."))
    and t not in (EventType.GATE_REMINDED, EventType.GATE_ESCALATED)
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
