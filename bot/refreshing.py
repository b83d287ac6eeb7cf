"""Card updates a click is making in this process, for the notifier to wait for.

A click decides its gate, then updates the card itself (bot/clicks.py). The decision's
gate.decided event reaches this process's notifier at once, usually while that update is
still on its way to Slack: the notifier then found the card not showing the decision yet,
waited for the card's lock, and rendered the same card again (four round trips and a render
per click, for nothing). Now a click registers its update before deciding; the notifier
waits for it (without holding one of its slots: other threads' events go on) and leaves
the card alone when it shows the decision. An event handled by
another replica, or a click whose update failed, takes the usual path.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from agent_core.models import Gate

# How long the notifier waits for a click's card update before doing its own.
WAIT_SECONDS = 5.0


class Refresh:
    """One click's card update: :meth:`shown` records the gate as the card shows it."""

    def __init__(self, done: asyncio.Future[Gate | None]) -> None:
        self._done = done

    def shown(self, gate: Gate | None) -> None:
        if not self._done.done():
            self._done.set_result(gate)


class Refreshes:
    """The card updates clicks are making in this process, by gate id."""

    def __init__(self) -> None:
        self._pending: dict[str, asyncio.Future[Gate | None]] = {}

    @contextlib.asynccontextmanager
    async def making(self, gate_id: str) -> AsyncIterator[Refresh]:
        """Around a click's decision and its card update (the first click's, when several
        race on one gate): the update's outcome, ``None`` unless :meth:`Refresh.shown`."""
        done: asyncio.Future[Gate | None] = asyncio.get_running_loop().create_future()
        mine = gate_id not in self._pending
        if mine:
            self._pending[gate_id] = done
        try:
            yield Refresh(done)
        finally:
            if not done.done():
                done.set_result(None)
            if mine:
                del self._pending[gate_id]

    async def shows(self, gate_id: str, status: object) -> bool:
        """Whether a click's card update, in progress here, showed the gate in ``status``
        (waited for, up to WAIT_SECONDS); False when there is none."""
        pending = self._pending.get(gate_id)
        if pending is None:
            return False
        try:
            gate = await asyncio.wait_for(asyncio.shield(pending), WAIT_SECONDS)
        except TimeoutError:
            return False
        return gate is not None and gate.status.value == status
