"""Agents used by the tests, importable by worker subprocesses (``AGENT=tests.agents:ops``).

Every tool appends a line to the journal file named by ``TEST_JOURNAL`` before and after its
work, so a test sees each side effect, across processes, exactly as many times as it happened.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any, Literal

from agent_core import Agent, ApprovalRequest, Verdict, approve, approver, ask, deny, tool
from agent_core.testing import Step, call, reply, tool_messages


def journal(line: str) -> None:
    path = os.environ.get("TEST_JOURNAL")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_journal(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]
    except FileNotFoundError:
        return []


def told_exactly(text: str) -> Callable[[list[dict[str, Any]]], None]:
    """A model step's ``expect``: the last tool message the model reads is ``text``."""

    def check(messages: list[dict[str, Any]]) -> None:
        assert tool_messages(messages)[-1]["content"] == text

    return check


@tool
def lookup(key: str) -> str:
    """Look something up (never gated)."""
    journal(f"lookup:{key}")
    return f"value of {key}"


@tool(requires_approval=True)
async def delete_user(user_id: str) -> str:
    """Permanently delete a user."""
    journal(f"delete_user:{user_id}")
    return f"user {user_id} deleted"


@tool(requires_approval=lambda args: not args["to"].endswith("@example.com"))
def send_email(to: str, subject: str, body: str) -> str:
    """Send an email."""
    journal(f"send_email:{to}")
    return f"sent to {to}"


@tool
def charge(account: str, amount: int) -> str:
    """Charge an account (gated by the agent's policy list)."""
    journal(f"charge:{account}:{amount}")
    return f"charged {amount} to {account}"


@tool(requires_approval=True)
def transfer(amount: int) -> str:
    """Move money slowly (the test kills the worker while it runs)."""
    journal(f"transfer:start:{amount}")
    time.sleep(float(os.environ.get("TEST_SLOW_SECONDS", "0")))
    journal(f"transfer:end:{amount}")
    return f"transferred {amount}"


@tool(requires_approval=True, idempotent=True)
async def sync_mirror(name: str) -> str:
    """Re-sync a mirror (idempotent: safe to run again after a crash)."""
    journal(f"sync_mirror:start:{name}")
    await asyncio.sleep(float(os.environ.get("TEST_SLOW_SECONDS", "0")))
    journal(f"sync_mirror:end:{name}")
    return f"mirror {name} synced"


@tool
def slow_report(name: str) -> str:
    """Build a report slowly (never gated; runs in a thread)."""
    journal(f"slow_report:start:{name}:{os.getpid()}")
    time.sleep(float(os.environ.get("TEST_SLOW_SECONDS", "0")))
    journal(f"slow_report:end:{name}:{os.getpid()}")
    return f"report {name} built"


@tool
async def blocking_report(name: str) -> str:
    """Build a report while blocking the event loop (a badly written async tool)."""
    journal(f"blocking_report:start:{name}:{os.getpid()}")
    time.sleep(float(os.environ.get("TEST_SLOW_SECONDS", "0")))  # blocks the worker's loop
    journal(f"blocking_report:end:{name}:{os.getpid()}")
    return f"report {name} built"


@tool
def explode(why: str) -> str:
    """Always fails."""
    raise RuntimeError(f"exploded: {why}")


@tool(requires_approval=lambda args: args["x"] / 0 > 1)
def risky(x: int) -> str:
    """Its approval rule raises: the call must be gated (fail closed)."""
    journal(f"risky:{x}")
    return "ok"


ops = Agent(
    name="test-ops",
    instructions="You are a test agent.",
    tools=[
        lookup,
        delete_user,
        send_email,
        charge,
        transfer,
        sync_mirror,
        slow_report,
        blocking_report,
        explode,
        risky,
    ],
    approval_policy=["charge"],
)


@tool(requires_approval=lambda args: not args.get("dry_run", True))
def deploy(env: str, dry_run: bool = True) -> str:
    """Deploy (a real deploy, dry_run=false, needs approval)."""
    journal(f"deploy:{env}:{'dry' if dry_run else 'real'}")
    return f"deployed {env} ({'dry run' if dry_run else 'for real'})"


@tool
def garbled(name: str) -> str:
    """Returns text that is not valid Unicode (a lone surrogate), as a broken decoder may."""
    journal(f"garbled:{name}")
    return "half an emoji: \ud83d"


strict = Agent(
    name="test-strict",
    instructions="You are a test agent.",
    tools=[deploy, garbled, lookup, delete_user, transfer, slow_report],
)


# --- sub-agents: desk → billing → ledger ------------------------------------------------
@tool(requires_approval=True)
def refund(order: int) -> str:
    """Refund an order."""
    journal(f"refund:{order}")
    return f"order {order} refunded"


@tool(requires_approval=True)
def write_off(amount: int) -> str:
    """Write an amount off the books."""
    journal(f"write_off:{amount}")
    return f"{amount} written off"


ledger = Agent(
    name="ledger",
    instructions="You keep the ledger.",
    description="Books entries",
    tools=[write_off, lookup],
)
billing = Agent(
    name="billing",
    instructions="You handle billing.",
    description="Refunds and invoices",
    tools=[refund, transfer, lookup, ledger],
    approval_timeout=float(os.environ.get("TEST_BILLING_TIMEOUT", "30")),
)
desk = Agent(
    name="desk",
    instructions="You are the front desk.",
    description="Front desk",
    tools=[lookup, delete_user, billing.as_tool(description="Ask billing to do something")],
)


# --- approver rules ---------------------------------------------------------------------
@tool(requires_approval=True)
def read_table(env: str, table: str) -> str:
    """Read a table (gated; reads on staging are approved by a rule)."""
    journal(f"read_table:{env}:{table}")
    return f"{table} on {env}: 3 rows"


def staging_reads(call: ApprovalRequest) -> Verdict:
    if call.tool == "read_table" and call.args.get("env") == "staging":
        return approve("reads on staging are fine")
    return ask()


@approver(name="freeze")
async def change_freeze(call: ApprovalRequest) -> Verdict | None:
    if call.tool == "delete_user" and call.args.get("user_id") == "frozen":
        return deny("change freeze until Monday")
    return None  # no opinion: the next rule, then a person


@approver(name="who_asked")
def who_asked(call: ApprovalRequest) -> Verdict | None:
    """Denies deleting the user "shared", naming who asked for it (rules see every requester)."""
    if call.tool == "delete_user" and call.args.get("user_id") == "shared":
        return deny(f"asked by {call.requested_by}; requesters {', '.join(call.requesters)}")
    return None


def broken_rule(call: ApprovalRequest) -> Verdict:
    raise RuntimeError("the rule's backend is down")


@approver(timeout=0.2)
async def slow_rule(call: ApprovalRequest) -> Verdict:
    await asyncio.sleep(5)
    return approve("too late")


ruled = Agent(
    name="ruled",
    instructions="You are a test agent with approval rules.",
    tools=[read_table, delete_user, lookup],
    approvers=[broken_rule, slow_rule, change_freeze, who_asked, staging_reads],
)


# --- more than one approver (agent_core.quorum) -------------------------------------------
@tool(requires_approval=True, approvals=2)
def wire(amount: int) -> str:
    """Wire money out (two distinct approvers)."""
    journal(f"wire:{amount}")
    return f"wired {amount}"


@tool(requires_approval=True, approvals=["S0SRE", "S0SECURITY"])
def rotate_keys(env: str) -> str:
    """Rotate the keys of an environment (one approver from SRE, one from security)."""
    journal(f"rotate_keys:{env}")
    return f"keys of {env} rotated"


@tool(requires_approval=True, approvals=1)
def restart(service: str) -> str:
    """Restart a service (one approver: the tool overrides the agent's two)."""
    journal(f"restart:{service}")
    return f"{service} restarted"


@tool(requires_approval=True)
def purge(table: str) -> str:
    """Purge a table (the agent's quorum: two approvers)."""
    journal(f"purge:{table}")
    return f"{table} purged"


@approver(name="small_wires")
def small_wires(call: ApprovalRequest) -> Verdict | None:
    if call.tool == "wire" and call.args.get("amount", 0) < 100:
        return approve("small amount")
    if call.tool == "rotate_keys" and call.args.get("env") == "staging":
        return approve("staging keys")
    if call.tool == "purge" and call.args.get("table") == "audit":
        return deny("the audit table is never purged")
    return None


@approver(name="anything_goes")
def anything_goes(call: ApprovalRequest) -> Verdict:
    """A second rule that approves everything: never consulted once the first approved."""
    return approve("fine by me")


quorum = Agent(
    name="quorum",
    instructions="You are a test agent whose calls need several approvers.",
    tools=[wire, rotate_keys, restart, purge, lookup],
    approvals=2,
    approvers=[small_wires],
)
quorum_two_rules = Agent(
    name="quorum_two_rules",
    instructions="Two rules that both approve: still one approval.",
    tools=[wire],
    approvers=[small_wires, anything_goes],
)


def quorum_model(messages: list[dict[str, Any]]) -> Step:
    """A scripted model for the ``quorum`` agent (the playground's PLAYGROUND_MODEL in the
    browser tests): it wires 500, then answers with what the tool message said."""
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return reply(str(last.get("content")))
    return call("wire", {"amount": 500})


# --- approval channels: routes of tools and agents (agent_core.routes) ----------------------
FINANCE_CHANNEL = "C0FINANCE"
FINANCE_GROUP = "S0FINANCE"


@tool(requires_approval=True, approvers=FINANCE_GROUP, approval_channel=FINANCE_CHANNEL)
def pay_invoice(invoice: str, amount: int) -> str:
    """Pay an invoice (decided by finance, in the finance channel)."""
    journal(f"pay_invoice:{invoice}:{amount}")
    return f"invoice {invoice} paid ({amount})"


finance = Agent(
    name="finance",
    instructions="You pay invoices.",
    tools=[pay_invoice, delete_user, lookup],
    # delete_user has no route of its own: the agent's approvers decide it, in the thread.
    approver_ids=["U0BOSS"],
)


# --- edit, then approve (agent_core.editing) ---------------------------------------------------
@tool(requires_approval=True, editable=["amount_cents", "reason", "notify", "tags"])
def refund_order(
    order_id: str,
    amount_cents: int,
    reason: Literal["damaged", "late", "other"] = "other",
    notify: bool = True,
    tags: list[str] | None = None,
) -> str:
    """Refund part of an order (an approver may lower the amount)."""
    journal(f"refund_order:{order_id}:{amount_cents}:{reason}:{notify}")
    return f"refunded {amount_cents} on {order_id} ({reason})"


@tool(requires_approval=True, editable=True, idempotent=True)
async def resize_disk(disk: str, size_gb: int) -> str:
    """Resize a disk (idempotent; slow when the test wants it killed while it runs)."""
    journal(f"resize_disk:start:{disk}:{size_gb}")
    await asyncio.sleep(float(os.environ.get("TEST_SLOW_SECONDS", "0")))
    journal(f"resize_disk:end:{disk}:{size_gb}")
    return f"disk {disk} is {size_gb} GB"


@tool(requires_approval=True, editable=True, approvals=2)
def big_wire(amount: int) -> str:
    """A wire that needs two approvers: never editable, whatever the tool says."""
    journal(f"big_wire:{amount}")
    return f"wired {amount}"


researcher = Agent(
    name="researcher",
    instructions="You research a task and answer in one line.",
    tools=[lookup],
)

editing = Agent(
    name="editing",
    instructions="You are a test agent whose approvers may edit calls.",
    tools=[
        refund_order,
        resize_disk,
        big_wire,
        delete_user,
        transfer,
        researcher.as_tool(requires_approval=True, editable=True),
    ],
)


def editing_model(messages: list[dict[str, Any]]) -> Step:
    """A scripted model for the ``editing`` agent (the playground's PLAYGROUND_MODEL in the
    browser tests): it refunds 4900 on A-7, then answers with what the tool message said."""
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return reply(str(last.get("content")))
    return call("refund_order", {"order_id": "A-7", "amount_cents": 4900})


# --- allow for this thread (agent_core.grants) ----------------------------------------------
@tool(requires_approval=True, allow_for=3600)
def ship(env: str, version: int = 1) -> str:
    """Ship a version to an environment (an approver may allow it in the thread for 1 h)."""
    journal(f"ship:{env}:{version}")
    return f"shipped {version} to {env}"


@tool(requires_approval=True, allow_for=3600)
def flush(cache: str) -> str:
    """Flush a cache (grants allowed too)."""
    journal(f"flush:{cache}")
    return f"{cache} flushed"


shipping = Agent(
    name="shipping",
    instructions="You ship releases.",
    tools=[ship, flush, lookup],
)


def shipping_model(messages: list[dict[str, Any]]) -> Step:
    """A scripted model for the ``shipping`` agent (the playground's browser tests): each user
    message ships the version it names to staging, then answers with the tool message."""
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return reply(str(last.get("content")))
    words = str(last.get("content") or "").split()
    version = next((int(w) for w in words if w.isdigit()), 1)
    return call("ship", {"env": "staging", "version": version})


ship_desk = Agent(
    name="ship_desk",
    instructions="You delegate releases to the shipping agent.",
    tools=[lookup, shipping.as_tool(description="Ask the shipping agent")],
)
