"""What the commands share: ``--help`` (with the settings each reads), ``--version`` and
``--check`` (``agent-worker``, ``agent-web``)."""

from __future__ import annotations

import argparse
import asyncio
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, NoReturn

from . import __version__
from .exceptions import ConfigError
from .settings import Settings, exit_on_config_error

if TYPE_CHECKING:
    from .agent import Agent

CHECK_HELP = (
    "validate the settings, reach Redis and import the agents, then exit: 0 when all is "
    "well, else 2 with one line per problem"
)


def settings_epilog(*helps: Mapping[str, str]) -> str:
    """The environment variables a command reads, each with what it is for (the same text
    as its configuration error lines)."""
    lines = ["settings (environment variables):"]
    for help_ in helps:
        for name, text in help_.items():
            lines.append(f"  {name}")
            lines += textwrap.wrap(text, 78, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)


def parser(
    prog: str, description: str, *helps: Mapping[str, str], check: bool = True
) -> argparse.ArgumentParser:
    """An argument parser with ``--version`` (and ``--check``); ``--help`` lists the
    settings in ``helps``."""
    p = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=settings_epilog(*helps) if helps else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    if check:
        p.add_argument("--check", action="store_true", help=CHECK_HELP)
    return p


async def reach_redis(settings: Settings) -> str:
    """Connect as the processes do, PING, and refuse the old key layout: what was reached
    (``Redis`` or ``Redis Cluster``), or a :class:`ConfigError` naming the variable."""
    from .connections import reachable_redis
    from .keys import Keys
    from .layout import refuse_old_layout
    from .streams import is_cluster

    redis = await reachable_redis(settings.redis_url, settings.redis_cluster)
    try:
        await refuse_old_layout(redis, Keys(settings.key_prefix, settings.shards))
        return "Redis Cluster" if is_cluster(redis) else "Redis"
    finally:
        await redis.aclose()


def run_check(prog: str, settings: Settings, agents: Sequence[Agent]) -> NoReturn:
    """``--check``, once the settings are read and the agents imported: reach Redis, then
    exit 0 with one line saying what was checked, or 2 with the problem."""
    from .connections import redacted

    try:
        reached = asyncio.run(reach_redis(settings))
    except ConfigError as exc:
        exit_on_config_error(exc)
    names = ", ".join(a.name for a in agents)
    print(
        f"{prog}: ok: settings valid, {reached} reached at {redacted(settings.redis_url)} "
        f"(KEY_PREFIX {settings.key_prefix}), agents imported: {names}",
        flush=True,
    )
    raise SystemExit(0)
