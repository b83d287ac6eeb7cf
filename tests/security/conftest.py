"""The Slack bot's fixtures (a fake Slack, the bot's web server in-process), shared here."""

from tests.bot.conftest import (  # noqa: F401 - fixtures, registered by import
    _hermetic_env,
    bot,
    fake_slack,
    fake_slack_server,
    journal,
    live,
    make_bot,
)
