"""Which shipped package may import which: ``agent_core`` knows nothing of Slack (no ``bot``,
no ``playground``), and ``bot`` does not import ``playground`` (the playground runs the bot,
never the other way round), nor anything under ``tests``."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "agent_core": {"agent_audit", "bot", "playground", "tests"},
    "agent_audit": {"bot", "playground", "tests"},
    "bot": {"playground", "tests"},
    "playground": {"tests"},
}


def imported_packages(path: Path) -> set[str]:
    """The top-level packages a module imports, anywhere in it (inside functions too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_module_imports_a_forbidden_package(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    wrong = {
        str(f.relative_to(ROOT)): sorted(imported_packages(f) & FORBIDDEN[package]) for f in files
    }
    assert {f: w for f, w in wrong.items() if w} == {}


def test_the_checker_sees_imports_inside_functions(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from playground.wire import sign\n    import tests.x\n")
    assert imported_packages(module) == {"playground", "tests"}


@pytest.mark.parametrize("package", ["agent_core", "bot"])
def test_importing_every_module_loads_no_forbidden_package(package: str) -> None:
    """Every module of the package imported in a fresh interpreter: what did it load?"""
    code = f"""
import importlib, json, pkgutil, sys
import {package}
for info in pkgutil.walk_packages({package}.__path__, "{package}."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}})))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert package in loaded
    assert loaded & FORBIDDEN[package] == set()
