"""The process entry points take their start-up heap out of the garbage collector's walks,
and a worker keeps its large buffers mapped."""

from __future__ import annotations

import gc
import os
import platform
import subprocess
import sys
import weakref

import pytest

from agent_core.runtime import freeze_startup_heap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_the_start_up_heap_is_frozen_after_its_garbage_is_collected() -> None:
    garbage = _Node()
    gone = weakref.ref(garbage)
    del garbage
    kept = _Node()
    try:
        freeze_startup_heap()
        assert gone() is None, "garbage made before the freeze is collected, not frozen"
        assert gc.get_freeze_count() > 10_000, "the imported libraries are frozen"
        assert all(kept is not o for o in gc.get_objects()), "what lived then is frozen"
        later = _Node()
        assert any(later is o for o in gc.get_objects()), "what comes later is walked"
    finally:
        gc.unfreeze()


_JOINS = """
import resource, sys
from agent_core.runtime import keep_large_buffers
kept = keep_large_buffers() if sys.argv[1] == "keep" else False
faults = []
for _ in range(4):
    items = [b"x" * 230 for _ in range(10_000)]  # a 5,000-pair history, as Redis returns it
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    body = b",".join([b"head", *items])  # the request body: one 2.3 MiB buffer
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del items, body
print(int(kept), max(faults[1:]))
"""


def _joins(mode: str, **env: str) -> tuple[bool, int]:
    out = subprocess.run(
        [sys.executable, "-c", _JOINS, mode],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
        timeout=60,
    ).stdout.split()
    return out[0] == "1", int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_a_worker_keeps_a_long_historys_request_buffer_instead_of_faulting_it_in_again() -> None:
    kept, faults = _joins("keep")
    _, untuned = _joins("default")
    assert kept
    # By default each 2.3 MiB body is mapped afresh (~560 pages faulted in each time).
    assert untuned > 300 and faults < untuned / 10, (faults, untuned)


def test_an_operators_malloc_settings_are_left_alone() -> None:
    kept, _ = _joins("keep", MALLOC_TRIM_THRESHOLD_="131072")
    assert not kept
