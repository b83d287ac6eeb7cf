"""Configuration, read from environment variables at the edge of each process only."""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .exceptions import ConfigError

DEFAULT_AGENT = "agent_core.examples.ops:agent"


class Settings(BaseSettings):
    """Settings of the core (the worker, and the parts of the bot that talk to the core)."""

    # allow_inf_nan=False: APPROVAL_TIMEOUT=inf or nan is not a number of seconds.
    model_config = SettingsConfigDict(
        case_sensitive=False, extra="ignore", env_ignore_empty=True, allow_inf_nan=False
    )

    redis_url: str = Field(validation_alias="REDIS_URL")
    key_prefix: str = Field("agw", validation_alias="KEY_PREFIX", pattern=r"^[A-Za-z0-9_.-]+$")
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
    def from_env(cls, **overrides: Any) -> Settings:
        """Read the environment; a missing or invalid setting raises :class:`ConfigError`."""
        try:
            return cls(**overrides)
        except ValidationError as exc:
            raise config_error(exc) from None

    def require_openai(self) -> None:
        """The worker needs an API key (any non-empty string for Ollama or vLLM)."""
        if self.openai_api_key is None or not self.openai_api_key.get_secret_value():
            raise ConfigError(
                "OPENAI_API_KEY is not set (use any non-empty value for a local server "
                "such as Ollama or vLLM)"
            )


def config_error(exc: ValidationError) -> ConfigError:
    """One line naming the first bad variable, never echoing its value."""
    err = exc.errors(include_url=False, include_input=False)[0]
    loc = err.get("loc") or ("?",)
    var = str(loc[0]).upper()
    if err.get("type") == "missing":
        return ConfigError(f"{var} is not set")
    return ConfigError(f"{var} is invalid: {err.get('msg', 'invalid value')}")
