"""Prometheus metrics of the ``web`` and ``worker`` processes (``GET /metrics``).

Counters and histograms live in prometheus_client's default registry, one per process (with
its ``process_*`` and ``python_*`` metrics); a process running several workers or bots adds
them up. Labels take a few values each, never a run, gate or user id.

Gates (counted by the core: the runner opening gates, the gateway deciding and closing them)
  ``agw_gates_opened_total``: gates opened.
  ``agw_gates_decided_total{outcome}``: gates closed, by ``approved``, ``denied``, ``expired``
  (the sweeper, or a click after the deadline) and ``cancelled`` (the run was cancelled or
  failed). A gate a thread's grant approves as it opens counts as opened and approved; one
  an approver rule decides as it opens counts in neither.
  ``agw_gate_decision_seconds{outcome}``: histogram of the time from a gate's opening to its
  decision (approved, denied, expired), 1 s to 1 h.

Jobs (read from Redis at each scrape, per shard)
  ``agw_jobs_pending{shard}``: jobs no worker has taken yet.
  ``agw_jobs_in_progress{shard}``: jobs a worker took and has not finished.
  ``agw_oldest_job_age_seconds{shard}``: how long the oldest pending job has waited (0: none).

Workers
  ``agw_run_takeovers_total``: runs taken over from a worker whose lease ran out (it died,
  froze or lost Redis mid-job).
  ``agw_dead_letters_total{reason}``: jobs moved to the dead-letter stream, ``malformed`` or
  ``too_many_deliveries``.
  ``agw_model_request_seconds``: histogram of one model request (each retry is one).
  ``agw_model_errors_total{kind}``: failed model requests: ``rate_limited`` (429) and
  ``retryable`` (5xx, timeout, connection, a relayed provider failure) are tried again,
  ``final`` is not; ``exhausted`` counts the calls that gave up after their retries.

Slack (the ``web`` process)
  ``agw_slack_api_calls_total{method}``: Web API calls (retries of one call count once).
  ``agw_slack_api_errors_total{method,error}``: calls that failed after their retries, by
  Slack's error code (``ratelimited``, ``channel_not_found``…) or the exception's type.
  ``agw_slack_api_rate_limited_total{method}``: HTTP 429 answers, retried or not.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest
from redis.asyncio import Redis
from redis.exceptions import RedisError

from .keys import Keys

if TYPE_CHECKING:
    from aiohttp import web

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
JOBS_GROUP = "workers"  # the workers' consumer group (agent_core.worker.JOBS_GROUP)
OUTCOMES = ("approved", "denied", "expired", "cancelled")

GATES_OPENED = Counter("agw_gates_opened", "Approval gates opened.")
GATES_DECIDED = Counter("agw_gates_decided", "Approval gates closed, by outcome.", ["outcome"])
GATE_DECISION_SECONDS = Histogram(
    "agw_gate_decision_seconds",
    "Seconds from a gate's opening to its decision.",
    ["outcome"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600),
)
JOBS_PENDING = Gauge("agw_jobs_pending", "Jobs no worker has taken yet.", ["shard"])
JOBS_IN_PROGRESS = Gauge(
    "agw_jobs_in_progress", "Jobs a worker took and has not finished.", ["shard"]
)
OLDEST_JOB_AGE = Gauge(
    "agw_oldest_job_age_seconds", "Seconds the oldest pending job has waited.", ["shard"]
)
TAKEOVERS = Counter("agw_run_takeovers", "Runs taken over from a worker whose lease ran out.")
DEAD_LETTERS = Counter("agw_dead_letters", "Jobs moved to the dead-letter stream.", ["reason"])
MODEL_SECONDS = Histogram(
    "agw_model_request_seconds",
    "Seconds of one model request.",
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120),
)
MODEL_ERRORS = Counter("agw_model_errors", "Failed model requests, by kind.", ["kind"])
SLACK_CALLS = Counter("agw_slack_api_calls", "Slack Web API calls.", ["method"])
SLACK_ERRORS = Counter(
    "agw_slack_api_errors", "Slack Web API calls that failed.", ["method", "error"]
)
SLACK_RATE_LIMITED = Counter(
    "agw_slack_api_rate_limited", "Slack Web API answers with HTTP 429.", ["method"]
)

# Every series a dashboard expects shows from the start, at 0.
for _outcome in OUTCOMES:
    GATES_DECIDED.labels(_outcome)
for _outcome in OUTCOMES[:3]:
    GATE_DECISION_SECONDS.labels(_outcome)
for _kind in ("rate_limited", "retryable", "final", "exhausted"):
    MODEL_ERRORS.labels(_kind)
for _reason in ("malformed", "too_many_deliveries"):
    DEAD_LETTERS.labels(_reason)

_LABEL = re.compile(r"^[A-Za-z0-9_.]{1,64}$")


def label(value: str) -> str:
    """A label value from outside (a Slack method or error code): kept when it looks like
    one, ``other`` otherwise, so that a strange answer cannot add series without bound."""
    return value if _LABEL.match(value) else "other"


def gate_decided(outcome: str, created_at: float, decided_at: float | None) -> None:
    """Count a decision the core applied (and its delay, unless the run closed the gate)."""
    GATES_DECIDED.labels(outcome).inc()
    if outcome != "cancelled" and decided_at is not None:
        GATE_DECISION_SECONDS.labels(outcome).observe(max(decided_at - created_at, 0.0))


async def _statuses(redis: Redis, keys: Keys, gate_ids: list[str]) -> list[str | None]:
    if not gate_ids:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for g in gate_ids:
            pipe.hget(keys.gate(g), "status")
        statuses: list[str | None] = await pipe.execute()
    return statuses


async def pending_gates(redis: Redis, keys: Keys, gate_ids: list[str]) -> list[str]:
    """Those of ``gate_ids`` that are pending now."""
    statuses = await _statuses(redis, keys, gate_ids)
    return [g for g, st in zip(gate_ids, statuses, strict=True) if st == "pending"]


async def count_cancelled(redis: Redis, keys: Keys, were_pending: list[str]) -> None:
    """Count the gates, pending before a run was cancelled or failed, that it closed."""
    try:
        statuses = await _statuses(redis, keys, were_pending)
    except (RedisError, OSError):
        return  # the cancel itself is done: a metric is not worth failing it
    closed = sum(st == "cancelled" for st in statuses)
    if closed:
        GATES_DECIDED.labels("cancelled").inc(closed)


async def count_granted(redis: Redis, keys: Keys, opened: list[str]) -> None:
    """Count, as approved, those of the gates just ``opened`` that a thread's grant approved
    as they opened (agent_core.grants; not in the decision-time histogram: nobody waited)."""
    if not opened:
        return
    try:
        async with redis.pipeline(transaction=False) as pipe:
            for g in opened:
                pipe.hget(keys.gate(g), "decided_by")
            by: list[str | None] = await pipe.execute()
    except (RedisError, OSError):
        return  # the gates are open: a metric is not worth failing the turn
    granted = sum(bool(b) and str(b).startswith("grant:") for b in by)
    if granted:
        GATES_DECIDED.labels("approved").inc(granted)


async def refresh_jobs(redis: Redis, keys: Keys, group: str = JOBS_GROUP) -> None:
    """Set the per-shard job gauges from the jobs streams.

    Acknowledged jobs are deleted from their stream, so its length is what is left to do:
    the group's pending entries are in progress, the rest waits, after the group's last
    delivered id.
    """
    shards = list(keys.all_shards())
    sec, usec = await redis.time()
    now_ms = sec * 1000 + usec // 1000
    async with redis.pipeline(transaction=False) as pipe:
        for s in shards:
            pipe.xlen(keys.jobs(s))
            pipe.xinfo_groups(keys.jobs(s))
        replies = await pipe.execute(raise_on_error=False)  # XINFO fails on a missing stream
    waiting_after: dict[int, str] = {}
    for i, s in enumerate(shards):
        length, groups = replies[2 * i], replies[2 * i + 1]
        length = length if isinstance(length, int) else 0
        info = (
            next((g for g in groups if g.get("name") == group), None)
            if isinstance(groups, list)
            else None
        )
        taken = min(int(info["pending"]), length) if info else 0
        JOBS_PENDING.labels(str(s)).set(length - taken)
        JOBS_IN_PROGRESS.labels(str(s)).set(taken)
        if length > taken:
            waiting_after[s] = ("(" + info["last-delivered-id"]) if info else "-"
        else:
            OLDEST_JOB_AGE.labels(str(s)).set(0)
    if not waiting_after:
        return
    async with redis.pipeline(transaction=False) as pipe:
        for s, start in waiting_after.items():
            pipe.xrange(keys.jobs(s), min=start, max="+", count=1)
        firsts = await pipe.execute()
    for s, first in zip(waiting_after, firsts, strict=True):
        age = max(now_ms - int(first[0][0].split("-")[0]), 0) / 1000 if first else 0.0
        OLDEST_JOB_AGE.labels(str(s)).set(age)


async def render(redis: Redis | None = None, keys: Keys | None = None) -> bytes:
    """The exposition text, the job gauges refreshed first when Redis is given."""
    if redis is not None and keys is not None:
        try:
            await asyncio.wait_for(refresh_jobs(redis, keys), timeout=2.0)
        except Exception as exc:  # Redis, or the client's state: serve the rest anyway
            log.warning("metrics: could not read the jobs streams (%s)", type(exc).__name__)
    return generate_latest(REGISTRY)


def handler(
    redis: Redis | None, keys: Keys | None
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """An aiohttp handler for ``GET /metrics``."""
    from aiohttp import web  # the web server only where one is served

    async def metrics(request: web.Request) -> web.Response:
        body = await render(redis, keys)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    return metrics


async def serve(redis: Redis, keys: Keys, host: str, port: int) -> web.AppRunner:
    """A small HTTP server answering ``GET /metrics`` (the worker's); cleanup() stops it."""
    from aiohttp import web

    app = web.Application()
    app.router.add_get(METRICS_PATH, handler(redis, keys))
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
