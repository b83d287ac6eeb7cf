"""The playground as a real process (``python -m playground``: it starts ``web`` and
``worker``), on a private Redis, and a page in Debian's Chromium driven by Playwright.

Screenshots go to ``var/artifacts/playground/`` (kept by CI as artifacts).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, Playwright, async_playwright

from tests.redis_server import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "var" / "artifacts" / "playground"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
# As the machine's probe starts it: no sandbox (root), no GPU, and nothing that reaches out.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
READY = re.compile(r"open (http://127\.0\.0\.1:\d+) in your browser")
TOKEN_META = re.compile(r'<meta name="playground-token" content="([^"]+)">')


@dataclass
class PlaygroundProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    prefix: str
    web_port: int = 0  # the bot's PORT

    def session_token(self) -> str:
        """The session token, read from the page as the browser does."""
        with urllib.request.urlopen(self.url + "/", timeout=5) as resp:
            page = resp.read().decode()
        found = TOKEN_META.search(page)
        assert found is not None, "the page carries no session token"
        return found.group(1)

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        """SIGTERM (the playground stops web and worker), then SIGKILL its process group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def playground_env(redis_url: str, port: int, web_port: int, **extra: str) -> dict[str, str]:
    """The environment of ``python -m playground`` (nothing inherited but PATH and HOME)."""
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "PYTHONPATH": str(ROOT),
        "REDIS_URL": redis_url,
        "PLAYGROUND_PORT": str(port),
        "PORT": str(web_port),
        **extra,
    }


def start_playground(
    redis_url: str, log_dir: Path, prefix: str | None = None, **extra: str
) -> PlaygroundProcess:
    """``python -m playground``, started and ready. ``prefix``: its PLAYGROUND_KEY_PREFIX (a
    new one when None, so that playgrounds can share the Redis; "" leaves it unset)."""
    prefix = "pg" + uuid.uuid4().hex[:8] if prefix is None else prefix
    port, web_port = free_port(), free_port()
    own = {"PLAYGROUND_KEY_PREFIX": prefix} if prefix else {}
    env = playground_env(redis_url, port, web_port, **own, **extra)
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"playground-{prefix}-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "playground"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: web and worker are in it too
        )
    pg = PlaygroundProcess(proc, "", log, prefix, web_port)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        if (m := READY.search(log.read_text(errors="replace"))) is not None:
            pg.url = m.group(1)
            return pg
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    pg.stop()
    raise AssertionError(f"the playground did not start:\n{pg.log_tail()}")


@pytest.fixture(scope="module")
def playground(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PlaygroundProcess]:
    pg = start_playground(redis_server.url, tmp_path_factory.mktemp("playground"))
    try:
        yield pg
    finally:
        pg.stop()


def _chromium() -> str:
    path = shutil.which(CHROMIUM) or CHROMIUM
    if not os.path.exists(path):
        raise AssertionError(
            f"{CHROMIUM} not found: install Debian's chromium (`make test` does, as root)"
        )
    return path


async def _launch(p: Playwright) -> Browser:
    return await p.chromium.launch(executable_path=_chromium(), args=CHROMIUM_ARGS)


@contextlib.asynccontextmanager
async def _page_of(browser: Browser, name: str) -> AsyncIterator[Page]:
    """A page in a new browser context (no cookie, storage or cache of another test); a
    screenshot of it at the end, and the test fails on any JavaScript error of the page."""
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    pg = await context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield pg
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(Exception):
            await pg.screenshot(path=str(ARTIFACTS / f"{name}-last.png"))
        await context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


# One Chromium per test module (its launch with Playwright's driver took about 1.5 s a test);
# each test still gets a browser context of its own (`page`). The tests that use `page` run
# on the module's event loop (BROWSER_LOOP in their pytestmark), the one the browser's
# connection lives on; a test whose other fixtures live on its own loop takes `own_page`.
BROWSER_LOOP = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        b = await _launch(p)
        try:
            yield b
        finally:
            await b.close()


@pytest_asyncio.fixture(loop_scope="module")
async def page(browser: Browser, request: pytest.FixtureRequest) -> AsyncIterator[Page]:
    async with _page_of(browser, request.node.name) as pg:
        yield pg


@pytest.fixture
async def own_page(request: pytest.FixtureRequest) -> AsyncIterator[Page]:
    """A page in a Chromium of the test's own, on the test's own event loop."""
    async with async_playwright() as p:
        b = await _launch(p)
        try:
            async with _page_of(b, request.node.name) as pg:
                yield pg
        finally:
            await b.close()


async def shot(page: Page, name: str) -> Path:
    """Save a screenshot as an artifact; returns its path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    await page.screenshot(path=str(path))
    return path
