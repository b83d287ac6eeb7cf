"""An example operations agent: look-ups run freely, destructive or outward calls wait for a human.

The "database" is an in-memory dict so the example runs anywhere; swap the bodies for your own
systems. Run it with ``AGENT=agent_core.examples.ops:agent`` (the default).
"""

from __future__ import annotations

from agent_core import Agent, tool

_USERS: dict[str, dict[str, str]] = {
    "42": {"name": "Ada Lovelace", "email": "ada@example.com", "plan": "pro"},
    "43": {"name": "Alan Turing", "email": "alan@partner.org", "plan": "free"},
}


@tool
def get_user(user_id: str) -> str:
    """Look up a user account by id.

    Args:
        user_id: The account id, e.g. "42".
    """
    user = _USERS.get(user_id)
    return f"{user}" if user else f"no user {user_id}"


@tool(requires_approval=True)
async def delete_user(user_id: str) -> str:
    """Permanently delete a user account. This cannot be undone.

    Args:
        user_id: The account id to delete.
    """
    if _USERS.pop(user_id, None) is None:
        return f"no user {user_id}; nothing deleted"
    return f"user {user_id} deleted"


@tool(requires_approval=lambda args: not str(args["to"]).endswith("@example.com"))
def send_email(to: str, subject: str, body: str) -> str:
    """Send an email. Mail to anyone outside example.com needs approval.

    Args:
        to: Recipient address.
        subject: Subject line.
        body: Plain-text body.
    """
    return f"email to {to} queued ({len(body)} characters)"


agent = Agent(
    name="ops",
    description="Looks up users; deletes accounts and emails outsiders only with approval.",
    instructions=(
        "You are an operations assistant. Use the tools to answer. Some calls need a person's "
        "approval; if a call is declined or times out, report that plainly and do not retry it "
        "unless asked."
    ),
    tools=[get_user, delete_user, send_email],
)
