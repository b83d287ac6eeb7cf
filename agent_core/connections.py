"""Redis clients with the timeouts and retries the gateway relies on."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError, RedisError, TimeoutError

from .cluster_client import DEFAULT_FAILOVER_WINDOW, FailoverCluster
from .exceptions import ConfigError
from .streams import is_cluster


def create_redis(url: str, *, socket_timeout: float = 10.0, max_connections: int = 64) -> Redis:
    """A client decoding responses to str, retrying commands on connection errors.

    Connections come from a bounded, blocking pool: a burst of hundreds of concurrent
    requests waits briefly for a free connection instead of opening one socket each (which
    ran the web process out of file descriptors at 500 simultaneous clicks, measured).
    Scripts are written to be safe to run twice, since a retried command may have been
    applied before the connection dropped. Blocking reads (XREADGROUP BLOCK) must use a block
    time well under ``socket_timeout``.
    """
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=socket_timeout,
        decode_responses=True,
        socket_timeout=socket_timeout,
        socket_connect_timeout=5.0,
        health_check_interval=15,
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), retries=3),
        retry_on_error=[ConnectionError, TimeoutError],
    )
    return Redis.from_pool(pool)


def create_cluster(
    url: str,
    *,
    socket_timeout: float = 10.0,
    max_connections: int = 64,
    failover_window: float = DEFAULT_FAILOVER_WINDOW,
) -> Redis:
    """A Redis Cluster client for a cluster reachable at ``url`` (any node).

    redis-py's cluster client (it follows MOVED and ASK redirections and refreshes its slot
    table), with :class:`~agent_core.cluster_client.FailoverCluster`'s changes: a command
    that fails while a master fails over is retried for up to ``failover_window`` seconds,
    and one master's failover no longer breaks the commands of the others. Retrying is safe
    for the same reason as in :func:`create_redis`.
    """
    client: Redis = FailoverCluster.from_url(
        url,
        decode_responses=True,
        socket_timeout=socket_timeout,
        socket_connect_timeout=5.0,
        max_connections=max_connections,
        failover_window=failover_window,
        # redis-py's own retries come at once, one after the other: a couple absorb a
        # stale connection; the failover window (with a backoff) does the rest.
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), retries=2),
        retry_on_error=[ConnectionError, TimeoutError],
        # A MOVED (a slot moved by resharding) patches that slot only. Rebuilding the whole
        # table closes every connection of the nodes it replaces, including ones other
        # tasks are blocked on (XREADGROUP), which then fail outside redis-py's errors.
        reinitialize_steps=0,
    )
    return client


async def connect_redis(
    url: str,
    cluster: bool | None = None,
    *,
    failover_window: float = DEFAULT_FAILOVER_WINDOW,
    **kwargs: float | int,
) -> Redis:
    """A client for ``url``: the cluster client when ``cluster`` is true, or when it is None
    and the server says it is a cluster node; else :func:`create_redis`'s.
    ``failover_window``: see :func:`create_cluster`."""
    if cluster is None:
        probe = create_redis(url, **kwargs)  # type: ignore[arg-type]
        try:
            info = await probe.info("cluster")
            cluster = bool(int(info.get("cluster_enabled", 0)))
        except RedisError:
            cluster = False
        finally:
            await probe.aclose()
    if cluster:
        client = create_cluster(url, failover_window=failover_window, **kwargs)  # type: ignore[arg-type]
        # Learn the slot table now: left to the first commands, a dozen readers starting at
        # once each rebuild it and close the connections the others are using.
        await client.initialize()
        return client
    return create_redis(url, **kwargs)  # type: ignore[arg-type]


async def reachable_redis(
    url: str, cluster: bool | None = None, *, failover_window: float = DEFAULT_FAILOVER_WINDOW
) -> Redis:
    """:func:`connect_redis`, then PING: a :class:`ConfigError` naming REDIS_URL (its
    password hidden) when the server does not answer."""
    redis = await connect_redis(url, cluster, failover_window=failover_window)
    try:
        await redis.ping()
    except (RedisError, OSError) as exc:
        await redis.aclose()
        raise ConfigError(
            f"REDIS_URL: cannot reach Redis at {redacted(url)} ({type(exc).__name__})"
        ) from None
    return redis


async def eval_replicated(
    redis: Redis, script: str, keys: list[str], args: list[Any], replicas: int, wait_ms: int
) -> tuple[Any, int]:
    """Run a Lua script, then WAIT until ``replicas`` replicas have its writes (at most
    ``wait_ms``); the script's result and the replicas reached. WAIT counts the writes of
    its own connection: a pipeline sends both on one (on a cluster, to the node of
    ``keys[0]``, again on every retry). EVAL, not EVALSHA: a replica just promoted has no
    script cache."""
    if isinstance(redis, FailoverCluster):
        result, reached = await redis.eval_and_wait(script, keys, args, replicas, wait_ms)
        return result, int(reached)
    pipe = redis.pipeline(transaction=False)
    pipe.eval(script, len(keys), *keys, *args)
    wait = ("WAIT", replicas, wait_ms)
    if is_cluster(redis):
        pipe.execute_command(*wait, target_nodes=redis.get_node_from_key(keys[0]))
    else:
        pipe.execute_command(*wait)
    result, reached = await pipe.execute()
    return result, int(reached)


def redacted(url: str) -> str:
    """A Redis URL without its password, for logs and errors."""
    parts = urlsplit(url)
    if parts.password:
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        user = f"{parts.username}:***@" if parts.username else ":***@"
        return parts._replace(netloc=f"{user}{host}{port}").geturl()
    return url
