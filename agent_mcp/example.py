"""An agent whose tools come from an MCP server: ``AGENT=agent_mcp.example:agent``.

The bundled notes server (:mod:`agent_mcp.example_server`) runs as a subprocess of each
worker, over stdio. Listing and adding notes run at once; deleting one waits for a human in
Slack. Point ``NOTES_FILE`` at the JSON file to keep the notes in (default: a file in the
temporary directory).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from agent_core import Agent
from agent_mcp import MCPServerStdio

NOTES_FILE = os.environ.get("NOTES_FILE") or str(
    Path(tempfile.gettempdir()) / "agent_mcp_example_notes.json"
)

notes = MCPServerStdio(
    "notes",
    sys.executable,
    [str(Path(__file__).with_name("example_server.py"))],
    env={"NOTES_FILE": NOTES_FILE},
    requires_approval=["delete_note"],
)

agent = Agent(
    name="notes",
    description="Keeps the team's notes (tools from an MCP server).",
    instructions=(
        "You keep the team's shared notes with the notes tools. List the notes before you "
        "change them, and name the note (id and text) you add or delete in your answer."
    ),
    toolsets=[notes],
    suggested_prompts=[
        "What notes do we have?",
        ("Tidy up", "Delete the note about the bank."),
    ],
)
