"""The store conformance kit: what every :class:`~runtime.store.Store` must do.

A store (the built-in memory, SQLite and PostgreSQL stores, or a plug-in's through the
``axon.stores`` entry points) passes this suite, or the host cannot rely on it: a round
trip of every message and part shape, append and replace-the-tail saves, shallow meta
merges, the session-id rule, all-or-nothing saves (bad input and cancellation change
nothing), concurrent writers, agreement with a reference model under random operations,
a closed store refusing calls, and the version rule (a save on a stale version never
overwrites another writer's).

Use it from a test module, with a ``store`` fixture that yields a fresh, empty store and
closes it after (pytest and pytest-trio are needed; nothing in Axon imports this)::

    import pytest
    from runtime.testing.stores import StoreConformance

    from my_package.store import RedisStore


    class TestRedisStore(StoreConformance):
        @pytest.fixture
        async def store(self):
            store = await RedisStore.open("redis://localhost/15")
            try:
                yield store
            finally:
                await store.aclose()

A store whose ``list_sessions`` pages (takes ``limit`` and ``after``) adds
:class:`StorePaging`: ``class TestRedisStore(StoreConformance, StorePaging)``. It is a
class apart so that a store written before paging, which the runtime pages by slicing its
full list, still passes :class:`StoreConformance` as it did.

A store whose ``save`` takes ``kept`` (:class:`~runtime.store.Store`'s kept rows: the
messages of a save the store holds as they are, not written again) adds
:class:`StoreKeptRows`, apart for the same reason: the runtime saves a store without them
from the first message not kept.

A store whose ``save`` takes ``grown`` (:class:`~runtime.store.Store`'s grown rows: a
running turn's answer written as its new parts) adds :class:`StoreGrownRows`; the
runtime's :func:`~runtime.store.save_keeping` with ``grown`` over any store (a store
without them writes the message whole) is in :class:`StoreConformance`.

A store that records incarnations (:attr:`~runtime.store.SessionRecord.incarnation`: the
version of a session's first save, which tells the runtime a session deleted and created
again under the same id from another writer's saves) adds :class:`StoreIncarnations`, a
class apart for the same reason: a store written before them reports ``0`` (the record's
default), which the runtime reads as "not recorded", and passes :class:`StoreConformance`
as it did.

A store that keeps deletion marks (``deletions`` and ``version_and_deletions``: a number
per id that grows with each deletion of it, which tells a turn begun on a session not
stored yet a session deleted since from another writer's new one) adds
:class:`StoreDeletionMarks`; the runtime's read of them over any store (``None``: none
kept, rebased as before) is in :class:`StoreConformance`.

A store whose ``delete`` deletes the sub-sessions a session's agent tools ran in, at any
depth (the built-in ones), adds :class:`StoreSubSessions`.

The data helpers (:func:`conversation`, :func:`turn`, :func:`record`) are public too, for
a store's own tests beyond the kit.
"""

from __future__ import annotations

import random
from typing import Any

import attrs
import pytest
import trio

from runtime.errors import (
    InvalidCursor,
    InvalidSessionId,
    SessionDeleted,
    StoreConflict,
    StoreError,
)
from runtime.messages import (
    AssistantMessage,
    Message,
    ProviderDataPart,
    ReasoningPart,
    SystemMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from runtime.store import (
    SessionInfo,
    SessionRecord,
    Store,
    checks_absent_mark,
    deletion_mark,
    has_user_messages,
    list_page,
    load_last_turn,
    load_last_turns,
    save_keeping,
    version_and_mark,
)
from runtime.tools import PARENT_SESSION_META, sub_session_id

# -- data --------------------------------------------------------------------------------


def conversation() -> list[Message]:
    """One full turn exercising every message and part shape a store must round-trip.

    Ids are fixed so that two calls give equal values.
    """
    messages: list[Message] = [
        SystemMessage(content="You are terse."),
        UserMessage(content='Weather in Paris and Oslo? ☀️ «ünïcode» "quotes" \\ \x00'),
        AssistantMessage(
            content=(
                ReasoningPart(
                    text="Two lookups needed.", step=0, signature="sig-abc", provider="anthropic"
                ),
                ReasoningPart(text="", step=0, redacted_data="ZW5jcnlwdGVk", provider="anthropic"),
                TextPart(text="Checking.", step=0),
                ToolCallPart(
                    tool_call_id="call_1",
                    tool_name="weather",
                    input={"city": "Paris", "days": [1, 2], "units": None},
                    step=0,
                ),
                ToolCallPart(
                    tool_call_id="call_2", tool_name="weather", input={"city": "Oslo"}, step=0
                ),
                ProviderDataPart(
                    provider="anthropic",
                    data={"type": "server_tool_use", "id": "srv_1", "input": {"q": "x"}},
                    step=1,
                ),
                ToolCallPart(tool_call_id="call_3", tool_name="convert", input=21.5, step=1),
                TextPart(text="Paris is sunny; Oslo did not answer.", step=2),
                TextPart(text="I won't guess.", step=2, refusal=True),
            )
        ),
        ToolMessage(
            tool_call_id="call_1",
            tool_name="weather",
            step=0,
            output={"temp": 21.5, "sky": "clear", "hourly": [20, 21, None], "ok": True},
        ),
        ToolMessage(
            tool_call_id="call_2",
            tool_name="weather",
            step=0,
            error="TimeoutError: upstream did not answer",
        ),
        ToolMessage(tool_call_id="call_3", tool_name="convert", step=1, output="70.7F"),
        AssistantMessage(
            content=(ReasoningPart(text="partial", step=0, provider="openai"),), interrupted=True
        ),
    ]
    return [attrs.evolve(m, id=f"conv{i}") for i, m in enumerate(messages)]


def turn(n: int) -> list[Message]:
    """A small two-message turn, distinct per ``n`` and equal for equal ``n`` (fixed ids)."""
    return [
        UserMessage(content=f"question {n}", id=f"u{n}"),
        AssistantMessage(content=(TextPart(text=f"answer {n}", step=0),), id=f"a{n}"),
    ]


def record(
    session_id: str, messages: list[Message], meta: dict[str, Any] | None = None
) -> SessionRecord:
    """What a store should load for ``session_id`` after saving ``messages`` and ``meta``."""
    return SessionRecord(session_id=session_id, messages=tuple(messages), meta=meta or {})


BAD_IDS = ["", "a" * 129, "has space", "slash/y", "back\\slash", "new\nline", "é", "a\x00", "*"]
"""Session ids every store refuses (:func:`runtime.store.validate_session_id`)."""


# -- the suite ---------------------------------------------------------------------------


class StoreConformance:
    """The conformance tests, for a subclass named ``Test...`` that defines a ``store``
    fixture yielding a fresh, empty store (see the module's docstring). Every test is a
    Trio test (``pytest.mark.trio``), whatever the project's ``trio_mode``."""

    pytestmark = pytest.mark.trio

    async def test_implements_the_protocol(self, store):
        assert isinstance(store, Store)

    async def test_round_trip(self, store):
        messages = conversation()
        meta = {"agent": "weather", "parent": None, "tags": ["a", "b"], "limits": {"steps": 8}}
        await store.save("s1", 0, messages, meta)
        loaded = await store.load("s1")
        assert loaded == record("s1", messages, meta)
        assert [type(m) for m in loaded.messages] == [type(m) for m in messages]
        assert loaded.messages[2].steps() == messages[2].steps()

    async def test_load_unknown_is_none(self, store):
        assert await store.load("never-saved") is None
        await store.save("other", 0, turn(0))
        assert await store.load("never-saved") is None

    async def test_append(self, store):
        history: list[Message] = []
        for n in range(5):
            await store.save("s", len(history), turn(n))
            history += turn(n)
            assert await store.load("s") == record("s", history)

    async def test_save_from_index_replaces_the_tail(self, store):
        first = turn(0) + turn(1) + turn(2)
        await store.save("s", 0, first)
        replacement = [UserMessage(content="edited question 1", id="edit")]
        await store.save("s", 2, replacement)
        assert await store.load("s") == record("s", first[:2] + replacement)

    async def test_save_from_index_with_nothing_truncates(self, store):
        first = turn(0) + turn(1)
        await store.save("s", 0, first)
        await store.save("s", 2, [])
        assert await store.load("s") == record("s", first[:2])

    async def test_save_from_zero_replaces_everything(self, store):
        await store.save("s", 0, turn(0) + turn(1))
        await store.save("s", 0, turn(7))
        assert await store.load("s") == record("s", turn(7))

    async def test_empty_session_exists(self, store):
        await store.save("s", 0, [])
        assert await store.load("s") == record("s", [])
        assert await store.list_sessions() == [SessionInfo(session_id="s", message_count=0)]

    async def test_meta_merges_shallowly(self, store):
        await store.save("s", 0, turn(0), {"agent": "a", "n": 1, "nested": {"x": 1, "y": 2}})
        await store.save("s", 2, turn(1), {"n": 2, "parent": "p", "nested": {"x": 3}})
        await store.save("s", 4, [], None)
        await store.save("s", 4, [], {})
        loaded = await store.load("s")
        assert loaded.meta == {"agent": "a", "n": 2, "parent": "p", "nested": {"x": 3}}

    async def test_meta_defaults_to_empty(self, store):
        await store.save("s", 0, turn(0))
        assert (await store.load("s")).meta == {}

    async def test_returned_and_given_values_are_not_shared(self, store):
        """Mutating what was saved, loaded or listed never reaches into the store."""
        meta = {"tags": ["a"]}
        messages = turn(0)
        saved = list(messages)
        await store.save("s", 0, messages, meta)
        meta["tags"].append("mutated")
        meta["new"] = 1
        messages.append(UserMessage(content="mutated"))
        (await store.load("s")).meta["tags"].append("mutated too")
        (await store.list_sessions())[0].meta["x"] = 1
        assert await store.load("s") == record("s", saved, {"tags": ["a"]})

    async def test_list_sessions(self, store):
        assert await store.list_sessions() == []
        await store.save("a", 0, turn(0), {"agent": "x"})
        await store.save("b", 0, turn(0) + turn(1))
        await store.save("c", 0, [])
        assert [i.session_id for i in await store.list_sessions()] == ["c", "b", "a"]
        await store.save("a", 2, turn(1))  # most recently saved moves to the front
        assert await store.list_sessions() == [
            SessionInfo(session_id="a", message_count=4, meta={"agent": "x"}),
            SessionInfo(session_id="c", message_count=0),
            SessionInfo(session_id="b", message_count=4),
        ]

    async def test_delete(self, store):
        await store.save("a", 0, turn(0), {"k": 1})
        await store.save("b", 0, turn(1))
        await store.delete("a")
        assert await store.load("a") is None
        assert [i.session_id for i in await store.list_sessions()] == ["b"]
        assert await store.load("b") == record("b", turn(1))
        await store.delete("a")  # unknown: no error
        await store.delete("never")
        # A deleted session starts afresh: no old messages, no old meta.
        with pytest.raises(StoreError):
            await store.save("a", 2, turn(1))
        await store.save("a", 0, turn(2))
        assert await store.load("a") == record("a", turn(2))

    @pytest.mark.parametrize("bad", [*BAD_IDS, 42, None, b"bytes"])
    async def test_invalid_session_ids_are_rejected(self, store, bad):
        with pytest.raises(InvalidSessionId):
            await store.save(bad, 0, turn(0))
        with pytest.raises(InvalidSessionId):
            await store.load(bad)
        with pytest.raises(InvalidSessionId):
            await store.delete(bad)
        assert await store.list_sessions() == []

    @pytest.mark.parametrize("good", ["a", "a" * 128, "Run-1_2.3:4", "0", "...", "session:42"])
    async def test_edge_session_ids_are_accepted(self, store, good):
        await store.save(good, 0, turn(0))
        assert (await store.load(good)).session_id == good

    @pytest.mark.parametrize("start", [1, 5, -1, True, 1.0, "0", None])
    async def test_bad_start_is_rejected_and_changes_nothing(self, store, start):
        with pytest.raises(StoreError):
            await store.save("new", start, turn(0))
        assert await store.load("new") is None
        await store.save("s", 0, turn(0), {"k": 1})
        if type(start) is int and start >= 0:
            start += 2  # beyond the end of a two-message session
        with pytest.raises(StoreError):
            await store.save("s", start, turn(1), {"k": 2})
        assert await store.load("s") == record("s", turn(0), {"k": 1})

    async def test_start_equal_to_length_appends_and_beyond_fails(self, store):
        await store.save("s", 0, turn(0))
        with pytest.raises(StoreError, match="beyond"):
            await store.save("s", 3, turn(1))
        await store.save("s", 2, turn(1))
        assert len((await store.load("s")).messages) == 4

    @pytest.mark.parametrize(
        "messages",
        [
            [UserMessage(content="ok", id="ok"), "not a message"],
            [TextPart(text="a part", step=0)],
            "text",
        ],
    )
    async def test_non_messages_are_rejected_and_change_nothing(self, store, messages):
        await store.save("s", 0, turn(0), {"k": 1})
        with pytest.raises(StoreError):
            await store.save("s", 1, messages, {"k": 2})
        assert await store.load("s") == record("s", turn(0), {"k": 1})

    @pytest.mark.parametrize("meta", [["not", "a", "dict"], "x", {1: "int key"}])
    async def test_bad_meta_is_rejected_and_changes_nothing(self, store, meta):
        await store.save("s", 0, turn(0), {"k": 1})
        with pytest.raises(StoreError):
            await store.save("s", 2, turn(1), meta)
        assert await store.load("s") == record("s", turn(0), {"k": 1})

    async def test_concurrent_saves_from_many_tasks(self, store):
        async def writer(i: int) -> None:
            history: list[Message] = []
            for n in range(5):
                await store.save(f"s{i}", len(history), turn(n), {"writer": i, "turns": n + 1})
                history += turn(n)

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(writer, i)
        infos = await store.list_sessions()
        assert sorted(i.session_id for i in infos) == sorted(f"s{i}" for i in range(20))
        assert all(i.message_count == 10 and i.meta["turns"] == 5 for i in infos)
        expected = [m for n in range(5) for m in turn(n)]
        for i in range(20):
            assert (await store.load(f"s{i}")).messages == tuple(expected)

    async def test_cancelled_save_is_all_or_nothing(self, store):
        await store.save("s", 0, turn(0), {"k": 1})
        with trio.move_on_after(0):
            await store.save("s", 1, turn(1), {"k": 2})
        loaded = await store.load("s")
        assert loaded in (
            record("s", turn(0), {"k": 1}),
            record("s", turn(0)[:1] + turn(1), {"k": 2}),
        )

    async def test_matches_a_reference_model_under_random_operations(self, store):
        """Random saves/deletes over a few sessions agree with a plain dict-of-lists model."""
        rng = random.Random(20240601)
        model: dict[str, tuple[list[Message], dict]] = {}
        recency: list[str] = []
        counter = 0
        for _ in range(150):
            sid = rng.choice(["a", "b", "c", "d"])
            if rng.random() < 0.1:
                await store.delete(sid)
                model.pop(sid, None)
                recency = [s for s in recency if s != sid]
            else:
                messages, meta = model.get(sid, ([], {}))
                start = rng.randint(0, len(messages))
                new = []
                for _ in range(rng.randint(0, 3)):
                    counter += 1
                    new += turn(counter)[: rng.randint(1, 2)]
                patch = rng.choice([None, {}, {"k": counter}, {f"key{counter % 3}": [counter]}])
                seen = (await store.load(sid) or record(sid, [])).version
                version = await store.save(sid, start, new, patch, expected_version=seen)
                assert version > seen and await store.version(sid) == version
                model[sid] = (messages[:start] + new, {**meta, **(patch or {})})
                recency = [sid] + [s for s in recency if s != sid]
            for s in ("a", "b", "c", "d"):
                expected = record(s, *model[s]) if s in model else None
                assert await store.load(s) == expected
        assert await store.list_sessions() == [
            SessionInfo(session_id=s, message_count=len(model[s][0]), meta=model[s][1])
            for s in recency
        ]

    async def test_closed_store_refuses_calls(self, store):
        await store.save("s", 0, turn(0))
        await store.aclose()
        await store.aclose()  # idempotent
        for call in (
            store.load("s"),
            store.version("s"),
            store.save("s", 2, turn(1)),
            store.list_sessions(),
            store.delete("s"),
        ):
            with pytest.raises(StoreError, match="closed"):
                await call

    # -- the version rule: a save based on a stale version never overwrites ---------------

    async def test_every_save_returns_a_new_version_that_load_reports(self, store):
        assert await store.version("s") == 0
        first = await store.save("s", 0, turn(0))
        second = await store.save("s", 2, turn(1), expected_version=first)
        assert 0 < first < second
        assert await store.version("s") == second
        assert (await store.load("s")).version == second

    async def test_save_on_a_stale_version_conflicts_and_writes_nothing(self, store):
        base = await store.save("s", 0, turn(0), {"k": 1})
        theirs = await store.save("s", 2, turn(1), {"k": 2}, expected_version=base)
        with pytest.raises(StoreConflict, match="another writer saved it") as info:
            await store.save("s", 2, turn(2), {"k": 3}, expected_version=base)
        assert (info.value.session_id, info.value.expected, info.value.actual) == (
            "s",
            base,
            theirs,
        )
        loaded = await store.load("s")
        assert loaded == record("s", turn(0) + turn(1), {"k": 2}) and loaded.version == theirs

    async def test_expecting_a_new_session_conflicts_when_another_writer_created_it(self, store):
        theirs = await store.save("s", 0, turn(0))
        with pytest.raises(StoreConflict):
            await store.save("s", 0, turn(1), expected_version=0)
        assert await store.load("s") == record("s", turn(0))
        assert await store.version("s") == theirs

    async def test_a_recreated_session_never_matches_the_deleted_sessions_version(self, store):
        version = 0
        for n in range(3):
            version = await store.save("s", 2 * n, turn(n), expected_version=version)
        await store.delete("s")
        assert await store.version("s") == 0
        again = 0
        for n in range(3):  # as many saves as before: a per-session counter alone would match
            again = await store.save("s", 2 * n, turn(10 + n), expected_version=again)
        assert again != version
        with pytest.raises(StoreConflict):
            await store.save("s", 6, turn(3), expected_version=version)
        assert len((await store.load("s")).messages) == 6

    @pytest.mark.parametrize("bad", [-1, "1", 1.0, True])
    async def test_bad_expected_version_is_refused_and_changes_nothing(self, store, bad):
        await store.save("s", 0, turn(0))
        with pytest.raises(StoreError, match="expected_version"):
            await store.save("s", 2, turn(1), expected_version=bad)
        assert await store.load("s") == record("s", turn(0))

    # -- the listing by the page, as the runtime reads it ----------------------------------

    async def test_list_page_walks_every_session_once(self, store):
        """:func:`~runtime.store.list_page` (how the web page, the API and the CLI list)
        over this store, with or without its own paging: pages in recency order, a next
        cursor while more follow and none on the last page, even a full one."""
        for n in range(7):
            await store.save(f"s{n}", 0, turn(n))
        walked, after, sizes = [], None, []
        while True:
            page = await list_page(store, limit=3, after=after)
            walked += [info.session_id for info in page.sessions]
            sizes.append(len(page.sessions))
            if page.next_cursor is None:
                break
            after = page.next_cursor
        assert walked == [f"s{n}" for n in reversed(range(7))] and sizes == [3, 3, 1]
        await store.delete("s0")  # six left: the second page is full and the last
        second = await list_page(
            store, limit=3, after=(await list_page(store, limit=3)).next_cursor
        )
        assert len(second.sessions) == 3 and second.next_cursor is None
        for bad_limit in (0, -1, True, None):
            with pytest.raises(InvalidCursor):
                await list_page(store, limit=bad_limit)

    # -- the last turn, as a turn's outcome is read -------------------------------------

    async def test_load_last_turn_reads_from_the_last_assistant_message_on(self, store):
        """:func:`~runtime.store.load_last_turn` over this store (its own read, or its
        whole load cut): the messages from the last assistant message on, with that
        message's index, the meta as stored; every message when none answered yet;
        ``None`` for a session never saved."""
        tool = ToolMessage(tool_call_id="c", tool_name="t", step=0, output="ok", id="t1")
        await store.save("s", 0, [*turn(0), *turn(1), tool], {"title": "x"})
        await store.save("q", 0, [UserMessage(content="only a question", id="u")])
        first, last = await load_last_turn(store, "s")
        assert first == 3 and last == record("s", [turn(1)[1], tool], {"title": "x"})
        assert await load_last_turn(store, "q") == (
            0,
            record("q", [UserMessage(content="only a question", id="u")]),
        )
        assert await load_last_turn(store, "never") is None

    async def test_load_last_turns_reads_from_the_nth_last_assistant_message_on(self, store):
        """:func:`~runtime.store.load_last_turns` over this store: the messages from its
        ``turns``-th last assistant message on, with that message's index; every message
        when it has fewer; ``None`` for a session never saved."""
        tool = ToolMessage(tool_call_id="c", tool_name="t", step=0, output="ok", id="t1")
        messages = [*turn(0), *turn(1), tool, *turn(2)]
        await store.save("s", 0, messages, {"title": "x"})
        assert await load_last_turns(store, "s", 1) == await load_last_turn(store, "s")
        first, last = await load_last_turns(store, "s", 2)
        assert first == 3 and last == record("s", messages[3:], {"title": "x"})
        assert await load_last_turns(store, "s", 3) == (
            1,
            record("s", messages[1:], {"title": "x"}),
        )
        assert await load_last_turns(store, "s", 4) == (0, record("s", messages, {"title": "x"}))
        assert await load_last_turns(store, "never", 2) is None

    async def test_has_user_messages_tells_which_user_ids_the_session_stores(self, store):
        """:func:`~runtime.store.has_user_messages` over this store: the ids asked that
        the session's user messages have (one whose JSON holds a ``\\u0000`` too, which
        PostgreSQL's index cannot read), after a save that replaced the tail; never an
        assistant's or a tool's id, nor another session's; none for a session never
        saved."""
        nul_user = UserMessage(content="a\x00b", id="un")
        nul_tool = ToolMessage(tool_call_id="c", tool_name="t", step=0, output="a\x00b", id="t1")
        version = await store.save("s", 0, [*turn(0), nul_tool, *turn(1)])
        await store.save("o", 0, [UserMessage(content="other", id="o1")])
        asked = {"u0", "a0", "t1", "u1", "a1", "o1", "un", "nope"}
        assert await has_user_messages(store, "s", asked) == {"u0", "u1"}
        await store.save("s", 3, [nul_user], expected_version=version)
        assert await has_user_messages(store, "s", asked) == {"u0", "un"}
        assert await has_user_messages(store, "o", asked) == {"o1"}
        assert await has_user_messages(store, "never", asked) == frozenset()
        assert await has_user_messages(store, "s", []) == frozenset()

    # -- deletion marks, as a turn begun on a session not stored reads them --------------

    async def test_the_deletion_mark_is_read_with_the_version_or_is_none(self, store):
        """:func:`~runtime.store.version_and_mark` and
        :func:`~runtime.store.deletion_mark` over this store: the version as
        :meth:`~runtime.store.Store.version` says, and the mark, ``None`` for a store
        that keeps none (its saves rebased as before), else one that moves with each
        deletion of the session and with nothing else."""
        before = await deletion_mark(store, "s")
        assert await version_and_mark(store, "s") == (0, before)
        version = await store.save("s", 0, turn(0), expected_version=0)
        await store.save("other", 0, turn(1))
        await store.delete("other")
        assert await version_and_mark(store, "s") == (version, before)
        await store.delete("s")
        after = await deletion_mark(store, "s")
        assert await version_and_mark(store, "s") == (0, after)
        assert (before is None) == (after is None) and (after is None or after != before)

    # -- a step's save, its turn's unchanged messages kept ----------------------------

    async def test_save_keeping_leaves_what_a_whole_save_leaves(self, store):
        """:func:`~runtime.store.save_keeping` over this store (its kept rows, or a save
        from the first message not kept): the session as the same save without them
        leaves it, the assistant message over its row, the results kept, one added."""
        first, second, third = _tool_step(0), _tool_step(1), _tool_step(2)
        version = await store.save("s", 0, [*turn(0), first[0], first[1]])
        version = await save_keeping(
            store, "s", 2, second, {"k": 1}, kept=(1,), expected_version=version
        )
        version = await save_keeping(
            store, "s", 2, third, None, kept=(1, 2), expected_version=version
        )
        assert await store.load("s") == record("s", [*turn(0), *third], {"k": 1})
        assert (await store.load("s")).version == version

    async def test_save_keeping_a_grown_answer_leaves_what_a_whole_save_leaves(self, store):
        """:func:`~runtime.store.save_keeping` with the turn's answer ``grown`` (a store
        that takes it writes its new parts alone, any other the message whole): every
        load in between, a save from before the answer, the answer grown again and its
        turn's last save (whole), and a delete leave what the same saves without it
        leave."""
        version = await store.save("s", 0, [*turn(0), *_tool_step(0)])
        for n in range(1, 6):
            step = _tool_step(n)
            version = await save_keeping(
                store,
                "s",
                2,
                step,
                None,
                kept=range(1, n + 1),
                expected_version=version,
                grown=(0,),
            )
            loaded = await store.load("s")
            assert loaded == record("s", [*turn(0), *step]) and loaded.version == version
        version = await store.save("s", 2, turn(7), expected_version=version)
        assert await store.load("s") == record("s", [*turn(0), *turn(7)])
        version = await store.save("s", 4, _tool_step(0), expected_version=version)
        version = await save_keeping(
            store, "s", 4, _tool_step(1), None, kept=(1,), expected_version=version, grown=(0,)
        )
        step = _tool_step(1)
        done = TextPart(text="done", step=2)
        final = [attrs.evolve(step[0], content=(*step[0].content, done)), *step[1:]]
        await save_keeping(store, "s", 4, final, None, kept=(1, 2), expected_version=version)
        assert await store.load("s") == record("s", [*turn(0), *turn(7), *final])
        await store.delete("s")
        assert await store.load("s") is None


def _tool_step(n: int) -> list[Message]:
    """A turn's assistant message and tool results after its step ``n`` (from 0): the
    message holds every step's call, a result follows for each; a step's save sends them
    all, the results of the steps before it the same as they were."""
    calls = tuple(
        ToolCallPart(tool_call_id=f"c{i}", tool_name="t", input={"i": i}, step=i)
        for i in range(n + 1)
    )
    return [
        AssistantMessage(content=calls, id="a"),
        *(
            ToolMessage(tool_call_id=f"c{i}", tool_name="t", step=i, output=f"r{i}", id=f"t{i}")
            for i in range(n + 1)
        ),
    ]


class StoreKeptRows:
    """The kept rows' checks, for a store whose ``save`` takes ``kept``
    (:class:`~runtime.store.Store`'s kept rows; the built-in ones do). Apart from
    :class:`StoreConformance` so a store written before them still passes that kit (the
    runtime then saves from the first message not kept); subclass both::

        class TestMyStore(StoreConformance, StoreKeptRows): ...
    """

    async def test_a_save_with_kept_rows_writes_the_others_over_and_replaces_the_tail(self, store):
        version = await store.save("s", 0, [*turn(0), *_tool_step(1)])
        step = _tool_step(2)
        await store.save("s", 2, step, expected_version=version, kept=(1, 2))
        assert await store.load("s") == record("s", [*turn(0), *step])

    async def test_kept_rows_are_not_written(self, store):
        """A kept message is taken as the store holds it: what the save passes in its
        place is not written (it is the one the store holds, for a caller keeping the
        rule; a different one here shows it was not sent to the rows)."""
        stored = _tool_step(1)
        version = await store.save("s", 0, stored)
        other = ToolMessage(tool_call_id="c0", tool_name="t", step=0, output="x", id="t0")
        step = _tool_step(2)
        await store.save("s", 0, [step[0], other, *step[2:]], expected_version=version, kept=(1,))
        assert await store.load("s") == record("s", [step[0], stored[1], *step[2:]])

    async def test_kept_rows_with_nothing_after_them_cut_the_tail(self, store):
        version = await store.save("s", 0, [*turn(0), *turn(1)])
        await store.save("s", 0, [turn(5)[0], turn(0)[1]], expected_version=version, kept=(1,))
        assert await store.load("s") == record("s", [turn(5)[0], turn(0)[1]])

    async def test_kept_rows_without_a_version_are_refused_and_change_nothing(self, store):
        await store.save("s", 0, turn(0))
        with pytest.raises(StoreError):
            await store.save("s", 0, turn(1), kept=(1,))
        assert await store.load("s") == record("s", turn(0))

    @pytest.mark.parametrize("kept", [(2,), (-1,), (True,), ("1",), 1])
    async def test_bad_kept_positions_are_refused_and_change_nothing(self, store, kept):
        version = await store.save("s", 0, turn(0))
        with pytest.raises(StoreError):
            await store.save("s", 0, turn(1), expected_version=version, kept=kept)
        assert await store.load("s") == record("s", turn(0))

    async def test_a_kept_row_past_the_sessions_end_is_refused_and_changes_nothing(self, store):
        version = await store.save("s", 0, turn(0))
        with pytest.raises(StoreError):
            await store.save("s", 1, turn(1), expected_version=version, kept=(1,))
        assert await store.load("s") == record("s", turn(0))

    async def test_kept_rows_on_a_stale_version_conflict_and_change_nothing(self, store):
        version = await store.save("s", 0, turn(0))
        await store.save("s", 2, turn(1), expected_version=version)
        with pytest.raises(StoreConflict):
            await store.save("s", 0, turn(2), expected_version=version, kept=(1,))
        assert await store.load("s") == record("s", [*turn(0), *turn(1)])


class StoreGrownRows:
    """The grown rows' checks, for a store whose ``save`` takes ``grown``
    (:class:`~runtime.store.Store`'s grown rows; the SQLite store does). Apart from
    :class:`StoreConformance` so a store written before them still passes that kit::

        class TestMyStore(StoreConformance, StoreGrownRows): ...
    """

    async def test_a_grown_answer_loads_as_the_whole_one_at_every_step(self, store):
        version = await store.save("s", 0, [*turn(0), *_tool_step(0)])
        answer = _tool_step(0)[0]
        for n in range(1, 8):
            step = _tool_step(n)
            answer = attrs.evolve(answer, content=(*answer.content, step[0].content[-1]))
            version = await store.save(
                "s", 2, [answer, *step[1:]], expected_version=version, grown=(0,)
            )
            assert await store.load("s") == record("s", [*turn(0), answer, *step[1:]])

    async def test_a_grown_answer_without_new_parts_keeps_its_parts(self, store):
        """A step that added no part (its fields changed alone) stores the same parts."""
        version = await store.save("s", 0, _tool_step(2))
        answer = _tool_step(2)[0]
        for interrupted in (False, True, True):
            answer = attrs.evolve(answer, interrupted=interrupted)
            version = await store.save(
                "s", 0, [answer], expected_version=version, grown=(0,), kept=()
            )
            assert await store.load("s") == record("s", [answer])

    async def test_a_grown_save_then_a_whole_one_then_grown_again(self, store):
        """Written whole between two grown saves (a decision, a rebase), the answer's
        earlier segments are not folded into it again."""
        version = await store.save("s", 0, [*turn(0), *_tool_step(3)])
        big = _tool_step(4)
        version = await store.save("s", 2, big[:1], expected_version=version, grown=(0,))
        small = _tool_step(1)
        version = await store.save("s", 2, small[:1], expected_version=version)
        version = await store.save("s", 2, big[:1], expected_version=version, grown=(0,))
        assert await store.load("s") == record("s", [*turn(0), big[0]])

    async def test_grown_without_a_version_or_on_a_kept_position_is_refused(self, store):
        version = await store.save("s", 0, [*turn(0), *_tool_step(0)])
        step = _tool_step(1)
        with pytest.raises(StoreError):
            await store.save("s", 2, step, grown=(0,))
        with pytest.raises(StoreError):
            await store.save("s", 2, step, expected_version=version, kept=(0,), grown=(0,))
        with pytest.raises(StoreError):
            await store.save("s", 2, step, expected_version=version, grown=(9,))
        assert await store.load("s") == record("s", [*turn(0), *_tool_step(0)])

    async def test_a_grown_save_on_a_stale_version_conflicts_and_changes_nothing(self, store):
        version = await store.save("s", 0, [*turn(0), *_tool_step(0)])
        version = await store.save("s", 2, _tool_step(1)[:1], expected_version=version, grown=(0,))
        with pytest.raises(StoreConflict):
            await store.save("s", 2, _tool_step(2)[:1], expected_version=version - 1, grown=(0,))
        assert await store.load("s") == record("s", [*turn(0), _tool_step(1)[0]])


class StorePaging:
    """The paging checks, for a store whose ``list_sessions`` takes ``limit`` and
    ``after`` (keyset paging, :meth:`~runtime.store.Store.list_sessions`). Apart from
    :class:`StoreConformance` so a store written before paging still passes that kit (the
    runtime pages such a store by slicing its full list); subclass both to check both::

        class TestMyStore(StoreConformance, StorePaging): ...
    """

    async def _walk(self, store, limit, between=None):
        """Every page from the top, ``between(page_number)`` awaited after each page; the
        sessions listed, in order."""
        walked, after, n = [], None, 0
        while True:
            page = await store.list_sessions(limit=limit, after=after)
            assert len(page) <= limit
            walked += [info.session_id for info in page]
            if len(page) < limit:
                return walked
            after = page[-1].cursor
            assert isinstance(after, str)
            if between is not None:
                await between(n)
            n += 1

    async def test_pages_are_the_listing_cut_at_cursors(self, store):
        assert await store.list_sessions(limit=5) == []
        for n in range(10):
            await store.save(f"s{n}", 0, turn(n), {"n": n})
        await store.save("s3", 2, turn(10))  # now the most recent
        everything = await store.list_sessions()
        assert [i.session_id for i in everything][:2] == ["s3", "s9"]
        assert all(isinstance(i.cursor, str) for i in everything)
        for limit in (1, 3, 10, 11, 1000):
            assert await self._walk(store, limit) == [i.session_id for i in everything]
        first = await store.list_sessions(limit=4)
        assert first == everything[:4]  # counts and meta as the full listing has them
        rest = await store.list_sessions(after=first[-1].cursor)  # no limit: all after it
        assert rest == everything[4:]
        assert await store.list_sessions(limit=3, after=everything[-1].cursor) == []

    async def test_a_cursor_outlives_its_session(self, store):
        """A cursor is a place in the order, not a session: the page after it is the same
        whether its session was since deleted or saved again (moved to the top)."""
        for n in range(6):
            await store.save(f"s{n}", 0, turn(n))
        first = await store.list_sessions(limit=2)  # s5, s4
        cursor = first[-1].cursor
        await store.save("s4", 2, turn(9))
        assert [i.session_id for i in await store.list_sessions(limit=2, after=cursor)] == [
            "s3",
            "s2",
        ]
        await store.delete("s4")
        assert [i.session_id for i in await store.list_sessions(after=cursor)] == [
            "s3",
            "s2",
            "s1",
            "s0",
        ]

    @pytest.mark.parametrize("bad", ["\x00 not a cursor", 7, b"1", ["1"]])
    async def test_a_cursor_the_store_did_not_write_is_refused(self, store, bad):
        """(Cursors are the store's own: the kit tries only what no store writes.)"""
        await store.save("s", 0, turn(0))
        with pytest.raises(InvalidCursor):
            await store.list_sessions(limit=2, after=bad)

    @pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
    async def test_a_bad_limit_is_refused(self, store, bad):
        with pytest.raises(InvalidCursor):
            await store.list_sessions(limit=bad)

    async def test_a_walk_during_saves_lists_no_session_twice_and_misses_only_saved_ones(
        self, store
    ):
        """What a user paging the list while turns run sees: a session saved during the
        walk moves to the top, so it is not listed again if already listed, and not on the
        later pages if not listed yet (it heads the first page again); a session created
        during the walk is on the next first page; every other session exactly once."""
        rng = random.Random(7)
        for n in range(40):
            await store.save(f"s{n}", 0, turn(n))
        saved: set[str] = set()
        created = 0

        async def between(page: int) -> None:
            nonlocal created
            for _ in range(3):
                sid = f"s{rng.randrange(40)}"
                await store.save(sid, 0, turn(page))
                saved.add(sid)
            await store.save(f"new{created}", 0, [])
            created += 1

        walked = await self._walk(store, 4, between)
        assert len(walked) == len(set(walked)), "a session listed twice"
        untouched = {f"s{n}" for n in range(40)} - saved
        assert untouched <= set(walked), "a session not saved during the walk was skipped"
        assert not any(sid.startswith("new") for sid in walked)
        top = [i.session_id for i in await store.list_sessions(limit=created + len(saved))]
        assert set(top) == saved | {f"new{n}" for n in range(created)}

    async def test_a_limit_beyond_any_count_lists_all(self, store):
        for n in range(3):
            await store.save(f"s{n}", 0, turn(n))
        assert len(await store.list_sessions(limit=2**70)) == 3
        first = await store.list_sessions(limit=1)
        assert len(await store.list_sessions(limit=2**70, after=first[0].cursor)) == 2


class StoreIncarnations:
    """The incarnation checks, for a store whose :meth:`~runtime.store.Store.load`
    reports :attr:`~runtime.store.SessionRecord.incarnation` (the built-in ones do). Apart
    from :class:`StoreConformance` so a store written before incarnations still passes
    that kit; subclass both to check both::

        class TestMyStore(StoreConformance, StoreIncarnations): ...
    """

    async def test_the_incarnation_is_the_first_saves_version(self, store):
        first = await store.save("s", 0, turn(0), expected_version=0)
        later = await store.save("s", 2, turn(1), expected_version=first)
        later = await store.save("s", 0, turn(2), expected_version=later)  # all replaced
        loaded = await store.load("s")
        assert loaded.incarnation == first and loaded.version == later > first

    async def test_a_re_created_sessions_incarnation_is_above_the_deleted_ones_versions(
        self, store
    ):
        version = 0
        for n in range(3):
            version = await store.save("s", 2 * n, turn(n), expected_version=version)
        await store.delete("s")
        again = await store.save("s", 0, turn(10), expected_version=0)
        loaded = await store.load("s")
        assert loaded.incarnation == again > version

    async def test_each_session_has_its_own_incarnation(self, store):
        one = await store.save("one", 0, turn(0))
        two = await store.save("two", 0, turn(1))
        await store.save("one", 2, turn(2), expected_version=one)
        assert (await store.load("one")).incarnation == one
        assert (await store.load("two")).incarnation == two


class StoreDeletionMarks:
    """The deletion-mark checks, for a store with ``deletions`` and
    ``version_and_deletions`` (the built-in ones). Apart from :class:`StoreConformance`
    so a store written before them still passes that kit; subclass both to check both::

        class TestMyStore(StoreConformance, StoreDeletionMarks): ...
    """

    async def test_each_deletion_of_a_session_moves_its_mark_up(self, store):
        marks = [await store.deletions("s")]
        assert marks == [0]
        for n in range(3):
            await store.save("s", 0, turn(n), expected_version=0)
            await store.delete("s")
            marks.append(await store.deletions("s"))
        assert marks == sorted(set(marks))  # each deletion: above the mark before
        assert await store.version_and_deletions("s") == (0, marks[-1])

    async def test_another_sessions_deletion_leaves_the_mark(self, store):
        await store.save("s", 0, turn(0))
        await store.delete("s")
        mark = await store.deletions("s")
        await store.save("x", 0, turn(1))
        await store.delete("x")
        assert await store.deletions("s") == mark

    async def test_deleting_a_session_never_stored_moves_no_mark(self, store):
        await store.delete("never")
        assert await store.version_and_deletions("never") == (0, 0)

    async def test_the_mark_is_the_ids_own(self, store):
        await store.save("one", 0, turn(0))
        two = await store.save("two", 0, turn(1))
        await store.delete("one")
        version, mark = await store.version_and_deletions("one")
        assert version == 0 and mark > 0
        assert await store.version_and_deletions("two") == (two, 0)

    async def test_a_re_created_session_keeps_its_mark(self, store):
        await store.save("s", 0, turn(0))
        await store.delete("s")
        mark = await store.deletions("s")
        again = await store.save("s", 0, turn(1), expected_version=0)
        assert mark > 0 and await store.version_and_deletions("s") == (again, mark)

    async def test_a_creating_save_checks_the_absent_mark_when_it_takes_one(self, store):
        # A store whose save takes ``absent_mark`` (``runtime.store.checks_absent_mark``)
        # refuses a save that would create a session deleted since that mark was read,
        # writing nothing, and creates it when the mark has not moved.
        if not checks_absent_mark(store):
            pytest.skip("the store's save takes no absent_mark: the mark is read apart")
        mark = await store.deletions("s")
        await store.save("s", 0, turn(0))
        await store.delete("s")
        with pytest.raises(SessionDeleted):
            await store.save("s", 0, turn(1), expected_version=0, absent_mark=mark)
        assert await store.load("s") is None
        now = await store.deletions("s")
        assert await store.save("s", 0, turn(1), expected_version=0, absent_mark=now) > 0


def _calling(n: int, *calls: tuple[str, str]) -> list[Message]:
    """A turn whose assistant message calls the tools ``calls`` (name, call id): a
    caller's turn whose calls of agent tools ran in sub-sessions."""
    return [
        UserMessage(content=f"question {n}", id=f"cu{n}"),
        AssistantMessage(
            content=tuple(
                ToolCallPart(tool_call_id=call, tool_name=name, input={}, step=0)
                for name, call in calls
            ),
            id=f"ca{n}",
        ),
    ]


class StoreSubSessions:
    """What a store's :meth:`~runtime.store.Store.delete` deletes with a session: the
    sub-sessions its agent tools' calls ran in (the id
    :func:`~runtime.tools.sub_session_id` derives, the meta naming the caller), at any
    depth. Apart from :class:`StoreConformance`: a store written before deletes the one
    session (its sub-sessions stay) and still passes that kit::

        class TestMyStore(StoreConformance, StoreSubSessions): ...
    """

    async def _sub(self, store, caller: str, name: str, call: str, *calls) -> str:
        sub = sub_session_id(caller, name, call)
        await store.save(sub, 0, _calling(1, *calls), {PARENT_SESSION_META: caller})
        return sub

    async def test_a_deleted_session_takes_its_sub_sessions_at_any_depth(self, store):
        await store.save("c", 0, _calling(0, ("helper", "k1"), ("plain", "k2")))
        sub = await self._sub(store, "c", "helper", "k1", ("deeper", "k3"))
        subsub = await self._sub(store, sub, "deeper", "k3", ("deepest", "k4"))
        third = await self._sub(store, subsub, "deepest", "k4")
        await store.save("other", 0, turn(0))
        await store.delete("c")
        for sid in ("c", sub, subsub, third):
            assert await store.load(sid) is None, sid
        assert [i.session_id for i in await store.list_sessions()] == ["other"]
        if hasattr(store, "deletions"):  # each one's deletion mark moved
            for sid in (sub, subsub, third):
                assert await store.deletions(sid) > 0, sid

    async def test_hashed_sub_session_ids_are_deleted_too(self, store):
        caller = "c" * 120  # its calls' sub-session ids are hashed (over 128 characters)
        await store.save(caller, 0, _calling(0, ("helper", "k1")))
        sub = await self._sub(store, caller, "helper", "k1", ("deeper", "k" * 120))
        subsub = await self._sub(store, sub, "deeper", "k" * 120)
        assert sub.startswith("sub.") and subsub.startswith("sub.")
        await store.delete(caller)
        assert await store.load(sub) is None and await store.load(subsub) is None

    async def test_a_sub_session_its_callers_stored_call_does_not_name_is_deleted(self, store):
        # the sub-session saved before the caller's call was (its id: "<caller>.<...>")
        await store.save("c", 0, turn(0))
        sub = await self._sub(store, "c", "helper", "k9")
        await store.delete("c")
        assert await store.load(sub) is None

    async def test_a_hashed_sub_session_its_callers_stored_call_does_not_name_is_deleted(
        self, store
    ):
        # the caller's step not saved yet (a worker saves it after the tool's sub-turn
        # began) and the id hashed: neither its calls nor the "<caller>." range name it
        caller = "c" * 120
        await store.save(caller, 0, turn(0))
        sub = await self._sub(store, caller, "helper", "k1")
        assert sub.startswith("sub.")
        await store.delete(caller)
        assert await store.load(sub) is None

    async def test_sessions_the_caller_does_not_own_are_left(self, store):
        await store.save("c", 0, _calling(0, ("helper", "k1")))
        look_alike = "c.helper.k2"  # an id of that shape, naming no caller
        await store.save(look_alike, 0, turn(1))
        others = sub_session_id("c", "helper", "k1")  # the call's id, another's meta
        await store.save(others, 0, turn(2), {PARENT_SESSION_META: "d"})
        await store.save("c2", 0, turn(3))
        await store.save("c2.helper.k1", 0, turn(4), {PARENT_SESSION_META: "c2"})
        await store.delete("c")
        for sid in (look_alike, others, "c2", "c2.helper.k1"):
            assert await store.load(sid) is not None, sid

    async def test_deleting_a_sub_session_leaves_its_caller(self, store):
        await store.save("c", 0, _calling(0, ("helper", "k1")))
        sub = await self._sub(store, "c", "helper", "k1")
        await store.delete(sub)
        assert await store.load(sub) is None and await store.load("c") is not None

    async def test_two_deletes_of_one_caller_at_once_delete_it_all(self, store):
        await store.save("c", 0, _calling(0, ("helper", "k1")))
        sub = await self._sub(store, "c", "helper", "k1", ("deeper", "k3"))
        subsub = await self._sub(store, sub, "deeper", "k3")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.delete, "c")
            nursery.start_soon(store.delete, "c")
            nursery.start_soon(store.delete, sub)
        assert await store.list_sessions() == []
        assert await store.load(subsub) is None
