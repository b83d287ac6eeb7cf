"""The worker: consumes start/resume jobs, advances runs, expires overdue gates.

Run it as a process with ``python -m agent_core.worker`` (or the ``agent-worker`` script), or
inside your own program with :func:`run_worker`. Any number of workers may run against one
Redis: jobs are shared through a consumer group, a run is advanced by one worker at a time (a
lease renewed while it works), and a dead worker's jobs are claimed by the others once idle
for ``WORKER_LEASE`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
from collections.abc import Sequence

from aiohttp import web
from openai import AsyncOpenAI
from redis.asyncio import Redis
from redis.exceptions import RedisError

from . import audit, event_loop, layout, metrics, presence
from .agent import Agent, AgentTool
from .connections import reachable_redis
from .event_loop import running_loop_name
from .exceptions import ConfigError, GateNotFound, LeaseLost
from .gateway import Gateway, valid_run_id
from .keys import Keys
from .nudges import NudgeSweeper
from .runner import JobRef, Runner
from .runtime import freeze_startup_heap, keep_large_buffers
from .script_replies import Began, LeaseStatus
from .scripts import Scripts
from .settings import Settings, exit_on_config_error, importable_from_cwd, load_agents
from .streams import StreamConsumer, StreamMessage, is_cluster, stream_groups
from .trimmer import forget_dead_consumers, trim_events

log = logging.getLogger("agent_core.worker")

JOBS_GROUP = "workers"
# How often the sweeper trims the events stream and looks for stuck runs (seconds).
HOUSEKEEPING_INTERVAL = 10.0


def _flat(msg: StreamMessage) -> list[str]:
    return [x for kv in msg.fields.items() for x in kv]


class Worker:
    """Consumes the jobs stream and sweeps expired gates until stopped.

    :func:`run_worker` builds one from settings; build it yourself to share a Redis client
    or an OpenAI client. ``stop``, when given, stops it once set (as :meth:`stop` does).
    """

    def __init__(
        self,
        redis: Redis,
        agent: Agent | Sequence[Agent],
        client: AsyncOpenAI,
        settings: Settings,
        *,
        name: str | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        configured = [agent] if isinstance(agent, Agent) else list(agent)
        if not configured:
            raise ConfigError("AGENTS is empty: a worker needs at least one agent")
        self.redis = redis
        self.agent = configured[0]  # runs that name no agent are this one's
        # Every configured agent and every sub-agent they call, by name.
        self.agents: dict[str, Agent] = {}
        for top in configured:
            for a in top.all_agents():
                if self.agents.setdefault(a.name, a) is not a:
                    raise ConfigError(
                        f"AGENTS: two different agents are named {a.name!r} (a sub-agent "
                        "included); give each agent its own name"
                    )
        self.settings = settings
        self.keys = Keys(settings.key_prefix, settings.shards)
        self.name = name or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.gateway = Gateway(
            redis,
            self.keys,
            agent_name=self.agent.name,
            decision_replicas=settings.decision_replicas,
        )
        self.runners = {
            a.name: Runner(
                redis,
                self.keys,
                a,
                client,
                model=settings.openai_model,
                approval_timeout=settings.approval_timeout,
                events_maxlen=settings.events_maxlen,
                max_turns=settings.max_turns,
                max_calls_per_turn=settings.max_calls_per_turn,
                claim_replicas=settings.decision_replicas,
                model_retries=settings.openai_max_retries,
                retry_budget=settings.openai_retry_budget,
                nudges=settings.nudges,
                approval_routes=settings.approval_routes,
            )
            for a in self.agents.values()
        }
        for r in self.runners.values():
            r.peers = self.runners
        self.runner = self.runners[self.agent.name]
        # Which approved calls a resume claims as one batch with the lease (ACQUIRE_LEASE):
        # any but a sub-agent's (a child run starts instead), for agents that run a turn's
        # calls together.
        self._batch = json.dumps(
            {
                "default": self.agent.name,
                "agents": {
                    a.name: sorted(t.name for t in a.tools if isinstance(t, AgentTool))
                    for a in self.agents.values()
                    if a.parallel_tool_calls
                },
            }
        )
        lease_ms = int(settings.worker_lease * 1000)
        self.lease_ms = lease_ms
        keys = self.keys
        # One reader for every shard's jobs on a single Redis node, one per shard on Redis
        # Cluster; each blocks on its own connection and they share the concurrency slots.
        self.readers = [
            StreamConsumer(
                redis,
                streams,
                JOBS_GROUP,
                self.name,
                dead_stream=lambda stream: keys.dead_jobs(keys.shard_of_stream(stream)),
                claim_idle_ms=lease_ms,
                max_deliveries=settings.job_max_deliveries,
                delete_acked=True,
            )
            for streams in stream_groups(redis, [keys.jobs(s) for s in keys.all_shards()])
        ]
        self.max_deliveries = settings.job_max_deliveries
        self.scripts = Scripts(redis, self.keys)
        self.nudger = NudgeSweeper(redis, self.keys, self.scripts)
        self._slots = asyncio.Semaphore(settings.worker_concurrency)
        self._inflight: set[asyncio.Task[None]] = set()
        # The jobs this worker is advancing, by (stream, id): one that its heartbeat could not
        # keep claimed (Redis unreachable for longer than the lease) may come back to this
        # worker's own claim; it must not start a second advance that takes the run over
        # from the first.
        self._working: set[tuple[str, str]] = set()
        self.stopping = stop if stop is not None else asyncio.Event()

    async def run(self) -> None:
        """Serve until :meth:`stop`; in-flight jobs get a short grace period. Raises
        :class:`ConfigError` at once when Redis holds this deployment's runs in the old key
        layout (:mod:`agent_core.layout`): it would not see them."""
        try:
            await layout.refuse_old_layout(self.redis, self.keys)
        except (RedisError, OSError) as exc:
            log.warning("could not check the key layout (%s)", type(exc).__name__)
        log.info(
            "worker %s serving %s %s (%s, %d shards, %s)",
            self.name,
            "agent" if len(self.agents) == 1 else "agents",
            ", ".join(repr(n) for n in self.agents),
            "Redis Cluster" if is_cluster(self.redis) else "one Redis",
            self.keys.shards,
            running_loop_name(),
        )
        opened: list[Agent] = []
        try:
            for a in self.agents.values():
                await a.open()  # toolsets connect once per process; failures are logged
                opened.append(a)
            await self._serve()
        finally:
            for r in self.runners.values():
                await r.endpoint.aclose()
            for a in opened:
                try:
                    await a.close()
                except Exception:
                    log.warning("agent %s: closing its toolsets failed", a.name, exc_info=True)

    async def _serve(self) -> None:
        await presence.announce_worker(self)  # the web's /healthz sees this worker now
        exporter = await self._serve_metrics()
        tasks = [asyncio.create_task(self._sweep_forever(), name="sweeper")]
        tasks += [
            asyncio.create_task(self._consume_forever(reader), name=f"jobs-{i}")
            for i, reader in enumerate(self.readers)
        ]
        stop = asyncio.create_task(self.stopping.wait())
        try:
            await asyncio.wait({stop, *tasks}, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception():
                    raise task.exception()  # type: ignore[misc]
        finally:
            stop.cancel()
            # A job delivered to a read cancelled here stays pending and is claimed by
            # another worker after WORKER_LEASE: nothing is lost.
            for task in tasks:
                task.cancel()
            # Bounded: redis-py's cluster client has been seen to swallow a cancellation
            # while blocked in a read (the bench's driver hung on it); a reader still blocked
            # after 5 s is left behind rather than holding the worker's exit.
            _finished, stuck = await asyncio.wait(tasks, timeout=5)
            for task in _finished:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    task.result()
            if stuck:
                log.warning("%d reader(s) did not stop within 5 s; exiting anyway", len(stuck))
            if self._inflight:
                _done, pending = await asyncio.wait(self._inflight, timeout=5)
                for t in pending:  # not acknowledged: another worker resumes them
                    t.cancel()
            if exporter is not None:
                await exporter.cleanup()
            await presence.withdraw(self.redis, self.keys, self.name)  # not alive any more

    async def _serve_metrics(self) -> web.AppRunner | None:
        """``GET /metrics`` on METRICS_HOST:METRICS_PORT, when the port is set."""
        host, port = self.settings.metrics_host, self.settings.metrics_port
        if not port:
            return None
        try:
            runner = await metrics.serve(self.redis, self.keys, host, port)
        except OSError as exc:
            raise ConfigError(
                f"METRICS_PORT: cannot listen on {host}:{port} ({exc.strerror or exc})"
            ) from None
        log.info("metrics on http://%s:%d%s", host, port, metrics.METRICS_PATH)
        return runner

    def stop(self) -> None:
        """Ask :meth:`run` to return (in-flight jobs get a short grace period)."""
        self.stopping.set()

    # --- jobs -------------------------------------------------------------------------
    async def _consume_forever(self, reader: StreamConsumer) -> None:
        backoff = 0.1
        while not self.stopping.is_set():
            await self._slots.acquire()
            try:
                free = self.settings.worker_concurrency - len(self._inflight)
                msgs = await reader.read(count=max(min(free, 50), 1), block_ms=1000)
                backoff = 0.1
            except (RedisError, OSError) as exc:
                self._slots.release()
                log.warning(
                    "jobs: Redis unavailable (%s); retrying in %.1fs", type(exc).__name__, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            except Exception:
                # Not Redis' answer but the client's state (redis-py's cluster client can
                # close a connection under a blocked read while it follows a slot move).
                # The reader must outlive it: whatever it had read stays pending, and is
                # claimed again after WORKER_LEASE.
                self._slots.release()
                log.exception("jobs: reading failed; retrying in %.1fs", backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if not msgs:
                self._slots.release()
                continue
            for i, msg in enumerate(msgs):
                if i > 0:
                    await self._slots.acquire()
                task = asyncio.create_task(self._handle(reader, msg))
                self._inflight.add(task)
                task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._slots.release()

    async def _handle(self, reader: StreamConsumer, msg: StreamMessage) -> None:
        job = (msg.stream, msg.id)
        if job in self._working:
            log.info("job %s is being advanced by this worker already", msg.id)
            return
        self._working.add(job)
        try:
            await self._handle_job(reader, msg)
        finally:
            self._working.discard(job)

    async def _handle_job(self, reader: StreamConsumer, msg: StreamMessage) -> None:
        run_id = msg.fields.get("run_id", "")
        try:
            if (
                not valid_run_id(run_id, self.keys)
                or self.keys.jobs(self.keys.shard_of(run_id)) != msg.stream
                or msg.fields.get("type") not in ("start", "resume")
            ):
                log.error("malformed job %s dead-lettered", msg.id)
                await reader.dead_letter(msg, "malformed job")
                metrics.DEAD_LETTERS.labels("malformed").inc()
                return
            fence, began = await self._acquire(
                run_id, msg.fields.get("turn"), msg.fields.get("gates", "").split()
            )
            if fence is None:
                await reader.ack(msg)
                log.warning("job %s for unknown run %s ignored", msg.id, run_id)
                return
            if fence == "busy":
                # Another worker advances this run. Waiting for it is not a failure: the job
                # goes back to the end of the stream as a new entry (delivery count reset),
                # and whoever reads it next finds the run's state then.
                await self.scripts.requeue_job(msg.stream, JOBS_GROUP, msg.id, _flat(msg))
                log.info("run %s is busy elsewhere; job %s requeued", run_id, msg.id)
                return
            await self._advance(reader, run_id, fence, msg, began)
        except asyncio.CancelledError:
            raise
        except LeaseLost:
            # Paused or slow past the lease: another worker owns the run now. Nothing more
            # is written; the job stays with the new owner.
            log.warning(
                "run %s: lost its lease (paused or blocked longer than WORKER_LEASE=%ss); "
                "stopped advancing it, wrote nothing more",
                run_id,
                self.settings.worker_lease,
            )
        except Exception:
            # Not acknowledged: the job is delivered again after WORKER_LEASE, and
            # dead-lettered after JOB_MAX_DELIVERIES attempts.
            log.exception("run %s: job %s failed", run_id, msg.id)

    async def _advance(
        self,
        reader: StreamConsumer,
        run_id: str,
        fence: str,
        msg: StreamMessage,
        began: Began | None = None,
    ) -> None:
        lost = asyncio.Event()
        done = asyncio.Event()
        # The heartbeat's task starts when its first beat is due: most jobs are over by then
        # (a task, its wait and its cancellation per job were ~5% of a worker's CPU).
        beats: list[asyncio.Task[None]] = []

        def beat() -> None:
            if not done.is_set():
                hb = self._heartbeat(reader, run_id, fence, msg, lost, done, first=0.0)
                beats.append(asyncio.create_task(hb))

        timer = asyncio.get_running_loop().call_later(self.lease_ms / 3000, beat)
        finished = False
        try:
            if msg.deliveries > self.max_deliveries:
                error = (
                    f"the worker failed to process this run {msg.deliveries - 1} times "
                    "(crash or error each time); the job was moved to the dead-letter stream"
                )
                await self.runner.fail(run_id, error, fence)
                await reader.dead_letter(msg, error)
                metrics.DEAD_LETTERS.labels("too_many_deliveries").inc()
                log.error("run %s: job %s dead-lettered", run_id, msg.id)
            else:
                job = JobRef(msg.stream, JOBS_GROUP, msg.id)
                await self.runner.advance(run_id, fence, lost, began, job)
                finished = job.finished  # by the step that paused or finished the run
            done.set()
            timer.cancel()
            for hb in beats:
                hb.cancel()
            if finished:
                pass
            elif await self.scripts.finish_job(msg.stream, JOBS_GROUP, msg.id, run_id, fence):
                finished = True
            else:
                raise LeaseLost(run_id)
        finally:
            # Told to stop, and waited for with a bound: redis-py can swallow a cancellation
            # that lands inside a command, and an unbounded await then held the job's slot.
            done.set()
            timer.cancel()
            for hb in beats:
                hb.cancel()
            if beats:
                await asyncio.wait(beats, timeout=1.0)
            if not finished and not lost.is_set():
                with contextlib.suppress(RedisError, OSError):
                    await self.scripts.release_lease(run_id, fence)

    async def _acquire(
        self, run_id: str, turn: str | None = None, gate_ids: Sequence[str] = ()
    ) -> tuple[str | None, Began | None]:
        """The run's lease: (a fence token, BEGIN_RUN's reply taken with it: the history
        for a model turn, or when the job resumes ``turn``, that turn's hash, the hashes of
        its gates ``gate_ids`` and its approved calls claimed as a batch), ``("busy",
        None)``, or ``(None, None)`` when the run does not exist.

        A busy run is tried a few times over about a second (a resume job often arrives
        while the worker that opened the gates is still releasing the run).
        """
        # One attempt id for every try: a try whose reply was lost (and its retry by the
        # client) gets its own fence back instead of "busy" until the lease runs out.
        lease_attempt = secrets.token_hex(8)
        for attempt in range(8):
            res = await self.scripts.acquire_lease(
                run_id,
                lease_ms=self.lease_ms,
                worker=self.name,
                begin_agent=self.agent.name,
                turn=turn if turn and turn.isdigit() else None,
                attempt=lease_attempt,
                gate_ids=[g for g in gate_ids if self._same_shard(g, run_id)],
                batch=self._batch,
                replicas=self.settings.decision_replicas,
                wait_ms=1000,
            )
            if res.status is LeaseStatus.OK:
                replicas = self.settings.decision_replicas
                if res.began and res.began.claimed and 0 <= res.replicas < replicas:
                    log.error(
                        "run %s: the claims of %d calls reached %s of %s replicas within "
                        "1000 ms; the tools run anyway, and a failover now could run them again",
                        run_id,
                        len(res.began.claimed),
                        res.replicas,
                        replicas,
                    )
                if res.previous_owner:
                    metrics.TAKEOVERS.inc()
                    log.info(
                        "run %s: taken over from %s, whose lease ran out",
                        run_id,
                        res.previous_owner,
                    )
                return res.fence, res.began
            if res.status is LeaseStatus.MISSING:
                return None, None
            await asyncio.sleep(min(0.01 * 2**attempt, 0.25))
        return "busy", None

    def _same_shard(self, gate_id: str, run_id: str) -> bool:
        k = self.keys
        return k.owns(gate_id) and k.shard_of(gate_id) == k.shard_of(run_id)

    async def _heartbeat(
        self,
        reader: StreamConsumer,
        run_id: str,
        fence: str,
        msg: StreamMessage,
        lost: asyncio.Event,
        done: asyncio.Event,
        first: float | None = None,
    ) -> None:
        """Renew the lease every third of it until ``done`` (the first renewal after
        ``first`` seconds, by default a third of the lease)."""
        beat = self.lease_ms / 3000
        pause = beat if first is None else first
        while not done.is_set():
            if pause > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), pause)
            if done.is_set():
                return
            try:
                # Refused only once another worker took the run over (or it was released):
                # a lease that ran out while Redis did not answer (a failover) is taken up
                # again, so failed beats never lose it by themselves.
                if not await self.scripts.renew_lease(run_id, fence, self.lease_ms):
                    if done.is_set():  # released by the step that finished the job
                        return
                    lost.set()
                    log.warning("run %s: lease lost (taken over); stopping", run_id)
                    return
                await reader.touch(msg)
                pause = beat
            except Exception as exc:  # Redis, or the client's state: try again soon
                log.warning("run %s: heartbeat failed (%s)", run_id, type(exc).__name__)
                pause = min(beat, 0.25)

    # --- expiry -----------------------------------------------------------------------
    async def _sweep_forever(self) -> None:
        interval = self.settings.sweep_interval
        retention = self.settings.run_retention
        loop = asyncio.get_running_loop()
        next_purge = loop.time()
        next_housekeeping = loop.time() + min(HOUSEKEEPING_INTERVAL, self.settings.stuck_run_after)
        while not self.stopping.is_set():
            try:
                if retention and loop.time() >= next_purge:
                    purged = await self.gateway.purge_finished(retention)
                    next_purge = loop.time() + (0 if purged == 100 else min(60.0, retention))
                if loop.time() >= next_housekeeping:
                    next_housekeeping = loop.time() + min(
                        HOUSEKEEPING_INTERVAL, self.settings.stuck_run_after
                    )
                    await self.housekeeping()
                _moved, more, next_in = await self._sweep_once()
                wait = 0.0 if more else min(next_in or interval, interval)
            except Exception as exc:  # Redis, or the client's state: the sweeper outlives it
                log.warning("sweeper: Redis unavailable (%s)", type(exc).__name__)
                wait = interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), timeout=max(wait, 0.005))

    async def housekeeping(self) -> None:
        """Announce this worker, repair stuck runs, trim what every group has read and the
        audit trail past AUDIT_RETENTION, forget dead consumers."""
        await presence.announce_worker(self)
        for run_id in await self.gateway.repair_stuck(self.settings.stuck_run_after):
            log.warning(
                "run %s was stuck (no progress for %.0f s, nothing pending, no worker): "
                "resume job enqueued",
                run_id,
                self.settings.stuck_run_after,
            )
        await audit.trim(self.scripts, self.settings.audit_retention)
        for shard in self.keys.all_shards():
            await trim_events(self.redis, self.keys.events(shard), self.settings.events_maxlen)
            for stream in (self.keys.events(shard), self.keys.jobs(shard)):
                await forget_dead_consumers(self.redis, stream)

    async def sweep(self, limit: int = 100) -> int:
        """Expire every overdue gate, and fire the reminders and escalations that are due
        (several workers may sweep at once); how many gates expired."""
        moved, _more, _next_in = await self._sweep_once(limit)
        return moved

    async def _sweep_once(self, limit: int = 100) -> tuple[int, bool, float | None]:
        """One pass: (gates expired, whether more may be due, seconds to the next deadline,
        reminder or escalation). The deadlines of every shard are read once per pass, expiries
        first: a gate past its deadline is expired, never reminded."""
        due, next_in = await self.gateway.due_gates(limit)
        moved = 0
        for gate_id in due:
            try:
                res = await self.gateway.expire(gate_id)
            except GateNotFound:
                if self.keys.owns(gate_id):
                    await self.redis.zrem(self.keys.deadlines(self.keys.shard_of(gate_id)), gate_id)
                continue
            if res is not None and res.applied:
                moved += 1
                log.info("gate %s expired", gate_id)
        _fired, more, nudge_in = await self.nudger.sweep(limit)
        soonest = min((t for t in (next_in, nudge_in) if t is not None), default=None)
        return moved, more or len(due) >= limit, soonest


async def run_worker(
    settings: Settings | None = None,
    *,
    agent: Agent | Sequence[Agent] | None = None,
    stop: asyncio.Event | None = None,
    name: str | None = None,
) -> None:
    """Run a worker in this process until ``stop`` is set (or the task running it is cancelled).

    ``settings`` default to :meth:`Settings.from_env` (with ``OPENAI_API_KEY`` required), and
    ``agent`` to the ones AGENTS (or AGENT) names (:func:`~agent_core.settings.load_agents`).
    The worker opens its own Redis and OpenAI clients and closes them when it returns. It
    installs no signal handler. Raises :class:`ConfigError` when the API key is missing, an
    agent cannot be imported or Redis cannot be reached.
    """
    if settings is None:
        settings = Settings.from_env(require_openai=True)
    settings.require_openai()
    if agent is None:
        agent = load_agents(settings)
    redis = await reachable_redis(
        settings.redis_url,
        settings.redis_cluster,
        failover_window=settings.redis_failover_window,
    )
    try:
        assert settings.openai_api_key is not None
        client = AsyncOpenAI(
            api_key=settings.openai_api_key.get_secret_value(),
            base_url=settings.openai_base_url,
            max_retries=0,  # the runner retries, honouring every rate-limit hint (retries.py)
            timeout=settings.openai_timeout,
        )
        try:
            await Worker(redis, agent, client, settings, name=name, stop=stop).run()
        finally:
            await client.close()
    finally:
        await redis.aclose()


async def serve(settings: Settings) -> None:
    """The worker process: :func:`run_worker` until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    freeze_startup_heap()
    keep_large_buffers()
    await run_worker(settings, stop=stop)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``agent-worker`` (``python -m agent_core.worker``)."""
    from . import cli
    from .settings import HELP

    args = cli.parser(
        "agent-worker",
        "Run the agents: take jobs from Redis, call the model and the tools, open approval "
        "gates. Configured by environment variables only.",
        HELP,
    ).parse_args(argv)
    importable_from_cwd()
    try:
        settings = Settings.from_env(require_openai=True)
        agents = load_agents(settings)  # an unimportable agent is a config error, reported now
    except ConfigError as exc:
        exit_on_config_error(exc)
    if args.check:
        cli.run_check("agent-worker", settings, agents)
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("httpx", "httpx2", "openai._base_client"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        event_loop.run(serve(settings), settings.event_loop)
    except ConfigError as exc:
        exit_on_config_error(exc)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
