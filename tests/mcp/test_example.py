"""The shipped example (``AGENT=agent_mcp.example:agent``) in a real worker process."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from redis.asyncio import Redis

from agent_core import Decision, RunStatus
from agent_core.testing import FakeOpenAI, call, reply
from agent_mcp import example
from tests.core.conftest import core_settings
from tests.core.harness import Harness
from tests.core.workers import WorkerProcess, worker_env
from tests.mcp.test_flow import told


def example_servers(notes_file: Path) -> list[int]:
    """The PIDs of the example servers keeping this notes file."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if (
                b"example_server.py" in (proc / "cmdline").read_bytes()
                and str(notes_file).encode() in (proc / "environ").read_bytes()
            ):
                pids.append(int(proc.name))
        except (OSError, ValueError):
            continue
    return pids


def notes_in(path: Path) -> list[int]:
    return [n["id"] for n in json.loads(path.read_text())]


async def test_the_example_deletes_a_note_only_once_approved(
    redis: Redis, redis_url: str, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    notes_file = tmp_path / "notes.json"
    env = worker_env(
        redis_url,
        fake_openai.base_url,
        tmp_path / "journal.txt",
        AGENT="agent_mcp.example:agent",
        NOTES_FILE=str(notes_file),
    )
    worker = WorkerProcess(env, tmp_path / "worker.log")
    observer = Harness(redis, core_settings(redis_url, fake_openai.base_url), example.agent)
    try:
        fake_openai.script(
            "Delete the note about the bank.",
            [
                call("list_notes", {}),
                call("delete_note", {"note_id": 2}),
                reply("Deleted note 2 (the bank call)."),
            ],
        )
        run = await observer.gateway.start_run("Delete the note about the bank.", "U1")
        [opened] = await observer.opened_gates(run.run_id, 1, timeout=30)
        assert (opened.data["tool"], opened.data["args"]) == ("delete_note", {"note_id": 2})
        assert notes_in(notes_file) == [1, 2, 3]
        await observer.gateway.decide(opened.data["gate_id"], Decision.APPROVE, by="U2")

        done = await observer.wait_finished(run.run_id, timeout=20)
        assert (done.status, done.final) == (RunStatus.COMPLETED, "Deleted note 2 (the bank call).")
        listed = (
            "1. Water the plants on Friday\n"
            "2. Call the bank about the duplicate card charge\n"
            "3. Draft the release notes for v2"
        )
        task = "Delete the note about the bank."
        assert told(fake_openai, task, 1) == [listed]
        assert told(fake_openai, task, 2) == [
            listed,
            "Deleted note 2: Call the bank about the duplicate card charge",
        ]
        assert notes_in(notes_file) == [1, 3]
        assert len(example_servers(notes_file)) == 1
        assert worker.stop() == 0  # SIGTERM: the worker closes its toolsets...
        assert example_servers(notes_file) == []  # ...and so stops the server it started
    finally:
        if worker.proc.poll() is None:
            worker.kill()
        for pid in example_servers(notes_file):
            os.kill(pid, signal.SIGKILL)
        await observer.close()
