"""Edits and grants in the soak (part of :class:`tests.soak.test_soak.Soak`).

The fates of ``adjust`` (editable) and ``ship`` (``allow_for``) gates, through Slack as a
person goes: **Edit & approve** (the button's ``block_actions`` opens the modal, then its signed
``view_submission``), sometimes an invalid edit first (it must be refused with the field's
error, deciding nothing), and the requester's own click and forged form (refused);
**Approve & allow** (its modal, with any arguments or ``only env=…``), and the requester's
try at it (refused: no form opens, a forged form decides nothing). The thread's later ``ship``
calls are then decided by the grant (fate ``by-grant``). :meth:`Editors.revoker` has an
approver list ``/agent grants`` now and then and revoke one. What went wrong on the spot (a
form opened for someone who may not decide) is noted in ``edit_grant_problems``; the rest is
judged by ``tests/soak/grant_promises.py``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

from agent_core import Keys
from bot import edit_view, grant_view
from tests.slack_fake import HttpResult, SlackClient
from tests.soak.config import APPROVERS, CHANNEL, REQUESTER, SEED
from tests.soak.people import Click, GateRecord, SoakSlack

# An edit's invalid values: each must come back as this error on the amount's field.
INVALID_AMOUNTS = ("12.5", "lots")
NOT_WHOLE = "Not a whole number."


@dataclass
class Revoke:
    """A Revoke clicked in ``/agent grants``."""

    grant_id: str
    user: str
    sent_unix: float
    status: int
    answer: str = ""  # what the person was told


class Editors:
    """The fates of editable and grantable gates, and the revoker."""

    # Set by Soak.__init__ (tests/soak/test_soak.py).
    slack: SoakSlack
    client: SlackClient
    redis: Redis
    keys: Keys
    counts: Counter[str]
    loading: bool
    revokes: list[Revoke]
    edit_grant_problems: list[str]

    if TYPE_CHECKING:

        def reply_name(self, what: str) -> str: ...

        async def send(self, make: Any) -> int: ...

        async def safely(self, coro: Any, default: Any = None) -> Any: ...

        async def click(
            self,
            rec: GateRecord,
            kind: str,
            user: str,
            *,
            wait: float = 5.0,
            outsider: bool = False,
            **kw: Any,
        ) -> Click: ...

    async def post(self, make: Any) -> HttpResult | None:
        """One request to web, its answer (None when it did not get through)."""
        try:
            return await asyncio.wait_for(make(), timeout=10)
        except Exception:
            self.counts["requests not answered (web down)"] += 1
            return None

    async def form(self, trigger: str, seconds: float = 3.0) -> dict[str, Any] | None:
        """The modal views.open received for ``trigger`` (None: none within ``seconds``)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end and trigger not in self.slack.opened:
            await asyncio.sleep(0.05)
        return self.slack.opened.get(trigger)

    async def submit(
        self, rec: GateRecord, kind: str, user: str, view: dict[str, Any], values: Any, **kw: Any
    ) -> Click:
        """Submit a modal as Slack does; the submission is one of the gate's clicks."""
        sent = time.monotonic()
        res = await self.post(
            lambda: self.client.view_submission(
                view["callback_id"], view["private_metadata"], values=values, user_id=user
            )
        )
        c = Click(kind, user, sent, res.status if res else 0, "", **kw)
        c.answer = res.text if res else ""
        if c.status == 200:
            c.acked_unix = time.time()
        rec.clicks.append(c)
        return c

    async def act_more(self, rec: GateRecord, rng: random.Random, a: str) -> None:
        """One try at an edit or grant fate (``a``: an approver who may decide the gate)."""
        fate = rec.fate
        if fate in ("edit", "edit-invalid", "edit-outsider"):
            if fate == "edit-outsider":
                await self.outsider_form(rec, "edit-button", edit_view.EDIT_CALLBACK)
            await self.edit(rec, a, rng, invalid=fate == "edit-invalid")
        elif fate in ("grant", "grant-only", "grant-requester"):
            if fate == "grant-requester":
                await self.outsider_form(rec, "grant-button", grant_view.GRANT_CALLBACK)
            await self.grant(rec, a, only=fate == "grant-only")
        else:
            raise AssertionError(f"unknown fate {fate}")

    async def outsider_form(self, rec: GateRecord, kind: str, callback: str) -> None:
        """The requester clicks the button (no form may open for them), then submits the
        form forged (it must decide nothing: the verdict checks who decided)."""
        trigger = self.reply_name("trigger")
        c = await self.click(rec, kind, REQUESTER, trigger_id=trigger, outsider=True)
        if c.status == 200 and await self.form(trigger, 1.5) is not None:
            self.edit_grant_problems.append(f"{rec.op}: {kind} opened a form for the requester")
        got = await self.safely(self.redis.hget(self.keys.gate(rec.gate_id), "args_hash"))
        if got is None:
            return
        meta = json.dumps({"gate_id": rec.gate_id, "args_hash": got, "channel": ""})
        if callback == edit_view.EDIT_CALLBACK:
            values = self.edit_values("1", "forged")
        else:
            values = scope_values(grant_view.ANY)
        view = {"callback_id": callback, "private_metadata": meta}
        await self.submit(rec, kind.replace("button", "forged"), REQUESTER, view, values)
        self.counts[f"requester's forged {kind.split('-')[0]} forms sent"] += 1

    @staticmethod
    def edit_values(amount: str, note: str) -> dict[str, Any]:
        return {
            edit_view.ARG_BLOCK + "amount": {
                edit_view.VALUE: {"type": "number_input", "value": amount}
            },
            edit_view.ARG_BLOCK + "note": {
                edit_view.VALUE: {"type": "plain_text_input", "value": note}
            },
        }

    async def edit(self, rec: GateRecord, user: str, rng: random.Random, *, invalid: bool) -> None:
        """Edit & approve: the button, the modal; an invalid edit first (refused, the modal
        kept open with the error), then a valid one."""
        trigger = self.reply_name("trigger")
        c = await self.click(rec, "edit-button", user, trigger_id=trigger)
        if c.status != 200:
            return
        view = await self.form(trigger)
        if view is None:
            return  # the web died before opening the form: the person clicks again
        if invalid:
            bad = await self.submit(
                rec, "edit-invalid", user, view, self.edit_values(rng.choice(INVALID_AMOUNTS), "x")
            )
            if bad.status == 200:  # its answer: grant_promises.check_invalid_edits
                self.counts["invalid edits submitted"] += 1
        amount = str(rng.randrange(1, 100) * 100 + 1)  # never the model's (a multiple of 100)
        note = f"edited by soak {SEED % 1000}"
        await self.submit(rec, "edit-submit", user, view, self.edit_values(amount, note))

    async def grant(self, rec: GateRecord, user: str, *, only: bool) -> None:
        """Approve & allow: the button, the modal, any arguments or ``only env=…``."""
        trigger = self.reply_name("trigger")
        c = await self.click(rec, "grant-button", user, trigger_id=trigger)
        if c.status != 200:
            return
        view = await self.form(trigger)
        if view is None:
            return
        choice = grant_view.ANY
        if only:
            for block in view.get("blocks") or []:
                for o in (block.get("element") or {}).get("options") or []:
                    if o["text"]["text"].startswith("only env="):
                        choice = o["value"]
        await self.submit(rec, "grant-submit", user, view, scope_values(choice))
        self.counts[f"grants submitted ({'only env' if only else 'any arguments'})"] += 1

    async def revoker(self) -> None:
        """Now and then an approver lists ``/agent grants`` and revokes one of them."""
        rng = random.Random(f"{SEED}:revoker")
        while self.loading:
            await asyncio.sleep(rng.uniform(2.0, 6.0))
            user = rng.choice(APPROVERS)
            name = self.reply_name("grants")
            res = await self.post(
                functools.partial(
                    self.client.command,
                    "grants",
                    user_id=user,
                    channel_id=CHANNEL,
                    response_url=self.slack.response_url(name),
                )
            )
            if res is None or res.status != 200:
                continue
            end = time.monotonic() + 3
            while time.monotonic() < end and not self.slack.responses(name):
                await asyncio.sleep(0.1)
            ids = [  # each listed grant's Revoke: its section's accessory
                str(el.get("value"))
                for r in self.slack.responses(name)
                for block in r.args.get("blocks") or []
                for el in [block.get("accessory"), *(block.get("elements") or [])]
                if isinstance(el, dict) and el.get("action_id") == grant_view.REVOKE_ACTION
            ]
            self.counts["/agent grants lists answered"] += 1
            self.counts["grants listed in /agent grants"] += len(ids)
            if not ids or rng.random() < 0.25:
                continue
            grant_id = rng.choice(ids)
            name = self.reply_name("revoke")
            sent = time.time()
            res = await self.post(
                functools.partial(
                    self.client.action,
                    grant_view.REVOKE_ACTION,
                    grant_id,
                    user_id=user,
                    channel_id=CHANNEL,
                    response_url=self.slack.response_url(name),
                )
            )
            r = Revoke(grant_id, user, sent, res.status if res else 0)
            self.revokes.append(r)
            end = time.monotonic() + 3
            while time.monotonic() < end and not self.slack.replies.get(name):
                await asyncio.sleep(0.1)
            r.answer = " | ".join(self.slack.replies.get(name, []))
            self.counts["revokes clicked"] += 1


def scope_values(choice: str) -> dict[str, Any]:
    """The grant modal's state: the constraint picked (``grant_view.ANY`` or an option's)."""
    return {
        grant_view.SCOPE_BLOCK: {
            grant_view.SCOPE_ACTION: {
                "type": "static_select",
                "selected_option": {"value": choice},
            }
        }
    }
