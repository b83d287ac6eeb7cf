"""Advance one run as far as it can go: model turns, tool calls, gates.

A run is a small state machine persisted in Redis (``phase`` = ``model`` → ``tools`` → ``model``
… → ``done``). Every step is written before the next one starts, so a worker killed at any
point leaves a run that another worker resumes from Redis alone:

* ``model``: call the model with the history; persist the assistant message and its calls.
* ``tools``: run un-gated calls (claimed → done), open gates for gated ones and pause; on
  resume apply the decisions, then append one tool message per call id, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from openai import AsyncOpenAI
from redis.asyncio import Redis

from . import children
from .agent import Agent
from .exceptions import LeaseLost
from .gating import args_hash
from .keys import Keys
from .model_http import ModelEndpoint
from .model_turn import ModelTurn
from .nudges import Nudges, check_agent
from .routes import ApprovalRoute
from .script_replies import Began, ModelRead
from .scripts import Scripts
from .steps import (
    EVENT_OUTPUT_CHARS,
    MAX_OUTPUT_CHARS,
    SPAWNED,
    JobRef,
    _now,
    log,
)
from .stopping import Stopper, new_attempt
from .tools_turn import ToolsTurn

__all__ = ["EVENT_OUTPUT_CHARS", "MAX_OUTPUT_CHARS", "SPAWNED", "JobRef", "Runner", "args_hash"]


class Runner(ModelTurn, ToolsTurn):
    """Runs turns of one agent against an OpenAI-compatible Chat Completions endpoint.

    Every write goes through a script that checks the caller's fence (its lease on the run):
    when the lease is lost, :class:`LeaseLost` is raised and nothing more is written.
    """

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        agent: Agent,
        client: AsyncOpenAI,
        *,
        model: str,
        approval_timeout: float,
        events_maxlen: int = 100_000,
        max_turns: int = 30,
        max_calls_per_turn: int = 64,
        model_retries: int = 10,
        retry_budget: float = 120.0,
        max_depth: int = children.DEFAULT_MAX_DEPTH,
        claim_replicas: int = 0,
        claim_wait_ms: int = 1000,
        nudges: Nudges = Nudges(),
        approval_routes: Mapping[str, ApprovalRoute] | None = None,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.agent = agent
        self.client = client
        self.endpoint = ModelEndpoint(client)
        self.model = agent.model or model
        self.approval_timeout = agent.approval_timeout or approval_timeout
        # The settings' reminder and escalation; a step that could never fire is refused now.
        self.nudges = nudges
        check_agent(agent, self.approval_timeout, nudges)
        self.maxlen = events_maxlen
        self.max_turns = max_turns
        self.max_calls_per_turn = max_calls_per_turn
        self.model_retries = model_retries
        self.retry_budget = retry_budget
        self.max_depth = max_depth
        self.claim_replicas = claim_replicas
        self.claim_wait_ms = claim_wait_ms
        self.approval_routes = dict(approval_routes or {})
        self.scripts = Scripts(redis, keys)
        self.stopper = Stopper(redis, keys)
        # The runners of the other agents this worker serves, by agent name: a job names a
        # run, and the run names its agent.
        self.peers: dict[str, Runner] = {}
        self._head_version: tuple[int, ...] | None = None
        self._body_head = b""

    async def advance(
        self,
        run_id: str,
        fence: str,
        lost: asyncio.Event | None = None,
        began: Began | None = None,
        job: JobRef | None = None,
    ) -> None:
        """Take the run as far as it goes without a human; return when paused or finished.

        ``fence`` is the caller's lease on the run (see :mod:`agent_core.scripts`); ``lost``,
        set by the caller's heartbeat when a renewal was refused, stops a model call (and its
        retries) at once. Raises :class:`LeaseLost` when the lease is no longer the caller's.
        ``began``: BEGIN_RUN's reply when the caller took it with the lease (ACQUIRE_LEASE),
        followed by the hash of the turn a resume job resumes when ACQUIRE_LEASE read it.
        """
        if began is None:
            began = await self.scripts.begin_run(run_id, fence, self.agent.name, _now())
        if began.status == "":
            log.warning("job for unknown run %s ignored", run_id)
            return
        if began.status == "lost":
            raise LeaseLost(run_id)
        if began.status != "running" or began.run is None:
            return
        run, turn_hash = began.run, began.turn
        if run.get("parent") and await self._orphaned(run, fence):
            return
        name = run.get("agent") or self.agent.name  # none named: this worker's first agent
        runner = self if name == self.agent.name else self.peers.get(name)
        if runner is None:
            served = ", ".join(sorted({self.agent.name, *self.peers})) or "none"
            await self.fail(
                run_id,
                f"no agent named {name!r} is configured on this worker (it serves {served}): "
                "add it to AGENTS on the workers, or start runs of a configured agent",
                fence,
            )
            return
        await runner.drive(run, fence, lost, turn_hash, began=began, job=job)

    async def drive(
        self,
        run: dict[str, str] | None,
        fence: str,
        lost: asyncio.Event | None = None,
        turn_hash: dict[str, str] | None = None,
        *,
        began: Began | None = None,
        job: JobRef | None = None,
    ) -> None:
        """Advance a run this worker has begun (see :meth:`advance`) until it pauses.
        ``turn_hash``: the run's current turn, read with the lease (a resume job's turn);
        ``began``: what ACQUIRE_LEASE read with it (the history for a model turn, the
        turn's gates and the calls it claimed); ``job``: finished by the step that pauses
        or finishes the run, when that is a model turn's record."""
        # Each step's script hands back the run as it left it: no re-read between steps. A
        # turn's last step also hands over what the next model call reads (``read``).
        read: list[ModelRead] = [began.read] if began is not None and began.read else []
        gates = began.gates if began is not None else None
        claimed = began.claimed if began is not None else frozenset()
        while run is not None and run.get("status") == "running":
            phase, turn = run.get("phase"), int(run.get("turn") or 0)
            if phase == "model":
                recorded: list[tuple[dict[str, str], dict[str, dict[str, str]] | None]] = []
                run = await self._model_turn(
                    run, turn, fence, lost, read.pop() if read else None, job, recorded
                )
                if recorded:  # the turn (and its gates) as just written: not read back
                    (turn_hash, gates), claimed = recorded[0], frozenset()
                    continue
            elif phase == "tools":
                run = await self._tools_turn(run, turn, fence, read, turn_hash, gates, claimed)
            else:
                return
            turn_hash, gates, claimed = None, None, frozenset()  # read for the first step only

    async def _orphaned(self, run: dict[str, str], fence: str) -> bool:
        """A child run whose parent finished (cancelled, failed) while the cascade did not
        reach it (a crash in between) is cancelled here, before it does anything more."""
        status, by = await self.redis.hmget(
            self.keys.run(run["parent"]), ["status", "cancelled_by"]
        )
        if status not in (None, "completed", "failed", "cancelled"):
            return False
        with contextlib.suppress(Exception):
            await self.stopper.cancel(
                run["run_id"],
                by or "",
                f"its parent run {run['parent']} is {status or 'gone'}",
                new_attempt(),
                parent_failed=status == "failed",
            )
        return True
