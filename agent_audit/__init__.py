"""``agent-audit``: read the audit trail (:mod:`agent_core.audit`) from outside the gateway.

``agent-audit verify`` checks every shard's hash chain (exit 1 naming the first broken
entry), ``agent-audit export`` writes entries as JSON lines or CSV, and ``agent-audit heads``
prints the chains' heads, to keep outside Redis and give to ``verify --heads`` later.
"""

from __future__ import annotations

from .cli import export_rows, main, parse_day

__all__ = ["export_rows", "main", "parse_day"]
