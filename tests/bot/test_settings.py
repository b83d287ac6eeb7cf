"""Configuration: every problem at once, one line each naming the variable, never a value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent_core import ConfigError
from bot.settings import PLAYGROUND_HINT, load_settings
from tests.slack_fake import FakeSlack

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
    assert "SUPERSECRET" not in message
    return message


def problems_of(**values: str) -> list[str]:
    """The lines of the error, without the playground hint."""
    return [line for line in error_of(**values).splitlines() if line != PLAYGROUND_HINT]


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


def test_web_host() -> None:
    # Every interface by default (Slack must reach /slack/events); the playground says 127.0.0.1.
    assert load_settings(**base()).web_host == "0.0.0.0"
    assert load_settings(**base(WEB_HOST="127.0.0.1")).web_host == "127.0.0.1"
    assert load_settings(**base(WEB_HOST="::1")).web_host == "::1"


def test_api_url_gets_its_trailing_slash() -> None:
    assert (
        load_settings(**base(SLACK_API_URL="http://127.0.0.1:9/api")).slack_api_url
        == "http://127.0.0.1:9/api/"
    )


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"SLACK_SIGNING_SECRET": SECRET_SIGNING}, "SLACK_BOT_TOKEN is not set"),
        ({"SLACK_BOT_TOKEN": SECRET_TOKEN}, "SLACK_SIGNING_SECRET is not set"),
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
        (base(WEB_HOST="my laptop"), "WEB_HOST is invalid: must be an IP address"),
    ],
)
def test_bad_settings_name_the_variable(values: dict[str, str], expected: str) -> None:
    lines = problems_of(**values)
    assert len(lines) == 1, lines
    assert lines[0].startswith(expected), lines


def test_every_problem_at_once_one_line_each() -> None:
    lines = error_of(APPROVERS="U123,bob", PORT="70000").splitlines()
    assert lines == [
        "SLACK_BOT_TOKEN is not set: the bot token (xoxb-…) from your Slack app's "
        "OAuth & Permissions page",
        "SLACK_SIGNING_SECRET is not set: the signing secret from your Slack app's Basic "
        "Information page, under App Credentials (not needed in Socket Mode, with "
        "SLACK_APP_TOKEN)",
        "APPROVERS is invalid: 'bob' is not a user ID (U…), user-group ID (S…) or * — who may "
        "approve: user IDs (U…), user-group IDs (S…) and/or *, comma-separated",
        "PORT is invalid: Input should be less than or equal to 65535 — the HTTP port of the "
        "web process",
        PLAYGROUND_HINT,
    ]


def test_playground_hint_only_when_a_slack_credential_is_missing() -> None:
    assert PLAYGROUND_HINT in error_of(SLACK_SIGNING_SECRET=SECRET_SIGNING).splitlines()
    assert PLAYGROUND_HINT in error_of(SLACK_BOT_TOKEN=SECRET_TOKEN).splitlines()
    assert PLAYGROUND_HINT not in error_of(**base(PORT="http"))


@pytest.mark.parametrize("token", ["", "SUPERSECRET-not-a-token"])
def test_an_empty_or_bad_token_is_named_never_echoed(token: str) -> None:
    (line,) = problems_of(**base(SLACK_BOT_TOKEN=token))
    expected = "is not set" if not token else "is invalid: must be a bot token"
    assert line.startswith(f"SLACK_BOT_TOKEN {expected}"), line
    assert "OAuth & Permissions" in line


def test_an_invalid_app_token_does_not_also_ask_for_the_signing_secret() -> None:
    lines = problems_of(SLACK_BOT_TOKEN=SECRET_TOKEN, SLACK_APP_TOKEN="SUPERSECRET")
    assert len(lines) == 1 and lines[0].startswith("SLACK_APP_TOKEN is invalid"), lines


def test_missing_variables_come_from_the_environment_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith("SLACK_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SLACK_BOT_TOKEN", "")
    lines = error_of().splitlines()
    assert [line.split(":")[0] for line in lines[:-1]] == [
        "SLACK_BOT_TOKEN is not set",
        "SLACK_SIGNING_SECRET is not set",
    ]
    assert lines[-1] == PLAYGROUND_HINT


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
    env.update(
        {"REDIS_URL": redis_url, "SLACK_SIGNING_SECRET": SECRET_SIGNING, "APPROVERS": "U012AB"}
    )
    proc = subprocess.run(
        [sys.executable, "-m", "bot"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "config error: SLACK_BOT_TOKEN is not set: the bot token (xoxb-…) from your Slack "
        "app's OAuth & Permissions page",
        PLAYGROUND_HINT,
    ]
    assert proc.stdout == ""
    assert "SUPERSECRET" not in proc.stderr + proc.stdout


def test_process_reports_every_problem_at_once() -> None:
    """Core, Slack and AGENT problems together, no traceback, the hint last."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "SLACK_BOT_TOKEN": "SUPERSECRET-not-a-token",
        "APPROVAL_TIMEOUT": "SUPERSECRET",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "bot"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert [line.split(" is ")[0] for line in lines[:-1]] == [
        "config error: REDIS_URL",
        "config error: APPROVAL_TIMEOUT",
        "config error: SLACK_BOT_TOKEN",
        "config error: SLACK_SIGNING_SECRET",
    ]
    assert lines[-1] == PLAYGROUND_HINT
    assert "SUPERSECRET" not in proc.stderr


def test_process_names_an_unimportable_agent(redis_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLACK_")}
    env.update(base(REDIS_URL=redis_url, AGENT="my_missing_agents:agent"))
    proc = subprocess.run(
        [sys.executable, "-m", "bot"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith(
        "config error: AGENT is invalid: no module named 'my_missing_agents' "
        "(AGENT=my_missing_agents:agent)"
    ), line
    assert "PYTHONPATH" in line


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
