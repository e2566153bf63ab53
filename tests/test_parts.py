"""One parts manager decides part boundaries: the stream shows the parts that are stored.

Each test runs turns through every actor (scripted provider, engine, turn runner, stream
controller, persister) and compares the parts a client rebuilds from the output stream
with the parts of the saved assistant message (tests/support/parts.py).
"""

from __future__ import annotations

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from actors.stores import MemoryStore
from actors.stream_controller import StreamController
from runtime import (
    Agent,
    BadRequest,
    Host,
    ProviderDataChunk,
    ProviderDataPart,
    ReasoningChunk,
    ReasoningPart,
    TextChunk,
    TextPart,
    Usage,
    tool,
)
from runtime.actor_messages import (
    Batch,
    ConsumerItem,
    PartBegin,
    StepBegin,
    TurnBegin,
    TurnDone,
    TurnEnd,
    TurnResult,
)
from runtime.inbox import Inbox
from runtime.messages import AssistantMessage
from tests.support.grammar import check_grammar
from tests.support.parts import rebuild_parts, stored_parts


@tool
async def echo(v: int) -> int:
    """Return v."""
    return v


async def run_and_reload(steps, store=None):
    """Run one turn of ``steps``; the stream, the result, and the assistant message as
    stored (with a path, as a session resumed by a new host from that file shows it)."""
    agent = Agent(provider=ScriptedProvider(steps), tools=[echo])
    memory = MemoryStore() if store is None else None
    async with Host.open(store=memory or store, log_tap=False) as host:
        session = await host.open_session(agent, session_id="p")
        async with session.stream("go") as out:
            chunks = [c async for c in out]
    if memory is not None:
        record = await memory.load("p")
        assert record is not None
        return chunks, out.result, record.messages[1]
    async with Host.open(store=store, log_tap=False) as host:
        resumed = await host.open_session(agent, session_id="p")
        return chunks, out.result, resumed.messages[1]


async def test_text_provider_data_text_and_refusal_are_three_text_parts_streamed_and_stored(
    tmp_path,
):
    # The case: streamed as ONE text part, stored as three, before one manager.
    step = [
        TextChunk(text="before"),
        ProviderDataChunk(provider="anthropic", data={"type": "server_tool_use"}),
        TextChunk(text="after"),
        TextChunk(text="I can't", refusal=True),
    ]
    chunks, _, stored = await run_and_reload([step], store=str(tmp_path / "s.db"))

    assert [type(p) for p in stored.content] == [TextPart, ProviderDataPart, TextPart, TextPart]
    assert [p.refusal for p in stored.content if isinstance(p, TextPart)] == [False, False, True]
    assert rebuild_parts(chunks) == [
        ("text", 0, "before"),
        ("text", 0, "after"),
        ("text", 0, "I can't"),
    ]
    assert rebuild_parts(chunks) == stored_parts(stored.content)
    check_grammar(chunks)


async def test_an_empty_text_chunk_opens_no_part_in_the_stream_or_the_message():
    chunks, _, stored = await run_and_reload(
        [[ReasoningChunk(text="think"), TextChunk(text=""), ReasoningChunk(text="more")]]
    )
    assert [c.type for c in chunks if c.type.endswith("-start")] == [
        "step-start",
        "reasoning-start",
    ]
    assert stored_parts(stored.content) == [("reasoning", 0, "thinkmore")]


async def test_a_signed_empty_reasoning_block_is_a_part_in_the_stream_and_the_message():
    # Its signature must go back to the provider, so the message keeps it; the stream
    # shows it as a start and a finish with no delta.
    chunks, _, stored = await run_and_reload(
        [[ReasoningChunk(signature="sig", provider="anthropic"), "answer"]]
    )
    assert stored.content[0] == ReasoningPart(
        text="", step=0, signature="sig", provider="anthropic"
    )
    assert [c.type for c in chunks][2:4] == ["reasoning-start", "reasoning-finish"]
    assert rebuild_parts(chunks) == stored_parts(stored.content)


async def test_a_signature_ends_the_reasoning_part_and_the_next_reasoning_opens_another():
    step = [
        ReasoningChunk(text="one", signature="s1", provider="anthropic"),
        ReasoningChunk(text="two", signature="s2", provider="anthropic"),
    ]
    chunks, _, stored = await run_and_reload([step])
    assert [(p.text, p.signature) for p in stored.content] == [("one", "s1"), ("two", "s2")]
    assert rebuild_parts(chunks) == [("reasoning", 0, "one"), ("reasoning", 0, "two")]


async def test_a_turn_cancelled_in_the_middle_of_a_part_stores_that_part_as_streamed(
    autojump_clock,
):
    store = MemoryStore()
    agent = Agent(provider=ScriptedProvider([["seen ", Sleep(10), "never"]]))
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id="c")
        async with session.stream("go") as out:
            chunks = []
            async for c in out:
                chunks.append(c)
                if c.type == "text-delta":
                    out.cancel("stop")
    stored = (await store.load("c")).messages[1]
    assert stored.interrupted
    # "seen" goes through alone, before " " is produced (the provider lets its first
    # batch reach the consumer first): the consumer cancels in the middle of the part.
    assert rebuild_parts(chunks) == stored_parts(stored.content) == [("text", 0, "seen")]
    check_grammar(chunks, ending="abort")


async def test_the_controller_closes_a_part_left_open_when_the_turn_ends():
    # Only a crash mid-part can leave a part open; the grammar must hold even then.
    controller = StreamController(session_id="g")
    consumer: Inbox[ConsumerItem] = Inbox(64, name="consumer")
    done = TurnDone(
        result=TurnResult(
            turn_id="t", finish_reason="aborted", usage=Usage(), steps=0, message=AssistantMessage()
        )
    )
    batch = Batch("t")
    batch += [
        TurnBegin(turn_id="t", message_id="m", consumer=consumer),
        StepBegin(step=0),
        PartBegin(kind="text", part_id="p1"),
        TextChunk(text="cut"),
        TurnEnd(finish_reason="aborted", usage=Usage(), abort_reason="crash"),
        done,
    ]
    await controller.handle(batch)
    got = [item async for item in consumer]
    chunks = [c for item in got[:-1] for c in item]
    assert got[-1] is done  # the result comes last, after every chunk
    assert [c.type for c in chunks][-3:] == ["text-delta", "text-finish", "abort"]
    check_grammar(chunks, ending="abort")


# -- any sequence of chunks ----------------------------------------------------------------

texts = st.sampled_from(["", "a", " b", "<think>", "</think>", "<thi", "nk>", "c d"])
text_chunks = st.builds(TextChunk, text=texts, refusal=st.booleans())
unsigned_reasoning = st.builds(
    ReasoningChunk,
    text=st.sampled_from(["", "r", "s t"]),
    provider=st.sampled_from([None, "anthropic"]),
)
signed_reasoning = st.builds(
    ReasoningChunk,
    text=st.sampled_from(["", "r"]),
    signature=st.just("sig"),
    provider=st.just("anthropic"),
)
redacted_reasoning = st.builds(ReasoningChunk, redacted_data=st.just("opaque"))
provider_data = st.builds(
    ProviderDataChunk, provider=st.just("anthropic"), data=st.just({"type": "web_search"})
)
content = st.lists(
    st.one_of(text_chunks, unsigned_reasoning, signed_reasoning, redacted_reasoning, provider_data),
    max_size=8,
)


@st.composite
def turns(draw):
    """1-3 steps of random content; every step but the last makes a tool call somewhere
    in it (so the turn goes on), and the last may fail after its content."""
    n = draw(st.integers(1, 3))
    steps = []
    for i in range(n):
        items: list = draw(content)
        if i < n - 1:
            at = draw(st.integers(0, len(items)))
            items[at:at] = tool_call("echo", {"v": i}, tool_call_id=f"call{i}")
        steps.append(items)
    fails = draw(st.booleans())
    if fails:
        steps[-1].append(BadRequest("boom"))
    return steps, fails


@settings(max_examples=40)
@given(turns())
def test_parts_rebuilt_from_any_stream_equal_the_stored_parts(turn):
    steps, fails = turn
    chunks, result, stored = trio.run(run_and_reload, steps)

    check_grammar(chunks, ending="error" if fails else "finish")
    assert result.finish_reason == ("error" if fails else "stop")
    assert rebuild_parts(chunks) == stored_parts(stored.content)
    texts_streamed = [p for p in rebuild_parts(chunks) if p[0] != "tool-call"]
    assert all(p[2] for p in texts_streamed if p[0] == "text"), "a text part is never empty"


_RUN_ITEMS = st.lists(
    st.one_of(
        st.builds(TextChunk, text=st.sampled_from(["", "a", "bc"]), refusal=st.booleans()),
        st.builds(ReasoningChunk, text=st.sampled_from(["", "r"])),
    ),
    max_size=12,
)


@given(_RUN_ITEMS)
def test_a_run_of_text_fed_at_once_decides_what_one_at_a_time_does(items):
    """``PartsManager.texts`` (the turn runner's text runs) makes the same markers,
    forwarded chunks and stored parts as ``text`` called for each chunk."""
    from actors.turn.parts import PartsManager

    def feed(run_at_once: bool) -> tuple[list, list]:
        parts, out = PartsManager(), []
        i = 0
        while i < len(items):
            chunk = items[i]
            if type(chunk) is TextChunk and run_at_once:
                i = parts.texts(items, i, out)
                continue
            if type(chunk) is TextChunk:
                parts.text(chunk, out)
            else:
                parts.reasoning(chunk, out)
            i += 1
        parts.close(out)
        # part ids are fresh per manager: compare the sequence without them
        shape = [
            (type(x).__name__, getattr(x, "kind", None), getattr(x, "text", None)) for x in out
        ]
        stored = [(type(p).__name__, p.text, getattr(p, "refusal", None)) for p in parts.content]
        return shape, stored

    assert feed(True) == feed(False)
