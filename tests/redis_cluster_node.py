"""The parts of :mod:`tests.redis_cluster`: one node's process (:class:`ClusterNode`), a
control connection to it, what ``CLUSTER NODES`` says of each node, and the key helpers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot as _key_slot
from redis.retry import Retry

from tests.redis_server import free_port

if TYPE_CHECKING:
    from tests.redis_cluster import ClusterServer

CLUSTER_SLOTS = 16384
_RESERVED_PORTS = frozenset({6379, 16379})  # the machine's own Redis: never ours


def key_slot(key: str | bytes) -> int:
    """The cluster hash slot of ``key`` (hash tags ``{...}`` respected), as Redis computes it."""
    return int(_key_slot(key.encode() if isinstance(key, str) else key))


def keys_in_slots(slots: Iterable[int], count: int, prefix: str = "k") -> list[str]:
    """``count`` distinct keys ``{prefix<n>}:v`` whose hash slots are all in ``slots``."""
    wanted = set(slots)
    if not wanted:
        raise ValueError("no slots given")
    keys: list[str] = []
    n = 0
    while len(keys) < count:
        key = f"{{{prefix}{n}}}:v"
        if key_slot(key) in wanted:
            keys.append(key)
        n += 1
        if n > 10_000_000:
            raise RuntimeError(f"could not find {count} keys in slots {sorted(wanted)[:5]}...")
    return keys


def free_cluster_port(exclude: set[int]) -> int:
    for _ in range(50):
        port = free_port()
        if port not in _RESERVED_PORTS and port not in exclude:
            return port
    raise RuntimeError("no free port found")


# --------------------------------------------------------------------------- views
@dataclass(frozen=True)
class ClusterNodeInfo:
    """One line of ``CLUSTER NODES`` as one node sees it."""

    id: str
    host: str
    port: int
    bus_port: int
    flags: frozenset[str]
    master_id: str | None
    link_state: str
    slots: frozenset[int]

    @property
    def slot_ranges(self) -> list[tuple[int, int]]:
        """The slots as sorted inclusive ranges, e.g. ``[(0, 5460)]``."""
        ranges: list[tuple[int, int]] = []
        for slot in sorted(self.slots):
            if ranges and ranges[-1][1] == slot - 1:
                ranges[-1] = (ranges[-1][0], slot)
            else:
                ranges.append((slot, slot))
        return ranges

    def __repr__(self) -> str:
        return (
            f"ClusterNodeInfo(port={self.port}, id={self.id[:8]}, flags={sorted(self.flags)},"
            f" master_id={(self.master_id or '-')[:8]}, slots={self.slot_ranges})"
        )

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def is_replica(self) -> bool:
        return "slave" in self.flags

    @property
    def is_myself(self) -> bool:
        return "myself" in self.flags

    @property
    def failing(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "handshake", "noaddr"})

    @classmethod
    def parse(cls, line: str) -> ClusterNodeInfo:
        fields = line.split()
        node_id, address, flags, master = fields[:4]
        link_state = fields[7]
        host_port, _, rest = address.partition("@")
        host, _, port = host_port.rpartition(":")
        bus_port = rest.split(",", 1)[0]
        slots: set[int] = set()
        for item in fields[8:]:
            if item.startswith("["):  # [slot->-id] / [slot-<-id]: migration in progress
                continue
            first, _, last = item.partition("-")
            slots.update(range(int(first), int(last or first) + 1))
        return cls(
            id=node_id,
            host=host,
            port=int(port),
            bus_port=int(bus_port) if bus_port else 0,
            flags=frozenset(flags.split(",")),
            master_id=None if master == "-" else master,
            link_state=link_state,
            slots=frozenset(slots),
        )


@dataclass(frozen=True)
class Failover:
    """What :meth:`ClusterServer.failover_master` saw."""

    old_port: int
    new_port: int
    promoted_after: float  # seconds from SIGKILL until the replica called itself master
    seconds: float  # seconds from SIGKILL until every surviving node was ok and agreed


@dataclass(frozen=True)
class Migration:
    """What :meth:`ClusterServer.migrate_slots` did."""

    slots: tuple[int, ...]
    to_port: int
    keys_moved: int
    seconds: float


# --------------------------------------------------------------------------- one node
class ClusterNode:
    """One ``redis-server --cluster-enabled yes`` process in its own directory."""

    def __init__(self, cluster: ClusterServer, port: int, bus_port: int, directory: Path) -> None:
        self.cluster = cluster
        self.port = port
        self.bus_port = bus_port
        self.dir = directory
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def logfile(self) -> Path:
        return self.dir / "redis.log"

    @property
    def nodes_conf(self) -> Path:
        return self.dir / f"nodes-{self.port}.conf"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.logfile.read_text(errors="replace")
        except OSError:
            return "(no log file)"
        return "\n".join(text.splitlines()[-lines:])

    def args(self) -> list[str]:
        c = self.cluster
        return [
            c.executable,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--protected-mode", "no",
            "--daemonize", "no",
            "--dir", str(self.dir),
            "--logfile", str(self.logfile),
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.nodes_conf),
            "--cluster-node-timeout", str(c.node_timeout_ms),
            "--cluster-port", str(self.bus_port),
            "--cluster-announce-ip", "127.0.0.1",
            # A replica may always take over, however long its link was down (tests pause
            # and kill nodes on purpose), and never migrates to another master by itself.
            "--cluster-replica-validity-factor", "0",
            "--cluster-allow-replica-migration", "no",
            # Full syncs start at once (the default waits 5 s for more replicas) ...
            "--repl-diskless-sync-delay", "0",
            # ... and SIGTERM does not wait 10 s for lagging replicas of a dying cluster.
            "--shutdown-timeout", "1",
        ]  # fmt: skip

    def spawn(self, timeout: float) -> None:
        if self.running:
            raise RuntimeError(f"node {self.port} already running (pid {self.pid})")
        self.paused = False
        self.proc = subprocess.Popen(
            self.args(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            cwd=self.dir,
        )
        try:
            self._wait_ping(timeout)
        except BaseException:
            self.terminate(signal.SIGKILL, timeout=5.0)
            raise

    def _wait_ping(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        last: str = "nothing"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"redis-server on port {self.port} exited with code"
                    f" {self.proc.returncode} at start; log tail:\n{self.log_tail()}"
                )
            try:
                with control(self.port, timeout=0.5) as conn:
                    if conn.ping():
                        return
            except redis.RedisError as exc:  # not listening yet, or loading its AOF
                last = repr(exc)
            time.sleep(0.02)
        raise AssertionError(
            f"redis-server on port {self.port} did not answer PING within {timeout} s"
            f" (last: {last}); log tail:\n{self.log_tail()}"
        )

    def send_signal(self, signum: signal.Signals) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"node {self.port} is not running")
        os.kill(self.proc.pid, signum)  # only ever the PID we started

    def terminate(self, signum: signal.Signals, timeout: float) -> None:
        """Send ``signum`` (resuming a paused node first), wait, SIGKILL on timeout, reap."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            if self.paused and signum != signal.SIGKILL:
                os.kill(proc.pid, signal.SIGCONT)  # a stopped process acts on SIGTERM later
            os.kill(proc.pid, signum)
        self.reap(timeout)

    def reap(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the process to end, then SIGKILL it; reap."""
        proc = self.proc
        if proc is not None:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.proc = None
        self.paused = False


@contextlib.contextmanager
def control(port: int, timeout: float = 2.0) -> Iterator[redis.Redis]:
    """A plain (non-cluster) synchronous connection to one node, closed afterwards."""
    conn = redis.Redis(
        host="127.0.0.1",
        port=port,
        decode_responses=True,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),  # a dead or paused node must fail fast
    )
    try:
        yield conn
    finally:
        conn.close()
