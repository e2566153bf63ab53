"""A step's save encodes what the step added, not the whole turn so far (branch
``stepsaves``, journal ``benchmarks/journal/pipeline.md``).

A turn's assistant message holds every step's parts, and each step's save stores it
again: encoded whole each time, a turn of n steps unstructured n(n+1)/2 parts (500,500
tool calls at 1,000 steps). :func:`runtime.serde.message_json` keeps the encoded parts of
the messages it encoded last and encodes only the parts that are new; the bytes stored
are the same."""

from __future__ import annotations

import sqlite3
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Budget, Host, serde, tool
from runtime.chunks import Usage
from runtime.messages import (
    AssistantMessage,
    Awaiting,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from runtime.output import ErrorInfo

STEPS = 200


@tool
def lookup(i: int) -> str:
    """Looks a number up."""
    return f"r{i}"


@pytest.fixture
def tool_calls_unstructured() -> Iterator[list[int]]:
    """How many tool-call parts the converter unstructures while the test runs."""
    hook = serde.converter.get_unstructure_hook(ToolCallPart)
    count = [0]

    def counting(part: Any) -> Any:
        count[0] += 1
        return hook(part)

    serde.converter.register_unstructure_hook(ToolCallPart, counting)
    try:
        yield count
    finally:
        serde.converter.register_unstructure_hook(ToolCallPart, hook)


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        return tmp_path / "s.db"
    from actors.stores.postgres import PostgresStore

    return await PostgresStore.open(request.getfixturevalue("pg_url"))


async def test_a_long_turns_step_saves_unstructure_each_tool_call_about_once(
    store: Any, tool_calls_unstructured: list[int]
) -> None:
    steps = [tool_call("lookup", {"i": i}, tool_call_id=f"c{i}") for i in range(STEPS)]
    provider = ScriptedProvider([*steps, ["done"]])
    agent = Agent(provider=provider, tools=[lookup], budget=Budget(max_steps=STEPS + 1))
    try:
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(agent, session_id="s")
            assert (await session.run("go")).text == "done"
    finally:
        if not isinstance(store, Path):
            await store.aclose()
    # (200 here; encoded whole at each of the 201 saves, 20,300: the step's k calls
    # at the save of step k, and all 200 at the answer's)
    assert tool_calls_unstructured[0] <= 2 * STEPS


async def test_a_long_turns_stored_answer_is_what_encoding_it_whole_gives(tmp_path: Path) -> None:
    steps = [tool_call("lookup", {"i": i}, tool_call_id=f"c{i}") for i in range(20)]
    agent = Agent(
        provider=ScriptedProvider([*steps, ["done"]]), tools=[lookup], budget=Budget(max_steps=21)
    )
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        await session.run("go")
        answer = session.messages[1]
    with sqlite3.connect(tmp_path / "s.db") as conn:
        (body,) = conn.execute("SELECT body FROM messages WHERE idx = 1").fetchone()
    assert isinstance(answer, AssistantMessage) and len(answer.content) == 21
    assert body == serde.to_json(answer)


async def test_a_finished_turns_answer_is_not_kept_encoded(tmp_path: Path, keeping_any) -> None:
    kept: list[set[str]] = []

    @tool
    def look(i: int) -> str:
        """Notes which answers are kept encoded."""
        kept.append(set(serde._encoded))
        return "x"

    steps = [tool_call("look", {"i": i}, tool_call_id=f"c{i}") for i in range(3)]
    agent = Agent(provider=ScriptedProvider([*steps, ["done"]]), tools=[look])
    serde.forget_encoded()
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        await session.run("go")
        answer = session.messages[1].id
    assert answer in kept[-1]  # while the turn ran (its steps' saves)
    assert answer not in serde._encoded


def _call(i: int, **kw: Any) -> ToolCallPart:
    return ToolCallPart(
        tool_call_id=f"c{i}", tool_name="t", input={"i": i, "f": 1.0, "s": "é😀"}, step=i, **kw
    )


@pytest.fixture
def keeping_any() -> Iterator[None]:
    """Every answer's encoded parts kept, however short (the unit tests' are), whether or
    not a persister marked it (:func:`runtime.serde.keep_encoded`)."""

    class Every(OrderedDict):  # type: ignore[type-arg]
        def __contains__(self, key: object) -> bool:
            return True

    kept_from, serde.KEPT_FROM_BYTES = serde.KEPT_FROM_BYTES, 0
    keeping, serde._keeping = serde._keeping, Every()
    try:
        yield
    finally:
        serde.KEPT_FROM_BYTES = kept_from
        serde._keeping = keeping


def test_an_answer_encoded_part_by_part_is_the_bytes_of_it_encoded_whole(keeping_any) -> None:
    parts: list[Any] = []
    message = AssistantMessage()
    for i in range(12):  # grows a step at a time, as a turn's saves see it
        parts += [_call(i)] + ([TextPart(text="a\n", step=i)] if i % 3 == 0 else [])
        message = attrs.evolve(message, content=tuple(parts))
        assert serde.message_json(message) == serde.to_json(message)
    changed = [
        # a part in the middle replaced (a decision recorded on a waiting call)
        attrs.evolve(
            message,
            content=(
                *parts[:3],
                _call(2, awaiting=Awaiting(kind="approval", id="a", turn_id="t")),
                *parts[4:],
            ),
        ),
        attrs.evolve(message, content=tuple(parts[:5])),  # cut short
        attrs.evolve(message, interrupted=True, usage=Usage(input_tokens=3, output_tokens=4)),
        attrs.evolve(message, error=ErrorInfo(kind="provider", message="boom")),
        attrs.evolve(message, content=(_call(99), *parts)),  # a new first part
    ]
    for other in changed:
        assert serde.message_json(other) == serde.to_json(other)


def test_a_part_equal_to_the_one_it_replaced_is_encoded_anew(keeping_any) -> None:
    message = AssistantMessage(content=tuple(_call(i) for i in range(4)))
    serde.message_json(message)  # encoded whole: where its first parts end is not known
    equal = attrs.evolve(message.content[2], input={"i": 2.0, "f": 1.0, "s": "é😀"})
    assert equal == message.content[2]  # (2.0 == 2) but written "2.0"
    for content in ((*message.content[:2], equal, message.content[3]), message.content[:3]):
        other = attrs.evolve(message, content=content)
        assert serde.message_json(other) == serde.to_json(other)


def test_an_answer_orjson_refuses_part_by_part_is_refused_as_it_is_whole(keeping_any) -> None:
    deep: Any = 1
    for _ in range(260):
        deep = [deep]
    for bad in (
        TextPart(text="\ud800", step=0),  # a lone surrogate
        ToolCallPart(tool_call_id="c", tool_name="t", input=deep, step=0),  # too deep
    ):
        first = AssistantMessage(content=(TextPart(text="ok", step=0),))
        serde.message_json(first)  # kept: the bad part is the one encoded alone
        message = attrs.evolve(first, content=(*first.content, bad))
        with pytest.raises(TypeError) as whole:
            serde.to_json(message)
        with pytest.raises(TypeError) as by_part:
            serde.message_json(message)
        assert str(by_part.value) == str(whole.value)


def test_a_part_nested_as_deep_as_orjson_writes_is_encoded_as_it_is_whole(keeping_any) -> None:
    for depth in range(248, 254):  # where orjson's limit falls inside a message
        value: Any = 1
        for _ in range(depth):
            value = [value]
        first = AssistantMessage(content=(TextPart(text="ok", step=0),))
        serde.message_json(first)
        deep = ToolCallPart(tool_call_id="c", tool_name="t", input=value, step=1)
        message = attrs.evolve(first, content=(*first.content, deep))
        try:
            whole: Any = serde.to_json(message)
        except TypeError as err:
            whole = str(err)
        try:
            by_part: Any = serde.message_json(message)
        except TypeError as err:
            by_part = str(err)
        assert by_part == whole


@pytest.mark.parametrize("change", ["replaced", "added"])
def test_a_list_of_parts_changed_in_place_is_encoded_as_it_now_is(change: str) -> None:
    """``content`` given as a list (the field takes one) and changed in place after its
    message was encoded: the kept parts were that very list, so every part seemed the
    same object: a replaced part's old bytes came back (stored by a store's save), an
    added one raised ``IndexError`` (attacknew)."""
    parts = [TextPart(text="x" * 600, step=0), TextPart(text="y" * 600, step=0)]
    message = AssistantMessage(content=parts, id="listed")  # type: ignore[arg-type]
    serde.message_json(message)
    if change == "replaced":
        parts[1] = TextPart(text="w", step=0)
    else:
        parts.append(TextPart(text="z", step=1))
    assert serde.message_json(message) == serde.to_json(message)


async def test_a_given_historys_answers_are_not_kept_encoded_after_the_turn(
    tmp_path: Path,
) -> None:
    """Only a running turn's answer is kept encoded (the persister marks it at its
    step's saves). Before, every assistant message of 1 KB or more encoded whole was:
    a history given to a session (a client's, AG-UI or Chat Completions) stayed held,
    parts and JSON, after its turn, until 64 other messages pushed it out; the parts'
    objects weigh ~11x their JSON (a 318 KB tool input: 3.5 MB) (attacknew)."""
    said = AssistantMessage(
        content=(ToolCallPart(tool_call_id="c", tool_name="t", input={"k": "x" * 2000}, step=0),),
        id="given",
    )
    history = [
        UserMessage(content="before"),
        said,
        ToolMessage(tool_call_id="c", tool_name="t", step=0, output="ok"),
    ]
    serde.forget_encoded()
    agent = Agent(provider=ScriptedProvider([["done"]]))
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent, session_id="s", history=history)
        await session.run("go")
    assert "given" not in serde._encoded


async def test_a_turn_waiting_for_approval_leaves_its_answer_neither_marked_nor_kept(
    tmp_path: Path, keeping_any
) -> None:
    """A turn that suspends (its calls wait for a person) ends in this process at its
    step's save, which marked its answer to keep for the next step's save: the mark and
    the encoded parts stayed for each waiting turn (1,000 waiting turns: ~140 bytes each
    more than 1,000 idle evicted sessions, issue 21's memory row 1.00x -> 1.13x)."""

    @tool(needs_approval=True)
    def wire(amount: int) -> str:
        """Wires money."""
        return "sent"

    marked = serde._keeping = OrderedDict()  # (the persister's marks, as they are made)
    agent = Agent(provider=ScriptedProvider([tool_call("wire", {"amount": 5})]), tools=[wire])
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        result = await session.run("go")
        answer = session.messages[1].id
    assert result.finish_reason == "awaiting-input"
    assert answer not in marked
    assert answer not in serde._encoded
