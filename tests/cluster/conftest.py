"""Fixtures of the cluster tests: the fake Slack's, shared with the bot's tests."""

from tests.bot.conftest import (  # noqa: F401 - fixtures, registered by import
    _hermetic_env,
    fake_slack,
    fake_slack_server,
)
