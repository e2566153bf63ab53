"""The runner's counted history (History), its kept repair (RepairedHistory) and its
published snapshot (TurnRunner._publish_history), driven by a state machine through
every History method with odd arguments (negative, out-of-range and stepped indices,
slices that change the length, ``*=``, ``__init__`` again, edits that raise), each edit
free to put in a message equal to one it replaces but holding values of other types
(``1`` made ``True``): after each, the kept repair must be alike to a full repair and
the snapshot alike to the list, types and all."""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from runtime.actor_messages import History
from runtime.history import RepairedHistory, repair
from runtime.messages import AssistantMessage, Message, ToolMessage, UserMessage
from tests.test_history_edits import Folding, call, messages, publish, publisher, same

OTHER = {int: True, bool: 1.0, float: 1}
"""A value's type and a value equal to it of another type (``1 == True == 1.0``)."""


def unlike(m: Message) -> Message:
    """``m`` made equal but not alike (a result's output, a call's argument retyped);
    ``m`` itself when it holds nothing to retype."""
    if isinstance(m, ToolMessage) and type(m.output) in OTHER:
        return attrs.evolve(m, output=OTHER[type(m.output)])
    if isinstance(m, AssistantMessage) and m.content:
        part = m.content[0]
        n = getattr(part, "input", {}).get("n")
        if type(n) in OTHER:
            retyped = attrs.evolve(part, input={"n": OTHER[type(n)]})
            return attrs.evolve(m, content=(retyped, *m.content[1:]))
    return m


numbered = st.one_of(
    messages,
    st.builds(
        lambda c, n: AssistantMessage(content=(attrs.evolve(call(c), input={"n": n}),)),
        st.sampled_from(["A", "B"]),
        st.sampled_from([1, True, 1.0]),
    ),
)
index = st.one_of(st.integers(-12, 12), st.sampled_from([-(10**6), 10**6]))
bound = st.one_of(st.none(), index)
step = st.sampled_from([None, 1, 2, 3, -1, -2])


class Failing(Exception):
    pass


def failing(items: list[Message]) -> Any:
    """An iterable that gives ``items``, then fails."""
    yield from items
    raise Failing


class HistoryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.runner = publisher(History())
        self.kept = [RepairedHistory(), Folding()]
        self.lists: list[list[Message]] = [self.history]
        """Every list the runner's history has been (one may be given back)."""

    @property
    def history(self) -> list[Message]:
        """The runner's history: ``state.messages``, whatever list a plug-in made it."""
        return self.runner.state.messages

    @history.setter
    def history(self, new: list[Message]) -> None:
        self.runner.state.messages = new
        self.lists.append(new)

    def unlike_copies(self, start: int | None, stop: int | None, s: int | None) -> list:
        """Equal, unlike copies of ``history[start:stop:s]`` (what an edit puts back)."""
        return [unlike(m) for m in self.history[start:stop:s]]

    # -- what a turn adds at the end ------------------------------------------------------

    @rule(ms=st.lists(numbered, max_size=5), how=st.sampled_from(["+=", "extend", "append"]))
    def add(self, ms, how):
        ms = [UserMessage(content="turn"), *ms]
        if how == "+=":
            self.history += ms
        elif how == "extend":
            self.history.extend(iter(ms))
        else:
            for m in ms:
                self.history.append(m)

    # -- edits of positions, each putting back equal messages of other types -------------

    @precondition(lambda self: self.history)
    @rule(i=index)
    def retype_item(self, i):
        n = len(self.history)
        self.history[i % n - n] = unlike(self.history[i % n])  # (a negative index)

    @rule(start=bound, stop=bound, s=step)
    def retype_slice(self, start, stop, s):
        self.history[start:stop:s] = self.unlike_copies(start, stop, s)

    @rule(start=bound, stop=bound, extra=st.lists(numbered, max_size=2))
    def resize_slice(self, start, stop, extra):
        self.history[start:stop] = [*self.unlike_copies(start, stop, None), *extra][1:]

    @rule(start=bound, stop=bound, s=step)
    def delete_slice(self, start, stop, s):
        del self.history[start:stop:s]

    @precondition(lambda self: self.history)
    @rule(i=index)
    def pop_and_put_back(self, i):
        n = len(self.history)
        if i in (-1, n - 1):
            self.history.append(unlike(self.history.pop()))
        else:
            at = i % n
            self.history.insert(at, unlike(self.history.pop(at)))

    @rule(i=index, m=numbered)
    def insert(self, i, m):
        self.history.insert(i, m)

    @precondition(lambda self: self.history)
    @rule(i=index)
    def remove_an_equal_one(self, i):
        self.history.remove(unlike(self.history[i % len(self.history)]))  # the first equal

    @rule(n=st.sampled_from([0, -1, 1, 2]))
    def multiply(self, n):
        if len(self.history) > 20:
            n = min(n, 1)
        self.history *= n

    @rule(how=st.sampled_from(["reverse", "sort", "sort by type"]))
    def reorder(self, how):
        if how == "reverse":
            self.history.reverse()
        else:  # equal messages swapped: the same values, in other types at each place
            by_type = how == "sort by type"
            key = (lambda m: repr(type(getattr(m, "output", None)))) if by_type else id
            self.history.sort(key=key, reverse=True)

    @rule(raising=st.booleans())
    def refill(self, raising):
        copies = self.unlike_copies(None, None, None)
        if raising:
            try:
                self.history.__init__(failing(copies))  # type: ignore[misc]
            except Failing:
                pass
        else:
            self.history.__init__(copies)  # type: ignore[misc]

    @rule()
    def clear_and_refill(self):
        copies = self.unlike_copies(None, None, None)
        self.history.clear()
        self.history.extend(copies)

    @rule(i=index)
    def extend_that_fails(self, i):
        try:
            self.history.extend(failing(self.unlike_copies(i, None, None)))
        except Failing:
            pass

    # -- the list replaced (a plug-in's, a reload's), or the repair primed from a tuple ---

    @rule(kind=st.sampled_from([list, History]), retyped=st.booleans())
    def replace_the_list(self, kind, retyped):
        self.history = kind(self.unlike_copies(None, None, None) if retyped else self.history)

    @rule(which=st.integers(0, 50))
    def give_back_an_earlier_list(self, which):
        earlier = self.lists[which % len(self.lists)]
        if isinstance(earlier, History):  # (a plain list was taken in: not the runner's)
            self.history = earlier

    @rule()
    def prime_from_a_tuple(self):
        full = repair(self.history)
        for kept in self.kept:
            assert same(kept(tuple(self.history)), full)

    # -- what is checked after every edit --------------------------------------------------

    @invariant()
    def the_kept_repair_is_a_full_repair(self):
        full = repair(self.history)
        for kept in self.kept:
            assert same(kept(self.history), full)

    @invariant()
    def the_snapshot_is_the_history(self):
        shown = publish(self.runner)
        assert repr(shown) == repr(tuple(self.history))


HistoryMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=25)
test_history_machine = HistoryMachine.TestCase
