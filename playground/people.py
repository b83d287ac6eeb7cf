"""Who is in the playground's workspace: two channels, four people, two user groups, the bot.

The people cover every authorization rule: the requester (who may not approve their own
call), an approver named in APPROVERS, a member of an approver user group, and an outsider.
#finance-approvals is an approval channel: route a tool there with APPROVAL_ROUTES, e.g.
``{"send_email": {"channel": "C0PGFINANCE", "approvers": "S0PGFINANCE"}}`` (@finance: Sam).
"""

from __future__ import annotations

from .workspace import Person, UserGroup, Workspace

TEAM_ID = "T0PGTEAM"
TEAM_NAME = "Playground"
CHANNEL_ID = "C0PGGENERAL"
CHANNEL_NAME = "general"
FINANCE_CHANNEL_ID = "C0PGFINANCE"
FINANCE_CHANNEL_NAME = "finance-approvals"
# Every channel, the main one (where people type) first: id → name.
CHANNELS = {CHANNEL_ID: CHANNEL_NAME, FINANCE_CHANNEL_ID: FINANCE_CHANNEL_NAME}
BOT_USER_ID = "U0PGBOT"
BOT_ID = "B0PGBOT"
BOT_NAME = "agent"
APP_ID = "A0PGAPP"


REQUESTER = Person("U0PGRILEY", "Riley", "requester: starts tasks")
APPROVER = Person("U0PGAVERY", "Avery", "approver (in APPROVERS)")
ON_CALL = Person("U0PGSAM", "Sam", "on-call: in the @oncall approver group")
OUTSIDER = Person("U0PGMORGAN", "Morgan", "outsider: not an approver")
PEOPLE: tuple[Person, ...] = (REQUESTER, APPROVER, ON_CALL, OUTSIDER)

ONCALL_GROUP = "S0PGONCALL"
FINANCE_GROUP = "S0PGFINANCE"  # not in APPROVERS: a route names it
USERGROUPS: dict[str, UserGroup] = {
    ONCALL_GROUP: UserGroup(ONCALL_GROUP, "oncall", "On-call", (ON_CALL.id,)),
    FINANCE_GROUP: UserGroup(FINANCE_GROUP, "finance", "Finance", (ON_CALL.id,)),
}

# What the bot's APPROVERS is set to when the person running the playground sets none.
DEFAULT_APPROVERS = f"{APPROVER.id},{ONCALL_GROUP}"


# The workspace the playground's Web API answers about: its channels, these people.
WORKSPACE = Workspace(
    team_id=TEAM_ID,
    team_name=TEAM_NAME,
    bot_user_id=BOT_USER_ID,
    bot_id=BOT_ID,
    bot_name=BOT_NAME,
    app_id=APP_ID,
    url="http://playground.localhost/",
    channels=frozenset(CHANNELS),
    people={p.id: p for p in PEOPLE},
    usergroups=USERGROUPS,
)


def person(user_id: str) -> Person | None:
    return WORKSPACE.people.get(user_id)


def display_name(user_id: str) -> str:
    return WORKSPACE.display_name(user_id)
