"""Overload must slow the gateway down, never make it drop acknowledged work.

Found by the Slack latency benchmark (tests/bench/slack_latency.py, SLACK_RESULTS.md): in a
burst of 500 clicks the ``web`` process acknowledged every click and then failed to decide
401 of them (``MaxConnectionsError: Too many connections``), and in a burst of 500 slash
commands 275 runs never started. The cause was the Redis client every process gets from
``agent_core.create_redis`` (an unbounded-waiting pool now fixes it).
"""

from __future__ import annotations

import asyncio

from agent_core import create_redis


async def test_150_concurrent_commands_wait_for_a_connection_instead_of_failing(
    redis_url: str,
) -> None:
    client = create_redis(redis_url)
    try:
        results = await asyncio.gather(
            *(client.blpop([f"nothing:{i}"], timeout=0.2) for i in range(150)),
            return_exceptions=True,
        )
    finally:
        await client.aclose()
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"{len(errors)} of 150 commands failed: {errors[0]!r}"
