"""bot: the Slack front end of the approval gateway (Bolt for Python, asyncio)."""

from .app import create_app, make_web_client
from .settings import BotSettings, load_settings

__all__ = ["BotSettings", "create_app", "load_settings", "make_web_client"]
