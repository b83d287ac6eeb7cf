"""Process-level tuning shared by the ``worker`` and ``web`` entry points (not the library:
a worker embedded in your own process leaves your process alone)."""

from __future__ import annotations

import ctypes
import gc
import os
import platform

__all__ = ["freeze_startup_heap", "keep_large_buffers"]

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# What glibc reads itself, when an operator sets them: theirs win.
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def freeze_startup_heap() -> None:
    """Take every object alive after start-up (the imported libraries, settings, agents,
    clients: about 120,000 objects) out of the cyclic garbage collector's sight.

    A full collection then walks only what the process made since, instead of every module
    of openai, pydantic, redis-py and Bolt each time: 74 ms with the event loop stopped
    (measured: the worker logged such pauses every minute or so under load), about 0.1 ms
    after the freeze. Garbage made before the freeze is collected first.
    """
    gc.collect()
    gc.freeze()


def keep_large_buffers(mmap_threshold: int = 32 << 20, trim_threshold: int = 64 << 20) -> bool:
    """Let glibc's malloc serve and keep buffers up to ``mmap_threshold`` bytes from the
    heap, and keep up to ``trim_threshold`` bytes of freed heap instead of returning it.

    A model request for a long history is one buffer of its size (2.3 MiB at 5,000
    pairs). By default glibc maps each such buffer afresh and unmaps it when freed, or
    trims the heap it came from, so every request faults its pages in again: joining a
    2.3 MiB body took 3.2-3.6 ms in a fresh process, 1,300 minor page faults, and
    0.21-0.28 ms once the memory is kept (measured on the benchmark VM). The cost is up to
    ``trim_threshold`` bytes of freed memory the process keeps. False, and nothing
    changed, off glibc or when ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` is
    set (glibc reads those itself).
    """
    if platform.libc_ver()[0] != "glibc" or any(v in os.environ for v in _MALLOC_ENV):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    # M_MMAP_THRESHOLD first: setting either turns glibc's own adjustment of both off.
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    )
