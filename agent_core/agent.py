"""The ``Agent``: instructions, tools and who decides which calls need a human."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .approvers import Approver, RuleFn, as_approver
from .exceptions import ConfigError
from .nudges import Nudges, Seconds
from .quorum import ApprovalsOption, check_approvals
from .routes import ApproverIds, approver_ids, channel_id
from .tools import Tool, allow_for_option
from .toolsets import Toolset

log = logging.getLogger(__name__)

ApprovalPolicy = Literal["none", "all"] | Sequence[str]
# A suggested prompt: the text itself, or (title shown, message sent).
SuggestedPrompt = str | tuple[str, str]
MAX_SUGGESTED_PROMPTS = 4  # Slack shows at most four in an assistant thread


def _ask_sub_agent(task: str) -> str:  # the schema of every sub-agent tool
    """Args:
    task: What to ask, in full: the sub-agent sees nothing else of this conversation.
    """
    raise NotImplementedError


@dataclass(frozen=True)
class AgentTool(Tool):
    """A tool that runs another agent as a child run (see :meth:`Agent.as_tool`).

    The worker never calls it like a function: the call starts a child run in Redis, whose
    final answer becomes the call's result.
    """

    agent: Agent | None = None

    async def call(self, args: Any) -> str:
        raise RuntimeError(f"{self.name} is a sub-agent: the runner starts it as a child run")


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
    tools: Sequence[Tool | Agent | Callable[..., Any]] = ()
    model: str | None = None
    approval_policy: ApprovalPolicy = "none"
    approval_timeout: float | None = None
    description: str = ""
    """One line on what the agent does: ``/agent help``, and a sub-agent tool's default."""
    suggested_prompts: Sequence[SuggestedPrompt] = ()
    """Offered when someone opens the agent's assistant thread in Slack (at most four)."""
    toolsets: Sequence[Toolset] = ()
    """Sources of more tools, opened by the worker (MCP servers)."""
    approvers: Sequence[Approver | RuleFn] = ()
    """Rules consulted, in order, before a person is asked (see :mod:`agent_core.approvers`)."""
    remind_after: Seconds | None = None
    """Remind the approvers of a gate still pending this long (tools may set their own)."""
    escalate_after: Seconds | None = None
    """Let ``escalate_to`` decide a gate still pending this long (see :mod:`agent_core.nudges`)."""
    escalate_to: str | Sequence[str] | None = None
    """Who an escalated gate goes to as well: user or group ids."""
    nudges: Nudges = field(init=False, repr=False, default_factory=Nudges)
    approvals: ApprovalsOption = None
    """How many approvers a gated call needs, for tools that set none (see
    :mod:`agent_core.quorum`): a number of distinct people, or user-group IDs."""
    allow_for: Seconds | None = None
    """How long an approver may allow a gated call's tool in its thread, for tools that set
    none (see :mod:`agent_core.grants`; ``0`` or unset: no grants)."""
    approver_ids: ApproverIds = ()
    """Who may decide this agent's calls (Slack IDs: users, user groups, ``*``), instead of
    APPROVERS; a tool's own ``approvers`` replace these (see :mod:`agent_core.routes`)."""
    approval_channel: str = ""
    """The channel (ID) its cards are posted in, with one line in the task's thread; a
    tool's own ``approval_channel`` wins. Empty: the task's thread."""
    parallel_tool_calls: bool = True
    """Run the approved calls of one model turn together, as the OpenAI API's parallel tool
    calls are meant (and as the Agents SDK and LangGraph's ToolNode run them): a resume
    claims them in one step with the lease and starts them at once. ``False`` runs them one
    at a time in call order, each claimed just before it starts (a round trip per call)."""
    _by_name: dict[str, Tool] = field(init=False, repr=False, default_factory=dict)
    _own: dict[str, Tool] = field(init=False, repr=False, default_factory=dict)
    _version: tuple[int, ...] = field(init=False, repr=False, default=())

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError("an agent needs a name")
        tools: list[Tool] = []
        for t in self.tools:
            if isinstance(t, Agent):
                tools.append(t.as_tool())
            else:
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
        elif not self.toolsets:  # a toolset's tools are known only once it is open
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
        try:
            self.nudges = Nudges.of(self.remind_after, self.escalate_after, self.escalate_to)
        except ValueError as exc:
            raise ValueError(f"agent {self.name!r}: {exc}") from None
        prompts = list(self.suggested_prompts)
        if len(prompts) > MAX_SUGGESTED_PROMPTS:
            raise ValueError(
                f"agent {self.name!r}: at most {MAX_SUGGESTED_PROMPTS} suggested prompts"
            )
        for p in prompts:
            texts = (p,) if isinstance(p, str) else p
            if not (
                isinstance(texts, tuple)
                and len(texts) in (1, 2)
                and all(isinstance(x, str) and x.strip() for x in texts)
            ):
                raise ValueError(
                    f"agent {self.name!r}: a suggested prompt is a text or (title, message)"
                )
        self.approvals = check_approvals(self.approvals, f"agent {self.name!r}")
        self.allow_for = allow_for_option(self.allow_for, self.approvals, f"agent {self.name!r}")
        self.approver_ids = approver_ids(self.approver_ids, f"agent {self.name!r}: approver_ids")
        self.approval_channel = channel_id(
            self.approval_channel, f"agent {self.name!r}: approval_channel"
        )
        rules = [as_approver(r) for r in self.approvers]
        rule_names = [r.name for r in rules]
        if len(set(rule_names)) != len(rule_names):
            raise ValueError(f"agent {self.name!r}: two approvers share a name")
        self.approvers = rules
        names_seen = [ts.name for ts in self.toolsets]
        if len(set(names_seen)) != len(names_seen):
            raise ValueError(f"agent {self.name!r}: two toolsets share a name")
        self.tools = tools
        self._own = {t.name: t for t in tools}
        self._by_name = dict(self._own)
        self._version = self.tools_version

    # --- tools ------------------------------------------------------------------------
    @property
    def tools_version(self) -> tuple[int, ...]:
        """Changes whenever a toolset's tools change."""
        return tuple(ts.version for ts in self.toolsets)

    def _current(self) -> dict[str, Tool]:
        version = self.tools_version
        if version != self._version:
            self._by_name = self._resolve()
            self._version = version
        return self._by_name

    def _resolve(self) -> dict[str, Tool]:
        """Own tools first; a toolset's tool whose name is taken (by an own tool or another
        toolset's) is offered as ``<toolset>_<tool>``."""
        listed = [(ts.name, t) for ts in self.toolsets for t in ts.tools()]
        counts: dict[str, int] = {}
        for _, t in listed:
            counts[t.name] = counts.get(t.name, 0) + 1
        out = dict(self._own)
        for source, t in listed:
            name = t.name
            if name in self._own or counts[name] > 1:
                name = f"{source}_{t.name}"[:64]
            if name in out:
                log.warning(
                    "agent %s: tool %s of %s hidden (name taken)", self.name, t.name, source
                )
                continue
            out[name] = t if name == t.name else dataclasses.replace(t, name=name)
        return out

    def get_tool(self, name: str) -> Tool | None:
        """The tool with that name, or None."""
        return self._current().get(name)

    def tool_names(self) -> list[str]:
        """Every tool the model is offered now."""
        return list(self._current())

    async def open(self) -> None:
        """Open every toolset (the worker does, once), side by side: one slow server does
        not hold up the others."""
        await asyncio.gather(*(ts.open() for ts in self.toolsets))

    async def close(self) -> None:
        """Close every toolset."""
        await asyncio.gather(*(ts.close() for ts in self.toolsets))

    # --- sub-agents -------------------------------------------------------------------
    def as_tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        requires_approval: bool | None = None,
        approvers: ApproverIds = None,
        approval_channel: str | None = None,
        editable: bool | Sequence[str] | None = None,
    ) -> AgentTool:
        """This agent as a tool of another: a call runs it as a child run, whose gates are
        shown on the parent's thread and whose final answer is the call's result
        (``approvers`` and ``approval_channel`` route the call's own gate, as for a tool;
        ``editable=True`` lets an approver edit the task before approving)."""
        base = Tool.from_function(
            _ask_sub_agent,
            name=name or self.name,
            description=description or self.description or f"Ask the {self.name} agent.",
            requires_approval=requires_approval,
            approvers=approvers,
            approval_channel=approval_channel,
            editable=editable,
        )
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(Tool)}
        return AgentTool(**fields, agent=self)

    def sub_agents(self) -> list[Agent]:
        """The agents this one calls as tools (not recursively)."""
        return [t.agent for t in self._own.values() if isinstance(t, AgentTool) and t.agent]

    def all_agents(self) -> Iterator[Agent]:
        """This agent and every agent reachable through sub-agent tools, each once."""
        seen: set[int] = set()
        stack: list[Agent] = [self]
        while stack:
            a = stack.pop()
            if id(a) in seen:
                continue
            seen.add(id(a))
            yield a
            stack.extend(reversed(a.sub_agents()))

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
        return [t.openai_schema() for t in self._current().values()]


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
                "package in the directory they start from, in a directory listed in "
                "PYTHONPATH, or installed"
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
