"""What a call to an MCP tool raises; the runner tells the model ``<class>: <message>``.

::

    agent_core.ToolError
    ├── MCPToolError         the server answered with an error (isError, or a JSON-RPC error)
    ├── MCPConnectionError   the server is unreachable, or the connection broke during the call
    └── MCPTimeoutError      the server did not answer within the toolset's ``timeout``
"""

from __future__ import annotations

from agent_core import ToolError


class MCPToolError(ToolError):
    """The MCP server answered the call with an error; the message is the server's text."""


class MCPConnectionError(ToolError):
    """The MCP server could not be reached, or the connection broke before it answered."""


class MCPTimeoutError(ToolError):
    """The MCP server did not answer the call in time (the call was cancelled)."""
