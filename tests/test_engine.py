"""The think-tag partitioner: any chunking of the same text gives the same partition."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from actors.engine import ThinkTagSplitter


def partition(pieces: list[str], tags=(("<think>", "</think>"),)) -> list[tuple[bool, str]]:
    splitter = ThinkTagSplitter(tags)
    out: list[tuple[bool, str]] = []
    for piece in pieces:
        out += splitter.feed(piece)
    out += splitter.flush()
    merged: list[tuple[bool, str]] = []
    for kind, text in out:
        assert text, "no empty pieces"
        if merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + text)
        else:
            merged.append((kind, text))
    return merged


def chunkings(text: str):
    """Split ``text`` at arbitrary cut points."""
    return st.lists(st.integers(0, len(text)), max_size=12).map(
        lambda cuts: [
            text[a:b] for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(text)], strict=True)
        ]
    )


fragments = st.lists(
    st.sampled_from(
        [
            "<think>",
            "</think>",
            "<",
            ">",
            "<th",
            "ink>",
            "/",
            "a",
            "b c",
            "\n",
            "é",
            "<thinking>",
            "</thinking>",
            "<think",
            "think>",
            " ",
        ]
    ),
    max_size=20,
).map("".join)


@given(st.data(), fragments)
def test_any_chunking_gives_the_same_partition(data, text):
    whole = partition([text])
    pieces = data.draw(chunkings(text))
    assert "".join(pieces) == text
    assert partition(pieces) == whole


def reference(text: str, open_: str = "<think>", close: str = "</think>"):
    """A character-by-character oracle, independent of the streaming implementation."""
    out: list[tuple[bool, str]] = []
    inside, i, buf = False, 0, ""
    while i < len(text):
        tag = close if inside else open_
        if text.startswith(tag, i):
            if buf:
                out.append((inside, buf))
            buf, inside, i = "", not inside, i + len(tag)
        else:
            buf += text[i]
            i += 1
    if buf:
        out.append((inside, buf))
    merged: list[tuple[bool, str]] = []
    for kind, t in out:
        if merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + t)
        else:
            merged.append((kind, t))
    return merged


@given(st.data(), fragments)
def test_chunked_partition_matches_a_character_by_character_reference(data, text):
    pieces = data.draw(chunkings(text))
    assert partition(pieces) == reference(text)


@given(
    st.data(),
    st.sampled_from([("<think>", "</think>"), ("<thinking>", "</thinking>")]),
    st.text(alphabet="ab <>/\n", max_size=20),
    st.text(alphabet="ab <>\n", max_size=20),
)
def test_configured_tag_splits_reasoning_from_text_at_any_cut(data, tags, reasoning, answer):
    open_, close = tags
    reasoning = reasoning.replace(close, "")
    answer = answer.replace(open_, "")
    text = f"{open_}{reasoning}{close}{answer}"
    pieces = data.draw(chunkings(text))
    result = partition(pieces, (tags,))
    expected = [(True, reasoning)] if reasoning else []
    if answer:
        expected.append((False, answer))
    # a '<' at the end of the reasoning may merge with the close tag only if it forms it
    assert result == partition([text], (tags,))
    if close[:-1] not in reasoning + close[:1] and not reasoning.endswith("<"):
        assert result == expected


def test_tag_cut_mid_word_does_not_leak_reasoning_into_text():
    assert partition(["<thi", "nk>secret</th", "ink>answer"]) == [
        (True, "secret"),
        (False, "answer"),
    ]


def test_unclosed_tag_at_end_of_stream_is_reasoning():
    assert partition(["before <think>still thinking"]) == [
        (False, "before "),
        (True, "still thinking"),
    ]


def test_empty_think_block_produces_no_part():
    assert partition(["<think></think>", "answer"]) == [(False, "answer")]


def test_lone_angle_bracket_is_held_back_then_released():
    splitter = ThinkTagSplitter()
    assert splitter.feed("a <") == [(False, "a ")]
    assert splitter.feed("b") == [(False, "<b")]


def test_text_without_tag_characters_passes_straight_through():
    splitter = ThinkTagSplitter()
    assert splitter.feed("plain text") == [(False, "plain text")]
    assert splitter.flush() == []


def test_thinking_tags_are_left_alone_by_a_think_only_splitter():
    assert partition(["<thinking>x</thinking>y"]) == [(False, "<thinking>x</thinking>y")]


async def test_engine_splits_tags_inside_a_scripted_turn():
    from actors.providers.scripted import ScriptedProvider
    from runtime import Agent, Host, ReasoningPart, TextChunk, TextPart

    steps = [[TextChunk(text="<thi"), TextChunk(text="nk>plan</thi"), TextChunk(text="nk>answer")]]
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=ScriptedProvider(steps)))
        async with session.stream("q") as out:
            types = [c.type async for c in out]
    parts = session.messages[1].content
    assert parts == (ReasoningPart(text="plan", step=0), TextPart(text="answer", step=0))
    assert "reasoning-delta" in types and types.index("reasoning-finish") < types.index(
        "text-start"
    )


def test_the_engine_and_the_agent_share_one_think_tag_default():
    # Defaulted in one place: an engine built without tags splits what an agent's
    # default think_tags would, and changing that one default changes both.
    from actors.engine import Engine
    from runtime import Agent, Inbox
    from runtime.agent import DEFAULT_THINK_TAGS

    assert Engine(Inbox(1)).tags == Agent().think_tags == DEFAULT_THINK_TAGS
    assert ThinkTagSplitter().feed("<think>r</think>a") == [(True, "r"), (False, "a")]


async def test_the_engine_forwards_nothing_of_a_call_its_requester_cancelled():
    # The runner reads a call's output no more once it cancelled the call: what the
    # engine forwarded after that stayed in the runner's inbox while the session idled.
    import trio

    from actors.engine import Engine
    from runtime import Inbox, TextChunk
    from runtime.actor_messages import BeginRequest
    from runtime.inbox import Batch

    out: Inbox = Inbox(4)
    engine = Engine(out)
    scope = trio.CancelScope()
    await engine.handle(BeginRequest(request_id="r", cancel_scope=scope))
    before, after = Batch("r"), Batch("r")
    before.append(TextChunk(text="a"))
    after.append(TextChunk(text="b"))
    await engine.handle(before)
    scope.cancel()
    await engine.handle(after)
    assert [[c.text for c in b] for b in (out.get_nowait(),)] == [["a"]]
    assert len(out) == 0 and after.taken


async def test_a_call_the_runner_is_done_with_is_let_go_by_the_engine():
    # The runner ends a call and discards what it left unread: the engine's batcher let
    # go of the batch it sent last only at the session's next call or rest (an idle
    # session kept it: test_host_leaks under load).
    import gc

    from actors.engine import Engine
    from runtime import Inbox, TextChunk
    from runtime.actor_messages import BeginRequest
    from runtime.inbox import Batch, Batcher

    out: Inbox = Inbox(4)
    engine = Engine(out)
    await engine.handle(BeginRequest(request_id="r"))
    first = Batch("r")
    first.append(TextChunk(text="a"))
    await engine.handle(first)
    sent = out.get_nowait()  # (unread: discarded by the runner)
    engine.forget_call("r")
    assert not [r for r in gc.get_referrers(sent) if isinstance(r, Batcher)]
