"""Configuration: one clear line naming the variable, never a secret value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_core import ConfigError
from bot.settings import load_settings
from bot.testing import FakeSlack

ROOT = Path(__file__).resolve().parents[2]
SECRET_TOKEN = "xoxb-SUPERSECRET-123"
SECRET_SIGNING = "signing-SUPERSECRET"


def base(**overrides: str) -> dict[str, str]:
    values = {"SLACK_BOT_TOKEN": SECRET_TOKEN, "SLACK_SIGNING_SECRET": SECRET_SIGNING}
    values.update(overrides)
    return values


def error_of(**values: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings(**values)
    message = str(info.value)
    assert "\n" not in message
    assert "SUPERSECRET" not in message
    return message


def test_defaults() -> None:
    s = load_settings(**base())
    assert s.slack_api_url == "https://slack.com/api/"
    assert (s.slash_command, s.port, s.allow_self_approval, s.approvers) == (
        "/agent",
        3000,
        False,
        "",
    )
    assert not s.socket_mode
    assert s.allow_external_approvers is False, "Slack Connect users are not approvers by default"
    assert "SUPERSECRET" not in repr(s) and "SUPERSECRET" not in str(s.model_dump())


def test_api_url_gets_its_trailing_slash() -> None:
    assert (
        load_settings(**base(SLACK_API_URL="http://127.0.0.1:9/api")).slack_api_url
        == "http://127.0.0.1:9/api/"
    )


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"SLACK_SIGNING_SECRET": SECRET_SIGNING}, "SLACK_BOT_TOKEN is not set"),
        ({"SLACK_BOT_TOKEN": SECRET_TOKEN}, "SLACK_SIGNING_SECRET is required"),
        (base(SLACK_BOT_TOKEN="SUPERSECRET-not-a-token"), "SLACK_BOT_TOKEN is invalid"),
        (
            base(SLACK_APP_TOKEN="xoxb-SUPERSECRET"),
            "SLACK_APP_TOKEN is invalid: must be an app-level token",
        ),
        (base(SLACK_API_URL="slack.com/api"), "SLACK_API_URL is invalid"),
        (base(APPROVERS="U123,bob"), "APPROVERS is invalid"),
        (base(PORT="http"), "PORT is invalid"),
        (base(PORT="70000"), "PORT is invalid"),
        (base(ALLOW_SELF_APPROVAL="maybe"), "ALLOW_SELF_APPROVAL is invalid"),
        (base(ALLOW_EXTERNAL_APPROVERS="maybe"), "ALLOW_EXTERNAL_APPROVERS is invalid"),
        (base(SLASH_COMMAND="agent"), "SLASH_COMMAND is invalid"),
    ],
)
def test_bad_settings_name_the_variable(values: dict[str, str], expected: str) -> None:
    assert expected in error_of(**values)


def test_external_approvers_can_be_allowed() -> None:
    assert load_settings(**base(ALLOW_EXTERNAL_APPROVERS="true")).allow_external_approvers


def test_socket_mode_needs_no_signing_secret() -> None:
    s = load_settings(SLACK_BOT_TOKEN=SECRET_TOKEN, SLACK_APP_TOKEN="xapp-1-abc")
    assert s.socket_mode and s.slack_signing_secret is None


def test_approver_lists() -> None:
    s = load_settings(**base(APPROVERS=" U01, S02 ,,*"))
    from bot.settings import parse_approvers

    assert parse_approvers(s.approvers) == ["U01", "S02", "*"]


def test_process_exits_with_one_line(redis_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLACK_")}
    env.update({"REDIS_URL": redis_url, "SLACK_SIGNING_SECRET": SECRET_SIGNING, "APPROVERS": "U1"})
    proc = subprocess.run(
        [sys.executable, "-m", "bot"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "config error: SLACK_BOT_TOKEN is not set"
    assert "SUPERSECRET" not in proc.stderr + proc.stdout


def test_rejected_token_is_one_clear_line(redis_url: str, fake_slack: FakeSlack) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLACK_")}
    env.update(
        {
            "REDIS_URL": redis_url,
            "AGENT": "tests.agents:ops",
            "SLACK_BOT_TOKEN": SECRET_TOKEN,
            "SLACK_SIGNING_SECRET": SECRET_SIGNING,
            "SLACK_API_URL": fake_slack.base_url,
        }
    )
    proc = subprocess.run(
        [sys.executable, "-m", "bot"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr.strip().splitlines()[-1]
        == "config error: SLACK_BOT_TOKEN was rejected by Slack (invalid_auth)"
    )
    assert "SUPERSECRET" not in proc.stderr + proc.stdout
