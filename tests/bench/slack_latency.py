"""Benchmark 2: Slack-side latency under load (``python -m tests.bench.slack_latency``).

Everything is real but Slack and the model: a private ``redis-server``, the ``web`` process
(``python -m bot``) and ``worker`` process(es) (``python -m agent_core.worker``) as
subprocesses, with :class:`tests.slack_fake.FakeSlack` and :class:`agent_core.testing.FakeOpenAI`
in a process of their own (``tests.bench.slack_fakes``). This process is only the load
generator: it sends signed requests to ``web`` exactly as Slack does, over loopback.

1. **Opening gates.** ``/agent slack-bench {i}`` slash commands, paced at ``--open-rate``/s;
   each run calls the gated ``delete_user`` and its card is posted. Their acks are measured
   too. Then the system is left to go quiet (no pending jobs or events).
2. **(a) Paced clicks**, open loop: click ``k`` is *scheduled* at ``t0 + k / rate`` and sent
   then, whatever happened to the earlier ones; every latency is measured from the scheduled
   time (no coordinated omission). 5 % of the clicks are double clicks on a gate clicked
   5-100 ms earlier, by the same approver or the other one.
   - ack: scheduled time → the HTTP response (Slack's 3 s limit applies to it);
   - click → tool start: scheduled time → the tool's first line (``time.monotonic()``, one
     clock for every process on the machine, written to a journal by
     ``tests.bench.slack_agent``);
   - click → card updated: scheduled time → the fake Slack's first ``chat.update`` showing
     the decision.
3. **(b) Bursts**: 100 and 500 clicks (5 % double clicks) all scheduled at the same instant,
   on fresh connections; then bursts of 100 and 500 slash commands.

Afterwards it checks that every clicked gate was decided once and its tool ran exactly once.
It prints the tables and writes ``tests/bench/SLACK_RESULTS.md``. ``--profile`` also samples
the web and worker processes with py-spy during the paced phase (it slows them down: its
latency figures are not the benchmark's).

The code, by concept: ``slack_procs`` (the processes started and what is measured of them),
``slack_load`` (the signed requests, paced or in bursts), ``slack_phases`` (the phases and
the checks), ``slack_results`` (the configuration, samples and results) and ``slack_report``
(the tables); this module reads the options and runs them.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

from tests.bench.slack_phases import bench
from tests.bench.slack_procs import HERE
from tests.bench.slack_report import print_report, write_markdown
from tests.bench.slack_results import Config, load_raw, save_raw

ANALYSIS_FILE = HERE / "slack_analysis.md"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--paced", type=int, default=2000)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--open-rate", type=float, default=50.0, help="slash commands/s opening gates")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3, help="runs of the main paced phase")
    p.add_argument("--no-bursts", action="store_true", help="only the paced phases")
    p.add_argument(
        "--sweep",
        default="50,100,150",
        help="lower paced rates (clicks/s, comma-separated; '' for none), 1,000 clicks each",
    )
    p.add_argument("--profile", action="store_true", help="sample web/worker with py-spy")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="markdown file (default tests/bench/SLACK_RESULTS.md)",
    )
    p.add_argument("--keep", action="store_true", help="keep the logs directory")
    p.add_argument("--save-raw", type=Path, default=None, help="also save every sample (JSON)")
    p.add_argument(
        "--render", type=Path, default=None, help="write the markdown from a --save-raw file"
    )
    args = p.parse_args(argv)
    cfg = Config(
        rate=args.rate,
        paced=args.paced,
        workers=args.workers,
        seed=args.seed,
        open_rate=args.open_rate,
        profile=args.profile,
        sweep=tuple(float(x) for x in args.sweep.split(",") if x.strip()),
        repeat=args.repeat,
    )
    if args.quick:
        cfg.paced, cfg.bursts, cfg.command_bursts, cfg.warmup = 400, (50, 100), (50, 100), 20
        cfg.sweep, cfg.sweep_clicks, cfg.repeat = (100.0,), 200, 1
    if args.no_bursts:
        cfg.bursts, cfg.command_bursts = (), ()
    if cfg.workers != 1:
        cfg.label += f", {cfg.workers} workers"
    configs = [cfg]
    skip = (args.quick or args.profile or args.no_bursts) and args.render is None
    out = args.out or (None if skip else cfg.out)
    if args.render is not None:
        runs, command = load_raw(args.render)
    else:
        runs = []
        for c in configs:
            print(f"=== {c.label} ===")
            workdir = Path(tempfile.mkdtemp(prefix="slack-bench-"))
            try:
                runs.append(asyncio.run(bench(c, workdir)))
            finally:
                if args.keep:
                    print(f"logs kept in {workdir}")
                else:
                    shutil.rmtree(workdir, ignore_errors=True)
        shown = list(argv if argv is not None else sys.argv[1:])
        if "--save-raw" in shown:  # where the raw data went is not part of the recipe
            i = shown.index("--save-raw")
            del shown[i : i + 2]
        command = " ".join([".venv/bin/python -m tests.bench.slack_latency", *shown])
        if args.save_raw is not None:
            save_raw(runs, command.strip(), args.save_raw)
    for res in runs:
        print_report(res)
    if out is not None:
        analysis = ANALYSIS_FILE.read_text() if ANALYSIS_FILE.exists() else ""
        write_markdown(runs, command.strip(), out, analysis)
        print(f"wrote {out}")
    failed = [c for res in runs for c in res.checks if not c[1]]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
