"""The shipped manifest matches what the code serves and calls."""

from __future__ import annotations

import re
from pathlib import Path

from bot.server import EVENTS_PATH

MANIFEST = (Path(__file__).resolve().parents[2] / "slack" / "manifest.yml").read_text()


def test_manifest_points_slack_at_the_bot() -> None:
    assert re.search(r"command: /agent\b", MANIFEST)
    urls = re.findall(r"(?:url|request_url): (\S+)", MANIFEST)
    assert len(urls) == 3 and all(u.endswith(EVENTS_PATH) for u in urls)
    assert re.search(r"interactivity:\s*\n\s*is_enabled: true", MANIFEST)
    assert "socket_mode_enabled: false" in MANIFEST


def test_manifest_grants_the_scopes_the_bot_uses() -> None:
    scopes = re.findall(r"^\s+- ([a-z:.]+)\s", MANIFEST, re.MULTILINE)
    assert {"commands", "chat:write", "usergroups:read"} <= set(scopes)
    # conversations.replies / conversations.history, to find a card posted before a crash
    assert {"channels:history", "groups:history", "im:history", "mpim:history"} <= set(scopes)


def test_manifest_subscribes_to_the_thread_replies_it_handles() -> None:
    """A reply in a run's thread continues it (bot/conversations.py): the message events of
    the conversations the bot is in, each with the history scope it needs."""
    block = MANIFEST.split("event_subscriptions:", 1)[1].split("interactivity:", 1)[0]
    assert re.search(r"request_url: \S+" + re.escape(EVENTS_PATH), block)
    events = set(re.findall(r"^\s+- (message\.[a-z]+)", block, re.MULTILINE))
    assert events == {"message.channels", "message.groups"}
    scopes = set(re.findall(r"^\s+- ([a-z:.]+)\s", MANIFEST, re.MULTILINE))
    assert {"channels:history", "groups:history"} <= scopes
