"""mkdocs hook: the configuration reference, generated at build time from the settings.

``docs/operations/configuration.md`` holds markers (``<!-- settings: core -->``, ``slack``,
``playground``); each becomes a table of the variables that part reads, built from the same
texts as the configuration error lines and ``--help``: the ``Field`` descriptions of
``agent_core.settings.Settings`` and ``bot.settings.BotSettings`` (their defaults too), and
the playground's ``HELP``. A page that names a marker this hook does not know fails the build.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

# The settings of this checkout, not of some installed copy.
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

MARKER = re.compile(r"<!-- settings: (\w+) -->")


def _default(model: type[BaseModel], field: FieldInfo, required_by: type[BaseModel] | None) -> str:
    name = next(n for n, f in model.model_fields.items() if f is field)
    if field.is_required() or (field.default is None and field.validate_default):
        return "required"
    if required_by is not None and required_by.model_fields[name].is_required():
        return "unset (required by `agent-worker`)"
    value: Any = field.default
    if value is None:
        return "unset"
    if isinstance(value, SecretStr):
        return "set"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if value == "":
        return "empty"
    return f"`{value}`"


def _variable(name: str, field: FieldInfo) -> str:
    alias = field.validation_alias
    return alias if isinstance(alias, str) else name.upper()


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def model_table(model: type[BaseModel], required_by: type[BaseModel] | None = None) -> str:
    """A Markdown table of every variable ``model`` reads: name, default, description."""
    rows = ["| variable | default | what it is for |", "|---|---|---|"]
    for name, field in model.model_fields.items():
        if not field.description:
            raise ValueError(f"{model.__name__}.{name} has no description")
        rows.append(
            f"| `{_variable(name, field)}` | {_default(model, field, required_by)} "
            f"| {_escape(field.description)} |"
        )
    return "\n".join(rows)


def help_table(texts: dict[str, str]) -> str:
    rows = ["| variable | what it is for |", "|---|---|"]
    for names, text in texts.items():
        shown = ", ".join(f"`{n.strip()}`" for n in names.split(","))
        rows.append(f"| {shown} | {_escape(text)} |")
    return "\n".join(rows)


def table(kind: str) -> str:
    if kind == "core":
        from agent_core.settings import Settings, _WorkerSettings

        return model_table(Settings, _WorkerSettings)
    if kind == "slack":
        from bot.settings import BotSettings

        return model_table(BotSettings)
    if kind == "playground":
        from playground.launcher import HELP

        return help_table(HELP)
    raise ValueError(f"unknown settings marker {kind!r}")


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return MARKER.sub(lambda m: table(m.group(1)), markdown)
