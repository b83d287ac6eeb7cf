"""A fake OpenAI-compatible Chat Completions server for tests.

:class:`FakeOpenAI` is a real HTTP server (aiohttp, in a background daemon thread with its own
event loop, on a free port of 127.0.0.1) that speaks the Chat Completions wire format. Point
any OpenAI client at :attr:`FakeOpenAI.base_url`; it serves in-process code and worker
subprocesses alike.

Answers are scripted per task::

    with FakeOpenAI() as fake:
        fake.script("delete user 42", [
            call("delete_user", {"user_id": 42}),
            reply("Done: user 42 is deleted."),
        ])

A request belongs to the script whose task equals the content of its first ``user`` message.
The step that answers it is chosen without state: its index is the number of ``assistant``
messages already in the request, so a retried or recovered request gets the same answer.

Anything unexpected (no script for the task, more turns than steps, a failing ``expect``, a
malformed conversation) is answered with an OpenAI-format error and recorded in
:attr:`FakeOpenAI.errors`; a test fixture should fail the test when that list is not empty.

A :data:`Responder` answers what no script covers, computing each step from the request
(``FakeOpenAI(responder=fn)`` or :meth:`FakeOpenAI.respond_with`)::

    def respond(messages: list[dict]) -> Step:
        return reply(f"you said {messages[-1]['content']}")

It gets a copy of the request's ``messages`` (and its ``tools`` list, when it takes a
``tools`` keyword) and returns a :class:`Step`; one that raises or returns anything else is
answered with an error and recorded in :attr:`FakeOpenAI.errors`. The playground's scripted
model (``playground/model.py``) is one.

Server profiles: ``FakeOpenAI(server="mistral")`` behaves like that server (see
:data:`SERVERS`). It enforces the request rules the real server documents or is known (from
public issues) to enforce on what the client sends, answering the status and error body the
real server answers and recording the violation in :attr:`FakeOpenAI.errors`; and it answers
scripted steps in that server's response shapes (its tool-call id format, extra fields,
reasoning fields, content filter annotations…). Each rule and shape names its source next to
it. ``quirks`` turns on version-specific oddities (:data:`QUIRKS`); ``upstream`` puts a relay
(LiteLLM, OpenRouter) in front of another server, whose rules then apply.
"""

from agent_core.testing.fake import FakeOpenAI, Responder
from agent_core.testing.servers import QUIRKS, SERVERS, ServerName, Violation
from agent_core.testing.steps import (
    Expect,
    Step,
    ToolCallSpec,
    call,
    calls,
    filtered,
    raw_response,
    reply,
    tool_messages,
)

__all__ = [
    "QUIRKS",
    "SERVERS",
    "Expect",
    "FakeOpenAI",
    "Responder",
    "ServerName",
    "Step",
    "ToolCallSpec",
    "Violation",
    "call",
    "calls",
    "filtered",
    "raw_response",
    "reply",
    "tool_messages",
]
