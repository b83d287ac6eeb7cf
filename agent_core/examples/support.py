"""An example support agent that hands billing questions to a sub-agent.

``support`` answers customers; anything about invoices or refunds goes to the ``billing``
agent (:mod:`agent_core.examples.billing`), called as a tool. Billing's refunds still need a
person: their approval card appears in the support thread, marked "Asked by a sub-agent:
support → billing → refund(...)", and billing's answer becomes support's tool result.

A rule decides some calls before anyone is asked: outward mail is refused at night.
Run it with ``AGENT=agent_core.examples.support:agent`` (the worker serves billing too).
"""

from __future__ import annotations

import datetime as dt

from agent_core import Agent, ApprovalRequest, Verdict, approver, ask, deny
from agent_core.examples import billing, ops


@approver
def no_mail_at_night(call: ApprovalRequest) -> Verdict:
    """Outward mail waits for office hours (08:00 to 18:00 UTC); the rest goes to a person."""
    hour = dt.datetime.now(dt.UTC).hour
    if call.tool == "send_email" and not 8 <= hour < 18:
        return deny("no outward mail outside office hours (08:00 to 18:00 UTC)")
    return ask()


agent = Agent(
    name="support",
    description="Answers customers; hands invoices and refunds to the billing agent.",
    instructions=(
        "You are a customer support assistant. Look customers up with get_user. For "
        "anything about invoices or refunds, ask the billing agent, giving it everything it "
        "needs (order number, amount, reason): it sees nothing else of this conversation. "
        "Report its answer plainly; if something was declined or timed out, say so."
    ),
    tools=[
        ops.get_user,
        ops.send_email,
        billing.agent.as_tool(description="Ask the billing agent about invoices and refunds."),
    ],
    approvers=[no_mail_at_night],
    suggested_prompts=[
        ("Refund an order", "Refund order 7: the customer was charged twice"),
        "Look up user 42",
    ],
)
