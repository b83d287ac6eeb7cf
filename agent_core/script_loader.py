"""Loading the Lua scripts: each a ``.lua`` file of a package's ``lua/`` folder, read with
:mod:`importlib.resources` (so they work from an installed wheel, where they are package
data).

A line ``--!include NAME.lua`` is replaced by ``lua/include/NAME.lua`` (of the same package,
else of ``agent_core``), itself resolved the same way; a file is included once per script,
at its first mention, so helpers that need one another include it themselves. Full-line
comments (the KEYS/ARGV/returns headers, notes) are left out of what Redis receives.

:class:`ScriptSet` is the mechanism the registries (:class:`agent_core.scripts.Scripts`,
``bot.lock_scripts.BotScripts``) share: it registers a script with the client on first use
(``register_script``: EVALSHA, loading the script on NOSCRIPT; the cluster client's own
version falls back to EVAL, see :mod:`agent_core.cluster_client`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Container
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

from . import direct

_INCLUDE = re.compile(r"^--!include\s+([A-Za-z0-9_]+\.lua)\s*$")
_COMMENT = re.compile(r"^\s*--(?!!include)")


def _read(package: str, *parts: str) -> str | None:
    node = resources.files(package).joinpath("lua", *parts)
    return node.read_text(encoding="utf-8") if node.is_file() else None


def _include(package: str, name: str) -> str:
    for owner in dict.fromkeys((package, "agent_core")):
        text = _read(owner, "include", name)
        if text is not None:
            return text
    raise FileNotFoundError(f"lua include {name!r} (for {package}) not found")


def _resolve(package: str, text: str, seen: set[str], origin: str) -> list[str]:
    out: list[str] = []
    for line in text.splitlines():
        m = _INCLUDE.match(line)
        if m:
            name = m.group(1)
            if name not in seen:
                seen.add(name)
                out += _resolve(package, _include(package, name), seen, name)
            continue
        if line.startswith("--!"):
            raise ValueError(f"{origin}: unknown directive {line!r}")
        if _COMMENT.match(line) or not line.strip():
            continue
        out.append(line)
    return out


@functools.cache
def source(package: str, name: str) -> str:
    """The text sent to Redis for script ``name`` of ``package`` (includes resolved)."""
    text = _read(package, f"{name}.lua")
    if text is None:
        raise FileNotFoundError(f"lua script {name!r} of {package} not found")
    return "\n".join(_resolve(package, text, set(), f"{name}.lua")) + "\n"


class ScriptSet:
    """The scripts of ``package`` registered with one client, each on first use."""

    package = "agent_core"

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._registered: dict[str, AsyncScript] = {}
        # Sent by agent_core.direct on a single-node client (a cluster client routes them).
        self._direct = direct.usable(redis)

    def source(self, name: str) -> str:
        """Script ``name``'s text, as Redis receives it."""
        return source(self.package, name)

    async def _run(self, name: str, keys: list[str], args: list[Any]) -> Any:
        if not self._direct:
            return await self._script(name)(keys=keys, args=args)
        (reply,) = await self._send_direct(name, keys, args)
        return reply

    async def _send_direct(
        self,
        name: str,
        keys: list[str],
        args: list[Any],
        *after: direct.Command,
        raw: Container[int] = (),
    ) -> list[Any]:
        """Script ``name``, then the commands ``after``, in one round trip through
        :mod:`agent_core.direct`: their replies, the first error reply raised. A server
        without the script (restarted, or a replica just promoted) gets it whole (EVAL)."""
        sent = ("EVALSHA", self._script(name).sha, len(keys), *keys, *args)
        replies = await direct.execute(self.redis, sent, *after, raw=raw)
        if isinstance(replies[0], NoScriptError):
            sent = ("EVAL", self.source(name), len(keys), *keys, *args)
            replies = await direct.execute(self.redis, sent, *after, raw=raw)
        for reply in replies:
            if isinstance(reply, ResponseError):
                raise reply
        return replies

    def _script(self, name: str) -> AsyncScript:
        script = self._registered.get(name)
        if script is None:
            script = self._registered[name] = self.redis.register_script(self.source(name))
        return script

    async def _run_then_lrange(
        self, name: str, keys: list[str], args: list[Any], list_key: str
    ) -> tuple[Any, list[bytes]]:
        """Script ``name``, then ``LRANGE list_key 0 -1``: one round trip (a pipeline, not a
        transaction; the callers say why that is enough). A list read inside Lua is copied
        twice (into Lua, then out into the reply): ~30 times the server's time of a plain
        LRANGE for a long history. A script the server does not know is sent whole (EVAL),
        as on a replica just promoted. The list comes as bytes: the history's messages are
        spliced into a request body as they are (on one node never decoded, then encoded
        again: ~0.1 ms at 1,000 pairs)."""
        if self._direct:
            listing = ("LRANGE", list_key, 0, -1)
            reply, listed = await self._send_direct(name, keys, args, listing, raw=(1,))
            return reply, listed
        script = self._script(name)
        try:
            reply, text = await self._pipelined(("EVALSHA", script.sha), keys, args, list_key)
        except NoScriptError:
            reply, text = await self._pipelined(("EVAL", self.source(name)), keys, args, list_key)
        return reply, [m.encode() for m in text]

    async def _pipelined(
        self, head: tuple[str, str], keys: list[str], args: list[Any], list_key: str
    ) -> tuple[Any, list[str]]:
        # Errors raised, not returned: the client's retries (the cluster client's failover
        # window) apply to a pipeline only when its execute() raises.
        pipe = self.redis.pipeline(transaction=False)
        pipe.execute_command(*head, len(keys), *keys, *args)
        pipe.lrange(list_key, 0, -1)
        reply, listed = await pipe.execute()
        return reply, listed
