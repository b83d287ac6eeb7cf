"""Who is in the playground's workspace: one channel, four people, one user group, the bot.

The people cover every authorization rule: the requester (who may not approve their own
call), an approver named in APPROVERS, a member of an approver user group, and an outsider.
"""

from __future__ import annotations

from dataclasses import dataclass

TEAM_ID = "T0PGTEAM"
TEAM_NAME = "Playground"
CHANNEL_ID = "C0PGGENERAL"
CHANNEL_NAME = "general"
BOT_USER_ID = "U0PGBOT"
BOT_ID = "B0PGBOT"
BOT_NAME = "agent"
APP_ID = "A0PGAPP"


@dataclass(frozen=True)
class Person:
    id: str
    name: str
    title: str


REQUESTER = Person("U0PGRILEY", "Riley", "requester: starts tasks")
APPROVER = Person("U0PGAVERY", "Avery", "approver (in APPROVERS)")
ON_CALL = Person("U0PGSAM", "Sam", "on-call: in the @oncall approver group")
OUTSIDER = Person("U0PGMORGAN", "Morgan", "outsider: not an approver")
PEOPLE: tuple[Person, ...] = (REQUESTER, APPROVER, ON_CALL, OUTSIDER)

ONCALL_GROUP = "S0PGONCALL"
USERGROUPS: dict[str, tuple[str, str, list[str]]] = {
    # id: (handle, name, members)
    ONCALL_GROUP: ("oncall", "On-call", [ON_CALL.id]),
}

# What the bot's APPROVERS is set to when the person running the playground sets none.
DEFAULT_APPROVERS = f"{APPROVER.id},{ONCALL_GROUP}"


def person(user_id: str) -> Person | None:
    return next((p for p in PEOPLE if p.id == user_id), None)


def display_name(user_id: str) -> str:
    if user_id == BOT_USER_ID:
        return BOT_NAME
    found = person(user_id)
    return found.name if found else user_id
