"""``python -m tests.bench``: run the benchmarks, print the tables, write RESULTS.md.

python -m tests.bench                    # everything (what `make bench` runs)
python -m tests.bench --only pause       # one part: pause, throughput, memory
python -m tests.bench --quick            # a fast smoke run with small counts
python -m tests.bench --out FILE         # where to write the markdown (default RESULTS.md)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import sys
import time
from pathlib import Path

from tests.bench.common import machine, median
from tests.bench.memory import MemoryResult, memory_tables, run_memory_bench
from tests.bench.pause import (
    LANGGRAPH,
    OURS,
    SDK,
    PauseResults,
    commands_table,
    pause_tables,
    run_pause_bench,
)
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
Scenario, the same for every framework: the task (a user message) and N prior messages of
~200 characters (assistant / user alternating) → one model turn that calls `delete_user`,
which needs approval → the run pauses durably → approve → the tool runs → one more model turn
("Done."). The fake model is `agent_core.testing.FakeOpenAI` in a process of its own; every
framework talks to it through its own `AsyncOpenAI` client and to the same private
redis-server. The three frameworks run interleaved in one process (the order rotates every
repetition, `gc.collect()` between repetitions, outside the windows).

- **ours**: a real `agent_core.worker.Worker` (jobs stream, consumer group, lease) on this
  process's event loop, with the production Redis client (`create_redis`). The history is
  written into the run's list beforehand (the writes of `Gateway.start_run`, checked against
  a real one) and the start job is then put on the jobs stream. The decision is
  `Gateway.decide` (the bot's call); its round trips count in "resume".
- **openai-agents**: `function_tool(needs_approval=True)`, `OpenAIChatCompletionsModel`;
  pause = `Runner.run` returns with `interruptions`, then `RunState.to_json()` is stored with
  one `SET` (compact JSON); resume = `GET`, `RunState.from_json`, `approve`, `Runner.run`.
- **langgraph\\***: `StateGraph(MessagesState)` with a `ToolNode` whose tool calls
  `interrupt()`; `ainvoke(..., durability="sync")`, resumed with `Command(resume="approve")`.
  **The checkpointer is not `langgraph-checkpoint-redis`** (it needs Redis Stack, see "What
  could not run") but `tests/bench/lg_saver.py`, a lean saver on plain Redis modelled on
  LangGraph's own savers (a blob per changed channel version, one pipelined round trip per
  checkpoint): it flatters LangGraph. The history is stored in the thread's checkpoint
  beforehand (`aupdate_state`), so its first write is not counted.

Windows (`time.perf_counter`): **pause** = the model's answer received → the pause is durable
(ours: the worker's job finished: gate opened, run `awaiting_approval`, job acknowledged,
lease released; SDK: `SET` returned; LangGraph: `ainvoke` returned the interrupt).
**decision → tool start** = the approve call made → the first line of the tool.
**prep** = the turn's start → the model request (ours: job hand-off, reading the run and its
history). **finish** = tool start → run done, minus the model. **The model round trip**
(time inside `chat.completions.create` of each framework's own client: request building,
HTTP, the fake, parsing) is measured on every call and **subtracted**; it is shown in its
own column. Bytes written and round trips are counted in the client (a redis-py connection
class counting `send_packed_command` calls and bytes; a pipeline is one round trip) and
cross-checked against the server's `INFO` (`total_net_input_bytes`, `commandstats`), whose
own cost is calibrated and subtracted.
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
- The **model round trip** column (excluded from every framework's figures) is, with a
  zero-latency model, mostly CPU spent in the caller by openai-python's
  `chat.completions.create` transforming its parameters (it walks every message): all three
  frameworks pay it, on their event loop. Posting the same body without the transform
  (`client.post("/chat/completions", body=..., cast_to=ChatCompletion)`) costs a small
  fraction of it; item 3's what-if rows show the effect on throughput.
- Ours' **pause** window starts when the model's answer arrives, but the worker still holds
  the decoded history it built the request from; CPython frees it when the model step
  returns, inside the window. That, not Redis, is why the pause grows a little with history:
  bytes written and round trips per pause are constant.
"""

NOT_RUN = """\
- **LangGraph with `langgraph-checkpoint-redis`** could not run: it stores checkpoints with
  RedisJSON and queries them through RediSearch 2.x indexes (`redisvl`, `storage_type:
  json`), i.e. Redis Stack. This machine has Debian 12's `redis-server` 7.0 (no modules);
  Debian has no `redis-stack-server` and no RedisJSON package, and its `redis-redisearch` is
  version 1.2 (no JSON indexes); no PyPI or Debian package ships the Redis Stack server
  or the RedisJSON module (the package lists were searched). The
  `langgraph*` rows use the plain-Redis saver described above instead; read them as a lower
  bound of LangGraph's cost on Redis (the real saver writes JSON documents and index entries).
- Profiling with py-spy works here (root, ptrace allowed); no fallback was needed.
"""


def target_lines(res: PauseResults) -> list[str]:
    lines: list[str] = []
    sizes = res.sizes
    ours = {n: res.of(OURS, n) for n in sizes}
    if not all(ours.values()):
        return lines
    lo, hi = min(sizes), max(sizes)
    p_lo = median([s.pause for s in ours[lo]])
    p_hi = median([s.pause for s in ours[hi]])
    b = [median([s.pause_traffic.bytes_out for s in ours[n]]) for n in sizes]
    rt = [median([s.pause_traffic.round_trips for s in ours[n]]) for n in sizes]
    lines.append(
        "- Bytes written per pause (ours): "
        + ", ".join(f"{x:,.0f} B" for x in b)
        + f" for {', '.join(f'{n:,}' for n in sizes)} messages: "
        + ("**flat**." if max(b) - min(b) <= 64 else "**not flat**.")
    )
    lines.append(
        f"- Round trips per pause (ours): {', '.join(f'{x:.0f}' for x in rt)}: "
        + ("**constant**." if max(rt) == min(rt) else "**not constant**.")
    )
    lines.append(
        f"- Pause time (ours, median): {p_lo * 1000:.2f} ms at {lo:,} messages, "
        f"{p_hi * 1000:.2f} ms at {hi:,} ({p_hi / p_lo:.1f}x). "
        + (
            "**Flat** (within 1.5x)."
            if p_hi <= 1.5 * p_lo
            else "**Not flat**: the Redis work is constant (bytes and round trips above), the "
            "growth is Python freeing the decoded history the model request was built from "
            "(see the notes)."
        )
    )
    lrange = [s.resume_server.by_cmd.get("lrange", 0) for s in ours[hi]]
    lines.append(
        f"- Reads of the history per resume (ours, LRANGE in decision → done): "
        f"{median(lrange):.0f}."
    )
    if 1000 in sizes:
        o = median([s.overhead for s in ours[1000]])
        for fw in (SDK, LANGGRAPH):
            ss = res.of(fw, 1000)
            if ss:
                r = median([s.overhead for s in ss]) / o
                lines.append(
                    f"- At 1,000 messages, pause + resume: {fw} / ours = **{r:.1f}x** "
                    + ("(target ≥ 10x: met)." if r >= 10 else "(target ≥ 10x: **not met**).")
                )
    return lines


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
async def amain(args: argparse.Namespace) -> int:
    parts = set(args.only.split(",")) if args.only else {"pause", "throughput", "memory"}
    quick = args.quick
    t_all = time.perf_counter()
    info = machine()
    sections: list[str] = []
    printed: list[Table] = []

    pause: PauseResults | None = None
    if "pause" in parts:
        sizes = [0, 100, 1000] if quick else [0, 100, 1000, 5000]
        reps = {0: 3, 100: 3, 1000: 3} if quick else {0: 30, 100: 30, 1000: 20, 5000: 10}
        log("1. pause and resume versus history length")
        with RedisServer() as server:
            pause = await run_pause_bench(server.url, sizes, reps, log)
        tables = [*pause_tables(pause), commands_table(pause)]
        printed += tables
        body = [
            "## 1. Pause and resume versus history length\n",
            METHOD_PAUSE,
            "Repetitions per size: "
            + ", ".join(f"{n:,} messages x {r}" for n, r in pause.reps.items())
            + " (p99 is the maximum below 100 samples).\n",
            *(markdown(t) for t in tables),
            "Against the targets:\n",
            "\n".join(target_lines(pause)) + "\n",
        ]
        if pause.skipped:
            body.append(
                "Not run: " + "; ".join(f"{k}: {v}" for k, v in pause.skipped.items()) + "\n"
            )
        sections.append("\n".join(body))

    if "throughput" in parts:
        log("3. throughput and scale-out")
        total, seconds, conc = (300, 4.0, 64) if quick else (3000, 15.0, 64)
        tp = await run_throughput_bench(
            [1, 2, 4],
            whatif_workers=[1] if quick else [1, 2],
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
        sections.append("\n".join(body))

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
        sections.append(
            "\n".join(
                [
                    "## 4. Memory\n",
                    METHOD_MEMORY.format(workers=workers, runs=runs, task=TASK),
                    *(markdown(t) for t in tables),
                    verdict + "\n",
                ]
            )
        )

    minutes = (time.perf_counter() - t_all) / 60
    for t in printed:
        print(markdown(t))
    header = [
        "# Benchmark results\n",
        f"Produced by `make bench` (`.venv/bin/python -m tests.bench"
        f"{' --quick' if quick else ''}{' --only ' + args.only if args.only else ''}`) on "
        f"{datetime.date.today().isoformat()}, in {minutes:.1f} minutes. Everything runs on "
        "this one machine over loopback: a private `redis-server` per part and a zero-latency "
        "fake model, so the figures are the gateway's own cost.\n",
        "**Machine:** "
        + f"{info['cpus']} x {info['cpu']}, {info['memory']} RAM; {info['os']}; "
        + f"Python {info['python']}; Redis {info['redis']}; redis-py {info['redis-py']}; "
        + f"openai {info['openai']}; openai-agents {info['openai-agents']}; "
        + f"langgraph {info['langgraph']}; langchain-openai {info['langchain-openai']}.\n",
    ]
    doc = "\n".join(header + sections + ["## Notes\n", NOTES, "## What could not run\n", NOT_RUN])
    await asyncio.to_thread(Path(args.out).write_text, doc)
    log(f"wrote {args.out} ({minutes:.1f} min)")
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    ap.add_argument("--only", help="comma-separated parts: pause,throughput,memory")
    ap.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    ap.add_argument("--out", default=str(HERE / "RESULTS.md"), help="markdown output file")
    raise SystemExit(asyncio.run(amain(ap.parse_args())))


if __name__ == "__main__":
    main()
