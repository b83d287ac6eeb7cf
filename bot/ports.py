"""The part of ``agent_core.Gateway`` the bot uses, as a structural type.

Keeping the list here makes the coupling explicit; ``agent_core.Gateway`` satisfies it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from agent_core.grants import Grants
from agent_core.models import ContinueOutcome, DecideResult, Decision, Event, Gate, Run


class EventConsumerLike(Protocol):
    async def read(self, count: int = ..., block_ms: int = ...) -> list[Event]: ...

    async def ack(self, event: Event) -> Any: ...

    async def ack_many(self, events: list[Event]) -> Any: ...

    async def touch_many(self, events: list[Event]) -> Any: ...


class GatewayLike(Protocol):
    grants: Grants  # allow for this thread (agent_core.grants)

    async def start_run(
        self,
        task: str,
        requested_by: str,
        origin: dict[str, Any] | None = ...,
        *,
        idempotency_key: str | None = ...,
        agent: str | None = ...,
    ) -> Run: ...

    async def started_run(self, idempotency_key: str) -> str | None: ...

    async def get_run(self, run_id: str) -> Run | None: ...

    async def get_gate(self, gate_id: str) -> Gate | None: ...

    async def pending_gates(self, run_id: str) -> list[Gate]: ...

    async def gates(self, run_id: str) -> list[Gate]: ...

    async def gates_by_id(self, gate_ids: Iterable[str]) -> list[Gate]: ...

    async def runs_for_user(self, user_id: str, limit: int = ...) -> list[Run]: ...

    async def decide(
        self,
        gate: str | Gate,
        decision: Decision,
        by: str,
        reason: str | None = ...,
        *,
        args_hash: str | None = ...,
        run_id: str | None = ...,
        groups: Sequence[str] = ...,
        allow_self_approval: bool = ...,
    ) -> DecideResult: ...

    async def decide_many(
        self,
        gates: Iterable[str | Gate],
        decision: Decision,
        by: str,
        reason: str | None = ...,
        *,
        groups: Sequence[str] = ...,
        allow_self_approval: bool = ...,
    ) -> list[DecideResult]: ...

    async def cancel_run(self, run_id: str, by: str, reason: str | None = ...) -> Run: ...

    async def retry_run(self, run_id: str, by: str) -> Run: ...

    async def continue_run(
        self, run_id: str, message: str, by: str, *, dedupe_key: str | None = ...
    ) -> ContinueOutcome: ...

    def event_consumer(self, group: str, consumer: str) -> EventConsumerLike: ...

    def event_consumers(self, group: str, consumer: str) -> Sequence[EventConsumerLike]: ...
