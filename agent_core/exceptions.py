"""Exceptions raised by agent_core.

::

    GatewayError
    ├── ConfigError          a missing or invalid setting (names the variable)
    ├── NotFound
    │   ├── RunNotFound      no run with that id
    │   └── GateNotFound     no gate with that id (also malformed ids)
    ├── InvalidState         the run cannot do that now (e.g. cancel a finished run)
    │   ├── ArgsHashMismatch the decider saw other arguments than the gate's: nothing decided
    │   ├── InvalidEdit      edited arguments that are not valid for the gate: nothing decided
    │   └── ChildRunSettled  a sub-agent's run its parent no longer waits for: retry the top run
    ├── LeaseLost            this worker no longer holds the run's lease: it wrote nothing
    └── ToolError
        ├── ToolDefinitionError   a tool that cannot be described to the model
        └── ToolArgumentsError    the model's arguments are not valid JSON or fail validation
"""

from __future__ import annotations


class GatewayError(Exception):
    """Root of every exception agent_core raises on purpose."""


class ConfigError(GatewayError):
    """A missing or invalid setting; the message names the environment variable."""


class NotFound(GatewayError):
    """Something named by id does not exist."""


class RunNotFound(NotFound):
    """No run with that id."""


class GateNotFound(NotFound):
    """No gate with that id."""


class InvalidState(GatewayError):
    """The run or gate is not in a state that allows the operation."""


class ArgsHashMismatch(InvalidState):
    """A decision named an arguments hash that is not the gate's; nothing was decided."""


class InvalidEdit(InvalidState):
    """Edited arguments that are not valid for the gate (agent_core.editing); nothing was
    decided. ``errors`` maps each field (``""``: the arguments as a whole) to its problem."""

    def __init__(self, errors: dict[str, str]) -> None:
        self.errors = dict(errors)
        shown = "; ".join(f"{k or '(arguments)'}: {v}" for k, v in self.errors.items())
        super().__init__(f"invalid edit: {shown}")


class ChildRunSettled(InvalidState):
    """A sub-agent's run whose parent already has its outcome cannot be retried on its own:
    its answer would reach nobody. ``top_run`` is the run to retry (or continue) instead."""

    def __init__(self, message: str, *, top_run: str) -> None:
        super().__init__(message)
        self.top_run = top_run


class LeaseLost(GatewayError):
    """The worker's lease on a run ran out or was taken over; it must stop advancing it."""


class ToolError(GatewayError):
    """A problem with a tool or a call to it."""


class ToolDefinitionError(ToolError):
    """A function that cannot be turned into a tool."""


class ToolArgumentsError(ToolError):
    """The model's arguments for a tool are not valid."""
