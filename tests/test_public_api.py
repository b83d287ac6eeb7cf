"""What ``from agent_core import ...`` offers, and the exception tree users catch."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import agent_core
from agent_core import exceptions

NEEDED = {
    "Agent",
    "tool",
    "Tool",
    "Gateway",
    "Settings",
    "Decision",
    "GateStatus",
    "RunStatus",
    "Run",
    "Gate",
    "Event",
    "EventType",
    "DecideResult",
    "ContinueOutcome",
    "Keys",
    "Worker",
    "run_worker",
}

EXCEPTIONS = sorted(
    name
    for name, obj in vars(exceptions).items()
    if inspect.isclass(obj)
    and issubclass(obj, BaseException)
    and obj.__module__ == exceptions.__name__
)


def test_all_is_sorted_without_duplicates() -> None:
    names = list(agent_core.__all__)
    assert len(names) == len(set(names))
    # Plain sorted() order: case-sensitive, so classes come before functions.
    assert names == sorted(names)


def test_every_name_in_all_resolves() -> None:
    missing = [name for name in agent_core.__all__ if not hasattr(agent_core, name)]
    assert missing == []


def test_all_has_what_a_user_needs() -> None:
    assert NEEDED - set(agent_core.__all__) == set()


def test_all_exports_every_exception() -> None:
    assert EXCEPTIONS, "no exception classes found"
    assert set(EXCEPTIONS) - set(agent_core.__all__) == set()
    for name in EXCEPTIONS:
        assert getattr(agent_core, name) is getattr(exceptions, name)


def test_python_m_worker_imports_no_worker_module_twice() -> None:
    """`Worker` and `run_worker` are loaded lazily: `python -m agent_core.worker` would
    otherwise find agent_core.worker imported by the package, and runpy warns about that."""
    import subprocess
    import sys

    probe = "import sys, agent_core; print('agent_core.worker' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_star_import_gives_the_public_api() -> None:
    namespace: dict[str, object] = {}
    exec("from agent_core import *", namespace)
    assert NEEDED | set(EXCEPTIONS) <= set(namespace)


@pytest.mark.parametrize("name", EXCEPTIONS)
def test_every_exception_derives_from_gateway_error(name: str) -> None:
    cls = getattr(exceptions, name)
    assert issubclass(cls, exceptions.GatewayError)
    assert cls.__doc__, f"{name} has no docstring"


def docstring_tree() -> dict[str, str | None]:
    """``{class name: parent name}`` read from the tree drawn in the module docstring.

    The tree is the literal block after ``::``: one class per line, four columns per level.
    """
    lines = (inspect.getdoc(exceptions) or "").splitlines()
    start = next(i for i, line in enumerate(lines) if line.rstrip().endswith("::")) + 1
    block = [line for line in lines[start:] if line.strip()]
    margin = min(len(line) - len(line.lstrip()) for line in block)
    tree: dict[str, str | None] = {}
    stack: list[str] = []
    for line in block:
        drawing = line[margin:]
        name = drawing.lstrip(" │├└─").split()[0]
        depth = (len(drawing) - len(drawing.lstrip(" │├└─"))) // 4
        assert depth <= len(stack), f"line skips a level: {line!r}"
        del stack[depth:]
        tree[name] = stack[-1] if stack else None
        stack.append(name)
    return tree


def test_docstring_draws_every_exception() -> None:
    drawn = docstring_tree()
    assert set(EXCEPTIONS) - set(drawn) == set(), drawn


def test_docstring_tree_matches_the_class_hierarchy() -> None:
    drawn = docstring_tree()
    assert drawn == {
        name: (None if name == "GatewayError" else getattr(exceptions, name).__bases__[0].__name__)
        for name in EXCEPTIONS
    }


def test_the_core_imports_no_web_server_until_it_serves_one() -> None:
    # A library user (an agent, a CLI on the gateway API) gets neither aiohttp's web server
    # nor prometheus_client: the worker and the web process import them when they serve.
    code = (
        "import sys; from agent_core import Agent, Gateway, Settings, tool; "
        "print(sorted(m for m in sys.modules "
        "if m.startswith(('aiohttp.web', 'prometheus_client', 'mcp', 'slack_bolt'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "[]\n"), done.stderr
