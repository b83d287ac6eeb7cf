"""A small MCP server for the tests (MCPServer, the SDK's FastMCP), run as a real process.

``python items_server.py --journal PATH [--name N] [--transport stdio|http|sse]
[--port P] [--legacy]``. Every side effect is one line appended to the journal: ``start
<pid>`` when the process starts, ``delete_item:<id>``, ``slow:start``/``slow:end``.
``--legacy`` (stdio only) makes it a 2025-era server: it answers only the ``initialize``
handshake (the client falls back to it), and list changes arrive as notifications.
"""

from __future__ import annotations

import argparse
import json
import os

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.runner import serve_loop
from mcp.server.stdio import stdio_server

parser = argparse.ArgumentParser()
parser.add_argument("--journal", required=True)
parser.add_argument("--name", default="items")
parser.add_argument("--transport", default="stdio", choices=["stdio", "http", "sse"])
parser.add_argument("--port", type=int, default=0)
parser.add_argument("--legacy", action="store_true")
opts = parser.parse_args()

app = MCPServer(opts.name, log_level="WARNING")


def journal(line: str) -> None:
    with open(opts.journal, "a", encoding="utf-8") as f:
        f.write(line + "\n")


@app.tool()
def lookup(key: str) -> str:
    """Read the value of a key."""
    return f"{opts.name}: value of {key}"


@app.tool()
def delete_item(item_id: str, reason: str = "") -> str:
    """Permanently delete an item."""
    journal(f"delete_item:{item_id}")
    return f"item {item_id} deleted"


@app.tool()
def fail(message: str) -> str:
    """Always fails with the message."""
    raise ToolError(message)


@app.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    journal("slow:start")
    await anyio.sleep(seconds)
    journal("slow:end")
    return f"slept {seconds} s"


@app.tool()
def environment(ctx: Context) -> str:
    """What the process was given: an environment variable, its cwd, a request header."""
    headers = ctx.headers or {}
    return json.dumps(
        {
            "token": os.environ.get("ITEMS_TOKEN"),
            "cwd": os.getcwd(),
            "authorization": headers.get("authorization"),
            "protocol": ctx.protocol_version,
        }
    )


@app.tool()
async def grow(name: str, ctx: Context) -> str:
    """Add a tool that echoes its text, and tell the client the tool list changed."""

    def echo(text: str) -> str:
        return f"echo: {text}"

    app.add_tool(echo, name=name, description="Echo the text.")
    await ctx.notify_tools_changed()  # 2026-era clients: their subscriptions/listen stream
    if opts.legacy:
        await ctx.session.send_tool_list_changed()  # 2025-era clients: a notification
    return f"added {name}"


async def serve_legacy_stdio() -> None:
    """Serve the handshake era only, as a server built before 2026 does."""
    server = app._lowlevel_server
    async with stdio_server() as (read, write), server.lifespan(server) as state:
        await serve_loop(
            server,
            read,
            write,
            lifespan_state=state,
            init_options=server.create_initialization_options(),
        )


journal(f"start {os.getpid()}")
if opts.legacy:
    anyio.run(serve_legacy_stdio)
elif opts.transport == "stdio":
    app.run()
elif opts.transport == "http":
    app.run("streamable-http", host="127.0.0.1", port=opts.port)
else:
    app.run("sse", host="127.0.0.1", port=opts.port)
