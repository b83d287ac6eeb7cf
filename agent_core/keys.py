"""Every Redis key name the project uses, built in one place.

Runs are spread over ``shards`` (default 16, fixed for a deployment: SHARDS). Every key of a
run carries its shard's hash tag (``{agw:3:04mz}:run:…``), and so do that shard's streams and
indexes (jobs, events, deadlines, active and finished runs): every multi-key Lua script
touches one slot, and on Redis Cluster the shards spread over the nodes. Run ids and gate ids
encode their shard in their first two characters (base 36), so a click finds its slot
without a lookup. A few keys belong to no run (a bot's locks, request de-duplication): they
carry the deployment's own tag ``{agw}``.

Balanced tags: the 16384 cluster slots are cut into ``shards`` equal slices, and shard ``s``'s
tag is ``{prefix:s:xxxx}`` with the 4-character suffix that makes it hash to the first slot
of slice ``s``, ``ceil(16384 * s / shards)``. So an even split of the slots over M masters
(what ``redis-cli --cluster create`` makes) gives each master floor or ceil(shards / M) shards,
whatever the prefix (the old tags, ``{prefix:s}``, fell where their CRC16 put them: 4 / 5 /
7 of 16 over 3 masters for ``agw``). The old layout is ``Keys(..., legacy=True)``: only
:mod:`agent_core.layout` uses it, to find a deployment's keys left there and move them
(``python -m agent_core.migrate_layout``).

No key name is ever built inside Lua: scripts receive every key in KEYS.
"""

from __future__ import annotations

import binascii
import functools
import math
import secrets
import zlib

DEFAULT_PREFIX = "agw"
DEFAULT_SHARDS = 16
MAX_SHARDS = 36 * 36  # two base-36 characters in every id
SLOTS = 16384  # Redis Cluster's hash slots

_B36 = "0123456789abcdefghijklmnopqrstuvwxyz"
_RUN_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"


def encode_shard(shard: int) -> str:
    return _B36[shard // 36] + _B36[shard % 36]


# Every two-character code (any case) and its shard: a look-up, as it runs for every key a
# script names.
_SHARD_CODES: dict[str, int] = {
    a + b: hi * 36 + lo
    for hi, h in enumerate(_B36)
    for lo, low in enumerate(_B36)
    for a in dict.fromkeys((h, h.upper()))
    for b in dict.fromkeys((low, low.upper()))
}


def decode_shard(text: str) -> int | None:
    """The shard two base-36 characters stand for (any case), or None."""
    return _SHARD_CODES.get(text)


def key_slot(tag: str) -> int:
    """The cluster slot of a hash tag's content (``agw:3:04mz`` for ``{agw:3:04mz}``): CRC16
    (XMODEM) mod 16384, as Redis computes it."""
    return binascii.crc_hqx(tag.encode(), 0) % SLOTS


def first_slot(shard: int, shards: int) -> int:
    """The first slot of a shard's slice: slice ``s`` holds the slots ``x`` with
    ``x * shards // 16384 == s``."""
    return math.ceil(SLOTS * shard / shards)


@functools.cache
def _suffixes() -> dict[int, str]:
    """Every 14-bit value the CRC16 of a 3-character base-36 string can have, with the first
    such string (in base-36 order): 16287 of the 16384 values."""
    table: dict[int, str] = {}
    for a in _B36:
        for b in _B36:
            for c in _B36:
                table.setdefault(binascii.crc_hqx((a + b + c).encode(), 0) % SLOTS, a + b + c)
    return table


def balanced_suffix(head: str, slot: int) -> str:
    """The 4 base-36 characters that make ``head + suffix`` hash to ``slot``.

    CRC16 with a zero start and no final XOR is linear: the CRC of ``h + m`` (``m`` of 3
    bytes) is ``crc(m) ^ crc(b"\\0\\0\\0", start=crc(h))``. So for each first character
    (in base-36 order) the 3 others are one table lookup, instead of a search through about
    16384 candidates per shard (1296 shards stay a few milliseconds).
    """
    for first in _B36:
        state = binascii.crc_hqx((head + first).encode(), 0)
        need = (binascii.crc_hqx(b"\0\0\0", state) ^ slot) % SLOTS
        rest = _suffixes().get(need)
        if rest is not None:
            return first + rest
    raise AssertionError(f"no suffix hashes {head!r} to slot {slot}")  # 36 misses: never seen


class Keys:
    """Key names under one prefix (one per deployment; tests use their own)."""

    def __init__(
        self, prefix: str = DEFAULT_PREFIX, shards: int = DEFAULT_SHARDS, *, legacy: bool = False
    ) -> None:
        """``legacy``: the old layout's tags (``{agw:3}``), for moving a deployment's keys."""
        if not prefix or any(c in prefix for c in "{}: "):
            raise ValueError(f"invalid key prefix {prefix!r}")
        if not 1 <= shards <= MAX_SHARDS:
            raise ValueError(f"shards must be 1 to {MAX_SHARDS}")
        self.prefix = prefix
        self.shards = shards
        self.legacy = legacy
        self._global = "{" + prefix + "}"
        self._tags: dict[int, str] = {}

    # --- shards and ids ---------------------------------------------------------------
    def tag(self, shard: int) -> str:
        """The hash tag of a shard, e.g. ``{agw:3:04mz}`` (``{agw:3}`` in the legacy layout),
        computed once per shard."""
        tag = self._tags.get(shard)
        if tag is None:
            if not 0 <= shard < self.shards:
                raise ValueError(f"no shard {shard} (SHARDS={self.shards})")
            head = f"{self.prefix}:{shard}"
            if not self.legacy:
                head += ":" + balanced_suffix(head + ":", first_slot(shard, self.shards))
            tag = self._tags[shard] = "{" + head + "}"
        return tag

    def slot(self, shard: int) -> int:
        """The cluster slot of a shard's keys."""
        return key_slot(self.tag(shard)[1:-1])

    def all_shards(self) -> range:
        return range(self.shards)

    def shard_of(self, ident: str) -> int:
        """The shard of a run id (``r-XX…``) or a gate id (``XX…``); ValueError if it
        encodes none of this deployment's shards."""
        code = ident[2:4] if ident.startswith("r-") else ident[:2]
        shard = decode_shard(code)
        if shard is None or shard >= self.shards:
            raise ValueError(f"{ident[:40]!r} belongs to no shard of this deployment")
        return shard

    def owns(self, ident: str) -> bool:
        """Whether an id encodes one of this deployment's shards."""
        try:
            self.shard_of(ident)
        except ValueError:
            return False
        return True

    def shard_for(self, key: str) -> int:
        """A stable shard for a string (an idempotency key): the same key, the same shard."""
        return zlib.crc32(key.encode()) % self.shards

    def new_run_id(self, shard: int | None = None) -> str:
        """``r-`` + the shard (2 characters) + 10 random base-36 characters: short enough to
        type, e.g. ``r-0b7k2m9x4qaz``. A random shard when none is given."""
        s = secrets.randbelow(self.shards) if shard is None else shard
        return "r-" + encode_shard(s) + "".join(secrets.choice(_RUN_ALPHABET) for _ in range(10))

    def new_gate_id(self, shard: int) -> str:
        """The shard (2 characters) + 22 URL-safe random characters (132 random bits):
        unguessable, safe in a button value."""
        return encode_shard(shard) + secrets.token_urlsafe(17)[:22]

    # --- runs -------------------------------------------------------------------------
    def _run_base(self, run_id: str) -> str:
        return f"{self.tag(self.shard_of(run_id))}:run:{run_id}"

    def run(self, run_id: str) -> str:
        """Hash: the run's fields (status, turn, phase, pending, …)."""
        return self._run_base(run_id)

    def history(self, run_id: str) -> str:
        """List: the run's chat messages as JSON, append-only."""
        return f"{self._run_base(run_id)}:msgs"

    def turn(self, run_id: str, turn: int) -> str:
        """Hash: the tool calls of one model turn, their states and results."""
        return f"{self._run_base(run_id)}:turn:{turn}"

    def run_gates(self, run_id: str) -> str:
        """Set: every gate id the run ever opened."""
        return f"{self._run_base(run_id)}:gates"

    def run_inbox(self, run_id: str) -> str:
        """List: messages sent to the run while it worked, for its next model turn."""
        return f"{self._run_base(run_id)}:inbox"

    def authors(self, run_id: str) -> str:
        """Hash: who said each user message of the history (its index → user id); kept out
        of the messages, which go to the model as they are stored."""
        return f"{self._run_base(run_id)}:authors"

    def children(self, run_id: str) -> str:
        """Set: the run's child runs (sub-agents), which live in its shard."""
        return f"{self._run_base(run_id)}:children"

    def start_key(self, key: str) -> str:
        """String: the run an idempotency key (e.g. a Slack trigger id) already started. It
        lives in :meth:`shard_for` ``(key)``, the shard the run is started in."""
        return self.seen_key(key, self.shard_for(key))

    def seen_key(self, key: str, shard: int) -> str:
        """String: what an idempotency or dedupe key already did in ``shard``: the run it
        started (:meth:`start_key`), or the message it added to a run of that shard
        (``Gateway.continue_run``). One name for both, so a chat message that started a run
        is also seen when it comes again as a reply to that run."""
        return f"{self.tag(shard)}:start:{key}"

    def active(self, shard: int) -> str:
        """Sorted set: a shard's runs not finished yet, scored by start time."""
        return f"{self.tag(shard)}:active"

    def user_runs(self, user: str, shard: int) -> str:
        """Sorted set: run ids a user started in a shard, scored by start time."""
        return f"{self.tag(shard)}:user:{user}:runs"

    def finished(self, shard: int) -> str:
        """Sorted set: a shard's finished run ids scored by when they finished (retention)."""
        return f"{self.tag(shard)}:finished"

    # --- gates ------------------------------------------------------------------------
    def gate(self, gate_id: str) -> str:
        """Hash: one approval gate."""
        return f"{self.tag(self.shard_of(gate_id))}:gate:{gate_id}"

    def deadlines(self, shard: int) -> str:
        """Sorted set: a shard's pending gate ids scored by their deadline (unix seconds)."""
        return f"{self.tag(shard)}:deadlines"

    # --- streams ----------------------------------------------------------------------
    def jobs(self, shard: int) -> str:
        """Stream: a shard's start/resume jobs for the workers' consumer group."""
        return f"{self.tag(shard)}:jobs"

    def dead_jobs(self, shard: int) -> str:
        """Stream: jobs that kept failing (dead letters)."""
        return f"{self.tag(shard)}:jobs:dead"

    def events(self, shard: int) -> str:
        """Stream: a shard's run and gate events for front ends (the Slack bot)."""
        return f"{self.tag(shard)}:events"

    def dead_events(self, shard: int) -> str:
        """Stream: events a consumer group could not handle."""
        return f"{self.tag(shard)}:events:dead"

    def shard_of_stream(self, stream: str) -> int:
        """The shard a stream key (jobs, events and their dead letters) belongs to."""
        head = f"{{{self.prefix}:"
        number = stream[len(head) : stream.find("}")].split(":")[0]
        if stream.startswith(head) and number.isascii() and number.isdigit():
            shard = int(number)
            if shard < self.shards and stream.startswith(self.tag(shard)):
                return shard
        raise ValueError(f"{stream!r} is not a stream of this deployment")

    # --- extensions -------------------------------------------------------------------
    def ext(self, namespace: str, ident: str, shard: int | None = None) -> str:
        """A key owned by a front end: in ``shard`` (the card of a gate, beside the gate), or
        under the deployment's own tag (a lock, request de-duplication)."""
        tag = self._global if shard is None else self.tag(shard)
        return f"{tag}:ext:{namespace}:{ident}"

    # --- reminders and escalation (agent_core.nudges) ----------------------------------
    def nudges(self, shard: int) -> str:
        """Sorted set: a shard's pending reminders and escalations, ``remind:<gate id>`` and
        ``escalate:<gate id>``, scored by when they are due (unix seconds)."""
        return f"{self.tag(shard)}:nudges"

    # --- the audit trail (agent_core.audit) ---------------------------------------------
    def audit(self, shard: int) -> str:
        """Stream: a shard's audit trail, every gate event chained by hashes; kept for
        AUDIT_RETENTION, whatever happens to the runs."""
        return f"{self.tag(shard)}:audit"

    def audit_head(self, shard: int) -> str:
        """Hash: the audit trail's head (``id`` and ``hash`` of its last entry) and, once
        trimmed, its ``anchor`` (the ``prev`` of the first entry kept)."""
        return f"{self.tag(shard)}:audit:head"

    # --- grants: "allow for this thread" (agent_core.grants) ---------------------------
    def grants(self, run_id: str) -> str:
        """Hash: the grants of the thread whose top run is ``run_id``, grant id → its record
        (JSON); deleted with the run."""
        return f"{self._run_base(run_id)}:grants"

    def live_grants(self, shard: int) -> str:
        """Sorted set: a shard's unrevoked grant ids scored by when they expire (unix
        seconds), for listing them (``/agent grants``)."""
        return f"{self.tag(shard)}:grants"
