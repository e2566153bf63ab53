"""A message replaced by one that compares equal but holds values of other types (a tool
result ``1`` made ``True`` or ``1.0``, ``{"a": 1}`` made ``{"a": True}``, a call's
arguments likewise) is a different message to the model: ``1 == True == 1.0`` in
Python, but ``1``, ``true`` and ``1.0`` on the wire. The kept repair
(:class:`runtime.history.RepairedHistory`) and the published snapshot
(``TurnRunner._publish_history``) compared the kept messages by value, so such a
replacement went unseen: the model was sent the old value, ``session.messages`` showed
it."""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import pytest

import runtime.history
from actors.providers.scripted import ScriptedProvider
from actors.turn.runner import TurnRunner
from runtime import Agent, Host
from runtime.actor_messages import History, SessionState
from runtime.history import RepairedHistory
from runtime.messages import (
    AssistantMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from tests.test_busy import Script, look

# (where the value is, the value stored, the value it is replaced by): equal, not alike
CHANGES = {
    "output 1 -> True": ("output", 1, True),
    "output 1 -> 1.0": ("output", 1, 1.0),
    "output nested": ("output", {"a": 1}, {"a": True}),
    "args 1 -> True": ("input", {"n": 1}, {"n": True}),
    "args 1 -> 1.0": ("input", {"n": 1}, {"n": 1.0}),
}


def turn(where: str, value: object) -> list:
    """A finished turn with one tool call, ``value`` as its arguments or its output."""
    args, output = (value, "ok") if where == "input" else ({}, value)
    return [
        UserMessage(content="go"),
        AssistantMessage(
            content=(ToolCallPart(tool_call_id="C", tool_name="look", input=args, step=0),)
        ),
        ToolMessage(tool_call_id="C", tool_name="look", output=output, step=0),
        AssistantMessage(content=(TextPart(text="done", step=1),)),
    ]


def replace(history: list, where: str, new: object) -> None:
    """The turn's value made ``new``, as a plug-in's edit of the runner's list would."""
    before = history[1:3]
    if where == "input":
        (part,) = history[1].content
        history[1] = attrs.evolve(history[1], content=(attrs.evolve(part, input=new),))
    else:
        history[2] = attrs.evolve(history[2], output=new)
    assert history[1:3] == before  # (equal to what it replaced, by value)


def value(messages: object, where: str) -> object:
    if where == "input":
        return messages[1].content[0].input  # type: ignore[index]
    return messages[2].output  # type: ignore[index]


def alike(a: object, b: object) -> bool:
    """Equal, and of the same types throughout: what JSON would tell apart."""
    return repr(a) == repr(b)


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_kept_message_replaced_by_an_equal_one_of_other_types_is_repaired_anew(change):
    where, old, new = CHANGES[change]
    history = History([*turn(where, old), UserMessage(content="next")])
    repaired = RepairedHistory()
    repaired(history)  # the turn is kept
    replace(history, where, new)
    assert value(history, where) == old  # (blind to the change)
    assert alike(value(repaired(history), where), new)


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_message_replaced_by_an_equal_one_of_other_types_is_published(change):
    where, old, new = CHANGES[change]
    history = History(turn(where, old))
    state = SessionState(session_id="s", messages=history)
    runner = SimpleNamespace(state=state, snapshot=state.snapshot(), _shown=(history, 0))
    replace(history, where, new)
    TurnRunner._publish_history(runner)  # type: ignore[arg-type]
    assert alike(value(runner.snapshot.messages, where), new)


@pytest.mark.parametrize("change", sorted(CHANGES))
async def test_the_model_is_sent_a_value_a_plugin_replaced_by_an_equal_one(change):
    where, old, new = CHANGES[change]
    script = Script(["one"], ["two"])
    agent = Agent(provider=ScriptedProvider(responder=script), tools=[look])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, "s", history=turn(where, old))
        await session.run("first")  # the given turn is kept, repaired, from here on
        replace(session.runner.state.messages, where, new)
        await session.run("second")
        assert alike(value(session.messages, where), new)
    assert alike(value(script.requests[0].messages, where), old)
    assert alike(value(script.requests[1].messages, where), new)


# -- a history of fresh objects (a reload): repaired whole once, then kept again ------------


def counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lengths of the histories :func:`runtime.history.repair` is given from now on."""
    sizes: list[int] = []
    real = runtime.history.repair

    def repair(messages):  # type: ignore[no-untyped-def]
        sizes.append(len(messages))
        return real(messages)

    monkeypatch.setattr(runtime.history, "repair", repair)
    return sizes


def long_history(turns: int) -> list:
    out: list = []
    for i in range(turns):
        out += turn("output", i)
    return [*out, UserMessage(content="last")]


def test_a_reloaded_history_is_repaired_whole_once_then_kept(monkeypatch):
    history = History(long_history(50))
    repaired = RepairedHistory()
    repaired(history)
    sizes = counting(monkeypatch)
    history[:] = [attrs.evolve(m) for m in history]  # the store's copies: equal, not the same
    repaired(history)
    assert max(sizes) == 200  # the whole kept part, once
    sizes.clear()
    for _ in range(3):  # turns on the reloaded history: their own messages only
        history += [AssistantMessage(content=(TextPart(text="a", step=0),))]
        history.append(UserMessage(content="more"))
        repaired(history)
    assert max(sizes) <= 2


def test_a_history_primed_from_a_tuple_is_not_repaired_again_for_its_list(monkeypatch):
    messages = long_history(50)
    repaired = RepairedHistory()
    repaired(tuple(messages))  # (primed off the loop)
    sizes = counting(monkeypatch)
    history = History(messages)  # the runner's list: the same objects
    history.append(AssistantMessage(content=(TextPart(text="a", step=0),)))
    history.append(UserMessage(content="more"))
    repaired(history)
    repaired(history)
    assert max(sizes) <= 2


async def test_a_session_another_writer_moved_is_repaired_whole_once_then_kept(
    tmp_path, monkeypatch
):
    """Host ``a`` takes in ``b``'s turn before its own: its history's saved part becomes
    the store's copies (equal, not the same objects), repaired whole on that turn only."""
    path = str(tmp_path / "s.db")

    def agent() -> Agent:  # one per host: a provider actor belongs to one host
        return Agent(provider=ScriptedProvider(responder=lambda _request: ["ok"]))

    async with Host.open(store=path, log_tap=False) as a, Host.open(store=path, log_tap=False) as b:
        mine = await a.open_session(agent(), "s", history=long_history(50))
        await mine.run("one")
        await (await b.open_session(agent(), "s")).run("two")
        sizes = counting(monkeypatch)
        await mine.run("three")  # reloads the session first
        assert max(sizes) >= 200
        sizes.clear()
        await mine.run("four")
        await mine.run("five")
        assert max(sizes) <= 2
    assert [m.content for m in mine.messages if isinstance(m, UserMessage)][-5:] == [
        "one",
        "two",
        "three",
        "four",
        "five",
    ]


# -- between two steps of one turn ----------------------------------------------------------


@pytest.mark.parametrize("how", ["reversed slice", "plain list"])
async def test_a_value_a_step_hook_retypes_is_sent_by_the_next_step(how):
    """A hook between two steps of one turn retypes a kept result (``1`` made ``True``)
    through a slice with a negative step, or by making ``state.messages`` a plain list
    of equal copies (taken in as the runner's History at the step's publication)."""
    from runtime.agent import Hooks
    from tests.test_busy import looking

    where, old, new = CHANGES["output 1 -> True"]
    holder: dict = {}

    async def retype(_event: object) -> None:
        state = holder["session"].runner.state
        if not holder.get("armed") or value(state.messages, where) is not old:
            return
        copies = list(state.messages)
        replace(copies, where, new)
        if how == "plain list":
            state.messages = copies
        else:
            state.messages[::-1] = copies[::-1]

    script = Script(["one"], looking("L"), ["two"])
    agent = Agent(
        provider=ScriptedProvider(responder=script),
        tools=[look],
        hooks=Hooks(on_step_finish=retype),
    )
    async with Host.open(log_tap=False) as host:
        session = holder["session"] = await host.open_session(agent, "s", history=turn(where, old))
        await session.run("first")
        holder["armed"] = True
        await session.run("second")  # its first step's end retypes the given turn's result
        assert alike(value(session.messages, where), new)
        assert tuple(session.messages) == tuple(session.runner.state.messages)
    assert [alike(value(r.messages, where), new) for r in script.requests] == [False, False, True]
