"""Configuration, read from environment variables at the edge of each process only."""

from __future__ import annotations

import os
import sys
from collections.abc import Collection, Mapping
from typing import Any, NoReturn

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from .exceptions import ConfigError

DEFAULT_AGENT = "agent_core.examples.ops:agent"

# What each variable is for and, for those you must set, where to get it: the second half of
# its line in a ConfigError. Never a value: secrets must not reach logs.
HELP: dict[str, str] = {
    "REDIS_URL": (
        "the Redis every process shares, e.g. redis://127.0.0.1:6379/0 (or rediss://, "
        "unix://); `make run` starts a local one when REDIS_URL is unset"
    ),
    "KEY_PREFIX": "the prefix of every Redis key: letters, digits, _ . -",
    "SHARDS": (
        "how many shards runs are spread over, 1 to 1296; fixed for a deployment (every "
        "process must agree, and run and gate ids encode it)"
    ),
    "DECISION_REPLICAS": (
        "the replicas a decision must reach (WAIT) before the click is acknowledged; 0 on a "
        "Redis without replicas, 1 or more with replicas (a failover then loses no decision)"
    ),
    "REDIS_CLUSTER": (
        "true to use redis-py's Redis Cluster client; unset detects a cluster at start"
    ),
    "OPENAI_API_KEY": (
        "the key of your model server: an OpenAI key from "
        "https://platform.openai.com/api-keys, or any non-empty value for a local server "
        "such as Ollama or vLLM (with OPENAI_BASE_URL)"
    ),
    "OPENAI_BASE_URL": "the Chat Completions endpoint; unset means OpenAI",
    "OPENAI_MODEL": "the model of agents that name none",
    "OPENAI_MAX_RETRIES": "the retries of one model call, 0 to 50",
    "OPENAI_RETRY_BUDGET": "the seconds one model call may spend retrying in all",
    "OPENAI_TIMEOUT": "the seconds one model request may take",
    "AGENT": (
        "the agent to run, as package.module:attribute, importable by the worker and web processes"
    ),
    "APPROVAL_TIMEOUT": "the seconds before a pending approval expires",
    "MAX_TURNS": "the model turns after which a run is failed, 1 to 1000",
    "WORKER_CONCURRENCY": "the jobs one worker advances at once, 1 to 1000",
    "WORKER_LEASE": "the seconds a worker's lease on a run lasts, at least 0.5",
    "JOB_MAX_DELIVERIES": "the deliveries before a job is dead-lettered, at least 1",
    "SWEEP_INTERVAL": "the longest wait of the expiry sweeper, in seconds, up to 60",
    "RUN_RETENTION": "the seconds a finished run is kept; 0 keeps it forever",
    "EVENTS_MAXLEN": "the backstop length of the events stream, at least 1000",
    "MAX_CALLS_PER_TURN": "the tool calls one model turn may make, 1 to 1000",
    "STUCK_RUN_AFTER": "the seconds without progress before a stuck run is repaired",
    "LOG_LEVEL": "the level of the logs",
    "METRICS_PORT": "the port of the worker's GET /metrics (Prometheus); 0 serves none",
    "METRICS_HOST": "the address the worker's /metrics listens on",
}


class Settings(BaseSettings):
    """Settings of the core (the worker, and the parts of the bot that talk to the core)."""

    # allow_inf_nan=False: APPROVAL_TIMEOUT=inf or nan is not a number of seconds.
    model_config = SettingsConfigDict(
        case_sensitive=False, extra="ignore", env_ignore_empty=True, allow_inf_nan=False
    )

    redis_url: str = Field(validation_alias="REDIS_URL")
    key_prefix: str = Field("agw", validation_alias="KEY_PREFIX", pattern=r"^[A-Za-z0-9_.-]+$")
    shards: int = Field(16, validation_alias="SHARDS", ge=1, le=1296)
    redis_cluster: bool | None = Field(None, validation_alias="REDIS_CLUSTER")
    decision_replicas: int = Field(0, validation_alias="DECISION_REPLICAS", ge=0, le=10)
    openai_api_key: SecretStr | None = Field(None, validation_alias="OPENAI_API_KEY")
    openai_base_url: str | None = Field(None, validation_alias="OPENAI_BASE_URL")
    openai_model: str = Field("gpt-4o-mini", validation_alias="OPENAI_MODEL", min_length=1)
    openai_max_retries: int = Field(10, validation_alias="OPENAI_MAX_RETRIES", ge=0, le=50)
    openai_retry_budget: float = Field(120.0, validation_alias="OPENAI_RETRY_BUDGET", ge=0)
    openai_timeout: float = Field(120.0, validation_alias="OPENAI_TIMEOUT", gt=0)
    agent: str = Field(DEFAULT_AGENT, validation_alias="AGENT", pattern=r"^[\w.]+:[\w.]+$")
    approval_timeout: float = Field(300.0, validation_alias="APPROVAL_TIMEOUT", gt=0)
    max_turns: int = Field(30, validation_alias="MAX_TURNS", ge=1, le=1000)
    worker_concurrency: int = Field(16, validation_alias="WORKER_CONCURRENCY", ge=1, le=1000)
    worker_lease: float = Field(5.0, validation_alias="WORKER_LEASE", ge=0.5)
    job_max_deliveries: int = Field(5, validation_alias="JOB_MAX_DELIVERIES", ge=1)
    sweep_interval: float = Field(1.0, validation_alias="SWEEP_INTERVAL", gt=0, le=60)
    run_retention: float = Field(7 * 86400, validation_alias="RUN_RETENTION", ge=0)
    events_maxlen: int = Field(1_000_000, validation_alias="EVENTS_MAXLEN", ge=1000)
    max_calls_per_turn: int = Field(64, validation_alias="MAX_CALLS_PER_TURN", ge=1, le=1000)
    stuck_run_after: float = Field(120.0, validation_alias="STUCK_RUN_AFTER", gt=0)
    log_level: str = Field("INFO", validation_alias="LOG_LEVEL")
    metrics_port: int = Field(0, validation_alias="METRICS_PORT", ge=0, le=65535)
    metrics_host: str = Field("127.0.0.1", validation_alias="METRICS_HOST", min_length=1)

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
