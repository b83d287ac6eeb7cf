"""How soon an acknowledgement follows its moment (:func:`bot.acking.first_of`), and what
Bolt's assistant middleware looks at.

On a busy web process every pass through the event loop's queue costs the time of all that
is queued: the click's answer to Slack waits for "the decision is durable" and then for "the
listener acked". Each of those waits resumes in the next pass, not two or three passes later
(a waiter task and ``asyncio.wait`` each added one). The passes are counted, not timed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse

from bot import assistant
from bot.acking import Flag, first_of


class Passes:
    """Counts the passes of the event loop: a callback that schedules itself again."""

    def __init__(self) -> None:
        self.count = 0
        self._on = True
        asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        if self._on:
            self.count += 1
            asyncio.get_running_loop().call_soon(self._tick)

    def stop(self) -> None:
        self._on = False


async def _resumed_after(trigger: str) -> int:
    """Loop passes between the moment and the waiter's resumption."""
    flag = Flag()
    at: list[int] = []
    passes: Passes | None = None

    async def work() -> None:
        nonlocal passes
        await asyncio.sleep(0)
        passes = Passes()
        at.append(passes.count)
        if trigger == "flag":
            flag.set()
            await asyncio.sleep(3600)  # the work goes on after its moment

    task = asyncio.ensure_future(work())
    try:
        assert await first_of(flag, task) is True
        assert passes is not None
        return passes.count - at[0]
    finally:
        if passes is not None:
            passes.stop()
        task.cancel()


async def test_a_set_flag_wakes_the_waiter_in_the_next_pass() -> None:
    assert await _resumed_after("flag") <= 1


async def test_a_finished_task_wakes_the_waiter_in_the_next_pass() -> None:
    # The task's done callbacks run one pass after it ends; the waiter in the pass after.
    assert await _resumed_after("task") <= 2


async def test_first_of_times_out_and_leaves_nothing_behind() -> None:
    flag = Flag()
    task = asyncio.ensure_future(asyncio.sleep(3600))
    try:
        assert await first_of(flag, task, 0.01) is False
        assert flag._callbacks == []
        flag.set()  # a late moment calls nothing left over
        assert flag.is_set()
    finally:
        task.cancel()


async def test_first_of_returns_at_once_when_the_moment_has_come() -> None:
    flag = Flag()
    flag.set()
    task = asyncio.ensure_future(asyncio.sleep(3600))
    try:
        assert await first_of(flag, task, 0) is True
    finally:
        task.cancel()


async def test_a_cancelled_waiter_removes_its_callbacks() -> None:
    flag = Flag()
    task = asyncio.ensure_future(asyncio.sleep(3600))
    waiter = asyncio.ensure_future(first_of(flag, task))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert flag._callbacks == []
    task.cancel()


@pytest.mark.parametrize(
    ("body", "matched"),
    [
        ({"type": "block_actions", "actions": [{"action_id": "approve"}]}, False),
        ({"type": "view_submission", "view": {"callback_id": "deny"}}, False),
        ({"type": "event_callback", "event": {"type": "app_mention"}}, True),
    ],
)
async def test_the_assistant_middleware_looks_only_at_events(
    body: dict[str, Any], matched: bool
) -> None:
    middleware = assistant._EventsOnly()
    looked: list[str] = []

    @middleware.thread_started
    async def started() -> None:  # pragma: no cover - only its matcher matters here
        pass

    for listener in middleware._thread_started_listeners or []:
        original = listener.async_matches

        async def spy(*, req: AsyncBoltRequest, resp: BoltResponse, _o: Any = original) -> bool:
            looked.append(req.body.get("type", ""))
            result: bool = await _o(req=req, resp=resp)
            return result

        listener.async_matches = spy  # type: ignore[method-assign]

    # Bolt puts its listener runner in the context; nothing here runs a listener.
    req = AsyncBoltRequest(body=body, mode="socket_mode", context={"listener_runner": None})
    resp = BoltResponse(status=404)
    passed: list[bool] = []

    async def next_() -> BoltResponse:
        passed.append(True)
        return resp

    await middleware.async_process(req=req, resp=resp, next=next_)
    assert bool(looked) is matched  # an event is matched against the assistant's listeners
    assert passed == [True]  # and anything it does not take goes on to the app's own
