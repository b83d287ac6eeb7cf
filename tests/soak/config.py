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
APPROVER3 = "U0SOAKTHIRD"  # a third of APPROVERS: quorums have three people racing for two slots
MAX_OPEN_RUNS = 30

# Approval channels, per-tool approvers, reminders, escalation and quorums (the soak agent's
# `pay`, `wire` and `vote`: tests/soak/soak_agent.py). `pay`'s cards go to FIN_CHANNEL (the bot is
# removed from it and invited back now and then: its cards fall back to the task's thread), and
# only FIN_GROUP's members may decide them, or ESCALATE_TO once escalated. STRANGER is on no
# list: their clicks (and the other outsiders') must be refused.
FIN_CHANNEL = "C0SOAKFIN"
FIN_GROUP = "S0SOAKFIN"
FIN1 = "U0SOAKFIN1"
FIN2 = "U0SOAKFIN2"
ESCALATE_TO = "U0SOAKESC"
STRANGER = "U0SOAKSTRANGER"
APPROVERS = (APPROVER, APPROVER2, APPROVER3)  # the APPROVERS setting
GROUPS = {FIN_GROUP: (FIN1, FIN2)}  # the user groups the fake Slack knows
# `ship`'s allow_for: short, so that grants also expire during a run (tests/soak/editors.py).
GRANT_SECONDS = 10.0
REMIND_AFTER, ESCALATE_AFTER = 1.0, 2.0  # shorter than the workers' APPROVAL_TIMEOUT (3 s, 12 s)

FATES = ["approve", "deny", "expire", "double", "race", "cancel"]
FATE_WEIGHTS = [40, 22, 12, 9, 9, 8]
# A routed gate's (`pay`): its fates above, plus an outsider's click before the decision
# ("outsider-approve", "outsider-deny") and an approval by whom it was escalated to, after the
# escalation (ESCALATE_TO also clicks too early, before it: refused).
ROUTED_FATES = [
    "approve",
    "deny",
    "expire",
    "race",
    "cancel",
    "outsider-approve",
    "outsider-deny",
    "escalated",
]
ROUTED_WEIGHTS = [22, 12, 10, 6, 6, 16, 10, 18]
# A quorum gate's (`wire`, `vote`: approvals=2): two or three approvers racing, one approval
# and a deny, the same person twice, one approval only (it expires), the requester first
# (refused), the escalated person as the second approver (`vote`), a cancel.
QUORUM_FATES = [
    "quorum",
    "quorum-race",
    "quorum-deny",
    "quorum-again",
    "half",
    "requester",
    "escalated",
    "cancel",
]
QUORUM_WEIGHTS = [24, 16, 12, 10, 10, 10, 12, 6]
# An editable gate's (`adjust`): Edit & approve (sometimes an invalid edit first, refused;
# or the requester's click and forged form first, refused), or the plain fates. A grantable
# gate's (`ship`): Approve & allow with any arguments or only its `env` (or the requester's try
# first, refused), or the plain fates; the thread's later `ship` gates are decided by the grant
# ("by-grant", tests/soak/editors.py).
EDIT_FATES = ["edit", "edit-invalid", "edit-outsider", "approve", "deny", "expire"]
EDIT_WEIGHTS = [30, 22, 12, 14, 12, 10]
GRANT_FATES = ["grant", "grant-only", "grant-requester", "approve", "deny", "expire"]
GRANT_WEIGHTS = [28, 26, 12, 12, 12, 10]

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
