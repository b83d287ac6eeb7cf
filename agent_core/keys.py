"""Every Redis key name the project uses, built in one place.

All keys start with the prefix and carry it as a hash tag (``{agw}:run:…``), so every
multi-key Lua script touches a single slot and the same code runs on Redis Cluster.
No key name is ever built inside Lua: scripts receive every key in KEYS.
"""

from __future__ import annotations

DEFAULT_PREFIX = "agw"


class Keys:
    """Key names under one prefix (one per deployment; tests use their own)."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        if not prefix or any(c in prefix for c in "{}: "):
            raise ValueError(f"invalid key prefix {prefix!r}")
        self.prefix = prefix
        self._base = "{" + prefix + "}"

    # --- runs -------------------------------------------------------------------------
    def run(self, run_id: str) -> str:
        """Hash: the run's fields (status, turn, phase, pending, …)."""
        return f"{self._base}:run:{run_id}"

    def history(self, run_id: str) -> str:
        """List: the run's chat messages as JSON, append-only."""
        return f"{self._base}:run:{run_id}:msgs"

    def turn(self, run_id: str, turn: int) -> str:
        """Hash: the tool calls of one model turn, their states and results."""
        return f"{self._base}:run:{run_id}:turn:{turn}"

    def run_gates(self, run_id: str) -> str:
        """Set: every gate id the run ever opened."""
        return f"{self._base}:run:{run_id}:gates"

    def start_key(self, key: str) -> str:
        """String: the run an idempotency key (e.g. a Slack trigger id) already started."""
        return f"{self._base}:start:{key}"

    def active(self) -> str:
        """Sorted set: runs not finished yet, scored by start time (the stuck-run checker)."""
        return f"{self._base}:active"

    def user_runs(self, user: str) -> str:
        """Sorted set: run ids started by a user, scored by start time."""
        return f"{self._base}:user:{user}:runs"

    # --- gates ------------------------------------------------------------------------
    def gate(self, gate_id: str) -> str:
        """Hash: one approval gate."""
        return f"{self._base}:gate:{gate_id}"

    def finished(self) -> str:
        """Sorted set: finished run ids scored by when they finished (for retention)."""
        return f"{self._base}:finished"

    def deadlines(self) -> str:
        """Sorted set: pending gate ids scored by their deadline (unix seconds)."""
        return f"{self._base}:deadlines"

    # --- streams ----------------------------------------------------------------------
    def jobs(self) -> str:
        """Stream: start/resume jobs for the workers' consumer group."""
        return f"{self._base}:jobs"

    def dead_jobs(self) -> str:
        """Stream: jobs that kept failing (dead letters)."""
        return f"{self._base}:jobs:dead"

    def events(self) -> str:
        """Stream: run and gate events for front ends (the Slack bot)."""
        return f"{self._base}:events"

    def dead_events(self) -> str:
        """Stream: events a consumer group could not handle."""
        return f"{self._base}:events:dead"

    # --- extensions -------------------------------------------------------------------
    def ext(self, namespace: str, ident: str) -> str:
        """A key owned by a front end (e.g. the Slack card of a gate)."""
        return f"{self._base}:ext:{namespace}:{ident}"
