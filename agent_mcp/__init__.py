"""agent_mcp: tools from MCP servers for agent_core agents.

::

    from agent_core import Agent
    from agent_mcp import MCPServerStdio

    notes = MCPServerStdio("notes", "python", ["notes_server.py"],
                           requires_approval=["delete_note"])
    agent = Agent(name="notes", instructions="...", toolsets=[notes])

The worker opens every toolset once per process; each server's tools are offered to the
model with their own input schemas and go through the same gates as local tools.
"""

try:
    import mcp  # noqa: F401
except ModuleNotFoundError as exc:  # the core does not depend on mcp: it is an extra
    raise ModuleNotFoundError(
        "agent_mcp needs the mcp extra: pip install 'slack-approval-gateway[mcp]'",
        name=exc.name,
    ) from exc

from .exceptions import MCPConnectionError, MCPTimeoutError, MCPToolError
from .servers import MCPServerHTTP, MCPServerSSE, MCPServerStdio, MCPToolset
from .tools import MCPApprovalRule, MCPTool, result_text

__all__ = [
    "MCPApprovalRule",
    "MCPConnectionError",
    "MCPServerHTTP",
    "MCPServerSSE",
    "MCPServerStdio",
    "MCPTimeoutError",
    "MCPTool",
    "MCPToolError",
    "MCPToolset",
    "result_text",
]
