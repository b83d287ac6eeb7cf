"""agent_core: durable, Redis-backed human approval gates for OpenAI tool-calling agents."""

from typing import TYPE_CHECKING, Any

from .agent import Agent, AgentTool
from .approvers import ApprovalRequest, Approver, Verdict, approve, approver, ask, deny
from .connections import create_redis
from .editing import approve_edited
from .events import EventConsumer
from .exceptions import (
    ArgsHashMismatch,
    ChildRunSettled,
    ConfigError,
    GateNotFound,
    GatewayError,
    InvalidEdit,
    InvalidState,
    LeaseLost,
    NotFound,
    RunNotFound,
    ToolArgumentsError,
    ToolDefinitionError,
    ToolError,
)
from .gateway import Gateway
from .grants import Grant, GrantResult, Grants
from .keys import Keys
from .models import (
    ContinueOutcome,
    DecideResult,
    Decision,
    Event,
    EventType,
    Gate,
    GateStatus,
    Run,
    RunStatus,
)
from .quorum import Approval, Quorum
from .settings import Settings
from .tools import Tool, tool
from .toolsets import Toolset

if TYPE_CHECKING:
    from .worker import Worker, run_worker

# The distribution's version (pyproject.toml reads it; the commands' --version print it).
__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentTool",
    "Approval",
    "ApprovalRequest",
    "Approver",
    "ArgsHashMismatch",
    "ChildRunSettled",
    "ConfigError",
    "ContinueOutcome",
    "DecideResult",
    "Decision",
    "Event",
    "EventConsumer",
    "EventType",
    "Gate",
    "GateNotFound",
    "GateStatus",
    "Gateway",
    "GatewayError",
    "Grant",
    "GrantResult",
    "Grants",
    "InvalidEdit",
    "InvalidState",
    "Keys",
    "LeaseLost",
    "NotFound",
    "Quorum",
    "Run",
    "RunNotFound",
    "RunStatus",
    "Settings",
    "Tool",
    "ToolArgumentsError",
    "ToolDefinitionError",
    "ToolError",
    "Toolset",
    "Verdict",
    "Worker",
    "approve",
    "approve_edited",
    "approver",
    "ask",
    "create_redis",
    "deny",
    "run_worker",
    "tool",
]


def __getattr__(name: str) -> Any:
    # The worker is imported on first use: `python -m agent_core.worker` would otherwise
    # find its own module already imported by the package (runpy warns about that).
    if name in ("Worker", "run_worker"):
        from . import worker

        return getattr(worker, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
