"""Every code block of the README and of the documentation site (docs/**/*.md) runs.

Each fenced block is one of these, and the tests enforce it:

- ```python: checked for syntax and undefined names (ruff's pyflakes rules, F), then run:
  modules are imported, programs are run as a user would run them (``python file.py`` in a
  directory holding every block's file, so that they import ``my_agents``), against the
  tests' private Redis and the fake OpenAI server, with only environment variables pointing
  at them. A block names its file in its first line (``# my_agents.py``), once across all
  pages; the flows below say how the known ones run together, and any other program must run
  alone and exit 0.
- ```sh: run with ``bash -euo pipefail`` in a scratch directory, with this environment's
  commands first on PATH and the same Redis and fake model, and must exit 0.
- a block titled ``title="Output: <command>"``: the command runs with nothing but PATH and
  HOME set, and prints exactly the block.
- a block titled ``title="Not run: <why>"`` is not run (a drawing, a configuration file
  for another program, a command that needs Slack or runs for minutes). The title shows on
  the site, so a reader sees which blocks the tests do not run, and why.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent_core import Agent
from agent_core.testing import FakeOpenAI, call, reply

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(\s*)```(\w*)(.*)$")
TITLE = re.compile(r'title="([^"]*)"')
NAME = re.compile(r"^#\s*([A-Za-z_]\w*\.py)\b")
NOT_RUN = "Not run: "
OUTPUT = "Output: "

AGENTS = "my_agents.py"  # imported by the worker programs (AGENT=my_agents:agent)
WORKER = "my_worker.py"  # serves the two programs below until SIGTERM
CLI = "approve_cli.py"
FOLLOW = "follow.py"  # runs until stopped
CHECK = "check_my_agents.py"  # runs its own worker and FakeOpenAI
KNOWN = {AGENTS, WORKER, CLI, FOLLOW, CHECK}


@dataclass(frozen=True)
class Fenced:
    """One fenced block of a page."""

    page: str  # relative to the repository
    line: int  # of the opening fence
    lang: str
    title: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


@dataclass(frozen=True)
class Block:
    """One ```python block."""

    name: str
    code: str
    line: int
    page: str = "README.md"

    @property
    def program(self) -> bool:
        return "asyncio.run(" in self.code


def fenced_blocks() -> list[Fenced]:
    found: list[Fenced] = []
    for path in PAGES:
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            start = FENCE.match(lines[i])
            i += 1
            if not start:
                continue
            opened = i
            body: list[str] = []
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            i += 1
            title = TITLE.search(start.group(3))
            found.append(
                Fenced(
                    page=str(path.relative_to(ROOT)),
                    line=opened,
                    lang=start.group(2),
                    title=title.group(1) if title else "",
                    code=textwrap.dedent("\n".join(body)) + "\n",
                )
            )
    return found


FENCED = fenced_blocks()


def python_blocks() -> list[Block]:
    blocks: list[Block] = []
    for f in FENCED:
        if f.lang != "python" or f.title.startswith(NOT_RUN):
            continue
        named = NAME.match(f.code)
        default = f"{Path(f.page).stem.replace('-', '_')}_line_{f.line}.py"
        blocks.append(Block(named.group(1) if named else default, f.code, f.line, f.page))
    return blocks


BLOCKS = python_blocks()
BY_NAME = {b.name: b for b in BLOCKS}
SHELL = [f for f in FENCED if f.lang == "sh" and not f.title]
OUTPUTS = [f for f in FENCED if f.title.startswith(OUTPUT)]


def test_blocks_are_found_and_named_once() -> None:
    assert KNOWN <= set(BY_NAME), sorted(BY_NAME)
    assert len(BY_NAME) == len(BLOCKS), "two blocks name the same file"


def test_every_block_runs_or_says_why_not() -> None:
    """A block is run (python, sh), compared (Output:), or says why it is not (Not run:)."""
    unaccounted = [
        f.where
        for f in FENCED
        if not (
            (f.lang in ("python", "sh") and not f.title)
            or f.title.startswith(OUTPUT)
            or (f.title.startswith(NOT_RUN) and f.title.removeprefix(NOT_RUN).strip())
        )
    ]
    assert unaccounted == [], (
        'blocks neither run nor titled "Not run: <why>" or "Output: <command>"'
    )
    assert len(SHELL) >= 3 and len(OUTPUTS) >= 1  # the runners below do see blocks


# --------------------------------------------------------------------------- static checks
def ruff() -> str:
    found = Path(sys.executable).with_name("ruff")
    path = str(found) if found.exists() else shutil.which("ruff")
    assert path, "ruff is not installed (pip install -e '.[dev]')"
    return path


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.name)
def test_block_compiles_with_no_undefined_name(block: Block) -> None:
    # compile() refuses an `await` outside a function; ruff's F rules catch undefined names
    # (F821), unused imports and the rest of pyflakes.
    compile(block.code, block.name, "exec")
    proc = subprocess.run(
        [ruff(), "check", "--isolated", "--no-cache", "--select", "F", "--output-format",
         "concise", "--stdin-filename", block.name, "-"],
        input=block.code, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, f"{block.page} line {block.line}:\n{proc.stdout}{proc.stderr}"


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.name)
def test_programs_end_by_running_main(block: Block) -> None:
    if block.program:
        assert block.code.rstrip().endswith("asyncio.run(main())"), block.name


# --------------------------------------------------------------------------- running them
@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """Every python block as a file, side by side (so programs import ``my_agents``)."""
    for block in BLOCKS:
        (tmp_path / block.name).write_text(block.code, encoding="utf-8")
    return tmp_path


def env_for(redis_url: str, fake: FakeOpenAI, prefix: str) -> dict[str, str]:
    passed = {k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}
    return {
        **passed,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONUNBUFFERED": "1",
        "REDIS_URL": redis_url,
        "KEY_PREFIX": prefix,
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_API_KEY": "sk-test-not-a-secret",
        "OPENAI_MODEL": "fake-model",
        "AGENT": "my_agents:agent",
    }


def run(workdir: Path, name: str, env: dict[str, str], timeout: float = 45) -> str:
    proc = subprocess.run(
        [sys.executable, name],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout


class Background:
    """A program of the docs that runs until stopped; its output goes to a file."""

    def __init__(self, workdir: Path, name: str, env: dict[str, str]) -> None:
        self.log = workdir / f"{name}.log"
        self._out = self.log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, name], cwd=workdir, env=env, stdout=self._out, stderr=subprocess.STDOUT
        )

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
            self._out.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def background() -> Iterator[list[Background]]:
    procs: list[Background] = []
    yield procs
    for p in procs:
        p.stop(signal.SIGKILL)


def test_the_agent_module_defines_an_agent(workdir: Path) -> None:
    spec = importlib.util.spec_from_file_location("docs_my_agents", workdir / AGENTS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert isinstance(module.agent, Agent)
    assert [t.name for t in module.agent.tools] == [
        "get_user",
        "delete_user",
        "send_email",
        "resync_mirror",
    ]


def test_the_cli_and_the_follower_against_the_in_process_worker(
    workdir: Path, redis_url: str, fake_openai: FakeOpenAI, background: list[Background]
) -> None:
    """my_worker.py serves; approve_cli.py starts a run, approves it, prints the answer;
    follow.py sees its events; SIGTERM stops the worker cleanly."""
    fake_openai.script(
        "delete user 42", [call("delete_user", {"user_id": "42"}), reply("User 42 is deleted.")]
    )
    env = env_for(redis_url, fake_openai, "readme")
    worker = Background(workdir, WORKER, env)
    follower = Background(workdir, FOLLOW, env)
    background += [worker, follower]
    out = run(workdir, CLI, env)
    assert out.splitlines() == [
        "delete_user {'user_id': '42'} asks for approval",
        "True approved U456",
        "completed User 42 is deleted.",
    ], out
    assert worker.stop() == 0, worker.output()
    assert "Traceback" not in worker.output(), worker.output()
    events = follower.output()
    follower.stop()
    for expected in ("run.started", "gate.opened", "gate.decided", "run.completed"):
        assert expected in events, events


def test_the_agent_check_runs_its_own_worker_and_model(
    workdir: Path, redis_url: str, fake_openai: FakeOpenAI
) -> None:
    out = run(workdir, CHECK, env_for(redis_url, fake_openai, "check-env"))
    assert out.strip() == "ok", out


def test_every_other_block_runs_alone(
    workdir: Path, redis_url: str, fake_openai: FakeOpenAI
) -> None:
    """A block the flows above do not know: a program must exit 0, a module must import."""
    for i, block in enumerate(b for b in BLOCKS if b.name not in KNOWN):
        if block.program:
            run(workdir, block.name, env_for(redis_url, fake_openai, f"other{i}"))
        else:
            spec = importlib.util.spec_from_file_location(f"docs_{i}", workdir / block.name)
            assert spec is not None and spec.loader is not None
            spec.loader.exec_module(importlib.util.module_from_spec(spec))


# --------------------------------------------------------------------------- shell and output
@pytest.mark.parametrize("block", SHELL, ids=lambda f: f.where)
def test_shell_block_runs(
    block: Fenced, tmp_path: Path, redis_url: str, fake_openai: FakeOpenAI
) -> None:
    env = env_for(redis_url, fake_openai, f"sh{block.line}")
    del env["AGENT"]  # the blocks say which agents they run
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, (
        f"{block.where} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    )


@pytest.mark.parametrize("block", OUTPUTS, ids=lambda f: f.where)
def test_output_block_is_what_the_command_prints(block: Fenced, tmp_path: Path) -> None:
    command = shlex.split(block.title.removeprefix(OUTPUT))
    installed = Path(sys.executable).parent / command[0]
    assert installed.exists(), f"{block.where}: {command[0]} is not a command of this environment"
    passed = {k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}
    proc = subprocess.run(
        [str(installed), *command[1:]],
        cwd=tmp_path,
        env={**passed, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home())},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.stdout + proc.stderr).strip() == block.code.strip(), block.where


# --------------------------------------------------------------------------- configuration
def test_the_configuration_reference_is_generated_from_the_settings() -> None:
    """docs/operations/configuration.md's tables come from the settings' own descriptions:
    every variable, with the text of its error line and --help, and its default."""
    from agent_core.settings import HELP as CORE
    from bot.settings import HELP as SLACK

    spec = importlib.util.spec_from_file_location(
        "settings_reference", ROOT / "docs" / "hooks" / "settings_reference.py"
    )
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = (ROOT / "docs" / "operations" / "configuration.md").read_text(encoding="utf-8")
    rendered = hook.on_page_markdown(page)
    assert "<!-- settings:" not in rendered
    for var, text in {**CORE, **SLACK}.items():
        assert f"| `{var}` |" in rendered and text.replace("|", "\\|") in rendered, var
    assert "| `SHARDS` | `16` |" in rendered and "| `REDIS_URL` | required |" in rendered
    assert "| `OPENAI_API_KEY` | unset (required by `agent-worker`) |" in rendered
    with pytest.raises(ValueError, match="unknown settings marker"):
        hook.on_page_markdown("<!-- settings: nonsense -->")
