"""Starting, continuing and retrying runs: the bodies of :meth:`Gateway.start_run`,
:meth:`Gateway.continue_run` and :meth:`Gateway.retry_run`.

Each is one script (START_RUN, CONTINUE_RUN, RETRY_RUN) that writes the run and queues its
job; a caller's idempotency key, dedupe key or attempt id is recorded by that same script,
so a repeat is answered as the first call was.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import TYPE_CHECKING, Any

from .completions import clean_text
from .exceptions import ChildRunSettled, InvalidState, RunNotFound
from .ids import valid_run_id
from .models import ContinueOutcome, Run
from .script_replies import ContinueReply, RetryOutcome
from .stopping import new_attempt

if TYPE_CHECKING:
    from .gateway import Gateway

MAX_TASK_CHARS = 20_000
# How long an idempotency key (start_run) or a dedupe key (continue_run) is remembered.
IDEMPOTENCY_TTL_SECONDS = 86_400


def checked_attempt(attempt: str | None) -> str:
    """The caller's attempt id, checked, or a new one."""
    if attempt is None:
        return new_attempt()
    if not 0 < len(attempt) <= 200:
        raise ValueError("attempt must be 1 to 200 characters")
    return attempt


async def start_run(
    gw: Gateway,
    task: str,
    requested_by: str,
    origin: dict[str, Any] | None,
    idempotency_key: str | None,
    agent: str | None,
) -> Run:
    """Queue a new run; see :meth:`Gateway.start_run`."""
    task = clean_text(task).strip()
    if not task:
        raise ValueError("the task is empty")
    if len(task) > MAX_TASK_CHARS:
        raise ValueError(f"the task is longer than {MAX_TASK_CHARS} characters")
    if not requested_by:
        raise ValueError("requested_by is required")
    if idempotency_key is not None and not 0 < len(idempotency_key) <= 200:
        raise ValueError("idempotency_key must be 1 to 200 characters")
    k = gw.keys
    # With an idempotency key the run goes to that key's shard: the key and the run are
    # written by one single-slot script. Without, to an even share of each master.
    run_id = k.new_run_id(k.shard_for(idempotency_key) if idempotency_key else gw.placement.pick())
    now = time.time()
    fields = {
        "run_id": run_id,
        "agent": agent or gw.agent_name,
        "task": task,
        "requested_by": requested_by,
        "requesters": json.dumps([requested_by]),
        "origin": json.dumps(origin or {}),
        "status": "queued",
        "phase": "model",
        "turn": "0",
        "pending": "0",
        "created_at": f"{now:.6f}",
        "updated_at": f"{now:.6f}",
    }
    got = await gw.scripts.start_run(
        run_id,
        idempotency_key=idempotency_key,
        requested_by=requested_by,
        first_message=json.dumps({"role": "user", "content": task}),
        now=f"{now:.6f}",
        ttl=IDEMPOTENCY_TTL_SECONDS,
        fields=fields,
    )
    if got != run_id:
        existing = await gw.get_run(got)
        if existing is not None:
            return existing
    return Run.from_hash(fields)


async def continue_run(
    gw: Gateway, run_id: str, message: str, by: str, dedupe_key: str | None
) -> ContinueOutcome:
    """Continue the run's conversation; see :meth:`Gateway.continue_run`."""
    message = clean_text(message).strip()
    if not message:
        raise ValueError("the message is empty")
    if len(message) > MAX_TASK_CHARS:
        raise ValueError(f"the message is longer than {MAX_TASK_CHARS} characters")
    if not by:
        raise ValueError("by is required")
    if dedupe_key is not None and not 0 < len(dedupe_key) <= 200:
        raise ValueError("dedupe_key must be 1 to 200 characters")
    if not valid_run_id(run_id, gw.keys):
        raise RunNotFound(f"no run {run_id[:40]!r}")
    wire = json.dumps({"role": "user", "content": message})
    dedupe = None
    if dedupe_key is not None:
        dedupe = (dedupe_key, secrets.token_hex(8), IDEMPOTENCY_TTL_SECONDS)
    res = await gw.scripts.continue_run(
        run_id,
        by=by,
        message=wire,
        now=f"{time.time():.6f}",
        entry=json.dumps({"by": by, "message": wire}),
        dedupe=dedupe,
    )
    if res is ContinueReply.MISSING:
        raise RunNotFound(f"no run {run_id!r}")
    if res is ContinueReply.CANCELLED:
        raise InvalidState(f"run {run_id} was cancelled; a cancelled run does not continue")
    return ContinueOutcome(res.value)


async def retry_run(gw: Gateway, run_id: str, by: str, attempt: str | None) -> Run:
    """Continue a failed run from the step it failed in; see :meth:`Gateway.retry_run`."""
    if not valid_run_id(run_id, gw.keys):
        raise RunNotFound(f"no run {run_id!r}")
    if not by:
        raise ValueError("by is required")
    # A run's parent never changes: the script only checks these were read right.
    parent, parent_turn = await gw.redis.hmget(gw.keys.run(run_id), ["parent", "parent_turn"])
    family = {"parent": parent or "", "parent_turn": parent_turn or "0"}
    res = await gw.scripts.retry_run(
        run_id, family, by=by, now=f"{time.time():.6f}", attempt=checked_attempt(attempt)
    )
    if res is RetryOutcome.MISSING:
        raise RunNotFound(f"no run {run_id!r}")
    if res is RetryOutcome.NOT_FAILED:
        run = await gw.get_run(run_id)
        status = run.status.value if run else "gone"
        raise InvalidState(f"run {run_id} is {status}; only a failed run can be retried")
    if res is RetryOutcome.PARENT_MOVED_ON:
        top = await gw.top_run_id(run_id)
        raise ChildRunSettled(
            f"run {run_id} is a sub-agent's run and its parent has already been told it "
            f"failed; retry the top run {top} instead",
            top_run=top,
        )
    if res is RetryOutcome.NOT_RETRYABLE:
        raise InvalidState(f"run {run_id} failed in a way a retry cannot fix (see its error)")
    if res is not RetryOutcome.QUEUED:
        raise InvalidState(f"run {run_id} changed while it was being retried; try again")
    run = await gw.get_run(run_id)
    assert run is not None
    return run
