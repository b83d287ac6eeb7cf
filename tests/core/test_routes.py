"""Approval routes (agent_core/routes.py): who may decide a tool's calls and where its card
goes, set on the tool, the agent or APPROVAL_ROUTES, and recorded in each gate as it opens
(sub-agents' gates included)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent_core import Agent, ConfigError, Settings, ToolDefinitionError, tool
from agent_core.routes import ApprovalRoute, route_for
from agent_core.testing import FakeOpenAI, call, reply
from tests.core.harness import Harness
from tests.core.test_subagents import child_gate


@tool(requires_approval=True, approvers=["S0FIN", "U0CFO"], approval_channel="C0FIN")
def pay(amount: int) -> str:
    """Pay."""
    return f"paid {amount}"


@tool(requires_approval=True)
def wipe(host: str) -> str:
    """Wipe a host."""
    return f"wiped {host}"


def test_a_tool_takes_one_id_a_comma_list_or_a_list() -> None:
    assert pay.approvers == ("S0FIN", "U0CFO") and pay.approval_channel == "C0FIN"
    one = tool(name="one", approvers="S0FIN", approval_channel="G0PRIVATE")(lambda: "x")
    assert one.approvers == ("S0FIN",) and one.approval_channel == "G0PRIVATE"
    listed = tool(name="t", approvers="U0A, W0B ,*")(lambda: "x")
    assert listed.approvers == ("U0A", "W0B", "*") and listed.approval_channel == ""


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"approvers": "finance"},
            "tool f: approvers: entry 1 is not a user (U…/W…), a user group (S…) or *",
        ),
        (
            {"approvers": ["U0A", "@sam"]},
            "tool f: approvers: entry 2 is not a user (U…/W…), a user group (S…) or *",
        ),
        ({"approvers": 7}, "tool f: approvers must be a Slack ID or a list of them"),
        (
            {"approval_channel": "#finance"},
            "tool f: approval_channel must be a channel ID like C0123ABCD (not a #name)",
        ),
    ],
)
def test_a_bad_route_on_a_tool_is_one_clear_error(kwargs: dict[str, Any], message: str) -> None:
    def f() -> str:
        return ""

    with pytest.raises(ToolDefinitionError) as err:
        tool(**kwargs)(f)
    assert str(err.value) == message


def test_a_bad_route_on_an_agent_is_one_clear_error() -> None:
    with pytest.raises(ValueError) as err:
        Agent(name="a", instructions="", approver_ids="everyone")
    assert str(err.value) == (
        "agent 'a': approver_ids: entry 1 is not a user (U…/W…), a user group (S…) or *"
    )
    with pytest.raises(ValueError) as err:
        Agent(name="a", instructions="", approval_channel="finance")
    assert "agent 'a': approval_channel must be a channel ID" in str(err.value)


def test_the_setting_wins_over_the_tool_which_wins_over_the_agent() -> None:
    agent = Agent(
        name="a",
        instructions="",
        tools=[pay, wipe],
        approver_ids="U0LEAD",
        approval_channel="C0OPS",
    )
    assert route_for(agent, pay) == ApprovalRoute(("S0FIN", "U0CFO"), "C0FIN")
    assert route_for(agent, wipe) == ApprovalRoute(("U0LEAD",), "C0OPS")
    routes = {"pay": ApprovalRoute(("S0AUDIT",), ""), "wipe": ApprovalRoute((), "C0SRE")}
    assert route_for(agent, pay, routes) == ApprovalRoute(("S0AUDIT",), "C0FIN")
    assert route_for(agent, wipe, routes) == ApprovalRoute(("U0LEAD",), "C0SRE")
    bare = Agent(name="b", instructions="", tools=[wipe])
    assert route_for(bare, wipe) == ApprovalRoute((), "")  # APPROVERS, in the thread


def settings(**env: Any) -> Settings:
    return Settings.from_env(REDIS_URL="redis://127.0.0.1:1/0", **env)


def test_approval_routes_parse() -> None:
    spec = '{"pay": {"channel": "C0FIN", "approvers": "S0FIN"}, "mcp_x": {"approvers": ["U0A"]}}'
    assert settings(APPROVAL_ROUTES=spec).approval_routes == {
        "pay": ApprovalRoute(("S0FIN",), "C0FIN"),
        "mcp_x": ApprovalRoute(("U0A",), ""),
    }
    assert settings().approval_routes == {}


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("pay=C0FIN", "is not JSON (a JSON object of tool name → {channel, approvers})"),
        ('["pay"]', "must be a JSON object of tool name → {channel, approvers}"),
        ('{"pay now": {}}', "'pay now' is not a tool name"),
        ('{"pay": "C0FIN"}', "pay: must be an object with channel and/or approvers"),
        ('{"pay": {"chanel": "C0FIN"}}', "pay: unknown key 'chanel' (channel, approvers)"),
        ('{"pay": {"channel": "#finance"}}', "pay.channel must be a channel ID like C0123ABCD"),
        ('{"pay": {"channel": 7}}', "pay.channel must be a channel ID like C0123ABCD"),
        (
            '{"pay": {"approvers": ["S0FIN", "finance"]}}',
            "pay.approvers: entry 2 is not a user (U…/W…), a user group (S…) or *",
        ),
    ],
)
def test_a_malformed_approval_routes_is_one_line_naming_the_variable(
    spec: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as err:
        settings(APPROVAL_ROUTES=spec)
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"APPROVAL_ROUTES is invalid: {problem}"), line


# --------------------------------------------------------------------------- in the gate
@tool(requires_approval=True, approvers="S0BOOKS", approval_channel="C0BOOKS")
def book(entry: str) -> str:
    """Book an entry."""
    return f"booked {entry}"


books = Agent(name="books", instructions="", description="Books", tools=[book, wipe])
front = Agent(
    name="front",
    instructions="",
    tools=[wipe, books.as_tool(approvers="U0LEAD")],
    approver_ids=["U0OPS"],
    approval_channel="C0OPS",
)


async def test_each_gate_records_its_route_at_open_sub_agents_included(
    agent_harness: Callable[[Agent], Harness], fake_openai: FakeOpenAI, journal: Path
) -> None:
    sub = front.get_tool("books")
    assert sub is not None and sub.approvers == ("U0LEAD",)  # a sub-agent tool routes too
    h = agent_harness(front)
    fake_openai.script("wipe h1", [call("wipe", {"host": "h1"}), reply("wiped")])
    run = await h.gateway.start_run("wipe h1", requested_by="U1", origin={"channel": "C1"})
    (gate,) = await wait_gates(h, run.run_id)
    assert gate.approvers == ["U0OPS"] and gate.approval_channel == "C0OPS"
    opened = [e for e in await h.events() if e.type.value == "gate.opened"]
    assert opened[-1].data["approvers"] == ["U0OPS"]
    assert opened[-1].data["approval_channel"] == "C0OPS"

    # A sub-agent's gates: its own tools' routes, else the sub-agent's (here none: APPROVERS).
    fake_openai.script("book it", [call("books", {"task": "book 5"}), reply("ok")])
    fake_openai.script("book 5", [call("book", {"entry": "5"}), reply("booked")])
    top = await h.gateway.start_run("book it", requested_by="U1", origin={"channel": "C1"})
    child_id, data = await child_gate(h, top.run_id)
    assert data["approvers"] == ["S0BOOKS"] and data["approval_channel"] == "C0BOOKS"
    child = await h.gateway.gates(child_id)
    assert child[0].approvers == ["S0BOOKS"] and child[0].approval_channel == "C0BOOKS"


async def wait_gates(h: Harness, run_id: str) -> list[Any]:
    for _ in range(200):
        gates = await h.gateway.gates(run_id)
        if gates:
            return gates
        await h.events(block_ms=50)
    raise AssertionError(f"no gate for {run_id}")
