"""The agent of the Slack latency benchmark (``AGENT=tests.bench.slack_agent:agent``).

``delete_user`` is always gated. The first thing it does is append ``<user_id> <t>`` to the
file named by ``SLACK_BENCH_JOURNAL``, where ``t`` is ``time.monotonic()`` (CLOCK_MONOTONIC,
one clock for every process of the machine), so the benchmark can compute click → tool start
across processes.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

from agent_core import Agent, tool

_journal: TextIO | None = None


def _write(line: str) -> None:
    global _journal
    path = os.environ.get("SLACK_BENCH_JOURNAL")
    if not path:
        return
    if _journal is None:
        _journal = open(path, "a", encoding="utf-8")
    _journal.write(line)
    _journal.flush()


@tool(requires_approval=True)
async def delete_user(user_id: str) -> str:
    """Permanently delete a user."""
    _write(f"{user_id} {time.monotonic():.6f}\n")
    return f"user {user_id} deleted"


agent = Agent(
    name="slack-bench",
    instructions="You are the Slack latency benchmark agent.",
    tools=[delete_user],
)


# --------------------------------------------------------------------------- what-ifs
# SLACK_BENCH_WHATIF (``--whatif``, comma-separated; never the default) measures the fixes
# proposed in SLACK_RESULTS.md without touching agent_core/ or bot/: the web and worker
# processes import this module (AGENT) before they create their clients, so it swaps the
# factories in the modules that call them:
#
# - ``blocking-pool``: ``create_redis`` on a redis-py BlockingConnectionPool (50 connections),
#   so a task waits for a free connection instead of raising MaxConnectionsError;
# - ``slack-session``: the web's AsyncWebClient gets one shared aiohttp session, so each Web
#   API call reuses a keep-alive connection instead of opening (and closing) a new session
#   and TCP connection.
def _blocking_pool_create_redis(url: str, *, socket_timeout: float = 10.0) -> Any:
    from redis.asyncio import BlockingConnectionPool, Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialWithJitterBackoff
    from redis.exceptions import ConnectionError, TimeoutError

    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=int(os.environ.get("SLACK_BENCH_POOL_SIZE", "50")),
        timeout=socket_timeout,
        decode_responses=True,
        socket_timeout=socket_timeout,
        socket_connect_timeout=5.0,
        health_check_interval=15,
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), retries=3),
        retry_on_error=[ConnectionError, TimeoutError],
    )
    return Redis(connection_pool=pool)


def _shared_session_web_client(settings: Any, timeout: int = 15) -> Any:
    import aiohttp

    from bot.app import make_web_client

    client = make_web_client(settings, timeout)
    client.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout))
    return client


def _apply_whatifs(names: set[str]) -> None:
    targets = [sys.modules.get(n) for n in ("bot.server", "agent_core.worker", "__main__")]
    for mod in [m for m in targets if m is not None]:
        if "blocking-pool" in names and hasattr(mod, "create_redis"):
            mod.create_redis = _blocking_pool_create_redis  # type: ignore[attr-defined]
        if "slack-session" in names and hasattr(mod, "make_web_client"):
            mod.make_web_client = _shared_session_web_client  # type: ignore[attr-defined]


_apply_whatifs({n.strip() for n in os.environ.get("SLACK_BENCH_WHATIF", "").split(",") if n})
