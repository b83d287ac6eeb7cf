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
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from aiohttp import web

__all__ = [
    "Expect",
    "FakeOpenAI",
    "Step",
    "ToolCallSpec",
    "call",
    "calls",
    "raw_response",
    "reply",
    "tool_messages",
]

Message = dict[str, Any]
Expect = Callable[[list[Message]], None]
"""A check run on the request's ``messages`` before a step answers; it raises to fail."""

_call_ids = itertools.count(1)


def _next_call_id() -> str:
    return f"call_{next(_call_ids)}"


@dataclass(frozen=True)
class ToolCallSpec:
    """One tool call of a scripted assistant turn.

    ``arguments`` is the exact string sent on the wire (normally JSON, but any string, to
    test how an agent handles invalid JSON).
    """

    name: str
    arguments: str
    id: str


@dataclass(frozen=True)
class Step:
    """One scripted assistant turn: a text reply and/or tool calls.

    Build steps with :func:`reply`, :func:`call` and :func:`calls`.
    """

    content: str | None
    tool_calls: tuple[ToolCallSpec, ...] = ()
    expect: Expect | None = field(default=None, compare=False)
    # (status, content type, body): sent as is instead of a completion (see raw_response).
    raw: tuple[int, str, str] | None = None

    @property
    def finish_reason(self) -> Literal["tool_calls", "stop"]:
        """``"tool_calls"`` when the turn calls tools, else ``"stop"``."""
        return "tool_calls" if self.tool_calls else "stop"


def _encode_args(args: Mapping[str, Any] | str) -> str:
    if isinstance(args, str):
        return args
    return json.dumps(dict(args), separators=(",", ":"))


def reply(text: str, *, expect: Expect | None = None) -> Step:
    """A turn that answers with ``text`` and no tool call (``finish_reason="stop"``)."""
    return Step(content=text, expect=expect)


def raw_response(
    body: str | Mapping[str, Any],
    *,
    status: int = 200,
    content_type: str | None = None,
    expect: Expect | None = None,
) -> Step:
    """A turn answered with this exact body, as odd servers and relays answer: an HTML page
    with a 200, a 200 carrying an ``error`` object, content as a list of chunks…

    A mapping is JSON-encoded (``application/json``); a string is sent as is
    (``text/html`` unless ``content_type`` says otherwise).
    """
    if isinstance(body, str):
        text, ctype = body, content_type or "text/html"
    else:
        text, ctype = json.dumps(dict(body)), content_type or "application/json"
    return Step(content=None, raw=(status, ctype, text), expect=expect)


def call(
    name: str,
    args: Mapping[str, Any] | str,
    id: str | None = None,
    *,
    content: str | None = None,
    expect: Expect | None = None,
) -> Step:
    """A turn with a single tool call.

    ``args`` given as a mapping is JSON-encoded; given as a ``str`` it is sent raw. ``id``
    defaults to a process-unique ``call_<n>``, fixed when the step is built, so a repeated
    request gets the same id. ``content`` is optional text sent beside the call.
    """
    spec = ToolCallSpec(name=name, arguments=_encode_args(args), id=id or _next_call_id())
    return Step(content=content, tool_calls=(spec,), expect=expect)


def calls(
    specs: Iterable[tuple[str, Mapping[str, Any] | str] | tuple[str, Mapping[str, Any] | str, str]],
    *,
    content: str | None = None,
    expect: Expect | None = None,
) -> Step:
    """A turn with several tool calls, given as ``(name, args)`` or ``(name, args, id)``.

    A call without an id gets a process-unique ``call_<n>``, fixed when the step is built;
    an explicit id is sent as given (empty or repeated, as some servers do).
    """
    tool_calls = tuple(
        ToolCallSpec(
            name=spec[0],
            arguments=_encode_args(spec[1]),
            id=spec[2] if len(spec) > 2 else _next_call_id(),
        )
        for spec in specs
    )
    if not tool_calls:
        raise ValueError("calls() needs at least one (name, args) pair")
    return Step(content=content, tool_calls=tool_calls, expect=expect)


def tool_messages(messages: Sequence[Message]) -> list[Message]:
    """The messages with ``role == "tool"``, in order (handy inside an ``expect``)."""
    return [m for m in messages if m.get("role") == "tool"]


def _text_of(content: Any) -> str | None:
    """The text of a message's content: a string, or a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return None


def _task_of(body: Mapping[str, Any]) -> str | None:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            return _text_of(message.get("content"))
    return None


def _check_conversation(messages: list[Any]) -> tuple[str, str] | None:
    """The 400 the real API gives to a malformed tool conversation, as (message, param).

    Every tool call id of an assistant message must be answered by a ``tool`` message before
    the next non-tool message, and every ``tool`` message must answer such a call.
    """
    open_ids: list[str] = []
    open_index = -1
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            return (
                f"Invalid value for 'messages[{index}]': expected an object with a role.",
                f"messages.[{index}]",
            )
        role = message["role"]
        if role == "tool":
            tool_call_id = message.get("tool_call_id")
            if tool_call_id not in open_ids:
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    f"messages.[{index}].role",
                )
            open_ids.remove(tool_call_id)
            continue
        if open_ids:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(open_ids)}",
                f"messages.[{open_index}].role",
            )
        if role == "assistant":
            open_ids = [
                str(tc.get("id")) for tc in message.get("tool_calls") or [] if isinstance(tc, dict)
            ]
            open_index = index
    if open_ids:
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            f"response messages: {', '.join(open_ids)}",
            f"messages.[{open_index}].role",
        )
    return None


def _error_body(
    message: str, type_: str, *, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _rough_tokens(value: Any) -> int:
    return max(1, len(json.dumps(value, default=str)) // 4)


class FakeOpenAI:
    """A scripted, OpenAI-compatible Chat Completions server on 127.0.0.1.

    Use it as a context manager or call :meth:`start` / :meth:`stop`. It serves:

    - ``POST /v1/chat/completions``: scripted answers (see :meth:`script`);
    - ``GET /v1/models``: a one-model list.

    Every request needs ``Authorization: Bearer <key>`` (any non-empty key, or exactly
    ``api_key`` when given), else 401 in OpenAI's error format. With ``validate=True`` (the
    default) a conversation that the real API refuses (a tool call id with no tool message,
    a tool message answering no call) gets the same 400 and is recorded in :attr:`errors`.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        model: str = "gpt-4o-mini",
        validate: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self._api_key = api_key
        self._model = model
        self._validate = validate
        self._host = host
        self._requested_port = port
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Step]] = {}
        self._requests: list[dict[str, Any]] = []
        self._errors: list[str] = []
        self._limited: tuple[float, str] | None = None
        self._pending_failures: list[tuple[int, float | None, dict[str, Any] | None]] = []
        self._failures_served = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FakeOpenAI:
        """Start serving in a background daemon thread; returns ``self``."""
        if self._thread is not None:
            raise RuntimeError("FakeOpenAI is already started")
        ready = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._start_site())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=serve, name="FakeOpenAI", daemon=True)
        self._thread.start()
        if not ready.wait(timeout=10):
            raise RuntimeError("FakeOpenAI did not start within 10 s")
        if failure:
            self._thread.join()
            self._thread = None
            self._loop = None
            raise RuntimeError(f"FakeOpenAI failed to start: {failure[0]!r}") from failure[0]
        return self

    async def _start_site(self) -> None:
        app = web.Application(client_max_size=256 * 1024**2)  # long histories exceed 1 MiB
        app.router.add_post("/v1/chat/completions", self._handle_chat)
        app.router.add_get("/v1/models", self._handle_models)
        app.router.add_route("*", "/{tail:.*}", self._handle_unknown)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._requested_port, reuse_address=True)
        await site.start()
        self._runner = runner
        self._port = int(runner.addresses[0][1])

    def stop(self) -> None:
        """Stop the server and join its thread. Safe to call twice."""
        thread, loop, runner = self._thread, self._loop, self._runner
        if thread is None or loop is None:
            return
        if runner is not None:
            future = asyncio.run_coroutine_threadsafe(runner.cleanup(), loop)
            future.result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        self._thread = None
        self._loop = None
        self._runner = None
        self._port = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The TCP port it listens on (only while started)."""
        if self._port is None:
            raise RuntimeError("FakeOpenAI is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``: pass it as the OpenAI client's ``base_url``."""
        return f"http://{self._host}:{self.port}/v1"

    # ------------------------------------------------------------------ scripting
    def script(self, task: str, steps: Sequence[Step]) -> None:
        """Script the answers for the conversation whose first user message is ``task``.

        Step ``i`` answers a request that already holds ``i`` assistant messages. Scripting
        the same task again replaces its steps.
        """
        steps = list(steps)
        for step in steps:
            if not isinstance(step, Step):
                raise TypeError(f"script steps must be Step objects, got {step!r}")
        with self._lock:
            self._scripts[task] = steps

    def fail_next(self, n: int = 1, status: int = 500, retry_after: float | None = None) -> None:
        """Answer the next ``n`` chat requests with HTTP ``status`` (an OpenAI error body).

        ``retry_after`` (seconds, may be fractional) is sent as a ``Retry-After`` header.
        The failures are counted in :attr:`failures_served` and are not :attr:`errors`.
        """
        if n < 0:
            raise ValueError("n must be >= 0")
        if status < 400:
            raise ValueError("status must be an HTTP error status")
        with self._lock:
            self._pending_failures.extend([(status, retry_after, None)] * n)

    def clear_failures(self) -> None:
        """Drop the failures still queued by :meth:`fail_next` and :meth:`error_next`, and end
        a :meth:`rate_limit`: the provider is back."""
        with self._lock:
            self._pending_failures.clear()
            self._limited = None

    def rate_limit(self, seconds: float, header: str = "x-ratelimit-reset-tokens") -> None:
        """Be over the rate limit for the next ``seconds``: every chat request gets a 429 whose
        only hint is ``header: <time left>s`` (as OpenAI, Groq and Azure send it), no
        ``Retry-After``. Counted in :attr:`failures_served`."""
        with self._lock:
            self._limited = (time.monotonic() + seconds, header)

    def error_next(self, n: int, error: Mapping[str, Any]) -> None:
        """Answer the next ``n`` chat requests with a 200 whose body is ``{"error": error}``,
        as OpenRouter relays a provider's failure. Counted like :meth:`fail_next`."""
        if n < 0:
            raise ValueError("n must be >= 0")
        with self._lock:
            self._pending_failures.extend([(200, None, {"error": dict(error)})] * n)

    def reset(self) -> None:
        """Forget scripts, recorded requests, errors and pending or served failures."""
        with self._lock:
            self._scripts.clear()
            self._requests.clear()
            self._errors.clear()
            self._pending_failures.clear()
            self._limited = None
            self._failures_served = 0

    # ------------------------------------------------------------------ records
    @property
    def requests(self) -> list[dict[str, Any]]:
        """A snapshot of every chat request body received, in order (failed ones too)."""
        with self._lock:
            return list(self._requests)

    def requests_for(self, task: str) -> list[dict[str, Any]]:
        """The recorded chat request bodies whose first user message is ``task``."""
        return [body for body in self.requests if _task_of(body) == task]

    @property
    def errors(self) -> list[str]:
        """A snapshot of the unexpected requests seen, each described in one string."""
        with self._lock:
            return list(self._errors)

    @property
    def failures_served(self) -> int:
        """How many injected failures (:meth:`fail_next`) have been answered."""
        with self._lock:
            return self._failures_served

    # ------------------------------------------------------------------ handlers
    def _check_auth(self, request: web.Request) -> web.Response | None:
        header = request.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            return web.json_response(
                _error_body(
                    "You didn't provide an API key. You need to provide your API key in an "
                    "Authorization header using Bearer auth (i.e. Authorization: Bearer "
                    "YOUR_KEY).",
                    "invalid_request_error",
                ),
                status=401,
            )
        if self._api_key is not None and key != self._api_key:
            return web.json_response(
                _error_body(
                    "Incorrect API key provided.",
                    "invalid_request_error",
                    code="invalid_api_key",
                ),
                status=401,
            )
        return None

    def _unexpected(
        self, problem: str, *, status: int = 500, param: str | None = None
    ) -> web.Response:
        with self._lock:
            self._errors.append(problem)
        type_ = "server_error" if status >= 500 else "invalid_request_error"
        return web.json_response(
            _error_body(f"FakeOpenAI: {problem}", type_, param=param),
            status=status,
            # The problem is in the test's script or the agent, not transient: a retry
            # would only repeat it, so tell OpenAI's clients not to.
            headers={"x-should-retry": "false"},
        )

    async def _handle_unknown(self, request: web.Request) -> web.Response:
        if (denied := self._check_auth(request)) is not None:
            return denied
        return self._unexpected(f"no such endpoint: {request.method} {request.path}", status=404)

    async def _handle_models(self, request: web.Request) -> web.Response:
        if (denied := self._check_auth(request)) is not None:
            return denied
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": self._model, "object": "model", "created": 0, "owned_by": "fake"}],
            }
        )

    async def _handle_chat(self, request: web.Request) -> web.Response:
        if (denied := self._check_auth(request)) is not None:
            return denied
        try:
            body = await request.json()
        except ValueError:
            return self._unexpected("request body is not JSON", status=400)
        if not isinstance(body, dict):
            return self._unexpected("request body is not a JSON object", status=400)

        with self._lock:
            self._requests.append(body)
            failure = self._pending_failures.pop(0) if self._pending_failures else None
            limited = self._limited
            left = limited[0] - time.monotonic() if limited is not None else 0.0
            if failure is not None or left > 0:
                self._failures_served += 1
        if failure is not None:
            return self._injected_failure(*failure)
        if limited is not None and left > 0:
            return web.json_response(
                _error_body(
                    "Rate limit reached for tokens (injected by FakeOpenAI.rate_limit).",
                    "tokens",
                    code="rate_limit_exceeded",
                ),
                status=429,
                headers={limited[1]: f"{left:.3f}s"},
            )

        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return self._unexpected("request has no 'messages' list", status=400, param="messages")
        if not body.get("model"):
            return self._unexpected("request has no 'model'", status=400, param="model")
        if body.get("stream"):
            return self._unexpected("streaming is not supported", status=400, param="stream")
        if self._validate and (problem := _check_conversation(messages)) is not None:
            message, param = problem
            return self._unexpected(message, status=400, param=param)

        task = _task_of(body)
        if task is None:
            return self._unexpected("request has no user message")
        with self._lock:
            steps = self._scripts.get(task)
        if steps is None:
            return self._unexpected(f"no script for task {task!r}")
        index = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
        if index >= len(steps):
            return self._unexpected(
                f"task {task!r}: request with {index} assistant message(s) but the script "
                f"has only {len(steps)} step(s)"
            )
        step = steps[index]
        if step.expect is not None:
            try:
                step.expect(messages)
            except AssertionError as exc:
                return self._unexpected(
                    f"task {task!r} step {index}: expect failed: {exc or 'AssertionError'}\n"
                    + traceback.format_exc()
                )
            except Exception as exc:
                return self._unexpected(
                    f"task {task!r} step {index}: expect raised {exc!r}\n" + traceback.format_exc()
                )
        if step.raw is not None:
            status, ctype, text = step.raw
            return web.Response(status=status, content_type=ctype, text=text)
        return web.json_response(self._completion(body, step))

    def _injected_failure(
        self, status: int, retry_after: float | None, body_200: dict[str, Any] | None
    ) -> web.Response:
        if body_200 is not None:
            return web.json_response(body_200, status=status)
        headers: dict[str, str] = {}
        if retry_after is not None:
            headers["Retry-After"] = (
                str(int(retry_after)) if float(retry_after).is_integer() else str(retry_after)
            )
        if status == 429:
            body = _error_body(
                "Rate limit reached (injected by FakeOpenAI.fail_next).",
                "requests",
                code="rate_limit_exceeded",
            )
        else:
            body = _error_body(
                f"The server had an error while processing your request (injected "
                f"{status} by FakeOpenAI.fail_next).",
                "server_error" if status >= 500 else "invalid_request_error",
            )
        return web.json_response(body, status=status, headers=headers)

    def _completion(self, body: Mapping[str, Any], step: Step) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": step.content,
            "refusal": None,
        }
        if step.tool_calls:
            message["tool_calls"] = [
                {
                    "id": tc.id,
                    "type": "function",
                    "function": {"name": tc.name, "arguments": tc.arguments},
                }
                for tc in step.tool_calls
            ]
        prompt_tokens = _rough_tokens(body.get("messages"))
        completion_tokens = _rough_tokens(message)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model") or self._model),
            "system_fingerprint": "fp_fake",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": step.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
