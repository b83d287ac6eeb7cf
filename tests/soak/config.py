"""What the soak's modules share (``tests/soak/test_soak.py`` has the rest of its knobs).

``SEED`` is drawn once, here, so that every module of the soak makes its choices from the one
seed the soak prints.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

SEED = int(os.environ.get("SOAK_SEED") or random.randrange(1 << 32))

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
