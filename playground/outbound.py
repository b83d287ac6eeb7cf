"""Requests to the bot's ``/slack/events``, built and signed exactly as Slack sends them.

Slash commands are form-encoded fields; interactivity (``block_actions``,
``view_submission``, ``view_closed``) is one form field ``payload`` holding JSON; events are
a JSON ``event_callback`` envelope. Every request carries ``X-Slack-Request-Timestamp`` and
``X-Slack-Signature``. Slack gives the app 3 seconds to answer; so does the playground.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp

from . import people
from .wire import sign

ACK_TIMEOUT = 3.0  # seconds Slack waits for an acknowledgement


@dataclass(frozen=True)
class Answer:
    """What the bot answered: ``status`` 0 when it did not answer at all (``error`` says why)."""

    status: int
    body: str
    content_type: str
    error: str = ""

    def json(self) -> Any:
        try:
            return json.loads(self.body) if self.body.strip() else None
        except json.JSONDecodeError:
            return None


def _user(user_id: str) -> dict[str, Any]:
    name = people.display_name(user_id)
    return {
        "id": user_id,
        "username": name.lower(),
        "name": name.lower(),
        "team_id": people.TEAM_ID,
    }


def _team() -> dict[str, Any]:
    return {"id": people.TEAM_ID, "domain": "playground"}


class Sender:
    """Signs and sends requests to the bot (see the module docstring)."""

    def __init__(self, events_url: str, signing_secret: str) -> None:
        self.events_url = events_url
        self._secret = signing_secret
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _post(self, body: str, content_type: str) -> Answer:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        ts = str(int(time.time()))
        headers = {
            "Content-Type": content_type,
            "X-Slack-Request-Timestamp": ts,
            "X-Slack-Signature": sign(self._secret, ts, body),
            "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
        }
        try:
            async with self._session.post(
                self.events_url,
                data=body.encode(),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=ACK_TIMEOUT),
            ) as resp:
                return Answer(resp.status, await resp.text(), resp.headers.get("Content-Type", ""))
        except TimeoutError:
            return Answer(0, "", "", "operation_timeout")
        except aiohttp.ClientError as exc:
            return Answer(0, "", "", f"dispatch_failed ({type(exc).__name__}: is web running?)")

    async def command(
        self, *, user: str, command: str, text: str, response_url: str, trigger_id: str
    ) -> Answer:
        fields = {
            "token": "playground-verification-token",
            "team_id": people.TEAM_ID,
            "team_domain": "playground",
            "channel_id": people.CHANNEL_ID,
            "channel_name": people.CHANNEL_NAME,
            "user_id": user,
            "user_name": people.display_name(user).lower(),
            "command": command,
            "text": text,
            "api_app_id": people.APP_ID,
            "is_enterprise_install": "false",
            "response_url": response_url,
            "trigger_id": trigger_id,
        }
        return await self._post(urlencode(fields), "application/x-www-form-urlencoded")

    async def interaction(self, payload: dict[str, Any]) -> Answer:
        body = urlencode({"payload": json.dumps(payload, ensure_ascii=False)})
        return await self._post(body, "application/x-www-form-urlencoded")

    def block_actions(
        self,
        *,
        user: str,
        action: dict[str, Any],
        trigger_id: str,
        message: dict[str, Any] | None = None,
        container: dict[str, Any],
        response_url: str | None = None,
        view: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "type": "block_actions",
            "team": _team(),
            "user": _user(user),
            "api_app_id": people.APP_ID,
            "token": "playground-verification-token",
            "container": container,
            "trigger_id": trigger_id,
            "is_enterprise_install": False,
            "enterprise": None,
            "actions": [{**action, "action_ts": f"{time.time():.6f}"}],
            "state": {"values": {}},
        }
        if message is not None:
            payload["channel"] = {"id": people.CHANNEL_ID, "name": people.CHANNEL_NAME}
            payload["message"] = message
        if response_url is not None:
            payload["response_url"] = response_url
        if view is not None:
            payload["view"] = view
        return payload

    def view_payload(
        self, kind: str, *, user: str, view: dict[str, Any], values: dict[str, Any]
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "type": kind,
            "team": _team(),
            "user": _user(user),
            "api_app_id": people.APP_ID,
            "token": "playground-verification-token",
            "is_enterprise_install": False,
            "enterprise": None,
            "view": {**view, "state": {"values": values}},
        }
        if kind == "view_submission":
            payload["trigger_id"] = new_trigger_id()
            payload["response_urls"] = []
        else:
            payload["is_cleared"] = False
        return payload

    async def event(self, event: dict[str, Any]) -> Answer:
        envelope = {
            "token": "playground-verification-token",
            "team_id": people.TEAM_ID,
            "api_app_id": people.APP_ID,
            "event": event,
            "type": "event_callback",
            "event_id": "Ev" + secrets.token_hex(6).upper(),
            "event_time": int(time.time()),
            "authorizations": [
                {
                    "enterprise_id": None,
                    "team_id": people.TEAM_ID,
                    "user_id": people.BOT_USER_ID,
                    "is_bot": True,
                    "is_enterprise_install": False,
                }
            ],
            "is_ext_shared_channel": False,
        }
        return await self._post(json.dumps(envelope, ensure_ascii=False), "application/json")


def new_trigger_id() -> str:
    """A trigger id in Slack's shape (digits.digits.hex)."""
    return f"{int(time.time() * 1000)}.{secrets.randbelow(10**10)}.{secrets.token_hex(16)}"
