"""``python -m agent_core.migrate_layout``: move a deployment's keys to the new key layout.

Reads REDIS_URL, KEY_PREFIX, SHARDS and REDIS_CLUSTER as ``web`` and ``worker`` do. Stop every
web and worker first: it refuses while workers are alive, and when the keys look like those of
another SHARDS (``--force`` goes on anyway). It never overwrites a key of the new layout: it
merges into it, or refuses (exit 1) naming each key it cannot merge. It prints what it moved,
shard by shard; run it again after a crash and it finishes; once done, running it again moves
nothing. ``--dry-run`` only counts (and refuses the same way). How it moves keys:
:mod:`agent_core.layout`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from . import layout
from .connections import reachable_redis, redacted
from .exceptions import ConfigError, InvalidState
from .keys import Keys
from .settings import Settings, exit_on_config_error
from .streams import is_cluster

PROGRESS_EVERY = 10_000  # keys between two progress lines


async def run(settings: Settings, *, force: bool = False, dry_run: bool = False) -> int:
    """Migrate (or count, ``dry_run``) and print what was done; the keys moved."""
    redis = await reachable_redis(settings.redis_url, settings.redis_cluster)
    try:
        keys = Keys(settings.key_prefix, settings.shards)
        old = layout.old_keys(keys)
        where = "Redis Cluster" if is_cluster(redis) else "one Redis"
        print(
            f"{'counting' if dry_run else 'moving'} the keys of KEY_PREFIX={keys.prefix} "
            f"(SHARDS={keys.shards}, {where} at {redacted(settings.redis_url)}) from the old "
            "layout to the new one",
            flush=True,
        )
        shown = 0

        async def progress(moved: int) -> None:
            nonlocal shown
            if moved - shown >= PROGRESS_EVERY:
                shown = moved
                print(f"  … {moved:,} keys moved", flush=True)

        report = await layout.migrate(
            redis, keys, force=force, dry_run=dry_run, checkpoint=progress
        )
        verb = "would move" if dry_run else "moved"
        for shard in sorted(report.moved):
            merged = report.merged[shard]
            print(
                f"shard {shard}: {old.tag(shard)} -> {keys.tag(shard)}: {report.moved[shard]:,} keys"
                + (f" ({merged:,} merged into keys the new layout had)" if merged else "")
            )
        if report.left:
            sample = ", ".join(sorted(report.left)[:3])
            print(
                f"left {len(report.left):,} keys of shards beyond SHARDS={keys.shards} as they "
                f"are (e.g. {sample}): was this deployment run with another SHARDS?"
            )
        if report.total:
            print(
                f"{verb} {report.total:,} keys in {len(report.moved)} shards "
                f"({report.seconds:.1f} s)" + ("" if dry_run else "; start web and workers now")
            )
        else:
            print(f"nothing to move: no key of KEY_PREFIX={keys.prefix} is in the old layout")
        return report.total
    finally:
        await redis.aclose()


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m agent_core.migrate_layout``."""
    parser = argparse.ArgumentParser(
        prog="python -m agent_core.migrate_layout",
        description="Move a deployment's Redis keys from the old layout ({prefix:N} hash "
        "tags) to the new one. Stop every web and worker first.",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="go on while workers are alive, or when the keys look like another SHARDS's",
    )
    parser.add_argument("--dry-run", action="store_true", help="count the keys, move none")
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env()
        asyncio.run(run(settings, force=args.force, dry_run=args.dry_run))
    except ConfigError as exc:
        exit_on_config_error(exc)
    except InvalidState as exc:
        print(f"migrate_layout: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
