"""Who may talk to the playground's server: its own page, and tools on this machine that hold
the session token. Any other web page the developer has open may not.

Every request must name the server itself in ``Host`` (``127.0.0.1:PORT`` or
``localhost:PORT``, the port it was received on): a DNS-rebinding page names its own host
there. A request that carries ``Origin`` must come from that same origin; browsers send it
with every cross-site request and every POST. The page's UI API (``/ui/…``) also needs the
session token, which only the page's own HTML carries (its ``<meta name=playground-token>``;
the page sends it back in :data:`TOKEN_HEADER`, and as ``?token=`` for its event stream,
which cannot carry headers). Its POSTs must be ``application/json``: a cross-site form or a
``text/plain`` fetch cannot send that without a CORS preflight, which is never granted.

Everything is refused with a 4xx and a one-line ``error`` before any handler runs: nothing
is sent to the bot, nothing is stored.
"""

from __future__ import annotations

import secrets

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

TOKEN_HEADER = "X-Playground-Token"
TOKEN_QUERY = "token"  # /ui/stream only: an EventSource cannot send headers
UI_PREFIX = "/ui/"
STREAM_PATH = "/ui/stream"

# On every answer: no other site may frame the page (a click on a framed Approve button
# would be the developer's), and the page carries a secret, so nothing caches it.
SAFE_HEADERS = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def new_token() -> str:
    """A session token: made up at each start, never stored."""
    return secrets.token_urlsafe(32)


def own_hosts(request: web.Request) -> frozenset[str]:
    """The ``Host`` values that name this server: 127.0.0.1 or localhost on the port the
    request arrived on (without the port only when it is 80). Empty when unknown."""
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    if not isinstance(sock, tuple) or len(sock) < 2 or not isinstance(sock[1], int):
        return frozenset()
    port = sock[1]
    names = ("127.0.0.1", "localhost")
    hosts = {f"{n}:{port}" for n in names}
    if port == 80:
        hosts.update(names)
    return frozenset(hosts)


def _refuse(status: int, error: str) -> web.Response:
    return web.json_response({"ok": False, "error": error}, status=status, headers=SAFE_HEADERS)


def check(request: web.Request, token: str) -> web.Response | None:
    """The refusal for a request that did not come from the page or a local tool, or None."""
    host = (request.headers.get("Host") or "").strip().lower()
    if host not in own_hosts(request):
        return _refuse(403, "forbidden: the Host header must be this playground (127.0.0.1)")
    origin = request.headers.get("Origin")
    if origin is not None and origin.strip().lower() != f"http://{host}":
        return _refuse(403, "forbidden: requests from other web pages are refused")
    if not request.path.startswith(UI_PREFIX):
        return None  # the page itself, its static files, the Web API (bot token), response URLs
    given = request.headers.get(TOKEN_HEADER)
    if given is None and request.path == STREAM_PATH:
        given = request.query.get(TOKEN_QUERY)
    if not given or not secrets.compare_digest(given.encode(), token.encode()):
        return _refuse(
            403,
            "forbidden: missing or wrong session token (reload the page: the playground "
            "may have restarted)",
        )
    if request.method == "POST" and request.content_type != "application/json":
        return _refuse(415, "the body must be JSON, sent as Content-Type: application/json")
    return None


def middleware(token: str) -> Middleware:
    """The aiohttp middleware applying :func:`check` to every request, and
    :data:`SAFE_HEADERS` to every answer."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        refused = check(request, token)
        if refused is not None:
            return refused
        resp = await handler(request)
        if not resp.prepared:  # a stream has sent its headers already
            for key, value in SAFE_HEADERS.items():
                resp.headers.setdefault(key, value)
        return resp

    return guard
