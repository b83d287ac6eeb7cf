"""What the soak's modules share (``tests/soak/test_soak.py`` has the rest of its knobs).

``SEED`` is drawn once, here, so that every module of the soak makes its choices from the one
seed the soak prints. ``CLUSTER`` (``SOAK_CLUSTER=1``, what ``make soak-cluster`` sets) runs the
same soak on a local Redis Cluster (3 masters + 3 replicas) whose masters are SIGKILLed and
failed over, instead of on one ``redis-server`` restarted from its AOF.
"""

from __future__ import annotations

import os
import random
import traceback
from pathlib import Path

from redis.exceptions import RedisClusterException, RedisError

SEED = int(os.environ.get("SOAK_SEED") or random.randrange(1 << 32))
CLUSTER = os.environ.get("SOAK_CLUSTER") == "1"

REPO = Path(__file__).resolve().parents[2]
CHANNEL = "C0SOAK"
REQUESTER = "U0SOAKREQ"
APPROVER = "U0SOAKAPP"
APPROVER2 = "U0SOAKBOSS"
MAX_OPEN_RUNS = 30

FATES = ["approve", "deny", "expire", "double", "race", "cancel"]
FATE_WEIGHTS = [40, 22, 12, 9, 9, 8]

# Chaos: a worker paused (SIGSTOP) for longer than its lease, then continued.
PAUSE_SECONDS = (2.5, 6.0)
AUDIT_GROUP = "soak-audit"  # the soak's own consumer group on the events stream


def redis_failed(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a read of the soak's own, means Redis (or a cluster master)
    is down: a RedisError or an OSError; on a cluster, the client's RedisClusterException
    ("slots not covered", outside RedisError), or an AttributeError or TypeError raised inside
    redis-py's asyncio connection, which trips over a connection closed under it while the
    client rebuilds its slot table (seen in the cluster soak: ``'NoneType' object has no
    attribute 'writelines'``; the same class of bug as redis/redis-py#4287)."""
    if isinstance(exc, RedisError | RedisClusterException | OSError):
        return True
    if isinstance(exc, AttributeError | TypeError) and exc.__traceback__ is not None:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        return f"{os.sep}redis{os.sep}" in last.filename
    return False
