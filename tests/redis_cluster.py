"""A private Redis Cluster for tests: real ``redis-server`` processes, never a fake.

:class:`ClusterServer` starts ``masters`` masters and ``replicas_per_master`` replicas each
(3 + 3 by default) on free ports of 127.0.0.1, every node in a directory of its own with an
append-only file (``appendfsync always``) and its own ``nodes.conf``. It joins them with
``redis-cli --cluster create`` and waits until the cluster is healthy: ``cluster_state:ok``
on every node, every node agreeing on who serves which slot, every replica's link up.

Tests can then break it on purpose, always with bounded waits:

* :meth:`ClusterServer.kill` (SIGKILL), :meth:`ClusterServer.pause` /
  :meth:`ClusterServer.resume` (SIGSTOP / SIGCONT);
* :meth:`ClusterServer.failover_master`: kill a master and wait until a replica of it is
  promoted and the surviving nodes agree the cluster is ok again;
* :meth:`ClusterServer.restart`: start a killed node again from its own AOF and
  ``nodes.conf``; a master that was failed over rejoins as a replica of its successor;
* :meth:`ClusterServer.migrate_slots` and the step-by-step :class:`SlotMigration`: the
  ``CLUSTER SETSLOT IMPORTING/MIGRATING``, ``GETKEYSINSLOT`` + ``MIGRATE ... KEYS``,
  ``SETSLOT NODE`` resharding, so a test can act between its steps.

Every call is synchronous (it sleeps while it waits): from an asyncio test, run the long ones
in a thread (``await asyncio.to_thread(cluster.failover_master, port)``) so the event loop
keeps serving the clients under test. Only the PIDs it started are ever signalled.

Fixtures: ``cluster_server`` starts one cluster per test module; ``clean_cluster`` heals and
empties it before a test; ``cluster_client`` is redis-py's asyncio ``RedisCluster`` on it.
Make them visible with ``pytest_plugins = ["tests.redis_cluster"]`` in ``tests/conftest.py``,
or per test module with ``cluster_server = redis_cluster.cluster_server`` (and so on; not
``pytest_plugins`` in a test module that imports this one: pytest then warns that it cannot
rewrite its asserts, an error under ``filterwarnings = error``). Or, without pytest:
``with ClusterServer() as cluster: ...``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
import redis
from redis.asyncio.cluster import RedisCluster as RedisClusterClient

from tests.redis_cluster_node import (
    CLUSTER_SLOTS,
    ClusterNode,
    ClusterNodeInfo,
    Failover,
    Migration,
    control,
    free_cluster_port,
    key_slot,
    keys_in_slots,
)

__all__ = [
    "CLUSTER_SLOTS",
    "ClusterNodeInfo",
    "ClusterServer",
    "Failover",
    "Migration",
    "SlotMigration",
    "clean_cluster",
    "cluster_client",
    "cluster_server",
    "key_slot",
    "keys_in_slots",
]

_live: weakref.WeakSet[ClusterServer] = weakref.WeakSet()


# --------------------------------------------------------------------------- the cluster
class ClusterServer:
    """A Redis Cluster of ``redis-server`` processes on 127.0.0.1 (see the module docstring).

    Ports identify nodes everywhere in this API. Roles change (a failover turns a replica
    into a master), so :meth:`masters`, :meth:`replicas` and :meth:`node_for_slot` always ask
    the live cluster.
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas_per_master: int = 1,
        node_timeout_ms: int = 1000,
        executable: str = "redis-server",
        cli: str = "redis-cli",
        startup_timeout: float = 30.0,
        directory: Path | None = None,
    ) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self.n_masters = masters
        self.replicas_per_master = replicas_per_master
        self.node_timeout_ms = node_timeout_ms
        self.executable = executable
        self.cli = cli
        self.startup_timeout = startup_timeout
        self._own_dir = directory is None
        self.dir = (
            Path(tempfile.mkdtemp(prefix="redis-cluster-")) if directory is None else directory
        )
        self._nodes: dict[int, ClusterNode] = {}
        self._ids: dict[int, str] = {}  # port -> node id (stable across restarts)

    # ------------------------------------------------------------------ addresses
    @property
    def ports(self) -> list[int]:
        """Every node's port, in start order (the first ``masters`` started as masters)."""
        return list(self._nodes)

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every node, for ``ClusterNode(host, port)`` lists."""
        return [("127.0.0.1", port) for port in self._nodes]

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<a live master>/0`` for ``RedisCluster.from_url``."""
        return f"redis://127.0.0.1:{self.masters()[0]}/0"

    def pid(self, port: int) -> int | None:
        return self._node(port).pid

    def pids(self) -> list[int]:
        """PIDs of the processes it started that are still running."""
        return [n.pid for n in self._nodes.values() if n.running and n.pid is not None]

    def running(self, port: int) -> bool:
        return self._node(port).running

    def node_id(self, port: int) -> str:
        if port not in self._ids:
            with control(port) as conn:
                self._ids[port] = str(conn.execute_command("CLUSTER", "MYID"))
        return self._ids[port]

    def port_of(self, node_id: str) -> int:
        for port in self._nodes:
            if self.node_id(port) == node_id:
                return port
        raise KeyError(node_id)

    def _node(self, port: int) -> ClusterNode:
        try:
            return self._nodes[port]
        except KeyError:
            raise KeyError(f"port {port} is not a node of this cluster") from None

    def _live_ports(self) -> list[int]:
        return [p for p, n in self._nodes.items() if n.running and not n.paused]

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ClusterServer:
        """Start every node, join them with ``redis-cli --cluster create``, wait until healthy."""
        if self._nodes:
            raise RuntimeError("cluster already started")
        for tool in (self.executable, self.cli):
            if shutil.which(tool) is None:
                raise RuntimeError(
                    f"{tool} is not installed: run `sudo apt-get install redis-server"
                    " redis-tools` (Debian/Ubuntu) or `brew install redis`"
                )
        _live.add(self)
        try:
            total = self.n_masters * (1 + self.replicas_per_master)
            used: set[int] = set()
            for index in range(total):
                self._start_new_node(index, used)
            self._create()
            self.wait_healthy(self.startup_timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _start_new_node(self, index: int, used: set[int]) -> None:
        # A free port can be taken between the probe and redis' bind: try a few.
        for _ in range(5):
            port = free_cluster_port(used)
            bus_port = free_cluster_port(used | {port})
            directory = self.dir / f"node-{index}"
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            node = ClusterNode(self, port, bus_port, directory)
            try:
                node.spawn(self.startup_timeout)
            except RuntimeError:
                if "Address already in use" not in node.log_tail():
                    raise
                continue
            used.update((port, bus_port))
            self._nodes[port] = node
            self.node_id(port)
            return
        raise RuntimeError("could not start a node on a free port after 5 tries")

    def _create(self) -> None:
        args = [
            self.cli,
            "--cluster", "create",
            *(f"127.0.0.1:{port}" for port in self._nodes),
            "--cluster-replicas", str(self.replicas_per_master),
            "--cluster-yes",
        ]  # fmt: skip
        try:
            done = subprocess.run(
                args,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self.startup_timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raw: str | bytes = exc.stdout or b""  # bytes, even with text=True
            output = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
            raise AssertionError(
                f"redis-cli --cluster create took over {self.startup_timeout} s:\n{output}"
                f"\n{self.log_tails()}"
            ) from None
        if done.returncode != 0 or "[OK] All 16384 slots covered" not in done.stdout:
            raise AssertionError(
                f"redis-cli --cluster create failed ({done.returncode}):\n{done.stdout}\n"
                f"{done.stderr}\n{self.log_tails()}"
            )

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM every node (SIGCONT first if paused), wait, SIGKILL the leftovers."""
        nodes = [n for n in self._nodes.values() if n.proc is not None]
        for node in nodes:  # all at once, then wait for all: they shut down in parallel
            proc = node.proc
            if proc is not None and proc.poll() is None:
                if node.paused:
                    os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for node in nodes:
            node.reap(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Stop every node and remove the directories (when this object made them)."""
        self.stop()
        _live.discard(self)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ClusterServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ClusterServer(ports={self.ports}, dir={str(self.dir)!r})"

    # ------------------------------------------------------------------ introspection
    def command(self, port: int, *args: Any, timeout: float = 2.0) -> Any:
        """Run one command on one node over a plain connection (no redirections)."""
        with control(port, timeout) as conn:
            return conn.execute_command(*args)

    def cluster_nodes(self, port: int | None = None) -> list[ClusterNodeInfo]:
        """``CLUSTER NODES`` as node ``port`` (default: any live node) sees it."""
        port = self._some_live_port() if port is None else port
        text = self.command(port, "CLUSTER", "NODES")
        return [ClusterNodeInfo.parse(line) for line in str(text).splitlines() if line.strip()]

    def cluster_info(self, port: int) -> dict[str, str]:
        text = str(self.command(port, "CLUSTER", "INFO"))
        return dict(
            line.split(":", 1) for line in text.splitlines() if ":" in line and line.strip()
        )

    def _some_live_port(self, exclude: Iterable[int] = ()) -> int:
        excluded = set(exclude)
        for port in self._live_ports():
            if port not in excluded:
                return port
        raise RuntimeError("no live node to ask")

    def masters(self, *, view_from: int | None = None) -> list[int]:
        """Ports of the masters serving slots (as a live node sees it), in slot order."""
        nodes = self.cluster_nodes(view_from)
        serving = [n for n in nodes if n.is_master and n.slots and not n.failing]
        return [n.port for n in sorted(serving, key=lambda n: min(n.slots))]

    def replicas(
        self, master_port: int | None = None, *, view_from: int | None = None
    ) -> list[int]:
        """Ports of the healthy replicas (of ``master_port``, when given)."""
        nodes = self.cluster_nodes(view_from)
        master_id = None if master_port is None else self.node_id(master_port)
        return sorted(
            n.port
            for n in nodes
            if n.is_replica and not n.failing and (master_id is None or n.master_id == master_id)
        )

    def node_for_slot(self, slot: int, *, view_from: int | None = None) -> int:
        """The port of the master serving ``slot``."""
        if not 0 <= slot < CLUSTER_SLOTS:
            raise ValueError(f"slot {slot} out of range")
        for node in self.cluster_nodes(view_from):
            if node.is_master and slot in node.slots:
                return node.port
        raise LookupError(f"slot {slot} is not served by any master")

    def slots_of(self, port: int, *, view_from: int | None = None) -> list[int]:
        """The slots master ``port`` serves, sorted."""
        node_id = self.node_id(port)
        for node in self.cluster_nodes(view_from):
            if node.id == node_id:
                return sorted(node.slots)
        return []

    def master_of_key(self, key: str | bytes) -> int:
        """The port of the master serving ``key``'s slot."""
        return self.node_for_slot(key_slot(key))

    def log_tails(self, lines: int = 15) -> str:
        parts = []
        for port, node in self._nodes.items():
            state = "paused" if node.paused else "running" if node.running else "down"
            parts.append(f"--- node {port} ({state}, pid {node.pid}):\n{node.log_tail(lines)}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ health
    def health_problems(self, rejoining: Iterable[int] = ()) -> list[str]:
        """What keeps the live nodes from being a healthy cluster (empty when healthy).

        Healthy: every live node says ``cluster_state:ok``; every live node's view lists the
        same owner for all 16384 slots, each owner live (not killed nor paused), and every live
        node as a replica or a master serving slots, none failing; every live replica's link
        to its master is up and not syncing. Each node of ``rejoining`` (just restarted) must
        moreover see itself as a replica or a master serving slots: a failed-over master comes
        back as an empty master until the cluster tells it to follow its successor.
        """
        restarted = set(rejoining)
        problems: list[str] = []
        live = self._live_ports()
        live_set = set(live)
        live_ids = {self._ids[port] for port in live if port in self._ids}
        owners: dict[int, dict[int, str]] = {}
        for port in live:
            try:
                problems.extend(self._node_problems(port, live_set, port in restarted, owners))
            except redis.RedisError as exc:
                problems.append(f"{port}: {exc!r}")
        maps = list(owners.values())
        if maps and set(maps[0].values()) - live_ids:
            problems.append("slots served by a node that is down or paused")
        maps = list(owners.values())
        if maps and any(m != maps[0] for m in maps[1:]):
            problems.append("live nodes disagree about slot owners")
        return problems

    def _node_problems(
        self, port: int, live: set[int], restarted: bool, owners: dict[int, dict[int, str]]
    ) -> list[str]:
        problems: list[str] = []
        info = self.cluster_info(port)
        view = self.cluster_nodes(port)
        if info.get("cluster_state") != "ok":
            problems.append(f"{port}: cluster_state:{info.get('cluster_state')}")
        slot_owner: dict[int, str] = {}
        for node in view:
            if node.port in live and node.failing:
                problems.append(f"{port} sees {node.port} as {sorted(node.flags)}")
            elif node.port in live and not node.is_replica and not node.slots:
                # Gossip has not told this node yet that a new replica follows its master
                # (just after ``--cluster create`` or a rejoin).
                problems.append(f"{port} sees {node.port} as an empty master")
            if node.is_master:
                for slot in node.slots:
                    slot_owner[slot] = node.id
        if len(slot_owner) != CLUSTER_SLOTS:
            problems.append(f"{port}: {CLUSTER_SLOTS - len(slot_owner)} slots unassigned")
        owners[port] = slot_owner
        me = next((n for n in view if n.is_myself), None)
        if restarted and (me is None or (me.is_master and not me.slots)):
            problems.append(f"{port}: an empty master, not a replica yet")
        if me is not None and me.is_replica:
            repl = self.command(port, "INFO", "replication")
            if repl.get("master_link_status") != "up":
                problems.append(f"{port}: master_link_status:{repl.get('master_link_status')}")
            elif repl.get("master_sync_in_progress") not in (0, "0", None):
                problems.append(f"{port}: sync in progress")
        return problems

    def wait_healthy(self, timeout: float = 20.0) -> float:
        """Wait until :meth:`health_problems` is empty; the seconds it took."""
        return self._wait(self.health_problems, timeout, "the cluster to be healthy")

    def _wait(self, problems: Callable[[], list[str]], timeout: float, what: str) -> float:
        start = time.monotonic()
        deadline = start + timeout
        last: list[str] = []
        while True:
            last = problems()
            if not last:
                return time.monotonic() - start
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"timed out after {timeout} s waiting for {what}: {last[:10]}\n"
                    f"{self.log_tails()}"
                )
            time.sleep(0.05)

    # ------------------------------------------------------------------ faults
    def kill(self, port: int) -> None:
        """SIGKILL the node (as a crash would) and reap it."""
        node = self._node(port)
        if not node.running:
            raise RuntimeError(f"node {port} is not running")
        node.terminate(signal.SIGKILL, timeout=5.0)

    def pause(self, port: int) -> None:
        """SIGSTOP the node: it stops answering but keeps its sockets open."""
        node = self._node(port)
        node.send_signal(signal.SIGSTOP)
        node.paused = True

    def resume(self, port: int) -> None:
        """SIGCONT a paused node."""
        node = self._node(port)
        node.send_signal(signal.SIGCONT)
        node.paused = False

    def failover_master(self, port: int, timeout: float = 20.0) -> Failover:
        """SIGKILL master ``port``; wait until a replica of it serves its slots everywhere.

        Returns the promoted replica's port and the times from the kill until that replica
        called itself master and until every surviving node was ok and agreed on it.
        """
        view = self.cluster_nodes(self._some_live_port(exclude=[port]))
        old_id = self.node_id(port)
        old = next((n for n in view if n.id == old_id), None)
        if old is None or not old.is_master or not old.slots:
            raise ValueError(f"node {port} is not a master serving slots")
        candidates = [n.port for n in view if n.master_id == old_id and n.port in self._nodes]
        if not candidates:
            raise ValueError(f"master {port} has no replica to fail over to")
        slots = old.slots
        start = time.monotonic()
        self.kill(port)
        promoted: list[int] = []

        def not_promoted() -> list[str]:
            for candidate in candidates:
                if not self._node(candidate).running:
                    continue
                try:
                    me = next(n for n in self.cluster_nodes(candidate) if n.is_myself)
                except redis.RedisError:
                    continue
                if me.is_master and slots <= me.slots:
                    promoted.append(candidate)
                    return []
            return [f"no replica of {port} promoted (candidates {candidates})"]

        self._wait(not_promoted, timeout, f"a replica of {port} to be promoted")
        promoted_after = time.monotonic() - start
        self._wait(
            self.health_problems,
            max(0.5, timeout - promoted_after),
            f"the cluster to be ok after failing over {port}",
        )
        return Failover(port, promoted[0], promoted_after, time.monotonic() - start)

    def restart(self, port: int, timeout: float = 20.0) -> float:
        """Start a killed node again (same port, directory, AOF and ``nodes.conf``).

        Waits until the cluster is healthy with it: a master that was failed over is then a
        replica of its successor, fully synced. Returns the seconds it took.
        """
        node = self._node(port)
        start = time.monotonic()
        node.spawn(timeout)
        self._wait(
            lambda: self.health_problems(rejoining=[port]),
            max(0.5, timeout - (time.monotonic() - start)),
            f"{port} to rejoin",
        )
        return time.monotonic() - start

    def heal(self, timeout: float = 30.0) -> None:
        """Resume paused nodes, restart killed ones, wait until healthy."""
        for node in self._nodes.values():
            if node.paused and node.running:
                self.resume(node.port)
        restarted = []
        for node in self._nodes.values():
            if not node.running:
                node.spawn(timeout)
                restarted.append(node.port)
        self._wait(
            lambda: self.health_problems(rejoining=restarted), timeout, "the cluster to heal"
        )

    def flushall(self) -> None:
        """FLUSHALL on every master (the replicas follow)."""
        for port in self.masters():
            self.command(port, "FLUSHALL")

    # ------------------------------------------------------------------ resharding
    def migrate_slots(
        self,
        slots: Iterable[int],
        to_port: int,
        *,
        batch: int = 10,
        between_batches: Callable[[], None] | None = None,
        timeout: float = 30.0,
    ) -> Migration:
        """Move ``slots`` (with their keys) to master ``to_port``, one slot at a time.

        For each slot: ``SETSLOT IMPORTING`` on the target, ``MIGRATING`` on its owner,
        ``GETKEYSINSLOT``/``MIGRATE ... KEYS`` in batches of ``batch`` keys (calling
        ``between_batches()`` after each one), then ``SETSLOT NODE`` on the target, the
        owner and every other master. Slots the target already serves are skipped. Waits until
        every live node agrees on the new owners.
        """
        start = time.monotonic()
        moved = 0
        wanted = sorted(set(slots))
        for slot in wanted:
            step = SlotMigration(self, [slot], to_port)
            step.begin()
            while True:
                count = step.move_keys(batch)
                if count == 0:
                    break
                moved += count
                if between_batches is not None:
                    between_batches()
            step.finish(timeout=timeout)
        return Migration(tuple(wanted), to_port, moved, time.monotonic() - start)


class SlotMigration:
    """One resharding of ``slots`` to master ``to_port``, step by step.

    ``begin()`` puts every slot in IMPORTING (target) / MIGRATING (owner) state; each
    ``move_keys(n)`` migrates up to ``n`` keys and returns how many (0: none left);
    ``finish()`` moves any keys left and assigns the slots to the target on every master.
    Between steps a test can run clients against the half-migrated slots (ASK redirections,
    TRYAGAIN on multi-key commands whose keys are split between the two nodes).
    """

    def __init__(self, cluster: ClusterServer, slots: Iterable[int], to_port: int) -> None:
        self.cluster = cluster
        self.to_port = to_port
        self.target_id = cluster.node_id(to_port)
        self.slots = sorted(set(slots))
        self.sources: dict[int, int] = {}  # slot -> port of its owner at begin()
        self.keys_moved = 0
        self.begun = False
        self.finished = False

    def begin(self) -> None:
        c = self.cluster
        if self.target_id not in {c.node_id(p) for p in c.masters()}:
            raise ValueError(f"node {self.to_port} is not a master serving slots")
        for slot in self.slots:
            source = c.node_for_slot(slot)
            if source == self.to_port:
                continue
            self.sources[slot] = source
            c.command(self.to_port, "CLUSTER", "SETSLOT", slot, "IMPORTING", c.node_id(source))
            c.command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", self.target_id)
        self.begun = True

    def move_keys(self, count: int = 10) -> int:
        """Migrate up to ``count`` keys of the pending slots; how many moved (0: done)."""
        if not self.begun:
            raise RuntimeError("begin() first")
        c = self.cluster
        for slot, source in self.sources.items():
            keys = c.command(source, "CLUSTER", "GETKEYSINSLOT", slot, count)
            if not keys:
                continue
            reply = c.command(
                source,
                "MIGRATE", "127.0.0.1", self.to_port, "", 0, 5000, "KEYS", *keys,
                timeout=10.0,
            )  # fmt: skip
            if reply not in ("OK", "NOKEY", True):
                raise AssertionError(f"MIGRATE of slot {slot} replied {reply!r}")
            self.keys_moved += len(keys)
            return len(keys)
        return 0

    def finish(self, timeout: float = 30.0) -> None:
        """Move the keys left, then ``SETSLOT NODE`` everywhere; wait until all agree."""
        if not self.begun:
            self.begin()
        while self.move_keys(100):
            pass
        c = self.cluster
        for slot, source in self.sources.items():
            others = [p for p in c.masters() if p not in (self.to_port, source)]
            # Target first (it bumps its config epoch and owns the slot), then the old owner
            # (which then answers MOVED), then everyone else.
            for port in [self.to_port, source, *others]:
                c.command(port, "CLUSTER", "SETSLOT", slot, "NODE", self.target_id)
        self.finished = True

        def disagreeing() -> list[str]:
            problems = []
            for port in c._live_ports():
                try:
                    view = c.cluster_nodes(port)
                except redis.RedisError as exc:
                    problems.append(f"{port}: {exc!r}")
                    continue
                target = next((n for n in view if n.id == self.target_id), None)
                if target is None or not set(self.sources) <= target.slots:
                    problems.append(f"{port} does not see the slots on {self.to_port} yet")
            return problems

        c._wait(disagreeing, timeout, f"every node to see slots on {self.to_port}")


# --------------------------------------------------------------------------- pytest
@pytest.fixture(scope="module")
def cluster_server() -> Iterator[ClusterServer]:
    """One 3 + 3 cluster per test module; stopped and its directories removed at the end.

    Tests that break it (kill, pause, migrate) should leave it healthy, or use
    ``clean_cluster``, which heals and empties it before each test.
    """
    with ClusterServer() as cluster:
        yield cluster


@pytest.fixture
def clean_cluster(cluster_server: ClusterServer) -> ClusterServer:
    """The module's cluster, healed (paused nodes resumed, killed ones restarted) and empty."""
    cluster_server.heal()
    cluster_server.flushall()
    return cluster_server


@pytest.fixture
async def cluster_client(clean_cluster: ClusterServer) -> AsyncIterator[RedisClusterClient]:
    """redis-py's asyncio cluster client (``decode_responses=True``) on ``clean_cluster``."""
    client = RedisClusterClient.from_url(clean_cluster.url, decode_responses=True)
    try:
        await client.initialize()
        yield client
    finally:
        await client.aclose()


@atexit.register
def _close_leftovers() -> None:
    """Last resort when a test run dies without fixture teardown: end our own servers."""
    for cluster in list(_live):
        with contextlib.suppress(Exception):
            cluster.close()
