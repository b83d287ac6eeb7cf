"""The gates' scripts: opening a turn's gates, deciding one (a person, a rule, a quorum's
approval, an expiry), granting and revoking "allow for this thread", firing a reminder or an
escalation. A part of the one registry, :class:`agent_core.scripts.Scripts` (see there for
the layer's rules: KEYS built here only, every script safe to run twice)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .connections import eval_replicated
from .keys import Keys
from .script_loader import ScriptSet
from .script_replies import (
    DecideOutcome,
    Decision,
    GateToOpen,
    Nudged,
    NudgeOutcome,
    OpenOutcome,
    RevokeOutcome,
    pairs,
    text,
)


class GateScripts(ScriptSet):
    """The gates' part of :class:`agent_core.scripts.Scripts`."""

    keys: Keys

    def _audit_keys(self, shard: int) -> list[str]:
        """A shard's audit trail: its stream and its head."""
        return [self.keys.audit(shard), self.keys.audit_head(shard)]

    # --- gates -----------------------------------------------------------------------------
    async def open_gates(
        self,
        run_id: str,
        turn: int,
        fence: str,
        gates: Sequence[GateToOpen],
        *,
        top_run: str | None = None,
    ) -> OpenOutcome:
        """OPEN_GATES: the turn's gates, all or nothing, and the run's pause; ``top_run``:
        the thread's top run (default: the run), whose live grants may decide a gate."""
        k = self.keys
        top_run = top_run or run_id
        shard = k.shard_of(run_id)
        keys = [
            k.run(run_id),
            k.turn(run_id, turn),
            k.deadlines(shard),
            k.events(shard),
            k.run_gates(run_id),
            k.grants(top_run),
            *self._audit_keys(shard),
            *(k.gate(g.gate_id) for g in gates),
            k.nudges(shard),
        ]
        args: list[Any] = [fence, turn]
        for g in gates:
            args += [g.gate_id, g.timeout, g.fields, g.opened, g.decided]
        return OpenOutcome(text(await self._run("open_gates", keys, args)))

    def _decide(
        self,
        gate_id: str,
        run_id: str,
        status: str,
        by: str,
        reason: str,
        attempt: str,
        seen_hash: str,
        groups: Sequence[str] = (),
        self_ok: bool = True,
        edit: tuple[str, str] | None = None,
    ) -> tuple[list[str], list[str]]:
        k = self.keys
        shard = k.shard_of(gate_id)
        keys = [k.gate(gate_id), k.run(run_id), k.deadlines(shard), k.jobs(shard), k.events(shard)]
        keys += [k.nudges(shard), *self._audit_keys(shard)]
        mine = json.dumps(list(groups)) if groups else ""
        args = [
            gate_id,
            status,
            by,
            reason,
            attempt,
            run_id,
            seen_hash,
            mine,
            "1" if self_ok else "0",
            *(edit or ("", "")),
        ]
        return keys, args

    @staticmethod
    def _decision_of(res: list[Any]) -> Decision:
        gate = pairs(res[1]) if len(res) > 1 else None
        why = text(res[2]) if len(res) > 2 and res[2] else ""
        return Decision(DecideOutcome(res[0]), gate, why)

    async def decide_gate(
        self,
        gate_id: str,
        run_id: str,
        status: str,
        *,
        by: str,
        reason: str,
        attempt: str,
        seen_hash: str,
        groups: Sequence[str] = (),
        self_ok: bool = True,
        edit: tuple[str, str] | None = None,
        replicas: int = 0,
        wait_ms: int = 0,
    ) -> tuple[Decision, int]:
        """DECIDE_GATE: move the gate out of ``pending``, exactly once (a quorum's approval
        that does not complete it is only counted). ``edit``: the edited arguments'
        canonical JSON and hash, for an approval with edits (agent_core.editing). With
        ``replicas``, then WAIT for them (see :func:`eval_replicated`). The decision, and
        the replicas reached (0 without WAIT)."""
        keys, args = self._decide(
            gate_id, run_id, status, by, reason, attempt, seen_hash, groups, self_ok, edit
        )
        if replicas <= 0:
            return self._decision_of(await self._run("decide_gate", keys, args)), 0
        res, reached = await eval_replicated(
            self.redis, self.source("decide_gate"), keys, args, replicas, wait_ms
        )
        return self._decision_of(res), reached

    @staticmethod
    def _granted_of(res: list[Any]) -> Decision:
        if res[0] in ("not_allowed", "too_many", "bad_until"):
            return Decision(DecideOutcome.REFUSED, None, text(res[0]))
        return GateScripts._decision_of(res)

    async def grant_gate(
        self,
        gate_id: str,
        run_id: str,
        *,
        by: str,
        reason: str,
        attempt: str,
        seen_hash: str,
        self_ok: bool,
        grant_id: str,
        until: float,
        spec: dict[str, str],
        max_grants: int,
        replicas: int = 0,
        wait_ms: int = 0,
    ) -> tuple[Decision, int]:
        """GRANT_GATE: approve the gate as DECIDE_GATE does and record the grant ``grant_id``
        of the thread ``spec["scope"]`` (its top run) in the same step; with ``replicas``,
        then WAIT for them (see :func:`eval_replicated`). The decision, and the replicas
        reached (0 without WAIT)."""
        k = self.keys
        shard = k.shard_of(gate_id)
        keys, _ = self._decide(gate_id, run_id, "approved", by, reason, attempt, seen_hash)
        keys += [k.grants(spec["scope"]), k.live_grants(shard)]
        args = [gate_id, by, reason, attempt, run_id, seen_hash, "1" if self_ok else "0"]
        args += [grant_id, f"{until:.6f}", json.dumps(spec), str(max_grants)]
        if replicas <= 0:
            return self._granted_of(await self._run("grant_gate", keys, args)), 0
        res, reached = await eval_replicated(
            self.redis, self.source("grant_gate"), keys, args, replicas, wait_ms
        )
        return self._granted_of(res), reached

    async def revoke_grant(self, grant_id: str, top_run: str, by: str) -> RevokeOutcome:
        """REVOKE_GRANT: end the grant ``grant_id`` of the thread ``top_run`` now."""
        k = self.keys
        shard = k.shard_of(top_run)
        keys = [k.grants(top_run), k.live_grants(shard), k.events(shard)]
        keys += self._audit_keys(shard)
        res = await self._run("revoke_grant", keys, [grant_id, by, top_run])
        return RevokeOutcome(text(res))

    async def fire_nudge(self, gate_id: str, step: str) -> Nudged:
        """FIRE_NUDGE: fire a gate's reminder (``step="remind"``) or escalation
        (``"escalate"``) once, while it is pending (see :mod:`agent_core.nudges`)."""
        k = self.keys
        shard = k.shard_of(gate_id)
        keys = [k.gate(gate_id), k.nudges(shard), k.events(shard), *self._audit_keys(shard)]
        res = await self._run("fire_nudge", keys, [gate_id, step])
        return Nudged(NudgeOutcome(text(res[0])), pairs(res[1]) if len(res) > 1 else None)
