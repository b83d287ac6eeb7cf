"""The playground's scripted model: answers the example ops agent when no real model is set.

It is a :data:`~agent_core.testing.Responder` served by a
:class:`~agent_core.testing.FakeOpenAI` on 127.0.0.1 (:func:`start_model`). It keeps no
memory: each answer is derived from the request alone. The latest user message is the task;
the tool results after it say where the run is.

- ``delete user 42`` / ``delete users 42 and 43`` → ``delete_user`` (one call per id, in one
  turn, so one approval card each);
- ``look up user 42`` / ``get user 42`` / ``who is user 42`` → ``get_user``;
- ``email alan@partner.org about <subject>: <body>`` → ``send_email`` (the body as typed);
- once the calls are answered: a final answer saying exactly what happened, read from the tool
  messages the runner sends (:mod:`agent_core.messages`);
- anything else: a reply listing what it understands.

``PLAYGROUND_MODEL=package.module:function`` replaces it with your own script
(:func:`load_responder`): a function that takes the request's ``messages`` (a list of Chat
Completions message dicts) and returns a :class:`~agent_core.testing.Step` built with
:func:`~agent_core.testing.reply`, :func:`~agent_core.testing.call` or
:func:`~agent_core.testing.calls`. Give it a ``tools`` keyword parameter to also receive the
request's ``tools`` list.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from agent_core.exceptions import ConfigError
from agent_core.testing import FakeOpenAI, Responder, Step, calls, reply

from . import people

Message = dict[str, Any]

API_KEY = "sk-playground-scripted-model"
"""An ``OPENAI_API_KEY`` for :func:`start_model`'s server (it accepts any non-empty key)."""

MODEL_HINT = (
    "A script answers for the example agent: try “delete user 42”, “delete users 42 and 43”, "
    "“look up user 43” or “email alan@partner.org the full incident report”. Set "
    "OPENAI_API_KEY (or OPENAI_BASE_URL for Ollama or vLLM) to use a real model."
)
"""A one-line description of the scripted model, for the page's banner."""

HELP = (
    "I'm the playground's scripted model, not a real LLM, so I only understand a few requests "
    "for the example ops agent:\n"
    "• `delete user 42` (or `delete users 42 and 43`): asks for approval, then deletes\n"
    "• `look up user 42` (also `get user 42`, `who is user 43`): runs at once, no approval\n"
    "• `email alan@partner.org about Launch: the body…`: mail outside example.com asks for "
    "approval (to `ada@example.com` it does not)\n"
    "Set OPENAI_API_KEY (or OPENAI_BASE_URL for a local server such as Ollama or vLLM) to use "
    "a real model."
)


def hint_for(spec: str | None) -> str:
    """The banner text for ``PLAYGROUND_MODEL=spec`` (:data:`MODEL_HINT` when unset)."""
    if spec is None or not spec.strip():
        return MODEL_HINT
    return (
        f"Your script {spec.strip()} (PLAYGROUND_MODEL) answers. Set OPENAI_API_KEY (or "
        "OPENAI_BASE_URL for Ollama or vLLM) to use a real model."
    )


# ---------------------------------------------------------------------------- the task
_ID = r"#?(?=[A-Za-z0-9_-]*\d)[A-Za-z0-9_-]+"  # an id holds a digit: "42", "u-7"
_IDS = rf"{_ID}(?:\s*(?:,|&|\+|\band\b)\s*(?:and\s+)?(?:(?:user|account)s?\s+)?{_ID})*"
_WHO = r"(?:the\s+)?(?:user|account)s?\s+(?:(?:with\s+)?ids?\s+)?"
_DELETE = re.compile(rf"\b(?:delete|remove|erase)\s+{_WHO}(?P<ids>{_IDS})", re.I)
_LOOKUP = re.compile(
    rf"(?:\b(?:look\s*up|get|show|find|fetch|check|describe|who\s+is|who's|tell\s+me)"
    rf"\s+(?:me\s+)?(?:about\s+)?{_WHO}"
    rf"|^\s*(?:user|account)s?\s+)(?P<ids>{_IDS})",
    re.I,
)
_ADDR = r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+"
_EMAIL = re.compile(
    r"^\s*(?:please\s+)?(?:(?:send|write)\s+(?:an?\s+)?(?:e-?mail|mail|message)\s+to"
    rf"|e-?mail|mail)\s+(?P<to>{_ADDR})[\s,:]*(?P<rest>.*)$",
    re.I | re.S,
)
_ABOUT = re.compile(r"^(?:about|regarding|re:?|subject:?|with\s+subject)\s+", re.I)
_SAYING = re.compile(r"^(?:saying|that|with\s+body:?|body:?)\s+", re.I)
_MAILTO = re.compile(r"<mailto:([^|>]+)(?:\|[^>]*)?>")


@dataclass(frozen=True)
class Intent:
    """What a task asks for: calls to one tool, one per set of arguments."""

    tool: str
    args: tuple[dict[str, str], ...]


def _ids(found: str) -> tuple[dict[str, str], ...]:
    ids = dict.fromkeys(m.lstrip("#") for m in re.findall(_ID, found))
    return tuple({"user_id": i} for i in ids)


_REPORT = re.compile(r"^(?:the\s+)?(?:full\s+|long\s+)?(?:incident\s+)?report\b", re.I)


def incident_report() -> str:
    """A long email body (about 10,000 characters), as a model drafting a report would write:
    more than an approval card shows, so the card offers *View all arguments*."""
    lines = ["Incident report: API outage", ""]
    for minute in range(240):
        lines.append(
            f"{minute // 60 + 14:02d}:{minute % 60:02d} UTC  probe eu-west-{minute % 3 + 1}: "
            f"{'timeout after 30 s' if 10 <= minute < 22 else 'ok (41 ms)'}"
        )
    lines += ["", "Root cause: a configuration push removed the health-check route.", "— ops"]
    return "\n".join(lines)


def _email(to: str, rest: str) -> Intent | None:
    rest = rest.strip()
    if not rest:
        return None
    if _REPORT.match(rest):
        report = {"to": to, "subject": "Incident report: API outage", "body": incident_report()}
        return Intent("send_email", (report,))
    about = _ABOUT.match(rest)
    if about is not None:
        rest = rest[about.end() :]
        split = re.search(r":\s|\n", rest)
        subject = (rest[: split.start()] if split else rest).strip()
        body = rest[split.end() :].strip() if split else ""
        body = body or subject
    else:
        body = rest[m.end() :] if (m := _SAYING.match(rest)) else rest
        body = body.strip()
        first = re.split(r"(?<=[.!?])\s|\n", body, maxsplit=1)[0].strip()
        subject = first if len(first) <= 60 else first[:57].rstrip() + "…"
    return Intent("send_email", ({"to": to, "subject": subject, "body": body},))


def parse_task(task: str) -> Intent | None:
    """The tool calls a task asks for, or None when the scripted model does not understand."""
    task = _MAILTO.sub(r"\1", task)
    if (m := _EMAIL.match(task)) is not None:
        return _email(m["to"], m["rest"])
    if (m := _DELETE.search(task)) is not None:
        return Intent("delete_user", _ids(m["ids"]))
    if (m := _LOOKUP.search(task)) is not None:
        return Intent("get_user", _ids(m["ids"]))
    return None


# ---------------------------------------------------------------------------- the report
_DENIED = re.compile(
    r"^Not executed: the user (?P<by>.*?) declined this call to \S+?\."
    r"(?: Their reason: (?P<reason>.*?)| They gave no reason\.)"
    r" Do not retry this call \(or an equivalent one\) unless the user asks you to\.$",
    re.S,
)
_EXPIRED = re.compile(
    r"^Not executed: the approval request for this call to \S+ timed out\. "
    r"No decision arrived within (?P<within>.+?), so the call was not executed\.",
    re.S,
)
_CANCELLED = re.compile(r"^Not executed: the run was cancelled by (?P<by>.+?) before this call")
_RAISED = re.compile(r"^Error: the tool \S+ failed: (?P<detail>.*)$", re.S)
_INVALID = re.compile(
    r"^Error: the call to \S+ was rejected before any approval or execution: "
    r"(?P<problem>.*)\. Nothing ran\. Correct the arguments",
    re.S,
)
_TOO_MANY = re.compile(r"^Error: (?P<what>this turn asked for .*?)\. None of them ran\.", re.S)


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "!", "?", "…")) else text + "."


def _target(name: str, args: Mapping[str, Any]) -> tuple[str, str, str]:
    """(what was asked, " (its object)", what did not happen) for a call."""
    if name in ("delete_user", "get_user") and "user_id" in args:
        user = f"user {args['user_id']}"
        if name == "delete_user":
            return f"delete {user}", f" ({user})", "nothing was deleted"
        return f"look up {user}", f" ({user})", "nothing was looked up"
    if name == "send_email" and "to" in args:
        return f"send the email to {args['to']}", f" (to {args['to']})", "no email was sent"
    return f"run {name}", "", f"{name} did not run"


def _mention(who: str) -> str:
    """A playground person's user id as their name (``@Avery``), else as is. Not ``<@U…>``:
    the bot escapes what the model writes, so a mention would show as its raw id."""
    found = people.person(who)
    return f"@{found.name}" if found is not None else who


def report_line(name: str, args: Mapping[str, Any], content: str) -> str:
    """One sentence telling the user what became of a call, from the tool message the runner
    sent (:mod:`agent_core.messages`)."""
    asked, obj, not_done = _target(name, args)
    if m := _DENIED.match(content):
        by, reason = _mention(m["by"]), m["reason"]
        why = f" (reason: {reason})" if reason is not None else ", who gave no reason"
        return f"I did not {asked}: the request was denied by {by}{why}."
    if m := _EXPIRED.match(content):
        return (
            f"The approval request for {name}{obj} expired before anyone answered: no decision "
            f"arrived within {m['within']}, so {not_done}."
        )
    if m := _CANCELLED.match(content):
        return (
            f"The run was cancelled by {_mention(m['by'])} before {name}{obj} ran, so {not_done}."
        )
    if content.startswith("Not executed: the arguments of this call to"):
        return (
            f"{name}{obj} did not run: its arguments no longer matched what the approver saw, "
            f"so {not_done}."
        )
    if content.startswith("Outcome unknown:"):
        return (
            f"The outcome of {name}{obj} is unknown: the worker stopped before it reported a "
            "result, and it was not run again. Please check before retrying."
        )
    if m := _RAISED.match(content):
        return f"{name}{obj} failed: {_sentence(m['detail'])}"
    if m := _INVALID.match(content):
        return f"The call to {name} was rejected before any approval: {m['problem']}. Nothing ran."
    if content.startswith("Error: there is no tool named"):
        return f"I called {name}, but this agent has no tool by that name, so nothing ran."
    if m := _TOO_MANY.match(content):
        return f"None of the calls ran: {m['what']}."
    if content.startswith(("Not executed:", "Error:")):
        return f"{name}{obj} did not run: {content}"
    user = args.get("user_id")
    if name == "delete_user" and content == f"user {user} deleted":
        return f"Done: user {user} deleted."
    if name == "send_email" and content.startswith("email to "):
        return f"Done: {_sentence(content)}"
    if name == "get_user" and user is not None:
        return f"User {user}: {_sentence(content)}"
    return f"{name}{obj} ran and returned: {_sentence(content)}"


# ---------------------------------------------------------------------------- the responder
def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _arguments(raw: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _results(after_task: list[Message]) -> list[str]:
    """A report line per answered tool call after the task, in the order of the calls."""
    asked: dict[str, tuple[str, dict[str, Any]]] = {}
    lines: list[str] = []
    for m in after_task:
        if m.get("role") == "assistant":
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function") or {}
                asked[str(tc.get("id"))] = (str(fn.get("name")), _arguments(fn.get("arguments")))
        elif m.get("role") == "tool":
            name, args = asked.get(str(m.get("tool_call_id")), ("a tool", {}))
            lines.append(report_line(name, args, _text(m.get("content"))))
    return lines


def _offered(tools: list[dict[str, Any]] | None) -> list[str] | None:
    if tools is None:
        return None
    return [str((t.get("function") or t).get("name")) for t in tools if isinstance(t, dict)]


def ops_responder(messages: list[Message], *, tools: list[dict[str, Any]] | None = None) -> Step:
    """The scripted model's answer to one Chat Completions request of the ops agent.

    ``tools`` is the request's tools list (None: assume the ops agent's tools are offered).
    """
    last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    task = _text(messages[last].get("content")) if last >= 0 else ""
    if lines := _results(messages[last + 1 :]):
        return reply("\n".join(lines))
    intent = parse_task(task)
    if intent is None or not intent.args:
        return reply(HELP)
    offered = _offered(tools)
    if offered is not None and intent.tool not in offered:
        return reply(
            f"This agent has no {intent.tool} tool (it offers: {', '.join(offered) or 'none'}), "
            "so I can't do that. I'm the playground's scripted model and only know the example "
            "ops agent; set OPENAI_API_KEY (or OPENAI_BASE_URL for Ollama or vLLM) to use a real "
            "model with this agent."
        )
    return calls([(intent.tool, args) for args in intent.args])


# ---------------------------------------------------------------------------- wiring
_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def load_responder(spec: str | None) -> Responder:
    """The responder named by ``PLAYGROUND_MODEL``: None or empty → :func:`ops_responder`;
    ``"package.module:function"`` → that callable (``function(messages) -> Step``).

    A bad spec raises :class:`ConfigError` with one line naming ``PLAYGROUND_MODEL``.
    """
    if spec is None or not spec.strip():
        return ops_responder
    spec = spec.strip()
    if not _SPEC.match(spec):
        raise ConfigError(f"PLAYGROUND_MODEL is invalid: {spec!r} is not 'package.module:function'")
    module_name, _, attr = spec.partition(":")
    try:
        obj: object = importlib.import_module(module_name)
    except Exception as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError(
            f"PLAYGROUND_MODEL is invalid: cannot import {module_name!r} "
            f"({type(exc).__name__}: {detail})"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(
                f"PLAYGROUND_MODEL is invalid: {module_name!r} has no attribute {attr!r}"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(
            f"PLAYGROUND_MODEL is invalid: {spec!r} is a {type(obj).__name__}, not a function"
        )
    return cast(Responder, obj)


def start_model(responder: Responder | None = None) -> FakeOpenAI:
    """A started :class:`FakeOpenAI` on a free port of 127.0.0.1 answering with ``responder``
    (default :func:`ops_responder`). Point ``OPENAI_BASE_URL`` at its ``base_url`` and set
    ``OPENAI_API_KEY`` to :data:`API_KEY` (any non-empty key is accepted); ``stop()`` it."""
    fake = FakeOpenAI(server="openai", responder=responder or ops_responder, keep_requests=100)
    return fake.start()
