"""The soak's plans (part of ``tests/soak/people.py``): the runs the requester asks for, each
with a scripted model conversation (its turns of tool calls, and for each sub-agent call the
child run it starts), drawn from the soak's seed.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from agent_core.testing import Step, call, calls, reply
from tests.soak.config import SEED
from tests.soak.soak_agent import MAX_DEPTH, SUB_AGENT_TOOLS


@dataclass
class CallPlan:
    tool: str
    op: str
    args: dict[str, Any]
    child: RunPlan | None = None  # a sub-agent call: the child run it should start


@dataclass
class RunPlan:
    index: int
    attempt: int
    task: str
    turns: list[list[CallPlan]]
    run_id: str | None = None
    acked_at: float | None = None
    reply_name: str = ""
    abandoned: bool = False  # acknowledged or not, it never became a run (yet)
    depth: int = 0  # 0: started by /agent; 1, 2: a child run (a sub-agent's)
    parent_op: str = ""  # a child run's: the op of the parent's call that starts it

    def descendants(self) -> Iterator[RunPlan]:
        """The child plans of this plan's sub-agent calls, and theirs."""
        for turn in self.turns:
            for c in turn:
                if c.child is not None:
                    yield c.child
                    yield from c.child.descendants()

    def calls(self) -> Iterator[CallPlan]:
        """Every call of this plan and of its descendants."""
        for plan in (self, *self.descendants()):
            for turn in plan.turns:
                yield from turn


SUB_SHARE = 0.28  # the share of runs whose model calls a sub-agent
DEEPER_SHARE = 0.35  # the share of sub-agent runs that call the sub-sub-agent
GATED_SUB_SHARE = 0.3  # the share of sub-agent calls made through the gated tool
PLAIN = ["act", "slow_act", "resync", "peek", "pay", "wire", "vote", "adjust", "ship"]
PLAIN_WEIGHTS = [30, 10, 7, 13, 12, 8, 8, 8, 4]
# The share of top runs that deploy: `ship` called once per turn, 3-5 turns (a grant made on
# the first decides the next ones, until it expires or is revoked), other calls in between.
SHIP_SHARE = 0.1
ENVS = ["staging", "staging", "prod"]


def op_depth(op: str) -> int:
    """The depth of the run that makes the call ``op``: ``index.attempt.turn.call`` at the
    top, and ``<op of the sub-agent call>.turn.call`` below."""
    return (op.count(".") - 3) // 2


def plain_call(rng: random.Random, op: str) -> CallPlan:
    tool = rng.choices(PLAIN, PLAIN_WEIGHTS)[0]
    args: dict[str, Any] = {"op": op}
    if tool == "slow_act":
        args["seconds"] = round(rng.uniform(0.2, 1.5), 2)
    elif tool == "adjust":
        args |= {"amount": rng.randrange(1, 100) * 100, "note": rng.choice(["refund", "fee"])}
    elif tool == "ship":
        args["env"] = rng.choice(ENVS)
    return CallPlan(tool, op, args)


def ship_turns(rng: random.Random, prefix: str) -> list[list[CallPlan]]:
    """A deploying run's turns: ``ship`` alone in each (each gate opens once the one before
    is decided, so a grant can decide it), now and then after another call of the turn."""
    turns: list[list[CallPlan]] = []
    for t in range(rng.randint(3, 5)):
        op = f"{prefix}.{t}.0"
        turn = [CallPlan("ship", op, {"op": op, "env": rng.choice(ENVS)})]
        if t and rng.random() < 0.3:
            turn.append(plain_call(rng, f"{prefix}.{t}.1"))
        turns.append(turn)
    return turns


def sub_call(rng: random.Random, op: str, depth: int) -> CallPlan:
    """A call (by a run at ``depth``) of the sub-agent one level down, and the child's plan:
    its task is the call's ``task`` argument, which the fake model is scripted by."""
    ungated, gated = SUB_AGENT_TOOLS[depth]
    tool = gated if rng.random() < GATED_SUB_SHARE else ungated
    task = f"soak-{SEED} sub {op}"
    deeper = depth + 1 < MAX_DEPTH and rng.random() < DEEPER_SHARE
    child = RunPlan(
        -1, 0, task, plan_turns(rng, op, depth + 1, deeper), depth=depth + 1, parent_op=op
    )
    return CallPlan(tool, op, {"task": task}, child)


def plan_turns(rng: random.Random, prefix: str, depth: int, with_sub: bool) -> list[list[CallPlan]]:
    """1-3 model turns (1-2 below the top) of 1-2 calls; with ``with_sub``, one turn calls
    the sub-agent one level down (sometimes twice: two children at once)."""
    n_turns = rng.choice([1, 1, 2, 2, 3] if depth == 0 else [1, 1, 2])
    sub_turn = rng.randrange(n_turns) if with_sub else -1
    turns: list[list[CallPlan]] = []
    for t in range(n_turns):
        n_calls = rng.choice([1, 1, 2, 2] if t == sub_turn else [1, 1, 1, 2])
        sub_at = rng.randrange(n_calls) if t == sub_turn else -1
        turn = []
        for k in range(n_calls):
            op = f"{prefix}.{t}.{k}"
            if k == sub_at or (t == sub_turn and rng.random() < 0.2):
                turn.append(sub_call(rng, op, depth))
            else:
                turn.append(plain_call(rng, op))
        turns.append(turn)
    return turns


def plan_run(rng: random.Random, index: int, attempt: int) -> RunPlan:
    # Not "soak …": a first word naming an agent picks that agent, and leaves the rest as
    # the task (bot.directory.AgentDirectory.route), which no script would match.
    task = f"soak-{SEED} run {index} try {attempt}"
    if rng.random() < SHIP_SHARE:
        return RunPlan(index, attempt, task, ship_turns(rng, f"{index}.{attempt}"))
    with_sub = rng.random() < SUB_SHARE
    return RunPlan(index, attempt, task, plan_turns(rng, f"{index}.{attempt}", 0, with_sub))


def script_of(plan: RunPlan) -> list[Step]:
    steps: list[Step] = []
    for turn in plan.turns:
        if len(turn) == 1:
            steps.append(call(turn[0].tool, turn[0].args))
        else:
            steps.append(calls([(c.tool, c.args) for c in turn]))
    steps.append(reply(final_answer(plan.task)))
    return steps


def final_answer(task: str) -> str:
    return f"final answer of {task}"
