"""What the runner's steps share: the state a :class:`~agent_core.runner.Runner` holds, the
job it advances a run for, and the small helpers every step uses.

The runner is split by concept: :mod:`agent_core.model_turn` (the model turn),
:mod:`agent_core.tools_turn` (a tools turn and its batch), :mod:`agent_core.tool_calls`
(one call: gate, claim, run, settle, sub-agent) and :mod:`agent_core.runner` (driving).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from openai import AsyncOpenAI
from redis.asyncio import Redis

from .agent import Agent
from .keys import Keys
from .model_http import ModelEndpoint
from .nudges import Nudges
from .routes import ApprovalRoute
from .scripts import Scripts
from .stopping import Stopper

log = logging.getLogger("agent_core.runner")

MAX_OUTPUT_CHARS = 100_000
EVENT_OUTPUT_CHARS = 2_000


def _now() -> str:
    return f"{time.time():.6f}"


# What _execute returns for a call that started a child run: its result comes later.
SPAWNED = "\x00spawned"


@dataclass
class JobRef:
    """The job a worker advances a run for: the step that pauses or finishes the run
    finishes it too (acked, lease released: RECORD_TURN), and says so in ``finished``."""

    stream: str
    group: str
    message_id: str
    finished: bool = False

    @property
    def fields(self) -> tuple[str, str, str]:
        return self.stream, self.group, self.message_id


class RunnerState:
    """The state every step of a run reads (set by :meth:`Runner.__init__`)."""

    redis: Redis
    keys: Keys
    agent: Agent
    client: AsyncOpenAI
    endpoint: ModelEndpoint
    model: str
    approval_timeout: float
    nudges: Nudges
    maxlen: int
    max_turns: int
    max_calls_per_turn: int
    model_retries: int
    retry_budget: float
    max_depth: int
    claim_replicas: int
    claim_wait_ms: int
    approval_routes: Mapping[str, ApprovalRoute]
    scripts: Scripts
    stopper: Stopper

    async def fail(self, run_id: str, error: str, fence: str, *, retryable: bool = False) -> bool:
        """Fail a run that has not finished, closing its pending gates and cancelling its
        sub-agents' runs (:meth:`Stopper.fail`); True if it moved. Only the holder of the
        run's lease can; :class:`LeaseLost` otherwise."""
        return await self.stopper.fail(run_id, error, fence, retryable=retryable)
