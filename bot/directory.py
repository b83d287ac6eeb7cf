"""The agents this web process offers, and which of them live workers serve.

``/agent billing refund order 7`` (or ``@agent billing refund order 7``) runs ``billing`` on
"refund order 7" when ``billing`` is a configured agent's name (any case); any other first
word is part of the task, which the default agent (the first of AGENTS) does. Before a run is
started, the workers' presence (:mod:`agent_core.presence`) says whether some live worker
serves the chosen agent: if live workers serve only others, the task is refused at once
rather than failed by a worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from agent_core import presence
from agent_core.agent import Agent
from agent_core.keys import Keys
from agent_core.presence import WorkersReport

from . import cards

log = logging.getLogger(__name__)

REPORT_CACHE_SECONDS = 1.0  # how long a command reuses what it read of the workers
ELSEWHERE_CACHE_SECONDS = 5.0  # how long /healthz reuses its look for other prefixes
READ_TIMEOUT_SECONDS = 0.5  # a command that cannot read the workers in time starts anyway

NOT_SERVED = (
    "No worker serves the agent `{agent}` right now (the live workers serve {served}), so the "
    "task was not started. Ask whoever runs the workers to add it to AGENTS there."
)
NO_WORKER = (
    "⚠️ No worker is running right now: your task is queued, and starts when one does. If "
    "it does not start within a few minutes, tell whoever runs this app."
)
NO_TASK = (
    "What should `{agent}` do? Write the task after its name: `{command} {agent} &lt;task&gt;`. "
    "Nothing was started."
)


@dataclass(frozen=True)
class AgentEntry:
    """An agent ``/agent <name>`` can pick."""

    name: str
    description: str = ""
    suggested_prompts: tuple[str | tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Route:
    """Who does a task: ``agent`` (None when no agent is configured here: the workers'
    default), and whether its name was given."""

    agent: AgentEntry | None
    task: str
    named: bool = False


class AgentDirectory:
    """The configured agents (the first is the default) and, with ``redis`` and ``keys``,
    what the live workers serve."""

    def __init__(
        self,
        agents: Sequence[Agent | AgentEntry] = (),
        redis: Redis | None = None,
        keys: Keys | None = None,
    ) -> None:
        self.entries = [
            a
            if isinstance(a, AgentEntry)
            else AgentEntry(a.name, a.description, tuple(a.suggested_prompts))
            for a in agents
        ]
        self._by_name = {e.name.casefold(): e for e in self.entries}
        self.redis = redis
        self.keys = keys
        self._report: tuple[float, WorkersReport] | None = None
        self._elsewhere: tuple[float, list[str]] | None = None

    @property
    def default(self) -> AgentEntry | None:
        return self.entries[0] if self.entries else None

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]

    def find(self, word: str) -> AgentEntry | None:
        """The agent named ``word`` (any case; a trailing ``:`` or ``,`` ignored), or None."""
        return self._by_name.get(word.rstrip(":,").casefold()) if word else None

    def route(self, text: str) -> Route:
        """The agent a task's text asks for, and the task: with several agents configured, a
        first word naming one picks it; otherwise the default agent does the whole text
        (with one agent, "ops is down: restart web" keeps its first word)."""
        words = text.split(maxsplit=1)
        chosen = self.find(words[0]) if words and len(self.entries) > 1 else None
        if chosen is not None:
            return Route(chosen, words[1].strip() if len(words) > 1 else "", named=True)
        return Route(self.default, text.strip())

    def help_text(self, command: str) -> str:
        """The agents, for ``/agent help`` (empty when none is configured here)."""
        if not self.entries:
            return ""
        lines = ["*Agents*" if len(self.entries) > 1 else "*Agent*"]
        for i, e in enumerate(self.entries):
            about = cards.clip_escaped(e.description, 300) if e.description else "no description"
            default = " (default)" if i == 0 and len(self.entries) > 1 else ""
            lines.append(f"• `{cards.clip_escaped(e.name, 100)}`{default} — {about}")
        if len(self.entries) > 1:
            first, second = self.entries[0].name, self.entries[1].name
            lines.append(
                f"Name an agent first to pick it, e.g. `{command} {second} &lt;task&gt;`; without a "
                f"name, `{first}` does the task."
            )
        return "\n".join(lines)

    # --- workers ----------------------------------------------------------------------
    @property
    def knows_workers(self) -> bool:
        """Whether it can read the live workers (it has a Redis and the deployment's keys)."""
        return self.redis is not None and self.keys is not None

    async def workers(self, *, look_elsewhere: bool = False, fresh: bool = False) -> WorkersReport:
        """What the live workers serve (read at most every REPORT_CACHE_SECONDS unless
        ``fresh``); with ``look_elsewhere`` and none alive, the other prefixes that have
        workers (looked for at most every ELSEWHERE_CACHE_SECONDS). Raises what Redis raises;
        ValueError when this directory has no Redis."""
        if self.redis is None or self.keys is None:
            raise ValueError("no Redis to read the workers from")
        loop = asyncio.get_running_loop()
        now = loop.time()
        cached = self._report
        if cached is not None and not fresh and now - cached[0] < REPORT_CACHE_SECONDS:
            report = cached[1]
        else:
            report = await presence.check(self.redis, self.keys, self.names, look_elsewhere=False)
            self._report = (loop.time(), report)
        if look_elsewhere and not report.workers:
            seen = self._elsewhere
            if seen is None or now - seen[0] >= ELSEWHERE_CACHE_SECONDS:
                seen = (loop.time(), await presence.other_prefixes(self.redis, self.keys))
                self._elsewhere = seen
            report = WorkersReport(
                report.workers, report.key_prefix, report.shards, report.expected_agents, seen[1]
            )
        return report

    async def refusal(self, agent: AgentEntry | None) -> tuple[str | None, str | None]:
        """Before starting a run of ``agent``: (why not to start it, a note to send once it
        started). Nothing is refused when the workers cannot be read in time: the run then
        starts, and a worker fails it if none serves its agent."""
        if agent is None or self.redis is None or self.keys is None:
            return None, None
        try:
            report = await asyncio.wait_for(self.workers(), READ_TIMEOUT_SECONDS)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("could not read the live workers (%s); starting anyway", type(exc).__name__)
            return None, None
        if not report.workers:
            return None, NO_WORKER
        if not report.serves(agent.name):
            served = ", ".join(f"`{cards.clip_escaped(a, 100)}`" for a in report.agents)
            return NOT_SERVED.format(agent=cards.clip_escaped(agent.name, 100), served=served), None
        return None, None
