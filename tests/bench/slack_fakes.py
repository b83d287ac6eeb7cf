"""``python -m tests.bench.slack_fakes GATES COMMANDS``: the fake Slack and fake OpenAI servers
of the Slack latency benchmark, in a process of their own.

They are :class:`tests.slack_fake.FakeSlack` and :class:`agent_core.testing.FakeOpenAI`, unchanged
but for a timestamp and the garbage collector: the first ``chat.update`` that turns a gate card
into its decided state is timed with ``time.monotonic()`` (the same clock in every process), to
measure click → card updated, and so is the first that shows the tool's outcome (the
notifier's update, after the tool ran); and what they keep is frozen every second (``_freeze_every``),
so that the collector's walks over it do not stall them as remote services never would. Running them here keeps their CPU time (every Slack call and every model
call of the web and worker processes lands in them) off the load generator's GIL.

Scripts: task ``slack-bench {i}`` (``i < GATES``) calls ``delete_user(user_id="u{i}")`` then
answers "done"; task ``slack-bench cmd {i}`` (``i < COMMANDS``) the same with ``c{i}``.

Protocol: prints ``READY <slack base url> <openai base url>``, then answers each stdin line
``stats`` with one JSON line; ``quit`` or end of input stops the servers.
"""

from __future__ import annotations

import gc
import json
import sys
import threading
import time
from collections import Counter
from typing import Any

from agent_core.testing import FakeOpenAI, call, reply
from tests.slack_fake import FakeSlack, SlackCall

DECIDED_PREFIXES = ("Approved:", "Denied:", "Expired:", "Cancelled:")
OUTCOMES = ("*Executed*", "*The tool failed*")  # a card's line once its tool ran (bot/cards.py)


def gate_task(i: int) -> str:
    return f"slack-bench {i}"


def command_task(i: int) -> str:
    return f"slack-bench cmd {i}"


class TimedSlack(FakeSlack):
    """A :class:`FakeSlack` that timestamps the first "decided" update of each message, and
    the first that shows its tool's outcome."""

    def __init__(self) -> None:
        # Block Kit validation is the fake's own check of our cards, not Slack's cost to us.
        super().__init__(validate_blocks=False)
        self.decided_at: dict[str, float] = {}
        self.outcome_at: dict[str, float] = {}
        self._timing_lock = threading.Lock()

    def _record(self, call: SlackCall) -> None:
        super()._record(call)
        text = str(call.args.get("text") or "")
        if call.method == "chat.update" and call.ok and text.startswith(DECIDED_PREFIXES):
            key = f"{call.args.get('channel')}|{call.args.get('ts')}"
            now = time.monotonic()
            shown = str(call.args.get("blocks") or "")
            with self._timing_lock:
                self.decided_at.setdefault(key, now)
                if key not in self.outcome_at and any(o in shown for o in OUTCOMES):
                    self.outcome_at[key] = now

    def stats(self) -> dict[str, Any]:
        calls = self.calls
        methods = Counter(c.method.split(":")[0] for c in calls)
        failed = Counter(c.method.split(":")[0] for c in calls if not c.ok)
        already = sum(
            1
            for c in calls
            if c.method.startswith("response_url:")
            and str(c.args.get("text") or "").startswith("Already approved")
        )
        live = sum(1 for m in self.messages if "gate_approve" in json.dumps(m.blocks))
        with self._timing_lock:
            decided = dict(self.decided_at)
            outcome = dict(self.outcome_at)
        return {
            "calls": dict(methods),
            "failed": dict(failed),
            "already_decided_replies": already,
            "cards_with_buttons": live,
            "decided_at": decided,
            "outcome_at": outcome,
        }


def _freeze_every(seconds: float) -> None:
    """Freeze what the fakes have kept so far (every call and message, for the checks), again
    and again: left to the garbage collector, this process's full collections walked all of
    it, growing with the run, and stopped both servers for 118 ms at 176,000 objects and
    507 ms at 621,000 (measured), which the worker saw as the model not answering."""
    while True:
        time.sleep(seconds)
        gc.freeze()


def main(argv: list[str]) -> int:
    threading.Thread(target=_freeze_every, args=(1.0,), name="gc-freeze", daemon=True).start()
    gates, commands = int(argv[0]), int(argv[1])
    slack = TimedSlack().start()
    model = FakeOpenAI().start()
    try:
        for i in range(gates):
            model.script(gate_task(i), [call("delete_user", {"user_id": f"u{i}"}), reply("done")])
        for i in range(commands):
            model.script(
                command_task(i), [call("delete_user", {"user_id": f"c{i}"}), reply("done")]
            )
        print(f"READY {slack.base_url} {model.base_url}", flush=True)
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "stats":
                out = slack.stats() | {"model_errors": model.errors[:5]}
                print(json.dumps(out), flush=True)
            elif cmd == "quit":
                break
    finally:
        slack.stop()
        model.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
