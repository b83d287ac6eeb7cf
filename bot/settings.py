"""Settings of the Slack front end, read from the environment.

Core settings (REDIS_URL, OPENAI_*, AGENT, APPROVAL_TIMEOUT, …) belong to
``agent_core.Settings``; this module only adds what the Slack side needs.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent_core.exceptions import ConfigError
from agent_core.settings import config_problems, help_texts

_ID = re.compile(r"^[UWS][A-Z0-9]{2,}$")

# The last line of a ConfigError in which a Slack credential is missing.
PLAYGROUND_HINT = (
    "No Slack workspace yet? Run the `playground` command (with REDIS_URL set): it starts a "
    "local Slack in your browser, with this bot and a worker."
)
_CREDENTIALS = ("SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET")


def _not_set() -> PydanticCustomError:
    # Reported as a missing variable (type "missing"), like one absent from the environment.
    return PydanticCustomError("missing", "Field required")


class BotSettings(BaseSettings):
    """Everything the ``web`` process reads from the environment."""

    model_config = SettingsConfigDict(case_sensitive=False, extra="ignore")

    # Each Field's description is what the variable is for and, for those you must set, where
    # to get it: the text of its configuration error line, of `agent-web --help` and of the
    # documentation (see agent_core.settings.HELP); a ConfigError line never carries a value.
    slack_bot_token: SecretStr = Field(
        description="the bot token (xoxb-…) from your Slack app's OAuth & Permissions page"
    )
    # Before the signing secret: its check reads whether Socket Mode is on.
    slack_app_token: SecretStr | None = Field(
        default=None,
        description=(
            "the app-level token (xapp-…) for Socket Mode, from your Slack app's Basic "
            "Information page, under App-Level Tokens"
        ),
    )
    slack_signing_secret: SecretStr | None = Field(
        default=None,
        validate_default=True,
        description=(
            "the signing secret from your Slack app's Basic Information page, under App "
            "Credentials (not needed in Socket Mode, with SLACK_APP_TOKEN)"
        ),
    )
    slack_api_url: str = Field(
        default="https://slack.com/api/", description="the Slack Web API base URL"
    )
    approvers: str = Field(
        default="",
        description=(
            "who may approve: user IDs (U…), user-group IDs (S…) and/or *, comma-separated"
        ),
    )
    allow_self_approval: bool = Field(
        default=False,
        description=(
            "whether a call's requesters (the run's starter, whoever spoke in its thread) may "
            "approve it: true or false"
        ),
    )
    allow_external_approvers: bool = Field(
        default=False,
        description=(
            "whether, with APPROVERS=*, people of other workspaces may decide: true or false"
        ),
    )
    slash_command: str = Field(
        default="/agent", description="the slash command of your Slack app's manifest"
    )
    port: int = Field(default=3000, ge=1, le=65535, description="the HTTP port of the web process")
    # Where /slack/events, /healthz and /metrics listen (the playground sets 127.0.0.1).
    web_host: str = Field(
        default="0.0.0.0",
        min_length=1,
        description="the address the web process listens on: an IP address, e.g. 127.0.0.1",
    )
    slack_max_retries: int = Field(
        default=3,
        ge=0,
        le=10,
        description="the retries of a rate-limited Web API call, 0 to 10",
    )
    notifier_concurrency: int = Field(
        default=1,
        ge=1,
        le=64,
        description="the Slack threads the notifier updates side by side, 1 to 64",
    )

    @field_validator("slack_bot_token")
    @classmethod
    def _bot_token(cls, v: SecretStr) -> SecretStr:
        if not v.get_secret_value():
            raise _not_set()
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
    def _secret(cls, v: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        v = v if v is not None and v.get_secret_value() else None
        # HTTP mode (no SLACK_APP_TOKEN) verifies every request with it. An invalid
        # SLACK_APP_TOKEN (absent from info.data) is reported on its own.
        if v is None and "slack_app_token" in info.data and info.data["slack_app_token"] is None:
            raise _not_set()
        return v

    @field_validator("slack_api_url")
    @classmethod
    def _api_url(cls, v: str) -> str:
        v = v.strip()
        if not re.match(r"^https?://[^/\s]+", v):
            raise ValueError("must be an http(s) URL")
        # slack_sdk joins method names with urljoin: without the slash the last segment is lost.
        return v if v.endswith("/") else v + "/"

    @field_validator("web_host")
    @classmethod
    def _web_host(cls, v: str) -> str:
        v = v.strip()
        try:
            ipaddress.ip_address(v)
        except ValueError:
            raise ValueError("must be an IP address (0.0.0.0: every interface)") from None
        return v

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

    @property
    def socket_mode(self) -> bool:
        return self.slack_app_token is not None


HELP: dict[str, str] = help_texts(BotSettings)


def parse_approvers(spec: str) -> list[str]:
    """``"U1, S2 ,*"`` → ``["U1", "S2", "*"]`` (blank entries dropped)."""
    return [item.strip() for item in spec.split(",") if item.strip()]


def load_settings(**overrides: Any) -> BotSettings:
    """Read the environment (``overrides``, by variable name, win over it).

    Every missing or invalid variable is reported at once in one :class:`ConfigError`, one
    line each naming the variable, never its value: tokens and secrets must not reach logs.
    When a Slack credential is missing, a last line points at the local playground.
    """
    try:
        return BotSettings(**{k.lower(): v for k, v in overrides.items()})
    except ValidationError as exc:
        lines = config_problems(exc, HELP)
        if any(line.startswith(f"{var} is not set") for var in _CREDENTIALS for line in lines):
            lines.append(PLAYGROUND_HINT)
        raise ConfigError("\n".join(lines)) from None
