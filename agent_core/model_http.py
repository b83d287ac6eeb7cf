"""The model's HTTP path: one aiohttp session posting Chat Completions requests.

The ``AsyncOpenAI`` client a worker is given stays the place its settings live (base URL,
key, headers, timeout) and the source of the error types the runner reasons with
(:mod:`agent_core.retries`, :mod:`agent_core.provider_errors`). Its request machinery is not
used per call: building, sending and reading one request through ``client.post`` cost about
1.9 ms of CPU, against 0.4 ms for the same POST through aiohttp (measured on loopback against
the fake model, 600 calls each, in one process); a complete run makes two model calls.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import aiohttp
import httpx2
import openai
from aiohttp.helpers import get_env_proxy_for_url
from openai import AsyncOpenAI
from yarl import URL

# The status codes OpenAI's client gives an exception type of its own; others are
# APIStatusError (5xx: InternalServerError). The runner retries by status, not by type,
# except RateLimitError for its metrics.
_STATUS_ERRORS: dict[int, type[openai.APIStatusError]] = {
    400: openai.BadRequestError,
    401: openai.AuthenticationError,
    403: openai.PermissionDeniedError,
    404: openai.NotFoundError,
    409: openai.ConflictError,
    422: openai.UnprocessableEntityError,
    429: openai.RateLimitError,
}


class ModelEndpoint:
    """POSTs to ``<client.base_url>/chat/completions`` with the client's headers and timeout.

    The session opens on the first call, in the running loop, and is closed by
    :meth:`aclose`. Answers: the decoded JSON (a JSON content type), else the text; a non-2xx
    answer raises the ``openai.APIStatusError`` subclass OpenAI's client would, a failed
    connection ``openai.APIConnectionError``, a timeout ``openai.APITimeoutError``.
    """

    def __init__(self, client: AsyncOpenAI | None) -> None:
        self.client = client
        self._session: aiohttp.ClientSession | None = None
        self._url = ""
        self._headers: dict[str, str] = {}
        self._proxy: URL | None = None
        self._proxy_auth: aiohttp.BasicAuth | None = None

    def _open(self) -> aiohttp.ClientSession:
        client = self.client
        if client is None:
            raise RuntimeError("no OpenAI client was given: this runner cannot call the model")
        self._url = str(client.base_url).rstrip("/") + "/chat/completions"
        # Only plain strings: the client marks headers it leaves out with sentinels.
        headers = {k: v for k, v in client.default_headers.items() if isinstance(v, str)}
        headers["Content-Type"] = "application/json"
        headers["Accept"] = "application/json"
        headers["Authorization"] = f"Bearer {client.api_key}"
        self._headers = headers
        timeout = client.timeout
        seconds = timeout if isinstance(timeout, int | float) else None
        if isinstance(timeout, httpx2.Timeout):
            seconds = timeout.read
        # HTTPS_PROXY / NO_PROXY, as OpenAI's client honours them: read once, here.
        # (aiohttp's trust_env reads them, and ~/.netrc, on every request, each in a thread
        # of the default executor: two thread hand-offs per model call, ~1.5% of a worker's
        # CPU, measured. A netrc login is never wanted: the request carries the API key.)
        with contextlib.suppress(LookupError):
            self._proxy, self._proxy_auth = get_env_proxy_for_url(URL(self._url))
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=seconds),
            connector=aiohttp.TCPConnector(limit=256),
            auto_decompress=True,
        )
        return self._session

    def _plain_key(self) -> bool:
        """Whether the client authenticates with its API key alone (a workload identity or
        a cloud provider signs each request: those go through the client itself)."""
        c = self.client
        return bool(
            c is not None
            and c.api_key
            and getattr(c, "workload_identity", None) is None
            and getattr(c, "_provider", None) is None
        )

    async def post(self, body: bytes) -> Any:
        """One Chat Completions request; the answer's body (see the class docstring)."""
        if self._session is None and not self._plain_key():
            if self.client is None:
                raise RuntimeError("no OpenAI client was given: this runner cannot call the model")
            return await self.client.post(
                "/chat/completions",
                content=body,
                cast_to=object,
                options={"headers": {"Content-Type": "application/json"}},
            )
        session = self._session if self._session is not None else self._open()
        try:
            async with session.post(
                self._url,
                data=body,
                headers=self._headers,
                proxy=self._proxy,
                proxy_auth=self._proxy_auth,
            ) as resp:
                content = await resp.read()
                status = resp.status
                ctype = resp.headers.get("Content-Type", "")
                if status >= 300:
                    raise status_error(
                        status, list(resp.headers.items()), content, self._url, ctype
                    )
        except TimeoutError as exc:
            raise openai.APITimeoutError(request=_request(self._url)) from exc
        except aiohttp.ClientError as exc:
            raise openai.APIConnectionError(
                message=f"Connection error ({type(exc).__name__})", request=_request(self._url)
            ) from exc
        text = content.decode("utf-8", errors="replace")
        if "json" in ctype.lower():
            return json.loads(text)  # a ValueError here: a body labelled JSON that is not JSON
        return text

    async def aclose(self) -> None:
        """Close the session (the client is the caller's to close)."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


def _request(url: str) -> httpx2.Request:
    return httpx2.Request("POST", url)


def status_error(
    status: int, headers: list[tuple[str, str]], content: bytes, url: str, ctype: str = ""
) -> openai.APIStatusError:
    """The exception OpenAI's client raises for this answer: its type by status, its
    ``body`` the ``error`` member of a JSON body (else the whole body), its ``response``
    carrying the headers (Retry-After and the rate-limit resets are read from them)."""
    response = httpx2.Response(status, headers=headers, content=content, request=_request(url))
    text = content.decode("utf-8", errors="replace")
    body: Any = text
    if "json" in ctype.lower() or text.lstrip().startswith(("{", "[")):
        try:
            body = json.loads(text)
        except (ValueError, RecursionError):
            body = text
    data = body.get("error", body) if isinstance(body, dict) else body
    kind = _STATUS_ERRORS.get(status)
    if kind is None:
        kind = openai.InternalServerError if status >= 500 else openai.APIStatusError
    message = f"Error code: {status} - {body}"
    return kind(message, response=response, body=data)
