"""A read's text deltas cross the engine and the turn runner as one ``TextRun`` (issue 24
goal 1), and the stream and the stored message say exactly what a text chunk per delta
says: each delta its own ``text-delta`` chunk, in order, with its own ``seq``.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.providers.anthropic import AnthropicProvider
from actors.providers.openai import OpenAIProvider
from actors.providers.read_batch import ReadBatch
from benchmarks.sse import anthropic_body, delta_texts, openai_body
from runtime import ProviderDataChunk, ReasoningChunk, TextChunk
from runtime.inbox import MAX_BATCH, Batch, Batcher, Inbox
from runtime.provider import TextRun
from tests.support.grammar import check_grammar
from tests.support.loopback import Reply, loopback_server
from tests.support.parts import rebuild_parts, stored_parts
from tests.support.provider_calls import make_request
from tests.test_parts import run_and_reload

KEY = "sk-test-not-a-real-key"

# -- the whole pipeline: runs against the same deltas as chunks ----------------------------

_TEXTS = st.sampled_from(["a", " b", "<think>", "</think>", "<thi", "nk>", "c d", "x<y"])
_ITEMS = st.lists(
    st.one_of(
        st.builds(TextRun, texts=st.lists(_TEXTS, min_size=1, max_size=5)),
        st.builds(TextChunk, text=st.sampled_from(["", "a", "<think>"]), refusal=st.booleans()),
        st.builds(ReasoningChunk, text=st.sampled_from(["r", "s t"])),
        st.builds(ReasoningChunk, text=st.just("r"), signature=st.just("sig")),
        st.builds(
            ProviderDataChunk, provider=st.just("anthropic"), data=st.just({"type": "web_search"})
        ),
    ),
    max_size=8,
)


def _as_chunks(items: list[Any]) -> list[Any]:
    """``items`` with each run as a text chunk per delta: what a provider sends a
    requester that takes no runs."""
    out: list[Any] = []
    for item in items:
        if type(item) is TextRun:
            out += [TextChunk(text=t) for t in item.texts]
        else:
            out.append(item)
    return out


def _shape(chunks: list[Any]) -> list[tuple[Any, ...]]:
    """The stream without its fresh ids: each chunk's type, text, seq and step."""
    return [(c.type, getattr(c, "text", None), c.seq, getattr(c, "step", None)) for c in chunks]


@settings(max_examples=60, deadline=None)
@given(_ITEMS)
def test_a_turn_streams_and_stores_its_runs_as_the_same_deltas_as_text_chunks(items):
    runs, result, stored = trio.run(run_and_reload, [items])
    chunks, _, stored_chunks = trio.run(run_and_reload, [_as_chunks(items)])

    check_grammar(runs, ending="finish")
    assert _shape(runs) == _shape(chunks)
    assert rebuild_parts(runs) == stored_parts(stored.content)
    assert stored_parts(stored.content) == stored_parts(stored_chunks.content)
    assert result.finish_reason == "stop"


async def test_each_text_of_a_run_is_a_text_delta_of_its_own_with_the_next_seq():
    items = [TextRun(texts=["a", "b", "c"]), TextRun(texts=["d"])]

    chunks, _, stored = await run_and_reload([items])

    deltas = [c for c in chunks if c.type == "text-delta"]
    assert [c.text for c in deltas] == ["a", "b", "c", "d"]
    assert [c.seq for c in deltas] == list(range(deltas[0].seq, deltas[0].seq + 4))
    assert len({c.part_id for c in deltas}) == 1
    assert stored.content[0].text == "abcd"


# -- the provider's read batch --------------------------------------------------------------


class _Sink:
    """An ``emit`` with ``send_all`` that records each call's items and ``whole``."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[Any], bool]] = []

    async def __call__(self, item: Any) -> None:
        self.calls.append(([item], False))

    async def send_all(self, items: Any, *, whole: bool = False) -> None:
        self.calls.append((list(items), whole))


async def test_a_read_batch_with_runs_sends_the_first_delta_alone_and_the_rest_as_one_run():
    sink = _Sink()
    out = ReadBatch(sink, runs=True)

    await out.text_list(["first", "a", "", "b", "c"])
    await out.flush()

    (first, first_whole), (rest, rest_whole) = sink.calls
    assert first == [TextChunk(text="first")] and not first_whole
    assert [type(x) for x in rest] == [TextRun] and rest[0].texts == ["a", "b", "c"]
    assert rest_whole


async def test_a_read_batch_sends_a_run_when_its_deltas_fill_a_batch():
    sink = _Sink()
    out = ReadBatch(sink, runs=True)

    await out.text_list(["first"] + ["t"] * (MAX_BATCH + 5))
    sent_before_the_flush = len(sink.calls)
    await out.flush()

    assert sent_before_the_flush == 2
    assert [len(items[0].texts) for items, _ in sink.calls[1:]] == [MAX_BATCH, 5]


async def test_a_run_and_the_chunks_of_the_read_before_it_count_toward_one_batch():
    out = ReadBatch(_Sink(), runs=True)
    await out.text_list(["first"])
    await out.flush()
    out.add(ProviderDataChunk(provider="anthropic", data={}))

    stop = out.texts(["t"] * MAX_BATCH, 0)

    assert stop == MAX_BATCH - 1
    assert out.urgent


async def test_a_read_batch_without_runs_sends_a_text_chunk_per_delta():
    sink = _Sink()
    out = ReadBatch(sink)

    await out.text_list(["first", "a", "b"])
    await out.flush()

    assert sink.calls[1] == ([TextChunk(text="a"), TextChunk(text="b")], False)


# -- batches of runs go whole ---------------------------------------------------------------


async def test_items_sent_whole_do_not_join_a_waiting_batch():
    inbox: Inbox[Batch[Any]] = Inbox()
    out: Batcher[Any] = Batcher(inbox, "r")
    await out.send_all(["x"])

    await out.send_all([TextRun(texts=["a", "b"])], whole=True)

    assert len(inbox) == 2


async def test_nothing_joins_a_batch_sent_whole_while_it_waits():
    inbox: Inbox[Batch[Any]] = Inbox()
    out: Batcher[Any] = Batcher(inbox, "r")
    run = TextRun(texts=["a", "b"])
    await out.send_all([run], whole=True)

    await out.send("y")
    await out.send_all(["z"])
    assert out.try_send_all(["w"])

    batches = [list(inbox.get_nowait()) for _ in range(len(inbox))]
    assert batches == [[run], ["y", "z", "w"]]


async def test_nothing_joins_a_batch_sent_whole_by_try_send_all_either():
    inbox: Inbox[Batch[Any]] = Inbox()
    out: Batcher[Any] = Batcher(inbox, "r")
    run = TextRun(texts=["a", "b"])
    await out.send_all([run], whole=True)

    assert out.try_send_all(["w"])

    batches = [list(inbox.get_nowait()) for _ in range(len(inbox))]
    assert batches == [[run], ["w"]]


# -- the providers: the same deltas, as runs ------------------------------------------------


async def _deltas(provider: Any, body: bytes, *, runs: bool) -> tuple[list[str], int]:
    """The text deltas ``provider`` emits for ``body`` (runs spread into their texts),
    and how many runs it sent."""
    sink = _Sink()
    async with loopback_server(Reply(body=body)) as server:
        provider = provider(server.url)
        request = attrs.evolve(make_request(), text_runs=runs)
        with trio.fail_after(20):
            await provider.stream(request, sink)
        await provider.aclose()
    texts: list[str] = []
    count = 0
    for items, _ in sink.calls:
        for item in items:
            if type(item) is TextRun:
                count += 1
                texts += item.texts
            elif type(item) is TextChunk:
                texts.append(item.text)
    return texts, count


async def test_the_anthropic_provider_sends_a_request_that_takes_runs_the_same_deltas():
    def anthropic(url: str) -> Any:
        return AnthropicProvider("claude-sonnet-4-5", base_url=url, api_key=KEY)

    body = anthropic_body(600)
    runs, count = await _deltas(anthropic, body, runs=True)
    chunks, none = await _deltas(anthropic, body, runs=False)

    assert runs == chunks == delta_texts(600)
    assert count > 0 and none == 0


async def test_the_openai_provider_sends_a_request_that_takes_runs_the_same_deltas():
    def openai(url: str) -> Any:
        return OpenAIProvider("gpt-4o-mini", base_url=url + "/v1", api_key=KEY)

    body = openai_body(600)
    runs, count = await _deltas(openai, body, runs=True)
    chunks, none = await _deltas(openai, body, runs=False)

    assert runs == chunks == delta_texts(600)
    assert count > 0 and none == 0
