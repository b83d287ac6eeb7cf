"""An in-process gateway + worker against the test Redis and the fake OpenAI server."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from openai import AsyncOpenAI
from redis.asyncio import Redis

from agent_core import Agent, Event, Gateway, Keys, Run, RunStatus, Settings
from agent_core.events import parse_event
from agent_core.streams import StreamMessage
from agent_core.worker import Worker


class Harness:
    """Runs workers as tasks of the test's event loop; waits on the events stream."""

    def __init__(self, redis: Redis, settings: Settings, agent: Agent) -> None:
        self.redis = redis
        self.settings = settings
        self.agent = agent
        self.keys = Keys(settings.key_prefix, settings.shards)
        self.gateway = Gateway(redis, self.keys, agent_name=agent.name)
        self.client = AsyncOpenAI(
            api_key="sk-test-not-a-secret",
            base_url=settings.openai_base_url,
            max_retries=0,  # as the worker: the runner retries
        )
        self.workers: list[tuple[Worker, asyncio.Task[None]]] = []
        self._seen: list[Event] = []
        # Every shard's events stream, and how far each has been read.
        self._last = {self.keys.events(s): "0-0" for s in self.keys.all_shards()}

    def start_worker(self) -> Worker:
        w = Worker(self.redis, self.agent, self.client, self.settings)
        self.workers.append((w, asyncio.create_task(w.run())))
        return w

    async def close(self) -> None:
        for w, _ in self.workers:
            w.stop()
        for _, t in self.workers:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(t, 10)
        await self.client.close()

    async def events(self, block_ms: int = 200) -> list[Event]:
        """Every event so far, from every shard (reads what is new, without a consumer group;
        a run's events are in order, those of runs in different shards need not be)."""
        reply = await self.redis.xread(dict(self._last), block=block_ms)
        for stream, entries in reply or []:
            for msg_id, fields in entries:
                self._seen.append(parse_event(StreamMessage(msg_id, fields, 1, stream)))
                self._last[stream] = msg_id
        return self._seen

    async def wait_event(
        self, run_id: str, type_: str, timeout: float = 10.0, **match: Any
    ) -> Event:
        """The first event of that type for the run (with matching data), waiting for it."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            for e in self._seen:
                if (
                    e.run_id == run_id
                    and e.type == type_
                    and all(e.data.get(k) == v for k, v in match.items())
                ):
                    return e
            if loop.time() > end:
                got = [
                    (e.type.value, e.data.get("status")) for e in self._seen if e.run_id == run_id
                ]
                raise AssertionError(f"no {type_} {match} for {run_id} in {timeout}s; saw {got}")
            await self.events(block_ms=100)

    async def wait_finished(self, run_id: str, timeout: float = 10.0) -> Run:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while loop.time() < end:
            await self.events(block_ms=100)
            if any(
                e.run_id == run_id
                and e.type.value in ("run.completed", "run.failed", "run.cancelled")
                for e in self._seen
            ):
                run = await self.gateway.get_run(run_id)
                assert run is not None
                return run
        run = await self.gateway.get_run(run_id)
        raise AssertionError(f"run {run_id} did not finish in {timeout}s: {run}")

    async def opened_gates(self, run_id: str, n: int, timeout: float = 10.0) -> list[Event]:
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            got = [e for e in self._seen if e.run_id == run_id and e.type.value == "gate.opened"]
            if len(got) >= n:
                return got
            if loop.time() > end:
                raise AssertionError(f"{len(got)} gates opened for {run_id}, wanted {n}")
            await self.events(block_ms=100)

    async def history(self, run_id: str) -> list[dict[str, Any]]:
        return await self.gateway.history(run_id)

    async def status(self, run_id: str) -> RunStatus:
        run = await self.gateway.get_run(run_id)
        assert run is not None
        return run.status


def tool_contents(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m.get("role") == "tool"]


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True)
