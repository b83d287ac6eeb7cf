"""The :class:`FakeOpenAI` server: a real local HTTP server speaking Chat Completions."""

from __future__ import annotations

import copy
import inspect
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from aiohttp import web

from agent_core.testing.server import ThreadedServer
from agent_core.testing.servers import (
    _RELAYS,
    _RULES,
    QUIRKS,
    SERVERS,
    ServerName,
    _thinking,
    forwarded,
)
from agent_core.testing.shapes import (
    _REFUSALS,
    _documented_failure,
    _litellm_relay,
    _openrouter_relay,
    _server_call_id,
    _shape,
    _too_many_requests,
)
from agent_core.testing.steps import (
    Step,
    _check_conversation,
    _error_body,
    _rough_tokens,
    _task_of,
)

Responder = Callable[[list[dict[str, Any]]], Step]
"""Answers a request no script matches: called with its ``messages``, returns a :class:`Step`.

A responder that also takes a ``tools`` keyword (give it a default, e.g. ``tools=None``) is
given the request's ``tools`` list (``[]`` when the request has none)."""


def _wants_tools(responder: Responder) -> bool:
    try:
        params = inspect.signature(responder).parameters
    except (TypeError, ValueError):
        return False
    tools = params.get("tools")
    if tools is not None and tools.kind in (tools.POSITIONAL_OR_KEYWORD, tools.KEYWORD_ONLY):
        return True
    return any(p.kind is p.VAR_KEYWORD for p in params.values())


class FakeOpenAI(ThreadedServer):
    """A scripted, OpenAI-compatible Chat Completions server on 127.0.0.1.

    Use it as a context manager or call :meth:`start` / :meth:`stop`. It serves:

    - ``POST /v1/chat/completions``: scripted answers (see :meth:`script`);
    - ``GET /v1/models``: a one-model list.

    Every request needs ``Authorization: Bearer <key>`` (any non-empty key, or exactly
    ``api_key`` when given), else 401 in OpenAI's error format. With ``validate=True`` (the
    default) a request that the real server refuses (for every server: a tool call id with no
    tool message, a tool message answering no call; then the rules of ``server``) gets the
    server's refusal and is recorded in :attr:`errors`.

    ``server`` picks the profile (:data:`SERVERS`, default ``"openai"``); ``upstream`` the
    server behind a relay (``"litellm"``, ``"openrouter"``; default ``"openai"``), whose rules
    and tool-call ids apply and whose refusals come back in the relay's error shape;
    ``quirks`` the version-specific oddities to reproduce (:data:`QUIRKS`).

    ``responder`` (or :meth:`respond_with`) answers the requests no script matches: it is
    called with the request's ``messages`` and its :class:`Step` is answered like a scripted
    one. Without it such a request is an error.

    ``keep_requests`` bounds :attr:`requests` to the latest N (a long-lived server, such as the
    playground's model, would otherwise keep every conversation it was sent).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        model: str = "gpt-4o-mini",
        validate: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
        server: ServerName = "openai",
        upstream: ServerName | None = None,
        quirks: Collection[str] = (),
        responder: Responder | None = None,
        keep_requests: int | None = None,
    ) -> None:
        if server not in SERVERS:
            raise ValueError(f"unknown server {server!r}; known: {', '.join(SERVERS)}")
        if upstream is not None and (server not in _RELAYS or upstream in _RELAYS):
            raise ValueError("upstream is for a relay (litellm, openrouter) in front of a server")
        unknown = sorted(set(quirks) - set(QUIRKS))
        if unknown:
            raise ValueError(f"unknown quirks {unknown}; known: {', '.join(QUIRKS)}")
        super().__init__(name="FakeOpenAI", host=host, port=port, reuse_address=True)
        self._server: ServerName = server
        self._upstream: ServerName | None = (upstream or "openai") if server in _RELAYS else None
        self._quirks = frozenset(quirks)
        self._api_key = api_key
        self._model = model
        self._validate = validate
        self._lock = threading.Lock()
        self._scripts: dict[str, list[Step]] = {}
        self._default_responder = responder
        self._responder = responder
        self._requests: deque[dict[str, Any]] = deque(maxlen=keep_requests)
        self._errors: list[str] = []
        self._limited: tuple[float, str | None] | None = None
        self._pending_failures: list[tuple[int, float | None, dict[str, Any] | None]] = []
        self._failures_served = 0

    # ------------------------------------------------------------------ routes
    def make_app(self) -> web.Application:
        """The Chat Completions routes (see the class docstring)."""
        app = web.Application(client_max_size=256 * 1024**2)  # long histories exceed 1 MiB
        app.router.add_post("/v1/chat/completions", self._handle_chat)
        app.router.add_get("/v1/models", self._handle_models)
        app.router.add_route("*", "/{tail:.*}", self._handle_unknown)
        return app

    @property
    def server(self) -> ServerName:
        """The server profile (``"openai"`` unless given)."""
        return self._server

    @property
    def upstream(self) -> ServerName | None:
        """The server behind a relay profile, else None."""
        return self._upstream

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

    def respond_with(self, responder: Responder | None) -> None:
        """Answer the requests that no script matches with ``responder`` (see
        :data:`Responder`); ``None`` makes them errors again. Scripts still come first."""
        with self._lock:
            self._responder = responder

    def fail_next(self, n: int = 1, status: int = 500, retry_after: float | None = None) -> None:
        """Answer the next ``n`` chat requests with HTTP ``status``: the profile's own error
        body where it is documented (Anthropic's 529 ``overloaded_error``, DeepSeek's 402
        ``Insufficient Balance``, Gemini's list-shaped errors), else an OpenAI error body.

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

    def rate_limit(self, seconds: float, header: str | None = None) -> None:
        """Be over the rate limit for the next ``seconds``: every chat request gets the
        server profile's 429 (for ``"openai"``: only ``x-ratelimit-reset-tokens: <time
        left>s``, no ``Retry-After``; Groq adds ``retry-after``; Azure sends ``retry-after``).
        ``header`` sends that one hint instead (``x-ratelimit-reset-*`` as ``"2.5s"``,
        ``retry-after`` and Azure's ``x-rate-limit-reset-tokens`` in whole seconds,
        ``retry-after-ms``). Counted in :attr:`failures_served`."""
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
        """Forget scripts, recorded requests, errors and pending or served failures; the
        responder is the constructor's again."""
        with self._lock:
            self._scripts.clear()
            self._responder = self._default_responder
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
            headers, limit_body = _too_many_requests(
                self._server,
                self._upstream,
                left,
                limited[1],
                str(body.get("model") or self._model),
            )
            return web.json_response(limit_body, status=429, headers=headers)

        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return self._unexpected("request has no 'messages' list", status=400, param="messages")
        if not body.get("model"):
            return self._unexpected("request has no 'model'", status=400, param="model")
        if body.get("stream"):
            return self._unexpected("streaming is not supported", status=400, param="stream")
        if self._validate and (refused := self._refusal(messages, body)) is not None:
            return refused

        task = _task_of(body)
        with self._lock:
            steps = self._scripts.get(task) if task is not None else None
            responder = self._responder
        if steps is not None:
            index = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
            if index >= len(steps):
                return self._unexpected(
                    f"task {task!r}: request with {index} assistant message(s) but the script "
                    f"has only {len(steps)} step(s)"
                )
            step, where = steps[index], f"task {task!r} step {index}"
        elif responder is not None:
            where = f"task {task!r} (responder)"
            try:
                answer = self._respond(responder, messages, body)
            except Exception as exc:
                return self._unexpected(f"{where}: raised {exc!r}\n" + traceback.format_exc())
            if not isinstance(answer, Step):
                return self._unexpected(f"{where}: returned {answer!r}, not a Step")
            step = answer
        elif task is None:
            return self._unexpected("request has no user message")
        else:
            return self._unexpected(f"no script for task {task!r}")
        if step.expect is not None:
            try:
                step.expect(messages)
            except AssertionError as exc:
                return self._unexpected(
                    f"{where}: expect failed: {exc or 'AssertionError'}\n" + traceback.format_exc()
                )
            except Exception as exc:
                return self._unexpected(
                    f"{where}: expect raised {exc!r}\n" + traceback.format_exc()
                )
        if step.raw is not None:
            status, ctype, text = step.raw
            return web.Response(status=status, content_type=ctype, text=text)
        return web.json_response(self._completion(body, step))

    @staticmethod
    def _respond(responder: Responder, messages: list[Any], body: Mapping[str, Any]) -> object:
        """The responder's answer, given a copy of the messages (and the tools if it asks)."""
        messages = copy.deepcopy(messages)
        if _wants_tools(responder):
            tools = body.get("tools")
            fn: Callable[..., object] = responder
            return fn(messages, tools=copy.deepcopy(tools) if isinstance(tools, list) else [])
        return responder(messages)

    def _refusal(self, messages: list[Any], body: Mapping[str, Any]) -> web.Response | None:
        """The server's refusal when the request breaks one of its rules, else None."""
        if not all(isinstance(m, dict) for m in messages):
            problem = _check_conversation(messages)
            assert problem is not None
            return self._unexpected(problem[0], status=400, param=problem[1])
        rules_of = self._upstream or self._server
        sent = forwarded(self._server, self._upstream, messages)
        violation = next(
            (v for rule in _RULES[rules_of] if (v := rule(sent, body)) is not None), None
        )
        if violation is None:
            return None
        status, error = _REFUSALS[rules_of](violation)
        name = self._server if self._upstream is None else f"{self._server}→{self._upstream}"
        if self._server == "openrouter":
            error = _openrouter_relay(status, error, rules_of)
        elif self._server == "litellm":
            error = _litellm_relay(status, error, rules_of)
        with self._lock:
            self._errors.append(
                f"{name} refuses this request ({violation.rule}): {violation.message}"
                + (f" at {list(violation.loc)}" if violation.loc else "")
            )
        return web.json_response(error, status=status)

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
        body: Any
        if (documented := _documented_failure(self._server, status)) is not None:
            body = documented  # the profile's own words for this status
        elif status == 429:
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
        ids_of = self._upstream or self._server
        if step.tool_calls:
            message["tool_calls"] = [
                {
                    "id": tc.id if tc.explicit_id else _server_call_id(ids_of, tc.id),
                    "type": "function",
                    "function": {"name": tc.name, "arguments": tc.arguments},
                }
                for tc in step.tool_calls
            ]
        prompt_tokens = _rough_tokens(body.get("messages"))
        completion_tokens = _rough_tokens(message)
        completion: dict[str, Any] = {
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
        _shape(self._server, self._upstream, completion, step, self._quirks, _thinking(body))
        return completion
