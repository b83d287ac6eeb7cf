"""``agent-audit`` as a real subprocess against the test's Redis: verify, export (JSON lines
and CSV, filtered), heads, and a verify that fails naming the entry removed in Redis."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
from pathlib import Path

import pytest

from agent_core import Decision
from agent_core.audit import entries
from agent_core.testing import FakeOpenAI, call, reply
from tests.core.harness import Harness
from tests.test_commands import command_line

pytestmark = pytest.mark.timeout(90)


async def audit(h: Harness, *args: str) -> tuple[int, str, str]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "REDIS_URL": h.settings.redis_url,
        "KEY_PREFIX": h.settings.key_prefix,
    }
    proc = await asyncio.create_subprocess_exec(
        *command_line("agent-audit"),
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode or 0, out.decode(), err.decode()


async def decided(h: Harness, fake: FakeOpenAI, task: str, tool: str, args: dict, by: str) -> str:
    fake.script(task, [call(tool, args), reply("done")])
    run = await h.gateway.start_run(task, requested_by="U1")
    [g] = await h.opened_gates(run.run_id, 1)
    await h.gateway.decide(g.data["gate_id"], Decision.APPROVE, by=by)
    await h.wait_finished(run.run_id)
    return str(g.data["gate_id"])


async def test_verify_export_and_heads(
    harness: Harness, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    h = harness
    g1 = await decided(h, fake_openai, "cli 1", "delete_user", {"user_id": "7"}, "U2")
    g2 = await decided(
        h, fake_openai, "cli 2", "send_email", {"to": "a@b.c", "subject": "s", "body": "b"}, "U3"
    )
    code, out, err = await audit(h, "verify")
    assert (code, err) == (0, "")
    assert out == "agent-audit: ok: 6 entries in 16 shards verified\n"

    code, out, _ = await audit(h, "export", "--since", "2026-01-01", "--format", "jsonl")
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert sorted((r["gate_id"], r["kind"]) for r in rows) == sorted(
        (g, k) for g in (g1, g2) for k in ("opened", "approved", "executed")
    )
    code, out, _ = await audit(h, "export", "--tool", "send_email", "--format", "csv")
    table = list(csv.DictReader(io.StringIO(out)))
    assert code == 0
    assert [(r["gate_id"], r["kind"], r["tool"]) for r in table] == [
        (g2, "opened", "send_email"),
        (g2, "approved", "send_email"),
        (g2, "executed", "send_email"),
    ]
    code, out, _ = await audit(h, "export", "--user", "U2")
    assert [(json.loads(x)["gate_id"], json.loads(x)["kind"]) for x in out.splitlines()] == [
        (g1, "approved")
    ]
    code, out, _ = await audit(h, "export", "--until", "2026-01-01")
    assert (code, out) == (0, "")  # nothing before
    code, out, err = await audit(h, "export", "--since", "yesterday")
    assert code == 2 and "is not a date" in err

    code, out, _ = await audit(h, "heads")
    heads = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(heads) == 16
    kept = tmp_path / "heads.jsonl"
    kept.write_text(out)

    # Remove g1's approval from Redis: verify fails (exit 1) naming the entry after it.
    shard = h.keys.shard_of(g1)
    trail = [e async for e in entries(h.redis, h.keys, shard)]
    i = next(n for n, e in enumerate(trail) if e.get("gate_id") == g1 and e.kind == "approved")
    await h.redis.xdel(h.keys.audit(shard), trail[i].id)
    code, out, err = await audit(h, "verify", "--heads", str(kept))
    assert (code, out) == (1, "")
    assert f"BROKEN: shard {shard}: entry {trail[i + 1].id}" in err
    assert f"does not follow entry {trail[i - 1].id}" in err
