"""Cancellation at every checkpoint of a turn: "cancellation mid-stream loses nothing".

One turn of each shape (text only; reasoning, a tool call and an answer over two steps;
a tool needing approval, approved and resumed; the same approval followed by a new
input instead of the continuation; two tools in parallel; a provider error mid-stream;
and, resumed otherwise, a wait the host's expiry timer denies and resumes, a client
tool's output)
runs on the scripted provider (embedded on SQLite and on the memory store) and on the
real OpenAI and Anthropic clients (against the suite's loopback SSE server, on SQLite),
and is cut after the N-th Trio task step (counted by a :class:`trio.abc.Instrument`,
which makes the cut there) four ways: the caller's cancel scope, a stop
(``out.cancel``), the host closing, a new input that interrupts (``on_busy``). N runs
over the turn's count with a stride (turns counted, never timed); by hand,
``AXON_CANCEL_EVERY=1`` cuts after every step, and the real clients all four ways.

After each cut:

(a) nothing but ``Cancelled`` (absorbed by the caller's scope) escapes to the caller
    (``HostClosed`` for what was asked of a closing host, the documented errors of a
    decision a new input overtook), no task is left running once the host is gone, no
    unraisable exception or warning, every stream has a result (no error but the
    shape's own), the session is not busy and holds what the store holds;
(b) the stored session is well-formed: one assistant message per user input (or
    neither, for the last), every tool call has exactly one result or waits for a
    decision, and the OpenAI, Anthropic and Gemini requests built from it break no
    wire rule;
(c) reopened from the store in a new host, the turn resumes (``resume=True`` under its
    turn and message ids; a waiting approval is decided and resumed) and a next turn
    runs; every request the provider gets is valid;
(d) a tool call that started runs again, if it does, under the idempotency key it had.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import warnings
import zlib
from collections.abc import Callable
from typing import Any

import attrs
import pydantic
import pytest
import trio
import trio.testing

from actors.providers import (
    AnthropicProvider,
    GeminiProvider,
    OpenAIProvider,
    OpenAIResponsesProvider,
)
from actors.providers import anthropic as anthropic_wire
from actors.providers import gemini as gemini_wire
from actors.providers import openai as openai_wire
from actors.providers.scripted import ScriptedProvider, Sleep, current_step, tool_call
from actors.stores import open_store
from actors.stores.memory import MemoryStore
from runtime import (
    Agent,
    AlreadyDecided,
    Hooks,
    Host,
    HostClosed,
    NothingToResume,
    Overloaded,
    ReasoningChunk,
    SessionBusy,
    Summarize,
    Tool,
    ToolContext,
    UnknownApproval,
    tool,
)
from runtime.compaction import SUMMARY_INSTRUCTIONS, apply_summaries, is_summary
from runtime.events import TurnFinished
from runtime.history import INTERRUPTED, repair
from runtime.messages import AssistantMessage, TextPart, ToolCallPart, ToolMessage, UserMessage
from tests import test_provider_openai_responses as rs
from tests.support.attacks import gemini_chunk, gemini_sse
from tests.support.faults import resolve_platform
from tests.support.loopback import (
    Recorded,
    Reply,
    anthropic_end,
    anthropic_sse,
    anthropic_start,
    loopback_server,
    sse,
)
from tests.support.wire_rules import (
    anthropic_errors,
    chat_errors,
    gemini_errors,
    responses_errors,
)

SID = "cut"
TURN, MESSAGE = "T1", "M1"


@attrs.define
class Ledger:
    """The idempotency keys each tool call ran under, in order."""

    keys: dict[str, list[str]] = attrs.Factory(dict)

    def ran(self, call_id: str, key: str) -> None:
        self.keys.setdefault(call_id, []).append(key)


LEDGER = Ledger()


@tool
async def lookup(key: str, ctx: ToolContext) -> str:
    """Look a key up."""
    LEDGER.ran(ctx.tool_call_id, ctx.idempotency_key)
    await trio.sleep(1)
    return f"value-{key}"


@tool(needs_approval=True)
async def guarded(key: str, ctx: ToolContext) -> str:
    """Look a key up once a person said yes."""
    LEDGER.ran(ctx.tool_call_id, ctx.idempotency_key)
    await trio.sleep(1)
    return f"guarded-{key}"


locate = Tool.client(
    "locate",
    {"type": "object", "properties": {"key": {"type": "string"}}},
    "Locate a key (the caller runs it).",
)
"""A client-side tool: the turn waits for the caller's output (``decide(output=...)``)."""

TIMEOUT = 5.0
"""The ``approval_timeout`` of the expiring shape (virtual seconds)."""
EPOCH = 1_700_000_000.0


def trio_wall() -> float:
    """The hosts' wall clock: moves with Trio's (autojump) clock, so the expiry timer's
    deadline comes in virtual time."""
    return EPOCH + trio.current_time()


# -- the shapes -------------------------------------------------------------------------


@attrs.frozen
class Shape:
    name: str
    scripted: list[list[Any]]
    """The scripted provider's steps."""
    calls: list[tuple[str, str, str]] = attrs.Factory(list)
    """``(call id, tool, key)`` of step 1's calls (the wire replies' too)."""
    reasoning: bool = False
    error: bool = False
    then: str | None = None
    """An approval's decision followed by this new input instead of the continuation
    (the approved call runs as the new turn begins, docs/approval.md)."""
    steer: str | None = None
    """A new input steered into the turn (``on_busy="steer"``) once it streamed."""
    output: Any = None
    """The agent's ``output_type``."""
    sub: str | None = None
    """The tool ``sub`` is an agent (``as_tool``): ``plain``, or ``approvals`` (its
    ``guarded`` call's approval passes up, ``pass_approvals=True``)."""
    compact: bool = False
    """The session starts from a long history the turn summarizes first."""
    final: str = "fine"
    """The next turn's answer."""
    expire: bool = False
    """The approval is never decided: the host's expiry timer denies it (``timed out``)
    once ``approval_timeout`` passed and resumes the turn itself."""


def _calls(calls: list[tuple[str, str, str]]) -> list[Any]:
    out: list[Any] = []
    for call_id, name, key in calls:
        out += tool_call(name, {"key": key}, tool_call_id=call_id)
    return out


SHAPES = [
    Shape("text", [["Hello ", "there ", Sleep(1), "world"]]),
    Shape(
        "reasoning_tool",
        [
            [ReasoningChunk(text="let me look"), *_calls([("call_A", "lookup", "a")])],
            ["the value is a"],
        ],
        calls=[("call_A", "lookup", "a")],
        reasoning=True,
    ),
    Shape(
        "approval",
        [[*_calls([("call_G", "guarded", "g")])], ["guarded done"]],
        calls=[("call_G", "guarded", "g")],
    ),
    Shape(
        "approved_then_new_input",
        [[*_calls([("call_G", "guarded", "g")])], ["guarded done"]],
        calls=[("call_G", "guarded", "g")],
        then="more",
    ),
    Shape(
        "parallel",
        [[*_calls([("call_A", "lookup", "a"), ("call_B", "lookup", "b")])], ["both done"]],
        calls=[("call_A", "lookup", "a"), ("call_B", "lookup", "b")],
    ),
    Shape(
        "error",
        [["partial ", "answer ", Sleep(1), Overloaded("overloaded_error", provider="scripted")]],
        error=True,
    ),
]


class Weather(pydantic.BaseModel):
    """The weather in a city."""

    city: str
    temp: float


GOOD = '{"city": "Paris", "temp": 21.5}'
BAD = '{"city": "Paris", "temp": "hot"}'
SEED = [
    m
    for n in range(3)
    for m in (
        UserMessage(content=f"question {n} " + "q" * 200, id=f"u{n}"),
        AssistantMessage(content=(TextPart(text=f"answer {n} " + "a" * 400, step=0),), id=f"a{n}"),
    )
]
"""Three turns before the cut one: over the compacting shape's ``max_tokens``."""

MORE_SHAPES = [
    Shape(
        "steer",
        [[*_calls([("call_A", "lookup", "a")])], ["the value is a"]],
        calls=[("call_A", "lookup", "a")],
        steer="also",
    ),
    Shape(
        "structured",
        [[BAD[:10], BAD[10:20], Sleep(1), BAD[20:]], [GOOD[:10], GOOD[10:]]],
        output=Weather,
        final=GOOD,
    ),
    Shape(
        "sub_agent",
        [[*tool_call("sub", {"input": "task"}, tool_call_id="call_S")], ["sub done"]],
        sub="plain",
    ),
    Shape(
        "sub_agent_approvals",
        [[*tool_call("sub", {"input": "task"}, tool_call_id="call_S")], ["sub done"]],
        sub="approvals",
    ),
    Shape(
        "compaction",
        [[*_calls([("call_A", "lookup", "a")])], ["the value is a"]],
        calls=[("call_A", "lookup", "a")],
        compact=True,
    ),
]


RESUME_SHAPES = [
    Shape(
        "expired_approval",
        [[*_calls([("call_G", "guarded", "g")])], ["guarded done"]],
        calls=[("call_G", "guarded", "g")],
        expire=True,
    ),
    Shape(
        "client_tool",
        [[*_calls([("call_C", "locate", "c")])], ["located"]],
        calls=[("call_C", "locate", "c")],
    ),
]
"""Turns resumed otherwise than by a person's approval: by the host's expiry timer, and by
a client tool's output."""


def _last_user_text(messages: Any) -> str:
    for m in reversed(messages):
        if type(m) is UserMessage:
            return m.text
    return ""


# -- the providers: scripted, and the wire replies of OpenAI and Anthropic ---------------


def scripted_provider(shape: Shape) -> ScriptedProvider:
    def respond(request: Any) -> list[Any]:
        if request.instructions == SUMMARY_INSTRUCTIONS:
            return ["summary ", "of before"]
        last = _last_user_text(request.messages)
        if last in ("next", "more"):
            return [shape.final]
        if last == "also":  # (steered in: the answer to both)
            return ["answer ", "to both"]
        if last == "task":  # the sub-agent's turn
            step = current_step(request.messages)
            if step == 0:
                name = "guarded" if shape.sub == "approvals" else "lookup"
                return [*tool_call(name, {"key": "s"}, tool_call_id="call_T")]
            return ["sub answer"]
        steps = shape.scripted
        return steps[min(current_step(request.messages), len(steps) - 1)]

    return ScriptedProvider(responder=respond, burst=1)


def _oa(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _oa_usage() -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def openai_reply(shape: Shape, step: int, final: bool) -> Reply:
    if final:
        return Reply(body=sse(_oa({"role": "assistant", "content": "fine"}), _oa({}, "stop")))
    if shape.error:
        error = {"error": {"message": "Overloaded", "type": "server_error", "code": None}}
        body = sse(
            _oa({"role": "assistant", "content": "partial "}),
            _oa({"content": "answer "}),
            error,
            done=False,
        )
        return Reply(body=body, write_events=True)
    if step == 0 and shape.calls:
        events: list[Any] = [_oa({"role": "assistant", "content": ""})]
        if shape.reasoning:
            events.append(_oa({"reasoning_content": "let me look"}))
        for i, (call_id, name, key) in enumerate(shape.calls):
            args = json.dumps({"key": key})
            head = {"index": i, "id": call_id, "type": "function"}
            events.append(
                _oa({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]})
            )
            events.append(_oa({"tool_calls": [{"index": i, "function": {"arguments": args}}]}))
        events += [_oa({}, "tool_calls"), _oa_usage()]
        return Reply(body=sse(*events), write_events=True)
    text = shape.scripted[-1][0] if shape.calls else "Hello there world"
    body = sse(
        _oa({"role": "assistant", "content": text[:5]}),
        _oa({"content": text[5:]}),
        _oa({}, "stop"),
        _oa_usage(),
    )
    return Reply(body=body, write_events=True)


def _start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def _text_blocks(index: int, text: str) -> list[dict[str, Any]]:
    return [
        _start(index, {"type": "text", "text": ""}),
        _delta(index, {"type": "text_delta", "text": text[:5]}),
        _delta(index, {"type": "text_delta", "text": text[5:]}),
        _stop(index),
    ]


def anthropic_reply(shape: Shape, step: int, final: bool) -> Reply:
    if final:
        events = [anthropic_start(), *_text_blocks(0, "fine"), *anthropic_end("end_turn")]
        return Reply(body=anthropic_sse(*events), write_events=True)
    if shape.error:
        error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        events = [anthropic_start(), *_text_blocks(0, "partial answer ")[:-1], error]
        return Reply(body=anthropic_sse(*events), write_events=True)
    if step == 0 and shape.calls:
        events = [anthropic_start()]
        index = 0
        if shape.reasoning:
            events += [
                _start(0, {"type": "thinking", "thinking": ""}),
                _delta(0, {"type": "thinking_delta", "thinking": "let me look"}),
                _delta(0, {"type": "signature_delta", "signature": "c2ln"}),
                _stop(0),
            ]
            index = 1
        for call_id, name, key in shape.calls:
            args = json.dumps({"key": key})
            events += [
                _start(index, {"type": "tool_use", "id": call_id, "name": name, "input": {}}),
                _delta(index, {"type": "input_json_delta", "partial_json": args[:4]}),
                _delta(index, {"type": "input_json_delta", "partial_json": args[4:]}),
                _stop(index),
            ]
            index += 1
        events += anthropic_end("tool_use")
        return Reply(body=anthropic_sse(*events), write_events=True)
    text = shape.scripted[-1][0] if shape.calls else "Hello there world"
    events = [anthropic_start(), *_text_blocks(0, text), *anthropic_end("end_turn")]
    return Reply(body=anthropic_sse(*events), write_events=True)


def gemini_reply(shape: Shape, step: int, final: bool) -> Reply:
    if final:
        return Reply(body=gemini_sse(gemini_chunk([{"text": "fine"}], "STOP")), write_events=True)
    if shape.error:  # (an overloaded model's error event after part of the answer)
        error = {"error": {"code": 503, "message": "The model is overloaded.", "status": "X"}}
        chunks = [gemini_chunk([{"text": "partial "}]), gemini_chunk([{"text": "answer "}])]
        return Reply(body=gemini_sse(*chunks, error), write_events=True)
    if step == 0 and shape.calls:
        chunks = (
            [gemini_chunk([{"text": "let me look", "thought": True}])] if shape.reasoning else []
        )
        calls = [
            {"functionCall": {"id": call_id, "name": name, "args": {"key": key}}}
            for call_id, name, key in shape.calls
        ]
        chunks += [gemini_chunk(calls[:1]), gemini_chunk(calls[1:], "STOP")]
        return Reply(body=gemini_sse(*chunks), write_events=True)
    text = shape.scripted[-1][0] if shape.calls else "Hello there world"
    chunks = [gemini_chunk([{"text": text[:5]}]), gemini_chunk([{"text": text[5:]}], "STOP")]
    return Reply(body=gemini_sse(*chunks), write_events=True)


def responses_reply(shape: Shape, step: int, final: bool) -> Reply:
    if final:
        events = [rs.created(), *rs.message(0, "msg_f", "fine"), rs.completed()]
        return Reply(body=rs.body(*events), write_events=True)
    if shape.error:  # (the server's error event after part of the answer)
        added, delta, _ = rs.message(0, "msg_e", "partial answer ")
        error = {"type": "error", "code": "server_error", "message": "overloaded", "param": None}
        return Reply(body=rs.body(rs.created(), added, delta, error), write_events=True)
    if step == 0 and shape.calls:
        events = [rs.created()]
        for i, (call_id, name, key) in enumerate(shape.calls):
            events += rs.call(i, f"fc_{call_id}", call_id, json.dumps({"key": key}), name=name)
        events.append(rs.completed())
        return Reply(body=rs.body(*events), write_events=True)
    text = shape.scripted[-1][0] if shape.calls else "Hello there world"
    events = [rs.created(), *rs.message(0, f"msg_{step}", text), rs.completed()]
    return Reply(body=rs.body(*events), write_events=True)


def _snake(contents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The wire's camelCase part keys as the wire rules name them (``function_call``)."""

    def key(k: str) -> str:
        return "".join(f"_{c.lower()}" if c.isupper() else c for c in k)

    return [
        {**c, "parts": [{key(k): v for k, v in p.items()} for p in c["parts"]]} for c in contents
    ]


def _gemini_step(contents: list[dict[str, Any]]) -> tuple[int, bool]:
    users = [
        i
        for i, c in enumerate(contents)
        if c["role"] == "user" and any("text" in p for p in c["parts"])
    ]
    last = users[-1] if users else 0
    text = [p["text"] for p in contents[last]["parts"] if "text" in p][-1]
    steps = sum(1 for c in contents[last + 1 :] if c["role"] == "model")
    return steps, text in ("next", "more")


def _responses_step(items: list[dict[str, Any]]) -> tuple[int, bool]:
    users = [i for i, it in enumerate(items) if it.get("role") == "user"]
    last = users[-1] if users else 0
    content = items[last].get("content")
    if isinstance(content, list):
        content = [c.get("text", "") for c in content][-1] if content else ""
    after = items[last + 1 :]
    return int(any(it.get("type") == "function_call_output" for it in after)), content in (
        "next",
        "more",
    )


def _wire_step(messages: list[dict[str, Any]], kind: str) -> tuple[int, bool]:
    """How many model calls the request's current turn made, and whether it is the next
    turn's (its last user input ``next``)."""
    last_user = max(
        (i for i, m in enumerate(messages) if m["role"] == "user" and _user_text(m, kind)),
        default=0,
    )
    text = _user_text(messages[last_user], kind)
    after = messages[last_user + 1 :]
    return sum(1 for m in after if m["role"] == "assistant"), text in ("next", "more")


def _user_text(message: dict[str, Any], kind: str) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content if message["role"] == "user" else ""
    if isinstance(content, list):
        texts = [b.get("text", "") for b in content if b.get("type") == "text"]
        return texts[-1] if texts else ""  # (an input cut before its answer is merged)
    return ""


def wire_responder(shape: Shape, kind: str) -> Callable[[Recorded], Reply]:
    def respond(request: Recorded) -> Reply:
        body = request.json()
        if kind == "gemini":
            return gemini_reply(shape, *_gemini_step(body["contents"]))
        if kind == "responses":
            return responses_reply(shape, *_responses_step(body["input"]))
        step, final = _wire_step(body["messages"], kind)
        if kind == "openai":
            return openai_reply(shape, step, final)
        return anthropic_reply(shape, step, final)

    return respond


# -- the cut ---------------------------------------------------------------------------


class Cutter(trio.abc.Instrument):
    """Counts task steps; after the ``at``-th, calls ``fire`` once."""

    def __init__(self, at: int | None, fire: Callable[[], bool]) -> None:
        self.at = at
        self.fire = fire
        self.steps = 0
        self.fired_at: int | None = None

    def after_task_step(self, task: Any) -> None:
        self.steps += 1
        if self.fired_at is None and self.at is not None and self.steps >= self.at:
            if self.fire():
                self.fired_at = self.steps


def _tasks() -> set[Any]:
    out: set[Any] = set()
    todo = [trio.lowlevel.current_root_task()]
    while todo:
        task = todo.pop()
        out.add(task)
        for nursery in task.child_nurseries:
            todo.extend(nursery.child_tasks)
    return out


@attrs.define
class Outcome:
    total: int
    fired_at: int | None
    escaped: list[BaseException]
    leaked: list[str]
    noise: list[str]


class Run:
    """One shape on one provider and one store, cut one way."""

    def __init__(self, shape: Shape, provider: str, store: str, how: str, tmp: Any) -> None:
        self.shape, self.provider_kind, self.store_kind, self.how = shape, provider, store, how
        self.tmp = tmp
        self.name = f"{shape.name}/{provider}/{store}/{how}"

    pg_url = ""

    def store(self) -> Any:
        if self.store_kind == "memory":
            return self._memory
        if self.store_kind == "postgres":
            return self.pg_url
        return str(self.tmp / "cut.db")

    def agent(self, server: Any) -> Agent:
        tools: list[Any] = [lookup, guarded]
        if any(name == "locate" for _, name, _ in self.shape.calls):
            tools.append(locate)  # (not to a sub-agent passing approvals up: refused)
        if self.provider_kind == "scripted":
            shape = self.shape
            provider = scripted_provider(shape)
            if shape.sub:
                sub = Agent(name="sub", provider=provider, tools=tools)
                tools = [*tools, sub.as_tool(pass_approvals=shape.sub == "approvals")]
            return Agent(
                provider=provider,
                tools=tools,
                output_type=shape.output,
                on_busy="steer" if shape.steer else "reject",
                history_processors=[Summarize(max_tokens=200, keep_turns=1)]
                if shape.compact
                else [],
                approval_timeout=TIMEOUT if shape.expire else None,
            )
        if self.provider_kind == "openai":
            provider: Any = OpenAIProvider("m", base_url=server.url + "/v1", api_key="t")
        elif self.provider_kind == "responses":
            provider = OpenAIResponsesProvider("m", base_url=server.url + "/v1", api_key="t")
        elif self.provider_kind == "gemini":
            provider = GeminiProvider("gemini-2.5-flash", base_url=server.url, api_key="t")
        else:
            provider = AnthropicProvider("m", base_url=server.url, api_key="t")
        if self.provider_kind != "gemini":  # (its client is plain httpx)
            resolve_platform(provider)  # (not in a worker thread: the clock jumps past it)
        return Agent(provider=provider, tools=[lookup, guarded])

    @contextlib.asynccontextmanager
    async def host(self) -> Any:
        """A host on the run's store, its wall clock Trio's (the expiry timer's deadline)."""
        async with Host.open(store=self.store(), log_tap=False) as host:
            host.clock = trio_wall
            yield host

    async def turn(self, session: Any, holder: dict[str, Any]) -> None:
        """The turn: the stream, and for an approval the decision and its continuation."""
        steering = trio.open_nursery() if self.shape.steer else contextlib.nullcontext(None)
        try:
            async with steering as nursery:
                async with session.stream("go", turn_id=TURN, message_id=MESSAGE) as out:
                    holder["out"] = out
                    async for _ in out:
                        if nursery is not None and not holder.get("steered"):
                            holder["steered"] = True
                            nursery.start_soon(self.steer, session, holder)
        except BaseExceptionGroup as group:  # (the steering nursery's: what the stream raised)
            (one,) = group.exceptions if len(group.exceptions) == 1 else (group,)
            if isinstance(one, BaseExceptionGroup | trio.Cancelled):
                raise
            raise one from None
        holder["out"] = None
        holder["results"].append(out.result)
        if session.pending and self.shape.expire:
            await _expired_and_resumed(session)
            return
        if session.pending:
            await _answer(session)
            then = session.stream(self.shape.then) if self.shape.then else session.resume()
            async with then as again:
                holder["out"] = again
                async for _ in again:
                    pass
            holder["out"] = None
            holder["results"].append(again.result)

    async def steer(self, session: Any, holder: dict[str, Any]) -> None:
        try:
            async with session.stream(self.shape.steer) as out:
                async for _ in out:
                    pass
        except (HostClosed, SessionBusy):
            return  # queued, or sent, as the host closed: documented
        if not out.steered:  # (the turn had ended: a turn of its own)
            holder["results"].append(out.result)

    async def open(self, host: Host, agent: Agent) -> Any:
        """The session, from the seed history for the compacting shape."""
        seed = SEED if self.shape.compact else None
        return await host.open_session(agent, session_id=SID, history=seed)

    async def cut(self, server: Any, at: int | None) -> Outcome:
        """Run the turn, cut after ``at`` task steps (``None``: never)."""
        holder: dict[str, Any] = {"out": None, "results": []}
        escaped: list[BaseException] = []
        before = _tasks()
        scope = trio.CancelScope()
        closing = trio.Event()

        def fire() -> bool:
            if self.how == "scope":
                scope.cancel()
                return True
            if self.how == "stop":
                out = holder["out"]
                if out is None and self.shape.expire and holder.get("session") is not None:
                    out = holder["session"].current  # (the expiry timer's continuation)
                if out is None:
                    return False  # no stream to stop just now: at the next step
                out.cancel("stop")
                return True
            closing.set()
            return True

        agent = self.agent(server)
        unraised: list[str] = []
        old_hook = sys.unraisablehook
        sys.unraisablehook = lambda u: unraised.append(f"{u.exc_type.__name__}: {u.exc_value}")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                cutter = Cutter(at, fire)
                if self.how == "host":
                    await self._cut_by_host(agent, holder, cutter, closing, escaped)
                elif self.how == "interrupt":
                    await self._cut_by_input(agent, holder, cutter, closing, escaped)
                else:
                    async with self.host() as host:
                        session = await self.open(host, agent)
                        holder["session"] = session
                        trio.lowlevel.add_instrument(cutter)
                        try:
                            with scope:
                                await self.turn(session, holder)
                        except BaseException as e:  # what escapes is the finding
                            escaped.append(e)
                        finally:
                            trio.lowlevel.remove_instrument(cutter)
                        if self.shape.expire:  # (the timer's continuation is not the
                            await _idle(session)  # caller's: its scope leaves it running)
                        escaped += await _as_stored(host, session)
                gc.collect()
        finally:
            sys.unraisablehook = old_hook
        leaked = sorted(t.name for t in _tasks() - before)
        noise = unraised + [f"{w.category.__name__}: {w.message}" for w in caught]
        for result in holder["results"]:
            if result is None:
                escaped.append(AssertionError("a stream ended with no result"))
            elif result.error is not None and not (self.shape.error and result.error.retryable):
                escaped.append(AssertionError(f"a stream ended {result.error}"))
        return Outcome(cutter.steps, cutter.fired_at, escaped, leaked, noise)

    async def _cut_by_host(
        self,
        agent: Agent,
        holder: dict[str, Any],
        cutter: Cutter,
        closing: trio.Event,
        escaped: list[BaseException],
    ) -> None:
        done = trio.Event()

        async def caller(session: Any) -> None:
            try:
                await self.turn(session, holder)
            except HostClosed:
                pass  # a decision after the host closed: documented
            except BaseException as e:  # what escapes is the finding
                escaped.append(e)
            finally:
                done.set()
                closing.set()

        async with trio.open_nursery() as nursery:
            async with self.host() as host:
                session = await self.open(host, agent)
                trio.lowlevel.add_instrument(cutter)
                try:
                    nursery.start_soon(caller, session)
                    await closing.wait()
                finally:
                    trio.lowlevel.remove_instrument(cutter)
            with trio.fail_after(60):
                await done.wait()

    async def _cut_by_input(
        self,
        agent: Agent,
        holder: dict[str, Any],
        cutter: Cutter,
        arrived: trio.Event,
        escaped: list[BaseException],
    ) -> None:
        """The cut is a new input with the ``interrupt`` busy strategy (a new input after
        the turn ended, if the turn ended first)."""

        async def first(session: Any) -> None:
            try:
                await self.turn(session, holder)
            except (SessionBusy, UnknownApproval, AlreadyDecided, NothingToResume):
                pass  # the new input came between the wait and its decision: documented
            except BaseException as e:  # what escapes is the finding
                escaped.append(e)
            finally:
                arrived.set()

        async def second(session: Any) -> None:
            await arrived.wait()
            try:
                async with session.stream("next", on_busy="interrupt") as out:
                    async for _ in out:
                        pass
                holder["results"].append(out.result)
            except BaseException as e:  # what escapes is the finding
                escaped.append(e)

        async with self.host() as host:
            session = await self.open(host, agent)
            trio.lowlevel.add_instrument(cutter)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(first, session)
                    nursery.start_soon(second, session)
            finally:
                trio.lowlevel.remove_instrument(cutter)
            escaped += await _as_stored(host, session)

    async def after(self, server: Any) -> list[str]:
        """(b), (c), (d) on the store the cut left: what is wrong, one a line."""
        bad: list[str] = []
        async with self.host() as host:
            record = await host.store.load(SID)
            bad += [f"after the cut: {b}" for b in well_formed(record.messages if record else ())]
            keys_before = {k: list(v) for k, v in LEDGER.keys.items()}
            agent = self.agent(server)
            session = await host.open_session(agent, session_id=SID)
            with trio.fail_after(600):
                if session.pending and self.shape.expire:
                    await _expired_and_resumed(session)
                elif session.pending:
                    await _answer(session)
                    async with session.resume() as out:
                        async for _ in out:
                            pass
                elif record is not None and any(
                    m.id == MESSAGE for m in record.messages[-2:]
                ):  # (a turn an input interrupted stays as it is: the input answered it)
                    async with session.stream(
                        "go", resume=True, turn_id=TURN, message_id=MESSAGE
                    ) as out:
                        async for _ in out:
                            pass
                record = await host.store.load(SID)
                stored = record.messages if record else ()
                bad += [f"after resuming: {b}" for b in well_formed(stored)]
                for call_id, keys in LEDGER.keys.items():
                    if len(set(keys)) != 1:
                        bad.append(f"{call_id} ran under keys {keys} (before: {keys_before})")
                result = await session.run("next")
                if result.text != self.shape.final:
                    bad.append(f"the next turn ended {result.finish_reason}: {result.text!r}")
            record = await host.store.load(SID)
            bad += [f"after the next turn: {b}" for b in well_formed(record.messages)]
            bad += self.requests_errors(agent, server)
        return bad

    def requests_errors(self, agent: Agent, server: Any) -> list[str]:
        bad: list[str] = []
        if self.provider_kind == "scripted":
            for request in agent.provider.requests:
                bad += [f"request: {b}" for b in wire_errors(request.messages)]
        else:
            for recorded in server.requests:
                body = recorded.json()
                if self.provider_kind == "openai":
                    errors = chat_errors(body["messages"])
                elif self.provider_kind == "gemini":
                    errors = gemini_errors(_snake(body["contents"]))
                elif self.provider_kind == "responses":
                    errors = responses_errors(body["input"])
                else:
                    errors = anthropic_errors(body["messages"])
                bad += [f"{self.provider_kind} request: {e}" for e in errors]
        return bad

    async def one(self, at: int | None) -> tuple[Outcome, list[str]]:
        LEDGER.keys.clear()
        self._memory = MemoryStore()
        if self.store_kind == "sqlite":
            (self.tmp / "cut.db").unlink(missing_ok=True)
        if self.store_kind == "postgres":
            store = await open_store(self.pg_url)
            try:
                await store.delete(SID)
            finally:
                await store.aclose()
        if self.provider_kind == "scripted":
            outcome = await self.cut(None, at)
            return outcome, await self.after(None)
        respond = wire_responder(self.shape, self.provider_kind)
        async with loopback_server(respond=respond) as server:
            outcome = await self.cut(server, at)
            server.requests.clear()
            return outcome, await self.after(server)


async def _answer(session: Any) -> None:
    """Approve each waiting call; a client tool's, its output."""
    for call in session.pending:
        if call.kind == "client":
            await session.decide(call.approval_id, output=f"at {call.input['key']}")
        else:
            await session.decide(call.approval_id, approved=True)


async def _expired_and_resumed(session: Any) -> None:
    """Wait (virtual time) until the host's expiry timer denied the waiting calls and a
    turn ended after it: its continuation, or a new input that superseded the wait.
    ``HostClosed`` if the host closes first."""
    host = session.host
    finished = host.bus.subscribe([TurnFinished], session_id=SID, name="expiry-wait")
    try:
        with trio.fail_after(600):
            while not len(finished.inbox):
                if host.shutting_down:
                    raise HostClosed("the host closed while the wait expired")
                await trio.sleep(0.5)
    finally:
        finished.close()


async def _idle(session: Any) -> None:
    """Wait until the session is idle and nothing is about to make it busy: the expiry
    timer records its denial, then starts the continuation as a task of the host's,
    and a check between the two found the session idle while the continuation was one
    scheduling step from appending the denied call's result (CI, seed-dependent)."""
    with trio.fail_after(600):
        while True:
            await trio.testing.wait_all_tasks_blocked()
            if not session.busy:
                return
            await trio.sleep(0.5)


async def _as_stored(host: Host, session: Any) -> list[BaseException]:
    """What is wrong with the session in memory once its turn was cut: still busy, or
    a history other than the store's."""
    bad: list[BaseException] = []
    if session.busy:
        bad.append(AssertionError("the session is still busy"))
    record = await host.store.load(SID)
    stored = record.messages if record is not None else ()
    # A decision is recorded in the store alone (the history in memory shows it after
    # the next load, docs/approval.md): a ``decide`` cut after its save leaves it so.
    if _undecided(stored) != _undecided(session.messages):
        bad.append(AssertionError(f"in memory {session.messages}, stored {stored}"))
    return bad


def _taken_back(awaiting: Any) -> Any:
    """A wait's decision taken back: a person's, the expiry timer's (its reason), a
    client tool's (its output or error)."""
    return attrs.evolve(
        awaiting, decided=False, approved=None, reason=None, output=None, error=None
    )


def _undecided(messages: Any) -> list[Any]:
    """``messages`` with every waiting call's decision taken back."""
    out: list[Any] = []
    for m in messages:
        if isinstance(m, AssistantMessage):
            content = tuple(
                attrs.evolve(p, awaiting=_taken_back(p.awaiting))
                if isinstance(p, ToolCallPart) and p.awaiting is not None
                else p
                for p in m.content
            )
            m = attrs.evolve(m, content=content)
        out.append(m)
    return out


def wire_errors(messages: Any) -> list[str]:
    """The rules the three providers' requests built from ``messages`` break."""
    history = repair(apply_summaries(messages))
    bad = chat_errors(openai_wire.map_messages(None, history))
    _, anthropic = anthropic_wire.map_messages(None, history)
    bad += anthropic_errors(anthropic)
    _, gemini = gemini_wire.map_messages(None, history)
    bad += gemini_errors(gemini)
    return bad


def well_formed(messages: Any) -> list[str]:
    """One assistant message per user input (or none, for an input cut before it was
    answered), every tool call one result or a wait for a decision, every provider's
    request built from it valid."""
    bad: list[str] = []
    groups: list[list[Any]] = []
    for m in messages:
        if is_summary(m):
            continue  # (stored before the user message of the turn that made it)
        if isinstance(m, UserMessage):
            groups.append([m])
        elif not groups:
            bad.append(f"a {m.role} message before any user message")
        else:
            groups[-1].append(m)
    for g, group in enumerate(groups):
        assistants = [m for m in group if isinstance(m, AssistantMessage)]
        if len(assistants) > 1:
            bad.append(f"input {g}: {len(assistants)} assistant messages")
            continue
        if not assistants:
            if len(group) > 1 or g != len(groups) - 1:
                bad.append(f"input {g}: no assistant message: {[m.role for m in group]}")
            continue
        results: dict[tuple[str, int], int] = {}
        for m in group:
            if isinstance(m, ToolMessage):
                results[(m.tool_call_id, m.step)] = results.get((m.tool_call_id, m.step), 0) + 1
        for p in assistants[0].content:
            if not isinstance(p, ToolCallPart):
                continue
            n = results.pop((p.tool_call_id, p.step), 0)
            # waiting for a decision, or decided with its continuation never come (it
            # runs as the next turn begins, docs/approval.md): the last input's only
            waiting = p.awaiting is not None and g == len(groups) - 1
            if n == 0 and not waiting:
                bad.append(f"input {g}: call {p.tool_call_id} has no result ({p.awaiting})")
            elif n > 1:
                bad.append(f"input {g}: call {p.tool_call_id} has {n} results")
        if results:
            bad.append(f"input {g}: results with no call: {sorted(results)}")
    bad += wire_errors([*messages, UserMessage(content="next")])
    return bad


# -- the tests ------------------------------------------------------------------------------


EVERY = bool(os.environ.get("AXON_CANCEL_EVERY"))
"""By hand, ``AXON_CANCEL_EVERY=1``: a cut after every step of every sweep, and the real
clients cut all four ways (some fifteen times the turns of an ordinary run)."""
SAMPLES = {"scripted": 4, "openai": 3, "anthropic": 3, "gemini": 2, "responses": 2}
"""Cuts per sweep in an ordinary run."""


def _ns(total: int, samples: int, name: str) -> list[int]:
    """The step counts to cut after: a stride over ``0..total``, each sweep starting at
    its own offset (``zlib.crc32`` of its name), so the sweeps of a shape cut it at
    different steps; every one of them when :data:`EVERY`."""
    if EVERY:
        return list(range(total + 1))
    stride = max(1, total // samples)
    return list(range(zlib.crc32(name.encode()) % stride, total + 1, stride))


async def _sweep(run: Run) -> dict[str, Any]:
    whole, problems = await run.one(None)
    assert not problems and not whole.escaped and not whole.leaked, (whole, problems)
    failures: list[str] = []
    ns = _ns(whole.total, SAMPLES[run.provider_kind], run.name)
    for n in ns:
        outcome, bad = await run.one(n)
        where = f"{run.name} at {n}/{whole.total}"
        if outcome.escaped:
            failures.append(f"{where}: escaped {outcome.escaped!r}")
        if outcome.leaked:
            failures.append(f"{where}: tasks left {outcome.leaked}")
        if outcome.noise:
            failures.append(f"{where}: {outcome.noise}")
        failures += [f"{where}: {b}" for b in bad]
    print(f"{run.name}: {whole.total} steps, N in {ns}")
    assert not failures, "\n".join(failures)
    return {"total": whole.total, "ns": len(ns)}


HOWS = ["scope", "stop", "host", "interrupt"]


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
@pytest.mark.parametrize("store", ["sqlite", "memory"])
async def test_a_scripted_turn_cut_at_any_step_loses_nothing(
    store: str, shape: Shape, how: str, tmp_path: Any, autojump_clock: Any
) -> None:
    await _sweep(Run(shape, "scripted", store, how, tmp_path))


@pytest.mark.parametrize("how", HOWS if EVERY else ["scope", "host"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_real_clients_turn_cut_at_any_step_loses_nothing_on_sqlite(
    provider: str, shape: Shape, how: str, tmp_path: Any, autojump_clock: Any
) -> None:
    await _sweep(Run(shape, provider, "sqlite", how, tmp_path))


def _sampled(cases: list[tuple[Any, ...]], key: Any, every: int) -> list[Any]:
    """The cases an ordinary run keeps: each whose ``zlib.crc32`` of ``key(*case)`` is a
    multiple of ``every`` (all of them with ``AXON_CANCEL_EVERY``). Sampled out cases are
    not collected at all, rather than collected and skipped: the run's skips stay the
    ones that say something is missing."""
    kept = [c for c in cases if EVERY or zlib.crc32(key(*c).encode()) % every == 0]
    return [pytest.param(*c, id="-".join(getattr(v, "name", v) for v in c)) for c in kept]


@pytest.mark.parametrize(
    ("store", "shape", "how"),
    _sampled(
        [(st, sh, h) for st in ["sqlite", "memory"] for sh in MORE_SHAPES for h in HOWS],
        lambda st, sh, h: f"{sh.name}/{st}/{h}",
        3,
    ),
)
async def test_a_steered_structured_delegating_or_compacting_turn_cut_loses_nothing(
    store: str, shape: Shape, how: str, tmp_path: Any, autojump_clock: Any
) -> None:
    await _sweep(Run(shape, "scripted", store, how, tmp_path))


@pytest.mark.parametrize(
    ("store", "shape", "how"),
    _sampled(
        [(st, sh, h) for st in ["sqlite", "memory"] for sh in RESUME_SHAPES for h in HOWS],
        lambda st, sh, h: f"{sh.name}/{st}/{h}",
        3,
    ),
)
async def test_a_turn_resumed_by_the_expiry_timer_or_a_client_tools_output_cut_loses_nothing(
    store: str, shape: Shape, how: str, tmp_path: Any, autojump_clock: Any
) -> None:
    await _sweep(Run(shape, "scripted", store, how, tmp_path))


@pytest.mark.parametrize(
    ("provider", "shape", "how"),
    _sampled(
        [(p, sh, h) for p in ["gemini", "responses"] for sh in SHAPES for h in HOWS],
        lambda p, sh, h: f"{p}/{sh.name}/{h}",
        7,
    ),
)
async def test_a_gemini_or_responses_turn_cut_at_any_step_loses_nothing_on_sqlite(
    provider: str, shape: Shape, how: str, tmp_path: Any, autojump_clock: Any
) -> None:
    await _sweep(Run(shape, provider, "sqlite", how, tmp_path))


@pytest.fixture
def idle_jump_clock() -> trio.testing.MockClock:
    """Virtual time that jumps once the loop is idle for a while of real time: the
    store's queries (real IO) finish first, a deadline is not jumped to meanwhile."""
    return trio.testing.MockClock(autojump_threshold=0.25)


@pytest.mark.parametrize(
    ("shape", "how"),
    [
        pytest.param(sh, h, id=f"{sh.name}-{h}")
        for i, sh in enumerate(SHAPES)
        for j, h in enumerate(HOWS)
        if EVERY or (i + j) % len(HOWS) == 0  # (each shape one way, each way in turn)
    ],
)
async def test_a_turn_cut_at_any_step_loses_nothing_on_postgresql(
    shape: Shape, how: str, pg_url: str, tmp_path: Any, idle_jump_clock: Any
) -> None:
    run = Run(shape, "scripted", "postgres", how, tmp_path)
    run.pg_url = pg_url
    await _sweep(run)


# -- regressions found by the sweep ---------------------------------------------------------


class _HeldVersion(MemoryStore):
    """A memory store whose version query waits, once armed, until ``release`` is set:
    the continuation's read of its decision, held while the host closes."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.reached = trio.Event()
        self.release = trio.Event()

    async def version(self, session_id: str) -> int:
        found = await super().version(session_id)
        if self.armed:
            self.reached.set()
            await self.release.wait()
        return found


async def test_a_continuation_entering_as_the_host_closes_is_refused_not_crashed(
    autojump_clock: Any,
) -> None:
    """A continuation whose read of its decision outlasted the start of the host's
    shutdown started its turn on the session's stopped actors: the turn runner crashed
    (``ClosedResourceError``) and the stream ended ``error``, or with no result at all.
    It is refused as a closed
    host's new work is (``HostClosed``), the approved call left for the next turn."""
    LEDGER.keys.clear()
    store = _HeldVersion()
    shape = next(s for s in SHAPES if s.name == "approval")
    got: list[Any] = []

    async def continuation(session: Any) -> None:
        try:
            async with session.resume() as out:
                async for _ in out:
                    pass
            got.append(out.result)
        except HostClosed as e:
            got.append(e)

    async with trio.open_nursery() as nursery:
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(
                Agent(provider=scripted_provider(shape), tools=[guarded]), session_id=SID
            )
            async with session.stream("go") as out:
                async for _ in out:
                    pass
            (call,) = session.pending
            await session.decide(call.approval_id, approved=True)
            store.armed = True
            nursery.start_soon(continuation, session)
            await store.reached.wait()

            async def release_once_stopped() -> None:
                (controller,) = [a for a in session.actors if a.name == "stream-controller"]
                await controller.stopped.wait()
                store.release.set()

            nursery.start_soon(release_once_stopped)
    (outcome,) = got
    assert isinstance(outcome, HostClosed), outcome
    assert LEDGER.keys == {}
    async with Host.open(store=store, log_tap=False) as host:
        store.armed = False
        session = await host.open_session(
            Agent(provider=scripted_provider(shape), tools=[guarded]), session_id=SID
        )
        result = await session.run("next")
    assert result.text == "fine"
    assert list(LEDGER.keys) == ["call_G"]  # the approved call ran as the next turn began


async def test_a_new_input_cut_before_it_ran_the_approved_call_stores_it_interrupted(
    autojump_clock: Any,
) -> None:
    """A new input runs the call a person approved in the turn it supersedes before its
    model call; cut before it ran it (in its start: here its ``on_turn_start`` hook),
    the turn stored its user message after the approved call with no result at all,
    which no later turn ran or answered. It gets the ``interrupted`` result, as a call
    cut while it runs does, and the call never runs."""
    LEDGER.keys.clear()
    holding = trio.Event()
    hold = {"on": False}

    async def on_turn_start(event: Any) -> None:
        if hold["on"]:
            holding.set()
            await trio.sleep_forever()

    shape = next(s for s in SHAPES if s.name == "approved_then_new_input")
    agent = Agent(
        provider=scripted_provider(shape), tools=[guarded], hooks=Hooks(on_turn_start=on_turn_start)
    )
    store = MemoryStore()
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id=SID)
        assert (await session.run("go")).finish_reason == "awaiting-input"
        (call,) = session.pending
        await session.decide(call.approval_id, approved=True)
        hold["on"] = True
        async with trio.open_nursery() as nursery, session.stream("more") as out:

            async def stop() -> None:
                await holding.wait()
                out.cancel("stop")

            nursery.start_soon(stop)
            async for _ in out:
                pass
        hold["on"] = False
        assert out.result.finish_reason == "aborted"
        record = await store.load(SID)
        result = await session.run("next")
    assert [m.role for m in record.messages] == ["user", "assistant", "tool", "user", "assistant"]
    answer = record.messages[2]
    assert answer.tool_call_id == "call_G" and answer.error == INTERRUPTED
    assert well_formed(record.messages) == []
    assert result.text == "fine" and LEDGER.keys == {}  # never run, then or later


async def test_a_structured_turn_resumed_after_its_retry_step_was_cut_asks_again_cleanly(
    autojump_clock: Any,
) -> None:
    """A structured turn cut while the model retried a rejected answer, then resumed:
    its committed steps read as finished (the rejected answer has no tool call), so the
    history kept the cut step's partial text, and the retry request ended with it (an
    assistant prefill, after the feedback) instead of the feedback. The cut step is
    dropped as it is from any turn taken over; the model is asked again."""
    retry_asked = trio.Event()

    def respond(request: Any) -> list[Any]:
        if current_step(request.messages) == 0:
            return [BAD]
        retry_asked.set()
        return [GOOD[:10], Sleep(1), GOOD[10:]]

    def agent() -> Agent:
        return Agent(provider=ScriptedProvider(responder=respond, burst=1), output_type=Weather)

    store = MemoryStore()
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent(), session_id=SID)
        async with trio.open_nursery() as nursery, session.stream("go", message_id=MESSAGE) as out:

            async def stop() -> None:
                await retry_asked.wait()
                await trio.sleep(0.5)  # (the retry's first piece streamed)
                out.cancel("stop")

            nursery.start_soon(stop)
            async for _ in out:
                pass
    record = await store.load(SID)
    assert [p.step for p in record.messages[-1].content] == [0, 1]  # the cut step's text
    resumed = agent()
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(resumed, session_id=SID)
        async with session.stream("go", resume=True, message_id=MESSAGE) as again:
            async for _ in again:
                pass
    (request,) = resumed.provider.requests
    assert [type(m).__name__ for m in request.messages] == [
        "UserMessage",
        "AssistantMessage",
        "RetryPrompt",
    ]
    assert again.result.output == Weather(city="Paris", temp=21.5)
    assert wire_errors(request.messages) == []


class _HeldLoad(MemoryStore):
    """A memory store whose first load, once armed, of a session whose wait was decided
    waits until ``release`` is set, shielded (as a SQLite store's query in its thread
    goes on when cancelled): the expiry timer's read of the session it just expired,
    held until the host has closed."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.reached = trio.Event()
        self.release = trio.Event()

    async def load(self, session_id: str) -> Any:
        found = await super().load(session_id)
        decided = found is not None and any(
            p.awaiting.decided
            for m in found.messages
            if isinstance(m, AssistantMessage)
            for p in m.content
            if isinstance(p, ToolCallPart) and p.awaiting is not None
        )
        if self.armed and decided:
            self.armed = False
            self.reached.set()
            with trio.CancelScope(shield=True):
                await self.release.wait()
        return found


async def test_a_wait_expiring_as_the_host_closes_leaves_its_continuation_to_the_next_host(
    autojump_clock: Any,
) -> None:
    """The host's expiry timer denied a waiting call and went on to resume the turn as
    the host closed: the continuation's ``resume`` was refused ``HostClosed`` (as a
    closed host's new work is), which the timer's task let out of the host's nursery,
    and ``async with Host.open(...)`` raised it at the application that closed its host
    (found by the sweep: expired_approval, scope way). The timer leaves the
    continuation to the session's next host, which runs it."""
    LEDGER.keys.clear()
    shape = next(s for s in RESUME_SHAPES if s.name == "expired_approval")
    store = _HeldLoad()

    def agent() -> Agent:
        return Agent(provider=scripted_provider(shape), tools=[guarded], approval_timeout=TIMEOUT)

    async with trio.open_nursery() as nursery:
        async with Host.open(store=store, log_tap=False) as host:
            host.clock = trio_wall
            session = await host.open_session(agent(), session_id=SID)
            assert (await session.run("go")).finish_reason == "awaiting-input"
            store.armed = True

            async def release_once_closed() -> None:
                while not host.closed:  # noqa: ASYNC110 (its nursery waits for the timer)
                    await trio.sleep(0.01)
                store.release.set()

            nursery.start_soon(release_once_closed)
            await store.reached.wait()  # the timer expired the wait, reads the session
    record = await store.load(SID)
    assert record is not None
    assert [m.role for m in record.messages] == ["user", "assistant"]  # not run on
    (call,) = record.messages[1].content
    assert (call.awaiting.decided, call.awaiting.reason) == (True, "timed out")
    async with Host.open(store=store, log_tap=False) as host:
        host.clock = trio_wall
        session = await host.open_session(agent(), session_id=SID)
        async with session.resume() as out:
            async for _ in out:
                pass
    assert out.result.text == "guarded done"
    assert LEDGER.keys.get("call_G") is None, session.messages  # denied: never run
    assert well_formed(session.messages) == []


async def test_a_decision_in_flight_as_the_host_closes_raises_host_closed(
    tmp_path: Any, autojump_clock: Any
) -> None:
    """A ``decide`` whose save was under way as its host closed (and closed the store it
    had opened) raised the store's ``StoreError("... is closed")`` at the caller, where
    a decision of a closed host raises ``HostClosed`` (found by the PostgreSQL sweep,
    approved_then_new_input, host way)."""
    shape = next(s for s in SHAPES if s.name == "approval")
    got: list[BaseException] = []
    async with trio.open_nursery() as nursery:
        async with Host.open(store=str(tmp_path / "d.db"), log_tap=False) as host:
            agent = Agent(provider=scripted_provider(shape), tools=[guarded])
            session = await host.open_session(agent, session_id=SID)
            assert (await session.run("go")).finish_reason == "awaiting-input"
            (call,) = session.pending
            original = host.store.save
            reached = trio.Event()

            async def held_save(*args: Any, **kwargs: Any) -> Any:
                reached.set()
                while not host.closed:  # noqa: ASYNC110
                    await trio.sleep(0.01)
                return await original(*args, **kwargs)

            host.store.save = held_save

            async def decide() -> None:
                try:
                    await session.decide(call.approval_id, approved=True)
                except BaseException as e:  # what escapes is the finding
                    got.append(e)

            nursery.start_soon(decide)
            await reached.wait()
    (raised,) = got
    assert isinstance(raised, HostClosed), repr(raised)
