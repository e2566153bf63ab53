"""A turn taken over after its last committed step paused (Anthropic's ``pause_turn`` or
``compaction`` stop: :attr:`FinishChunk.resume <runtime.chunks.FinishChunk.resume>`)
continues that step, as the worker that began it would have, and the pauses it
continued count on across the takeover (``MAX_RESUMES``).

A dead worker is simulated as in tests/test_turn_resume.py: what the store held once the
paused steps were saved (the next model call hanging) is copied into the store a second
host opens."""

from __future__ import annotations

import attrs
import httpx
import trio

from actors.providers.scripted import ScriptedProvider, Sleep
from actors.stores import MemoryStore
from actors.stores.sqlite import SQLiteStore
from actors.turn import runner as runner_module
from actors.turn.takeover import PAUSED_META
from runtime import Agent, Host
from runtime.approval import WAITING_META
from runtime.chunks import FinishChunk, TextChunk
from runtime.liveness import RUNNING_META, public_meta
from runtime.messages import AssistantMessage, TextPart, UserMessage
from tests.web.harness import web_server

T, M, SID = "turn-p", "msg-p", "paused"


def paused(text: str) -> list[object]:
    return [TextChunk(text=text), FinishChunk(reason="other", resume=True)]


async def commit_paused(
    store: MemoryStore, pauses: int, *, interrupted: bool = False, cancel: bool = False
) -> None:
    """Run the turn on a first host through ``pauses`` paused steps, its next model call
    hanging, and copy what its store holds then into ``store`` (with ``interrupted``,
    its message marked so, as a restarted embedded host settles a dead writer's turn;
    with ``cancel``, the turn is cut there instead, as a worker shutting down cuts it,
    and saved so)."""
    steps = [paused(f"part {n}.") for n in range(pauses)]
    provider = ScriptedProvider([*steps, [Sleep(10_000), "never"]])
    first = MemoryStore()
    async with Host.open(store=first, log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider), session_id=SID)
        async with session.stream("search", turn_id=T, message_id=M, resume=True) as out:
            await trio.sleep(10)  # the paused steps run and are saved (autojump clock)
            assert len(provider.requests) == pauses + 1  # the next call hangs
            if cancel:
                out.cancel("worker shutting down")
            else:
                record = await first.load(SID)
        if cancel:
            record = await first.load(SID)
    messages = list(record.messages)
    meta = dict(record.meta)
    if interrupted:
        messages[1] = attrs.evolve(messages[1], interrupted=True)
        meta[RUNNING_META] = None
    await store.save(SID, 0, messages, meta)
    assert [p.step for p in messages[1].content] == list(range(pauses))


async def take_over(store: MemoryStore, committed: int, *steps: list[object]):
    """Take the turn over, the model answering ``steps`` from step ``committed`` on (the
    scripted provider picks its step by the steps the turn's message holds)."""
    provider = ScriptedProvider([*(["unused"] for _ in range(committed)), *steps])
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider), session_id=SID)
        async with session.stream("search", turn_id=T, message_id=M, resume=True) as out:
            chunks = await out.collect()
    return chunks, out.result, provider


async def test_a_turn_taken_over_after_a_paused_step_continues_it(autojump_clock):
    store = MemoryStore()
    await commit_paused(store, 1)
    chunks, result, provider = await take_over(store, 1, [" done."])
    assert len(provider.requests) == 1  # the continuation; step 0 is the first worker's
    last = provider.requests[0].messages[-1]
    assert last.role == "assistant" and last.text == "part 0."  # the paused answer, last
    assert [c.step for c in chunks if c.type == "step-start"] == [1]
    assert result.finish_reason == "stop"
    record = await store.load(SID)
    answer = record.messages[1]
    assert answer.id == M and answer.status == "complete"
    assert [(p.step, p.text) for p in answer.content] == [(0, "part 0."), (1, " done.")]
    assert record.meta[PAUSED_META] is None  # the turn ended: nothing to continue


async def test_the_pauses_continued_before_the_takeover_count_toward_max_resumes(
    autojump_clock, monkeypatch
):
    monkeypatch.setattr(runner_module, "MAX_RESUMES", 2)
    store = MemoryStore()
    await commit_paused(store, 2)  # steps 0 and 1 paused, both continued
    assert (await store.load(SID)).meta[PAUSED_META] == {"turn_id": T, "step": 1, "resumed": 2}
    _, result, provider = await take_over(store, 2, paused("part 2."), paused("x"), ["y"])
    # step 2 pauses again: the third pause of the turn, past MAX_RESUMES=2, ends it
    assert len(provider.requests) == 1
    assert result.finish_reason == "other"
    answer = (await store.load(SID)).messages[1]
    assert [p.step for p in answer.content] == [0, 1, 2]


async def test_a_paused_step_of_a_message_marked_interrupted_is_kept_and_continued(
    autojump_clock,
):
    """An embedded host that restarts marks the dead writer's message interrupted
    (runtime.liveness): the paused step was saved whole, so it is not run again."""
    store = MemoryStore()
    await commit_paused(store, 1, interrupted=True)
    _, result, provider = await take_over(store, 1, [" done."])
    assert len(provider.requests) == 1
    assert provider.requests[0].messages[-1].text == "part 0."
    answer = (await store.load(SID)).messages[1]
    assert answer.status == "complete" and answer.text == "part 0. done."
    assert result.finish_reason == "stop"


async def test_a_turn_cut_after_a_paused_step_and_taken_over_continues_it(autojump_clock):
    """A worker shutting down cuts the turn in the continuation's call (saved interrupted,
    the paused step's mark kept): the worker that takes it over continues the pause."""
    store = MemoryStore()
    await commit_paused(store, 1, cancel=True)
    cut = await store.load(SID)
    assert cut.messages[1].interrupted
    assert cut.meta[PAUSED_META] == {"turn_id": T, "step": 0, "resumed": 1}
    _, result, provider = await take_over(store, 1, [" done."])
    assert len(provider.requests) == 1
    assert provider.requests[0].messages[-1].text == "part 0."
    record = await store.load(SID)
    assert record.messages[1].text == "part 0. done." and result.finish_reason == "stop"
    assert record.meta[PAUSED_META] is None


async def later_turn(store: MemoryStore) -> ScriptedProvider:
    """After the cut paused turn, the session's next turn (``turn-2``, ``msg-2``) runs
    to its answer on another host."""
    provider = ScriptedProvider(["hello"])
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider), session_id=SID)
        assert PAUSED_META not in session.meta  # the runner's own: not the application's
        async with session.stream("next", turn_id="turn-2", message_id="msg-2") as out:
            await out.collect()
    assert out.result.text == "hello"
    return provider


async def test_a_later_turn_leaves_the_mark_of_another_turn_alone(autojump_clock):
    """The mark names its turn: a later turn's saves neither write it back nor clear it
    (it is not in the meta the application holds, which a turn's saves carry)."""
    store = MemoryStore()
    await commit_paused(store, 1, cancel=True)
    await later_turn(store)
    record = await store.load(SID)
    assert record.meta[PAUSED_META] == {"turn_id": T, "step": 0, "resumed": 1}
    assert record.messages[-1].text == "hello"


async def test_a_stale_mark_does_not_make_a_later_turn_taken_over_continue(autojump_clock):
    """The cut turn's mark stays stored: the later turn, taken over once its answer is
    saved (a worker that died before the queue heard), is over, not continued."""
    store = MemoryStore()
    await commit_paused(store, 1, cancel=True)
    await later_turn(store)
    provider = ScriptedProvider([["never"]])
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider), session_id=SID)
        async with session.stream("next", turn_id="turn-2", message_id="msg-2", resume=True) as out:
            await out.collect()
    assert len(provider.requests) == 0
    assert (await store.load(SID)).messages[-1].text == "hello"


async def test_a_stale_mark_does_not_continue_its_turn_once_a_later_turn_followed(
    autojump_clock,
):
    """The cut turn itself resumed after a later turn answered: its paused step is not
    continued there (the history goes on past it)."""
    store = MemoryStore()
    await commit_paused(store, 1, cancel=True)
    await later_turn(store)
    before = await store.load(SID)
    provider = ScriptedProvider([["never"]])
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider), session_id=SID)
        async with session.stream("search", turn_id=T, message_id=M, resume=True) as out:
            await out.collect()
    assert len(provider.requests) == 0
    assert [m.id for m in (await store.load(SID)).messages] == [m.id for m in before.messages]


class CountingStore(MemoryStore):
    """A memory store that keeps the meta of each save it is asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.metas: list[dict[str, object]] = []

    async def save(self, session_id, start, messages, meta=None, **kwargs):
        self.metas.append(dict(meta or {}))
        return await super().save(session_id, start, messages, meta, **kwargs)


async def test_a_paused_turn_clears_its_mark_in_its_last_steps_save_and_writes_no_more(
    autojump_clock,
):
    """The mark is set by the paused step's save and cleared by the save of the step
    that ends the turn; the turn's final save, the same, costs no write."""
    store = CountingStore()
    provider = ScriptedProvider([paused("part 0."), [" done."]])
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider), session_id=SID)
        async with session.stream("search", turn_id=T, message_id=M) as out:
            await out.collect()
    assert out.result.text == "part 0. done."
    assert [m.get(PAUSED_META) for m in store.metas] == [
        {"turn_id": T, "step": 0, "resumed": 1},
        None,
    ]


async def test_the_web_api_shows_no_paused_mark_in_a_sessions_meta(tmp_path):
    """``GET /api/sessions`` and ``/api/sessions/{id}`` give the application's meta: the
    runner's own keys (the paused mark, the running marker) left out, ``awaiting_input``
    (what lists read) and the application's kept; the worker front end's lists use the
    same :func:`~runtime.liveness.public_meta`."""
    path = tmp_path / "s.db"
    mark = {"turn_id": T, "step": 0, "resumed": 1}
    meta = {PAUSED_META: mark, RUNNING_META: None, WAITING_META: 0, "title": "t"}
    store = await SQLiteStore.open(path)
    answer = AssistantMessage(id=M, content=(TextPart(text="part 0.", step=0),))
    await store.save(SID, 0, (UserMessage(content="search"), answer), meta)
    await store.aclose()
    async with web_server(Agent(provider=ScriptedProvider(["x"])), store=str(path)) as server:
        async with httpx.AsyncClient(timeout=30) as http:
            listed = (await http.get(f"{server.url}/api/sessions")).json()["sessions"]
            one = (await http.get(f"{server.url}/api/sessions/{SID}")).json()
    shown = {WAITING_META: 0, "title": "t"}
    assert [s["meta"] for s in listed] == [shown]
    assert one["meta"] == shown
    assert public_meta(meta) == shown
