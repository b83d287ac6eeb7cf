"""An example billing agent: invoices are looked up freely, every refund waits for a human.

The invoices live in an in-memory dict so the example runs anywhere; swap the bodies for your
billing system. Run it beside the operations agent with
``AGENTS=agent_core.examples.ops:agent,agent_core.examples.billing:agent``, then
``/agent billing refund order 7`` in Slack.
"""

from __future__ import annotations

from agent_core import Agent, tool

_INVOICES: dict[str, dict[str, str | int]] = {
    "7": {"customer": "Ada Lovelace", "amount_cents": 4900, "status": "paid"},
    "8": {"customer": "Alan Turing", "amount_cents": 1200, "status": "open"},
}


@tool
def get_invoice(order_id: str) -> str:
    """Look up the invoice of an order.

    Args:
        order_id: The order number, e.g. "7".
    """
    invoice = _INVOICES.get(order_id)
    return f"{invoice}" if invoice else f"no invoice for order {order_id}"


@tool(requires_approval=True)
def refund(order_id: str, amount_cents: int, reason: str) -> str:
    """Refund money to the customer of an order. Money leaves the company: needs approval.

    Args:
        order_id: The order number.
        amount_cents: How much to refund, in cents; at most the invoice's amount.
        reason: Why, in a few words (shown to the approver).
    """
    invoice = _INVOICES.get(order_id)
    if invoice is None:
        return f"no invoice for order {order_id}; nothing refunded"
    paid = int(invoice["amount_cents"])
    if invoice["status"] != "paid" or not 0 < amount_cents <= paid:
        return f"order {order_id}: cannot refund {amount_cents} cents (paid: {paid})"
    invoice["status"] = "refunded"
    return f"refunded {amount_cents} cents on order {order_id}"


agent = Agent(
    name="billing",
    description="Looks up invoices and refunds orders (every refund needs approval).",
    instructions=(
        "You are a billing assistant. Look up the invoice before refunding, and refund at "
        "most what was paid. A refund needs a person's approval; if it is declined or times "
        "out, say so plainly and do not retry it unless asked."
    ),
    tools=[get_invoice, refund],
)
