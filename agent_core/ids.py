"""The shape of run and gate ids: what a caller may pass before anything is read."""

from __future__ import annotations

import re

from .keys import Keys

_GATE_ID = re.compile(r"^[A-Za-z0-9_-]{24}$")
_RUN_ID = re.compile(r"^r-[a-z0-9]{12}$")


def valid_gate_id(gate_id: str, keys: Keys | None = None) -> bool:
    """A well-formed gate id (of one of ``keys``' shards, when given)."""
    ok = isinstance(gate_id, str) and bool(_GATE_ID.match(gate_id))
    return ok and (keys is None or keys.owns(gate_id))


def valid_run_id(run_id: str, keys: Keys | None = None) -> bool:
    """A well-formed run id (of one of ``keys``' shards, when given)."""
    ok = isinstance(run_id, str) and bool(_RUN_ID.match(run_id))
    return ok and (keys is None or keys.owns(run_id))
