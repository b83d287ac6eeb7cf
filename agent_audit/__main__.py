"""``python -m agent_audit``: the ``agent-audit`` command."""

from .cli import main

main()
