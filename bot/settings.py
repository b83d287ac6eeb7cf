"""Settings of the Slack front end, read from the environment.

Core settings (REDIS_URL, OPENAI_*, AGENT, APPROVAL_TIMEOUT, …) belong to
``agent_core.Settings``; this module only adds what the Slack side needs.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent_core.exceptions import ConfigError

_ID = re.compile(r"^[UWS][A-Z0-9]{2,}$")


class BotSettings(BaseSettings):
    """Everything the ``web`` process reads from the environment."""

    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore")

    slack_bot_token: SecretStr
    slack_signing_secret: SecretStr | None = None
    slack_app_token: SecretStr | None = None
    slack_api_url: str = "https://slack.com/api/"
    approvers: str = ""
    allow_self_approval: bool = False
    # With APPROVERS=*, may people from other workspaces (Slack Connect) approve or deny?
    allow_external_approvers: bool = False
    slash_command: str = "/agent"
    port: int = Field(default=3000, ge=1, le=65535)
    slack_max_retries: int = Field(default=3, ge=0, le=10)

    @field_validator("slack_bot_token")
    @classmethod
    def _bot_token(cls, v: SecretStr) -> SecretStr:
        if not v.get_secret_value().startswith("xox"):
            raise ValueError("must be a bot token (xoxb-…)")
        return v

    @field_validator("slack_app_token")
    @classmethod
    def _app_token(cls, v: SecretStr | None) -> SecretStr | None:
        if v is None or not v.get_secret_value():
            return None
        if not v.get_secret_value().startswith("xapp-"):
            raise ValueError("must be an app-level token (xapp-…)")
        return v

    @field_validator("slack_signing_secret")
    @classmethod
    def _secret(cls, v: SecretStr | None) -> SecretStr | None:
        return v if v is not None and v.get_secret_value() else None

    @field_validator("slack_api_url")
    @classmethod
    def _api_url(cls, v: str) -> str:
        v = v.strip()
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError("must be an http(s) URL")
        # slack_sdk joins method names with urljoin: without the slash the last segment is lost.
        return v if v.endswith("/") else v + "/"

    @field_validator("approvers")
    @classmethod
    def _approvers(cls, v: str) -> str:
        for item in parse_approvers(v):
            if item != "*" and not _ID.match(item):
                raise ValueError(f"{item[:20]!r} is not a user ID (U…), user-group ID (S…) or *")
        return v

    @field_validator("slash_command")
    @classmethod
    def _command(cls, v: str) -> str:
        if not re.match(r"^/[a-z0-9_-]{1,31}$", v):
            raise ValueError("must look like /agent")
        return v

    @model_validator(mode="after")
    def _mode(self) -> BotSettings:
        if self.slack_app_token is None and self.slack_signing_secret is None:
            raise ValueError("SLACK_SIGNING_SECRET is required in HTTP mode (no SLACK_APP_TOKEN)")
        return self

    @property
    def socket_mode(self) -> bool:
        return self.slack_app_token is not None


def parse_approvers(spec: str) -> list[str]:
    """``"U1, S2 ,*"`` → ``["U1", "S2", "*"]`` (blank entries dropped)."""
    return [item.strip() for item in spec.split(",") if item.strip()]


def load_settings(**overrides: Any) -> BotSettings:
    """Read the environment (``overrides``, by variable name, win over it).

    A problem becomes one :class:`ConfigError` naming the variable, never its value:
    tokens and secrets must not reach logs.
    """
    try:
        return BotSettings(**{k.lower(): v for k, v in overrides.items()})
    except ValidationError as exc:
        err = exc.errors(include_url=False, include_input=False)[0]
        loc = err.get("loc") or ()
        name = str(loc[0]).upper() if loc else ""
        msg = str(err.get("msg", "invalid"))
        if err.get("type") == "missing":
            raise ConfigError(f"{name} is not set") from None
        msg = msg.removeprefix("Value error, ")
        if name:
            raise ConfigError(f"{name} is invalid: {msg}") from None
        raise ConfigError(msg) from None
