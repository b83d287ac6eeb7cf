"""The example agents shipped in the package run through the real worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis

from agent_core import GateStatus, RunStatus
from agent_core.examples import support
from agent_core.testing import FakeOpenAI, call, reply, tool_messages
from tests.core.conftest import core_settings
from tests.core.harness import Harness


def told(*parts: str) -> Callable[[list[dict[str, Any]]], None]:
    def check(messages: list[dict[str, Any]]) -> None:
        text = tool_messages(messages)[-1]["content"]
        for p in parts:
            assert p in text, text

    return check


async def test_the_support_example_hands_a_refund_to_billing(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI
) -> None:
    h = Harness(redis, core_settings(redis_url, fake_openai.base_url), support.agent)
    h.start_worker()
    try:
        fake_openai.script(
            "Refund order 7: charged twice",
            [
                call("billing", {"task": "refund order 7 in full (4900 cents): charged twice"}),
                reply("Billing refunded order 7.", expect=told("Refunded 4900 cents.")),
            ],
        )
        fake_openai.script(
            "refund order 7 in full (4900 cents): charged twice",
            [
                call("get_invoice", {"order_id": "7"}),
                call(
                    "refund",
                    {"order_id": "7", "amount_cents": 4900, "reason": "charged twice"},
                ),
                reply(
                    "Refunded 4900 cents.",
                    expect=told("refunded 4900 cents on order 7"),
                ),
            ],
        )
        run = await h.gateway.start_run("Refund order 7: charged twice", requested_by="U1")
        gate = None
        for _ in range(100):
            found = [e for e in await h.events(block_ms=100) if e.type.value == "gate.opened"]
            if found:
                gate = found[0]
                break
        assert gate is not None
        assert gate.data["path"] == ["support", "billing"] and gate.data["tool"] == "refund"
        await h.gateway.decide(gate.data["gate_id"], "approve", by="U2")
        done = await h.wait_finished(run.run_id, timeout=15)
        assert (done.status, done.final) == (RunStatus.COMPLETED, "Billing refunded order 7.")
        [g] = await h.gateway.gates(gate.run_id)
        assert g.status is GateStatus.APPROVED
    finally:
        await h.close()


def test_the_support_example_declares_its_sub_agent_and_rule() -> None:
    names = [a.name for a in support.agent.all_agents()]
    assert names == ["support", "billing"]
    assert [r.name for r in support.agent.approvers] == ["no_mail_at_night"]  # type: ignore[union-attr]
