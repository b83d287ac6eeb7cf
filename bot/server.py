"""The ``web`` process: Slack requests over HTTP (or Socket Mode), /healthz, the notifier.

``GET /healthz`` answers 503 when Redis cannot be reached, else 200 with ``"ok": true`` and
a ``workers`` field: how many workers are alive under this KEY_PREFIX, the agents they serve,
the configured agents none serves, and a ``problem`` text (``"status": "degraded"``) when runs
started here would stay queued or fail: no worker (and the other KEY_PREFIXes that have
workers in this Redis), another SHARDS, or a missing agent. The web still takes tasks then:
a 200 keeps it in a load balancer's rotation, where it queues runs for the workers to come.
Keys of this KEY_PREFIX in the old key layout (written by a process of the previous version
after this one started) make it ``"degraded"`` too, with a ``layout`` field naming the fix;
found at start, they stop the process (:mod:`agent_core.layout`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import redis.asyncio as aioredis
from aiohttp import web
from redis.exceptions import RedisError
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.async_app import AsyncApp
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from agent_core import Agent, ConfigError, Gateway, Keys, Settings, event_loop, metrics
from agent_core.connections import reachable_redis
from agent_core.event_loop import running_loop_name
from agent_core.layout import old_layout_problem, refuse_old_layout
from agent_core.runtime import freeze_startup_heap
from agent_core.settings import exit_on_config_error, importable_from_cwd, load_agents
from agent_core.streams import is_cluster

from . import bolt_compat
from .app import create_app, make_web_client
from .context import BotContext
from .directory import AgentDirectory
from .notifier import Notifier
from .ports import GatewayLike
from .publisher import slack_error
from .settings import PLAYGROUND_HINT, BotSettings, load_settings, parse_approvers

log = logging.getLogger("bot")

Headers = dict[str, str | Sequence[str]]

EVENTS_PATH = "/slack/events"
HEALTH_PATH = "/healthz"
MAX_BODY_BYTES = 1024 * 1024
# How long the web process waits for a worker to show up before it warns that none did.
WORKERS_GRACE_SECONDS = 5.0
# How long /healthz reuses its look for keys in the old key layout.
LAYOUT_CACHE_SECONDS = 10.0


def build_web_app(
    bolt: AsyncApp,
    settings: BotSettings,
    redis: aioredis.Redis,
    keys: Keys | None = None,
    agents: AgentDirectory | None = None,
) -> web.Application:
    """The aiohttp application: ``POST /slack/events`` (HTTP mode), ``GET /healthz`` (with
    the live workers when ``agents`` can read them) and ``GET /metrics`` (with the job gauges
    when ``keys`` are given)."""
    web_app = web.Application(client_max_size=MAX_BODY_BYTES)
    secret = settings.slack_signing_secret
    secret_value = secret.get_secret_value() if secret is not None else ""
    verifier = SignatureVerifier(secret_value) if secret is not None else None

    async def slack_events(request: web.Request) -> web.Response:
        raw = await request.read()
        if _is_ssl_check(raw, request.content_type):
            # Slack checks the URL's certificate with an unsigned ``ssl_check=1&token=…``;
            # Bolt answers it (before verifying) with an empty 200 and dispatches nothing.
            # Only that exact form is answered so: anything else is verified below.
            return web.Response(status=200, body=b"")
        # Checked on the raw bytes before any decoding or parsing, so a forged request
        # learns nothing about our parser and cannot make it fail.
        if verifier is None or not _signed_by_slack(verifier, raw, request):
            return web.json_response({"error": "invalid request"}, status=401)
        try:
            body = raw.decode("utf-8")
        except UnicodeDecodeError:
            return web.json_response({"error": "malformed payload"}, status=400)
        headers: Headers = {k: request.headers.getall(k) for k in request.headers}
        if bolt_compat.form_read_as_empty(body, request.content_type):
            body = bolt_compat.payload_word_escaped(body)
        try:
            bolt_req = AsyncBoltRequest(body=body, query=request.query_string, headers=headers)
            malformed = bolt_compat.malformed_payload(
                bolt_req.body, form=bolt_compat.plain_form(body, request.content_type)
            )
        except Exception:  # JSON that is not JSON, or of a shape Bolt's parse trips over
            malformed = True
        if malformed:
            log.warning("a signed Slack request with a malformed payload was refused")
            return web.json_response({"error": "malformed payload"}, status=400)
        try:
            bolt_resp = await bolt.async_dispatch(bolt_req)
        except (KeyError, TypeError, AttributeError, ValueError):
            # Bolt's matchers index the payload without checking its JSON types (see
            # bot.bolt_compat): a signed payload of the wrong shape is malformed, not a
            # server error (fuzzing found it).
            log.warning("a signed Slack request with a malformed payload was refused")
            return web.json_response({"error": "malformed payload"}, status=400)
        except Exception:
            log.exception("dispatching a Slack request failed")
            return web.json_response({"error": "internal error"}, status=500)
        return await to_aiohttp_response(bolt_resp)

    layout_seen: list[tuple[float, str | None]] = []

    async def layout_problem() -> str | None:
        """The old key layout's keys (read at most every LAYOUT_CACHE_SECONDS)."""
        if keys is None:
            return None
        now = asyncio.get_running_loop().time()
        if not layout_seen or now - layout_seen[0][0] >= LAYOUT_CACHE_SECONDS:
            layout_seen[:] = [(now, await old_layout_problem(redis, keys))]
        return layout_seen[0][1]

    async def healthz(request: web.Request) -> web.Response:
        try:
            await asyncio.wait_for(redis.ping(), timeout=2.0)
            old_layout = await asyncio.wait_for(layout_problem(), timeout=2.0)
            if agents is None or not agents.knows_workers:
                if old_layout is None:
                    return web.json_response({"ok": True})
                return web.json_response({"ok": True, "status": "degraded", "layout": old_layout})
            report = await asyncio.wait_for(agents.workers(look_elsewhere=True), timeout=2.0)
        except (RedisError, OSError, TimeoutError) as exc:
            return web.json_response({"ok": False, "redis": type(exc).__name__}, status=503)
        workers = report.as_dict()
        status = "degraded" if workers["problem"] or old_layout else "ok"
        body: dict[str, Any] = {"ok": True, "status": status, "workers": workers}
        if old_layout is not None:
            body["layout"] = old_layout
        return web.json_response(body)

    if verifier is not None and not settings.socket_mode:
        web_app.router.add_post(EVENTS_PATH, slack_events)
    web_app.router.add_get(HEALTH_PATH, healthz)
    web_app.router.add_get(metrics.METRICS_PATH, metrics.handler(redis, keys))
    return web_app


_SSL_CHECK_FIELDS = frozenset({"ssl_check", "token"})


def _is_ssl_check(raw: bytes, content_type: str) -> bool:
    """Exactly Slack's certificate check: a form of ``ssl_check=1`` and (optionally) one
    ``token``, nothing else. It does nothing, so it needs no signature (Slack sends none)."""
    if content_type != "application/x-www-form-urlencoded" or len(raw) > 1024:
        return False
    try:
        fields = parse_qs(raw.decode("ascii"), keep_blank_values=True, strict_parsing=True)
    except (UnicodeDecodeError, ValueError):
        return False
    return (
        fields.get("ssl_check") == ["1"]
        and set(fields) <= _SSL_CHECK_FIELDS
        and len(fields.get("token", [""])) == 1
    )


def _signed_by_slack(verifier: SignatureVerifier, body: bytes, request: web.Request) -> bool:
    """Valid ``v0`` signature and a timestamp within 5 minutes; anything odd is invalid."""
    try:
        return verifier.is_valid(
            body=body,
            timestamp=request.headers.get("X-Slack-Request-Timestamp", ""),
            signature=request.headers.get("X-Slack-Signature", ""),
        )
    except (ValueError, TypeError, OverflowError):  # e.g. a timestamp that is not a number
        return False


class BotServer:
    """One ``web`` process, startable in-process by tests (``port=0`` picks a free port)."""

    def __init__(
        self,
        settings: BotSettings,
        redis: aioredis.Redis,
        gateway: GatewayLike,
        client: AsyncWebClient | None = None,
        *,
        host: str | None = None,
        port: int | None = None,
        notifier_consumer: str | None = None,
        notifier_block_ms: int = 1000,
        run_notifier: bool = True,
        agents: Sequence[Agent] = (),
        workers_grace: float | None = None,
    ) -> None:
        """``agents``: those ``/agent <name>`` picks from, the default first (none: every run
        is the workers' default agent's). ``workers_grace``: warn in the log when, that many
        seconds after start, no worker serves this deployment (or one of ``agents``)."""
        self.settings = settings
        self.redis = redis
        self.gateway = gateway
        self.client = client or make_web_client(settings)
        self.agents = AgentDirectory(agents, redis, self._keys())
        self.context = BotContext.build(settings, redis, gateway, self.client, agents=self.agents)
        self.app = create_app(settings, redis, gateway, self.client, context=self.context)
        self.notifier = Notifier(
            gateway,
            self.context.publisher,
            self.context.store,
            consumer=notifier_consumer,
            block_ms=notifier_block_ms,
            concurrency=settings.notifier_concurrency,
            home=self.context.home,
            approvers=parse_approvers(settings.approvers),
        )
        self.host = settings.web_host if host is None else host
        self.port = settings.port if port is None else port
        self.run_notifier = run_notifier
        self.workers_grace = workers_grace
        self._workers_task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self._socket: Any = None
        self._stop = asyncio.Event()
        self._notifier_task: asyncio.Task[None] | None = None
        self._socket_task: asyncio.Task[Any] | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` once started."""
        assert self._runner is not None, "not started"
        port = self._runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    async def start(self) -> BotServer:
        if self.client.session is None:
            # One pooled HTTP session for every Web API call: slack_sdk otherwise opens a
            # session (and a connection) per call, which a burst of clicks turns into
            # hundreds of sockets.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64),
                timeout=aiohttp.ClientTimeout(total=30),
            )
            self.client.session = self._session
        self._runner = web.AppRunner(
            build_web_app(self.app, self.settings, self.redis, self._keys(), self.agents),
            access_log=None,
            handle_signals=False,
        )
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port).start()
        except OSError as exc:
            await self.stop()
            raise ConfigError(listen_problem(self.host, self.port, exc)) from None
        if self.settings.socket_mode:
            from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler

            assert self.settings.slack_app_token is not None
            self._socket = AsyncSocketModeHandler(
                self.app, self.settings.slack_app_token.get_secret_value(), web_client=self.client
            )
            # Connecting retries until it works; meanwhile /healthz and the notifier run.
            self._socket_task = asyncio.create_task(
                self._socket.connect_async(), name="socket-mode"
            )
        if self.run_notifier:
            self._notifier_task = asyncio.create_task(
                self.notifier.run(self._stop), name="notifier"
            )
        if self.workers_grace is not None and self.agents.knows_workers:
            self._workers_task = asyncio.create_task(
                self._check_workers(self.workers_grace), name="workers-check"
            )
        return self

    async def _check_workers(self, grace: float) -> None:
        """Warn once if, ``grace`` seconds after start, runs started here would not run: no
        worker under this KEY_PREFIX (naming the prefixes that have some), another SHARDS,
        or an agent no worker serves. Startup does not wait for it."""
        loop = asyncio.get_running_loop()
        end = loop.time() + grace
        problem: str | None = None
        while not self._stop.is_set():
            try:
                late = loop.time() >= end
                report = await self.agents.workers(look_elsewhere=late, fresh=True)
                problem = report.problem
            except (RedisError, OSError) as exc:
                log.info("could not read the live workers (%s)", type(exc).__name__)
                return
            if problem is None:
                log.info(
                    "workers: %d alive, serving %s",
                    report.alive,
                    ", ".join(report.agents) or "no agent",
                )
                return
            if late:
                break
            await asyncio.sleep(min(0.5, max(end - loop.time(), 0.0)))
        if problem is not None and not self._stop.is_set():
            log.warning("workers: %s", problem)

    def _keys(self) -> Keys | None:
        # GatewayLike does not promise key names; agent_core's Gateway has them.
        keys = getattr(self.gateway, "keys", None)
        return keys if isinstance(keys, Keys) else None

    async def stop(self) -> None:
        """Stop taking requests, finish acknowledged work, then stop the notifier."""
        self._stop.set()
        if self._workers_task is not None:
            self._workers_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._workers_task
            self._workers_task = None
        if self._socket is not None:
            with contextlib.suppress(Exception):
                await self._socket.close_async()
            self._socket = None
        if self._socket_task is not None:
            self._socket_task.cancel()
            with contextlib.suppress(BaseException):
                await self._socket_task
            self._socket_task = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.context.drain()
        if self._notifier_task is not None:
            try:
                await asyncio.wait_for(self._notifier_task, timeout=10)
            except (TimeoutError, asyncio.CancelledError):
                self._notifier_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._notifier_task
            self._notifier_task = None
        if self.context.home is not None:
            await self.context.home.close()
        if self._session is not None:
            self.client.session = None
            await self._session.close()
            self._session = None

    async def wait(self) -> None:
        """Until :meth:`request_stop` (SIGTERM/SIGINT), or until the notifier dies."""
        waiter = asyncio.create_task(self._stop.wait())
        tasks: set[asyncio.Task[Any]] = {waiter}
        if self._notifier_task is not None:
            tasks.add(self._notifier_task)
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()

    def request_stop(self) -> None:
        self._stop.set()


def listen_problem(host: str, port: int, exc: OSError) -> str:
    """The one line that says why the web process cannot listen, naming the variable."""
    if exc.errno == errno.EADDRINUSE:
        return f"PORT is taken: another process listens on {host}:{port}; set PORT to a free port"
    return f"WEB_HOST, PORT: cannot listen on {host}:{port} ({exc.strerror or exc})"


TOKEN_ERRORS = frozenset(
    {
        "invalid_auth",
        "not_authed",
        "account_inactive",
        "token_revoked",
        "token_expired",
        "not_allowed_token_type",
    }
)


async def check_slack(settings: BotSettings, client: AsyncWebClient) -> None:
    """Fail fast on a token Slack rejects; only warn when Slack cannot be reached."""
    checks: list[tuple[str, Any]] = [("SLACK_BOT_TOKEN", client.auth_test)]
    if settings.slack_app_token is not None:
        app_token = settings.slack_app_token.get_secret_value()
        checks.append(
            ("SLACK_APP_TOKEN", lambda: client.apps_connections_open(app_token=app_token))
        )
    for name, check in checks:
        try:
            await check()
        except SlackApiError as exc:
            err = slack_error(exc)
            if err in TOKEN_ERRORS:
                raise ConfigError(f"{name} was rejected by Slack ({err})") from None
            log.warning("checking %s with Slack failed (%s); continuing", name, err)
        except Exception as exc:
            log.warning(
                "could not reach Slack at %s to check %s (%s); continuing",
                settings.slack_api_url,
                name,
                type(exc).__name__,
            )


async def serve(settings: BotSettings, core: Settings) -> None:
    agents = load_agents(core)
    redis = await reachable_redis(
        core.redis_url, core.redis_cluster, failover_window=core.redis_failover_window
    )
    keys = Keys(core.key_prefix, core.shards)
    try:
        await refuse_old_layout(redis, keys)
    except ConfigError:
        await redis.aclose()
        raise
    gateway = Gateway(
        redis,
        keys,
        agent_name=agents[0].name,
        decision_replicas=core.decision_replicas,
    )
    server = BotServer(settings, redis, gateway, agents=agents, workers_grace=WORKERS_GRACE_SECONDS)
    try:
        await check_slack(settings, server.client)
    except ConfigError:
        await redis.aclose()
        raise
    try:
        await server.start()
    except ConfigError:
        await redis.aclose()
        raise
    mode = (
        "Socket Mode"
        if settings.socket_mode
        else f"HTTP on {server.host}:{server.port}{EVENTS_PATH}"
    )
    log.info(
        "web ready (%s, command %s, %s %s, %s, %s)",
        mode,
        settings.slash_command,
        "agents" if len(agents) > 1 else "agent",
        ", ".join(a.name for a in agents),
        "Redis Cluster" if is_cluster(redis) else "one Redis",
        running_loop_name(),
    )
    if not server.context.approvers.configured:
        log.warning(
            "APPROVERS is empty: nobody can approve tool calls (authorization fails closed)"
        )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.request_stop)
    freeze_startup_heap()
    try:
        await server.wait()
    finally:
        await server.stop()
        await redis.aclose()


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``agent-web`` (``python -m bot``, the Procfile's ``web``)."""
    from agent_core import cli
    from agent_core.settings import HELP as CORE_HELP

    from .settings import HELP

    args = cli.parser(
        "agent-web",
        "Serve the Slack app: slash command, buttons, thread replies and mentions (HTTP on "
        "PORT, or Socket Mode with SLACK_APP_TOKEN), and post run updates to Slack. "
        "Configured by environment variables only.",
        CORE_HELP,
        HELP,
    ).parse_args(argv)
    importable_from_cwd()
    # Every problem at once: the core's settings, the Slack ones, then the agent.
    problems: list[str] = []
    core: Settings | None = None
    settings: BotSettings | None = None
    try:
        core = Settings.from_env()
    except ConfigError as exc:
        problems += str(exc).splitlines()
    try:
        settings = load_settings()
    except ConfigError as exc:
        problems += str(exc).splitlines()
    agents: list[Agent] = []
    if core is not None:
        try:
            agents = load_agents(core)
        except ConfigError as exc:
            problems.append(str(exc))
    if problems or core is None or settings is None:
        # The playground hint, if any, stays last.
        problems.sort(key=lambda line: line == PLAYGROUND_HINT)
        exit_on_config_error(ConfigError("\n".join(problems)), notes={PLAYGROUND_HINT})
    if args.check:
        cli.run_check("agent-web", core, agents)
    logging.basicConfig(
        level=core.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        event_loop.run(serve(settings, core), core.event_loop)
    except ConfigError as exc:
        exit_on_config_error(exc, notes={PLAYGROUND_HINT})
    except KeyboardInterrupt:
        pass
