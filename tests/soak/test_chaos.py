"""Soak: hundreds of runs under random decisions while processes and Redis are killed.

Real ``web`` and two ``worker`` processes, a Redis with an append-only file
(``appendfsync always``), FakeSlack and FakeOpenAI. Runs are started with signed slash
commands; each gate is approved, denied (through the modal) or left to expire, with the clicks
signed and sent to ``web`` like Slack does. Meanwhile workers and ``web`` are SIGKILLed and
restarted at random moments, and Redis is SIGKILLed and restarted from its AOF. Afterwards:

* every run is completed, failed with a reason, or reports an in-doubt call;
* every approved call ran at most once; a denied or expired call never ran;
* every card shows its gate's final outcome, with no live buttons.

``SOAK_SECONDS`` (default 60) sets the chaos phase; ``SOAK_SEED`` reproduces a run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from agent_core import GateStatus, Gateway, Keys, RunStatus
from agent_core.testing import FakeOpenAI, call, reply
from bot import cards
from bot.testing import FakeSlack, SlackClient
from tests.redis_server import RedisServer

REPO = Path(__file__).resolve().parents[2]
SECRET = "soak-signing-secret"
APPROVER = "U0APPROVER"
REQUESTER = "U0REQUESTER"
PREFIX = "soak"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(0)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """A process of ours; killed with SIGKILL by its own PID only."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.p: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out = open(self.log, "ab")
        self.p = subprocess.Popen(self.argv, cwd=REPO, env=self.env, stdout=out, stderr=out)
        out.close()

    def kill(self) -> None:
        if self.p and self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGKILL)
            self.p.wait(10)

    def stop(self) -> None:
        if self.p and self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


async def test_soak(tmp_path: Path) -> None:
    seconds = float(os.environ.get("SOAK_SECONDS", "60"))
    seed = int(os.environ.get("SOAK_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    print(f"\nsoak: seed={seed} seconds={seconds}")
    journal = tmp_path / "journal.txt"
    journal.touch()
    redis_server = RedisServer(appendonly=True).start()
    port = free_port()
    with FakeSlack() as slack, FakeOpenAI() as oai:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", "/tmp"),
            "PYTHONPATH": str(REPO),
            "REDIS_URL": redis_server.url,
            "KEY_PREFIX": PREFIX,
            "OPENAI_API_KEY": "sk-soak",
            "OPENAI_BASE_URL": oai.base_url,
            "OPENAI_MODEL": "fake",
            "OPENAI_MAX_RETRIES": "5",
            "AGENT": "tests.soak.agent:agent",
            "APPROVAL_TIMEOUT": "4",
            "WORKER_LEASE": "1",
            "SWEEP_INTERVAL": "0.2",
            "SOAK_JOURNAL": str(journal),
            "SLACK_BOT_TOKEN": slack.token,
            "SLACK_SIGNING_SECRET": SECRET,
            "SLACK_API_URL": slack.base_url,
            "APPROVERS": APPROVER,
            "PORT": str(port),
        }
        workers = [
            Proc(
                f"worker{i}",
                [sys.executable, "-m", "agent_core.worker"],
                env,
                tmp_path / f"w{i}.log",
            )
            for i in range(2)
        ]
        web = Proc("web", [sys.executable, "-m", "bot"], env, tmp_path / "web.log")
        for p in (*workers, web):
            p.start()
        client = SlackClient(f"http://127.0.0.1:{port}/slack/events", SECRET, fake=slack)
        redis = Redis.from_url(redis_server.url, decode_responses=True)
        keys = Keys(PREFIX)
        gw = Gateway(redis, keys, agent_name="soak")
        counts: Counter[str] = Counter()
        intended: dict[str, str] = {}  # gate id -> approve | deny | expire
        handled: set[str] = set()
        started: list[str] = []
        last_event = "0-0"

        async def send(make: Any) -> bool:
            """One Slack request; False when web or Redis is down right now (retry later)."""
            try:
                res = await make()
            except (TimeoutError, OSError, Exception):  # connection refused while down
                counts["requests_failed"] += 1
                return False
            return res.status == 200

        async def start_run(i: int) -> None:
            task = f"soak task {i}"
            oai.script(task, [call("act", {"op": f"op{i}"}), reply(f"finished {i}")])
            if await send(lambda: client.command(task, user_id=REQUESTER, channel_id="C0SOAK")):
                started.append(task)
                counts["runs_started"] += 1

        async def decide(gate_id: str, how: str) -> None:
            if how == "approve":
                ok = await send(
                    lambda: client.action(cards.APPROVE_ACTION, gate_id, user_id=APPROVER)
                )
            else:
                meta = json.dumps({"gate_id": gate_id, "channel": "C0SOAK"})
                values = {
                    cards.REASON_BLOCK: {
                        cards.REASON_ACTION: {"type": "plain_text_input", "value": "soak says no"}
                    }
                }
                ok = await send(
                    lambda: client.view_submission(
                        cards.DENY_CALLBACK, meta, values=values, user_id=APPROVER
                    )
                )
            if ok:
                handled.add(gate_id)
                counts[f"clicks_{how}"] += 1

        async def poll_gates() -> None:
            nonlocal last_event
            try:
                reply_ = await redis.xread({keys.events(): last_event}, count=500)
            except Exception:
                return
            for _s, entries in reply_ or []:
                for msg_id, fields in entries:
                    last_event = msg_id
                    if fields.get("type") in ("run.completed", "run.failed", "run.cancelled"):
                        counts["runs_seen_done"] += 1
                    if fields.get("type") == "gate.opened":
                        gid = json.loads(fields["data"])["gate_id"]
                        intended[gid] = rng.choices(["approve", "deny", "expire"], [5, 3, 2])[0]

        async def reconnect() -> None:
            nonlocal redis, gw
            await redis.aclose()
            redis = Redis.from_url(redis_server.url, decode_responses=True)
            gw = Gateway(redis, keys, agent_name="soak")

        # --- chaos phase --------------------------------------------------------------
        end = time.monotonic() + seconds
        next_chaos = time.monotonic() + rng.uniform(2, 6)
        next_redis = time.monotonic() + rng.uniform(12, 25)
        i = 0
        while time.monotonic() < end:
            if len(started) - counts["runs_seen_done"] < 40:
                await start_run(i)
                i += 1
            await poll_gates()
            for gid, how in list(intended.items()):
                if gid not in handled and how != "expire" and rng.random() < 0.3:
                    await decide(gid, how)
                # a double click now and then: it must change nothing
                if gid in handled and how == "approve" and rng.random() < 0.002:
                    await send(
                        lambda g=gid: client.action(cards.APPROVE_ACTION, g, user_id=APPROVER)
                    )
                    counts["double_clicks"] += 1
            now = time.monotonic()
            if now >= next_chaos:
                victim = rng.choice([*workers, web])
                victim.kill()
                counts[f"kill_{victim.name.rstrip('01')}"] += 1
                await asyncio.sleep(rng.uniform(0, 0.5))
                victim.start()
                next_chaos = now + rng.uniform(2, 6)
            if now >= next_redis:
                redis_server.kill()
                counts["redis_restarts"] += 1
                await asyncio.sleep(rng.uniform(0.2, 1.0))
                redis_server.start()
                await reconnect()
                next_redis = now + rng.uniform(15, 30)
            await asyncio.sleep(0.05)

        # --- drain: decide what is left, let expiries fire, wait for every run ---------
        for p in workers:
            if p.p is None or p.p.poll() is not None:
                p.start()
        if web.p is None or web.p.poll() is not None:
            web.start()
        drain_end = time.monotonic() + 90
        runs: list[Any] = []
        while time.monotonic() < drain_end:
            await poll_gates()
            for gid, how in list(intended.items()):
                gate = await gw.get_gate(gid)
                if how != "expire" and gate is not None and gate.status is GateStatus.PENDING:
                    await decide(gid, how)
            runs = await gw.runs_for_user(REQUESTER, limit=100_000)
            if runs and all(r.status.finished for r in runs) and len(runs) == len(started):
                # ... and the bot has shown every event (a killed web's pending events are
                # claimed by its successor after the claim idle time).
                groups = {g["name"]: g for g in await redis.xinfo_groups(keys.events())}
                bot = groups.get("bot")
                if bot is not None and bot["pending"] == 0 and bot.get("lag") == 0:
                    break
            await asyncio.sleep(0.5)
        counts["drain_seconds"] = round(90 - (drain_end - time.monotonic()))

        # --- verdict --------------------------------------------------------------------
        violations: list[str] = []
        lines = journal.read_text().splitlines()
        starts = Counter(line.split()[1] for line in lines if line.startswith("start "))
        ends = Counter(line.split()[1] for line in lines if line.startswith("end "))
        if len(runs) != len(started):
            violations.append(f"{len(started)} runs started, {len(runs)} known to Redis")
        for run in runs:
            counts[f"run_{run.status.value}"] += 1
            if not run.status.finished:
                violations.append(f"{run.run_id} still {run.status.value}")
            if run.status is RunStatus.FAILED and not run.error:
                violations.append(f"{run.run_id} failed without a reason")
            for gate in await gw.gates(run.run_id):
                op = gate.args["op"]
                counts[f"gate_{gate.status.value}"] += 1
                if gate.status is GateStatus.APPROVED:
                    if starts[op] > 1:
                        violations.append(f"{op} ran {starts[op]} times")
                    if starts[op] == 1 and ends[op] == 0:
                        counts["in_doubt"] += 1
                        history = await gw.history(run.run_id)
                        if not any("Outcome unknown" in str(m.get("content")) for m in history):
                            if run.status is RunStatus.COMPLETED:
                                violations.append(f"{op} in doubt but the model was not told")
                elif starts[op]:
                    violations.append(f"{op} ran although its gate is {gate.status.value}")
                card = await redis.hgetall(keys.ext("slack-card", gate.gate_id))
                msg = slack.message(card.get("channel", ""), card.get("ts", "")) if card else None
                if msg is None:
                    violations.append(f"gate {gate.gate_id} ({op}) has no card")
                    continue
                if any(
                    b.get("type") == "actions"
                    and any(
                        e.get("action_id") in (cards.APPROVE_ACTION, cards.DENY_ACTION)
                        for e in b.get("elements", [])
                    )
                    for b in msg.blocks
                ):
                    violations.append(f"card of {op} still has live buttons ({gate.status.value})")
                word = {
                    "approved": "Approved",
                    "denied": "Denied",
                    "expired": "Expired",
                    "cancelled": "Cancelled",
                }[gate.status.value]
                if word not in json.dumps(msg.blocks):
                    violations.append(f"card of {op} does not say {word}")
        counts["decisions"] = sum(
            v for k, v in counts.items() if k.startswith("gate_") and k != "gate_pending"
        )
        await redis.aclose()
        for p in (*workers, web):
            p.stop()
        redis_server.close()
        summary = ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        print(f"soak: {summary}, violations={len(violations)}")
        for v in violations[:30]:
            print("  violation:", v)
        assert not violations, f"seed {seed}: {len(violations)} violations"
        assert counts["runs_started"] >= 20
