"""The ``Agent``: instructions, tools and who decides which calls need a human."""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .exceptions import ConfigError
from .tools import Tool

log = logging.getLogger(__name__)

ApprovalPolicy = Literal["none", "all"] | Sequence[str]


@dataclass
class Agent:
    """An agent the worker runs.

    ``approval_policy`` applies only to tools whose own ``requires_approval`` says nothing:
    ``"none"`` gates none of them, ``"all"`` gates all of them, a list gates the named ones.
    ``approval_timeout`` (seconds) falls back to the ``APPROVAL_TIMEOUT`` setting when None;
    ``model`` falls back to ``OPENAI_MODEL``.
    """

    name: str
    instructions: str
    tools: Sequence[Tool | Callable[..., Any]] = ()
    model: str | None = None
    approval_policy: ApprovalPolicy = "none"
    approval_timeout: float | None = None
    _by_name: dict[str, Tool] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        tools: list[Tool] = []
        for t in self.tools:
            tools.append(t if isinstance(t, Tool) else Tool.from_function(t))
        names = [t.name for t in tools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"agent {self.name!r}: duplicate tool names {dupes}")
        policy = self.approval_policy
        if isinstance(policy, str):
            if policy not in ("none", "all"):
                raise ValueError(
                    f"agent {self.name!r}: approval_policy must be 'none', 'all' or a list of "
                    f"tool names, not {policy!r}"
                )
        else:
            unknown = sorted(set(policy) - set(names))
            if unknown:
                raise ValueError(
                    f"agent {self.name!r}: approval_policy names unknown tools {unknown}"
                )
        timeout = self.approval_timeout
        if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(
                f"agent {self.name!r}: approval_timeout must be a positive number of seconds"
            )
        self.tools = tools
        self._by_name = {t.name: t for t in tools}

    def get_tool(self, name: str) -> Tool | None:
        """The tool with that name, or None."""
        return self._by_name.get(name)

    def requires_approval(self, t: Tool, args: dict[str, Any]) -> bool:
        """Whether this call needs a human: the tool's rule first, then the agent's policy.

        A rule that raises gates the call: authorization fails closed.
        """
        rule = t.requires_approval
        if isinstance(rule, bool):
            return rule
        if rule is not None:
            try:
                return bool(rule(dict(args)))
            except Exception:
                log.warning(
                    "approval rule of tool %s raised; gating the call", t.name, exc_info=True
                )
                return True
        policy = self.approval_policy
        if policy == "all":
            return True
        if policy == "none":
            return False
        return t.name in policy

    def openai_tools(self) -> list[dict[str, Any]]:
        """The ``tools`` parameter of a Chat Completions request."""
        return [t.openai_schema() for t in self._by_name.values()]


def load_agent(path: str) -> Agent:
    """Import ``package.module:attribute`` and check that it is an :class:`Agent`.

    Every failure is one :class:`ConfigError` line naming AGENT and the module.
    """
    module_name, _, attr = path.partition(":")
    try:
        obj: object = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise ConfigError(
                f"AGENT is invalid: no module named {module_name!r} (AGENT={path}). The worker "
                "and web processes import it, so it must be on their sys.path: a file or "
                "package in the directory they start from (the repository root with "
                "`make run`), in a directory listed in PYTHONPATH, or installed"
            ) from None
        raise ConfigError(_import_failed(module_name, exc)) from None
    except Exception as exc:
        raise ConfigError(_import_failed(module_name, exc)) from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(
                f"AGENT is invalid: module {module_name!r} has no attribute {attr!r} (AGENT={path})"
            ) from None
    if not isinstance(obj, Agent):
        raise ConfigError(f"AGENT is invalid: {path!r} is a {type(obj).__name__}, not an Agent")
    return obj


def _import_failed(module_name: str, exc: Exception) -> str:
    detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    return (
        f"AGENT is invalid: importing module {module_name!r} failed ({detail}); "
        f"`python -c 'import {module_name}'` shows the traceback"
    )
