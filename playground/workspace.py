"""Who and what a fake Slack workspace holds: its team, the app's bot, people, user groups and
channels, as the Web API (:class:`playground.slack_api.WebApi`) answers about them.

The playground's is fixed (:data:`playground.people.WORKSPACE`: one channel, four people);
the tests' fake Slack uses an open one (every channel exists, people and groups are added by
the test, a channel can be made unreachable).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Person:
    id: str
    name: str
    title: str = ""


@dataclass(frozen=True)
class UserGroup:
    id: str
    handle: str
    name: str
    members: tuple[str, ...]


@dataclass
class Workspace:
    """A workspace (see the module docstring). ``channels`` None: every channel exists;
    ``unreachable``: channel → the error posting there gets (``not_in_channel``);
    ``open_membership``: everyone is in every channel (else only ``people``).

    Channel membership, as Slack answers the app about it: ``bot_not_in`` lists the
    channels the app's bot is not a member of (it cannot post or read there: a public one
    answers ``not_in_channel``, a private one, listed in ``private``, ``channel_not_found``
    as if it did not exist); ``archived`` ones answer ``is_archived`` to posts and updates.
    """

    team_id: str
    team_name: str
    bot_user_id: str
    bot_id: str
    bot_name: str
    app_id: str
    url: str  # auth.test's workspace URL
    channels: frozenset[str] | None = None
    people: dict[str, Person] = field(default_factory=dict)
    usergroups: dict[str, UserGroup] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)
    open_membership: bool = False
    bot_not_in: set[str] = field(default_factory=set)
    private: set[str] = field(default_factory=set)
    archived: set[str] = field(default_factory=set)

    def channel_problem(self, channel: Any, *, write: bool = True) -> str | None:
        """The error Slack gives for posting to (``write``) or reading ``channel``, or None."""
        if not channel or not isinstance(channel, str):
            return "channel_not_found"
        if self.channels is not None and channel not in self.channels:
            return "channel_not_found"
        if channel in self.bot_not_in:
            return "channel_not_found" if channel in self.private else "not_in_channel"
        if write and channel in self.archived:
            return "is_archived"
        return self.unreachable.get(channel)

    def is_member(self, user: str) -> bool:
        """Whether ``user`` can be shown an ephemeral message in the workspace's channels."""
        return bool(user) and (self.open_membership or user in self.people)

    def display_name(self, user_id: str) -> str:
        if user_id == self.bot_user_id:
            return self.bot_name
        found = self.people.get(user_id)
        return found.name if found else user_id

    def user_info(self, user_id: str) -> dict[str, Any] | None:
        """``users.info``'s ``user`` object; None for someone unknown."""
        found = self.people.get(user_id)
        if found is None and user_id != self.bot_user_id:
            return None
        name = self.display_name(user_id)
        return {
            "id": user_id,
            "team_id": self.team_id,
            "name": name.lower(),
            "real_name": name,
            "is_bot": found is None,
            "profile": {
                "real_name": name,
                "display_name": name,
                "title": found.title if found else "",
            },
        }
