"""The runner's counted history (History) and its kept repair (RepairedHistory), attacked:
every way a plug-in or the runner itself can edit the list, against a plain list and a
full repair. A missed edit publishes a stale snapshot (to ``session.messages``, to the
store's saves); a stale kept repair sends the model a wrong history."""

from __future__ import annotations

import bisect
import heapq
import random
from types import SimpleNamespace

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.turn.runner import TurnRunner
from runtime.actor_messages import History, SessionState
from runtime.history import RepairedHistory, repair
from runtime.messages import (
    AssistantMessage,
    SystemMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)


def call(call_id: str) -> ToolCallPart:
    return ToolCallPart(tool_call_id=call_id, tool_name="t", input={}, step=0)


def result(call_id: str, output: object = "ok") -> ToolMessage:
    return ToolMessage(tool_call_id=call_id, tool_name="t", output=output, step=0)


OTHER_TYPE = {int: True, bool: 1.0, float: 1}
"""A tool output's type and an output equal to it of another type (``1 == True == 1.0``)."""


ids = st.sampled_from(["A", "B", "C"])
messages = st.one_of(
    st.builds(lambda t: UserMessage(content=t), st.sampled_from(["u", "v"])),
    st.just(SystemMessage(content="summary")),
    st.builds(lambda cs: AssistantMessage(content=tuple(call(c) for c in cs)), st.sets(ids)),
    st.just(AssistantMessage(content=(TextPart(text=" ", step=0),))),  # blank: repaired
    st.builds(result, ids, st.sampled_from(["ok", 1])),
)
index = st.integers(-30, 30)


# -- the snapshot: every edit of the runner's list is seen ---------------------------------


def publisher(history: list) -> SimpleNamespace:
    """What TurnRunner._publish_history reads and writes, over ``history``."""
    state = SessionState(session_id="s", messages=history)
    return SimpleNamespace(
        state=state,
        snapshot=state.snapshot(),
        _shown=(history, getattr(history, "edits", None)),
    )


def publish(runner: SimpleNamespace) -> tuple:
    TurnRunner._publish_history(runner)  # type: ignore[arg-type]
    return runner.snapshot.messages


# Each edit: (name, function of (list, message, index)); applied to a History and to a
# plain list alike. Some reach the list's storage without a History method.
EDITS = {
    "append": lambda h, m, i: h.append(m),
    "list.append": lambda h, m, i: list.append(h, m),
    "list.extend": lambda h, m, i: list.extend(h, [m, m]),
    "list.insert": lambda h, m, i: list.insert(h, i, m),
    "list.pop": lambda h, m, i: h and list.pop(h),
    "list.__delitem__": lambda h, m, i: list.__delitem__(h, slice(i, None)),
    "list.__setitem__ last": lambda h, m, i: h and list.__setitem__(h, -1, m),
    "list.__iadd__": lambda h, m, i: list.__iadd__(h, [m]),
    "list.clear": lambda h, m, i: list.clear(h),
    "insort": lambda h, m, i: bisect.insort(h, m, key=id),
    "extend(generator)": lambda h, m, i: h.extend(x for x in (m, m)),
    "+= generator": lambda h, m, i: h.__iadd__(x for x in (m,)),
    "*= 2": lambda h, m, i: h.__imul__(2 if len(h) < 20 else 1),
    "*= 0": lambda h, m, i: h.__imul__(0),
    "slice set": lambda h, m, i: h.__setitem__(slice(i, i + 2), [m]),
    "slice set, same length": lambda h, m, i: h.__setitem__(slice(i, i + 1), [m][: len(h[i:][:1])]),
    "extended slice set": lambda h, m, i: h.__setitem__(slice(None, None, -1), list(h)),
    "slice del": lambda h, m, i: h.__delitem__(slice(i, i + 2)),
    "item set": lambda h, m, i: h and h.__setitem__(i % len(h), m),
    "item del": lambda h, m, i: h and h.__delitem__(i % len(h)),
    "insert": lambda h, m, i: h.insert(i, m),
    "shuffle": lambda h, m, i: random.Random(i).shuffle(h),
    "reverse": lambda h, m, i: h.reverse(),
    "sort": lambda h, m, i: h.sort(key=lambda x: (type(x).__name__, id(x))),
    "__init__ again": lambda h, m, i: h.__init__([m]),
    "remove": lambda h, m, i: h and h.remove(h[i % len(h)]),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_edit_of_any_kind_is_published(edit):
    m0 = [UserMessage(content=str(i)) for i in range(5)]
    history = History(m0)
    plain = list(m0)
    runner = publisher(history)
    new = UserMessage(content="new")
    EDITS[edit](history, new, 2)
    EDITS[edit](plain, new, 2)
    assert list(history) == plain
    assert publish(runner) == tuple(plain)
    assert publish(runner) == tuple(plain)  # and kept, not lost, by the next publication


def test_a_heap_push_is_published():
    history = History()
    runner = publisher(history)
    heapq.heappush(history, 3)  # type: ignore[arg-type]  # list's C append
    heapq.heappush(history, 1)  # type: ignore[arg-type]
    assert history.edits == 0  # not counted: the length shows it
    assert publish(runner) == (1, 3)


def test_a_history_replaced_by_a_plain_list_is_still_published():
    history = History([UserMessage(content="a")])
    runner = publisher(history)
    plain = [UserMessage(content="b")]
    runner.state.messages = plain  # a plug-in's `state.messages = [...]`
    assert publish(runner) == tuple(plain)
    taken = runner.state.messages  # (made a counted History: the runner's list now)
    assert type(taken) is History and taken is not plain
    taken[0] = UserMessage(content="c")  # same length: counted
    assert publish(runner) == tuple(taken)
    runner.state.messages = history  # and back to the counted list, unchanged meanwhile
    assert publish(runner) == tuple(history)


def test_a_history_replaced_by_another_at_the_same_count_is_published():
    a, b = History([UserMessage(content="a")]), History([UserMessage(content="b")])
    runner = publisher(a)
    runner.state.messages = b  # both at 0 edits: told apart by identity
    assert publish(runner) == tuple(b)


edit_ops = st.lists(
    st.tuples(st.sampled_from(sorted(EDITS)), messages, index, st.booleans()),
    max_size=25,
)


@given(start=st.lists(messages, max_size=8), ops=edit_ops)
def test_the_snapshot_is_the_history_after_any_edits(start, ops):
    history, plain = History(start), list(start)
    runner = publisher(history)
    for name, m, i, publish_now in ops:
        EDITS[name](history, m, i)
        EDITS[name](plain, m, i)
        if publish_now:
            assert publish(runner) == tuple(plain)
        assert list(history) == plain
    assert publish(runner) == tuple(plain)


def test_a_version_moved_without_an_edit_keeps_the_messages():
    history = History([UserMessage(content="a")])
    runner = publisher(history)
    shown = runner.snapshot.messages
    runner.state.saved_upto, runner.state.version = 1, 3  # a save's answer
    publish(runner)
    snap = runner.snapshot
    assert (snap.messages, snap.saved_upto, snap.version) == (shown, 1, 3)


# -- the kept repair: any sequence of edits, as the runner's list gets them ------------------


def same(kept: tuple, full: list) -> bool:
    """Alike but for the ids of the ``interrupted`` results repair makes (new each time):
    equal, and of the same types throughout (``1`` is not ``True``, as sent)."""
    return repr([attrs.evolve(m, id="") for m in kept]) == repr(
        [attrs.evolve(m, id="") for m in full]
    )


class Folding(RepairedHistory):
    FOLD = 2


repair_ops = st.lists(
    st.one_of(
        st.tuples(st.just("turn"), st.lists(messages, min_size=1, max_size=6)),
        st.tuples(st.sampled_from(["insert", "replace", "delete", "truncate"]), index, messages),
        st.tuples(st.just("prime"), index, messages),  # the kept repair primed from a tuple
        st.tuples(st.just("reload"), index, messages),  # a new list, equal (the store's)
        st.tuples(st.just("retype"), index, messages),  # a result made an equal one, unlike
        st.tuples(st.just("copies"), index, messages),  # the store's equal copies, in place
    ),
    max_size=20,
)


@pytest.mark.parametrize("kept", [RepairedHistory, Folding], ids=["kept", "folding"])
@settings(max_examples=200)
@given(start=st.lists(messages, max_size=10), ops=repair_ops)
def test_the_kept_repair_equals_a_full_repair_after_any_edits(kept, start, ops):
    repaired = kept()
    history = History(start)
    assert same(repaired(history), repair(history))
    for op, *args in ops:
        if op == "turn":  # a turn: its user message, then what its steps add
            history.append(UserMessage(content="turn"))
            history += args[0]
        elif op == "insert":  # a summary before the turn's message, a steered message
            history.insert(args[0], args[1])
        elif op == "replace" and history:  # the turn's answer refreshed, a superseded call
            history[args[0] % len(history)] = args[1]
        elif op == "delete" and history:
            del history[args[0] % len(history)]
        elif op == "truncate":  # a failed step's rollback, a reload's shorter base
            del history[args[0] % (len(history) + 1) :]
        elif op == "prime":
            assert same(repaired(tuple(history)), repair(history))
        elif op == "reload":
            history = History(list(history))
        elif op == "retype":
            for j, m in enumerate(history):
                if isinstance(m, ToolMessage) and type(m.output) in OTHER_TYPE:
                    history[j] = attrs.evolve(m, output=OTHER_TYPE[type(m.output)])
                    break
        elif op == "copies":  # as a reload from the store replaces the saved part
            cut = args[0] % (len(history) + 1)
            history[:cut] = [attrs.evolve(m) for m in history[:cut]]
        assert same(repaired(history), repair(history))


COUNTED = sorted(name for name in EDITS if not name.startswith("list."))
"""The edits made through History's own methods (those it counts)."""


@given(
    start=st.lists(messages, max_size=8),
    ops=st.lists(st.tuples(st.sampled_from(COUNTED), messages, index), max_size=10),
)
def test_a_watermark_is_below_every_position_an_edit_changed(start, ops):
    history = History(start)
    mark = history.watch()
    before = list(history)
    for name, m, i in ops:
        EDITS[name](history, m, i)
    kept = min(mark.low, len(before))
    assert len(history) >= kept
    assert all(history[p] is before[p] for p in range(kept))


def test_an_edit_at_the_end_leaves_the_watermark_where_it_was():
    history = History([UserMessage(content="a"), UserMessage(content="b")])
    mark = history.watch()
    history.append(UserMessage(content="c"))
    history += [UserMessage(content="d")]
    history[3] = UserMessage(content="e")  # (the turn's answer, refreshed in place)
    del history[3:]
    assert mark.low == 3


def test_an_edit_below_a_folded_head_is_repaired_whole():
    repaired = Folding()
    history = History()
    for i in range(6):  # turns with an unanswered call each: folded twice
        history += [UserMessage(content=f"u{i}"), AssistantMessage(content=(call(f"c{i}"),))]
    history.append(UserMessage(content="last"))
    assert same(repaired(history), repair(history))
    assert repaired._repaired  # folded
    history[1] = AssistantMessage(content=(call("c0"), call("x")))  # inside the folded head
    history.insert(2, result("x"))
    assert same(repaired(history), repair(history))
    assert [m.tool_call_id for m in repaired(history)[2:4]] == ["c0", "x"]
    del history[3:]  # below the head: cut
    history.append(UserMessage(content="after the cut"))
    assert same(repaired(history), repair(history))


# -- an edit that raises part way has edited the list all the same ---------------------------


def refill_raising(history: History, new: list) -> None:
    """``history.__init__(new)`` whose iterable fails after its last item: list's
    ``__init__`` has emptied the list and refilled it by then."""

    def items():  # type: ignore[no-untyped-def]
        yield from new
        raise RuntimeError("the source failed")

    with pytest.raises(RuntimeError):
        history.__init__(items())  # type: ignore[misc]
    assert list(history) == new


def retyped(history: list) -> list:
    """``history`` with its tool result ``1`` made ``True`` (equal, not alike); the last
    message the same object."""
    return [attrs.evolve(m, output=True) if isinstance(m, ToolMessage) else m for m in history]


def turn_then_user() -> History:
    return History(
        [
            UserMessage(content="u"),
            AssistantMessage(content=(call("A"),)),
            result("A", 1),
            UserMessage(content="next"),
        ]
    )


def test_a_refill_that_raises_part_way_is_published():
    history = turn_then_user()
    runner = publisher(history)
    refill_raising(history, retyped(history))
    assert repr(publish(runner)[2].output) == "True"


def test_a_refill_that_raises_part_way_is_repaired_anew():
    history = turn_then_user()
    repaired = RepairedHistory()
    repaired(history)  # the turn is kept
    refill_raising(history, retyped(history))
    assert same(repaired(history), repair(history))
