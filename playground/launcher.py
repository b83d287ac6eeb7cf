"""``python -m playground``: the playground, then ``web`` and ``worker`` pointed at it.

Settings (read here, at the edge): REDIS_URL (required; ``make run`` starts a local Redis),
PLAYGROUND_PORT (the page and the fake Web API, default 3100), PORT (the bot's, default
3000), APPROVERS (default: Avery and the @oncall group), SLASH_COMMAND, and the model:
OPENAI_API_KEY or OPENAI_BASE_URL for a real one, else the scripted model
(PLAYGROUND_MODEL=module:function for your own script).

The bot and the worker run unchanged, as subprocesses: only their settings differ
(SLACK_API_URL, a bot token and a signing secret made up for this session, 127.0.0.1 to
listen on, and the playground's own key prefix). Their output is forwarded with a prefix,
like honcho's. Ctrl-C (or SIGTERM) stops all three; so does either subprocess exiting.

The playground never joins a deployment sharing its Redis: it keeps everything under its own
key prefix (``playground``; PLAYGROUND_KEY_PREFIX, never KEY_PREFIX, changes it), and it
refuses to start while workers it did not start are alive under that prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import signal
import socket
import sys
from dataclasses import dataclass
from importlib import resources
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from redis.asyncio import Redis

from agent_core import presence
from agent_core.connections import connect_redis, redacted
from agent_core.exceptions import ConfigError
from agent_core.keys import Keys

from . import people
from .outbound import Sender
from .server import PageInfo, Playground, bot_events
from .store import Store
from .wire import PostRateLimit

log = logging.getLogger("playground")

# The settings the playground reads (`playground --help`); the bot and worker read theirs.
HELP = {
    "REDIS_URL": "the Redis the playground, the bot and the worker share (required)",
    "PLAYGROUND_PORT": "the port of the page and of the fake Slack Web API (default 3100)",
    "PORT": "the bot's port (default 3000)",
    "PLAYGROUND_KEY_PREFIX": "the playground's own key prefix (default playground)",
    "APPROVERS": "who may approve (default: Avery and the @oncall group)",
    "APPROVAL_ROUTES": (
        "route tools to #finance-approvals, e.g. "
        '{"send_email": {"channel": "C0PGFINANCE", "approvers": "S0PGFINANCE"}} '
        "(@finance: Sam); unset, every card is in its task's thread"
    ),
    "SLASH_COMMAND": "the slash command (default /agent)",
    "OPENAI_API_KEY, OPENAI_BASE_URL": "a real model; unset, a scripted one answers",
    "PLAYGROUND_MODEL": "module:function, your own script for the scripted model",
}

# Posts to one channel Slack lets through at once before its ~1 a second applies.
POST_BURST = 4
EXAMPLES = [
    "/agent delete user 42",
    "/agent look up user 43",
    "/agent email alan@partner.org the full incident report",
    "/agent delete users 42 and 43",
    "/agent status",
]
KEY_PREFIX = "playground"  # the playground's own; a deployment's KEY_PREFIX is never used
DEPLOYMENT_PREFIX = "agw"  # KEY_PREFIX when unset (agent_core.settings)
LOOPBACK = "127.0.0.1"  # where everything the playground starts listens


@dataclass(frozen=True)
class LaunchSettings:
    redis_url: str
    port: int
    web_port: int
    approvers: str
    command: str
    real_model: bool
    model_spec: str | None
    key_prefix: str = KEY_PREFIX

    @classmethod
    def from_env(cls, env: dict[str, str]) -> LaunchSettings:
        problems: list[str] = []
        redis_url = env.get("REDIS_URL", "")
        if not redis_url:
            problems.append(
                "REDIS_URL is not set: the Redis the gateway and the playground keep their "
                "state in, e.g. redis://127.0.0.1:6379/0"
            )

        def port(name: str, default: int) -> int:
            raw = env.get(name) or str(default)
            if not raw.isdigit() or not 1 <= int(raw) <= 65535:
                problems.append(f"{name} is invalid: must be a TCP port (1-65535)")
                return default
            return int(raw)

        pg_port, web_port = port("PLAYGROUND_PORT", 3100), port("PORT", 3000)
        if pg_port == web_port:
            problems.append("PLAYGROUND_PORT is invalid: it must differ from PORT (the bot's)")
        prefix = env.get("PLAYGROUND_KEY_PREFIX") or KEY_PREFIX
        deployment = env.get("KEY_PREFIX") or DEPLOYMENT_PREFIX
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", prefix):
            problems.append("PLAYGROUND_KEY_PREFIX is invalid: letters, digits, _ . - only")
        elif prefix == deployment:
            problems.append(
                f"PLAYGROUND_KEY_PREFIX is invalid: it is the deployment's KEY_PREFIX "
                f"({deployment}); the playground needs a prefix of its own"
            )
        if problems:
            raise ConfigError("\n".join(problems))
        return cls(
            redis_url=redis_url,
            port=pg_port,
            web_port=web_port,
            approvers=env.get("APPROVERS") or people.DEFAULT_APPROVERS,
            command=env.get("SLASH_COMMAND") or "/agent",
            real_model=bool(env.get("OPENAI_API_KEY") or env.get("OPENAI_BASE_URL")),
            model_spec=env.get("PLAYGROUND_MODEL") or None,
            key_prefix=prefix,
        )


async def _pipe(name: str, stream: asyncio.StreamReader | None) -> None:
    if stream is None:
        return
    while line := await stream.readline():
        sys.stdout.write(f"{name:<10} | {line.decode(errors='replace')}")
        sys.stdout.flush()


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), 10)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


def refuse_taken_port(port: int) -> None:
    """A :class:`ConfigError` naming PORT when the bot's port is taken on loopback: the web
    subprocess would otherwise die on it after the playground started."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((LOOPBACK, port))
        except OSError as exc:
            raise ConfigError(
                f"PORT {port} is not free ({exc.strerror}); set PORT (the bot's port, which "
                "the playground starts the bot on)"
            ) from None


async def launch(settings: LaunchSettings) -> int:
    """Run the playground and its two subprocesses until a signal or a subprocess exit."""
    refuse_taken_port(settings.web_port)
    redis = await connect_redis(settings.redis_url)
    try:
        await redis.ping()
    except Exception as exc:
        await redis.aclose()
        raise ConfigError(
            f"REDIS_URL: cannot reach Redis at {redacted(settings.redis_url)} "
            f"({type(exc).__name__})"
        ) from None

    try:
        await refuse_foreign_workers(redis, Keys(settings.key_prefix))
    except BaseException:
        await redis.aclose()
        raise

    env = dict(os.environ)
    model = None
    if settings.real_model:
        label = "Real model: " + (env.get("OPENAI_MODEL") or "gpt-4o-mini")
        where = urlsplit(env.get("OPENAI_BASE_URL") or "https://api.openai.com/v1")
        hint = f"served by {where.hostname}" + (f":{where.port}" if where.port else "")
    else:
        from .model import API_KEY, hint_for, load_responder, start_model

        model = start_model(load_responder(settings.model_spec))
        env["OPENAI_BASE_URL"] = model.base_url
        env["OPENAI_API_KEY"] = API_KEY
        label = "Scripted model (no OPENAI_API_KEY set)"
        hint = hint_for(settings.model_spec)

    secret = secrets.token_hex(16)
    token = "xoxb-playground-" + secrets.token_hex(12)
    events_url = f"http://127.0.0.1:{settings.web_port}/slack/events"
    manifest = slack_manifest()
    info = PageInfo(
        command=settings.command,
        model_scripted=not settings.real_model,
        model_label=label,
        model_hint=hint,
        examples=[e.replace("/agent", settings.command, 1) for e in EXAMPLES],
        bot_events=bot_events(manifest),
    )
    pg = Playground(
        Store(redis, "{" + settings.key_prefix + ":playground}"),
        Sender(events_url, secret),
        token,
        info,
        # Slack's ~1 message a second per channel (short bursts allowed): the bot meets 429s
        # here as it would in Slack.
        post_limit=PostRateLimit(per_second=1.0, burst=POST_BURST),
    )
    runner = web.AppRunner(pg.app(), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, LOOPBACK, settings.port).start()
    except OSError as exc:
        await runner.cleanup()
        await redis.aclose()
        if model is not None:
            model.stop()
        raise ConfigError(
            f"PLAYGROUND_PORT {settings.port} is not free ({exc.strerror}); set PLAYGROUND_PORT"
        ) from None
    base = f"http://{LOOPBACK}:{settings.port}"
    pg.response_base = base

    env.update(
        SLACK_BOT_TOKEN=token,
        SLACK_SIGNING_SECRET=secret,
        SLACK_API_URL=base + "/api/",
        APPROVERS=settings.approvers,
        PORT=str(settings.web_port),
        WEB_HOST=LOOPBACK,  # /slack/events, /healthz and /metrics: not on the network
        METRICS_HOST=LOOPBACK,  # the worker's /metrics, if METRICS_PORT asks for one
        KEY_PREFIX=settings.key_prefix,  # never the deployment's
        SLASH_COMMAND=settings.command,
        PYTHONUNBUFFERED="1",
    )
    env.pop("SLACK_APP_TOKEN", None)  # the playground speaks HTTP, not Socket Mode
    procs: dict[str, asyncio.subprocess.Process] = {}
    pipes = []
    for name, module in (("web", "bot"), ("worker", "agent_core.worker")):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        procs[name] = proc
        pipes.append(asyncio.create_task(_pipe(name, proc.stdout)))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ready = await _wait_healthy(settings.web_port, procs["web"])
    if ready and await _wait_worker(redis, Keys(settings.key_prefix), procs["worker"]):
        # The last line of a start: `make run` ends on this URL.
        print(
            f"playground | open {base} in your browser: a local Slack with the real bot and "
            f"worker ({'real model' if settings.real_model else 'scripted model'}; Ctrl-C stops)",
            flush=True,
        )
    waits = [asyncio.create_task(p.wait()) for p in procs.values()]
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait([*waits, stopper], return_when=asyncio.FIRST_COMPLETED)
    code = 0
    for name, proc in procs.items():
        if proc.returncode is not None and not stop.is_set():
            print(f"playground | {name} exited with status {proc.returncode}; stopping", flush=True)
            code = proc.returncode or 1
    await asyncio.gather(*(_stop(p) for p in procs.values()))
    for task in [*pipes, stopper, *waits]:
        task.cancel()
    await runner.cleanup()
    await redis.aclose()
    if model is not None:
        model.stop()
    return code


def slack_manifest() -> str:
    """The Slack app's manifest, as shipped in the ``bot`` package (``slack/manifest.yml`` in
    the repository is the same file): the playground sends the events it subscribes to."""
    return resources.files("bot").joinpath("manifest.yml").read_text(encoding="utf-8")


async def refuse_foreign_workers(redis: Redis, keys: Keys) -> None:
    """A :class:`ConfigError` when workers are alive under the playground's prefix: the
    playground has not started its own yet, so they belong to another playground or to a
    deployment, and sharing their streams would hand runs from one to the other."""
    alive = await presence.live_workers(redis, keys)
    if not alive:
        return
    names = ", ".join(w.name for w in alive[:3]) + (", …" if len(alive) > 3 else "")
    lapse = round(max(w.every for w in alive) * presence.STALE_AFTER)
    raise ConfigError(
        f"{len(alive)} worker(s) that this playground did not start are alive under its key "
        f"prefix {keys.prefix} in this Redis ({names}): stop that playground or deployment, "
        "or set PLAYGROUND_KEY_PREFIX (or REDIS_URL) to keep this one apart (a worker "
        f"killed without stopping stays listed for up to {lapse} s)"
    )


async def _wait_healthy(port: int, web_proc: asyncio.subprocess.Process) -> bool:
    """Wait (up to 30 s) until the bot answers /healthz; False if it exited first."""
    url = f"http://127.0.0.1:{port}/healthz"
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            if web_proc.returncode is not None:
                return False
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as resp:
                    if resp.status == 200:
                        return True
            await asyncio.sleep(0.1)
    return False


async def _wait_worker(redis: Redis, keys: Keys, worker: asyncio.subprocess.Process) -> bool:
    """Wait (up to 30 s) until the worker announces itself (its presence record); False if
    it exited first."""
    for _ in range(300):
        if worker.returncode is not None:
            return False
        with contextlib.suppress(Exception):
            if await presence.live_workers(redis, keys):
                return True
        await asyncio.sleep(0.1)
    return False


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``playground`` (``python -m playground``)."""
    from agent_core import cli

    cli.parser(
        "playground",
        "A local Slack in your browser, with the real bot (agent-web) and a worker "
        "(agent-worker) pointed at it; a scripted model unless OPENAI_API_KEY or "
        "OPENAI_BASE_URL is set. Prints the page's URL once both are ready.",
        HELP,
        check=False,
    ).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="playground | %(levelname)s %(message)s")
    try:
        settings = LaunchSettings.from_env(dict(os.environ))
        code = asyncio.run(launch(settings))
    except ConfigError as exc:
        for line in str(exc).splitlines():
            print(f"config error: {line}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        code = 0
    raise SystemExit(code)
