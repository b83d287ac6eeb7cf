"""agent_core: durable, Redis-backed human approval gates for OpenAI tool-calling agents."""

from .agent import Agent
from .connections import create_redis
from .events import EventConsumer
from .exceptions import (
    ConfigError,
    GateNotFound,
    GatewayError,
    InvalidState,
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
