"""Edit, then approve: a person changes a gated call's arguments before approving it.

A tool allows it with ``@tool(requires_approval=True, editable=True)`` (every parameter) or
a list of its parameters (``editable=["amount_cents"]``); the default is off, because an
edit is a new call that a person now owns. Sub-agents (``Agent.as_tool(editable=...)``) and
MCP servers (``MCPServer*(editable=...)``) take the same option; their JSON schema gives
the fields.

The gate carries what a front end needs, which has no tool registry: ``editable`` (a JSON
list of the fields a person may change) and ``args_schema`` (the arguments' JSON schema,
compact). :func:`approve_edited` checks an edit against that schema (:func:`check_args`:
strict types, required, enum/const, bounds, no unknown fields) and that every other field
is unchanged, then decides the gate through DECIDE_GATE with the edited arguments (their
canonical JSON and hash). The gate records ``edited_args``, ``edited_hash`` and
``edited_by`` next to the original ``args`` and ``args_hash``; its ``decided_hash`` is the
edited hash. The worker runs the edited arguments only: it validates them again with the
tool's own model and checks that they hash to the decided hash before the claim.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .exceptions import GateNotFound, InvalidEdit, ToolArgumentsError, ToolDefinitionError

if TYPE_CHECKING:
    from .gateway import Gateway
    from .models import DecideResult, Gate
    from .tools import Tool

Editable = bool | Sequence[str] | None
MAX_SCHEMA_CHARS = 16_000  # a larger schema is not carried by the gate: not editable
MAX_EDIT_BYTES = 64_000  # of the edited arguments' canonical JSON
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def canonical(args: Mapping[str, Any]) -> str:
    """The canonical JSON of arguments: what the hash covers and the gate records."""
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def editable_fields(editable: Editable, schema: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """The fields a person may edit: ``True`` is every property of ``schema``, a list names
    some (each must be one: :class:`ToolDefinitionError` otherwise)."""
    if editable is None or editable is False:
        return ()
    props = list((schema.get("properties") or {}).keys())
    if editable is True:
        if not props:
            raise ToolDefinitionError(f"{where}: editable=True, but it has no parameters")
        return tuple(props)
    if isinstance(editable, str) or not isinstance(editable, Iterable):
        raise ToolDefinitionError(f"{where}: editable is True, False or a list of parameters")
    names = list(editable)
    unknown = [n for n in names if n not in props]
    if unknown or not names:
        raise ToolDefinitionError(
            f"{where}: editable names {unknown or 'nothing'}; its parameters are {props}"
        )
    return tuple(dict.fromkeys(names))


def gate_fields(t: Tool) -> dict[str, str]:
    """The gate hash fields of an editable tool (none for another): ``editable`` and
    ``args_schema``. A schema over :data:`MAX_SCHEMA_CHARS` makes the call not editable."""
    if not t.editable:
        return {}
    schema = json.dumps(t.schema, separators=(",", ":"), ensure_ascii=False)
    if len(schema) > MAX_SCHEMA_CHARS:
        return {}
    return {"editable": json.dumps(list(t.editable)), "args_schema": schema}


def _is_type(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _JSON_TYPES.get(name, ()))


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part, {}) if isinstance(node, Mapping) else {}
        return _resolve(node, root) if isinstance(node, Mapping) else {}
    return schema


def _problem(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any]) -> str | None:
    """What is wrong with ``value`` against ``schema`` (None: valid)."""
    schema = _resolve(schema, root)
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            subs = [o for o in options if isinstance(o, Mapping)]
            found = [_problem(value, o, root) for o in subs]
            if all(found):
                kinds = [str(_resolve(o, root).get("type") or "") for o in subs]
                if all(k in _JSON_TYPES and not _is_type(value, k) for k in kinds):
                    return "must be " + " or ".join(kinds)
                return found[0]
    for sub in schema.get("allOf") or []:
        if isinstance(sub, Mapping) and (p := _problem(value, sub, root)):
            return p
    if "const" in schema and value != schema["const"]:
        return f"must be {json.dumps(schema['const'])}"
    if "enum" in schema and value not in schema["enum"]:
        return "must be one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if isinstance(kind, str) else []
    if kinds and not any(_is_type(value, k) for k in kinds):
        return f"must be {' or '.join(kinds)}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"must be at least {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"must be at most {schema['maximum']}"
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            return f"must be more than {schema['exclusiveMinimum']}"
        if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
            return f"must be less than {schema['exclusiveMaximum']}"
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            return f"must have at least {schema['minLength']} characters"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"must have at most {schema['maxLength']} characters"
        pattern = schema.get("pattern")
        if isinstance(pattern, str) and not re.search(pattern, value):
            return f"must match {pattern}"
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            return f"must have at least {schema['minItems']} items"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            return f"must have at most {schema['maxItems']} items"
        items = schema.get("items")
        if isinstance(items, Mapping):
            for i, item in enumerate(value):
                if p := _problem(item, items, root):
                    return f"item {i}: {p}"
    if isinstance(value, dict):
        problems = _object_problems(value, schema, root)
        if problems:
            k, p = next(iter(problems.items()))
            return f"{k}: {p}" if k else p
    return None


def _object_problems(
    value: Mapping[str, Any], schema: Mapping[str, Any], root: Mapping[str, Any]
) -> dict[str, str]:
    out: dict[str, str] = {}
    props = schema.get("properties") or {}
    for name in schema.get("required") or []:
        if name not in value:
            out[name] = "is required"
    extra = schema.get("additionalProperties", True)
    for name, item in value.items():
        if name in props:
            if p := _problem(item, props[name], root):
                out[name] = p
        elif extra is False:
            out[name] = "is not a parameter of this tool"
        elif isinstance(extra, Mapping) and (p := _problem(item, extra, root)):
            out[name] = p
    return out


def check_args(schema: Mapping[str, Any], args: Any) -> dict[str, str]:
    """Check arguments against a tool's JSON schema, strictly (``"5"`` is not an integer,
    ``true`` is not a number); ``{field: problem}``, empty when valid. Covers what pydantic
    writes for a tool's parameters and what MCP servers usually send: ``type``,
    ``required``, ``enum``, ``const``, bounds, lengths, ``pattern``, ``items``,
    ``anyOf``/``oneOf``/``allOf``, local ``$ref`` and ``additionalProperties``."""
    if not isinstance(args, dict):
        return {"": "the arguments must be a JSON object"}
    return _object_problems(args, schema, schema)


def check_edit(gate: Gate, edited: Any) -> dict[str, str]:
    """What is wrong with ``edited`` as the new arguments of ``gate`` (empty: nothing):
    the gate must be editable, every field it does not let a person edit must be unchanged
    (present or absent as before) and the whole must pass the gate's schema."""
    if not gate.editable or gate.args_schema is None:
        return {"": f"{gate.tool} does not allow edits"}
    if gate.quorum is not None:
        return {"": "a call that needs several approvals cannot be edited"}
    if not isinstance(edited, dict):
        return {"": "the arguments must be a JSON object"}
    try:
        size = len(canonical(edited).encode())
    except (TypeError, ValueError):  # lone surrogates (\ud800), objects JSON cannot hold
        return {"": "the arguments must be JSON text that is valid Unicode"}
    if size > MAX_EDIT_BYTES:
        return {"": f"the edited arguments are over {MAX_EDIT_BYTES:,} bytes"}
    out: dict[str, str] = {}
    for name in sorted(set(gate.args) | set(edited)):
        if name in gate.editable:
            if name in gate.args and name not in edited:
                out[name] = "is required"  # the call runs these arguments, all of them
            continue
        if name not in gate.args or name not in edited or edited[name] != gate.args[name]:
            out[name] = "cannot be edited"
    for name, problem in check_args(gate.args_schema, edited).items():
        out.setdefault(name, problem)
    return out


def changes(gate: Gate) -> list[tuple[str, str, str]]:
    """What an edit changed: (field, before, after) as compact JSON ("" when absent)."""
    if gate.edited_args is None:
        return []

    def shown(args: Mapping[str, Any], name: str) -> str:
        return json.dumps(args[name], ensure_ascii=False) if name in args else ""

    names = list(gate.args) + [n for n in gate.edited_args if n not in gate.args]
    return [
        (n, shown(gate.args, n), shown(gate.edited_args, n))
        for n in names
        if gate.args.get(n, ...) != gate.edited_args.get(n, ...)
    ]


async def approve_edited(
    gateway: Gateway,
    gate: str | Gate,
    by: str,
    args: Mapping[str, Any],
    reason: str | None = None,
    *,
    args_hash: str | None = None,
    groups: Sequence[str] = (),
    allow_self_approval: bool = True,
) -> DecideResult:
    """Approve a gate with edited arguments, atomically and exactly once, as
    :meth:`Gateway.decide` approves it (``args_hash``: the original arguments' hash the
    decider was shown). :class:`InvalidEdit` (nothing decided) when the edit is not valid;
    an edit of a gate already decided gets ``applied=False``. Edits equal to the original
    are an ordinary approval. ``gate``: its id, or the :class:`Gate` the caller has just read
    (checked against the edit as it is, and deciding in one round trip, as
    :meth:`Gateway.decide` does with a Gate)."""
    from .deciding import apply_decision
    from .gating import args_hash as hash_of
    from .models import Gate

    if isinstance(gate, str):
        gate_id = gate
        raw = await gateway.redis.hgetall(gateway.keys.gate(gate_id)) if gate_id else {}
        if not raw:
            raise GateNotFound(f"no gate {gate_id[:40]!r}")
        gate = Gate.from_hash(raw)
    gate_id = gate.gate_id
    edited = dict(args)
    problems = check_edit(gate, edited)
    if problems:
        raise InvalidEdit(problems)
    if hash_of(edited) == gate.args_hash:
        edit = None
    else:
        edit = (canonical(edited), hash_of(edited))
    return await apply_decision(
        gateway,
        gate_id,
        "approved",
        by,
        reason,
        args_hash or "",
        run_id=gate.run_id,
        groups=groups,
        allow_self_approval=allow_self_approval,
        edit=edit,
    )


def call_to_run(gate: Gate, call: dict[str, Any], t: Tool) -> tuple[dict[str, Any], str | None]:
    """The call an approved gate runs: ``call`` itself when not edited, else ``call`` with the
    edited arguments, validated again with the tool's own model (strict pydantic, or an MCP
    tool's schema) and hashing to the gate's decided hash. (call, why) when they do not:
    nothing may run, ``why`` is what the model is told."""
    if gate.edited_args is None:
        return call, None
    from .gating import args_hash
    from .messages import edit_not_run

    try:
        args = t.validate(canonical(gate.edited_args))
    except ToolArgumentsError as exc:
        return call, edit_not_run(t.name, str(exc))
    if gate.decided_hash is None or args_hash(args) != gate.decided_hash:
        return call, edit_not_run(t.name, "they do not hash to the approved arguments")
    return {**call, "args": args}, None


def told(gate: Gate) -> str:
    """What the model reads after an edited call's output: who approved which arguments and
    what it asked for (empty when the call was not edited)."""
    if gate.edited_args is None:
        return ""
    from .messages import edited

    return edited(gate.decided_by or "", canonical(gate.edited_args), canonical(gate.args))
