"""Tool execution attacked by a careless tool author and a hostile model: whatever a
tool's code does (its validators and approval rule included), whatever a model sends,
the call ends in a result the model sees, the executor serves every other session's
calls on, and the history is one the store can keep."""

from __future__ import annotations

import json

import pydantic
import pytest
import trio

from actors.plugins.approval import ApprovalActor
from actors.providers.scripted import ScriptedProvider, tool_call
from actors.tool_executor import run_tool_call
from runtime import (
    Agent,
    Budget,
    Host,
    InvalidDecision,
    Tool,
    ToolCallChunk,
    ToolContext,
    ToolMessage,
    tool,
)
from runtime.actor_messages import ToolCallSpec
from runtime.events import ActorCrashed


async def outcome(t: Tool, args: dict | None = None, max_chars: int | None = None):
    return await run_tool_call(
        ToolCallSpec(tool_call_id="c", tool_name=t.name, input=args or {}),
        {t.name: t},
        None,
        max_chars,
    )


def results(session_or_record) -> list[tuple]:
    messages = session_or_record.messages
    return [(m.tool_call_id, m.output, m.error) for m in messages if isinstance(m, ToolMessage)]


# -- what a tool's own code raises or returns ------------------------------------------


class Picky(pydantic.BaseModel):
    x: int

    @pydantic.field_validator("x")
    @classmethod
    def _odd(cls, x: int) -> int:
        raise KeyError("not a ValueError, so pydantic lets it through")


@tool
async def picky(p: Picky) -> str:
    """Never runs: its argument's validator raises."""
    return "ran"


async def test_a_validator_raising_past_pydantic_is_the_calls_error():
    oc = await outcome(picky, {"p": {"x": 1}})
    assert oc.error == (
        "invalid arguments for picky: validation raised KeyError: "
        "'not a ValueError, so pydantic lets it through'"
    )


async def test_one_tools_odd_validator_does_not_fail_another_sessions_call_in_flight():
    """The executor serves every session: a call whose validator raised crashed it, and
    its crash answered every call then in flight, another session's too, with
    'the tool executor ... crashed'."""
    started, release = trio.Event(), trio.Event()

    @tool
    async def slow() -> str:
        """Waits."""
        started.set()
        await release.wait()
        return "slow done"

    crashes: list[ActorCrashed] = []
    slow_agent = Agent(
        provider=ScriptedProvider([[*tool_call("slow", {}, tool_call_id="S")], ["ok"]]),
        tools=[slow],
    )
    picky_step = [*tool_call("picky", {"p": {"x": 1}}, tool_call_id="P")]
    picky_agent = Agent(provider=ScriptedProvider([picky_step, ["ok"]]), tools=[picky])
    async with Host.open(log_tap=False) as host:
        sub = host.bus.subscribe([ActorCrashed], policy="drop-oldest", name="t")
        a = await host.open_session(slow_agent)
        b = await host.open_session(picky_agent)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.run, "go")
            await started.wait()
            await b.run("go")
            release.set()
        sub.close()
        crashes = [e async for e in sub]
    assert results(a) == [("S", "slow done", None)]
    assert results(b)[0][2].startswith("invalid arguments for picky: validation raised KeyError")
    assert crashes == []


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


@pytest.mark.parametrize(
    ("raised", "error"),
    [
        (Unprintable(), "Unprintable: <exception str() failed>"),
        (GeneratorExit(), "GeneratorExit"),
        (trio.Cancelled._create(), "Cancelled: cancelled due to unknown"),
        (
            BaseExceptionGroup("g", [GeneratorExit(), ValueError("v")]),
            "BaseExceptionGroup: g (2 sub-exceptions): GeneratorExit; ValueError: v",
        ),
    ],
    ids=["str-raises", "generator-exit", "own-cancelled", "base-group"],
)
async def test_whatever_a_tool_raises_is_its_error(raised, error):
    """An exception whose ``str()`` raised crashed the executor; a GeneratorExit, a
    group of such, or a Cancelled that no cancelled scope sent went out of it, the
    last one leaving the turn waiting for ever."""

    @tool
    async def hostile() -> str:
        """Raises."""
        raise raised

    escaped = oc = None
    try:
        oc = await outcome(hostile)
    except BaseException as exc:  # (a bare Cancelled out of a test function passes it)
        escaped = exc
    assert escaped is None
    assert (oc.output, oc.error) == (None, f"tool hostile raised {error}")


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
async def test_ctrl_c_and_sys_exit_in_a_tool_still_end_the_program(raised):
    @tool
    async def quitting() -> str:
        """Quits."""
        raise raised()

    with pytest.raises(raised):
        await outcome(quitting)


async def test_a_tools_huge_error_message_is_truncated_like_its_output():
    @tool
    async def loud() -> str:
        """Raises with a response body in its message."""
        raise RuntimeError("x" * 5000)

    oc = await outcome(loud, max_chars=100)
    assert len(oc.error) < 200 and oc.error.endswith("characters omitted]")


def _cycle() -> dict:
    d: dict = {}
    d["self"] = d
    return d


def _deep() -> dict:
    d: dict = {}
    for _ in range(5000):
        d = {"a": d}
    return d


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"\xff\xfe", "invalid utf-8"),
        (_cycle(), "Circular reference"),
        (_deep(), "Circular reference detected (depth exceeded)"),
    ],
    ids=["bytes-not-utf8", "cycle", "too-deep"],
)
async def test_a_return_value_with_no_json_form_is_the_calls_error(value, why):
    """Bytes that are not UTF-8, a cycle or nesting too deep crashed the executor (a
    ValueError, where only pydantic's own error was caught). (An integer past 64 bits
    has a JSON form: test_a_tools_integer_past_64_bits_is_its_result_live_and_stored.)"""

    @tool
    async def odd() -> object:
        """Returns it."""
        return value

    oc = await outcome(odd)
    assert oc.output is None
    assert oc.error.startswith("tool odd returned a value that is not JSON: ") and why in oc.error


# -- approval rules that raise -----------------------------------------------------------

ran: list[str] = []


def broken_rule(arguments: dict, context: object) -> bool:
    raise ZeroDivisionError("the rule's own bug")


@tool(needs_approval=broken_rule)
async def transfer(amount: int) -> str:
    """Moves money."""
    ran.append("transfer")
    return "moved"


RULE_ERROR = (
    "the tool call was not executed: the approval rule of transfer raised "
    "ZeroDivisionError: the rule's own bug"
)


@pytest.mark.parametrize("in_process", [False, True], ids=["suspending", "in-process-approver"])
async def test_an_approval_rule_that_raises_refuses_the_call_and_the_turn_goes_on(in_process):
    """The rule raised in the turn runner (the turn failed) or, with an in-process
    approver, in the tool executor (which crashed)."""
    ran.clear()
    steps = [[*tool_call("transfer", {"amount": 5}, tool_call_id="T")], ["could not"]]
    async with Host.open(log_tap=False) as host:
        if in_process:
            await host.start_actor(ApprovalActor(lambda request: (True, None)))
        session = await host.open_session(Agent(provider=ScriptedProvider(steps), tools=[transfer]))
        result = await session.run("pay")
    assert (result.finish_reason, result.error, result.text) == ("stop", None, "could not")
    assert results(session) == [("T", None, RULE_ERROR)]
    assert ran == []


# -- what the model sends ----------------------------------------------------------------


@tool
async def lookup(id: int) -> str:
    """Looks an id up."""
    ran.append(f"lookup {id}")
    return "found"


async def test_a_models_integer_past_64_bits_runs_the_tool_and_is_stored_exactly(tmp_path):
    """The providers parse arguments with Python's JSON parser (any integer). The user
    sees the call run with the model's very integer (``lookup 1180591620717411303424``)
    and the store keeps it as an integer, the same read back. Before (orjson writes none
    past 64 bits) the call was refused ("its input cannot be stored ...; send such a
    value as a string") and its input stored as text."""
    ran.clear()
    steps = [
        [ToolCallChunk(tool_call_id="L", tool_name="lookup", input={"id": 2**70})],
        ["found it"],
    ]
    agent = Agent(provider=ScriptedProvider(steps), tools=[lookup])
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        result = await session.run("look it up")
        live = list(session.messages)
    async with Host.open(store=path, log_tap=False) as host:
        stored = (await host.store.load("s")).messages
    assert (result.finish_reason, result.error) == ("stop", None)
    assert ran == [f"lookup {2**70}"]
    assert results(session) == [("L", "found", None)]
    assert list(stored) == live
    assert stored[1].content[0].input == {"id": 2**70}
    assert type(stored[1].content[0].input["id"]) is int


@tool
async def power(exponent: int) -> dict:
    """Two to a power."""
    return {"n": 2**exponent, "negative": -(2**exponent), "list": [2**exponent, 1]}


async def test_a_tools_integer_past_64_bits_is_its_result_live_and_stored(tmp_path):
    """A tool returning ``{"n": 2**70}``: the user sees it as the call's result and the
    store keeps it, the same integers read back. Before, the executor made the call's
    result an error ("tool power returned a value that is not JSON: Integer exceeds
    64-bit range"): orjson writes no integer past 64 bits."""
    steps = [[*tool_call("power", {"exponent": 70}, tool_call_id="P")], ["big"]]
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(
            Agent(provider=ScriptedProvider(steps), tools=[power]), session_id="s"
        )
        result = await session.run("x")
    async with Host.open(store=path, log_tap=False) as host:
        stored = await host.store.load("s")
    want = {"n": 2**70, "negative": -(2**70), "list": [2**70, 1]}
    assert (result.finish_reason, result.error) == ("stop", None)
    assert results(session) == [("P", want, None)]
    assert results(stored) == [("P", want, None)]


# -- a client tool's output ------------------------------------------------------------

pick = Tool.client("pick", {"type": "object", "properties": {}}, "Ask the user.")


async def client_suspended(host: Host):
    steps = [[*tool_call("pick", {}, tool_call_id="C")], ["thanks"]]
    session = await host.open_session(
        Agent(provider=ScriptedProvider(steps), tools=[pick]), session_id="s"
    )
    await session.run("go")
    return session


async def test_a_client_tools_output_is_kept_in_the_json_form_the_model_saw(tmp_path):
    """A set given to ``respond`` was the output in memory and its repr, the text
    ``'{1, 2}'``, in the store."""
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        session = await client_suspended(host)
        await session.respond("C", output={"picked": {2, 1}})
        live = results(session)
    async with Host.open(store=path, log_tap=False) as host:
        stored = await host.store.load("s")
    assert live == [("C", {"picked": [1, 2]}, None)]
    assert results(stored) == live


async def test_a_client_tools_integer_past_64_bits_is_its_output_live_and_stored(tmp_path):
    """A client's output ``{"n": 2**70}``: the user sees the turn go on with it, and the
    store keeps it exactly. It was refused ("the output cannot be stored as JSON: Integer
    exceeds 64-bit range")."""
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        session = await client_suspended(host)
        result = await session.respond("C", output={"n": 2**70, "m": -(2**64)})
        live = results(session)
    async with Host.open(store=path, log_tap=False) as host:
        stored = await host.store.load("s")
    assert result.finish_reason == "stop"
    assert live == [("C", {"n": 2**70, "m": -(2**64)}, None)]
    assert results(stored) == live


async def test_a_client_tools_non_finite_float_is_null_live_and_stored(tmp_path):
    """NaN given to ``respond`` was NaN in memory and in the next request, null in the
    store."""
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        session = await client_suspended(host)
        await session.respond("C", output={"score": float("nan")})
        live = results(session)
    async with Host.open(store=path, log_tap=False) as host:
        stored = await host.store.load("s")
    assert live == [("C", {"score": None}, None)]
    assert results(stored) == live


class Opaque:
    pass


@pytest.mark.parametrize("output", [Opaque(), b"\xff"], ids=["object", "bytes-not-utf8"])
async def test_a_client_tool_output_with_no_json_form_is_refused_and_changes_nothing(
    tmp_path, output
):
    """An object was stored as its repr (a memory address), bytes as base64."""
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await client_suspended(host)
        before = await host.store.load("s")
        with pytest.raises(InvalidDecision, match="the output cannot be stored as JSON"):
            await session.respond("C", output=output)
        after = await host.store.load("s")
        result = await session.respond("C", output="red")
    assert (after.messages, after.version) == (before.messages, before.version)
    assert result.finish_reason == "stop" and results(session) == [("C", "red", None)]


# -- structured output -----------------------------------------------------------------


class Comment(pydantic.BaseModel):
    """A comment and its replies."""

    text: str
    replies: list[Comment] = []


async def test_a_recursive_model_is_an_output_type_whose_root_is_an_object():
    """pydantic's schema of a recursive model is a ``$ref`` into its ``$defs``: it was
    refused as 'not an object' ('wrap it in a model'), which it is."""
    answer = '{"text": "a", "replies": [{"text": "b", "replies": [{"text": "c"}]}]}'
    agent = Agent(provider=ScriptedProvider([[answer]]), output_type=Comment)
    assert agent.output_schema.schema["type"] == "object"
    assert agent.output_schema.schema["properties"]["replies"]["items"] == {
        "$ref": "#/$defs/Comment"
    }
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        result = await session.run("thread?")
    assert result.output == Comment.model_validate_json(answer)


def _nested(depth: int) -> str:
    return '{"text": "a", "child": ' * depth + '{"text": "z"}' + "}" * depth


async def test_an_answer_nested_deeper_than_python_is_rejected_and_asked_again():
    """A recursive JSON schema validated a deep answer into a RecursionError, which
    failed the turn instead of asking the model again."""
    schema = {
        "type": "object",
        "properties": {"text": {"type": "string"}, "child": {"$ref": "#"}},
        "required": ["text"],
    }
    provider = ScriptedProvider([[_nested(400)], ['{"text": "flat"}']])
    agent = Agent(provider=provider, output_type=schema)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        result = await session.run("x")
    assert (result.finish_reason, result.output, result.steps) == ("stop", {"text": "flat"}, 2)
    feedback = provider.requests[1].messages[-1].content
    assert "nested too deeply to validate" in feedback


async def test_a_retry_prompt_quotes_a_long_answer_once_at_most_per_problem_cut_short():
    """jsonschema's message quotes the value: a long answer that was not an object came
    back whole in the retry prompt."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    provider = ScriptedProvider([['{"a": "' + "y" * 50_000 + '"}'], ['{"a": 1}']])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider, output_type=schema))
        result = await session.run("x")
    assert result.output == {"a": 1}
    feedback = provider.requests[1].messages[-1].content
    assert len(feedback) < 1000 and "characters more" in feedback


async def test_a_long_structured_answer_is_parsed_for_partial_objects_in_linear_time():
    """Each batch of the answer parsed the whole text so far and sent the whole object:
    a 500 KB answer cost 11 s of CPU on the event loop (every session's) and some 6,000
    object-deltas of up to 500 KB each. Past 8 KB a batch parses once the text grew by
    an eighth; the part's end always does, so the last object-delta is the answer."""
    schema = {"type": "object", "properties": {"items": {"type": "array"}}}
    words = [f"word{i}" for i in range(20_000)]
    answer = json.dumps({"items": words})
    provider = ScriptedProvider([[answer]], chunk_size=40, burst=1)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider, output_type=schema))
        async with session.stream("x") as out:
            deltas = [c.value for c in [c async for c in out] if c.type == "object-delta"]
    assert out.result.output == {"items": words}
    assert 20 < len(deltas) < 250  # ~5,000 batches
    assert deltas[-1] == {"items": words}
    assert deltas[0] != deltas[-1]


def test_a_value_nested_deeper_than_a_recursive_schema_can_check_is_an_input_error():
    """(MCP tools' and client tools' schemas) the RecursionError went out of respond()."""
    from runtime.tools import ToolInputError, check_against_schema, json_schema_validator

    validator = json_schema_validator({"type": "object", "properties": {"c": {"$ref": "#"}}})
    value = json.loads(_nested(400).replace('"child"', '"c"'))
    with pytest.raises(ToolInputError, match="invalid output for t: nested too deeply to check"):
        check_against_schema("t", validator, value, "output")


# -- compaction ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "summary", ["   ", "S" * 100_000], ids=["empty", "larger-than-what-it-summarizes"]
)
async def test_a_summary_that_does_not_shrink_the_request_is_not_stored(summary):
    """An empty summary was stored and stood for every older turn in each later request
    (all they said was lost to the model); a summary larger than the turns it stood for
    was stored too, and sent with every later request, each turn making another."""
    from runtime import Summarize
    from runtime.compaction import SUMMARY_INSTRUCTIONS, is_summary

    asked: list[int] = []

    def respond(request):
        if request.instructions == SUMMARY_INSTRUCTIONS:
            asked.append(1)
            return [summary]
        return ["answer " * 30]

    provider = ScriptedProvider(responder=respond)
    agent = Agent(provider=provider, history_processors=[Summarize(max_tokens=300, keep_turns=1)])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        for n in range(4):
            result = await session.run(f"question {n} " + "q" * 200)
            assert result.error is None
    assert asked  # the summary was asked for
    assert not any(is_summary(m) for m in session.messages)
    sent = provider.requests[-1].messages
    assert not any(is_summary(m) for m in sent)
    assert sent[0].text.startswith("question 0")  # the oldest turn still reaches the model


# -- agents as tools ---------------------------------------------------------------------


@tool(needs_approval=True)
async def delete(path: str) -> str:
    """Deletes a file."""
    ran.append(f"delete {path}")
    return "deleted"


async def test_a_sub_agent_that_waits_for_approval_is_a_tool_error_not_an_empty_answer():
    """Its turn suspended (awaiting-input) and the parent model got '' as the sub-agent's
    successful answer; nobody could ever answer the wait."""
    ran.clear()
    worker = Agent(
        name="worker",
        provider=ScriptedProvider([[*tool_call("delete", {"path": "/x"})], ["deleted it"]]),
        tools=[delete],
    )
    boss = Agent(
        name="boss",
        provider=ScriptedProvider(
            [[*tool_call("worker", {"input": "clean"}, tool_call_id="W")], ["ok"]]
        ),
        tools=[worker.as_tool()],
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(boss)
        result = await session.run("clean up")
    assert (result.finish_reason, result.text) == ("stop", "ok")
    [(call_id, output, error)] = results(session)
    assert (call_id, output) == ("W", None)
    assert error == (
        "tool worker raised RuntimeError: sub-agent worker stopped to wait for a person's "
        "input (delete (approval)), which nobody can give it when another agent calls it: "
        "it did not finish"
    )
    assert ran == []


async def test_a_sub_agent_a_budget_stopped_says_so_in_its_answer():
    """Its partial text was the answer, as if it had finished."""
    worker = Agent(
        name="worker",
        provider=ScriptedProvider(responder=lambda r: ["partial ", *tool_call("nope", {})]),
        budget=Budget(max_steps=1),
    )
    boss = Agent(
        name="boss",
        provider=ScriptedProvider(
            [[*tool_call("worker", {"input": "go"}, tool_call_id="W")], ["ok"]]
        ),
        tools=[worker.as_tool()],
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(boss)
        await session.run("go")
    assert results(session) == [
        ("W", "partial \n[the sub-agent stopped before it finished: max_steps reached]", None)
    ]


# -- a context kept past its call ---------------------------------------------------------


async def test_a_context_kept_past_its_call_streams_nothing_into_a_later_call():
    """A tool that kept its ToolContext (a background task, a careless global) and
    streamed through it after its call ended put its chunk in the session's tool inbox;
    the next turn's call with the same id (servers number calls per response: call_0)
    streamed it as its own."""
    from runtime.output import TextDelta

    kept: list = []

    @tool
    async def remember(context: ToolContext) -> str:
        """Keeps its context."""
        kept.append(context)
        return "kept"

    @tool
    async def plain() -> str:
        """Answers."""
        return "plain"

    steps = [[*tool_call("remember", {}, tool_call_id="call_0")], ["one"]]
    later = [[*tool_call("plain", {}, tool_call_id="call_0")], ["two"]]
    agent = Agent(provider=ScriptedProvider(turns=[steps, later]), tools=[remember, plain])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        await session.run("first")
        with trio.move_on_after(1):  # (it must not wait either)
            await kept[0].emit(TextDelta(step=0, part_id="p", text="stale"))
        async with session.stream("second") as out:
            chunks = [c async for c in out]
    assert not [c for c in chunks if c.type == "tool-stream"]
    assert out.result.text == "two"


async def test_usage_that_is_no_usage_is_the_tools_error_not_the_turns():
    """``context.add_usage(5)`` was taken, and failed the calling turn with an
    AttributeError ('int' object has no attribute 'empty') once the call ended."""

    @tool
    async def spend(context: ToolContext) -> str:
        """Reports what it spent, wrongly."""
        context.add_usage(5)
        return "done"

    steps = [[*tool_call("spend", {}, tool_call_id="S")], ["ok"]]
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=ScriptedProvider(steps), tools=[spend]))
        result = await session.run("go")
    assert (result.finish_reason, result.error) == ("stop", None)
    assert results(session) == [
        ("S", None, "tool spend raised TypeError: add_usage takes a Usage, not int")
    ]


# -- a recursion bomb in a model's arguments ---------------------------------------------

DEEP_ARGS = '{"a":' * 5000 + "1" + "}" * 5000


async def test_arguments_nested_past_pythons_stack_are_invalid_json_and_the_turn_goes_on():
    """Python's JSON parser raises RecursionError, not ValueError, on them: the OpenAI
    provider's call failed and so did the turn (ProviderError: RecursionError)."""
    from actors.providers.openai import OpenAIProvider
    from tests.support.loopback import Reply, loopback_server, sse

    def chunk(delta=None, finish=None):
        choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
        return {"id": "x", "object": "chat.completion.chunk", "created": 1, "choices": [choice]}

    call = {"index": 0, "id": "c1", "type": "function"}
    bomb = sse(
        chunk({"tool_calls": [{**call, "function": {"name": "lookup", "arguments": DEEP_ARGS}}]}),
        chunk(finish="tool_calls"),
    )
    answer = sse(chunk({"content": "sorry"}), chunk(finish="stop"))
    ran.clear()
    async with loopback_server(Reply(body=bomb), Reply(body=answer)) as server:
        provider = OpenAIProvider("gpt-4o-mini", base_url=server.url + "/v1", api_key="sk-test")
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider, tools=[lookup]))
            result = await session.run("look")
        server_requests = len(server.requests)
    assert (result.finish_reason, result.error, result.text) == ("stop", None, "sorry")
    [(_, output, error)] = results(session)
    assert output is None and error.startswith("invalid JSON in tool arguments: maximum recursion")
    assert ran == [] and server_requests == 2


def test_a_stored_recursion_bomb_restores_as_an_empty_input():
    """Kept as its raw text, the call's input was parsed again for every later request
    to Anthropic and Gemini: the RecursionError failed each one."""
    from actors.providers import anthropic, gemini

    assert anthropic._tool_input(DEEP_ARGS) == {}
    assert gemini._tool_input(DEEP_ARGS) == {}


@pytest.mark.parametrize(
    "arguments",
    [json.loads('{"a":' * 300 + "1" + "}" * 300)],
    ids=["nested-past-orjsons-limit"],
)
async def test_arguments_the_store_cannot_write_are_refused_where_they_enter(tmp_path, arguments):
    """(the second: deeper than orjson writes, 254, shallower than Python's parser goes)"""
    ran.clear()
    steps = [[ToolCallChunk(tool_call_id="L", tool_name="lookup", input=arguments)], ["again"]]
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(
            Agent(provider=ScriptedProvider(steps), tools=[lookup]), session_id="s"
        )
        result = await session.run("x")
    async with Host.open(store=path, log_tap=False) as host:
        stored = await host.store.load("s")
    assert (result.finish_reason, result.error, ran) == ("stop", None, [])
    assert results(stored) == results(session)
    assert results(session)[0][2].startswith("the tool call was not executed: its input cannot")


# -- timeouts no call could run under ------------------------------------------------------


@pytest.mark.parametrize("timeout", [-1, float("nan"), "5", True], ids=repr)
def test_a_timeout_no_call_could_run_under_is_refused_when_the_tool_is_made(timeout):
    """Taken, each was every call's error, as if the tool had raised it ("tool t raised
    TypeError: '<' not supported between instances of 'str' and 'int'")."""
    from runtime import ConfigurationError, ToolDefinitionError

    async def t() -> str:
        """x"""
        return "x"

    with pytest.raises(ToolDefinitionError, match="a tool timeout is a number of seconds"):
        tool(t, timeout=timeout)
    with pytest.raises(ConfigurationError, match="a tool timeout is a number of seconds"):
        Budget(tool_timeout=timeout)


# -- media beside text -------------------------------------------------------------------


async def test_an_image_beside_a_tools_text_does_not_let_the_text_past_the_limit():
    """A media output was not measured at all: one image let 5 MB of text through to the
    model and the store, past max_tool_result_chars."""
    from runtime import Image
    from runtime.messages import TextPart

    image = Image(data=b"\x89PNG\r\n\x1a\n" + b"\x00" * 16, media_type="image/png")

    @tool
    async def shot() -> object:
        """A screenshot and what it shows."""
        return ["a" * 50, image, "b" * 50, "c" * 10]

    def shown(output):
        return [p.text if isinstance(p, TextPart) else p for p in output]

    marker = "…[truncated: 50 of 110 characters omitted]"
    assert shown((await outcome(shot, max_chars=60)).output) == ["a" * 50, image, "b" * 10 + marker]
    assert shown((await outcome(shot, max_chars=110)).output) == [
        "a" * 50,
        image,
        "b" * 50,
        "c" * 10,
    ]


def test_an_async_approval_rule_is_refused_when_the_tool_is_made():
    """Its coroutine, never awaited, was true: every call waited for a person, whatever
    the rule would have said."""
    from runtime import ToolDefinitionError

    async def rule(arguments: dict, context: object) -> bool:
        return False

    async def act() -> str:
        """Acts."""
        return "acted"

    with pytest.raises(ToolDefinitionError, match="needs_approval rule 'rule' is async"):
        tool(act, needs_approval=rule)


async def test_an_approval_rule_that_returns_an_awaitable_refuses_the_call():
    class Rule:
        async def __call__(self, arguments: dict, context: object) -> bool:
            return False

    ran.clear()
    steps = [[*tool_call("transfer", {"amount": 5}, tool_call_id="T")], ["ok"]]
    sneaky = tool(transfer.function, name="transfer", needs_approval=Rule())
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=ScriptedProvider(steps), tools=[sneaky]))
        result = await session.run("pay")
    assert (result.finish_reason, ran) == ("stop", [])
    assert results(session) == [
        (
            "T",
            None,
            "the tool call was not executed: the approval rule of transfer raised TypeError: "
            "the approval rule returned an awaitable: it must return a bool",
        )
    ]


# -- a tool that swallows its cancellation -----------------------------------------------


async def test_a_cancelled_calls_late_outcome_is_not_a_later_calls_result():
    """A tool that swallowed its cancellation (a bare except) still answered into the
    session's tool inbox after its turn was cut: the next turn's call with the same id
    (servers number calls per response: call_0) took that stale answer as its own."""
    started = trio.Event()

    @tool
    async def stubborn() -> str:
        """Never lets go."""
        started.set()
        try:
            await trio.sleep_forever()
        except BaseException:  # careless: Cancelled too
            return "stale answer"

    @tool
    async def plain() -> str:
        """Answers after a moment."""
        for _ in range(10):
            await trio.lowlevel.checkpoint()
        return "fresh answer"

    first = [[*tool_call("stubborn", {}, tool_call_id="call_0")], ["one"]]
    second = [[*tool_call("plain", {}, tool_call_id="call_0")], ["two"]]
    agent = Agent(provider=ScriptedProvider(turns=[first, second]), tools=[stubborn, plain])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        async with session.stream("first") as out:
            await started.wait()
            out.cancel("stop")
            async for _ in out:
                pass
        assert out.result.finish_reason == "aborted"
        await session.run("second")
    assert results(session)[-1] == ("call_0", "fresh answer", None)


class Located(pydantic.BaseModel):
    city: str

    @pydantic.field_validator("city")
    @classmethod
    def _country(cls, city: str) -> str:
        return {"Paris": "FR"}[city]  # careless: a KeyError for any other city


async def test_an_output_validator_raising_past_pydantic_rejects_the_answer_and_asks_again():
    """The KeyError failed the turn ("KeyError: 'Oslo'"), where a ValueError has the
    model asked again."""
    provider = ScriptedProvider([['{"city": "Oslo"}'], ['{"city": "Paris"}']])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider, output_type=Located))
        result = await session.run("where?")
    assert (result.finish_reason, result.error, result.steps) == ("stop", None, 2)
    assert result.output == Located.model_construct(city="FR")
    feedback = provider.requests[1].messages[-1].content
    assert "(root): validation raised KeyError: 'Oslo'" in feedback


# -- text that is not valid Unicode ------------------------------------------------------


@pytest.mark.parametrize(
    ("returns", "raises", "kept"),
    [
        ("caf\udce9.txt", None, ("caf\\udce9.txt", None)),
        ({"names": ["caf\udce9.txt", "ok"]}, None, ({"names": ["caf\\udce9.txt", "ok"]}, None)),
        (None, "caf\udce9.txt", (None, "tool ls raised FileNotFoundError: caf\\udce9.txt")),
    ],
    ids=["text", "nested", "in-an-error"],
)
async def test_a_lone_surrogate_from_a_tool_is_written_as_its_escape(
    tmp_path, returns, raises, kept
):
    """Bytes that are not UTF-8 decoded with surrogateescape (os.listdir's names, a path
    in an OSError) hold lone surrogates, which orjson (the store's) refuses: the result
    went to the model, then every save of the session failed. (Nested, it had become an
    error result.)"""

    @tool
    async def ls() -> object:
        """Lists a folder."""
        if raises is not None:
            raise FileNotFoundError(raises)
        return returns

    steps = [[*tool_call("ls", {}, tool_call_id="L")], ["listed"]]
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(
            Agent(provider=ScriptedProvider(steps), tools=[ls]), session_id="s"
        )
        result = await session.run("ls")
    async with Host.open(store=path, log_tap=False) as host:
        stored = await host.store.load("s")
    assert (result.finish_reason, result.error) == ("stop", None)
    assert results(session) == [("L", *kept)]
    assert results(stored) == results(session)


@pytest.mark.parametrize(
    "given", ["caf\udce9", ["look:", "caf\udce9"]], ids=["text", "a text part of a list"]
)
async def test_user_input_with_a_lone_surrogate_is_refused_before_anything_runs(tmp_path, given):
    """(a command-line argument typed in a Latin-1 terminal, which Python decodes with
    surrogateescape) The turn ran, its model call paid for, then its save and every
    later save of the session failed with a StoreError."""
    from runtime.errors import InvalidMedia

    provider = ScriptedProvider([["hello"]])
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider), session_id="s")
        with pytest.raises(InvalidMedia, match="'\\\\udce9' at character 3 is a lone surrogate"):
            await session.run(given)
        assert await host.store.load("s") is None
        assert (await session.run("café")).text == "hello"
    assert len(provider.requests) == 1


@pytest.mark.parametrize("field", ["max_tool_result_chars", "max_tool_calls"])
@pytest.mark.parametrize("value", [-1, 1.5, "10"], ids=repr)
def test_a_budget_count_that_is_no_count_is_refused(field, value):
    """max_tool_result_chars=-1 cut every result to all but its last character, ending
    "…[truncated: 7 of 6 characters omitted]"."""
    from runtime import ConfigurationError

    with pytest.raises(ConfigurationError, match=f"Budget.{field} must be None or an int"):
        Budget(**{field: value})


# -- how an error is described, wherever it is reported -----------------------------------


def test_an_exception_group_is_described_by_its_sub_exceptions():
    """A group's own text ("unhandled errors in a TaskGroup (1 sub-exception)") said
    nothing of what failed: only the tool executor named its sub-exceptions, every other
    caller (log lines, crash messages, the CLI) gave the group's text alone."""
    from runtime.errors import describe_exception

    group = ExceptionGroup("boom", [ValueError("a"), KeyError("b")])
    assert describe_exception(group) == (
        "ExceptionGroup: boom (2 sub-exceptions): ValueError: a; KeyError: 'b'"
    )


def test_an_exception_with_no_text_is_described_without_a_dangling_colon():
    from runtime.errors import describe_exception

    assert describe_exception(RuntimeError()) == "RuntimeError"


def test_a_key_inside_a_sub_exception_is_redacted_where_the_group_is_described():
    from runtime.errors import describe_exception

    key = "sk-ant-" + "k" * 40
    group = ExceptionGroup("g", [ValueError(f"401: invalid x-api-key {key}")])
    described = describe_exception(group)
    assert key not in described and "ValueError: 401" in described


def test_a_group_nested_past_any_reason_is_described_without_raising():
    from runtime.errors import describe_exception

    group: BaseException = ValueError("leaf")
    for _ in range(5000):
        group = ExceptionGroup("g", [group])
    assert describe_exception(group).startswith("ExceptionGroup: g (1 sub-exception): ")


async def test_a_turn_that_ends_with_an_exception_group_names_what_failed_in_its_error():
    """The error chunk said "unhandled errors in a TaskGroup (2 sub-exceptions)"."""
    from runtime import Hooks

    async def bad_hook(event):
        raise ExceptionGroup("hooks failed", [LookupError("no such user"), OSError("disk")])

    agent = Agent(provider=ScriptedProvider([["x"]]), hooks=Hooks(on_step_finish=bad_hook))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        async with session.stream("hi") as out:
            chunks = [c async for c in out]
    assert (chunks[-1].type, chunks[-1].error.kind) == ("error", "ExceptionGroup")
    assert chunks[-1].error.message == (
        "hooks failed (2 sub-exceptions): LookupError: no such user; OSError: disk"
    )


# -- an agent that is its own tool -----------------------------------------------------------


def _self_caller(max_depth: int) -> tuple[Agent, list[str]]:
    """An agent whose one tool runs the agent itself (as an application builds it: the
    agents are frozen, so the tool finds the agent when it is called); its model calls
    the tool, then answers with what the tool gave back. ``errors`` collects each tool
    error a model saw."""
    errors: list[str] = []

    def respond(request):
        last = request.messages[-1]
        if isinstance(last, ToolMessage):
            if last.error is not None:
                errors.append(last.error)
            return [f"depth answer: {last.output or last.error}"]
        return [*tool_call("again", {"input": "once more"})]

    holder: dict[str, Tool] = {}

    @tool
    async def again(input: str, context: ToolContext) -> str:
        """Asks this same agent again."""
        return await holder["self"].call({"input": input}, context)

    agent = Agent(name="me", provider=ScriptedProvider(responder=respond), tools=[again])
    holder["self"] = agent.as_tool(max_depth=max_depth)
    return agent, errors


async def test_an_agent_that_is_its_own_tool_stops_at_the_nesting_bound():
    """It recursed until its tool timeout or its budget's steps ran out, a turn held at
    every level."""
    agent, errors = _self_caller(max_depth=3)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        result = await session.run("go")
    assert result.finish_reason == "stop"
    assert errors == [
        "tool again raised RuntimeError: agent nesting deeper than 3: me was not run "
        "(agents calling agents, or themselves, 3 deep already)"
    ]
    # the top session and 3 nested ones: each called the tool once and answered once
    assert len(agent.provider.requests) == 2 * 4


def test_a_nesting_bound_that_is_no_bound_is_refused_when_the_tool_is_made():
    from runtime import ToolDefinitionError

    with pytest.raises(ToolDefinitionError, match="max_depth must be an int >= 1"):
        Agent(name="x", provider=ScriptedProvider([["x"]])).as_tool(max_depth=0)


# -- NaN and the infinities --------------------------------------------------------------


async def test_a_non_finite_float_from_a_tool_is_null_live_sent_and_stored(tmp_path):
    """NaN was NaN in the stream and in the next request (OpenAI's tool message read
    ``NaN``, which no JSON parser takes), and null once stored: the history a later turn
    sent was not what the model had seen."""
    from actors.providers.openai import map_messages

    @tool
    async def ratio() -> dict:
        """Divides."""
        return {"nan": float("nan"), "inf": float("inf"), "neg": -float("inf"), "ok": 1.5}

    provider = ScriptedProvider([[*tool_call("ratio", {}, tool_call_id="R")], ["done"]])
    agent = Agent(provider=provider, tools=[ratio])
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        async with session.stream("go") as out:
            live = [c.output async for c in out if c.type == "tool-result"]
        stored = await host.store.load("s")
    expected = {"nan": None, "inf": None, "neg": None, "ok": 1.5}
    sent = [m for m in provider.requests[1].messages if isinstance(m, ToolMessage)]
    [body] = [m for m in map_messages(None, provider.requests[1].messages) if m["role"] == "tool"]
    kept = [m.output for m in stored.messages if isinstance(m, ToolMessage)]
    assert live == [expected]
    assert [m.output for m in sent] == [expected]
    assert json.loads(body["content"]) == expected and "NaN" not in body["content"]
    assert kept == [expected]


# -- an async tool that blocks the loop -------------------------------------------------------


def _blocking_tool(now: list[float], held: float) -> Tool:
    @tool
    async def crunch(n: int) -> str:
        """Holds the loop for ``held`` seconds as the watch's clock sees it (time.sleep)."""
        await trio.lowlevel.checkpoint()
        now[0] += held  # the step from here to the return: "time.sleep(held)"
        return f"crunched {n}"

    return crunch


async def test_an_async_tool_that_holds_the_loop_is_named_in_one_warning():
    """It stopped every session of the host, and nothing said which tool did."""
    from structlog.testing import capture_logs

    from actors.tool_executor import LoopWatch

    now = [0.0]
    watch = LoopWatch(clock=lambda: now[0], limit=0.25)
    crunch = _blocking_tool(now, held=3.0)
    with capture_logs() as logs:
        outcomes = [
            await run_tool_call(
                ToolCallSpec(tool_call_id=f"c{i}", tool_name="crunch", input={"n": i}),
                {"crunch": crunch},
                None,
                None,
                watch=watch,
            )
            for i in range(3)
        ]
    warnings = [line for line in logs if line["event"] == "tool.blocked-loop"]
    assert [o.output for o in outcomes] == ["crunched 0", "crunched 1", "crunched 2"]
    assert [(w["tool"], w["held"], w["log_level"]) for w in warnings] == [
        ("crunch", 3.0, "warning")
    ]


async def test_an_async_tool_that_awaits_in_short_steps_is_not_warned_about():
    from structlog.testing import capture_logs

    from actors.tool_executor import LoopWatch

    now = [0.0]
    watch = LoopWatch(clock=lambda: now[0], limit=0.25)
    crunch = _blocking_tool(now, held=0.1)
    with capture_logs() as logs:
        oc = await run_tool_call(
            ToolCallSpec(tool_call_id="c", tool_name="crunch", input={"n": 1}),
            {"crunch": crunch},
            None,
            None,
            watch=watch,
        )
    assert oc.output == "crunched 1"
    assert [line for line in logs if line["event"] == "tool.blocked-loop"] == []


async def test_a_watched_tool_is_cancelled_and_raises_as_an_unwatched_one_does(autojump_clock):
    """The watch runs the tool's coroutine step by step: a timeout still cancels it, its
    own error is still its error."""
    from actors.tool_executor import LoopWatch

    @tool(timeout=5)
    async def stuck() -> str:
        """Never returns."""
        await trio.sleep_forever()
        return "never"

    @tool
    async def broken() -> str:
        """Raises after an await."""
        await trio.lowlevel.checkpoint()
        raise KeyError("missing")

    tools = {"stuck": stuck, "broken": broken}
    watch = LoopWatch()
    timed_out, failed = [
        await run_tool_call(
            ToolCallSpec(tool_call_id=name, tool_name=name, input={}),
            tools,
            None,
            None,
            watch=watch,
        )
        for name in ("stuck", "broken")
    ]
    assert timed_out.error == "tool stuck timed out after 5s"
    assert failed.error == "tool broken raised KeyError: 'missing'"


async def test_the_hosts_tool_executor_warns_of_an_async_tool_holding_the_loop():
    from structlog.testing import capture_logs

    from actors.tool_executor import LoopWatch

    now = [0.0]
    crunch = _blocking_tool(now, held=3.0)
    steps = [[*tool_call("crunch", {"n": 1})], ["done"]]
    with capture_logs() as logs:
        async with Host.open(log_tap=False) as host:
            host.tool_executor.loop_watch = LoopWatch(clock=lambda: now[0])
            session = await host.open_session(
                Agent(provider=ScriptedProvider(steps), tools=[crunch])
            )
            result = await session.run("go")
    assert result.text == "done"
    warned = [line["tool"] for line in logs if line["event"] == "tool.blocked-loop"]
    assert warned == ["crunch"]


async def test_a_provider_failing_with_an_exception_group_names_what_failed():
    """The turn's error said "ProviderError: stream failed (1 sub-exception)"."""
    failing = ExceptionGroup("stream failed", [ConnectionResetError("peer reset")])
    agent = Agent(provider=ScriptedProvider([[failing]]))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        result = await session.run("hi")
    assert result.finish_reason == "error"
    assert "ConnectionResetError: peer reset" in result.error.message


async def test_two_agents_calling_each_other_stop_at_the_nesting_bound():
    """A calls B calls A...: the depth counts every agent-as-tool level, whichever agent."""
    errors: list[str] = []

    def respond(name: str):
        def step(request):
            last = request.messages[-1]
            if isinstance(last, ToolMessage):
                if last.error is not None:
                    errors.append(last.error)
                return ["back"]
            return [*tool_call(name, {"input": "your turn"})]

        return step

    holder: dict[str, Tool] = {}

    @tool
    async def ask_a(input: str, context: ToolContext) -> str:
        """Asks agent a."""
        return await holder["a"].call({"input": input}, context)

    b = Agent(name="b", provider=ScriptedProvider(responder=respond("ask_a")), tools=[ask_a])
    ask_b = b.as_tool(name="ask_b", max_depth=4)
    a = Agent(name="a", provider=ScriptedProvider(responder=respond("ask_b")), tools=[ask_b])
    holder["a"] = a.as_tool(max_depth=4)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(a)
        result = await session.run("go")
    assert result.finish_reason == "stop"
    assert errors == [
        "tool ask_b raised RuntimeError: agent nesting deeper than 4: ask_b was not run "
        "(agents calling agents, or themselves, 4 deep already)"
    ]
    # a at depths 0, 2, 4 and b at 1, 3: each called once and answered once
    assert (len(a.provider.requests), len(b.provider.requests)) == (6, 4)
