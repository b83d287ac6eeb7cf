"""Where this app works around Bolt (slack_bolt), in one place, each with the upstream
behaviour it answers. What Bolt does, and why the app does not let it:

- **Its constructor reads the environment.** ``AsyncApp()`` picks up SLACK_BOT_TOKEN,
  SLACK_SIGNING_SECRET, SLACK_CLIENT_ID… by itself: given our ``client`` as well, it logs
  "As you gave `client` as well, `token` will be unused", and with SLACK_CLIENT_ID and
  SLACK_CLIENT_SECRET it turns on its OAuth flow. :func:`unseen_by_bolt` hides them while
  it is built (everything it needs comes from BotSettings).
- **Any form body containing the word "payload" is taken for an interactive payload.**
  Bolt's request parser (``slack_bolt.request.internals.parse_body``) checks
  ``"payload" in body``; a slash command such as ``/agent summarize the payload`` is then
  read as empty and answered 404. :func:`form_read_as_empty` finds such a form and
  :func:`payload_word_escaped` percent-encodes the word.
- **It verifies the signature a second time.** The web process verifies every HTTP request
  on its raw bytes before any parsing (bot.server), so Bolt's own check is off
  (:data:`BOLT_VERIFIES_REQUESTS`): it would only cost an HMAC, and reject the escaped form
  above. Socket Mode requests are not signed; Bolt skips them by itself.
- **Its matchers index payloads without checking their JSON types.** A signed payload of
  the wrong shape raised KeyError, TypeError, AttributeError or IndexError inside
  ``async_dispatch``, answered 500 (fuzzing found them). :func:`malformed_payload` refuses
  those shapes first; the web process answers 400.
- **With ``process_before_response=False`` it polls for ``ack()`` every 10 ms**, so every
  answer came ~10 ms late. The app runs with ``process_before_response=True`` and returns
  from each listener at its ``ack()``: that is :mod:`bot.acking`, a design of its own rather
  than a patch, kept in its module.
- **Its default assistant thread context store loses a change.** It keeps a thread's context
  in the metadata of the app's first reply in the thread (``conversations.replies``, then
  ``chat.update`` on every change), so an ``assistant_thread_context_changed`` that comes
  before that reply is lost. :mod:`bot.assistant` gives Bolt a store of its own in Redis
  (``ThreadStore``), which also records who opened each thread.
- **Its matchers raise on a payload of the wrong shape even after** :func:`malformed_payload`:
  :mod:`bot.server` also answers 400 to the KeyError, TypeError, AttributeError or ValueError
  that ``async_dispatch`` raises, a second line behind the check above.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs

# Bolt's second signature check, in HTTP mode (see the module's docstring).
BOLT_VERIFIES_REQUESTS = False

# Variables AsyncApp's constructor reads from the environment by itself.
BOLT_READS = (
    "SLACK_BOT_TOKEN",
    "SLACK_SIGNING_SECRET",
    "SLACK_VERIFICATION_TOKEN",
    "SLACK_CLIENT_ID",
    "SLACK_CLIENT_SECRET",
)


@contextlib.contextmanager
def unseen_by_bolt(names: tuple[str, ...] = BOLT_READS) -> Iterator[None]:
    """Hide these variables from the environment for the (synchronous) block, then restore
    them: the process's settings were read from them already."""
    hidden = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(hidden)


_OBJECTS = ("user", "team", "channel", "container", "message", "view", "enterprise", "event")
_STRINGS = ("type", "action_id", "block_id", "callback_id", "value", "trigger_id")


def _is_json_body(body: str, content_type: str) -> bool:
    """Whether Bolt reads this body as JSON (it does for a JSON content type or a ``{``)."""
    return content_type == "application/json" or body.startswith("{")


def plain_form(body: str, content_type: str) -> bool:
    """Whether Bolt reads ``body`` as a plain form (a slash command), not as JSON nor as an
    interactive ``payload=`` form (after :func:`payload_word_escaped` where it applies)."""
    return not _is_json_body(body, content_type) and "payload" not in body


def malformed_payload(parsed: Any, *, form: bool) -> bool:
    """True for a request body as Bolt parsed it (``AsyncBoltRequest.body``: the JSON, the
    ``payload=`` field's JSON, or a plain ``form``) whose fields Bolt's matchers would trip
    over: they index fields without checking their types (fuzzing found KeyError,
    TypeError, AttributeError and IndexError, each answered 500). Checked on Bolt's own
    parse, so a click's body is parsed once."""
    if not isinstance(parsed, dict):
        return True
    if form:
        # Every field of a form is text, and Slack sends none of the names Bolt reads as
        # objects; one such field (``event=x``) made its middleware fail with
        # AttributeError, answered 500 (fuzzing found it).
        return any(name in parsed for name in _FORM_OBJECTS)
    payload = parsed
    if not isinstance(payload.get("type"), str):
        return True

    def bad(obj: dict[str, Any]) -> bool:
        return any(k in obj and not isinstance(obj[k], str) for k in _STRINGS)

    if bad(payload) or any(
        payload.get(k) is not None and not isinstance(payload[k], dict) for k in _OBJECTS
    ):
        return True
    view = payload.get("view")
    if isinstance(view, dict) and bad(view):
        return True
    actions = payload.get("actions")
    if actions is not None and (
        not isinstance(actions, list)
        or not actions  # Slack never sends an empty list; Bolt reads actions[0]
        or not all(isinstance(a, dict) and not bad(a) for a in actions)
    ):
        return True
    # Fields Slack always sends with each type, which Bolt's matchers index unchecked.
    for path in _REQUIRED.get(payload["type"], ()):
        if not isinstance(_dig(payload, path), str):
            return True
    if payload["type"] == "block_actions" and not all(
        isinstance(a.get("action_id"), str) for a in actions or []
    ):
        return True
    return False


_REQUIRED: dict[str, tuple[tuple[str, ...], ...]] = {
    "view_submission": (("view", "callback_id"), ("view", "type")),
    "view_closed": (("view", "callback_id"), ("view", "type")),
    "block_suggestion": (("action_id",),),
    "shortcut": (("callback_id",),),
    "message_action": (("callback_id",),),
    "interactive_message": (("callback_id",),),
    "dialog_submission": (("callback_id",),),
    "dialog_cancellation": (("callback_id",),),
    "dialog_suggestion": (("callback_id",),),
    "workflow_step_edit": (("callback_id",),),
    "event_callback": (("event", "type"),),
}


def _dig(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def form_read_as_empty(body: str, content_type: str) -> bool:
    """A form body (a slash command) that merely contains the word "payload": Bolt takes any
    such body for an interactive ``payload=`` and, finding no such field, reads it as
    empty, so ``/agent summarize the payload`` would be answered 404."""
    if "payload" not in body or _is_json_body(body, content_type):
        return False
    if body.startswith("payload=") or "&payload=" in body:
        return False  # an interactive payload (parsing a click's large form twice is costly)
    return "payload" not in parse_qs(body, keep_blank_values=True)


def payload_word_escaped(body: str) -> str:
    """The same form with every "payload" percent-encoded (``%70ayload`` decodes to the
    same text), which Bolt then parses as the form it is. The body no longer matches its
    signature: Bolt's own check is off in HTTP mode (:data:`BOLT_VERIFIES_REQUESTS`), since
    the web process verified the raw bytes before anything read them."""
    return body.replace("payload", "%70ayload")


# Fields Bolt reads as JSON objects (slack_bolt.request.internals and its middlewares).
_FORM_OBJECTS = (
    "assistant_thread",
    "authorizations",
    "container",
    "event",
    "function_data",
    "inputs",
    "item",
    "message",
    "previous_message",
    "view",
)
