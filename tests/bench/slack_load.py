"""The load generator's requests: signed slash commands and Approve clicks, exactly as
Slack sends them, paced (open loop) or in bursts.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlencode

import aiohttp

from tests.bench.slack_procs import APPROVER_A, APPROVER_B, CHANNEL, REQUESTER, SECRET
from tests.bench.slack_results import Gate, Sample
from tests.slack_fake import SlackClient, sign


@dataclass
class Request:
    kind: str
    index: int
    body: bytes


class Loader:
    """Sends pre-built, signed requests to /slack/events on a pool of keep-alive connections."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=30),
        )

    async def close(self) -> None:
        await self.session.close()

    @staticmethod
    def headers(body: bytes, timestamp: str) -> dict[str, str]:
        return {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": sign(SECRET, timestamp, body.decode()),
        }

    async def _one(self, req: Request, headers: dict[str, str], sched: float) -> Sample:
        s = Sample(req.kind, req.index, sched, started=time.monotonic())
        try:
            async with self.session.post(self.url, data=req.body, headers=headers) as resp:
                await resp.read()
                s.status = resp.status
        except (aiohttp.ClientError, TimeoutError):
            s.status = 0
        s.done = time.monotonic()
        return s

    def _signed(self, reqs: Sequence[Request]) -> list[dict[str, str]]:
        ts = str(int(time.time()))
        return [self.headers(r.body, ts) for r in reqs]

    async def paced(self, reqs: Sequence[Request], rate: float) -> list[Sample]:
        """Open loop: request k is sent at t0 + k / rate, whatever became of the others."""
        signed = self._signed(reqs)
        tasks: list[asyncio.Task[Sample]] = []
        t0 = time.monotonic() + 0.1
        for k, (req, headers) in enumerate(zip(reqs, signed, strict=True)):
            sched = t0 + k / rate
            delay = sched - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self._one(req, headers, sched)))
        return list(await asyncio.gather(*tasks))

    async def burst(self, reqs: Sequence[Request]) -> list[Sample]:
        """Every request scheduled at the same instant, each on a connection of its own."""
        signed = self._signed(reqs)
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            timeout=aiohttp.ClientTimeout(total=30),
        ) as session:
            own, self.session = self.session, session
            try:
                sched = time.monotonic()
                tasks = [
                    asyncio.create_task(self._one(r, h, sched))
                    for r, h in zip(reqs, signed, strict=True)
                ]
                return list(await asyncio.gather(*tasks))
            finally:
                self.session = own


def click_body(client: SlackClient, slack_url: str, gate: Gate, user: str, n: int) -> bytes:
    payload = client.action_payload(
        "gate_approve",
        gate.button_value,
        user_id=user,
        channel_id=CHANNEL,
        message_ts=gate.card_ts,
        response_url=f"{slack_url}/respond/click{n}",
    )
    return urlencode({"payload": json.dumps(payload)}).encode()


def command_body(client: SlackClient, slack_url: str, task: str, n: int) -> bytes:
    return client.command_body(
        task,
        user_id=REQUESTER,
        channel_id=CHANNEL,
        response_url=f"{slack_url}/respond/cmd{n}",
    ).encode()


def clicks_with_doubles(
    client: SlackClient,
    slack_url: str,
    gates: Sequence[Gate],
    n_doubles: int,
    rng: random.Random,
    *,
    spread: int,
) -> list[Request]:
    """One first click per gate, plus ``n_doubles`` repeat clicks at most ``spread`` slots later."""
    total = len(gates) + n_doubles
    double_slots = set(rng.sample(range(1, total), n_doubles))
    out: list[Request] = []
    firsts: list[Gate] = []
    it = iter(gates)
    for k in range(total):
        if k in double_slots and firsts:
            target = rng.choice(firsts[-spread:])
            user = rng.choice([APPROVER_A, APPROVER_B])
            out.append(
                Request("double", target.index, click_body(client, slack_url, target, user, k))
            )
            continue
        g = next(it)
        firsts.append(g)
        out.append(Request("first", g.index, click_body(client, slack_url, g, APPROVER_A, k)))
    assert len(firsts) == len(gates)
    return out
