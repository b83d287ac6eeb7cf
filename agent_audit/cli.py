"""The ``agent-audit`` command: verify, export and keep the heads of the audit trail."""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import sys
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import TextIO

from redis.asyncio import Redis

from agent_core import cli
from agent_core.audit import Head, entries, read_heads, verify_shard
from agent_core.exceptions import ConfigError
from agent_core.keys import Keys
from agent_core.settings import HELP, Settings, exit_on_config_error

PROG = "agent-audit"
SETTINGS = ("REDIS_URL", "REDIS_CLUSTER", "KEY_PREFIX", "SHARDS")
COLUMNS = [
    "shard",
    "id",
    "time",
    "kind",
    "gate_id",
    "run_id",
    "call_id",
    "tool",
    "args_hash",
    "by",
    "at",
    "reason",
    "group",
    "to",
    "after_cancel",
    "prev",
]


def parse_day(text: str) -> datetime:
    """A date (``2026-12-01``, midnight UTC) or an ISO time (UTC unless it says otherwise)."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a date (2026-12-01) or an ISO time"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _stream_id(when: datetime | None, default: str) -> str:
    return default if when is None else f"{int(when.timestamp() * 1000)}-0"


def _parser() -> argparse.ArgumentParser:
    p = cli.parser(
        PROG,
        "Read the gateway's audit trail in Redis: verify its hash chains, export it, print "
        "its heads (to keep outside Redis). Configured by environment variables.",
        {name: HELP[name] for name in SETTINGS if name in HELP},
        check=False,
    )
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="check every shard's chain; exit 1 naming what broke")
    v.add_argument(
        "--heads",
        type=argparse.FileType("r"),
        help="a file `agent-audit heads` printed earlier: each head must still be there",
    )
    e = sub.add_parser("export", help="write the entries, oldest first")
    e.add_argument("--since", type=parse_day, help="from this date or time (UTC)")
    e.add_argument("--until", type=parse_day, help="before this date or time (UTC)")
    e.add_argument("--tool", default="", help="only this tool's entries")
    e.add_argument("--user", default="", help="only the entries by this user id")
    e.add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
    sub.add_parser("heads", help="print every shard's chain head, one JSON line each")
    return p


async def export_rows(
    redis: Redis,
    keys: Keys,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    tool: str = "",
    user: str = "",
) -> AsyncIterator[dict[str, str]]:
    """The entries to export, shard by shard, oldest first; ``until`` is excluded."""
    start, end = _stream_id(since, "-"), _stream_id(until, "+")
    if end != "+":
        end = "(" + end
    for shard in keys.all_shards():
        async for e in entries(redis, keys, shard, start=start, end=end):
            if (tool and e.get("tool") != tool) or (user and e.get("by") != user):
                continue
            row = e.as_dict()
            row["time"] = datetime.fromtimestamp(e.at, UTC).isoformat(timespec="milliseconds")
            yield row


async def _export(redis: Redis, keys: Keys, args: argparse.Namespace, out: TextIO) -> int:
    rows = export_rows(
        redis, keys, since=args.since, until=args.until, tool=args.tool, user=args.user
    )
    if args.format == "jsonl":
        async for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
        return 0
    writer = csv.DictWriter(out, [*COLUMNS, "extra"], extrasaction="ignore")
    writer.writeheader()
    async for row in rows:
        extra = {k: v for k, v in row.items() if k not in COLUMNS}
        writer.writerow({**row, "extra": json.dumps(extra) if extra else ""})
    return 0


def _kept_heads(f: TextIO) -> list[Head]:
    heads = []
    for n, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            heads.append(Head(int(d["shard"]), str(d["id"]), str(d["hash"])))
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"--heads {f.name}: line {n} is not a head") from None
    return heads


async def _verify(redis: Redis, keys: Keys, args: argparse.Namespace, out: TextIO) -> int:
    known = _kept_heads(args.heads) if args.heads else []
    checked, problems = 0, []
    for shard in keys.all_shards():
        found = await verify_shard(redis, keys, shard, known)
        checked += found.checked
        problems += found.problems
    for line in problems:
        print(f"{PROG}: BROKEN: {line}", file=sys.stderr)
    if problems:
        return 1
    print(f"{PROG}: ok: {checked} entries in {keys.shards} shards verified", file=out)
    return 0


async def _run(settings: Settings, args: argparse.Namespace, out: TextIO) -> int:
    from agent_core.connections import reachable_redis

    keys = Keys(settings.key_prefix, settings.shards)
    redis = await reachable_redis(settings.redis_url, settings.redis_cluster)
    try:
        if args.command == "verify":
            return await _verify(redis, keys, args, out)
        if args.command == "export":
            return await _export(redis, keys, args, out)
        for h in await read_heads(redis, keys):
            out.write(json.dumps({"shard": h.shard, "id": h.id, "hash": h.hash}) + "\n")
        return 0
    finally:
        await redis.aclose()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``agent-audit`` (``python -m agent_audit``)."""
    args = _parser().parse_args(argv)
    try:
        settings = Settings.from_env()
        code = asyncio.run(_run(settings, args, sys.stdout))
    except ConfigError as exc:
        exit_on_config_error(exc)
    sys.exit(code)
