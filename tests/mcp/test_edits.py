"""Edit, then approve an MCP tool's call: its input schema gives the fields."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from agent_core import Agent, InvalidEdit, RunStatus, approve_edited
from agent_core.testing import FakeOpenAI, call, reply, tool_messages
from tests.core.harness import Harness
from tests.mcp.conftest import effects, stdio_items

RunAgent = Callable[[Agent], Awaitable[Harness]]


async def test_an_mcp_call_edited_runs_the_edit_on_the_server(
    run_agent: RunAgent, fake_openai: FakeOpenAI, journal: Path
) -> None:
    items = stdio_items(
        "items", journal, requires_approval=["delete_item"], editable=["delete_item"]
    )
    h = await run_agent(Agent(name="ops", instructions="Manage items.", toolsets=[items]))
    fake_openai.script(
        "delete 7",
        [
            call("delete_item", {"item_id": "7"}),
            reply(
                "done",
                expect=lambda m: (
                    tool_messages(m)[-1]["content"]
                    == 'item 8 deleted\n\nApproved by U2 with edited arguments: {"item_id":"8"}; '
                    'the original request was {"item_id":"7"}.'
                ),
            ),
        ],
    )
    run = await h.gateway.start_run("delete 7", requested_by="U1")
    [opened] = await h.opened_gates(run.run_id, 1)
    gid = opened.data["gate_id"]
    gate = await h.gateway.get_gate(gid)
    assert gate is not None and gate.editable == ["item_id", "reason"]
    with pytest.raises(InvalidEdit) as caught:
        await approve_edited(h.gateway, gid, "U2", {"item_id": 8})
    assert caught.value.errors == {"item_id": "must be string"}
    assert (await approve_edited(h.gateway, gid, "U2", {"item_id": "8"})).applied
    done = await h.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "done")
    assert effects(journal) == ["delete_item:8"]
