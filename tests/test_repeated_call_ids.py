"""A provider that numbers its calls per response (``call_0`` in every step) still gets
one id per call in the turn: the runtime renames a repeated id where calls enter the
turn (actors.turn.parts.CallIds), so the tools, results, stored message, stream, replay
and a taken-over step all name each call by one id of its own."""

from __future__ import annotations

import trio

from actors.providers import anthropic, gemini, openai, openai_responses
from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores import MemoryStore
from actors.turn.parts import CallIds, PartsManager
from runtime import Agent, Host, RetryPolicy, ToolCallPart, ToolMessage, UserMessage, tool
from runtime.app.web.ui_stream import encode_turn, ui_messages
from runtime.chunks import ToolCallChunk, ToolInputDeltaChunk, ToolInputStartChunk
from runtime.errors import Overloaded
from runtime.history import repair
from runtime.ids import is_call_id_of, repeated_call_id
from runtime.tools import ToolContext
from tests.support import wire_rules

T, M, SID = "turn-1", "msg-1", "dup"

STEPS = [
    [*tool_call("charge", {"n": 1}, tool_call_id="call_0")],
    [*tool_call("charge", {"n": 2}, tool_call_id="call_0")],
    ["paid twice"],
]
IDS = ["call_0", "call_0-1"]


class Charger:
    """The ``charge`` tool: records each run's input and idempotency key; with
    ``hang_on``, that call never returns (its worker dies there)."""

    def __init__(self, hang_on: int | None = None) -> None:
        self.runs: list[tuple[int, str, str]] = []
        self.hang_on = hang_on
        self.hanging = trio.Event()

    def tool(self) -> object:
        @tool
        async def charge(n: int, context: ToolContext) -> str:
            """Charge the card."""
            self.runs.append((n, context.tool_call_id, context.idempotency_key))
            if n == self.hang_on:
                self.hanging.set()
                await trio.sleep_forever()
            return f"charged {n}"

        return charge


def agent_with(charger: Charger) -> Agent:
    return Agent(provider=ScriptedProvider(STEPS), tools=[charger.tool()])


def check_history(messages) -> None:
    assistant = messages[1]
    calls = [(p.tool_call_id, p.step) for p in assistant.content if isinstance(p, ToolCallPart)]
    assert calls == [(IDS[0], 0), (IDS[1], 1)]
    results = [(m.tool_call_id, m.step, m.output) for m in messages if isinstance(m, ToolMessage)]
    assert results == [(IDS[0], 0, "charged 1"), (IDS[1], 1, "charged 2")]


async def test_both_calls_run_and_each_result_reaches_its_own_call():
    store, charger = MemoryStore(), Charger()
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent_with(charger), session_id=SID)
        async with session.stream("pay", turn_id=T, message_id=M) as out:
            chunks = await out.collect()
    assert charger.runs == [(1, IDS[0], f"{T}:0:{IDS[0]}"), (2, IDS[1], f"{T}:1:{IDS[1]}")]
    assert [(m.tool_call_id, m.output) for m in out.result.tool_messages] == [
        (IDS[0], "charged 1"),
        (IDS[1], "charged 2"),
    ]
    check_history((await store.load(SID)).messages)
    check_history(session.messages)
    # The UI stream names each call by its own id, in every chunk of it.
    by_type: dict[str, list[str]] = {}
    for c in encode_turn(chunks):
        if c["type"].startswith("tool-"):
            by_type.setdefault(c["type"], []).append(c["toolCallId"])
    assert by_type["tool-input-start"] == IDS
    assert sorted(set(by_type["tool-input-delta"])) == IDS
    assert by_type["tool-input-available"] == IDS
    assert by_type["tool-output-available"] == IDS
    outputs = [c["output"] for c in encode_turn(chunks) if c["type"] == "tool-output-available"]
    assert outputs == ["charged 1", "charged 2"]
    # ... and so does the reloaded message: two tool parts, each with its own output.
    ui = ui_messages(session.messages)[1]
    tools = [(p["toolCallId"], p["output"]) for p in ui["parts"] if p["type"] == "tool-charge"]
    assert tools == [(IDS[0], "charged 1"), (IDS[1], "charged 2")]


async def test_replay_of_the_renamed_calls_is_valid_for_every_provider():
    store = MemoryStore()
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent_with(Charger()), session_id=SID)
        async with session.stream("pay") as out:
            await out.collect()
    stored = (await store.load(SID)).messages
    history = repair([*stored, UserMessage(content="again")])  # the next request

    chat = openai.map_messages(None, history)
    assert wire_rules.chat_errors(chat) + wire_rules.sdk_errors("chat", chat) == []
    assert [c["id"] for m in chat if m.get("tool_calls") for c in m["tool_calls"]] == IDS
    assert [(m["tool_call_id"], m["content"]) for m in chat if m["role"] == "tool"] == [
        (IDS[0], "charged 1"),
        (IDS[1], "charged 2"),
    ]

    items = openai_responses.map_messages(history)
    assert wire_rules.responses_errors(items) == []
    assert [i["call_id"] for i in items if i.get("type") == "function_call_output"] == IDS

    _system, claude = anthropic.map_messages(None, history)
    assert wire_rules.anthropic_errors(claude) == []
    uses = [
        b["id"]
        for m in claude
        if m["role"] == "assistant"
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]
    assert uses == IDS

    _system, contents = gemini.map_messages(None, history)
    assert wire_rules.gemini_errors(contents) == []


async def test_a_taken_over_step_gives_its_call_the_same_id(autojump_clock):
    # The first worker commits step 0 and dies in step 1's tool.
    store, first = MemoryStore(), MemoryStore()
    charger = Charger(hang_on=2)
    async with Host.open(store=first, log_tap=False) as host:
        session = await host.open_session(agent_with(charger), session_id=SID)
        async with session.stream("pay", turn_id=T, message_id=M, resume=True):
            await charger.hanging.wait()
            await trio.sleep(1)  # let the persister write step 0 (autojump clock)
            record = await first.load(SID)
            await store.save(SID, 0, record.messages, dict(record.meta))
    assert charger.runs[-1] == (2, IDS[1], f"{T}:1:{IDS[1]}")
    # Another worker takes the turn over: step 1 runs again, its call renamed alike.
    again = Charger()
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent_with(again), session_id=SID)
        async with session.stream("pay", turn_id=T, message_id=M, resume=True) as out:
            await out.collect()
    assert again.runs == [(2, IDS[1], f"{T}:1:{IDS[1]}")]  # the same idempotency key
    assert [m.tool_call_id for m in out.result.tool_messages] == IDS
    check_history((await store.load(SID)).messages)


def held_ids(parts: list[ToolCallPart]) -> set[str]:
    """The call ids a parts manager holding ``parts`` renames against."""
    return PartsManager(parts).call_ids


def test_an_id_new_to_the_message_is_kept_and_no_chunk_is_copied():
    ids = CallIds(held_ids([ToolCallPart(tool_call_id="a", tool_name="t", input={}, step=0)]), 1)
    start = ToolInputStartChunk(tool_call_id="b", tool_name="t")
    delta = ToolInputDeltaChunk(tool_call_id="b", delta="{}")
    call = ToolCallChunk(tool_call_id="b", tool_name="t", input={})
    assert ids.start(start) is start
    assert not ids.renamed  # the deltas are forwarded untouched
    assert ids.call(call) is call
    assert ids.delta(delta) is delta


def test_a_repeated_id_renames_every_chunk_of_its_call_and_repeats_within_one_response():
    held = held_ids([ToolCallPart(tool_call_id="call_0", tool_name="t", input={}, step=0)])
    ids = CallIds(held, 1)
    got = [
        ids.start(ToolInputStartChunk(tool_call_id="call_0", tool_name="t")).tool_call_id,
        ids.delta(ToolInputDeltaChunk(tool_call_id="call_0", delta="{")).tool_call_id,
        ids.call(ToolCallChunk(tool_call_id="call_0", tool_name="t", input={})).tool_call_id,
        # the same id twice more in the response: a call without streamed input, then one with
        ids.call(ToolCallChunk(tool_call_id="call_0", tool_name="t", input={})).tool_call_id,
        ids.start(ToolInputStartChunk(tool_call_id="call_0", tool_name="t")).tool_call_id,
        ids.call(ToolCallChunk(tool_call_id="call_0", tool_name="t", input={})).tool_call_id,
    ]
    assert got == ["call_0-1", "call_0-1", "call_0-1", "call_0-1-2", "call_0-1-3", "call_0-1-3"]
    # Derived, not drawn: the same parts and step give the same ids again.
    again = CallIds(held, 1)
    assert again.call(
        ToolCallChunk(tool_call_id="call_0", tool_name="t", input={})
    ).tool_call_id == ("call_0-1")


def test_only_the_renamed_forms_of_an_id_count_as_that_id():
    assert repeated_call_id("call_0", 3) == "call_0-3"
    assert repeated_call_id("call_0", 3, 2) == "call_0-3-2"
    for renamed in ("call_0", "call_0-3", "call_0-3-2"):
        assert is_call_id_of(renamed, "call_0")
    for other in ("call_01", "call_0-", "call_0-x", "call_0-3-2-1", "call_1-3", "call"):
        assert not is_call_id_of(other, "call_0")


async def test_a_step_made_again_by_the_fallback_gives_its_call_the_same_id():
    # The primary starts step 1's call_0 (streamed as call_0-1), then fails; the backup
    # makes the step again after a reset-step, and its call_0 is call_0-1 once more.
    busy = Overloaded("overloaded", provider="scripted", status_code=529)
    primary = ScriptedProvider(
        [STEPS[0], [ToolInputStartChunk(tool_call_id="call_0", tool_name="charge"), busy]],
        name="primary",
    )
    backup = ScriptedProvider([["unused"], *STEPS[1:]], name="backup")
    charger = Charger()
    agent = Agent(
        provider=[primary, backup], tools=[charger.tool()], retry=RetryPolicy(max_attempts=1)
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id=SID)
        async with session.stream("pay", turn_id=T) as out:
            chunks = await out.collect()
    started = [c.tool_call_id for c in chunks if c.type == "tool-input-start"]
    assert started == [IDS[0], IDS[1], IDS[1]]  # the second one voided by reset-step
    assert [c.type for c in chunks].count("reset-step") == 1
    assert [(n, i) for n, i, _ in charger.runs] == [(1, IDS[0]), (2, IDS[1])]
    check_history(session.messages)
