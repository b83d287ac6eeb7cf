"""The process entry points take their start-up heap out of the garbage collector's walks."""

from __future__ import annotations

import gc
import weakref

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
