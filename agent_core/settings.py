"""Configuration, read from environment variables at the edge of each process only."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from .event_loop import EventLoopChoice
from .exceptions import ConfigError
from .nudges import Nudges, ids
from .routes import ApprovalRoute, parse_routes

if TYPE_CHECKING:
    from .agent import Agent

DEFAULT_AGENT = "agent_core.examples.ops:agent"
_AGENT_PATH = r"^[\w.]+:[\w.]+$"


class Settings(BaseSettings):
    """Settings of the core (the worker, and the parts of the bot that talk to the core)."""

    # allow_inf_nan=False: APPROVAL_TIMEOUT=inf or nan is not a number of seconds.
    model_config = SettingsConfigDict(
        case_sensitive=False, extra="ignore", env_ignore_empty=True, allow_inf_nan=False
    )

    # Each Field's description is what the variable is for and, for those you must set, where
    # to get it: the one text of its configuration error line, of `--help` and of the
    # documentation's configuration reference (HELP, below). Never a value: secrets must not
    # reach logs.
    redis_url: str = Field(
        validation_alias="REDIS_URL",
        description=(
            "the Redis every process shares, e.g. redis://127.0.0.1:6379/0 (or rediss://, unix://)"
        ),
    )
    key_prefix: str = Field(
        "agw",
        validation_alias="KEY_PREFIX",
        pattern=r"^[A-Za-z0-9_.-]+$",
        description=(
            "the prefix of every Redis key (and of each shard's hash tag): letters, digits, _ . -"
        ),
    )
    shards: int = Field(
        16,
        validation_alias="SHARDS",
        ge=1,
        le=1296,
        description=(
            "how many shards runs are spread over, 1 to 1296; fixed for a deployment (every "
            "process must agree, and run and gate ids encode it)"
        ),
    )
    redis_cluster: bool | None = Field(
        None,
        validation_alias="REDIS_CLUSTER",
        description="true to use redis-py's Redis Cluster client; unset detects a cluster at start",
    )
    redis_failover_window: float = Field(
        10.0,
        validation_alias="REDIS_FAILOVER_WINDOW",
        ge=0,
        description=(
            "the seconds a Redis Cluster command is retried while a master fails over, "
            "at least 0; above cluster-node-timeout + 2 s"
        ),
    )
    decision_replicas: int = Field(
        0,
        validation_alias="DECISION_REPLICAS",
        ge=0,
        le=10,
        description=(
            "the replicas a decision must reach (WAIT) before the click is acknowledged, and a "
            "tool call's claim before the tool starts; 0 on a Redis without replicas, 1 or more "
            "with replicas (a failover then loses no decision and runs no call twice)"
        ),
    )
    openai_api_key: SecretStr | None = Field(
        None,
        validation_alias="OPENAI_API_KEY",
        description=(
            "the key of your model server: an OpenAI key from "
            "https://platform.openai.com/api-keys, or any non-empty value for a local server "
            "such as Ollama or vLLM (with OPENAI_BASE_URL)"
        ),
    )
    openai_base_url: str | None = Field(
        None,
        validation_alias="OPENAI_BASE_URL",
        description=(
            "the Chat Completions endpoint (Ollama, vLLM, LiteLLM, …); unset means OpenAI"
        ),
    )
    openai_model: str = Field(
        "gpt-4o-mini",
        validation_alias="OPENAI_MODEL",
        min_length=1,
        description="the model of agents that name none",
    )
    openai_max_retries: int = Field(
        10,
        validation_alias="OPENAI_MAX_RETRIES",
        ge=0,
        le=50,
        description=(
            "the retries of one model call, 0 to 50 (on a 429 that is not out of quota, a 5xx, "
            "a timeout, a connection error; never on another 4xx)"
        ),
    )
    openai_retry_budget: float = Field(
        120.0,
        validation_alias="OPENAI_RETRY_BUDGET",
        ge=0,
        description=(
            "the seconds one model call may spend retrying in all; past it the run fails, retryable"
        ),
    )
    openai_timeout: float = Field(
        120.0,
        validation_alias="OPENAI_TIMEOUT",
        gt=0,
        description="the seconds one model request may take",
    )
    agent: str = Field(
        DEFAULT_AGENT,
        validation_alias="AGENT",
        pattern=_AGENT_PATH,
        description=(
            "the agent to run, as package.module:attribute, importable by the worker and web "
            "processes"
        ),
    )
    agents_spec: str | None = Field(
        None,
        validation_alias="AGENTS",
        description=(
            "the agents to run, comma-separated package.module:attribute paths (the first is "
            "the default); instead of AGENT"
        ),
    )
    """AGENTS as set; :attr:`agents` is the parsed list."""
    approval_timeout: float = Field(
        300.0,
        validation_alias="APPROVAL_TIMEOUT",
        gt=0,
        description="the seconds before a pending approval expires (an agent may set its own)",
    )
    remind_after: float | None = Field(
        None,
        validation_alias="REMIND_AFTER",
        ge=0,
        description=(
            "the seconds after which the approvers of a gate still pending are reminded, once "
            "(a tool or an agent may set its own); unset or 0: no reminder"
        ),
    )
    escalate_after: float | None = Field(
        None,
        validation_alias="ESCALATE_AFTER",
        ge=0,
        description=(
            "the seconds after which a gate still pending is escalated to ESCALATE_TO, who may "
            "then decide it too (a tool or an agent may set its own); unset or 0: none"
        ),
    )
    escalate_to: str | None = Field(
        None,
        validation_alias="ESCALATE_TO",
        description=(
            "who a gate is escalated to after ESCALATE_AFTER: user IDs (U…) and/or user-group "
            "IDs (S…), comma-separated"
        ),
    )
    approval_routes_spec: str | None = Field(
        None,
        validation_alias="APPROVAL_ROUTES",
        description=(
            "per tool, who may decide its calls and the channel its cards go to, as JSON: "
            '{"send_money": {"channel": "C0FINANCE", "approvers": "S0FINANCE"}} (approvers: '
            "a Slack ID or a list; wins over the tool's and the agent's own)"
        ),
    )
    """APPROVAL_ROUTES as set; :attr:`approval_routes` is the parsed map."""
    max_turns: int = Field(
        30,
        validation_alias="MAX_TURNS",
        ge=1,
        le=1000,
        description="the model turns after which a run is failed, 1 to 1000",
    )
    worker_concurrency: int = Field(
        16,
        validation_alias="WORKER_CONCURRENCY",
        ge=1,
        le=1000,
        description="the jobs one worker advances at once, 1 to 1000",
    )
    worker_lease: float = Field(
        5.0,
        validation_alias="WORKER_LEASE",
        ge=0.5,
        description=(
            "the seconds a worker's lease on a run lasts, at least 0.5 (renewed every third of "
            "it; a silent worker's runs are taken over after about 1.25 times this)"
        ),
    )
    job_max_deliveries: int = Field(
        5,
        validation_alias="JOB_MAX_DELIVERIES",
        ge=1,
        description=("the deliveries before a job is dead-lettered and its run failed, at least 1"),
    )
    sweep_interval: float = Field(
        1.0,
        validation_alias="SWEEP_INTERVAL",
        gt=0,
        le=60,
        description="the longest wait of the expiry sweeper, in seconds, up to 60",
    )
    run_retention: float = Field(
        7 * 86400,
        validation_alias="RUN_RETENTION",
        ge=0,
        description="the seconds a finished run is kept; 0 keeps it forever",
    )
    audit_retention: float = Field(
        400 * 86400,
        validation_alias="AUDIT_RETENTION",
        ge=0,
        description=(
            "the seconds an audit trail entry is kept, whatever RUN_RETENTION says; 0 keeps "
            "them forever"
        ),
    )
    events_maxlen: int = Field(
        1_000_000,
        validation_alias="EVENTS_MAXLEN",
        ge=1000,
        description=(
            "the backstop length of the events stream, at least 1000 (events are trimmed once "
            "every consumer group has read them)"
        ),
    )
    max_calls_per_turn: int = Field(
        64,
        validation_alias="MAX_CALLS_PER_TURN",
        ge=1,
        le=1000,
        description="the tool calls one model turn may make, 1 to 1000",
    )
    stuck_run_after: float = Field(
        120.0,
        validation_alias="STUCK_RUN_AFTER",
        gt=0,
        description="the seconds without progress before a stuck run is repaired",
    )
    log_level: str = Field(
        "INFO", validation_alias="LOG_LEVEL", description="the level of the logs"
    )
    event_loop: EventLoopChoice = Field(
        "auto",
        validation_alias="EVENT_LOOP",
        description=(
            "the processes' event loop: auto (uvloop where it is installed), uvloop or asyncio"
        ),
    )
    metrics_port: int = Field(
        0,
        validation_alias="METRICS_PORT",
        ge=0,
        le=65535,
        description=(
            "the port of the worker's GET /metrics (Prometheus); 0 serves none (web serves it "
            "on PORT)"
        ),
    )
    metrics_host: str = Field(
        "127.0.0.1",
        validation_alias="METRICS_HOST",
        min_length=1,
        description="the address the worker's /metrics listens on",
    )

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, v: str) -> str:
        if not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return v

    @field_validator("log_level")
    @classmethod
    def _level(cls, v: str) -> str:
        v = v.upper()
        if v not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError("must be DEBUG, INFO, WARNING or ERROR")
        return v

    @field_validator("agents_spec")
    @classmethod
    def _agents(cls, v: str | None) -> str | None:
        return None if v is None else ",".join(parse_agents(v))

    @field_validator("escalate_to")
    @classmethod
    def _escalate_to(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        try:
            return ",".join(ids(v, "ESCALATE_TO") or ())
        except ValueError as exc:
            raise ValueError(str(exc).removeprefix("ESCALATE_TO: ")) from None

    @field_validator("approval_routes_spec")
    @classmethod
    def _routes(cls, v: str | None) -> str | None:
        if v is not None:
            parse_routes(v)
        return v

    @property
    def approval_routes(self) -> dict[str, ApprovalRoute]:
        """APPROVAL_ROUTES parsed: tool name → its route (see :mod:`agent_core.routes`)."""
        return parse_routes(self.approval_routes_spec) if self.approval_routes_spec else {}

    @model_validator(mode="after")
    def _agent_or_agents(self) -> Settings:
        if self.agents_spec is not None and "agent" in self.model_fields_set:
            raise ValueError(BOTH_AGENT_VARIABLES)
        return self

    @model_validator(mode="after")
    def _nudges_fit(self) -> Settings:
        nudges = self.nudges  # ValueError for ESCALATE_AFTER without ESCALATE_TO, and back
        for var, value in (
            ("REMIND_AFTER", nudges.remind_after),
            ("ESCALATE_AFTER", nudges.escalate_after),
        ):
            if value and value >= self.approval_timeout:
                raise ValueError(
                    f"{var} ({value:g} s) is not shorter than APPROVAL_TIMEOUT "
                    f"({self.approval_timeout:g} s), so it would never fire"
                )
        return self

    @property
    def nudges(self) -> Nudges:
        """The default reminder and escalation of every gate (REMIND_AFTER,
        ESCALATE_AFTER, ESCALATE_TO; see :mod:`agent_core.nudges`)."""
        return Nudges.of(
            self.remind_after,
            self.escalate_after,
            self.escalate_to,
            names=("REMIND_AFTER", "ESCALATE_AFTER", "ESCALATE_TO"),
        )

    @property
    def agents(self) -> list[str]:
        """The ``package.module:attribute`` of every agent, the default first: AGENTS, or
        AGENT alone."""
        return self.agents_spec.split(",") if self.agents_spec else [self.agent]

    @property
    def agents_variable(self) -> str:
        """The variable that names the agents (``AGENTS`` or ``AGENT``), for messages."""
        return "AGENTS" if self.agents_spec else "AGENT"

    @classmethod
    def from_env(cls, *, require_openai: bool = False, **overrides: Any) -> Settings:
        """Read the environment (``overrides``, by variable name, win over it).

        Every missing or invalid variable is reported at once, one line each, in one
        :class:`ConfigError`. ``require_openai=True`` (the worker) also requires
        ``OPENAI_API_KEY``.
        """
        model: type[Settings] = _WorkerSettings if require_openai else cls
        try:
            settings = model(**overrides)
        except ValidationError as exc:
            raise ConfigError("\n".join(config_problems(exc))) from None
        if require_openai:
            settings.require_openai()
        return settings

    def require_openai(self) -> None:
        """The worker needs an API key (any non-empty string for Ollama or vLLM)."""
        if self.openai_api_key is None or not self.openai_api_key.get_secret_value():
            raise ConfigError(not_set("OPENAI_API_KEY"))


def help_texts(model: type[BaseModel]) -> dict[str, str]:
    """Each environment variable ``model`` reads and its Field's description, in field order:
    the text of its configuration error line, of ``--help`` and of the documentation."""
    texts: dict[str, str] = {}
    for name, field in model.model_fields.items():
        alias = field.validation_alias
        var = alias if isinstance(alias, str) else name.upper()
        if field.description:
            texts[var] = field.description
    return texts


HELP: dict[str, str] = help_texts(Settings)


BOTH_AGENT_VARIABLES = (
    "AGENT and AGENTS are both set: set only one (AGENTS lists every agent, the first being "
    "the default; AGENT names a single agent)"
)


def parse_agents(spec: str) -> list[str]:
    """``"a.b:x, a.c:y"`` → ``["a.b:x", "a.c:y"]``; ValueError (naming the entry by its
    position, never echoing it) when an entry is not ``package.module:attribute``, repeats
    another, or there is none."""
    paths = [item.strip() for item in spec.split(",") if item.strip()]
    if not paths:
        raise ValueError("lists no agent")
    for i, path in enumerate(paths, 1):
        if not re.match(_AGENT_PATH, path):
            raise ValueError(f"entry {i} is not package.module:attribute")
        if paths.index(path) != i - 1:
            raise ValueError(f"entry {i} repeats entry {paths.index(path) + 1}")
    return paths


def load_agents(settings: Settings) -> list[Agent]:
    """Import every agent ``settings`` names (AGENTS, or AGENT), the default first.

    Every failure is one :class:`ConfigError` line naming the variable that was set: an
    entry that cannot be imported or is no Agent, two different agents with one name (their
    sub-agents included), names only case tells apart, or (with several agents) a name
    ``/agent <name>`` cannot pick because it has a space.
    """
    from .agent import load_agent

    var = settings.agents_variable
    loaded: list[tuple[str, Agent]] = []
    for path in settings.agents:
        try:
            loaded.append((path, load_agent(path)))
        except ConfigError as exc:
            if var == "AGENT":
                raise
            raise ConfigError(_in_agents(str(exc))) from None
    _check_names(loaded, var)
    return [agent for _path, agent in loaded]


def _in_agents(line: str) -> str:
    """``load_agent``'s line about AGENT, said of an entry of AGENTS."""
    line = line.replace("AGENT is invalid:", "AGENTS is invalid:", 1)
    return line.replace("(AGENT=", "(in AGENTS: ")


def _check_names(loaded: list[tuple[str, Agent]], var: str) -> None:
    by_name: dict[str, tuple[str, Agent]] = {}  # every agent reachable, by name
    tops: dict[str, tuple[str, Agent]] = {}  # the listed ones, by folded name
    for path, top in loaded:
        folded = top.name.casefold()
        if folded in tops:
            other_path, other = tops[folded]
            why = "name the same agent" if other is top else "differ only in case"
            if other is not top and other.name == top.name:
                why = f"are two different agents named {top.name!r}"
            raise ConfigError(
                f"{var} is invalid: {other_path} and {path} {why}; give each agent its own name"
            )
        tops[folded] = (path, top)
        if len(loaded) > 1 and len(top.name.split()) != 1:
            raise ConfigError(
                f"{var} is invalid: the agent of {path} is named {top.name!r}; "
                "`/agent <name> <task>` picks an agent by one word, so give it a name without spaces"
            )
        for a in top.all_agents():
            where = path if a is top else f"a sub-agent of {path}"
            seen = by_name.setdefault(a.name, (where, a))
            if seen[1] is not a:
                raise ConfigError(
                    f"{var} is invalid: two different agents are named {a.name!r} ({seen[0]} "
                    f"and {where}); give each agent its own name"
                )


class _WorkerSettings(Settings):
    """The worker's settings: the same, with OPENAI_API_KEY required."""

    openai_api_key: SecretStr = Field(validation_alias="OPENAI_API_KEY")

    @field_validator("openai_api_key")
    @classmethod
    def _key(cls, v: SecretStr) -> SecretStr:
        if not v.get_secret_value():  # an empty override, reported as not set
            raise PydanticCustomError("missing", "Field required")
        return v


def not_set(var: str, texts: Mapping[str, str] = HELP) -> str:
    """The line for a variable that is not set: what it is for and where to get it."""
    about = texts.get(var)
    return f"{var} is not set: {about}" if about else f"{var} is not set"


def config_problems(exc: ValidationError, texts: Mapping[str, str] = HELP) -> list[str]:
    """One line per bad variable, in field order, never echoing a value."""
    lines: list[str] = []
    for err in exc.errors(include_url=False, include_input=False, include_context=False):
        loc = err.get("loc") or ()
        var = str(loc[0]).upper() if loc else ""
        if err.get("type") == "missing" and var:
            line = not_set(var, texts)
        else:
            msg = str(err.get("msg") or "invalid value").removeprefix("Value error, ")
            if not var:
                line = msg
            else:
                about = texts.get(var)
                line = f"{var} is invalid: {msg}" + (f" — {about}" if about else "")
        if line not in lines:
            lines.append(line)
    return lines


def exit_on_config_error(exc: ConfigError, *, notes: Collection[str] = ()) -> NoReturn:
    """Print each line of a ConfigError as ``config error: …`` on stderr and exit with 2.

    Lines in ``notes`` (advice rather than problems) are printed as they are.
    """
    for line in str(exc).splitlines():
        print(line if line in notes else f"config error: {line}", file=sys.stderr)
    raise SystemExit(2)


def importable_from_cwd() -> None:
    """Put the working directory on ``sys.path`` as ``python -m`` does, so that the
    ``agent-worker`` and ``agent-web`` scripts find an AGENT module where ``python -m`` would."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
