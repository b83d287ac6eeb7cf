"""The shipped manifest matches what the code serves and calls."""

from __future__ import annotations

import re
from pathlib import Path

from bot.server import EVENTS_PATH
from playground.launcher import slack_manifest

# The copy users paste into Slack's "create an app from a manifest" page.
USERS_COPY = Path(__file__).resolve().parents[2] / "slack" / "manifest.yml"
# The packaged copy (bot/manifest.yml): what the playground reads from an installed wheel.
MANIFEST = slack_manifest()


def test_the_packaged_manifest_is_the_one_users_copy() -> None:
    # Two files, one manifest: an edit to one must be made to the other.
    assert USERS_COPY.read_text(encoding="utf-8") == MANIFEST


def test_manifest_points_slack_at_the_bot() -> None:
    assert re.search(r"command: /agent\b", MANIFEST)
    urls = re.findall(r"(?:url|request_url): (\S+)", MANIFEST)
    assert len(urls) == 3 and all(u.endswith(EVENTS_PATH) for u in urls)
    assert re.search(r"interactivity:\s*\n\s*is_enabled: true", MANIFEST)
    assert "socket_mode_enabled: false" in MANIFEST


def test_manifest_grants_the_scopes_the_bot_uses() -> None:
    scopes = re.findall(r"^\s+- ([a-z_:.]+)\s", MANIFEST, re.MULTILINE)
    assert {"commands", "chat:write", "usergroups:read"} <= set(scopes)
    # conversations.replies / conversations.history, to find a card posted before a crash
    assert {"channels:history", "groups:history", "im:history", "mpim:history"} <= set(scopes)


def test_manifest_subscribes_to_the_thread_replies_it_handles() -> None:
    """A reply in a run's thread continues it (bot/conversations.py): the message events of
    the conversations the bot is in, each with the history scope it needs."""
    block = MANIFEST.split("event_subscriptions:", 1)[1].split("interactivity:", 1)[0]
    assert re.search(r"request_url: \S+" + re.escape(EVENTS_PATH), block)
    events = set(re.findall(r"^\s+- (message\.[a-z]+)", block, re.MULTILINE))
    assert events == {"message.channels", "message.groups", "message.im"}
    scopes = set(re.findall(r"^\s+- ([a-z_:.]+)\s", MANIFEST, re.MULTILINE))
    assert {"channels:history", "groups:history", "im:history"} <= scopes


def test_manifest_lets_mentions_and_dms_start_runs() -> None:
    """``@agent <task>`` (app_mention, app_mentions:read) and a DM to the app (message.im,
    with the app's Messages tab open to writing) start a run (bot/mentions.py)."""
    block = MANIFEST.split("event_subscriptions:", 1)[1].split("interactivity:", 1)[0]
    events = set(re.findall(r"^\s+- ([a-z_.]+)", block, re.MULTILINE))
    assert {"app_mention", "message.im"} <= events
    scopes = set(re.findall(r"^\s+- ([a-z_:.]+)\s", MANIFEST, re.MULTILINE))
    assert {"app_mentions:read", "im:history", "chat:write"} <= scopes
    assert "im:write" not in scopes  # the bot answers in DMs people opened; it opens none
    home = MANIFEST.split("app_home:", 1)[1].split("oauth_config:", 1)[0]
    assert re.search(r"messages_tab_enabled: true", home)
    assert re.search(r"messages_tab_read_only_enabled: false", home)


def test_manifest_opens_the_assistant_view() -> None:
    """Assistant threads (bot/assistant.py): the split view, its events, the status line's
    scope, and the names it shows (users:read for people, usergroups:read for groups)."""
    features = MANIFEST.split("features:", 1)[1].split("oauth_config:", 1)[0]
    view = re.search(r"\n  assistant_view:.*\n    assistant_description: (\S.*)\n", features)
    assert view is not None and view.group(1).strip()
    # The prompts are set per thread from the agent's definition, not fixed here.
    assert not re.search(r"^\s+suggested_prompts:", features, re.MULTILINE)
    block = MANIFEST.split("event_subscriptions:", 1)[1].split("interactivity:", 1)[0]
    events = set(re.findall(r"^\s+- ([a-z_.]+)", block, re.MULTILINE))
    assert {"assistant_thread_started", "assistant_thread_context_changed", "message.im"} <= events
    scopes = set(re.findall(r"^\s+- ([a-z_:.]+)\s", MANIFEST, re.MULTILINE))
    assert {
        "assistant:write",
        "chat:write",
        "im:history",
        "users:read",
        "usergroups:read",
    } <= scopes


def test_manifest_enables_the_home_tab() -> None:
    """Each approver's Home lists what waits for them (bot/home.py): the Home tab, and the
    event that says someone opened it."""
    home = MANIFEST.split("app_home:", 1)[1].split("oauth_config:", 1)[0]
    assert re.search(r"home_tab_enabled: true", home)
    block = MANIFEST.split("event_subscriptions:", 1)[1].split("interactivity:", 1)[0]
    assert "app_home_opened" in set(re.findall(r"^\s+- ([a-z_.]+)", block, re.MULTILINE))


def test_manifest_tells_the_app_when_it_is_back_in_a_channel() -> None:
    """``member_joined_channel`` (bot/rejoin.py): the app invited back to a channel shows the
    cards Slack refused to update while it was out; Slack sends it with ``channels:read``
    for public channels and ``groups:read`` for private ones."""
    block = MANIFEST.split("event_subscriptions:", 1)[1].split("interactivity:", 1)[0]
    events = set(re.findall(r"^\s+- ([a-z_.]+)", block, re.MULTILINE))
    assert "member_joined_channel" in events
    scopes = set(re.findall(r"^\s+- ([a-z_:.]+)\s", MANIFEST, re.MULTILINE))
    assert {"channels:read", "groups:read"} <= scopes
