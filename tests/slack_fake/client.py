"""Requests to the bot's ``/slack/events`` as Slack sends them, for tests.

:class:`SlackClient` sends slash commands, ``block_actions`` and ``view_submission`` payloads
form-encoded and signed (``v0=`` HMAC-SHA256 of ``v0:{timestamp}:{body}``), and Events API
callbacks as JSON; a test may sign with another secret, at another time, or not at all.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import aiohttp

from playground.wire import sign

from .fake import FakeSlack


@dataclass(frozen=True)
class HttpResult:
    status: int
    text: str
    headers: Mapping[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.text) if self.text else None


class SlackClient:
    """Sends requests to the bot the way Slack does (form-encoded and signed)."""

    def __init__(
        self,
        url: str,
        signing_secret: str,
        *,
        team_id: str = "T0TEST",
        command: str = "/agent",
        fake: FakeSlack | None = None,
    ) -> None:
        self.url = url
        self.signing_secret = signing_secret
        self.team_id = team_id
        self.command_name = command
        self.fake = fake
        self._n = itertools.count(1)

    async def post(
        self,
        body: str,
        *,
        content_type: str = "application/x-www-form-urlencoded",
        timestamp: str | None = None,
        secret: str | None = None,
        signature: str | None = None,
        path: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> HttpResult:
        """POST ``body`` signed with ``secret`` (default: the real one) at ``timestamp``."""
        ts = timestamp if timestamp is not None else str(int(time.time()))
        sig = signature if signature is not None else sign(secret or self.signing_secret, ts, body)
        headers = {
            "Content-Type": content_type,
            "X-Slack-Request-Timestamp": ts,
            "X-Slack-Signature": sig,
            **(headers or {}),
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.url + path, data=body.encode(), headers=headers) as resp,
        ):
            return HttpResult(resp.status, await resp.text(), dict(resp.headers))

    def _response_url(self, name: str | None) -> str:
        if self.fake is None:
            return "https://hooks.slack.com/actions/T0TEST/1/fake"
        return self.fake.response_url(name or f"r{next(self._n)}")

    def command_body(
        self,
        text: str,
        *,
        user_id: str = "U0REQ",
        channel_id: str = "C0CHAN",
        response_url: str | None = None,
        command: str | None = None,
        team_id: str | None = None,
    ) -> str:
        return urlencode(
            {
                "token": "deprecated-verification-token",
                "team_id": team_id or self.team_id,
                "team_domain": "fake",
                "channel_id": channel_id,
                "channel_name": "general",
                "user_id": user_id,
                "user_name": user_id.lower(),
                "command": command or self.command_name,
                "text": text,
                "api_app_id": "A0APP",
                "is_enterprise_install": "false",
                "response_url": response_url or self._response_url(None),
                "trigger_id": f"trigger-{next(self._n)}",
            }
        )

    async def event(
        self,
        event: dict[str, Any],
        *,
        event_id: str | None = None,
        retry: int = 0,
        secret: str | None = None,
        signature: str | None = None,
    ) -> HttpResult:
        """An Events API ``event_callback`` carrying ``event``, as JSON; ``retry`` > 0 adds
        the headers of Slack's retries (``X-Slack-Retry-Num``, ``X-Slack-Retry-Reason``);
        ``secret``/``signature`` as in :meth:`post` (a forged one)."""
        body = {
            "token": "deprecated-verification-token",
            "team_id": self.team_id,
            "api_app_id": "A0APP",
            "event": event,
            "type": "event_callback",
            "event_id": event_id or f"Ev{next(self._n):08d}{time.time_ns() % 10**6:06d}",
            "event_time": int(time.time()),
        }
        headers = {}
        if retry:
            headers = {"X-Slack-Retry-Num": str(retry), "X-Slack-Retry-Reason": "http_timeout"}
        return await self.post(
            json.dumps(body),
            content_type="application/json",
            headers=headers,
            secret=secret,
            signature=signature,
        )

    async def member_joined(
        self, channel: str, user: str, *, inviter: str = "U0INVITER", **kwargs: Any
    ) -> HttpResult:
        """The ``member_joined_channel`` event Slack sends the app when ``user`` joins
        ``channel`` (the app itself, on ``/invite @app``: ``user`` is its bot user)."""
        event = {
            "type": "member_joined_channel",
            "user": user,
            "channel": channel,
            "channel_type": "G" if channel.startswith("G") else "C",
            "team": self.team_id,
            "inviter": inviter,
            "event_ts": f"{time.time():.6f}",
        }
        return await self.event(event, **kwargs)

    async def command(self, text: str, **kwargs: Any) -> HttpResult:
        """A slash command, e.g. ``await slack.command("delete user 42", user_id="U1")``."""
        return await self.post(self.command_body(text, **kwargs))

    def action_payload(
        self,
        action_id: str,
        value: str,
        *,
        user_id: str = "U0APPROVER",
        channel_id: str = "C0CHAN",
        message_ts: str = "1700000000.000100",
        trigger_id: str | None = None,
        response_url: str | None = None,
        block_id: str = "gate",
    ) -> dict[str, Any]:
        return {
            "type": "block_actions",
            "team": {"id": self.team_id, "domain": "fake"},
            "user": {"id": user_id, "username": user_id.lower(), "team_id": self.team_id},
            "api_app_id": "A0APP",
            "token": "deprecated-verification-token",
            "container": {
                "type": "message",
                "message_ts": message_ts,
                "channel_id": channel_id,
                "is_ephemeral": False,
            },
            "trigger_id": trigger_id or f"trigger-{next(self._n)}",
            "channel": {"id": channel_id, "name": "general"},
            "message": {"type": "message", "ts": message_ts, "text": "card", "blocks": []},
            "response_url": response_url or self._response_url(None),
            "actions": [
                {
                    "type": "button",
                    "action_id": action_id,
                    "block_id": block_id,
                    "value": value,
                    "text": {"type": "plain_text", "text": action_id},
                    "action_ts": f"{time.time():.6f}",
                }
            ],
        }

    async def action(self, action_id: str, value: str, **kwargs: Any) -> HttpResult:
        """A button click (``block_actions``), e.g. ``await slack.action("gate_approve", gid)``."""
        return await self.payload(self.action_payload(action_id, value, **kwargs))

    def view_payload(
        self,
        callback_id: str,
        private_metadata: str,
        values: dict[str, dict[str, dict[str, Any]]] | None = None,
        *,
        user_id: str = "U0APPROVER",
    ) -> dict[str, Any]:
        return {
            "type": "view_submission",
            "team": {"id": self.team_id, "domain": "fake"},
            "user": {"id": user_id, "username": user_id.lower(), "team_id": self.team_id},
            "api_app_id": "A0APP",
            "token": "deprecated-verification-token",
            "trigger_id": f"trigger-{next(self._n)}",
            "view": {
                "id": "V0VIEW",
                "type": "modal",
                "callback_id": callback_id,
                "private_metadata": private_metadata,
                "state": {"values": values or {}},
                "hash": "1",
            },
            "response_urls": [],
        }

    async def view_submission(
        self, callback_id: str, private_metadata: str, **kwargs: Any
    ) -> HttpResult:
        """A modal submission; ``values`` as in ``view.state.values``."""
        return await self.payload(self.view_payload(callback_id, private_metadata, **kwargs))

    async def payload(self, payload: dict[str, Any], **kwargs: Any) -> HttpResult:
        """Any interactivity payload, sent as ``payload=<json>``."""
        return await self.post(urlencode({"payload": json.dumps(payload)}), **kwargs)
