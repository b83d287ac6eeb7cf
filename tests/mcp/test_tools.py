"""What the model reads of an MCP result, argument checks, approval rules, configuration."""

from __future__ import annotations

import base64
import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest
from mcp import types

import agent_mcp
from agent_core import Agent, ToolArgumentsError, ToolError
from agent_mcp import (
    MCPConnectionError,
    MCPServerHTTP,
    MCPServerSSE,
    MCPServerStdio,
    MCPTool,
    MCPToolError,
    result_text,
)
from tests.mcp.conftest import is_items_server, server_pids, stdio_items

SCHEMA = {
    "type": "object",
    "properties": {"item_id": {"type": "string"}, "count": {"type": "integer", "minimum": 1}},
    "required": ["item_id"],
}


def listed(name: str = "delete_item", schema: dict[str, Any] | None = None) -> types.Tool:
    return types.Tool(name=name, description="Delete an item.", input_schema=schema or SCHEMA)


def tool(name: str = "delete_item", schema: dict[str, Any] | None = None) -> MCPTool:
    server = MCPServerStdio("items", "true")
    return MCPTool.from_listing(listed(name, schema), server, None)


# --------------------------------------------------------------------------- results
def test_content_items_are_joined_one_per_line_and_media_are_summarised() -> None:
    png = base64.b64encode(b"x" * 300).decode()
    result = types.CallToolResult(
        content=[
            types.TextContent(type="text", text="Found 2 files."),
            types.ImageContent(type="image", data=png, mime_type="image/png"),
            types.ResourceLink(type="resource_link", uri="file:///a.txt", name="a.txt"),
            types.EmbeddedResource(
                type="resource",
                resource=types.TextResourceContents(uri="file:///b.txt", text="hello"),
            ),
            types.EmbeddedResource(
                type="resource",
                resource=types.BlobResourceContents(
                    uri="file:///c.bin", blob=png, mime_type="application/zip"
                ),
            ),
        ],
        structured_content={"count": 2},  # the text says it already: not repeated
    )
    assert result_text(result) == (
        "Found 2 files.\n"
        "[image: image/png, about 300 bytes, not shown]\n"
        "[resource link: file:///a.txt (a.txt)]\n"
        "[resource: file:///b.txt]\nhello\n"
        "[resource: file:///c.bin, application/zip, not shown]"
    )


def test_structured_content_is_sent_as_json_when_no_item_is_text() -> None:
    result = types.CallToolResult(content=[], structured_content={"total": 3, "ok": True})
    assert result_text(result) == '{"total": 3, "ok": true}'
    assert result_text(types.CallToolResult(content=[])) == "(no output)"


def test_is_error_raises_with_the_servers_text() -> None:
    failed = types.CallToolResult(
        content=[types.TextContent(type="text", text="disk full")], is_error=True
    )
    with pytest.raises(MCPToolError, match=r"^disk full$"):
        result_text(failed)
    with pytest.raises(MCPToolError, match="without a message"):
        result_text(types.CallToolResult(content=[], is_error=True))


# --------------------------------------------------------------------------- arguments
def test_valid_arguments_pass_as_written() -> None:
    assert tool().validate('{"item_id": "7"}') == {"item_id": "7"}


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("{nope", "arguments are not valid JSON (Expecting property name enclosed in double"),
        ('"7"', "arguments must be a JSON object"),
        ('{"item_id": 7}', "invalid arguments: item_id: 7 is not of type 'string'"),
        (
            '{"count": 0, "extra": 1}',
            "invalid arguments: (root): 'item_id' is a required property; "
            "count: 0 is less than the minimum of 1",
        ),
    ],
)
def test_invalid_arguments_say_what_is_wrong(raw: str, problem: str) -> None:
    with pytest.raises(ToolArgumentsError) as err:
        tool().validate(raw)
    assert str(err.value).startswith(problem)


def test_at_most_five_problems_are_listed() -> None:
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(8)}}
    args = ", ".join(f'"p{i}": {i}' for i in range(8))
    with pytest.raises(ToolArgumentsError, match=r"; and 3 more$"):
        tool(schema=schema).validate("{" + args + "}")


def test_an_invalid_input_schema_is_refused() -> None:
    import jsonschema

    with pytest.raises(jsonschema.SchemaError):
        tool(schema={"type": "object", "properties": {"x": {"type": "no-such-type"}}})


def test_names_the_model_cannot_take_are_rewritten_and_the_server_name_kept() -> None:
    t = tool("files.read/v2")
    assert (t.name, t.remote_name) == ("files_read_v2", "files.read/v2")
    assert t.openai_schema()["function"]["parameters"] == SCHEMA  # offered as it is


# --------------------------------------------------------------------------- approval
def rule_of(requires_approval: Any, name: str = "delete_item") -> Any:
    return MCPServerStdio("items", "true", requires_approval=requires_approval)._rule(name)


@pytest.mark.parametrize(
    ("requires_approval", "policy", "gated"),
    [
        (True, "none", True),
        (False, "all", False),  # the tool's own rule comes first
        (None, "none", False),
        (None, "all", True),
        (["delete_item"], "none", True),
        (["other"], "none", False),  # not named: the agent's policy decides
        (["other"], "all", True),
    ],
)
def test_the_servers_rule_comes_first_then_the_agents_policy(
    requires_approval: Any, policy: Any, gated: bool
) -> None:
    t = dataclasses.replace(tool(), requires_approval=rule_of(requires_approval))
    agent = Agent(name="a", instructions=".", approval_policy=policy)
    assert agent.requires_approval(t, {"item_id": "7"}) is gated


def test_a_callable_rule_sees_the_servers_tool_name_and_fails_closed() -> None:
    seen: list[str] = []

    def rule(name: str, args: dict[str, Any]) -> bool:
        seen.append(name)
        return bool(args["item_id"] != "scratch")  # KeyError without an item_id

    agent = Agent(name="a", instructions=".")
    # As the agent offers it after a name collision: prefixed, same server-side name.
    t = dataclasses.replace(tool(), name="items_delete_item", requires_approval=rule_of(rule))
    assert agent.requires_approval(t, {"item_id": "scratch"}) is False
    assert agent.requires_approval(t, {"item_id": "7"}) is True
    assert agent.requires_approval(t, {}) is True  # the rule raised: gated
    assert seen == ["delete_item"] * 3


# --------------------------------------------------------------------------- configuration
@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: MCPServerStdio("my server", "x"), "must match"),
        (lambda: MCPServerStdio("", "x"), "must match"),
        (lambda: MCPServerStdio("s", "x", "arg"), "args is a list"),
        (lambda: MCPServerStdio("s", "x", allowed_tools="lookup"), "allowed_tools is a list"),
        (lambda: MCPServerStdio("s", "x", requires_approval="delete"), "requires_approval is"),
        (lambda: MCPServerStdio("s", "x", requires_approval=3), "requires_approval is"),  # type: ignore[arg-type]
        (lambda: MCPServerStdio("s", "x", timeout=0), "timeout must be a positive"),
        (lambda: MCPServerStdio("s", "x", connect_timeout=float("inf")), "connect_timeout"),
        (lambda: MCPServerHTTP("s", "127.0.0.1:80/mcp"), "url must be an http"),
        (lambda: MCPServerSSE("s", "ws://127.0.0.1/sse"), "url must be an http"),
    ],
)
def test_configuration_mistakes_are_refused_at_once(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


async def test_a_command_that_cannot_start_never_raises_from_open(tmp_path: Path) -> None:
    ghost = MCPServerStdio("ghost", str(tmp_path / "no-such-command"), connect_timeout=2)
    agent = Agent(name="a", instructions=".", toolsets=[ghost])
    await agent.open()
    try:
        assert (agent.tool_names(), ghost.version) == ([], 0)
        with pytest.raises(MCPConnectionError, match=r"^cannot reach MCP server 'ghost' \("):
            await ghost.call_tool("lookup", {})
    finally:
        await agent.close()


async def test_open_counts_and_the_last_close_stops_the_server(journal: Path) -> None:
    items = stdio_items("items", journal, allowed_tools=["lookup"])
    await items.open()
    await items.open()  # a second agent sharing the toolset
    assert [t.name for t in items.tools()] == ["lookup"]
    await items.close()
    assert await items.call_tool("lookup", {"key": "k"}) == "items: value of k"
    await items.close()
    assert [t.name for t in items.tools()] == ["lookup"]  # the last known tools stay
    [pid] = server_pids(journal)
    assert not is_items_server(pid)


# --------------------------------------------------------------------------- public API
def test_all_is_sorted_and_resolves() -> None:
    names = list(agent_mcp.__all__)
    assert names == sorted(set(names))
    assert [n for n in names if not hasattr(agent_mcp, n)] == []


def test_all_exports_every_public_class_and_function() -> None:
    public = {
        name
        for module in ("exceptions", "servers", "tools")
        for name, obj in vars(getattr(agent_mcp, module)).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and obj.__module__ == f"agent_mcp.{module}"
    }
    assert public - set(agent_mcp.__all__) == set()


@pytest.mark.parametrize("error", [MCPConnectionError, MCPToolError, agent_mcp.MCPTimeoutError])
def test_every_call_error_is_an_agent_core_tool_error(error: type[Exception]) -> None:
    assert issubclass(error, ToolError) and error.__doc__
