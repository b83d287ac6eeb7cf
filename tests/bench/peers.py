"""The peers of the pause benchmark (:mod:`tests.bench.pause`): the OpenAI Agents SDK and
LangGraph, each with a stub model that receives the message list in-process (no HTTP, no
request body) and each persisting its paused state in the same Redis as ours.
"""

from __future__ import annotations

import json
import operator
import time
import uuid
from typing import Annotated, Any, TypedDict

from redis.asyncio import Redis

from agent_core import create_redis
from tests.bench.common import ModelClock, ServerProbe, Traffic, count_traffic
from tests.bench.fake_model import GATED_USERS
from tests.bench.pause import (
    INSTRUCTIONS,
    LG_DICTS,
    LG_MESSAGES,
    SDK,
    STAND_IN,
    Framework,
    Sample,
    ToolProbe,
    history,
)


# =========================================================================== OpenAI Agents SDK
class AgentsSdk(Framework):
    """``needs_approval=True``; the paused ``RunState.to_json()`` is SET in Redis, GET to resume.

    The model is a stub :class:`agents.Model`: it gets the input items and answers with the
    two calls, then (once it sees the tool outputs) with "Done.".
    """

    name = SDK

    def __init__(self, url: str, probe: ServerProbe) -> None:
        from agents import Agent, Model, ModelResponse, Usage, function_tool, set_tracing_disabled
        from openai.types.responses import (
            ResponseFunctionToolCall,
            ResponseOutputMessage,
            ResponseOutputText,
        )

        set_tracing_disabled(True)
        self.probe = probe
        self.traffic_ = Traffic()
        self.redis = count_traffic(create_redis(url), self.traffic_)
        self.clock = ModelClock()
        self.tool = ToolProbe()
        self.min_items = 0
        clock, bench = self.clock, self

        class StubModel(Model):
            async def get_response(  # type: ignore[override]
                self, system_instructions: Any, input: Any, *a: Any, **k: Any
            ) -> Any:
                with clock.timing():
                    assert isinstance(input, list) and len(input) >= bench.min_items, len(input)
                    last = input[-1]
                    if isinstance(last, dict) and last.get("type") == "function_call_output":
                        text = ResponseOutputText(type="output_text", text="Done.", annotations=[])
                        out: list[Any] = [
                            ResponseOutputMessage(
                                id="msg_done",
                                type="message",
                                role="assistant",
                                status="completed",
                                content=[text],
                            )
                        ]
                    else:
                        out = [
                            ResponseFunctionToolCall(
                                type="function_call",
                                id=f"fc_{u}",
                                call_id=f"call_{u}",
                                name="delete_user",
                                arguments=json.dumps({"user_id": u}),
                                status="completed",
                            )
                            for u in GATED_USERS
                        ]
                    return ModelResponse(output=out, usage=Usage(), response_id=None)

            def stream_response(self, *a: Any, **k: Any) -> Any:
                raise NotImplementedError

        probe_tool = self.tool

        @function_tool(needs_approval=True)
        async def delete_user(user_id: str) -> str:
            """Permanently delete a user."""
            probe_tool.mark()
            return f"user {user_id} deleted"

        self.agent = Agent(
            name="bench", instructions=INSTRUCTIONS, tools=[delete_user], model=StubModel()
        )

    @staticmethod
    def _input(n: int) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for i, m in enumerate(history(n)):
            if m["role"] == "assistant":  # as the SDK itself records assistant output
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "id": f"msg_{i}",
                        "status": "completed",
                        "content": [
                            {"type": "output_text", "text": m["content"], "annotations": []}
                        ],
                    }
                )
            else:
                items.append({"role": "user", "content": m["content"]})
        return items

    async def rep(self, n: int) -> Sample:
        from agents import Runner, RunState

        items = self._input(n)
        self.min_items = len(items)
        key = f"sdk:run:{uuid.uuid4().hex}"
        s0, c0 = await self.probe.snapshot(), self.traffic_.snapshot()
        t0 = time.perf_counter()
        result = await Runner.run(self.agent, items)  # type: ignore[arg-type]
        assert len(result.interruptions) == len(GATED_USERS), result.interruptions
        await self.redis.set(key, json.dumps(result.to_state().to_json(), separators=(",", ":")))
        t1 = time.perf_counter()
        c1, s1 = self.traffic_.snapshot(), await self.probe.snapshot()
        del result

        s2, c2 = await self.probe.snapshot(), self.traffic_.snapshot()
        t2 = time.perf_counter()
        raw = await self.redis.get(key)
        state = await RunState.from_json(self.agent, json.loads(raw))
        for item in state.get_interruptions():
            state.approve(item)
        result = await Runner.run(self.agent, state)
        t4 = time.perf_counter()
        c4, s4 = self.traffic_.snapshot(), await self.probe.snapshot()
        assert result.final_output == "Done.", result.final_output
        prep, pause, resume, to_tool, model = self._windows(t0, t1, t2, t4)
        await self.redis.delete(key)
        return Sample(
            SDK,
            n,
            prep,
            model,
            pause,
            resume,
            to_tool,
            0,
            c1 - c0,
            c4 - c2,
            self.probe.delta(s0, s1),
            self.probe.delta(s2, s4),
        )

    async def close(self) -> None:
        await self.redis.aclose()


# =========================================================================== LangGraph
class DictState(TypedDict):
    messages: Annotated[list[dict[str, Any]], operator.add]


class LangGraph(Framework):
    """``interrupt()`` in each gated tool, one task per tool call (``Send``, as LangGraph's
    own agent does) so both interrupts surface in one pause; resumed with
    ``Command(resume={interrupt id: "approve", ...})``, ``durability="sync"``.

    ``dicts=False``: ``MessagesState`` (LangChain message objects), a stub chat model
    (a ``BaseChatModel``) and the prebuilt ``ToolNode``. ``dicts=True``: the leanest
    LangGraph agent we could write, the messages as plain dicts in the state (``operator.add``)
    and a plain async function as the stub model.

    The saver is ``langgraph-checkpoint-redis``'s ``AsyncRedisSaver`` (the async face of
    ``RedisSaver``, which ``ainvoke`` needs) on Redis Stack; ``stand_in=True`` uses
    :class:`tests.bench.lg_saver.PlainRedisSaver` on plain Redis instead (when Redis Stack
    cannot run). The history is stored in the thread's checkpoint beforehand
    (``aupdate_state``, not timed); the real saver's thread is deleted after each repetition
    (``adelete_thread``, not timed), so every repetition finds the same index size.
    """

    def __init__(self, url: str, probe: ServerProbe, *, dicts: bool, stand_in: bool) -> None:
        self.dicts, self.stand_in = dicts, stand_in
        self.name = (LG_DICTS if dicts else LG_MESSAGES) + (STAND_IN if stand_in else "")
        self.probe = probe
        self.traffic_ = Traffic()
        self.redis = count_traffic(Redis.from_url(url), self.traffic_)
        self.clock = ModelClock()
        self.tool = ToolProbe()
        self.min_messages = 0
        self.saver: Any = None
        self.graph: Any = None

    async def setup(self) -> None:
        from langgraph.graph import END, START, StateGraph
        from langgraph.types import Send, interrupt

        if self.stand_in:
            from tests.bench.lg_saver import PlainRedisSaver

            self.saver = PlainRedisSaver(self.redis)
        else:
            from langgraph.checkpoint.redis.aio import AsyncRedisSaver

            self.saver = AsyncRedisSaver(redis_client=self.redis)
            await self.saver.asetup()
        clock, probe_tool, bench = self.clock, self.tool, self

        def route(state: Any) -> Any:
            last = state["messages"][-1]
            calls = last.get("tool_calls") if self.dicts else getattr(last, "tool_calls", None)
            if not calls:
                return END
            return [Send("tools", [c] if not self.dicts else c) for c in calls]

        if self.dicts:

            async def stub(messages: list[dict[str, Any]]) -> dict[str, Any]:
                assert len(messages) >= bench.min_messages, len(messages)
                if messages[-1]["role"] == "tool":
                    return {"role": "assistant", "content": "Done."}
                calls = [
                    {
                        "id": f"call_{u}",
                        "type": "function",
                        "function": {
                            "name": "delete_user",
                            "arguments": json.dumps({"user_id": u}),
                        },
                    }
                    for u in GATED_USERS
                ]
                return {"role": "assistant", "content": "", "tool_calls": calls}

            async def agent_node(state: DictState) -> dict[str, Any]:
                messages = [{"role": "system", "content": INSTRUCTIONS}, *state["messages"]]
                with clock.timing():
                    answer = await stub(messages)
                return {"messages": [answer]}

            async def tool_node(call: dict[str, Any]) -> dict[str, Any]:
                args = json.loads(call["function"]["arguments"])
                decision = interrupt({"tool": "delete_user", "args": args})
                if decision != "approve":
                    content = "declined"
                else:
                    probe_tool.mark()
                    content = f"user {args['user_id']} deleted"
                return {
                    "messages": [{"role": "tool", "tool_call_id": call["id"], "content": content}]
                }

            g: Any = StateGraph(DictState)
            g.add_node("agent", agent_node)
            g.add_node("tools", tool_node)
        else:
            from langchain_core.language_models.chat_models import BaseChatModel
            from langchain_core.messages import AIMessage, SystemMessage, ToolMessage
            from langchain_core.outputs import ChatGeneration, ChatResult
            from langchain_core.tools import tool as lc_tool
            from langgraph.graph import MessagesState
            from langgraph.prebuilt import ToolNode

            class StubChatModel(BaseChatModel):
                @property
                def _llm_type(self) -> str:
                    return "bench-stub"

                def _generate(self, *a: Any, **k: Any) -> ChatResult:
                    raise NotImplementedError("async only")

                async def _agenerate(self, messages: Any, *a: Any, **k: Any) -> ChatResult:
                    assert len(messages) >= bench.min_messages, len(messages)
                    if isinstance(messages[-1], ToolMessage):
                        msg = AIMessage("Done.")
                    else:
                        msg = AIMessage(
                            "",
                            tool_calls=[
                                {"name": "delete_user", "args": {"user_id": u}, "id": f"call_{u}"}
                                for u in GATED_USERS
                            ],
                        )
                    return ChatResult(generations=[ChatGeneration(message=msg)])

            llm = StubChatModel()

            @lc_tool
            async def delete_user(user_id: str) -> str:
                """Permanently delete a user."""
                decision = interrupt({"tool": "delete_user", "args": {"user_id": user_id}})
                if decision != "approve":
                    return "declined"
                probe_tool.mark()
                return f"user {user_id} deleted"

            async def lc_agent_node(state: MessagesState) -> dict[str, Any]:
                messages = [SystemMessage(INSTRUCTIONS), *state["messages"]]
                with clock.timing():
                    answer = await llm.ainvoke(messages)
                return {"messages": [answer]}

            g = StateGraph(MessagesState)
            g.add_node("agent", lc_agent_node)
            g.add_node("tools", ToolNode([delete_user]))
        g.add_edge(START, "agent")
        g.add_conditional_edges("agent", route, ["tools", END])
        g.add_edge("tools", "agent")
        self.start = START
        self.graph = g.compile(checkpointer=self.saver)

    def _messages(self, n: int) -> list[Any]:
        messages = history(n)
        if self.dicts:
            return messages
        from langchain_core.messages import AIMessage, HumanMessage

        return [
            AIMessage(m["content"]) if m["role"] == "assistant" else HumanMessage(m["content"])
            for m in messages
        ]

    async def rep(self, n: int) -> Sample:
        from langgraph.types import Command

        thread = uuid.uuid4().hex
        cfg: Any = {"configurable": {"thread_id": thread}}
        # Not timed: the history is already persisted in the thread's checkpoint.
        messages = self._messages(n)
        self.min_messages = len(messages) + 1
        await self.graph.aupdate_state(cfg, {"messages": messages}, as_node=self.start)
        del messages
        s0, c0 = await self.probe.snapshot(), self.traffic_.snapshot()
        t0 = time.perf_counter()
        out = await self.graph.ainvoke(None, cfg, durability="sync")
        t1 = time.perf_counter()
        c1, s1 = self.traffic_.snapshot(), await self.probe.snapshot()
        interrupts = out.get("__interrupt__") or []
        assert len(interrupts) == len(GATED_USERS), interrupts
        resume = Command(resume={i.id: "approve" for i in interrupts})
        del out

        s2, c2 = await self.probe.snapshot(), self.traffic_.snapshot()
        t2 = time.perf_counter()
        out = await self.graph.ainvoke(resume, cfg, durability="sync")
        t4 = time.perf_counter()
        c4, s4 = self.traffic_.snapshot(), await self.probe.snapshot()
        last = out["messages"][-1]
        final = last["content"] if self.dicts else last.content
        assert final == "Done." and not out.get("__interrupt__"), last
        prep, pause, resume_t, to_tool, model = self._windows(t0, t1, t2, t4)
        del out
        if not self.stand_in:
            await self.saver.adelete_thread(thread)
        return Sample(
            self.name,
            n,
            prep,
            model,
            pause,
            resume_t,
            to_tool,
            0,
            c1 - c0,
            c4 - c2,
            self.probe.delta(s0, s1),
            self.probe.delta(s2, s4),
        )

    async def close(self) -> None:
        await self.redis.aclose()
