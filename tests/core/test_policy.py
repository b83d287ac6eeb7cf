"""Who decides whether a call needs a human: the tool's own rule first, then the agent's policy."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import pytest

from agent_core import Agent, Tool, ToolDefinitionError, tool
from agent_core.tools import ApprovalRule


def always(args: dict[str, Any]) -> bool:
    return True


def never(args: dict[str, Any]) -> bool:
    return False


def make_tool(name: str, rule: ApprovalRule) -> Tool:
    def fn(target: str) -> str:
        return target

    return tool(name=name, requires_approval=rule)(fn)


def make_agent(rule: ApprovalRule, policy: str | Sequence[str]) -> tuple[Agent, Tool]:
    subject = make_tool("subject", rule)
    bystander = make_tool("bystander", None)
    tools = [subject, bystander]
    agent = Agent(name="t", instructions="", tools=tools, approval_policy=policy)
    return agent, subject


POLICIES: list[str | list[str]] = ["none", "all", ["subject"], ["bystander"], []]


def policy_id(policy: object) -> str:
    return policy if isinstance(policy, str) else f"list{policy}"


# --------------------------------------------------------------------------- the priority table
@pytest.mark.parametrize("policy", POLICIES, ids=policy_id)
@pytest.mark.parametrize(
    ("rule", "gated"),
    [
        pytest.param(True, True, id="tool-True"),
        pytest.param(False, False, id="tool-False"),
        pytest.param(always, True, id="callable-True"),
        pytest.param(never, False, id="callable-False"),
    ],
)
def test_a_tool_with_its_own_rule_decides_whatever_the_agent_policy(
    rule: ApprovalRule, gated: bool, policy: str | list[str]
) -> None:
    agent, subject = make_agent(rule, policy)
    assert agent.requires_approval(subject, {"target": "x"}) is gated


@pytest.mark.parametrize(
    ("policy", "gated"),
    [
        pytest.param("all", True, id="all-gates"),
        pytest.param("none", False, id="none-does-not"),
        pytest.param(["subject"], True, id="listed-gates"),
        pytest.param(["bystander"], False, id="unlisted-does-not"),
        pytest.param([], False, id="empty-list-does-not"),
        pytest.param(("subject", "bystander"), True, id="tuple-listed-gates"),
    ],
)
def test_a_tool_that_says_nothing_follows_the_agent_policy(
    policy: str | Sequence[str], gated: bool
) -> None:
    agent, subject = make_agent(None, policy)
    assert agent.requires_approval(subject, {"target": "x"}) is gated


def test_default_policy_gates_nothing() -> None:
    agent = Agent(name="t", instructions="", tools=[make_tool("a", None)])
    assert agent.approval_policy == "none"
    a = agent.get_tool("a")
    assert a is not None
    assert agent.requires_approval(a, {"target": "x"}) is False


def test_list_policy_gates_only_the_listed_tools() -> None:
    a, b, c = make_tool("a", None), make_tool("b", None), make_tool("c", False)
    agent = Agent(name="t", instructions="", tools=[a, b, c], approval_policy=["a", "c"])
    assert agent.requires_approval(a, {"target": "x"}) is True
    assert agent.requires_approval(b, {"target": "x"}) is False
    # "c" is listed, but says False itself: its own rule wins.
    assert agent.requires_approval(c, {"target": "x"}) is False


# --------------------------------------------------------------------------- callable rules
@tool(requires_approval=lambda args: not args["to"].endswith("@example.com"))
def send_email(to: str, subject: str, body: str) -> str:
    """Send an email."""
    return "sent"


@pytest.mark.parametrize("policy", ["none", "all"])
@pytest.mark.parametrize(
    ("to", "gated"),
    [("ada@example.com", False), ("eve@elsewhere.org", True), ("x@example.com.evil", True)],
)
def test_callable_rule_decides_from_the_arguments(to: str, gated: bool, policy: str) -> None:
    agent = Agent(name="mail", instructions="", tools=[send_email], approval_policy=policy)
    args = {"to": to, "subject": "hi", "body": "..."}
    assert agent.requires_approval(send_email, args) is gated


def test_callable_rule_receives_the_arguments_as_a_dict_it_cannot_corrupt() -> None:
    seen: list[dict[str, Any]] = []

    def rule(args: dict[str, Any]) -> bool:
        seen.append(dict(args))
        assert isinstance(args, dict)
        args["target"] = "tampered"
        return False

    agent, subject = make_agent(rule, "none")
    args = {"target": "prod-db"}
    assert agent.requires_approval(subject, args) is False
    assert seen == [{"target": "prod-db"}]
    assert args == {"target": "prod-db"}


@pytest.mark.parametrize(("value", "gated"), [(1, True), ("yes", True), (0, False), (None, False)])
def test_callable_rule_result_is_read_as_truthiness(value: object, gated: bool) -> None:
    agent, subject = make_agent(lambda args: value, "none")  # type: ignore[arg-type,return-value]
    assert agent.requires_approval(subject, {"target": "x"}) is gated


@pytest.mark.parametrize("policy", ["none", "all", ["bystander"]], ids=policy_id)
@pytest.mark.parametrize(
    "exc", [KeyError("to"), ValueError("bad"), TypeError("nope"), ZeroDivisionError()]
)
def test_callable_rule_that_raises_gates_the_call(
    exc: Exception, policy: str | list[str], caplog: pytest.LogCaptureFixture
) -> None:
    def rule(args: dict[str, Any]) -> bool:
        raise exc

    agent, subject = make_agent(rule, policy)
    with caplog.at_level(logging.WARNING, logger="agent_core"):
        assert agent.requires_approval(subject, {"target": "x"}) is True
    assert any("subject" in r.getMessage() for r in caplog.records), caplog.text


def test_rule_reading_a_missing_argument_fails_closed() -> None:
    # The documented example, called with an argument left out (e.g. an optional one).
    @tool(requires_approval=lambda args: args["amount"] > 100)
    def pay(to: str, amount: int = 0) -> str:
        return "paid"

    agent = Agent(name="t", instructions="", tools=[pay])
    assert agent.requires_approval(pay, {"to": "bob"}) is True
    assert agent.requires_approval(pay, {"to": "bob", "amount": 5}) is False
    assert agent.requires_approval(pay, {"to": "bob", "amount": 500}) is True


# --------------------------------------------------------------------------- Agent validation
def test_policy_naming_an_unknown_tool_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"unknown tools \['nope'\]"):
        Agent(
            name="t", instructions="", tools=[make_tool("a", None)], approval_policy=["a", "nope"]
        )


@pytest.mark.parametrize("policy", ["some", "ALL", "None", "", "a"])
def test_policy_string_other_than_none_or_all_is_rejected(policy: str) -> None:
    # "a" is a tool's name: a bare string is never read as a list of names.
    with pytest.raises(ValueError, match="approval_policy must be 'none', 'all' or a list"):
        Agent(name="t", instructions="", tools=[make_tool("a", None)], approval_policy=policy)


def test_duplicate_tool_names_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"duplicate tool names \['a'\]"):
        Agent(name="t", instructions="", tools=[make_tool("a", None), make_tool("a", True)])


def test_a_function_and_a_tool_with_the_same_name_are_duplicates() -> None:
    def lookup(key: str) -> str:
        return key

    with pytest.raises(ValueError, match="duplicate tool names"):
        Agent(name="t", instructions="", tools=[lookup, tool(lookup)])


@pytest.mark.parametrize("timeout", [0, -1, -0.5, math.nan, math.inf])
def test_approval_timeout_must_be_a_positive_finite_number(timeout: float) -> None:
    with pytest.raises(ValueError, match="approval_timeout must be a positive"):
        Agent(name="t", instructions="", approval_timeout=timeout)


@pytest.mark.parametrize("timeout", [None, 0.5, 1, 86_400])
def test_valid_approval_timeouts(timeout: float | None) -> None:
    assert Agent(name="t", instructions="", approval_timeout=timeout).approval_timeout == timeout


def test_agent_errors_name_the_agent() -> None:
    with pytest.raises(ValueError, match="'billing'"):
        Agent(name="billing", instructions="", approval_policy="sometimes")


# --------------------------------------------------------------------------- plain functions
def test_plain_functions_in_tools_are_wrapped() -> None:
    def get_user(user_id: str) -> str:
        """Look up a user."""
        return user_id

    async def delete_user(user_id: str) -> str:
        return user_id

    agent = Agent(
        name="ops",
        instructions="",
        tools=[get_user, delete_user, make_tool("explicit", True)],
        approval_policy=["delete_user"],
    )
    assert all(isinstance(t, Tool) for t in agent.tools)
    assert [getattr(t, "name", None) for t in agent.tools] == [
        "get_user",
        "delete_user",
        "explicit",
    ]
    wrapped = agent.get_tool("get_user")
    assert wrapped is not None
    assert wrapped.fn is get_user
    assert wrapped.requires_approval is None
    assert wrapped.description == "Look up a user."
    deleter = agent.get_tool("delete_user")
    assert deleter is not None
    assert agent.requires_approval(wrapped, {"user_id": "u1"}) is False
    assert agent.requires_approval(deleter, {"user_id": "u1"}) is True
    assert [t["function"]["name"] for t in agent.openai_tools()] == [
        "get_user",
        "delete_user",
        "explicit",
    ]


def test_get_tool_of_an_unknown_name_is_none() -> None:
    agent = Agent(name="t", instructions="", tools=[make_tool("a", None)])
    assert agent.get_tool("b") is None


def test_a_plain_function_that_cannot_be_a_tool_fails_at_agent_creation() -> None:
    def untyped(x):  # type: ignore[no-untyped-def]
        return x

    with pytest.raises(ToolDefinitionError, match="type hint"):
        Agent(name="t", instructions="", tools=[untyped])


def test_openai_tools_are_one_entry_per_tool_with_its_schema() -> None:
    agent = Agent(name="t", instructions="", tools=[send_email])
    assert agent.openai_tools() == [send_email.openai_schema()]
    params = agent.openai_tools()[0]["function"]["parameters"]
    assert sorted(params["required"]) == ["body", "subject", "to"]
