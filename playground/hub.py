"""Live updates for the page: every open tab subscribes; the Web API side publishes.

An event goes to everyone, or to one person only (their ephemeral messages and modals).
A tab that cannot keep up (its queue is full) is dropped; its EventSource reconnects and
reloads the history, so nothing it shows stays stale.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

QUEUE_SIZE = 1000


@dataclass(eq=False)
class Subscriber:
    user: str
    queue: asyncio.Queue[tuple[str, str] | None] = field(
        default_factory=lambda: asyncio.Queue(QUEUE_SIZE)
    )


class Hub:
    def __init__(self) -> None:
        self._subs: set[Subscriber] = set()

    @property
    def listening(self) -> bool:
        """Whether any tab is subscribed."""
        return bool(self._subs)

    def subscribe(self, user: str) -> Subscriber:
        sub = Subscriber(user)
        self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subs.discard(sub)

    def publish(self, event: str, data: Any, *, to: str | None = None) -> None:
        text = json.dumps(data, ensure_ascii=False)
        for sub in list(self._subs):
            if to is not None and sub.user != to:
                continue
            try:
                sub.queue.put_nowait((event, text))
            except asyncio.QueueFull:
                self._end(sub)

    def close(self) -> None:
        for sub in list(self._subs):
            self._end(sub)

    def _end(self, sub: Subscriber) -> None:
        """Drop a subscriber: empty its queue and leave the None that ends its stream."""
        self._subs.discard(sub)
        while not sub.queue.empty():
            sub.queue.get_nowait()
        sub.queue.put_nowait(None)
