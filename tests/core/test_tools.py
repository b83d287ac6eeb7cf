"""``@tool``: what a tool author writes, what the model is shown, what the tool receives."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from agent_core import Tool, ToolArgumentsError, ToolDefinitionError, tool


class Address(BaseModel):
    street: str
    zip_code: int


# --------------------------------------------------------------------------- the decorator
def test_bare_decorator_makes_a_tool_named_after_the_function() -> None:
    @tool
    def get_user(user_id: str) -> str:
        """Look up a user."""
        return user_id

    assert isinstance(get_user, Tool)
    assert get_user.name == "get_user"
    assert get_user.description == "Look up a user."
    assert get_user.requires_approval is None
    assert get_user.idempotent is False


def test_decorator_with_keyword_arguments() -> None:
    def rule(args: dict[str, Any]) -> bool:
        return True

    @tool(
        name="remove-user", description="Remove someone.", requires_approval=rule, idempotent=True
    )
    async def delete_user(user_id: str) -> str:
        """Permanently delete a user."""
        return user_id

    assert isinstance(delete_user, Tool)
    assert delete_user.name == "remove-user"
    assert delete_user.description == "Remove someone."
    assert delete_user.requires_approval is rule
    assert delete_user.idempotent is True
    assert delete_user.openai_schema()["function"]["name"] == "remove-user"


@pytest.mark.parametrize("rule", [True, False])
def test_decorator_keeps_a_boolean_rule(rule: bool) -> None:
    @tool(requires_approval=rule)
    def noop() -> str:
        return ""

    assert noop.requires_approval is rule


def test_openai_schema_is_a_function_entry() -> None:
    @tool
    def ping(host: str) -> str:
        """Ping a host."""
        return host

    assert ping.openai_schema() == {
        "type": "function",
        "function": {
            "name": "ping",
            "description": "Ping a host.",
            "parameters": {
                "type": "object",
                "properties": {"host": {"type": "string"}},
                "required": ["host"],
                "additionalProperties": False,
            },
        },
    }


def test_description_falls_back_to_the_name() -> None:
    @tool
    def undocumented(x: int) -> int:
        return x

    assert undocumented.description == "undocumented"


# --------------------------------------------------------------------------- running tools
async def test_sync_tool_runs_and_gets_its_arguments() -> None:
    @tool
    def add(a: int, b: int = 10) -> str:
        return f"{a}+{b}={a + b}"

    assert await add.call({"a": 1}) == "1+10=11"
    assert await add.call({"a": 1, "b": 2}) == "1+2=3"


async def test_async_tool_runs_on_the_event_loop() -> None:
    loop_thread = threading.get_ident()
    seen: list[int] = []

    @tool
    async def greet(name: str) -> str:
        seen.append(threading.get_ident())
        await asyncio.sleep(0)
        return f"hello {name}"

    assert await greet.call({"name": "ada"}) == "hello ada"
    assert seen == [loop_thread]


async def test_sync_tool_runs_in_a_thread_and_does_not_block_the_loop() -> None:
    loop_thread = threading.get_ident()
    seen: list[int] = []

    @tool
    def slow() -> str:
        seen.append(threading.get_ident())
        time.sleep(0.2)
        return "done"

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        started = time.monotonic()
        assert await slow.call({}) == "done"
        elapsed = time.monotonic() - started
    finally:
        task.cancel()
    assert elapsed >= 0.2
    assert seen and seen[0] != loop_thread
    # A blocked loop would not tick at all while the tool sleeps; a free one ticks ~20 times.
    assert ticks >= 5, ticks


async def test_two_sync_tools_run_concurrently() -> None:
    @tool
    def nap(n: int) -> int:
        time.sleep(0.2)
        return n

    started = time.monotonic()
    results = await asyncio.gather(nap.call({"n": 1}), nap.call({"n": 2}))
    assert list(results) == ["1", "2"]
    assert time.monotonic() - started < 0.35


async def test_sync_function_returning_an_awaitable_is_awaited() -> None:
    async def inner(x: int) -> str:
        return f"inner {x}"

    @tool
    def wrapper(x: int) -> Any:
        return inner(x)

    assert await wrapper.call({"x": 3}) == "inner 3"


async def test_pydantic_model_parameter_arrives_as_a_model_instance() -> None:
    received: list[object] = []

    @tool
    def ship(to: Address) -> str:
        received.append(to)
        return to.street

    assert await ship.call({"to": {"street": "Main St", "zip_code": 12345}}) == "Main St"
    assert received == [Address(street="Main St", zip_code=12345)]


@pytest.mark.parametrize(
    ("result", "text"),
    [
        ("plain text", "plain text"),
        ("", ""),
        (42, "42"),
        (1.5, "1.5"),
        (True, "true"),
        (None, "null"),
        ({"ok": True, "n": [1, 2]}, '{"ok": true, "n": [1, 2]}'),
        (["a", "b"], '["a", "b"]'),
    ],
)
async def test_non_string_results_are_json_encoded(result: object, text: str) -> None:
    @tool
    def give() -> object:
        return result

    out = await give.call({})
    assert isinstance(out, str)
    assert out == text


async def test_pydantic_model_result_is_its_json() -> None:
    @tool
    async def where() -> Address:
        return Address(street="Elm", zip_code=1)

    out = await where.call({})
    assert json.loads(out) == {"street": "Elm", "zip_code": 1}


async def test_unserializable_result_falls_back_to_str() -> None:
    class Thing:
        def __str__(self) -> str:
            return "a thing"

    @tool
    def make() -> object:
        return {"thing": Thing()}

    assert json.loads(await make.call({})) == {"thing": "a thing"}


async def test_exception_in_the_tool_propagates_to_the_caller() -> None:
    @tool
    def boom() -> str:
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        await boom.call({})


# --------------------------------------------------------------------------- the schema
@tool
def kitchen_sink(
    text: str,
    count: int,
    ratio: float,
    flag: bool,
    tags: list[str],
    mode: Literal["fast", "slow"],
    address: Address,
    note: str | None = None,
    limit: int = 5,
) -> str:
    """Do everything at once.

    The model sees this paragraph too.

    Args:
        text: The text to process.
        count (int): How many times.
        ratio: A ratio between
            zero and one: inclusive.
        flag: Whether to shout.
        tags: Labels to attach.
        mode: How fast to go.
        address: Where to send it.
        note: An optional note.
    """
    return "ok"


def test_schema_types_from_hints() -> None:
    props = kitchen_sink.schema["properties"]
    assert props["text"]["type"] == "string"
    assert props["count"]["type"] == "integer"
    assert props["ratio"]["type"] == "number"
    assert props["flag"]["type"] == "boolean"
    assert props["tags"]["type"] == "array"
    assert props["tags"]["items"] == {"type": "string"}
    assert props["mode"]["enum"] == ["fast", "slow"]
    assert props["limit"]["type"] == "integer"
    assert props["limit"]["default"] == 5
    assert {"type": "string"} in props["note"]["anyOf"]
    assert {"type": "null"} in props["note"]["anyOf"]
    assert props["note"]["default"] is None


def test_schema_required_lists_exactly_the_parameters_without_default() -> None:
    assert sorted(kitchen_sink.schema["required"]) == sorted(
        ["text", "count", "ratio", "flag", "tags", "mode", "address"]
    )
    assert list(kitchen_sink.schema["properties"]) == [
        "text",
        "count",
        "ratio",
        "flag",
        "tags",
        "mode",
        "address",
        "note",
        "limit",
    ]


def test_schema_of_a_pydantic_model_parameter_is_resolvable() -> None:
    schema = kitchen_sink.schema
    ref = schema["properties"]["address"]["$ref"]
    assert ref.startswith("#/$defs/")
    target = schema["$defs"][ref.removeprefix("#/$defs/")]
    assert target["properties"]["street"]["type"] == "string"
    assert target["properties"]["zip_code"]["type"] == "integer"
    assert sorted(target["required"]) == ["street", "zip_code"]


def test_schema_forbids_additional_properties_and_has_no_titles() -> None:
    schema = kitchen_sink.schema
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert "title" not in schema
    for name, prop in schema["properties"].items():
        assert "title" not in prop, name


def test_schema_of_a_tool_without_parameters() -> None:
    @tool
    def now() -> str:
        return "noon"

    assert now.schema["type"] == "object"
    assert now.schema["properties"] == {}
    assert now.schema.get("required", []) == []
    assert now.schema["additionalProperties"] is False


def test_docstring_description_and_parameter_descriptions() -> None:
    assert kitchen_sink.description == (
        "Do everything at once.\n\nThe model sees this paragraph too."
    )
    props = kitchen_sink.schema["properties"]
    assert props["text"]["description"] == "The text to process."
    assert props["count"]["description"] == "How many times."  # "(int)" is dropped
    # A continuation line is part of the description, even when it contains a colon.
    assert props["ratio"]["description"] == "A ratio between zero and one: inclusive."
    assert "zero" not in props  # ... and is never taken for a parameter
    assert props["mode"]["description"] == "How fast to go."
    assert props["note"]["description"] == "An optional note."
    assert "description" not in props["limit"]  # undocumented parameter


def test_docstring_text_after_the_args_section_stays_in_the_description() -> None:
    @tool
    def lookup(key: str) -> str:
        """Look something up.

        Args:
            key: The key.

        Returns:
            The value.
        """
        return key

    assert lookup.description.startswith("Look something up.")
    assert "The value." in lookup.description
    assert "The key." not in lookup.description
    assert lookup.schema["properties"]["key"]["description"] == "The key."


def test_explicit_description_wins_over_the_docstring() -> None:
    @tool(description="Short.")
    def f(x: int) -> int:
        """Long docstring."""
        return x

    assert f.description == "Short."


@pytest.mark.parametrize("pname", ["json", "schema", "copy", "model_config", "model_fields"])
async def test_parameter_names_that_clash_with_pydantic_still_work(pname: str) -> None:
    ns: dict[str, Any] = {}
    exec(f"def f({pname}: str) -> str:\n    return 'got ' + {pname}\n", ns)
    t = tool(ns["f"])
    assert list(t.schema["properties"]) == [pname]
    assert t.schema["required"] == [pname]
    args = t.validate(json.dumps({pname: "x"}))
    assert await t.call(args) == "got x"


# --------------------------------------------------------------------------- validation
@tool
def book(room: str, people: int, projector: bool = False) -> str:
    """Book a room."""
    return f"{room}:{people}:{projector}"


def test_valid_arguments_come_back_as_a_dict_with_defaults_filled_in() -> None:
    # What the approval rule sees, the card shows, the hash covers and the tool gets.
    assert book.validate('{"room": "A1", "people": 3}') == {
        "room": "A1",
        "people": 3,
        "projector": False,
    }


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ('{"room": "A1", "people": "3"}', "people: Input should be a valid integer"),
        (
            '{"room": "A1", "people": 3, "projector": "false"}',
            "projector: Input should be a valid boolean",
        ),
        (
            '{"room": "A1", "people": 3, "projector": 0}',
            "projector: Input should be a valid boolean",
        ),
        ('{"room": 7, "people": 3}', "room: Input should be a valid string"),
        ('{"room": "A1", "people": 3.0}', "people: Input should be a valid integer"),
    ],
)
def test_arguments_are_validated_strictly(raw: str, problem: str) -> None:
    # Lax coercion let "false" reach the approval rule as a truthy string and the tool as
    # False: a real run without approval. Strict JSON validation sends it back to the model.
    with pytest.raises(ToolArgumentsError) as err:
        book.validate(raw)
    assert problem in str(err.value)


def test_empty_arguments_mean_an_empty_object() -> None:
    @tool
    def now() -> str:
        return "noon"

    assert now.validate("") == {}
    assert now.validate("{}") == {}


def test_invalid_json_is_an_arguments_error() -> None:
    with pytest.raises(ToolArgumentsError, match="not valid JSON"):
        book.validate('{"room": "A1", "people": ')


@pytest.mark.parametrize("raw", ["[1, 2]", '"A1"', "3", "null", "true"])
def test_non_object_json_is_an_arguments_error(raw: str) -> None:
    with pytest.raises(ToolArgumentsError, match="must be a JSON object"):
        book.validate(raw)


def test_missing_required_field_names_the_field() -> None:
    with pytest.raises(ToolArgumentsError) as info:
        book.validate('{"room": "A1"}')
    message = str(info.value)
    assert "people" in message
    assert "required" in message.lower()
    assert "room" not in message  # only the problem is reported


def test_wrong_type_names_the_field() -> None:
    with pytest.raises(ToolArgumentsError) as info:
        book.validate('{"room": "A1", "people": "many"}')
    message = str(info.value)
    assert "people" in message
    assert "integer" in message


def test_string_field_given_a_number_is_rejected() -> None:
    with pytest.raises(ToolArgumentsError, match="room"):
        book.validate('{"room": 12, "people": 3}')


def test_extra_field_is_rejected_and_named() -> None:
    with pytest.raises(ToolArgumentsError) as info:
        book.validate('{"room": "A1", "people": 3, "catering": true}')
    message = str(info.value)
    assert "catering" in message
    assert "not permitted" in message


def test_literal_outside_the_choices_is_rejected() -> None:
    @tool
    def go(mode: Literal["fast", "slow"]) -> str:
        return mode

    with pytest.raises(ToolArgumentsError, match="mode"):
        go.validate('{"mode": "warp"}')
    assert go.validate('{"mode": "slow"}') == {"mode": "slow"}


def test_nested_model_errors_name_the_path() -> None:
    @tool
    def ship(to: Address) -> str:
        return to.street

    with pytest.raises(ToolArgumentsError, match=r"to\.zip_code"):
        ship.validate('{"to": {"street": "Main"}}')


def test_several_problems_are_all_reported() -> None:
    with pytest.raises(ToolArgumentsError) as info:
        book.validate('{"people": "x", "extra": 1}')
    message = str(info.value)
    for name in ("room", "people", "extra"):
        assert name in message


def test_arguments_error_is_a_tool_error() -> None:
    from agent_core import GatewayError, ToolError

    with pytest.raises(ToolError):
        book.validate("{")
    assert issubclass(ToolArgumentsError, GatewayError)


# --------------------------------------------------------------------------- definition errors
def test_missing_type_hint_is_a_definition_error() -> None:
    def f(x, y: int) -> str:  # type: ignore[no-untyped-def]
        return ""

    with pytest.raises(ToolDefinitionError, match=r"'x'.*type hint"):
        tool(f)


def test_star_args_is_a_definition_error() -> None:
    def f(*items: str) -> str:
        return ""

    with pytest.raises(ToolDefinitionError, match=r"\*args"):
        tool(f)


def test_star_star_kwargs_is_a_definition_error() -> None:
    def f(x: int, **extra: str) -> str:
        return ""

    with pytest.raises(ToolDefinitionError, match=r"\*\*kwargs"):
        tool(f)


@pytest.mark.parametrize("bad", ["has space", "dots.not.allowed", "x" * 65, "ünï", "semi;colon"])
def test_bad_name_is_a_definition_error(bad: str) -> None:
    def f() -> str:
        return ""

    with pytest.raises(ToolDefinitionError, match="tool name"):
        tool(name=bad)(f)


def test_longest_allowed_name() -> None:
    assert tool(name="x" * 64)(lambda: "").name == "x" * 64


def test_lambda_needs_a_name() -> None:
    with pytest.raises(ToolDefinitionError, match="<lambda>"):
        tool(lambda: "x")
    assert tool(name="const")(lambda: "x").name == "const"


def test_callable_without_a_name_is_a_definition_error() -> None:
    def f(x: int) -> int:
        return x

    with pytest.raises(ToolDefinitionError, match="name="):
        tool(functools.partial(f, 1))


def test_unresolvable_type_hint_is_a_definition_error() -> None:
    def f(x: NoSuchType) -> str:  # type: ignore[name-defined]  # noqa: F821
        return ""

    with pytest.raises(ToolDefinitionError, match="type hints"):
        tool(f)


async def test_parameter_with_a_leading_underscore_works() -> None:
    # Pydantic forbids field names starting with "_"; a tool parameter may still have one.
    def f(_hidden: int) -> int:
        return _hidden * 2

    t = tool(f)
    assert list(t.schema["properties"]) == ["_hidden"]
    assert await t.call(t.validate('{"_hidden": 4}')) == "8"


def test_not_callable_is_a_definition_error() -> None:
    with pytest.raises(ToolDefinitionError, match="not callable"):
        Tool.from_function(42)  # type: ignore[arg-type]


def test_definition_error_is_a_tool_error() -> None:
    from agent_core import GatewayError, ToolError

    assert issubclass(ToolDefinitionError, ToolError)
    assert issubclass(ToolDefinitionError, GatewayError)
