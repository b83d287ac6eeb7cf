"""The fake model in a process of its own: ``python -m tests.bench.fake_model [SIZE ...]``.

Serves :class:`agent_core.testing.FakeOpenAI` (a real HTTP server speaking Chat Completions)
scripted for every benchmark task: :data:`tests.bench.agent.TASK` (one gated call, then
"Done.") and, for each history size given (user+assistant pairs), :func:`task_for` with
:func:`script_for` (two gated calls, then "Done."). It prints
``PORT <n>`` on stdout when ready and serves until its standard input closes (the benchmark
holds the pipe) or it gets SIGTERM; unexpected requests are reported on stderr at exit.

A process of its own keeps the fake's CPU work (parsing and checking every request) off the
measured process's GIL.
"""

from __future__ import annotations

import signal
import sys
import threading

from aiohttp import web

from agent_core.testing import FakeOpenAI, Step, call, calls, reply
from tests.bench.agent import TASK

MAX_REQUEST_BYTES = 64 * 2**20


class BigFakeOpenAI(FakeOpenAI):
    """FakeOpenAI accepting requests over aiohttp's default 1 MiB (5,000 pairs are ~2.4 MB)."""

    async def _start_site(self) -> None:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_post("/v1/chat/completions", self._handle_chat)
        app.router.add_get("/v1/models", self._handle_models)
        app.router.add_route("*", "/{tail:.*}", self._handle_unknown)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._requested_port, reuse_address=True)
        await site.start()
        self._runner = runner
        self._port = int(runner.addresses[0][1])


GATED_USERS = ("42", "43")  # the pause benchmark's turn calls delete_user twice


def task_for(n: int) -> str:
    """The task of the pause benchmark's run with ``n`` prior user+assistant pairs."""
    return f"bench: delete users 42 and 43 (history {n} pairs)"


def script_for(n: int) -> list[Step]:
    """Step i answers a request holding i assistant messages: the n prior pairs hold n, so
    step n is the turn with the two gated calls and step n + 1 the final answer."""
    gated = calls([("delete_user", {"user_id": u}) for u in GATED_USERS])
    return [reply("filler")] * n + [gated, reply("Done.")]


def _wait_stdin_closed(stop: threading.Event) -> None:
    sys.stdin.read()
    stop.set()


def main() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with BigFakeOpenAI() as fake:
        fake.script(TASK, [call("delete_user", {"user_id": "42"}), reply("Done.")])
        for n in (int(a) for a in sys.argv[1:]):
            fake.script(task_for(n), script_for(n))
        print(f"PORT {fake.port}", flush=True)
        threading.Thread(target=_wait_stdin_closed, args=(stop,), daemon=True).start()
        stop.wait()
        if fake.errors:
            print(
                f"fake model: {len(fake.errors)} unexpected request(s): {fake.errors[:3]}",
                file=sys.stderr,
                flush=True,
            )


if __name__ == "__main__":
    main()
