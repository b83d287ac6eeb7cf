"""The event loop the processes run on: uvloop where it is installed (a dependency on
Linux and macOS), else asyncio's own; ``EVENT_LOOP`` chooses."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from .exceptions import ConfigError

T = TypeVar("T")

EventLoopChoice = Literal["auto", "uvloop", "asyncio"]


def loop_factory(choice: EventLoopChoice) -> tuple[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The name and the factory of the loop ``choice`` asks for: ``auto`` is uvloop when it
    can be imported, else asyncio; ``uvloop`` when it cannot is a :class:`ConfigError`."""
    if choice != "asyncio":
        try:
            uvloop = importlib.import_module("uvloop")
        except ImportError:
            if choice == "uvloop":
                raise ConfigError(
                    "EVENT_LOOP: uvloop is not installed (pip install uvloop), "
                    "or set EVENT_LOOP=asyncio"
                ) from None
        else:
            factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
            return "uvloop", factory
    return "asyncio", asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T], choice: EventLoopChoice = "auto") -> T:
    """``asyncio.run(main)`` on the loop ``choice`` asks for."""
    try:
        _, factory = loop_factory(choice)
    except ConfigError:
        main.close()  # never awaited: no "coroutine was never awaited" warning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``: the loop this coroutine runs on (for the startup log)."""
    return (
        "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
    )
