"""MCP tools end to end: a real MCP server, a real worker, Redis, the fake model.

What is checked is what people see: the tools the model is offered, the gate an approver
decides, the side effect on the server's side, and the exact text the model reads next.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agent_core import Agent, Decision, RunStatus
from agent_core.testing import FakeOpenAI, call, calls, reply, tool_messages
from agent_mcp import MCPServerHTTP, MCPServerSSE
from tests.core.harness import Harness
from tests.mcp.conftest import ItemsServer, effects, stdio_items

RunAgent = Callable[[Agent], Awaitable[Harness]]

# The input schema of delete_item as the server lists it (pydantic's, titles and all).
DELETE_ITEM_SCHEMA = {
    "type": "object",
    "properties": {
        "item_id": {"title": "Item Id", "type": "string"},
        "reason": {"default": "", "title": "Reason", "type": "string"},
    },
    "required": ["item_id"],
    "title": "delete_itemArguments",
}


def offered(fake: FakeOpenAI, task: str, turn: int = 0) -> dict[str, dict[str, Any]]:
    """The functions offered to the model in the task's request number ``turn``."""
    body = fake.requests_for(task)[turn]
    return {t["function"]["name"]: t["function"] for t in body.get("tools", [])}


def told(fake: FakeOpenAI, task: str, turn: int = 1) -> list[str]:
    """The tool results the model read in the task's request number ``turn``."""
    return [m["content"] for m in tool_messages(fake.requests_for(task)[turn]["messages"])]


async def test_approved_call_runs_once_on_the_server_and_the_model_reads_its_output(
    run_agent: RunAgent, fake_openai: FakeOpenAI, journal: Path
) -> None:
    items = stdio_items("items", journal, requires_approval=["delete_item"])
    h = await run_agent(Agent(name="ops", instructions="Manage items.", toolsets=[items]))
    fake_openai.script(
        "delete 7",
        [
            calls([("lookup", {"key": "7"}), ("delete_item", {"item_id": "7"})]),
            reply("Item 7 is gone."),
        ],
    )
    run = await h.gateway.start_run("delete 7", requested_by="U1")

    [opened] = await h.opened_gates(run.run_id, 1)  # lookup is not on the approval list
    d = opened.data
    assert (d["tool"], d["args"], d["description"]) == (
        "delete_item",
        {"item_id": "7"},
        "Permanently delete an item.",
    )
    assert effects(journal) == []  # nothing ran on the server before the decision
    res = await h.gateway.decide(d["gate_id"], Decision.APPROVE, by="U2")
    assert res.applied

    done = await h.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "Item 7 is gone.")
    assert effects(journal) == ["delete_item:7"]  # exactly once
    assert told(fake_openai, "delete 7") == ["items: value of 7", "item 7 deleted"]
    tools = offered(fake_openai, "delete 7")
    assert sorted(tools) == ["delete_item", "environment", "fail", "grow", "lookup", "slow"]
    assert tools["delete_item"]["parameters"] == DELETE_ITEM_SCHEMA
    assert tools["delete_item"]["description"] == "Permanently delete an item."


async def test_http_server_gets_the_headers_and_ungated_calls_run_at_once(
    run_agent: RunAgent,
    fake_openai: FakeOpenAI,
    journal: Path,
    http_items: Callable[..., ItemsServer],
) -> None:
    server = http_items("http")
    items = MCPServerHTTP("items", server.url, headers={"Authorization": "Bearer s3cret"})
    assert "s3cret" not in repr(items)
    h = await run_agent(Agent(name="ops", instructions="Manage items.", toolsets=[items]))
    fake_openai.script(
        "who am I",
        [calls([("environment", {}), ("delete_item", {"item_id": "9"})]), reply("done")],
    )
    run = await h.gateway.start_run("who am I", requested_by="U1")
    done = await h.wait_finished(run.run_id)
    assert done.status is RunStatus.COMPLETED
    env, deleted = told(fake_openai, "who am I")
    assert json.loads(env)["authorization"] == "Bearer s3cret"
    assert deleted == "item 9 deleted"
    assert effects(journal) == ["delete_item:9"]
    assert not [e for e in await h.events() if e.type.value == "gate.opened"]


async def test_sse_server_works_and_a_gate_covers_every_tool_with_true(
    run_agent: RunAgent,
    fake_openai: FakeOpenAI,
    journal: Path,
    http_items: Callable[..., ItemsServer],
) -> None:
    server = http_items("sse")
    items = MCPServerSSE("items", server.url, requires_approval=True)
    h = await run_agent(Agent(name="ops", instructions="Manage items.", toolsets=[items]))
    fake_openai.script("look k1", [call("lookup", {"key": "k1"}), reply("found")])
    run = await h.gateway.start_run("look k1", requested_by="U1")
    [opened] = await h.opened_gates(run.run_id, 1)
    await h.gateway.decide(opened.data["gate_id"], Decision.APPROVE, by="U2")
    done = await h.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "found")
    assert told(fake_openai, "look k1") == ["items: value of k1"]


async def test_allowed_tools_hide_the_others(
    run_agent: RunAgent, fake_openai: FakeOpenAI, journal: Path
) -> None:
    items = stdio_items("items", journal, allowed_tools=["lookup"])
    h = await run_agent(Agent(name="ops", instructions="Manage items.", toolsets=[items]))
    fake_openai.script("delete 3", [call("delete_item", {"item_id": "3"}), reply("cannot")])
    run = await h.gateway.start_run("delete 3", requested_by="U1")
    await h.wait_finished(run.run_id)
    assert list(offered(fake_openai, "delete 3")) == ["lookup"]
    assert told(fake_openai, "delete 3") == [
        "Error: there is no tool named 'delete_item'. Nothing ran. Available tools: lookup."
    ]
    assert effects(journal) == []


async def test_same_tool_name_on_two_servers_is_prefixed_and_both_work(
    run_agent: RunAgent, fake_openai: FakeOpenAI, journal: Path
) -> None:
    alpha = stdio_items("alpha", journal, allowed_tools=["lookup", "delete_item"])
    beta = stdio_items("beta", journal, allowed_tools=["lookup"])
    h = await run_agent(Agent(name="ops", instructions="Two stores.", toolsets=[alpha, beta]))
    fake_openai.script(
        "look everywhere",
        [
            calls([("alpha_lookup", {"key": "k"}), ("beta_lookup", {"key": "k"})]),
            reply("both"),
        ],
    )
    run = await h.gateway.start_run("look everywhere", requested_by="U1")
    await h.wait_finished(run.run_id)
    assert sorted(offered(fake_openai, "look everywhere")) == [
        "alpha_lookup",
        "beta_lookup",
        "delete_item",  # only alpha has it: no prefix
    ]
    assert told(fake_openai, "look everywhere") == ["alpha: value of k", "beta: value of k"]


async def test_errors_and_invalid_arguments_are_what_the_model_reads(
    run_agent: RunAgent, fake_openai: FakeOpenAI, journal: Path
) -> None:
    items = stdio_items("items", journal, requires_approval=["delete_item"])
    h = await run_agent(Agent(name="ops", instructions="Manage items.", toolsets=[items]))
    fake_openai.script(
        "break things",
        [
            calls(
                [
                    ("fail", {"message": "no such item"}),
                    ("delete_item", {"item_id": 7}),
                    ("delete_item", "[1]"),
                    ("delete_item", {}),
                ]
            ),
            reply("nothing worked"),
        ],
    )
    run = await h.gateway.start_run("break things", requested_by="U1")
    done = await h.wait_finished(run.run_id)
    assert done.status is RunStatus.COMPLETED
    rejected = "Error: the call to delete_item was rejected before any approval or execution: "
    again = ". Nothing ran. Correct the arguments and call again if still needed."
    assert told(fake_openai, "break things") == [
        "Error: the tool fail failed: MCPToolError: Error executing tool fail: no such item",
        rejected + "invalid arguments: item_id: 7 is not of type 'string'" + again,
        rejected + "arguments must be a JSON object" + again,
        rejected + "invalid arguments: (root): 'item_id' is a required property" + again,
    ]
    # Rejected before the gate: no approver was asked, nothing reached the server.
    assert not [e for e in await h.events() if e.type.value == "gate.opened"]
    assert effects(journal) == []


async def test_a_call_past_the_timeout_is_a_tool_error_and_the_session_goes_on(
    run_agent: RunAgent, fake_openai: FakeOpenAI, journal: Path
) -> None:
    items = stdio_items("items", journal, timeout=0.5)
    h = await run_agent(Agent(name="ops", instructions="Manage items.", toolsets=[items]))
    fake_openai.script(
        "nap",
        [
            call("slow", {"seconds": 20}),
            call("lookup", {"key": "k"}),
            reply("woke up"),
        ],
    )
    run = await h.gateway.start_run("nap", requested_by="U1")
    done = await h.wait_finished(run.run_id)
    assert (done.status, done.final) == (RunStatus.COMPLETED, "woke up")
    assert told(fake_openai, "nap", 2) == [
        "Error: the tool slow failed: MCPTimeoutError: MCP server 'items' did not answer "
        "within 0.5 s; the call was cancelled, but it may have taken effect on the server",
        "items: value of k",
    ]


async def test_a_servers_route_is_recorded_in_the_gates_of_its_tools(
    run_agent: RunAgent, fake_openai: FakeOpenAI, journal: Path
) -> None:
    """``approvers``/``approval_channel`` on a server route its tools' gates (as on a tool)."""
    items = stdio_items(
        "items",
        journal,
        requires_approval=["delete_item"],
        approvers=["S0SRE", "U0LEAD"],
        approval_channel="C0SRE",
    )
    h = await run_agent(Agent(name="ops", instructions="Manage items.", toolsets=[items]))
    fake_openai.script("delete 8", [call("delete_item", {"item_id": "8"}), reply("gone")])
    run = await h.gateway.start_run("delete 8", requested_by="U1")
    [opened] = await h.opened_gates(run.run_id, 1)
    assert opened.data["approvers"] == ["S0SRE", "U0LEAD"]
    assert opened.data["approval_channel"] == "C0SRE"
    gate = await h.gateway.get_gate(opened.data["gate_id"])
    assert gate is not None and (gate.approvers, gate.approval_channel) == (
        ["S0SRE", "U0LEAD"],
        "C0SRE",
    )


def test_a_bad_route_on_a_server_is_one_clear_error(journal: Path) -> None:
    with pytest.raises(ValueError) as err:
        stdio_items("items", journal, approval_channel="#sre")
    assert str(err.value) == (
        "MCP server 'items': approval_channel must be a channel ID like C0123ABCD (not a #name)"
    )
