"""The benchmark's phases: opening the gates, the paced clicks, the bursts, and the
checks after them; waiting for the system to go quiet and reading what happened downstream
(the tools' journal, the gates, the cards).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import redis.asyncio as aioredis

from agent_core import Keys
from tests.bench.slack_fakes import command_task, gate_task
from tests.bench.slack_load import Loader, Request, click_body, clicks_with_doubles, command_body
from tests.bench.slack_procs import (
    APPROVER_A,
    APPROVER_B,
    CHANNEL,
    PASSED_ON,
    PREFIX,
    REQUESTER,
    SECRET,
    CpuMeter,
    Fakes,
    Proc,
    Profiler,
    base_env,
    errors_logged,
    free_port,
    summarize_profile,
    wait_healthy,
)
from tests.bench.slack_report import code_version
from tests.bench.slack_results import Config, Gate, Results, Sample, percentile
from tests.redis_server import RedisServer
from tests.slack_fake import SlackClient


async def bench(cfg: Config, workdir: Path) -> Results:
    res = Results(cfg, code=code_version())
    rng = random.Random(cfg.seed)
    started = time.monotonic()
    total_commands = sum(cfg.command_bursts)
    journal = workdir / "tools.journal"
    keys = Keys(PREFIX)
    procs: list[Proc] = []
    with RedisServer() as redis_server:
        fakes = Fakes(cfg.gates_needed, total_commands, workdir / "fakes.log")
        r = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        loader: Loader | None = None
        try:
            env = base_env(redis_server.url, fakes, journal)
            passed = {k: env[k] for k in PASSED_ON if k in env}
            if passed:
                res.notes.append(f"set for the web and worker processes: {passed}")
            for i in range(cfg.workers):
                procs.append(
                    Proc(
                        f"worker{i}",
                        [sys.executable, "-m", "agent_core.worker"],
                        env,
                        workdir / f"worker{i}.log",
                    )
                )
            port = free_port()
            web_env = env | {
                "SLACK_BOT_TOKEN": "xoxb-test-token",
                "SLACK_SIGNING_SECRET": SECRET,
                "SLACK_API_URL": fakes.slack_api,
                "APPROVERS": f"{APPROVER_A},{APPROVER_B}",
                "PORT": str(port),
            }
            web = Proc("web", [sys.executable, "-m", "bot"], web_env, workdir / "web.log")
            procs.append(web)
            url = f"http://127.0.0.1:{port}"
            await wait_healthy(url, web)
            client = SlackClient(url + "/slack/events", SECRET)
            loader = Loader(client.url)

            def stuck_of(phase: str) -> Callable[[], Awaitable[None]]:
                dump = Path(env["SLACK_BENCH_TASK_DUMP"])
                return lambda: stuck_report(res, phase, r, keys, procs, dump)

            # 1. open the gates through the real slash command, paced

            async def started_runs() -> int:
                return sum(
                    [int(await r.zcard(keys.user_runs(REQUESTER, s))) for s in keys.all_shards()]
                )

            print(f"opening {cfg.gates_needed} gates with /agent at {cfg.open_rate:.0f}/s …")
            opening = [
                Request("command", i, command_body(client, fakes.slack_url, gate_task(i), i))
                for i in range(cfg.gates_needed)
            ]
            name = f"/agent, paced {cfg.open_rate:.0f}/s (opening the gates)"
            mark = errors_logged(procs)
            res.phases[name] = await loader.paced(opening, cfg.open_rate)
            quiet = await wait_quiet(r, keys, timeout=300)
            res.errors[name] = errors_logged(procs, mark)
            res.started[name] = (await started_runs(), len(opening))
            gates = await load_gates(r, keys)
            for _ in range(5):  # set-up must complete: send what did not start again
                missing = [i for i in range(cfg.gates_needed) if i not in gates]
                if not missing:
                    break
                print(f"  {len(missing)} runs did not start; sending them again at 10/s")
                again = [
                    Request("command", i, command_body(client, fakes.slack_url, gate_task(i), i))
                    for i in missing
                ]
                await loader.paced(again, 10)
                await wait_quiet(r, keys, timeout=300)
                gates = await load_gates(r, keys)
            missing = [i for i in range(cfg.gates_needed) if i not in gates]
            if missing:
                raise RuntimeError(f"{len(missing)} gates never opened (first: u{missing[0]})")
            print(f"  all open and carded; quiet {quiet:.1f} s after the last command")
            order = list(range(cfg.gates_needed))
            cursor = 0

            def take(n: int) -> list[Gate]:
                nonlocal cursor
                chunk = [gates[i] for i in order[cursor : cursor + n]]
                cursor += n
                return chunk

            # warm-up: Bolt's first request calls auth.test, connections open, code paths warm
            warm = [
                Request("warmup", g.index, click_body(client, fakes.slack_url, g, APPROVER_A, -1))
                for g in take(cfg.warmup)
            ]
            await loader.paced(warm, 20)
            await wait_quiet(r, keys, timeout=60)

            clicked: list[int] = []
            warmed = {int(w.index) for w in warm}
            # 2a. paced clicks (the main phase, then the sweep of lower rates)
            pids = {p.name: p.pid for p in procs} | {
                "fakes": fakes.pid,
                "redis": redis_server.pid or 0,
                "load generator": os.getpid(),
            }
            for phase_no, (rate, n_clicks) in enumerate(cfg.paced_phases):
                n_dbl = cfg.doubles(n_clicks)
                paced_gates = take(n_clicks - n_dbl)
                reqs = clicks_with_doubles(
                    client, fakes.slack_url, paced_gates, n_dbl, rng, spread=20
                )
                name = f"(a) clicks, paced {rate:.0f}/s"
                if phase_no < cfg.repeat and cfg.repeat > 1:
                    name += f", run {phase_no + 1}/{cfg.repeat}"
                print(f"{name}: {len(reqs)} clicks ({n_dbl} double) …")
                profiler: Profiler | None = None
                if cfg.profile and phase_no == 0:
                    targets = {p.name: p.pid for p in procs}
                    profiler = Profiler(targets, len(reqs) / rate, workdir)
                    await asyncio.sleep(1.0)  # py-spy attaches
                mark = errors_logged(procs)
                meter = CpuMeter(pids)
                samples = await loader.paced(reqs, rate)
                res.cpu[name] = meter.lap()
                res.phases[name] = samples
                clicked += [g.index for g in paced_gates]
                if profiler is not None:
                    for pname, path in profiler.wait().items():
                        res.profiles[pname] = summarize_profile(path)
                await collect_downstream(
                    res, name, samples, paced_gates, journal, fakes, r, keys, stuck_of(name)
                )
                res.cpu_per_click[name] = meter.per(len(reqs))
                res.errors[name] = errors_logged(procs, mark)

            # 2b. bursts of clicks
            for size in cfg.bursts:
                n_dbl = cfg.doubles(size)
                burst_gates = take(size - n_dbl)
                reqs = clicks_with_doubles(
                    client, fakes.slack_url, burst_gates, n_dbl, rng, spread=size
                )
                rng.shuffle(reqs)
                name = f"(b) clicks, burst of {size}"
                print(f"{name} ({n_dbl} double) …")
                mark = errors_logged(procs)
                samples = await loader.burst(reqs)
                res.phases[name] = samples
                clicked += [g.index for g in burst_gates]
                await collect_downstream(
                    res, name, samples, burst_gates, journal, fakes, r, keys, stuck_of(name)
                )
                res.errors[name] = errors_logged(procs, mark)

            # 2b. bursts of slash commands
            first_cmd = 0
            for size in cfg.command_bursts:
                reqs = [
                    Request(
                        "command",
                        i,
                        command_body(client, fakes.slack_url, command_task(i), 100_000 + i),
                    )
                    for i in range(first_cmd, first_cmd + size)
                ]
                first_cmd += size
                name = f"(b) /agent, burst of {size}"
                print(f"{name} …")
                mark = errors_logged(procs)
                before = await started_runs()
                res.phases[name] = await loader.burst(reqs)
                await wait_quiet(r, keys, timeout=300)
                res.errors[name] = errors_logged(procs, mark)
                res.started[name] = (await started_runs() - before, size)

            # checks: every clicked gate decided once, its tool ran exactly once
            j = read_journal(journal)
            once = [i for i in clicked if len(j.get(f"u{i}", [])) == 1]
            res.checks.append(
                (
                    "every clicked gate's tool ran exactly once",
                    len(once) == len(clicked),
                    f"{len(once)}/{len(clicked)}",
                )
            )
            touched = set(clicked) | warmed
            untouched = [i for i in range(cfg.gates_needed) if i not in touched and f"u{i}" in j]
            res.checks.append(
                ("no unclicked gate's tool ran", not untouched, f"{len(untouched)} ran")
            )
            statuses = await gate_statuses(r, keys, [gates[i].gate_id for i in clicked])
            res.checks.append(
                (
                    "every clicked gate is approved, by one of the approvers",
                    all(s == "approved" for s in statuses),
                    dict(collections.Counter(statuses)).__repr__(),
                )
            )
            stats = fakes.stats()
            doubles = sum(1 for s in res.phases.values() for x in s if x.kind == "double")
            res.checks.append(
                (
                    "every double click told 'Already approved by …'",
                    stats["already_decided_replies"] == doubles,
                    f"{stats['already_decided_replies']}/{doubles}",
                )
            )
            bad = [(n, x.status) for n, s in res.phases.items() for x in s if x.status != 200]
            res.checks.append(("every request answered 200", not bad, f"{len(bad)} not 200"))
            res.notes.append(
                "fake Slack calls: "
                + ", ".join(f"{m} {n}" for m, n in sorted(stats["calls"].items()))
            )
            if stats["failed"]:
                res.notes.append(f"failed Slack calls: {stats['failed']}")
            if stats["model_errors"]:
                res.notes.append(f"fake model errors: {stats['model_errors']}")
        finally:
            if loader is not None:
                await loader.close()
            await r.aclose()
            for p in reversed(procs):
                p.stop()
            fakes.stop()
    res.bolt_floor = await bolt_ack_floor()
    res.elapsed = time.monotonic() - started
    return res


async def wait_quiet(
    r: aioredis.Redis,
    keys: Keys,
    timeout: float,
    stuck: Callable[[], Awaitable[None]] | None = None,
) -> float:
    """Until no job and no event is waiting or being handled (three checks in a row); the
    seconds it took. After ``timeout``: ``stuck()`` and -1 when given, else TimeoutError."""
    start = time.monotonic()
    quiet_in_a_row = 0
    while time.monotonic() - start < timeout:
        busy = 0
        for stream in [f(s) for s in keys.all_shards() for f in (keys.jobs, keys.events)]:
            try:
                for g in await r.xinfo_groups(stream):
                    busy += int(g.get("pending") or 0) + int(g.get("lag") or 0)
            except aioredis.ResponseError:
                busy += 1
        quiet_in_a_row = quiet_in_a_row + 1 if busy == 0 else 0
        if quiet_in_a_row >= 3:
            return time.monotonic() - start
        await asyncio.sleep(0.2)
    if stuck is not None:
        await stuck()
        return -1.0
    raise TimeoutError(f"the system did not go quiet within {timeout} s")


async def stuck_report(
    res: Results, name: str, r: aioredis.Redis, keys: Keys, procs: Sequence[Proc], dump: Path
) -> None:
    """The system did not go quiet: record what is pending, and each process's asyncio tasks
    (SIGUSR1: tests/bench/slack_agent.py writes them to ``dump``)."""
    pending: list[str] = []
    streams = [(keys.jobs(s), "workers") for s in keys.all_shards()]
    streams += [(keys.events(s), "bot") for s in keys.all_shards()]
    for stream, group in streams:
        with contextlib.suppress(aioredis.ResponseError):
            for p in await r.xpending_range(stream, group, "-", "+", 5):
                entry = await r.xrange(stream, p["message_id"], p["message_id"])
                kind = entry[0][1].get("type") if entry else "?"
                pending.append(f"{group}: {kind} delivered {p['times_delivered']} times")
    locks = await r.keys("{" + keys.prefix + "*:ext:slack-lock:*")
    res.checks.append(
        (
            f"the system went quiet after {name} (no job or event left pending)",
            False,
            "; ".join(pending) + f"; card locks held: {len(locks)}",
        )
    )
    for p in procs:
        with contextlib.suppress(OSError):
            os.kill(p.pid, signal.SIGUSR1)
    await asyncio.sleep(2)
    kept = _keep_dump(dump)
    print(f"  STUCK after {name}: {'; '.join(pending)}; asyncio tasks: {kept}")


def _keep_dump(dump: Path) -> Path | None:
    """Copy the task dump out of the work directory (which is removed at the end)."""
    if not dump.exists():
        return None
    keep = Path(tempfile.gettempdir()) / f"slack_stuck_tasks_{int(time.time())}.txt"
    keep.write_text(dump.read_text(errors="replace"))
    return keep


def read_journal(path: Path) -> dict[str, list[float]]:
    out: dict[str, list[float]] = collections.defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            name, _, t = line.partition(" ")
            if t:
                out[name].append(float(t))
    return out


async def wait_journal(path: Path, names: set[str], timeout: float) -> dict[str, list[float]]:
    end = time.monotonic() + timeout
    while True:
        j = read_journal(path)
        if names <= j.keys() or time.monotonic() > end:
            return j
        await asyncio.sleep(0.2)


async def load_gates(r: aioredis.Redis, keys: Keys) -> dict[int, Gate]:
    """Every pending gate with its card, by the index in its ``delete_user`` argument."""
    ids = [g for s in keys.all_shards() for g in await r.zrange(keys.deadlines(s), 0, -1)]
    async with r.pipeline(transaction=False) as pipe:
        for gid in ids:
            pipe.hmget(keys.gate(gid), ["args", "args_hash"])
            pipe.hget(keys.ext("slack-card", gid, keys.shard_of(gid)), "ts")
        replies = await pipe.execute()
    out: dict[int, Gate] = {}
    for gid, (args, digest), ts in zip(ids, replies[0::2], replies[1::2], strict=True):
        user_id = json.loads(args or "{}").get("user_id", "")
        if user_id.startswith("u") and ts:
            out[int(user_id[1:])] = Gate(int(user_id[1:]), gid, ts, digest or "")
    return out


async def gate_statuses(r: aioredis.Redis, keys: Keys, gate_ids: list[str]) -> list[str]:
    async with r.pipeline(transaction=False) as pipe:
        for gid in gate_ids:
            pipe.hget(keys.gate(gid), "status")
        return [str(s) for s in await pipe.execute()]


async def collect_downstream(
    res: Results,
    name: str,
    samples: list[Sample],
    gates: Sequence[Gate],
    journal: Path,
    fakes: Fakes,
    r: aioredis.Redis,
    keys: Keys,
    stuck: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Click → tool start, click → card updated and click → card shows the tool's outcome,
    for the first click of each gate."""
    firsts = {s.index: s for s in samples if s.kind == "first"}
    # Quiet = no job or event waiting or in flight: every tool that will run has run.
    if await wait_quiet(r, keys, timeout=120, stuck=stuck) >= 0:
        await wait_journal(journal, {f"u{i}" for i in firsts}, timeout=5)
        await wait_quiet(r, keys, timeout=120, stuck=stuck)
    j = read_journal(journal)
    stats = fakes.stats()
    decided, outcome_at = stats["decided_at"], stats.get("outcome_at", {})
    by_index = {g.index: g for g in gates}
    # The gate's decided_at is Redis' clock (TIME, unix seconds): move it to ours.
    offset = time.time() - time.monotonic()
    async with r.pipeline(transaction=False) as pipe:
        for i in firsts:
            pipe.hget(keys.gate(by_index[i].gate_id), "decided_at")
        decided_unix = dict(zip(firsts, await pipe.execute(), strict=True))
    tool: list[float] = []
    card: list[float] = []
    outcome: list[float] = []
    dec: list[float] = []
    dec_tool: list[float] = []
    for i in firsts:
        # The first click of a double click may lose the race to the second: take the
        # earliest scheduled click on that gate.
        sched = min(x.sched for x in samples if x.index == i)
        at = float(decided_unix[i]) - offset if decided_unix.get(i) else None
        if at is not None:
            dec.append(at - sched)
        if f"u{i}" in j:
            tool.append(min(j[f"u{i}"]) - sched)
            if at is not None:
                dec_tool.append(min(j[f"u{i}"]) - at)
        t = decided.get(f"{CHANNEL}|{by_index[i].card_ts}")
        if t is not None:
            card.append(t - sched)
        t = outcome_at.get(f"{CHANNEL}|{by_index[i].card_ts}")
        if t is not None:
            outcome.append(t - sched)
    res.tool_start[name] = tool
    res.card_shown[name] = card
    res.outcome_shown[name] = outcome
    res.decided[name] = dec
    res.decided_to_tool[name] = dec_tool


async def bolt_ack_floor(n: int = 300) -> dict[str, tuple[float, float]]:
    """Bolt's own time to answer a click whose listener does nothing but ack(), both ways.

    With ``process_before_response=False`` (what bot/app.py uses) Bolt runs the listener as a
    task and polls ``ack.response`` every 10 ms (slack_bolt/listener/asyncio_runner.py), so
    the answer waits for the next poll even when ack() was called at once.
    """
    from slack_bolt.async_app import AsyncApp
    from slack_bolt.request.async_request import AsyncBoltRequest
    from slack_sdk.web.async_client import AsyncWebClient

    from tests.slack_fake import FakeSlack

    payload = {
        "type": "block_actions",
        "user": {"id": APPROVER_A},
        "team": {"id": "T0TEST"},
        "channel": {"id": CHANNEL},
        "container": {"channel_id": CHANNEL},
        "actions": [{"action_id": "gate_approve", "block_id": "b", "value": "x"}],
    }
    body = urlencode({"payload": json.dumps(payload)})
    headers = {"content-type": ["application/x-www-form-urlencoded"]}
    out: dict[str, tuple[float, float]] = {}
    with FakeSlack() as fake:  # answers Bolt's one auth.test
        for before in (False, True):
            app = AsyncApp(
                client=AsyncWebClient(token=fake.token, base_url=fake.base_url),
                signing_secret=SECRET,
                request_verification_enabled=False,
                process_before_response=before,
            )

            @app.action("gate_approve")
            async def approve(ack: Any) -> None:
                await ack()

            times: list[float] = []
            for _ in range(n + 5):
                t0 = time.perf_counter()
                resp = await app.async_dispatch(AsyncBoltRequest(body=body, headers=headers))
                times.append(time.perf_counter() - t0)
                assert resp.status == 200
            times = times[5:]  # the first one also runs auth.test
            name = f"process_before_response={before}" + (" (bot/app.py)" if not before else "")
            out[name] = (percentile(times, 50), percentile(times, 99))
    return out
