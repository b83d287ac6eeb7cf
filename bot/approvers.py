"""Who may decide gates: APPROVERS = user IDs, user-group IDs and/or ``*``.

Authorization fails closed: an empty list approves nobody, and a user group whose members
cannot be looked up counts as empty until the lookup works again. ``*`` means the members of
the app's own workspace: someone from another organization in a Slack Connect channel is
covered only when ALLOW_EXTERNAL_APPROVERS is on (or when listed by user ID or user group).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from agent_core.models import Gate

log = logging.getLogger(__name__)

GROUP_CACHE_SECONDS = 60.0
# A failed lookup is retried sooner than a successful one is refreshed.
GROUP_FAILURE_CACHE_SECONDS = 5.0


@dataclass(frozen=True)
class ApproverList:
    """One list of who may decide: user IDs, user groups, ``*``."""

    anyone: bool
    users: frozenset[str]
    groups: tuple[str, ...]
    of_gate: bool = False  # the gate's own list (its tool's or agent's), not APPROVERS

    @classmethod
    def parse(cls, spec: Iterable[str], *, of_gate: bool = False) -> ApproverList:
        items = [s for s in spec if s]
        return cls(
            "*" in items,
            frozenset(s for s in items if s[0] in "UW"),
            tuple(s for s in items if s[0] == "S"),
            of_gate,
        )

    @property
    def configured(self) -> bool:
        return self.anyone or bool(self.users) or bool(self.groups)


class Approvers:
    """Answers "may this user decide?" from the APPROVERS setting, or from a gate's own
    approvers (its tool's or agent's, recorded in the gate when it opened), which replace
    APPROVERS for that gate."""

    def __init__(
        self,
        spec: Iterable[str],
        client: AsyncWebClient,
        *,
        allow_self_approval: bool = False,
        allow_external: bool = False,
        cache_seconds: float = GROUP_CACHE_SECONDS,
    ) -> None:
        self.default = ApproverList.parse(spec)
        self.allow_self_approval = allow_self_approval
        self.allow_external = allow_external
        self._client = client
        self._cache_seconds = cache_seconds
        self._cache: dict[str, tuple[float, frozenset[str] | None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def anyone(self) -> bool:
        return self.default.anyone

    @property
    def users(self) -> frozenset[str]:
        return self.default.users

    @property
    def groups(self) -> tuple[str, ...]:
        return self.default.groups

    @property
    def configured(self) -> bool:
        return self.default.configured

    def list_for(self, gate: Gate | None) -> ApproverList:
        """Who may decide ``gate``: its own approvers when it has some, else APPROVERS; plus,
        once it was escalated, its ``escalate_to`` (:meth:`Gate.extra_approvers`)."""
        if gate is None:
            return self.default
        base = ApproverList.parse(gate.approvers, of_gate=True) if gate.approvers else self.default
        extra = gate.extra_approvers()
        if not extra:
            return base
        more = ApproverList.parse(extra)
        return ApproverList(
            base.anyone or more.anyone,
            base.users | more.users,
            base.groups + tuple(g for g in more.groups if g not in base.groups),
            base.of_gate,
        )

    async def is_approver(
        self, user_id: str, *, external: bool = False, gate: Gate | None = None
    ) -> bool:
        """``external``: the user belongs to another workspace (Slack Connect), whom ``*``
        covers only with ``allow_external``. ``gate``: judged by its own approvers, if any."""
        who = self.list_for(gate)
        if user_id in who.users:
            return True
        if who.anyone and (not external or self.allow_external):
            return True
        for group in who.groups:
            if user_id in await self._members(group):
                return True
        return False

    async def why_not(
        self, user_id: str, *, external: bool = False, gate: Gate | None = None
    ) -> str | None:
        """``None`` when the user is an approver (of ``gate``, when given), otherwise the
        reason to show them."""
        who = self.list_for(gate)
        if not who.configured:
            return (
                "No approvers are configured (APPROVERS is empty), so nobody can approve "
                "or deny tool calls. Ask your Slack admin to set APPROVERS."
            )
        if await self.is_approver(user_id, external=external, gate=gate):
            return None
        failed = [g for g in who.groups if g in self._cache and self._cache[g][1] is None]
        if failed:
            return (
                "You are not on the approver list, and the approver user group could not be "
                "checked just now. Try again in a moment."
            )
        if who.anyone and external:
            return (
                "Your click came from another workspace (Slack Connect), or did not say which: "
                "only members of this app's workspace may approve or deny here "
                "(ALLOW_EXTERNAL_APPROVERS is off), so nothing was decided."
            )
        if who.of_gate and gate is not None:
            return (
                f"Only the approvers of `{gate.tool}` may decide its calls "
                f"({_mentions(gate.approvers)}), and you are not one of them."
            )
        return "You are not on the approver list for this agent (APPROVERS)."

    async def why_not_decide(
        self, user_id: str, gate: Gate, *, approve: bool, external: bool = False
    ) -> str | None:
        """``None`` if the user may approve (``approve=True``) or deny this gate.

        Who may decide is the gate's own approver list when it has one (its tool's or
        agent's), else APPROVERS. Whoever spoke to the agent is a requester: the run's
        starter and everyone whose message the model had read when it asked for the call
        (thread replies, mentions, down through sub-agents). No requester may approve the
        call unless self-approval is enabled. The starter may always deny their own run's
        call (as they may cancel the run). ``external`` as for :meth:`is_approver`.
        """
        starter = bool(gate.requested_by) and user_id == gate.requested_by
        if not approve and starter:
            return None
        if approve and not self.allow_self_approval:
            if starter:
                return (
                    "You asked for this run, so someone else has to approve its tool calls "
                    "(self-approval is off: ALLOW_SELF_APPROVAL)."
                )
            if user_id in gate.requesters and not await self.why_not(
                user_id, external=external, gate=gate
            ):
                return (
                    "You spoke to the agent in this run's thread before it asked for this "
                    "call, so you are one of its requesters: someone else has to approve it "
                    "(self-approval is off: ALLOW_SELF_APPROVAL)."
                )
        return await self.why_not(user_id, external=external, gate=gate)

    async def quorum_groups(self, user_id: str, gate: Gate) -> list[str]:
        """The user groups of ``gate``'s quorum (agent_core.quorum) that ``user_id`` is in,
        for DECIDE_GATE to fill; a group that cannot be looked up counts as one they are not
        in (fails closed)."""
        if gate.quorum is None:
            return []
        return [g for g in gate.quorum.groups if user_id in await self._members(g)]

    async def _members(self, group: str) -> frozenset[str]:
        cached = self._cache.get(group)
        now = time.monotonic()
        if cached is not None and cached[0] > now:
            return cached[1] if cached[1] is not None else frozenset()
        lock = self._locks.setdefault(group, asyncio.Lock())
        async with lock:
            cached = self._cache.get(group)
            if cached is not None and cached[0] > time.monotonic():
                return cached[1] if cached[1] is not None else frozenset()
            try:
                resp = await self._client.usergroups_users_list(usergroup=group)
                members = frozenset(str(u) for u in (resp.get("users") or []))
                self._cache[group] = (time.monotonic() + self._cache_seconds, members)
                return members
            except Exception as exc:  # fail closed on any lookup problem
                log.warning("could not list members of user group %s: %s", group, _describe(exc))
                self._cache[group] = (time.monotonic() + GROUP_FAILURE_CACHE_SECONDS, None)
                return frozenset()


def _mentions(ids: Iterable[str]) -> str:
    """``<@U1>, <!subteam^S1>, everyone``: how Slack shows each approver."""
    shown = []
    for i in ids:
        if i == "*":
            shown.append("everyone in the workspace")
        elif i.startswith("S"):
            shown.append(f"<!subteam^{i}>")
        else:
            shown.append(f"<@{i}>")
    return ", ".join(shown)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error", "error"))
    return type(exc).__name__
