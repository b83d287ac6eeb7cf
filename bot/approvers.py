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

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from agent_core.models import Gate

log = logging.getLogger(__name__)

GROUP_CACHE_SECONDS = 60.0
# A failed lookup is retried sooner than a successful one is refreshed.
GROUP_FAILURE_CACHE_SECONDS = 5.0


class Approvers:
    """Answers "may this user decide?" from the APPROVERS setting."""

    def __init__(
        self,
        spec: Iterable[str],
        client: AsyncWebClient,
        *,
        allow_self_approval: bool = False,
        allow_external: bool = False,
        cache_seconds: float = GROUP_CACHE_SECONDS,
    ) -> None:
        items = [s for s in spec if s]
        self.anyone = "*" in items
        self.users = frozenset(s for s in items if s[0] in "UW")
        self.groups = tuple(s for s in items if s[0] == "S")
        self.allow_self_approval = allow_self_approval
        self.allow_external = allow_external
        self._client = client
        self._cache_seconds = cache_seconds
        self._cache: dict[str, tuple[float, frozenset[str] | None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def configured(self) -> bool:
        return self.anyone or bool(self.users) or bool(self.groups)

    async def is_approver(self, user_id: str, *, external: bool = False) -> bool:
        """``external``: the user belongs to another workspace (Slack Connect), whom ``*``
        covers only with ``allow_external``."""
        if user_id in self.users:
            return True
        if self.anyone and (not external or self.allow_external):
            return True
        for group in self.groups:
            if user_id in await self._members(group):
                return True
        return False

    async def why_not(self, user_id: str, *, external: bool = False) -> str | None:
        """``None`` when the user is an approver, otherwise the reason to show them."""
        if not self.configured:
            return (
                "No approvers are configured (APPROVERS is empty), so nobody can approve "
                "or deny tool calls. Ask your Slack admin to set APPROVERS."
            )
        if await self.is_approver(user_id, external=external):
            return None
        failed = [g for g in self.groups if g in self._cache and self._cache[g][1] is None]
        if failed:
            return (
                "You are not on the approver list, and the approver user group could not be "
                "checked just now. Try again in a moment."
            )
        if self.anyone and external:
            return (
                "Your click came from another workspace (Slack Connect), or did not say which: "
                "only members of this app's workspace may approve or deny here "
                "(ALLOW_EXTERNAL_APPROVERS is off), so nothing was decided."
            )
        return "You are not on the approver list for this agent (APPROVERS)."

    async def why_not_decide(
        self, user_id: str, gate: Gate, *, approve: bool, external: bool = False
    ) -> str | None:
        """``None`` if the user may approve (``approve=True``) or deny this gate.

        Whoever spoke to the agent is a requester: the run's starter and everyone whose
        message the model had read when it asked for the call (thread replies, mentions, down
        through sub-agents). No requester may approve the call unless self-approval is
        enabled. The starter may always deny their own run's call (as they may cancel the
        run). ``external`` as for :meth:`is_approver`.
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
            if user_id in gate.requesters and not await self._why_not_for(user_id, gate, external):
                return (
                    "You spoke to the agent in this run's thread before it asked for this "
                    "call, so you are one of its requesters: someone else has to approve it "
                    "(self-approval is off: ALLOW_SELF_APPROVAL)."
                )
        return await self._why_not_for(user_id, gate, external)

    async def _why_not_for(self, user_id: str, gate: Gate, external: bool) -> str | None:
        """:meth:`why_not`, with the people the gate was escalated to (by user id or user
        group, see :meth:`agent_core.models.Gate.extra_approvers`) counted as approvers."""
        why = await self.why_not(user_id, external=external)
        if why is not None and await self.escalated_to(user_id, gate):
            return None
        return why

    async def escalated_to(self, user_id: str, gate: Gate) -> bool:
        """Whether ``gate`` was escalated to ``user_id``: listed in its ``escalate_to`` by
        user id or through a user group (looked up as APPROVERS' groups are: fails closed)."""
        for ident in gate.extra_approvers():
            if ident == user_id or (ident[:1] == "S" and user_id in await self._members(ident)):
                return True
        return False

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


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SlackApiError):
        return str(exc.response.get("error", "error"))
    return type(exc).__name__
