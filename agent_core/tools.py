"""The ``@tool`` decorator: a Python function the model may call.

The JSON schema sent to the model is built from the function's type hints and docstring with
pydantic; the model's arguments are validated against the same model before anything else
happens (approval included).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from typing_extensions import Unpack

from .editing import Editable, editable_fields
from .exceptions import ToolArgumentsError, ToolDefinitionError
from .nudges import Nudges, Seconds
from .nudges import seconds as _seconds
from .quorum import ApprovalsOption, check_approvals
from .routes import ApproverIds, approver_ids, channel_id

ApprovalRule = bool | Callable[[dict[str, Any]], bool] | None


class ToolOptions(TypedDict, total=False):
    """The options of :func:`tool` and :meth:`Tool.from_function` beyond the name and the
    description (each explained in :func:`tool`'s docstring)."""

    requires_approval: ApprovalRule
    idempotent: bool
    remind_after: Seconds | None
    escalate_after: Seconds | None
    escalate_to: str | Iterable[str] | None
    approvals: ApprovalsOption
    approvers: ApproverIds
    approval_channel: str | None
    editable: Editable
    allow_for: Seconds | None


MAX_DESCRIPTION_CHARS = 1024

_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$")
_ARG_LINE = re.compile(r"^(\s+)(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def allow_for_option(value: Seconds | None, approvals: ApprovalsOption, where: str) -> float | None:
    """``allow_for=`` in seconds (None: not set here, 0: off); ValueError, one line naming
    ``where``, for a bad value or one combined with a quorum (a grant is one person's
    decision)."""
    seconds = _seconds(value, f"{where}: allow_for")
    if not seconds:
        return seconds
    if approvals is not None and approvals != 1:
        raise ValueError(
            f"{where}: allow_for cannot be combined with approvals={approvals!r} (a grant is "
            "one person's decision; a call that needs several approvers is never granted)"
        )
    return seconds


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {param: description}).

    A parameter's description may continue on lines indented deeper than its name.
    """
    if not doc:
        return "", {}
    desc: list[str] = []
    params: dict[str, list[str]] = {}
    in_args = False
    arg_indent: int | None = None
    current: str | None = None
    for line in inspect.cleandoc(doc).splitlines():
        if _ARGS_HEADER.match(line):
            in_args, arg_indent, current = True, None, None
            continue
        if in_args:
            if not line.strip():
                continue
            indent = len(line) - len(line.lstrip())
            if indent == 0:
                in_args = False  # the section ended: this line is description again
            else:
                m = _ARG_LINE.match(line)
                if current is not None and arg_indent is not None and indent > arg_indent:
                    params[current].append(line.strip())
                elif m and (arg_indent is None or indent == arg_indent):
                    arg_indent, current = indent, m.group(2)
                    params[current] = [m.group(3).strip()]
                continue
        desc.append(line)
    described = {name: " ".join(w for w in words if w) for name, words in params.items()}
    return "\n".join(desc).strip(), described


@dataclass(frozen=True)
class Tool:
    """A function the model may call, with its schema and approval rule."""

    name: str
    description: str
    fn: Callable[..., Any]
    params_model: type[BaseModel]
    requires_approval: ApprovalRule = None
    idempotent: bool = False
    schema: dict[str, Any] = field(default_factory=dict)
    nudges: Nudges = field(default_factory=Nudges)  # reminders, escalation (agent_core.nudges)
    approvals: ApprovalsOption = None  # more than one approver: see agent_core.quorum
    # Who may decide its calls (Slack IDs; empty: the agent's, else APPROVERS) and the
    # channel its cards go to (empty: the agent's, else the task's thread).
    approvers: tuple[str, ...] = ()
    approval_channel: str = ""
    # The parameters a person may edit before approving (agent_core.editing; empty: none).
    editable: tuple[str, ...] = ()
    # Seconds a grant made with an approval lasts ("allow for this thread", agent_core.grants;
    # None: the agent's, 0: no grants).
    allow_for: float | None = None

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        **options: Unpack[ToolOptions],
    ) -> Tool:
        """Describe ``fn`` as a tool (see :func:`tool`)."""
        requires_approval = options.get("requires_approval")
        idempotent = options.get("idempotent", False)
        approvals = options.get("approvals")
        if not callable(fn):
            raise ToolDefinitionError(f"{fn!r} is not callable")
        tool_name = name or getattr(fn, "__name__", None)
        if not isinstance(tool_name, str):
            raise ToolDefinitionError(f"{fn!r} has no __name__: pass name=")
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tool_name):
            raise ToolDefinitionError(f"tool name {tool_name!r} must match [A-Za-z0-9_-]{{1,64}}")
        try:
            nudges = Nudges.of(
                options.get("remind_after"),
                options.get("escalate_after"),
                options.get("escalate_to"),
            )
        except ValueError as exc:
            raise ToolDefinitionError(f"tool {tool_name}: {exc}") from None
        try:
            approvals = check_approvals(approvals, f"tool {tool_name}")
            ids = approver_ids(options.get("approvers"), f"tool {tool_name}: approvers")
            channel = channel_id(
                options.get("approval_channel"), f"tool {tool_name}: approval_channel"
            )
            grant_for = allow_for_option(options.get("allow_for"), approvals, f"tool {tool_name}")
        except ValueError as exc:
            raise ToolDefinitionError(str(exc)) from None
        doc_desc, param_docs = _parse_docstring(inspect.getdoc(fn))
        try:
            hints = inspect.get_annotations(fn, eval_str=True)
        except Exception as exc:
            raise ToolDefinitionError(f"tool {tool_name}: cannot read type hints: {exc}") from exc
        # Pydantic fields get neutral names (p0, p1, ...) and the parameter's name as alias, so
        # that any identifier works as a parameter: json, schema, model_config, _private...
        fields: dict[str, Any] = {}
        for i, (pname, param) in enumerate(inspect.signature(fn).parameters.items()):
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ToolDefinitionError(f"tool {tool_name}: *args/**kwargs are not supported")
            if pname not in hints:
                raise ToolDefinitionError(
                    f"tool {tool_name}: parameter {pname!r} needs a type hint"
                )
            default = ... if param.default is param.empty else param.default

            fields[f"p{i}"] = (
                hints[pname],
                Field(default, alias=pname, description=param_docs.get(pname)),
            )
        try:
            model = create_model(
                f"{tool_name}_args",
                __config__=ConfigDict(extra="forbid"),
                **fields,
            )
            schema = model.model_json_schema()
        except Exception as exc:
            raise ToolDefinitionError(f"tool {tool_name}: {exc}") from exc
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        return cls(
            name=tool_name,
            description=description or doc_desc or tool_name,
            fn=fn,
            params_model=model,
            requires_approval=requires_approval,
            idempotent=idempotent,
            schema=schema,
            nudges=nudges,
            approvals=approvals,
            approvers=ids,
            approval_channel=channel,
            editable=editable_fields(options.get("editable"), schema, f"tool {tool_name}"),
            allow_for=grant_for,
        )

    def openai_schema(self) -> dict[str, Any]:
        """The entry of ``tools`` in a Chat Completions request.

        The description is cut at 1,024 characters: OpenAI and Azure refuse every request of
        an agent with a longer one. The card still shows it in full.
        """
        description = self.description
        if len(description) > MAX_DESCRIPTION_CHARS:
            description = description[: MAX_DESCRIPTION_CHARS - 1] + "…"
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": description,
                "parameters": self.schema,
            },
        }

    def validate(self, raw_arguments: str) -> dict[str, Any]:
        """Parse and validate the model's arguments; :class:`ToolArgumentsError` if invalid.

        Validation is strict (``"false"`` is not a bool, ``"5"`` is not an int) and happens
        once: the result, with defaults filled in, is what the approval rule sees, what the
        card shows, what the arguments hash covers and what the tool is called with.
        """
        try:
            data = json.loads(raw_arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ToolArgumentsError(
                f"arguments are not valid JSON ({exc.msg} at {exc.pos})"
            ) from exc
        except (ValueError, RecursionError) as exc:  # 4,300+ digit numbers, deep nesting
            raise ToolArgumentsError(f"arguments are not usable JSON ({exc})"[:300]) from exc
        if not isinstance(data, dict):
            raise ToolArgumentsError("arguments must be a JSON object")
        try:
            # Lone surrogates (\ud800) parse but cannot be stored, hashed or shown.
            json.dumps(data, ensure_ascii=False).encode()
        except UnicodeEncodeError as exc:
            raise ToolArgumentsError("arguments contain text that is not valid Unicode") from exc
        parsed = self._parse(json.dumps(data))
        return parsed.model_dump(mode="json", by_alias=True)

    def _parse(self, json_text: str) -> BaseModel:
        try:
            return self.params_model.model_validate_json(json_text, strict=True)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}"
                for e in exc.errors(include_url=False)
            )
            raise ToolArgumentsError(f"invalid arguments: {problems}") from exc

    async def call(self, args: Mapping[str, Any]) -> str:
        """Run the tool with arguments returned by :meth:`validate` and return its output.

        Sync functions run in a thread so they never block the worker's event loop.
        """
        parsed = self._parse(json.dumps(dict(args)))
        kwargs = {f.alias or n: getattr(parsed, n) for n, f in type(parsed).model_fields.items()}
        if inspect.iscoroutinefunction(self.fn):
            result = await self.fn(**kwargs)
        else:
            result = await asyncio.to_thread(self.fn, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        if isinstance(result, str):
            return result
        if isinstance(result, BaseModel):
            return result.model_dump_json()
        return json.dumps(result, default=str)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    **options: Unpack[ToolOptions],
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    **options: Unpack[ToolOptions],
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a function (sync or async) into a :class:`Tool`.

    ``requires_approval``: ``True`` always gates, ``False`` never does, a callable decides from
    the call's arguments (a dict; if it raises, the call is gated), ``None`` follows the agent's
    ``approval_policy``. ``idempotent=True`` lets a call left in doubt by a crash run again.
    ``remind_after`` (seconds or a timedelta) reminds the approvers of a gate still pending
    then; ``escalate_after`` lets ``escalate_to`` (user or group ids) decide it too from then
    on (see :mod:`agent_core.nudges`; ``None`` follows the agent, ``0`` turns a step off).
    ``approvals``: more than one approver for a gated call: a number of distinct people
    (``2``), or a list of Slack user-group IDs, one approver from each (default: the agent's).
    ``approvers`` (a Slack ID or a list: users, user groups, ``*``) replace the agent's
    approvers and APPROVERS for this tool's calls; ``approval_channel`` (a channel ID) is where
    their cards are posted, with one line in the task's thread (see :mod:`agent_core.routes`).
    ``editable``: ``True`` or a list of parameters lets an approver edit the arguments before
    approving (**Edit & approve**; see :mod:`agent_core.editing`). Off by default.
    ``allow_for`` (seconds or a timedelta; ``None`` follows the agent, ``0`` is off) lets an
    approver **approve and allow** the tool in the thread for that long: later matching calls
    are approved by the grant (see :mod:`agent_core.grants`); not with ``approvals`` above 1.
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool.from_function(f, name=name, description=description, **options)

    if fn is not None:
        return wrap(fn)
    return wrap
