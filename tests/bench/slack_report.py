"""The benchmark's report: its tables, printed and written as markdown
(``tests/bench/SLACK_RESULTS.md``), with the code and the machine measured.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from tests.bench.slack_procs import DOUBLE_SHARE, REPO
from tests.bench.slack_results import Results, fmt_ms, percentile


def code_version() -> str:
    """The commit of the code under test, and whether agent_core/ or bot/ differ from it."""

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "agent_core", "bot")
    return commit + (" with uncommitted changes in agent_core/ or bot/" if dirty else "")


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    redis_v = subprocess.run(
        ["redis-server", "--version"], capture_output=True, text=True, check=False
    ).stdout.split()
    version = next((w.split("=", 1)[1] for w in redis_v if w.startswith("v=")), "?")
    pkgs = ", ".join(
        f"{p} {metadata.version(p)}"
        for p in ("slack_bolt", "slack_sdk", "aiohttp", "redis", "uvloop")
    )
    return (
        f"{os.cpu_count()} x {cpu} (nproc {len(os.sched_getaffinity(0))}); "
        f"{platform.platform()}; Python {platform.python_version()}; Redis {version}; {pkgs}"
    )


Table = tuple[list[str], list[list[str]]]


def with_pooled(per_phase: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The phases, with "…, all N runs" (their samples pooled) after the runs of one phase."""
    out: dict[str, list[Any]] = {}
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for name in per_phase:
        if ", run " in name:
            groups[name.split(", run ")[0]].append(name)
    for name, xs in per_phase.items():
        out[name] = xs
        base = name.split(", run ")[0]
        if ", run " in name and groups[base][-1] == name and len(groups[base]) > 1:
            out[f"{base}, all {len(groups[base])} runs"] = [
                x for n in groups[base] for x in per_phase[n]
            ]
    return out


def tables(res: Results) -> list[tuple[str, Table]]:
    ack_rows: list[list[str]] = []
    for name, samples in with_pooled(res.phases).items():
        lat = [s.latency for s in samples]
        ok = sum(1 for s in samples if s.status == 200)
        burst = "burst" in name
        target = 3.0 if burst or "opening" in name else 0.050
        worst = max(lat) if lat else float("nan")
        p99 = percentile(lat, 99)
        verdict = (worst if burst else p99) < target
        errs = res.errors.get(name, {})
        started = res.started.get(name)
        ack_rows.append(
            [
                name,
                str(len(samples)),
                f"{ok}/{len(samples)}",
                f"{started[0]}/{started[1]}" if started else "—",
                " / ".join(f"{n}" for n in errs.values()) if errs else "—",
                fmt_ms(percentile(lat, 50)),
                fmt_ms(p99),
                fmt_ms(worst),
                ("max" if burst else "p99") + f" < {fmt_ms(target)}",
                "yes" if verdict else "**no**",
            ]
        )
    down_rows: list[list[str]] = []
    decided, decided_to_tool = with_pooled(res.decided), with_pooled(res.decided_to_tool)
    card_shown = with_pooled(res.card_shown)
    outcome_shown = with_pooled(res.outcome_shown)
    for name, xs in with_pooled(res.tool_start).items():
        p99 = percentile(xs, 99)
        paced = "paced" in name
        down_rows.append(
            [
                name,
                "click → tool start",
                str(len(xs)),
                fmt_ms(percentile(xs, 50)),
                fmt_ms(p99),
                fmt_ms(max(xs) if xs else float("nan")),
                "p99 < 100" if paced else "—",
                ("yes" if p99 < 0.1 else "**no**") if paced else "—",
            ]
        )
        for what, xs2 in (
            ("click → decision written (web)", decided.get(name, [])),
            ("decision written → tool start (worker)", decided_to_tool.get(name, [])),
            ("click → card shows the decision", card_shown.get(name, [])),
            ("click → card shows the tool's outcome", outcome_shown.get(name, [])),
        ):
            down_rows.append(
                [
                    name,
                    what,
                    str(len(xs2)),
                    fmt_ms(percentile(xs2, 50)),
                    fmt_ms(percentile(xs2, 99)),
                    fmt_ms(max(xs2) if xs2 else float("nan")),
                    "—",
                    "—",
                ]
            )
    check_rows = [[what, "yes" if ok else "**no**", detail] for what, ok, detail in res.checks]
    floor_rows = [[k, fmt_ms(p50), fmt_ms(p99)] for k, (p50, p99) in res.bolt_floor.items()]
    floor_tables = (
        [
            (
                "(c) Where an ack's time goes: Bolt alone, in-process (AsyncApp.async_dispatch of "
                "a block_actions request whose listener only calls ack()), ms",
                (["Bolt setting", "p50", "p99"], floor_rows),
            )
        ]
        if floor_rows
        else []
    )
    ncpu = len(os.sched_getaffinity(0))
    cpu_rows: list[list[str]] = []
    cpu_header: list[str] = ["phase"]
    for name, use in res.cpu.items():
        per = res.cpu_per_click.get(name, {})
        cpu_header = ["phase", "what", *use]
        cpu_rows.append(
            [name, "CPU-s per s, during the clicks", *(f"{v:.2f}" for v in use.values())]
        )
        cpu_rows.append(
            [name, "CPU-ms per click, until all done", *(f"{v:.1f}" for v in per.values())]
        )
    cpu_tables = (
        [(f"CPU use (the machine has {ncpu} CPUs)", (cpu_header, cpu_rows))] if cpu_rows else []
    )
    return [
        (
            "Acknowledgement latency (scheduled send → HTTP response), ms",
            (
                [
                    "phase",
                    "requests",
                    "200",
                    "runs started",
                    "ERROR lines ("
                    + "/".join(n for n in next(iter(res.errors.values()), {}))
                    + ")",
                    "p50",
                    "p99",
                    "max",
                    "target",
                    "met",
                ],
                ack_rows,
            ),
        ),
        (
            "Downstream latency of the first click on each gate, ms",
            (["phase", "what", "n", "p50", "p99", "max", "target", "met"], down_rows),
        ),
        *cpu_tables,
        *floor_tables,
        ("Checks", (["check", "ok", "detail"], check_rows)),
    ]


def text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def write_markdown(runs: list[Results], command: str, out: Path, analysis: str) -> None:
    cfg = runs[0].config
    minutes = sum(r.elapsed for r in runs) / 60
    parts = [
        "# Benchmark 2: Slack-side latency under load",
        "",
        f"Produced by `{command}` on {datetime.date.today().isoformat()}, "
        f"in {minutes:.1f} minutes (seed {cfg.seed}).",
        "",
        f"**Code:** commit {runs[0].code}. **Machine:** {machine()}.",
        "",
        "**Set-up:** one private `redis-server` (no persistence), one `web` process "
        f"(`python -m bot`, HTTP mode) and {cfg.workers} `worker` process(es) "
        "(`python -m agent_core.worker`, `WORKER_CONCURRENCY=16`), `LOG_LEVEL=WARNING`; "
        "`tests.slack_fake.FakeSlack` (Block Kit validation off) and `agent_core.testing.FakeOpenAI` "
        "in one process of their own; this process sends the requests. All of them share the "
        "machine's CPUs, over loopback. Requests are signed and form-encoded exactly as Slack "
        "sends them; gates were opened by the real `/agent <task>` path (paced at "
        f"{cfg.open_rate:.0f}/s) and their cards posted before the clicks. {cfg.warmup} warm-up "
        f"clicks are not counted. Double clicks: {DOUBLE_SHARE:.0%} of the clicks of each phase "
        "hit a gate already clicked (paced: 5-100 ms later; bursts: in the same burst), by the "
        "same approver or the other one.",
        "",
        "**Measured:** open loop. Each request has a scheduled send time (paced: t0 + k/rate; "
        "burst: one instant for all, each on a new connection) and every latency is measured "
        "from it, so a slow server cannot slow the arrivals down. *Tool start* is the first line "
        "of the gated tool (`time.monotonic()`, written by `tests/bench/slack_agent.py` in the "
        "worker); *card shows the decision* is the fake Slack's first `chat.update` of the "
        "card with the decided text (`tests/bench/slack_fakes.py`), *card shows the tool's "
        "outcome* its first `chat.update` showing the tool's result (the notifier's update "
        "once the tool ran, which a click does not wait for). *ERROR lines* counts the "
        "lines logged at ERROR by each process during the phase; *runs started* compares the "
        "runs created with the slash commands sent.",
        "",
    ]
    for res in runs:
        label = res.config.label
        if len(runs) > 1:
            parts += [f"## {label}", ""]
        for title, (header, rows) in tables(res):
            parts += [f"{'###' if len(runs) > 1 else '##'} {title}", "", md_table(header, rows), ""]
        if res.notes:
            parts += ["Notes:", ""] + [f"- {n}" for n in res.notes] + [""]
        if res.profiles:
            parts += [
                f"### Profile of the paced phase ({label}; py-spy, 200 Hz)",
                "",
                "Sampling slows the processes down: the latencies of a `--profile` run are not "
                "the benchmark's.",
                "",
            ]
            for name, summary in res.profiles.items():
                parts += [f"#### {name}", "", "```", summary, "```", ""]
    if analysis:
        parts += [analysis.strip(), ""]
    out.write_text("\n".join(parts))


def print_report(res: Results) -> None:
    print(f"\n=== {res.config.label} ===")
    for title, (header, rows) in tables(res):
        print(title)
        print(text_table(header, rows))
        print()
    for n in res.notes:
        print("note:", n)
    for name, summary in res.profiles.items():
        print(f"\nprofile of {name}:\n{summary}")
