"""MCP servers as toolsets of an :class:`~agent_core.Agent`.

One session per server per worker process, opened by :meth:`MCPToolset.open` and kept
open. The session lives in a background task the toolset owns: the mcp client's context
managers hold anyio cancel scopes, which must be entered and exited by one task, and a
transport that fails tears down only that task's scope. Calls from any task of the worker
are sent through the session; a broken session is replaced by a new one (at once in the
background, and on the next call), and an unreachable server is a tool error for the
model, never an exception out of :meth:`MCPToolset.open`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import jsonschema
from mcp import Client, StdioServerParameters, types
from mcp.client import IncomingMessage, Transport
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from agent_core.editing import editable_fields
from agent_core.exceptions import ToolDefinitionError
from agent_core.routes import ApproverIds, approver_ids, channel_id
from agent_core.tools import ApprovalRule as ToolRule

from .exceptions import MCPConnectionError, MCPTimeoutError, MCPToolError
from .tools import MCPApprovalRule, MCPTool, result_text

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")
MAX_PAGES = 100  # of tools/list: a server that pages forever cannot hang the listing
MAX_BACKOFF = 30.0  # seconds between two connection attempts to a server that is down
CALL_GRACE = 5.0  # seconds past ``timeout`` before the call is abandoned without the SDK


@dataclass
class _Connection:
    client: Client | None = None
    lost: str = ""  # why it is lost; empty while it is not


def _describe(exc: BaseException) -> str:
    """One line on why a connection failed: the first leaf of an exception group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = exc.message if isinstance(exc, MCPError) else str(exc)
    line = " ".join(f"{type(exc).__name__}: {text}".split()) if text else type(exc).__name__
    return line[:300]


def _positive(owner: str, label: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"MCP server {owner!r}: {label} must be a number of seconds")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"MCP server {owner!r}: {label} must be a positive number of seconds")
    return float(value)


@asynccontextmanager
async def _watch_eof(transport: Transport, on_eof: Callable[[], None]) -> AsyncIterator[Any]:
    """``transport``, calling ``on_eof`` when the server closes its end (its process
    exited): the session is then replaced at once, not when a call finds it dead."""
    async with transport as (read, write):
        send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)

        async def relay() -> None:
            try:
                async with send:
                    async for item in read:
                        await send.send(item)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return  # our side closed first
            on_eof()

        async with anyio.create_task_group() as tg:
            tg.start_soon(relay)
            try:
                yield receive, write
            finally:
                tg.cancel_scope.cancel()


class MCPToolset:
    """The tools of one MCP server: the base of :class:`MCPServerStdio`,
    :class:`MCPServerHTTP` and :class:`MCPServerSSE` (an :class:`agent_core.Toolset`).

    ``name`` prefixes a tool's name when two sources offer the same one. ``allowed_tools``
    (the server's names) hides every other tool. ``requires_approval``: ``True`` gates every
    call, a list of tool names gates those (the others follow the agent's
    ``approval_policy``), a callable decides from (tool name, arguments) and gates the call
    when it raises, ``False`` gates none, ``None`` leaves it all to the agent's policy.
    ``approvers`` and ``approval_channel`` route every call of the server's tools as a tool's
    own do (see :mod:`agent_core.routes`; APPROVAL_ROUTES can route one tool).
    ``editable``: ``True`` lets an approver edit the arguments of every tool's calls before
    approving, a list of tool names (the server's) of those tools' (every field of the tool's
    input schema; see :mod:`agent_core.editing`). Off by default.
    ``timeout`` bounds each call, ``connect_timeout`` each connection attempt (seconds).
    """

    def __init__(
        self,
        name: str,
        *,
        allowed_tools: Sequence[str] | None = None,
        requires_approval: MCPApprovalRule = None,
        approvers: ApproverIds = None,
        approval_channel: str | None = None,
        editable: bool | Sequence[str] | None = None,
        timeout: float = 60.0,
        connect_timeout: float = 10.0,
    ) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(
                f"MCP server name {name!r} must match [A-Za-z0-9_-]{{1,32}}: it prefixes the "
                "names of its tools when two sources offer the same one"
            )
        if isinstance(allowed_tools, str):
            raise ValueError(f"MCP server {name!r}: allowed_tools is a list of tool names")
        rule = requires_approval
        if isinstance(rule, str) or not (
            rule is None or isinstance(rule, bool | Sequence) or callable(rule)
        ):
            raise ValueError(
                f"MCP server {name!r}: requires_approval is True, False, None, a list of tool "
                "names or a callable on (tool name, arguments)"
            )
        self.name = name
        self.allowed_tools = None if allowed_tools is None else frozenset(allowed_tools)
        self.requires_approval: MCPApprovalRule = (
            tuple(rule) if isinstance(rule, Sequence) and not callable(rule) else rule
        )
        self.approvers = approver_ids(approvers, f"MCP server {name!r}: approvers")
        self.approval_channel = channel_id(
            approval_channel, f"MCP server {name!r}: approval_channel"
        )
        if isinstance(editable, str):
            raise ValueError(f"MCP server {name!r}: editable is True, False or tool names")
        self.editable = editable if isinstance(editable, bool | None) else frozenset(editable)
        self.timeout = _positive(name, "timeout", timeout)
        self.connect_timeout = _positive(name, "connect_timeout", connect_timeout)
        self._tools: tuple[MCPTool, ...] = ()
        self._listed: tuple[tuple[str, str, str, str], ...] = ()
        self._version = 0
        self._opens = 0
        self._task: asyncio.Task[None] | None = None
        self._conn: _Connection | None = None
        self._stopping = False
        self._refresh_wanted = False
        self._attempt = 0  # connection attempts started
        self._failed = 0  # the last attempt that failed
        self._connecting = False
        self._last_error = "not connected yet"
        # Made by _start(), in the event loop that uses them.
        self._poke = asyncio.Event()  # the session's owner has something to do
        self._wake = asyncio.Event()  # a caller wants a connection attempt now
        self._attempt_over = asyncio.Event()  # replaced after each attempt

    def __repr__(self) -> str:  # headers and env may hold secrets
        return f"{type(self).__name__}(name={self.name!r})"

    # --- the Toolset protocol ---------------------------------------------------------
    def tools(self) -> Sequence[MCPTool]:
        """The tools listed by the server, as last known (no I/O)."""
        return self._tools

    @property
    def version(self) -> int:
        """Bumped whenever the server's tool list changes."""
        return self._version

    async def open(self) -> None:
        """Connect and list the tools; never raises (a server that cannot be reached is
        logged, has no tools or its last known ones, and is retried in the background).
        Opening an open toolset only counts: it closes after as many :meth:`close`."""
        self._opens += 1
        self._start()
        try:
            await self._connected()
        except MCPConnectionError:
            pass  # the owner task logged why, and tries again
        except Exception:
            log.warning("MCP server %s: opening failed", self.name, exc_info=True)

    async def close(self) -> None:
        """Close the session (and stop a stdio server); it may be opened again."""
        self._opens = max(self._opens - 1, 0)
        task = self._task
        if self._opens or task is None:
            return
        self._task = None
        self._stopping = True
        self._poke.set()
        self._wake.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), 10)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        except Exception:
            log.warning("MCP server %s: closing failed", self.name, exc_info=True)

    # --- calls ------------------------------------------------------------------------
    async def call_tool(self, tool: str, arguments: dict[str, Any]) -> str:
        """Call ``tool`` (the server's name for it); the result as the model reads it.

        Raises :class:`MCPToolError` (the server's error), :class:`MCPConnectionError`
        (unreachable, or the connection broke) or :class:`MCPTimeoutError`.
        """
        conn = await self._connected()
        assert conn.client is not None
        try:
            async with asyncio.timeout(self.timeout + CALL_GRACE):
                result = await conn.client.call_tool(
                    tool, arguments, read_timeout_seconds=self.timeout
                )
        except MCPError as exc:
            if exc.code == types.REQUEST_TIMEOUT:
                raise self._timed_out() from exc
            if exc.code == types.CONNECTION_CLOSED:
                self._mark_lost(conn, exc.message)
                raise self._broke(exc.message) from exc
            raise MCPToolError(
                f"the server refused the call: {exc.message} (JSON-RPC error {exc.code})"
            ) from exc
        except TimeoutError as exc:
            raise self._timed_out() from exc
        except ValidationError as exc:
            raise MCPToolError(
                f"the server's answer is not a valid tool result ({exc.error_count()} problems)"
            ) from exc
        except Exception as exc:  # the transport failed under the call
            self._mark_lost(conn, _describe(exc))
            raise self._broke(_describe(exc)) from exc
        return result_text(result)

    def _timed_out(self) -> MCPTimeoutError:
        return MCPTimeoutError(
            f"MCP server {self.name!r} did not answer within {self.timeout:g} s; the call was "
            "cancelled, but it may have taken effect on the server"
        )

    def _broke(self, reason: str) -> MCPConnectionError:
        return MCPConnectionError(
            f"the connection to MCP server {self.name!r} broke before it answered ({reason}); "
            "the call may or may not have taken effect on the server"
        )

    # --- the connection ---------------------------------------------------------------
    def _start(self) -> None:
        """Start the session's owner task unless it runs (in this event loop)."""
        task = self._task
        loop = asyncio.get_running_loop()
        if task is not None and not task.done() and task.get_loop() is loop:
            return
        self._stopping = False
        self._conn = None
        self._attempt = self._failed = 0
        self._connecting = False
        self._poke, self._wake, self._attempt_over = (asyncio.Event() for _ in range(3))
        self._task = loop.create_task(self._serve(), name=f"mcp-server-{self.name}")

    def _signal(self) -> None:
        """Wake every caller waiting for the outcome of a connection attempt."""
        self._attempt_over.set()
        self._attempt_over = asyncio.Event()

    def _mark_lost(self, conn: _Connection, reason: str) -> None:
        conn.lost = conn.lost or reason
        self._poke.set()

    async def _connected(self) -> _Connection:
        """The live session, or :class:`MCPConnectionError` after one attempt failed."""
        conn = self._conn
        if conn is not None and not conn.lost:
            return conn
        self._start()
        # An attempt under way counts; otherwise wait for the next one.
        needed = self._attempt if self._connecting else self._attempt + 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.connect_timeout
        while True:
            conn = self._conn
            if conn is not None and not conn.lost:
                return conn
            if self._failed >= needed:
                raise MCPConnectionError(
                    f"cannot reach MCP server {self.name!r} ({self._last_error}); the call was "
                    "not sent"
                )
            left = deadline - loop.time()
            if left <= 0:
                raise MCPConnectionError(
                    f"MCP server {self.name!r} did not connect within "
                    f"{self.connect_timeout:g} s; the call was not sent"
                )
            over = self._attempt_over
            self._wake.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(over.wait(), left)

    async def _serve(self) -> None:
        """The owner task: connect, list, serve until lost or closed; again, with backoff."""
        loop = asyncio.get_running_loop()
        backoff = 0.0
        while not self._stopping:
            if backoff:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), backoff)
                if self._stopping:
                    break
            self._wake.clear()
            self._attempt += 1
            attempt = self._attempt
            self._connecting = True
            conn = _Connection()
            since: float | None = None
            reason = ""
            eof = functools.partial(self._mark_lost, conn, "the server closed the connection")
            try:
                async with self._session(eof) as client:
                    await self._refresh(client)
                    conn.client = client
                    self._conn, self._connecting, since = conn, False, loop.time()
                    log.info("MCP server %s: connected, %d tools", self.name, len(self._tools))
                    self._signal()
                    await self._stay(conn)
            except Exception as exc:
                reason = _describe(exc)
            finally:
                self._conn = None
                reason = reason or conn.lost or "closed"
                self._connecting = False
            if self._stopping:
                break
            self._last_error = reason
            if since is None:
                self._failed = attempt
                level = logging.WARNING if backoff == 0 else logging.INFO
                backoff = min(max(backoff * 2, 0.5), MAX_BACKOFF)
                log.log(
                    level,
                    "MCP server %s: cannot connect (%s); retrying in %.1f s",
                    self.name,
                    reason,
                    backoff,
                )
            else:
                log.warning("MCP server %s: connection lost (%s); reconnecting", self.name, reason)
                # A server that dies at once is not restarted in a tight loop.
                backoff = 0.0 if loop.time() - since > 1.0 else 0.5
            self._signal()
        self._signal()

    @asynccontextmanager
    async def _session(self, on_eof: Callable[[], None]) -> AsyncIterator[Client]:
        async with AsyncExitStack() as stack:
            transport = await self._transport(stack, on_eof)
            client = Client(
                transport,
                message_handler=self._on_message,
                read_timeout_seconds=self.connect_timeout,
                cache=None,  # tools/list is cached here, and refreshed on list_changed
                client_info=types.Implementation(name="agent_mcp", version="1"),
            )
            yield await stack.enter_async_context(client)

    async def _transport(self, stack: AsyncExitStack, on_eof: Callable[[], None]) -> Transport:
        """A new transport to the server (resources it needs go on ``stack``)."""
        raise NotImplementedError

    async def _stay(self, conn: _Connection) -> None:
        """Serve the session: re-list the tools when the server says they changed."""
        assert conn.client is not None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._listen, conn.client)
            while not (self._stopping or conn.lost):
                await self._poke.wait()
                self._poke.clear()
                if self._refresh_wanted and not (self._stopping or conn.lost):
                    self._refresh_wanted = False
                    try:
                        await self._refresh(conn.client)
                    except MCPError as exc:
                        if exc.code == types.CONNECTION_CLOSED:
                            raise
                        log.warning(  # the server answered: keep the session and its tools
                            "MCP server %s: listing its tools failed (%s)", self.name, exc.message
                        )
            tg.cancel_scope.cancel()

    async def _listen(self, client: Client) -> None:
        """On 2026-era connections, list changes come on a ``subscriptions/listen`` stream
        (earlier ones send ``notifications/tools/list_changed`` to :meth:`_on_message`)."""
        try:
            async with client.listen(tools_list_changed=True) as changes:
                async for _ in changes:
                    self._request_refresh()
        except Exception as exc:  # not supported, or the connection ended
            log.debug("MCP server %s: no list-change subscription (%s)", self.name, _describe(exc))

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, Exception):
            log.debug("MCP server %s: transport error %s", self.name, _describe(message))
        elif getattr(message, "method", None) == "notifications/tools/list_changed":
            self._request_refresh()

    def _request_refresh(self) -> None:
        self._refresh_wanted = True
        self._poke.set()

    async def _refresh(self, client: Client) -> None:
        listed: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await client.list_tools(cursor=cursor)
            listed += page.tools
            cursor = page.next_cursor
            if not cursor:
                break
        self._set_tools(listed)

    def _set_tools(self, listed: Sequence[types.Tool]) -> None:
        tools: list[MCPTool] = []
        for t in listed:
            if self.allowed_tools is not None and t.name not in self.allowed_tools:
                continue
            try:
                tool = MCPTool.from_listing(t, self, self._rule(t.name))
                tool = dataclasses.replace(
                    tool,
                    approvers=self.approvers,
                    approval_channel=self.approval_channel,
                    editable=self._editable(t.name, tool.schema),
                )
            except jsonschema.SchemaError as exc:
                log.warning(
                    "MCP server %s: tool %s hidden: its input schema is invalid (%s)",
                    self.name,
                    t.name,
                    exc.message[:200],
                )
                continue
            if any(tool.name == other.name for other in tools):
                log.warning(
                    "MCP server %s: tool %s hidden: another of its tools is offered as %s",
                    self.name,
                    t.name,
                    tool.name,
                )
                continue
            tools.append(tool)
        key = tuple(
            (t.name, t.remote_name, t.description, json.dumps(t.schema, sort_keys=True))
            for t in tools
        )
        if key == self._listed:
            return
        self._tools, self._listed = tuple(tools), key
        self._version += 1
        names = {t.name for t in listed}
        rule = self.requires_approval
        gated = rule if isinstance(rule, tuple) else ()
        for label, wanted in (
            ("allowed_tools", self.allowed_tools or ()),
            ("requires_approval", gated),
        ):
            missing = sorted(set(wanted) - names)
            if missing:
                log.warning(
                    "MCP server %s lists no tool named %s (named in its %s)",
                    self.name,
                    ", ".join(missing),
                    label,
                )

    def _editable(self, remote_name: str, schema: dict[str, Any]) -> tuple[str, ...]:
        """The fields of a tool an approver may edit: all or none (see the class docstring)."""
        wanted = self.editable
        if not (wanted is True or (isinstance(wanted, frozenset) and remote_name in wanted)):
            return ()
        try:
            return editable_fields(True, schema, f"MCP tool {remote_name}")
        except ToolDefinitionError:  # no properties: nothing to edit
            return ()

    def _rule(self, remote_name: str) -> ToolRule:
        """The approval rule of one tool (see the class docstring)."""
        rule = self.requires_approval
        if rule is None or isinstance(rule, bool):
            return rule
        if isinstance(rule, tuple):
            return True if remote_name in rule else None
        if callable(rule):
            decide = rule

            def requires(args: dict[str, Any]) -> bool:
                return bool(decide(remote_name, args))

            return requires
        return True  # unreachable: the constructor checked the rule; gate if not


class MCPServerStdio(MCPToolset):
    """An MCP server run as a subprocess of the worker, spoken to over stdin and stdout.

    The command starts when the toolset opens, and again after it exits. ``env`` is added
    to the few variables the mcp SDK passes on (HOME, PATH, ...); ``cwd`` defaults to the
    worker's. The server's stderr is the worker's.
    """

    def __init__(
        self,
        name: str,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        allowed_tools: Sequence[str] | None = None,
        requires_approval: MCPApprovalRule = None,
        approvers: ApproverIds = None,
        approval_channel: str | None = None,
        editable: bool | Sequence[str] | None = None,
        timeout: float = 60.0,
        connect_timeout: float = 10.0,
    ) -> None:
        super().__init__(
            name,
            allowed_tools=allowed_tools,
            requires_approval=requires_approval,
            approvers=approvers,
            approval_channel=approval_channel,
            editable=editable,
            timeout=timeout,
            connect_timeout=connect_timeout,
        )
        if isinstance(args, str):
            raise ValueError(f"MCP server {name!r}: args is a list of arguments")
        self.params = StdioServerParameters(
            command=command,
            args=list(args),
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )

    async def _transport(self, stack: AsyncExitStack, on_eof: Callable[[], None]) -> Transport:
        return _watch_eof(stdio_client(self.params), on_eof)


def _http_url(name: str, url: str) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"MCP server {name!r}: url must be an http:// or https:// URL")
    return url


class MCPServerHTTP(MCPToolset):
    """An MCP server at a streamable HTTP endpoint (``url``, e.g. ``https://host/mcp``),
    with ``headers`` on every request (an ``Authorization`` header, say)."""

    def __init__(
        self,
        name: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        allowed_tools: Sequence[str] | None = None,
        requires_approval: MCPApprovalRule = None,
        approvers: ApproverIds = None,
        approval_channel: str | None = None,
        editable: bool | Sequence[str] | None = None,
        timeout: float = 60.0,
        connect_timeout: float = 10.0,
    ) -> None:
        super().__init__(
            name,
            allowed_tools=allowed_tools,
            requires_approval=requires_approval,
            approvers=approvers,
            approval_channel=approval_channel,
            editable=editable,
            timeout=timeout,
            connect_timeout=connect_timeout,
        )
        self.url = _http_url(name, url)
        self.headers = dict(headers or {})

    async def _transport(self, stack: AsyncExitStack, on_eof: Callable[[], None]) -> Transport:
        http = await stack.enter_async_context(
            httpx2.AsyncClient(
                headers=self.headers,
                # A response stream may stay quiet for as long as a call runs.
                timeout=httpx2.Timeout(self.connect_timeout, read=max(300.0, self.timeout + 30)),
            )
        )
        return streamable_http_client(self.url, http_client=http)


class MCPServerSSE(MCPToolset):
    """An MCP server on the older HTTP+SSE transport (``url`` of its SSE endpoint, e.g.
    ``https://host/sse``), with ``headers`` on every request."""

    def __init__(
        self,
        name: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        allowed_tools: Sequence[str] | None = None,
        requires_approval: MCPApprovalRule = None,
        approvers: ApproverIds = None,
        approval_channel: str | None = None,
        editable: bool | Sequence[str] | None = None,
        timeout: float = 60.0,
        connect_timeout: float = 10.0,
    ) -> None:
        super().__init__(
            name,
            allowed_tools=allowed_tools,
            requires_approval=requires_approval,
            approvers=approvers,
            approval_channel=approval_channel,
            editable=editable,
            timeout=timeout,
            connect_timeout=connect_timeout,
        )
        self.url = _http_url(name, url)
        self.headers = dict(headers or {})

    async def _transport(self, stack: AsyncExitStack, on_eof: Callable[[], None]) -> Transport:
        return sse_client(
            self.url,
            headers=self.headers,
            timeout=self.connect_timeout,
            sse_read_timeout=max(300.0, self.timeout + 30),
        )
