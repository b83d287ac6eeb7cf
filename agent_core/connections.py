"""Redis clients with the timeouts and retries the gateway relies on."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError, RedisError, TimeoutError

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


def create_cluster(url: str, *, socket_timeout: float = 10.0, max_connections: int = 64) -> Redis:
    """redis-py's Redis Cluster client for a cluster reachable at ``url`` (any node).

    It follows MOVED and ASK redirections (a slot moved by resharding, a replica promoted by
    a failover) and refreshes its slot table; a command is retried on connection errors,
    which is safe for the same reason as in :func:`create_redis`.
    """
    client: Redis = RedisCluster.from_url(
        url,
        decode_responses=True,
        socket_timeout=socket_timeout,
        socket_connect_timeout=5.0,
        max_connections=max_connections,
        # Each retry rebuilds the slot table (redis-py ignores the backoff here): 20 cover
        # about a second. A failover takes longer (the node timeout): the callers' own
        # retry loops (worker, notifier, the bot's ack budget) carry it the rest of the way.
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), retries=20),
        retry_on_error=[ConnectionError, TimeoutError],
        # A MOVED (a slot moved by resharding) patches that slot only. Rebuilding the whole
        # table closes every connection of the nodes it replaces, including ones other
        # tasks are blocked on (XREADGROUP), which then fail outside redis-py's errors.
        reinitialize_steps=0,
    )
    return client


async def connect_redis(url: str, cluster: bool | None = None, **kwargs: float | int) -> Redis:
    """A client for ``url``: the cluster client when ``cluster`` is true, or when it is None
    and the server says it is a cluster node; else :func:`create_redis`'s."""
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
        client = create_cluster(url, **kwargs)  # type: ignore[arg-type]
        # Learn the slot table now: left to the first commands, a dozen readers starting at
        # once each rebuild it and close the connections the others are using.
        await client.initialize()
        return client
    return create_redis(url, **kwargs)  # type: ignore[arg-type]


async def reachable_redis(url: str, cluster: bool | None = None) -> Redis:
    """:func:`connect_redis`, then PING: a :class:`ConfigError` naming REDIS_URL (its
    password hidden) when the server does not answer."""
    redis = await connect_redis(url, cluster)
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
    ``keys[0]``). EVAL, not EVALSHA: a replica just promoted has no script cache."""
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
