"""What a run of the Slack benchmark is set to do (:class:`Config`), what each request
came to (:class:`Sample`) and what the run found (:class:`Results`), with the statistics
and the raw JSON (``--save-raw``, ``--render``) of them.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench.slack_procs import DOUBLE_SHARE, HERE


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); NaN for no samples."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(0, min(len(s) - 1, -(-int(q * len(s)) // 100) - 1))
    return s[k]


def fmt_ms(x: float) -> str:
    if x != x:
        return "n/a"
    v = x * 1000
    return f"{v:.1f}" if v < 100 else f"{v:.0f}"


@dataclass
class Sample:
    kind: str  # "first" | "double" | "command" | "warmup"
    index: int  # gate index (u{index}) or command index
    sched: float
    started: float = 0.0
    done: float = 0.0
    status: int = 0

    @property
    def latency(self) -> float:
        return self.done - self.sched


@dataclass
class Gate:
    index: int
    gate_id: str
    card_ts: str
    args_hash: str = ""

    @property
    def button_value(self) -> str:
        """What the card's Approve button carries (``<gate id>:<args hash>``)."""
        return f"{self.gate_id}:{self.args_hash}"


@dataclass
class Config:
    rate: float = 200.0
    paced: int = 2000
    # Lower rates, ``sweep_clicks`` clicks each, after the main paced phase: where is the knee?
    sweep: tuple[float, ...] = (50.0, 100.0, 150.0)
    sweep_clicks: int = 1000
    repeat: int = 3  # runs of the main paced phase (each on fresh gates)
    bursts: tuple[int, ...] = (100, 500)
    command_bursts: tuple[int, ...] = (100, 500)
    open_rate: float = 50.0
    workers: int = 1
    warmup: int = 40
    seed: int = 1
    profile: bool = False
    label: str = "as shipped"
    out: Path = HERE / "SLACK_RESULTS.md"

    def doubles(self, n: int) -> int:
        return round(n * DOUBLE_SHARE)

    @property
    def paced_phases(self) -> list[tuple[float, int]]:
        main = [(self.rate, self.paced)] * self.repeat
        return main + [(r, self.sweep_clicks) for r in self.sweep]

    @property
    def gates_needed(self) -> int:
        firsts = sum(n - self.doubles(n) for _, n in self.paced_phases)
        firsts += sum(b - self.doubles(b) for b in self.bursts)
        return self.warmup + firsts


@dataclass
class Results:
    config: Config
    phases: dict[str, list[Sample]] = field(default_factory=dict)
    tool_start: dict[str, list[float]] = field(default_factory=dict)
    card_shown: dict[str, list[float]] = field(default_factory=dict)
    # click → the card shows the tool's outcome (the notifier's update after the tool ran)
    outcome_shown: dict[str, list[float]] = field(default_factory=dict)
    decided: dict[str, list[float]] = field(default_factory=dict)
    decided_to_tool: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)
    cpu_per_click: dict[str, dict[str, float]] = field(default_factory=dict)
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    profiles: dict[str, str] = field(default_factory=dict)
    errors: dict[str, dict[str, int]] = field(default_factory=dict)
    started: dict[str, tuple[int, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    bolt_floor: dict[str, tuple[float, float]] = field(default_factory=dict)
    code: str = ""  # the commit measured


def save_raw(runs: list[Results], command: str, path: Path) -> None:
    """Every sample and figure, to render the markdown again (``--render``) without a run."""

    def enc(o: Any) -> Any:
        return str(o) if isinstance(o, Path) else o

    data = {"command": command, "date": datetime.date.today().isoformat()}
    data["runs"] = [dataclasses.asdict(r) for r in runs]  # type: ignore[assignment]
    path.write_text(json.dumps(data, default=enc))


def load_raw(path: Path) -> tuple[list[Results], str]:
    data = json.loads(path.read_text())
    runs = []
    for r in data["runs"]:
        known = {f.name for f in dataclasses.fields(Config)}
        cfg = Config(**{k: v for k, v in r.pop("config").items() if k in known})
        cfg.out = Path(cfg.out)
        cfg.bursts, cfg.command_bursts = tuple(cfg.bursts), tuple(cfg.command_bursts)
        cfg.sweep = tuple(cfg.sweep)
        r["phases"] = {n: [Sample(**x) for x in xs] for n, xs in r["phases"].items()}
        r["checks"] = [tuple(c) for c in r["checks"]]
        r["started"] = {n: tuple(v) for n, v in r["started"].items()}
        r["bolt_floor"] = {n: tuple(v) for n, v in r["bolt_floor"].items()}
        fields = {f.name for f in dataclasses.fields(Results)}
        runs.append(Results(config=cfg, **{k: v for k, v in r.items() if k in fields}))
    return runs, str(data["command"])
