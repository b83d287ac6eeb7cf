"""One tool of an MCP server, as the agent sees it: schema, validation, result text."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jsonschema
import jsonschema.validators
from mcp import types
from pydantic import BaseModel, ConfigDict

from agent_core import Tool, ToolArgumentsError
from agent_core.tools import ApprovalRule

from .exceptions import MCPToolError

if TYPE_CHECKING:
    from .servers import MCPToolset

MCPApprovalRule = bool | Sequence[str] | Callable[[str, dict[str, Any]], bool] | None
"""A server's ``requires_approval``: ``True``/``False`` for all its tools, a list of tool
names (the server's names) to gate, or a callable on (tool name, arguments); ``None``
leaves every call to the agent's ``approval_policy``."""

MAX_ERRORS_SHOWN = 5
MAX_ERROR_CHARS = 200
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_-]")


class _AnyArguments(BaseModel):
    """Placeholder ``params_model``: an MCP tool validates against its JSON schema."""

    model_config = ConfigDict(extra="allow")


def _remote_only(**kwargs: Any) -> Any:
    raise RuntimeError("an MCP tool runs on its server: call MCPTool.call")


def _offered_name(remote_name: str) -> str:
    """The name the model sees: Chat Completions accepts only ``[A-Za-z0-9_-]{1,64}``."""
    return _NOT_ALLOWED.sub("_", remote_name)[:64] or "_"


@dataclass(frozen=True)
class MCPTool(Tool):
    """A tool listed by an MCP server. ``name`` is what the model sees (prefixed on a
    collision); ``remote_name`` is what the server is called with."""

    remote_name: str = ""
    server: MCPToolset | None = field(default=None, compare=False, repr=False)
    validator: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def from_listing(
        cls, listed: types.Tool, server: MCPToolset, requires_approval: ApprovalRule
    ) -> MCPTool:
        """Describe a tool of ``tools/list``; :class:`jsonschema.SchemaError` when its
        input schema is not a JSON schema."""
        schema = dict(listed.input_schema or {"type": "object", "properties": {}})
        validator_class = jsonschema.validators.validator_for(
            schema, default=jsonschema.Draft202012Validator
        )
        validator_class.check_schema(schema)
        return cls(
            name=_offered_name(listed.name),
            description=listed.description or listed.title or listed.name,
            fn=_remote_only,
            params_model=_AnyArguments,
            requires_approval=requires_approval,
            schema=schema,
            remote_name=listed.name,
            server=server,
            validator=validator_class(schema),
        )

    def validate(self, raw_arguments: str) -> dict[str, Any]:
        """A JSON object valid against the tool's input schema, or :class:`ToolArgumentsError`.

        The arguments are passed on as the model wrote them (the server fills in defaults).
        """
        try:
            data = json.loads(raw_arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ToolArgumentsError(
                f"arguments are not valid JSON ({exc.msg} at {exc.pos})"
            ) from exc
        except (ValueError, RecursionError) as exc:
            raise ToolArgumentsError(f"arguments are not usable JSON ({exc})"[:300]) from exc
        if not isinstance(data, dict):
            raise ToolArgumentsError("arguments must be a JSON object")
        try:
            json.dumps(data, ensure_ascii=False).encode()
        except UnicodeEncodeError as exc:
            raise ToolArgumentsError("arguments contain text that is not valid Unicode") from exc
        try:
            errors = sorted(self.validator.iter_errors(data), key=lambda e: list(e.absolute_path))
        except Exception as exc:  # a $ref the schema cannot resolve, say
            raise ToolArgumentsError(f"the tool's input schema cannot be applied: {exc}") from exc
        if errors:
            problems = [
                f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: "
                f"{e.message[:MAX_ERROR_CHARS]}"
                for e in errors[:MAX_ERRORS_SHOWN]
            ]
            more = len(errors) - MAX_ERRORS_SHOWN
            if more > 0:
                problems.append(f"and {more} more")
            raise ToolArgumentsError("invalid arguments: " + "; ".join(problems))
        return data

    async def call(self, args: Mapping[str, Any]) -> str:
        """Call the tool on its server; the result as text (see :func:`result_text`)."""
        if self.server is None:
            raise RuntimeError(f"{self.name}: no MCP server")
        return await self.server.call_tool(self.remote_name, dict(args))


def _content_text(item: Any) -> str:
    kind = getattr(item, "type", "")
    if kind == "text":
        return str(item.text)
    if kind in ("image", "audio"):
        size = len(item.data) * 3 // 4  # base64
        return f"[{kind}: {item.mime_type}, about {size} bytes, not shown]"
    if kind == "resource_link":
        named = f" ({item.name})" if item.name else ""
        return f"[resource link: {item.uri}{named}]"
    if kind == "resource":
        res = item.resource
        text = getattr(res, "text", None)
        if isinstance(text, str):
            return f"[resource: {res.uri}]\n{text}"
        return f"[resource: {res.uri}, {res.mime_type or 'binary'}, not shown]"
    return f"[{kind or 'unknown'} content, not shown]"


def result_text(result: types.CallToolResult) -> str:
    """What the model reads of a tool result.

    Content items in order, one per line: text as is, images and audio as
    ``[image: <mime type>, about N bytes, not shown]``, resources by URI (a text resource
    with its text). ``structuredContent`` is added as JSON when no item is text (the spec
    has servers repeat it as text). ``isError`` raises :class:`MCPToolError` with that text.
    """
    parts = [_content_text(c) for c in result.content]
    has_text = any(getattr(c, "type", "") == "text" for c in result.content)
    if result.structured_content is not None and not has_text:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(p for p in parts if p)
    if result.is_error:
        raise MCPToolError(text or "the server reported an error without a message")
    return text or "(no output)"
