"""Waiting for a run to reach a state: the body of :meth:`Gateway.wait`.

Nothing polls: the events stream is read with XREAD BLOCK from the position taken before
the run is read, so no transition is missed.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .exceptions import RunNotFound
from .ids import valid_run_id
from .models import Run, RunStatus

if TYPE_CHECKING:
    from .gateway import Gateway

# The states Gateway.wait can wait for: each is entered in the same script that publishes
# its event, so a waiter reading the events stream cannot miss it.
FINISHED = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})
WAITABLE = FINISHED | {RunStatus.AWAITING_APPROVAL}
_ENTERED_BY = {
    "gate.opened": RunStatus.AWAITING_APPROVAL,
    "run.completed": RunStatus.COMPLETED,
    "run.failed": RunStatus.FAILED,
    "run.cancelled": RunStatus.CANCELLED,
}
# Longest single XREAD BLOCK of Gateway.wait: well under the client's socket timeout.
_WAIT_BLOCK_MS = 1000


async def wait_for(gw: Gateway, run_id: str, targets: set[RunStatus], timeout: float | None) -> Run:
    """Block until the run is in a state of ``targets``, or finished; see
    :meth:`Gateway.wait`."""
    if not targets or not targets <= WAITABLE:
        raise ValueError(
            "until must name awaiting_approval, completed, failed or cancelled: those "
            "are the states the events stream announces"
        )
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    if not valid_run_id(run_id, gw.keys):
        raise RunNotFound(f"no run {run_id[:40]!r}")
    stream = gw.keys.events(gw.keys.shard_of(run_id))
    # The stream position first, then the run: an event after it is read below.
    last = await gw.redis.xrevrange(stream, count=1)
    position = last[0][0] if last else "0-0"
    run = await gw.get_run(run_id)
    while True:
        if run is None:
            raise RunNotFound(f"no run {run_id!r}")
        if run.status in targets or run.status.finished:
            return run
        block_ms = _WAIT_BLOCK_MS
        if deadline is not None:
            left = deadline - loop.time()
            if left <= 0:
                wanted = ", ".join(sorted(s.value for s in targets))
                raise TimeoutError(
                    f"run {run_id} is still {run.status.value} after {timeout} s "
                    f"(waited for {wanted})"
                )
            block_ms = max(1, min(block_ms, int(left * 1000)))
        reply = await gw.redis.xread({stream: position}, count=500, block=block_ms)
        entered = False
        for _stream, entries in reply or []:
            for msg_id, fields in entries:
                position = msg_id
                status = _ENTERED_BY.get((fields or {}).get("type", ""))
                if status is not None and fields.get("run_id") == run_id:
                    entered = entered or status in targets or status.finished
        if entered:
            run = await gw.get_run(run_id)
            if run is None:
                raise RunNotFound(f"no run {run_id!r}")
            return run
