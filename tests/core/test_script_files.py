"""The script layer: every Lua script is a file with a KEYS/ARGV/returns header, its helpers
are included (once, never copied), each one compiles on a real Redis, and each is run by a
method of its registry (agent_core.scripts.Scripts, bot.scripts.BotScripts,
playground.store.PlaygroundScripts). No Lua is left in a Python module."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from agent_core import Keys
from agent_core.script_loader import _resolve, source
from agent_core.scripts import Scripts
from bot.scripts import BotScripts
from playground.store import PlaygroundScripts

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"agent_core": Scripts, "bot": BotScripts, "playground": PlaygroundScripts}


def script_names(package: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / package / "lua").glob("*.lua"))


def test_every_script_has_its_header_and_named_keys() -> None:
    for package in PACKAGES:
        for name in script_names(package):
            text = (ROOT / package / "lua" / f"{name}.lua").read_text()
            header = [line for line in text.splitlines() if line.startswith("-- ")]
            for part in ("-- KEYS:", "-- ARGV:", "-- Returns:"):
                assert any(line.startswith(part) for line in header), (package, name, part)
            assert re.search(r"^local [\w, ]+=\s*KEYS\[1\]", text, re.M), (package, name)


def test_every_script_is_a_method_of_its_registry() -> None:
    for package, registry in PACKAGES.items():
        assert script_names(package), package
        for name in script_names(package):
            assert callable(getattr(registry, name, None)), (package, name)


def test_helpers_are_included_once_and_none_is_left_unused() -> None:
    # finish_turn includes read_for_model.lua, which includes requesters.lua itself.
    text = source("agent_core", "finish_turn")
    assert text.count("local function add_requesters(") == 1
    assert text.count("local function holds(") == 1
    assert not any(line.lstrip().startswith("--") for line in text.splitlines()), "no comments"
    for package in PACKAGES:
        used = "".join(source(package, n) for n in script_names(package))
        for include in sorted((ROOT / package / "lua").glob("include/*.lua")):
            first = re.search(r"^local function (\w+)", include.read_text(), re.M)
            assert first and f"local function {first.group(1)}(" in used, include.name


def test_a_bad_include_is_refused() -> None:
    with pytest.raises(FileNotFoundError, match=r"nowhere\.lua"):
        _resolve("agent_core", "--!include nowhere.lua\nreturn 1", set(), "t.lua")
    with pytest.raises(ValueError, match="unknown directive"):
        _resolve("agent_core", "--!inclde lease.lua\nreturn 1", set(), "t.lua")


def test_the_scripts_are_package_data() -> None:
    for package in PACKAGES:
        node = resources.files(package).joinpath("lua")
        assert node.is_dir() and any(n.name.endswith(".lua") for n in node.iterdir()), package


def test_no_lua_is_left_in_a_python_module() -> None:
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            assert "redis.call(" not in path.read_text(), path


async def test_every_script_compiles_on_redis(redis: Redis) -> None:
    registries = {
        "agent_core": Scripts(redis, Keys()),
        "bot": BotScripts(redis),
        "playground": PlaygroundScripts(redis),
    }
    for package, scripts in registries.items():
        for name in script_names(package):
            try:
                await redis.script_load(scripts.source(name))
            except ResponseError as exc:  # a syntax error names the script
                raise AssertionError(f"{package}/lua/{name}.lua: {exc}") from None
