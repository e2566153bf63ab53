"""A read's text deltas cross the engine and the turn runner as one ``TextRun`` (issue 24
goal 1), and the stream and the stored message say exactly what a text chunk per delta
says: each delta its own ``text-delta`` chunk, in order, with its own ``seq``.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.providers.anthropic import AnthropicProvider
from actors.providers.openai import OpenAIProvider
from actors.providers.read_batch import ReadBatch
from benchmarks.sse import anthropic_body, delta_texts, openai_body
from runtime import ProviderDataChunk, ReasoningChunk, TextChunk
from runtime.inbox import MAX_BATCH, MAX_RUN, Batch, Batcher, Inbox
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

    await out.text_list(["first"] + ["t"] * (MAX_RUN + 5))
    sent_before_the_flush = len(sink.calls)
    await out.flush()

    assert sent_before_the_flush == 2
    assert [len(items[0].texts) for items, _ in sink.calls[1:]] == [MAX_RUN, 5]


async def test_a_read_batch_with_runs_is_full_at_max_batch_items_too():
    """Runs carry up to MAX_RUN deltas a batch, but no more objects than MAX_BATCH are
    sent before the provider yields (the young collections, issue 24)."""
    out = ReadBatch(_Sink(), runs=True)
    await out.text_list(["first"])
    await out.flush()
    for _ in range(MAX_BATCH // 2 - 1):
        out.texts(["t"], 0)
        out.add(ProviderDataChunk(provider="anthropic", data={}))
    assert not out.urgent
    out.texts(["t"], 0)
    assert not out.urgent and len(out.out) == MAX_BATCH - 1
    out.add(ProviderDataChunk(provider="anthropic", data={}))
    assert out.urgent


async def test_a_run_and_the_chunks_of_the_read_before_it_count_toward_one_batch():
    out = ReadBatch(_Sink(), runs=True)
    await out.text_list(["first"])
    await out.flush()
    out.add(ProviderDataChunk(provider="anthropic", data={}))

    stop = out.texts(["t"] * MAX_RUN, 0)

    assert stop == MAX_RUN - 1
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


# -- the stream controller: a run longer than a batch, in pieces ------------------------------

_LONG_ITEMS = st.lists(
    st.one_of(
        st.builds(
            TextRun,
            texts=st.integers(1, 3 * MAX_BATCH + 7).map(lambda n: [f"w{i} " for i in range(n)]),
        ),
        st.builds(TextChunk, text=st.sampled_from(["a", "b c"])),
        st.builds(ReasoningChunk, text=st.sampled_from(["r", "s t"])),
        st.sampled_from(["text-begin", "text-end", "reasoning-begin", "step", "object"]),
    ),
    max_size=10,
)


class _Bus:
    """A bus with a subscriber for every chunk: what the controller publishes."""

    def __init__(self) -> None:
        self.published: list[Any] = []

    def has_subscribers(self) -> bool:
        return True

    def wants(self, kind: Any, session_id: Any) -> bool:
        return True

    async def publish(self, chunk: Any) -> None:
        self.published.append(chunk)


def _raw(items: list[Any], runs: bool) -> list[Any]:
    """The controller's raw items for ``items`` (a marker string named): with ``runs``
    the runs as they are, else a text chunk per delta."""
    from runtime.actor_messages import ObjectUpdate, PartBegin, PartEnd, StepBegin

    out: list[Any] = []
    for n, item in enumerate(items):
        if item == "text-begin":
            out.append(PartBegin(kind="text", part_id=f"p{n}"))
        elif item == "reasoning-begin":
            out.append(PartBegin(kind="reasoning", part_id=f"p{n}"))
        elif item == "text-end":
            out.append(PartEnd(kind="text", part_id=f"p{n - 1}"))
        elif item == "step":
            out.append(StepBegin(step=n))
        elif item == "object":
            out.append(ObjectUpdate(part_id=f"p{n}", value={"n": n}))
        elif type(item) is TextRun and not runs:
            out += [TextChunk(text=t) for t in item.texts]
        else:
            out.append(item)
    return out


async def _rendered(batches: list[list[Any]]) -> tuple[list[list[Any]], list[Any]]:
    """What a stream controller hands its consumer for ``batches``, batch by batch, and
    what it publishes on the bus."""
    from actors.stream_controller import StreamController
    from runtime.actor_messages import TurnBegin

    consumer: Inbox[Any] = Inbox(10_000)
    ctrl = StreamController(session_id="s")
    bus = _Bus()
    ctrl.bus = bus  # type: ignore[assignment]
    begin: Batch[Any] = Batch(None)
    begin.append(TurnBegin(turn_id="t", message_id="m", consumer=consumer))
    await ctrl.handle(begin)
    for items in batches:
        batch: Batch[Any] = Batch(None)
        batch.extend(items)
        await ctrl.handle(batch)
    got = []
    while len(consumer):
        got.append(list(consumer.get_nowait()))
    return got, bus.published


@settings(max_examples=80, deadline=None)
@given(st.lists(_LONG_ITEMS, min_size=1, max_size=3))
def test_a_run_longer_than_a_batch_renders_as_the_same_chunks_as_text_chunks(batches):
    """A run of more deltas than a batch takes is built and sent a piece at a time: the
    consumer and the bus get the same chunks (classes, fields, seqs, order) as from a
    text chunk per delta, and no batch of the consumer's holds more than MAX_BATCH."""
    fast, fast_bus = trio.run(_rendered, [_raw(b, runs=True) for b in batches])
    slow, slow_bus = trio.run(_rendered, [_raw(b, runs=False) for b in batches])

    flat = [c for b in fast for c in b]
    assert flat == [c for b in slow for c in b]
    assert [type(c) for c in flat] == [type(c) for b in slow for c in b]
    assert fast_bus == slow_bus == flat
    assert all(len(b) <= MAX_BATCH for b in fast)


async def test_a_long_run_reaches_the_consumer_a_batch_at_a_time():
    """The pieces of a run go to the consumer with a schedule point between: it takes
    the first before the last is built, each at most MAX_BATCH chunks."""
    from actors.stream_controller import StreamController
    from runtime.actor_messages import PartBegin, TurnBegin

    texts = [f"w{i} " for i in range(MAX_RUN)]
    consumer: Inbox[Any] = Inbox(10_000)
    ctrl = StreamController(session_id="s")
    begin: Batch[Any] = Batch(None)
    begin.append(TurnBegin(turn_id="t", message_id="m", consumer=consumer))
    await ctrl.handle(begin)
    consumer.get_nowait().taken = True  # the start chunk (a consumer marks what it took)
    batch: Batch[Any] = Batch(None)
    batch.extend([PartBegin(kind="text", part_id="p"), TextRun(texts=texts)])
    seen: list[tuple[int, int]] = []  # (chunks, the controller's seq) as each batch came

    async def consume() -> None:
        while sum(n for n, _ in seen) < 1 + MAX_RUN:
            got = await consumer.get()
            got.taken = True
            seen.append((len(got), ctrl.seq))

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await trio.testing.wait_all_tasks_blocked()
            await ctrl.handle(batch)

    assert max(n for n, _ in seen) <= MAX_BATCH
    assert seen[0][1] < ctrl.seq  # the first piece was taken before the last was built
    assert sum(n for n, _ in seen) == 1 + MAX_RUN


async def test_a_turn_with_runs_longer_than_a_batch_streams_and_stores_the_same():
    items = [TextRun(texts=[f"w{i} " for i in range(n)]) for n in (MAX_BATCH + 1, MAX_RUN, 3)]

    runs, _, stored = await run_and_reload([items])
    chunks, _, stored_chunks = await run_and_reload([_as_chunks(items)])

    check_grammar(runs, ending="finish")
    assert _shape(runs) == _shape(chunks)
    assert stored_parts(stored.content) == stored_parts(stored_chunks.content)
