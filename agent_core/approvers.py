"""Approver callbacks: rules that decide a gated call before a person is asked.

An agent's ``approvers`` run in order when a call needs approval; the first that does not
answer :func:`ask` decides, and the decision is recorded as made by ``rule:<name>`` (the
card shows the rule, the model is told which rule decided and why). A rule that raises,
times out or returns something else than a verdict asks a person: a broken rule never
approves anything.

::

    @approver
    def reads_on_staging(call: ApprovalRequest) -> Verdict:
        if call.args.get("env") == "staging" and call.tool.startswith("get_"):
            return approve("reads on staging are fine")
        return ask()
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

log = logging.getLogger(__name__)

RULE_PREFIX = "rule:"


@dataclass(frozen=True)
class ApprovalRequest:
    """The call a rule is asked about."""

    tool: str
    args: dict[str, Any]
    agent: str
    run_id: str
    requested_by: str  # the primary requester: the top run's starter
    path: list[str] = field(default_factory=list)
    origin: dict[str, Any] = field(default_factory=dict)
    # Everyone whose message the model had read when it asked for the call, the primary first.
    requesters: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Verdict:
    """What a rule answers: approve, deny (with a reason) or ask a person."""

    decision: Literal["approve", "deny", "ask"]
    reason: str | None = None


def approve(reason: str | None = None) -> Verdict:
    """Approve the call without asking anyone."""
    return Verdict("approve", reason)


def deny(reason: str) -> Verdict:
    """Deny the call; the reason reaches the model and the card."""
    if not reason or not reason.strip():
        raise ValueError("deny() needs a reason: the model and the card show it")
    return Verdict("deny", reason)


def ask() -> Verdict:
    """Leave the call to a person (or to the next rule)."""
    return Verdict("ask")


RuleFn = Callable[[ApprovalRequest], "Verdict | Awaitable[Verdict | None] | None"]


@dataclass(frozen=True)
class Approver:
    """A named rule (see :func:`approver`)."""

    name: str
    fn: RuleFn
    timeout: float = 5.0

    async def verdict(self, request: ApprovalRequest) -> Verdict:
        """The rule's answer; :func:`ask` when it raises, times out or answers nonsense."""
        try:
            if inspect.iscoroutinefunction(self.fn):
                result = await asyncio.wait_for(self.fn(request), self.timeout)
            else:
                result = await asyncio.wait_for(asyncio.to_thread(self.fn, request), self.timeout)
                if inspect.isawaitable(result):
                    result = await asyncio.wait_for(result, self.timeout)
        except TimeoutError:
            log.warning(
                "approver %s took longer than %.1f s: asking a person", self.name, self.timeout
            )
            return ask()
        except Exception:
            log.warning("approver %s raised: asking a person", self.name, exc_info=True)
            return ask()
        if result is None:
            return ask()
        if not isinstance(result, Verdict):
            log.warning(
                "approver %s returned %s, not a Verdict: asking a person",
                self.name,
                type(result).__name__,
            )
            return ask()
        return result


@overload
def approver(fn: RuleFn, /) -> Approver: ...


@overload
def approver(*, name: str | None = None, timeout: float = 5.0) -> Callable[[RuleFn], Approver]: ...


def approver(
    fn: RuleFn | None = None, /, *, name: str | None = None, timeout: float = 5.0
) -> Approver | Callable[[RuleFn], Approver]:
    """Turn a function (sync or async) of an :class:`ApprovalRequest` into a named rule."""

    def wrap(f: RuleFn) -> Approver:
        return as_approver(f, name=name, timeout=timeout)

    return wrap(fn) if fn is not None else wrap


def as_approver(
    rule: Approver | RuleFn, *, name: str | None = None, timeout: float = 5.0
) -> Approver:
    if isinstance(rule, Approver):
        return rule
    if not callable(rule):
        raise ValueError(f"an approver must be callable, not {rule!r}")
    rule_name = str(name or getattr(rule, "__name__", ""))
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", rule_name):
        raise ValueError(f"approver name {rule_name!r} must match [A-Za-z0-9_.-]{{1,64}}")
    if not timeout > 0:
        raise ValueError("an approver's timeout must be positive")
    return Approver(rule_name, rule, timeout)


async def consult(
    rules: Sequence[Approver], request: ApprovalRequest
) -> tuple[Verdict, str] | None:
    """The first verdict that is not :func:`ask`, with the rule's name; None: ask a person."""
    for rule in rules:
        v = await rule.verdict(request)
        if v.decision != "ask":
            return v, rule.name
    return None


def rule_name(decided_by: str | None) -> str | None:
    """The rule's name when a rule decided (``rule:<name>``), else None."""
    if decided_by and decided_by.startswith(RULE_PREFIX):
        return decided_by[len(RULE_PREFIX) :]
    return None
