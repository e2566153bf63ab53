"""Reading a turn's stream with ``async for``: one generator per loop, no coroutine a
chunk, the same chunks in the same order, a loop left early closed with its stream
(issue 24 goal 1: ``TurnStream.__aiter__``)."""

from __future__ import annotations

import gc
import warnings

from trio.testing import wait_all_tasks_blocked

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, Host
from runtime.app.session import TurnStream

WORDS = "one two three four five six"


def _agent() -> Agent:
    return Agent(provider=ScriptedProvider([[WORDS]]))


async def test_async_for_over_a_stream_makes_no_anext_coroutine_a_chunk(monkeypatch):
    """``async for`` resumes the stream's generator for each chunk; ``__anext__`` (a
    coroutine made, run and freed for each) is not called: ~450 instructions a delta of
    a whole turn (callgrind). The chunks are the turn's, to its ``finish``."""
    calls = 0
    anext = TurnStream.__anext__

    async def counted_anext(self: TurnStream) -> object:
        nonlocal calls
        calls += 1
        return await anext(self)

    monkeypatch.setattr(TurnStream, "__anext__", counted_anext)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(_agent())
        async with session.stream("hi") as out:
            types = [chunk.type async for chunk in out]
    assert calls == 0
    assert types[0] == "start" and types[-1] == "finish" and "text-delta" in types


async def test_a_loop_left_early_and_a_second_loop_read_the_turn_s_chunks_once_in_order():
    """A ``break`` leaves the rest to the next ``async for`` over the same stream, from
    the chunk after the last one read (each loop has its own generator over the one
    buffer): together they read what one loop reads."""
    async with Host.open(log_tap=False) as host:
        whole = await host.open_session(_agent())
        async with whole.stream("hi") as out:
            want = [(chunk.type, getattr(chunk, "text", None)) async for chunk in out]
        session = await host.open_session(_agent())
        got = []
        async with session.stream("hi") as out:
            async for chunk in out:
                got.append((chunk.type, getattr(chunk, "text", None)))
                if chunk.type == "text-delta":
                    break
            async for chunk in out:
                got.append((chunk.type, getattr(chunk, "text", None)))
    kinds = [kind for kind, _ in want]
    assert len(got) == len(want) and kinds.count("text-delta") >= 2
    assert [kind for kind, _ in got] == kinds
    assert "".join(t for k, t in got if k == "text-delta") == WORDS


async def test_a_loop_left_early_is_closed_with_its_stream_not_collected_unfinished():
    """The generator a ``break`` left at its ``yield`` is closed when the ``async with``
    is left: collected unfinished, Trio would warn (``ResourceWarning``) and close it in a
    task of its own."""
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(_agent())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            async with session.stream("hi") as out:
                reader = aiter(out)
                async for chunk in reader:
                    if chunk.type == "text-delta":
                        break
                assert reader.ag_frame is not None  # waiting at its yield
            assert reader.ag_frame is None  # closed by the stream
            del reader, out
            gc.collect()
            await wait_all_tasks_blocked()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
