"""Fuzzing tool-argument validation: ``Tool.validate`` on whatever a model may send.

The contract (docs/agents/tools.md): the model's arguments are validated before
anything else; invalid JSON, a missing field, a wrong type or an unknown field is a
:class:`ToolArgumentsError` (sent back to the model), and valid arguments come back as a dict
that the tool accepts. The cases hypothesis does not reach by chance (huge numbers, deep
nesting, lone surrogates) are spelled out at the end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from redis.asyncio import Redis

from agent_core import RunStatus, Tool, ToolArgumentsError, tool
from agent_core.runner import args_hash
from agent_core.testing import FakeOpenAI, call, reply
from tests.agents import ops, read_journal
from tests.core.conftest import core_settings
from tests.core.harness import Harness


class Address(BaseModel):
    street: str
    zip: int | None = None


@tool
def everything(
    name: str,
    count: int,
    ratio: float,
    flag: bool,
    tags: list[str],
    mode: Literal["a", "b"] = "a",
    address: Address | None = None,
    extra: dict[str, int] | None = None,
) -> str:
    """A tool with every common parameter type."""
    return "ok"


@tool
def nothing() -> str:
    """A tool without parameters."""
    return "ok"


TOOLS: list[Tool] = [everything, nothing, *ops.tools]

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_any = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=20,
)
# Objects whose keys are mostly real parameter names, so validation gets past "unknown field".
names = st.sampled_from(
    ["name", "count", "ratio", "flag", "tags", "mode", "address", "extra", "user_id", "to", "x"]
)
near_valid = st.dictionaries(names | st.text(max_size=8), json_any, max_size=8)


def mutations(doc: str) -> st.SearchStrategy[str]:
    """A JSON document cut, padded, or with a character changed."""
    n = len(doc)
    return st.one_of(
        st.just(doc),
        st.integers(0, n).map(lambda i: doc[:i]),
        st.integers(0, n).map(lambda i: doc[i:]),
        st.tuples(st.integers(0, n), st.characters()).map(
            lambda t: doc[: t[0]] + t[1] + doc[t[0] :]
        ),
        st.sampled_from([" ", "\n", "\x00", "}", "]", ",", "NaN", "Infinity", "//"]).map(
            lambda s: doc + s
        ),
    )


raw_arguments = st.one_of(
    st.text(),
    st.binary().map(lambda b: b.decode("utf-8", errors="replace")),
    json_any.map(json.dumps),
    near_valid.map(json.dumps).flatmap(mutations),
    near_valid.map(lambda d: json.dumps(d, ensure_ascii=False)),
    st.sampled_from(["", "{}", "null", "[]", '""', "0", "{", '{"a":1}{"b":2}', "\ufeff{}"]),
)


def check_validate(t: Tool, raw: str) -> dict[str, Any] | None:
    """Only a dict or ToolArgumentsError; a dict the tool's own model accepts and can hash."""
    try:
        args = t.validate(raw)
    except ToolArgumentsError:
        return None
    assert isinstance(args, dict)
    t.params_model.model_validate(args)  # what Tool.call does with it
    args_hash(args)  # what the gate records
    return args


@settings(max_examples=150, deadline=None)
@given(t=st.sampled_from(TOOLS), raw=raw_arguments)
def test_validate_returns_a_dict_or_raises_tool_arguments_error(t: Tool, raw: str) -> None:
    check_validate(t, raw)


@settings(max_examples=200, deadline=None)
@given(
    name=st.text(),
    count=st.integers(-(10**30), 10**30),
    ratio=st.floats(allow_nan=False, allow_infinity=False),
    flag=st.booleans(),
    tags=st.lists(st.text()),
    mode=st.sampled_from(["a", "b"]),
)
def test_valid_arguments_round_trip(
    name: str, count: int, ratio: float, flag: bool, tags: list[str], mode: str
) -> None:
    doc = {"name": name, "count": count, "ratio": ratio, "flag": flag, "tags": tags, "mode": mode}
    args = check_validate(everything, json.dumps(doc))
    assert args == {**doc, "address": None, "extra": None}, "with the defaults filled in"


# --------------------------------------------------------------------------- found by fuzzing
HUGE_INT = '{"count": ' + "9" * 5000 + "}"
DEEP = '{"name": ' + "[" * 100_000 + "]" * 100_000 + "}"


@pytest.mark.parametrize("raw", [HUGE_INT, DEEP], ids=["5000-digit-number", "100000-deep"])
def test_pathological_json_is_a_tool_arguments_error(raw: str) -> None:
    check_validate(everything, raw)


LONE_SURROGATE = '{"user_id": "\\ud800"}'


def test_a_lone_surrogate_is_invalid_arguments() -> None:
    """Found by fuzzing: it used to pass validation and then break the arguments hash."""
    with pytest.raises(ToolArgumentsError, match="not valid Unicode"):
        ops.get_tool("delete_user").validate(LONE_SURROGATE)  # type: ignore[union-attr]


async def test_a_lone_surrogate_in_gated_arguments_is_refused_to_the_model(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, journal: Path
) -> None:
    task = "surrogate args"

    def told_invalid(messages: list[dict[str, Any]]) -> None:
        tool_msgs = [m["content"] for m in messages if m.get("role") == "tool"]
        assert tool_msgs and "rejected before any approval" in tool_msgs[-1], tool_msgs

    fake_openai.script(
        task, [call("delete_user", LONE_SURROGATE), reply("bad args", expect=told_invalid)]
    )
    h = Harness(redis, core_settings(redis_url, fake_openai.base_url), ops)
    h.start_worker()
    try:
        run = await h.gateway.start_run(task, requested_by="U1")
        done = await h.wait_finished(run.run_id, timeout=5)
        assert done.status is RunStatus.COMPLETED and done.final == "bad args"
        assert read_journal(str(journal)) == []
    finally:
        await h.close()
        fake_openai.reset()  # the unfinished run must not fail the fixture's teardown
