"""agent_core: durable, Redis-backed human approval gates for OpenAI tool-calling agents."""

from .agent import Agent
from .connections import create_redis
from .events import EventConsumer
from .exceptions import (
    ArgsHashMismatch,
    ConfigError,
    GateNotFound,
    GatewayError,
    InvalidState,
    LeaseLost,
    NotFound,
    RunNotFound,
    ToolArgumentsError,
    ToolDefinitionError,
    ToolError,
)
from .gateway import Gateway
from .keys import Keys
from .models import DecideResult, Decision, Event, EventType, Gate, GateStatus, Run, RunStatus
from .settings import Settings
from .tools import Tool, tool

__all__ = [
    "Agent",
    "ArgsHashMismatch",
    "ConfigError",
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
    "InvalidState",
    "Keys",
    "LeaseLost",
    "NotFound",
    "Run",
    "RunNotFound",
    "RunStatus",
    "Settings",
    "Tool",
    "ToolArgumentsError",
    "ToolDefinitionError",
    "ToolError",
    "create_redis",
    "tool",
]
