"""Requests this app never asks for, answered quietly.

Slack may still send them: legacy attachment buttons (``interactive_message``) and dialogs
(``dialog_submission``, ``dialog_cancellation``, ``dialog_suggestion``) from some other
integration's message or a stale client, a modal's ``view_closed``, a select menu's
``block_suggestion``, a retired workflow step's ``workflow_step_edit``. Each is acknowledged
with what Slack expects (an empty 200; an empty option list for suggestions), nothing is
decided, nobody is told "unknown button", and nothing is logged above DEBUG. Without these
listeners Bolt answers 404 and logs an "Unhandled request" warning.

The gate buttons listen to ``block_actions`` only (see :mod:`bot.actions`): Bolt's
``app.action("gate_approve")`` would also match a legacy payload whose callback_id is
``gate_approve``.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from slack_bolt.async_app import AsyncApp

log = logging.getLogger(__name__)

# Any callback_id or action_id: Slack always sends one with these types (the web process
# refuses a payload without one as malformed before Bolt reads it).
ANY = re.compile(r".*", re.DOTALL)


def register(app: AsyncApp) -> None:
    async def quiet_ack(ack: Any, body: dict[str, Any]) -> None:
        await ack()
        log.debug("acknowledged a %s request this app does not use", body.get("type"))

    async def no_options(ack: Any, body: dict[str, Any]) -> None:
        await ack(options=[])
        log.debug("answered a %s request with no options", body.get("type"))

    app.attachment_action(ANY)(quiet_ack)
    app.dialog_submission(ANY)(quiet_ack)
    app.dialog_cancellation(ANY)(quiet_ack)
    app.dialog_suggestion(ANY)(no_options)
    app.view_closed(ANY)(quiet_ack)
    app.block_suggestion(ANY)(no_options)
    app.action({"type": "workflow_step_edit", "callback_id": ANY})(quiet_ack)
