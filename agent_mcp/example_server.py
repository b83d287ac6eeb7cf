"""The MCP server of the example agent (:mod:`agent_mcp.example`): a shared list of notes.

An MCP server like any other, written with the mcp SDK's ``MCPServer`` (FastMCP) and
spoken to over stdio: ``python agent_mcp/example_server.py``. The notes are kept in the
JSON file named by ``NOTES_FILE`` (three sample notes when it does not exist yet).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

NOTES_FILE = Path(
    os.environ.get("NOTES_FILE") or Path(tempfile.gettempdir()) / "agent_mcp_example_notes.json"
)
SAMPLE = [
    {"id": 1, "text": "Water the plants on Friday"},
    {"id": 2, "text": "Call the bank about the duplicate card charge"},
    {"id": 3, "text": "Draft the release notes for v2"},
]

server = MCPServer("notes", instructions="A shared list of notes.", log_level="WARNING")


def _load() -> list[dict[str, Any]]:
    if not NOTES_FILE.exists():
        _save(SAMPLE)
    notes: list[dict[str, Any]] = json.loads(NOTES_FILE.read_text(encoding="utf-8"))
    return notes


def _save(notes: list[dict[str, Any]]) -> None:
    tmp = NOTES_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(notes, indent=1), encoding="utf-8")
    tmp.replace(NOTES_FILE)


@server.tool()
def list_notes() -> str:
    """List every note with its id."""
    notes = _load()
    return "\n".join(f"{n['id']}. {n['text']}" for n in notes) or "There are no notes."


@server.tool()
def add_note(text: str) -> str:
    """Add a note.

    Args:
        text: What the note says.
    """
    notes = _load()
    note_id = max((int(n["id"]) for n in notes), default=0) + 1
    _save([*notes, {"id": note_id, "text": text}])
    return f"Added note {note_id}."


@server.tool()
def delete_note(note_id: int) -> str:
    """Delete a note for good.

    Args:
        note_id: The id of the note, as list_notes shows it.
    """
    notes = _load()
    kept = [n for n in notes if n["id"] != note_id]
    if len(kept) == len(notes):
        raise ToolError(f"there is no note {note_id}")
    _save(kept)
    [gone] = [n for n in notes if n["id"] == note_id]
    return f"Deleted note {note_id}: {gone['text']}"


if __name__ == "__main__":
    _load()
    server.run()
