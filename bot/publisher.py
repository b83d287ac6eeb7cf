"""Puts the truth on Slack: posts and updates gate cards and run messages.

Every method renders from the current state in Redis (the gate record, the stored tool
result), under a per-gate or per-run lock, so events delivered twice, out of order or to
two replicas at once all converge on one card showing the latest state. An unchanged
rendering is not sent again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from . import cards
from .ports import GatewayLike
from .store import Store

log = logging.getLogger(__name__)

# Slack refused the size or shape of the blocks: a smaller card may still go through.
TOO_BIG = frozenset({"invalid_blocks", "msg_blocks_too_long", "msg_too_long"})
# Errors worth trying again later; any other Slack error will not fix itself.
TRANSIENT_SLACK_ERRORS = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)


class TransientSlackError(Exception):
    """Slack could not be reached or asked us to come back later."""


def slack_error(exc: BaseException) -> str:
    """A short, secret-free description of a Web API failure."""
    if isinstance(exc, SlackApiError):
        err = exc.response.get("error") if exc.response is not None else None
        return str(err or "error")
    return type(exc).__name__


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, SlackApiError):
        return slack_error(exc) in TRANSIENT_SLACK_ERRORS or exc.response.status_code >= 500
    return True


def digest(card: cards.Card) -> str:
    raw = json.dumps([card.text, card.blocks], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


class Publisher:
    def __init__(
        self, gateway: GatewayLike, store: Store, client: AsyncWebClient, command: str = "/agent"
    ) -> None:
        self.gateway = gateway
        self.store = store
        self.client = client
        self.command = command

    async def show_gate(self, gate_id: str) -> None:
        """Post the gate's card, or update it to the gate's current state.

        Raises :class:`TransientSlackError` when Slack should be tried again later.
        """
        async with self.store.lock(f"gate:{gate_id}"):
            gate = await self.gateway.get_gate(gate_id)
            if gate is None:
                return
            rec = await self.store.card(gate_id)
            card = cards.gate_card(gate, rec.result)
            smaller = cards.gate_card(gate, rec.result, compact=True)
            d = digest(card)
            if rec.channel and rec.ts:
                if rec.digest == d:
                    return
                ok = await self._send_card(
                    "chat_update", card, smaller, channel=rec.channel, ts=rec.ts
                )
                if ok is not None:
                    await self.store.set_card_digest(gate_id, d)
                return
            channel = gate.origin.get("channel")
            if not isinstance(channel, str) or not channel:
                return  # a run started outside Slack: no card
            resp = await self._send_card(
                "chat_postMessage",
                card,
                smaller,
                channel=channel,
                thread_ts=_opt_str(gate.origin.get("thread_ts")),
            )
            if resp is not None:
                await self.store.save_card(
                    gate_id, str(resp.get("channel") or channel), str(resp["ts"]), d
                )

    async def show_run(self, run_id: str) -> None:
        """Update the run's root message ("Task started by …") to its current status."""
        async with self.store.lock(f"run:{run_id}"):
            run = await self.gateway.get_run(run_id)
            if run is None:
                return
            rec = await self.store.run(run_id)
            channel = rec.channel or _opt_str(run.origin.get("channel"))
            ts = rec.ts or _opt_str(run.origin.get("thread_ts"))
            if not channel or not ts:
                return
            card = cards.root_message(run.task, run.requested_by, run, self.command)
            d = digest(card)
            if rec.digest == d:
                return
            resp = await self._call(
                "chat_update", channel=channel, ts=ts, text=card.text, blocks=card.blocks
            )
            if resp is not None:
                await self.store.set_run_digest(run_id, d)

    async def post_in_thread(
        self, run_id: str, origin: dict[str, Any], marker: str, texts: list[str]
    ) -> None:
        """Post ``texts`` in the run's thread, each at most once (``marker`` names them)."""
        channel = _opt_str(origin.get("channel"))
        if not channel:
            return
        async with self.store.lock(f"run:{run_id}"):
            for i, text in enumerate(texts):
                part = f"{marker}:{i}"
                if await self.store.posted(run_id, part):
                    continue
                resp = await self._call(
                    "chat_postMessage",
                    channel=channel,
                    thread_ts=_opt_str(origin.get("thread_ts")),
                    text=text,
                )
                if resp is None:
                    return
                await self.store.mark_posted(run_id, part, str(resp.get("ts", "")))

    async def tell(
        self,
        user_id: str,
        text: str,
        *,
        channel: str | None = None,
        respond: Any = None,
    ) -> None:
        """An ephemeral message to one user: via response_url when we have one."""
        if respond is not None:
            try:
                await respond(text=text, response_type="ephemeral", replace_original=False)
                return
            except Exception as exc:
                log.warning("response_url failed (%s); trying chat.postEphemeral", slack_error(exc))
        if channel:
            try:
                await self.client.chat_postEphemeral(channel=channel, user=user_id, text=text)
            except Exception as exc:
                log.warning("could not tell %s: %s", user_id, slack_error(exc))

    async def _send_card(
        self, method: str, card: cards.Card, smaller: cards.Card, **kwargs: Any
    ) -> Any:
        """Send a card; if Slack refuses its size or shape, send the compact one instead."""
        try:
            return await getattr(self.client, method)(text=card.text, blocks=card.blocks, **kwargs)
        except Exception as exc:
            if not isinstance(exc, SlackApiError) or slack_error(exc) not in TOO_BIG:
                return self._failed(method, exc)
            log.warning("Slack refused a card (%s); sending the compact one", slack_error(exc))
        return await self._call(method, text=smaller.text, blocks=smaller.blocks, **kwargs)

    async def _call(self, method: str, **kwargs: Any) -> Any:
        """Call the Web API; ``None`` for a permanent failure (logged), raise if transient.

        Rate limits and connection errors were already retried by the client's handlers.
        """
        try:
            return await getattr(self.client, method)(**kwargs)
        except Exception as exc:
            return self._failed(method, exc)

    def _failed(self, method: str, exc: Exception) -> None:
        if is_transient(exc):
            raise TransientSlackError(f"{method}: {slack_error(exc)}") from exc
        log.error("Slack refused %s: %s", method, slack_error(exc))
        return None


def _opt_str(v: object) -> str | None:
    return v if isinstance(v, str) and v else None
