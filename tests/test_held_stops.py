"""``runtime.busy.HeldStops``: the one store of named stops that came before what they
name (the host's, fed by its own stop endpoint and by the relay's publisher), against a
plain model: kept a minute, at most ``kept``, the oldest dropped first, each used once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.busy import HeldStops


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def held(kept: int = 1024, held_for: float = 60.0) -> tuple[HeldStops, Clock]:
    clock = Clock()
    return HeldStops(kept=kept, held_for=held_for, clock=clock), clock


def test_a_stop_is_taken_by_what_it_names_once():
    stops, _ = held()
    stops.hold("s", "u1", None, "r")
    assert stops.take("s", "u2", "t1") is None
    assert stops.take("s", "u1", "t1") == "r"
    assert stops.take("s", "u1", "t1") is None


def test_a_stop_naming_a_turn_is_taken_by_that_turn_whatever_its_message():
    stops, _ = held()
    stops.hold("s", None, "t2", "r")
    assert stops.take("s", "u9", "t2") == "r"


def test_a_stop_naming_both_takes_only_what_has_both():
    stops, _ = held()
    stops.hold("s", "u1", "t1", "r")
    assert stops.take("s", "u1", "t2") is None
    assert stops.take("s", "u2", "t1") is None
    assert stops.take("s", "u1", "t1") == "r"


def test_a_stop_naming_nothing_is_not_kept():
    stops, _ = held()
    stops.hold("s", None, None, "r")
    assert not stops
    assert stops.take("s", None, "t") is None


def test_a_stop_of_one_session_is_not_taken_by_another():
    stops, _ = held()
    stops.hold("t", "u0", None, "r")
    assert stops.take("s", "u0", "turn") is None
    assert stops.take("t", "u0", "turn") == "r"


def test_a_stop_is_dropped_after_its_minute():
    stops, clock = held()
    stops.hold("s", "u3", None, "r")
    clock.now = 60.5
    assert stops.take("s", "u3", "t3") is None
    assert not stops


def test_a_stop_sent_twice_is_kept_once_from_its_last_sending():
    stops, clock = held()
    stops.hold("s", "u1", None, "r")
    clock.now = 50
    stops.hold("s", "u1", None, "r")
    clock.now = 100
    assert len(stops) == 1
    assert stops.take("s", "u1", "t") == "r"


def test_the_stops_kept_are_bounded_the_oldest_dropped():
    stops, _ = held(kept=1024)
    for n in range(1024 + 5):
        stops.hold(f"s{n}", "u", None, "r")
    assert len(stops) == 1024
    assert stops.take("s4", "u", "t") is None
    assert stops.take("s5", "u", "t") == "r"


_names = st.sampled_from([None, "a", "b"])
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("hold"), st.sampled_from(["s", "t"]), _names, _names),
        st.tuples(st.just("take"), st.sampled_from(["s", "t"]), _names, _names),
        st.tuples(st.just("take"), st.just("s"), st.just("a"), st.just("b")),
        st.tuples(st.just("wait"), st.floats(0, 40), st.none(), st.none()),
    ),
    max_size=40,
)


@settings(max_examples=500)
@given(_ops)
def test_held_stops_behave_as_a_list_of_the_latest_unexpired_stops(ops):
    # The model: a list of (key, at), oldest first, at most 3 kept, 60 s each; a take
    # uses the first (oldest) one of the session that names what it is asked.
    stops, clock = held(kept=3)
    model: list[tuple[tuple[str, str | None, str | None], float]] = []
    for op, a, b, c in ops:
        if op == "wait":
            clock.now += a
            continue
        live = [(k, at) for k, at in model if at >= clock.now - 60]
        if op == "hold":
            if b is None and c is None:
                continue
            key = (a, b, c)
            model = [(k, at) for k, at in live if k != key] + [(key, clock.now)]
            model = model[-3:]
            stops.hold(a, b, c, f"{a}{b}{c}")
        else:
            expected = next(
                (k for k, _ in live if k[0] == a and k[1] in (None, b) and k[2] in (None, c)),
                None,
            )
            got = stops.take(a, b, c)
            if expected is None:
                assert got is None
            else:
                assert got == f"{expected[0]}{expected[1]}{expected[2]}"
                model = [(k, at) for k, at in model if k != expected]
        assert len(stops) <= 3
