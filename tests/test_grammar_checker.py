"""The output grammar checker (tests/support/grammar) on streams written by hand: the
turns with no step it accepts are the zero-step continuation a budget ends, and a bare
``start finish`` (``budget``: a hook's own on turn start; ``stop``: a takeover of an
answered turn; tests/test_stepless_turns.py streams both for real), and a continuation
whose agent tool asks for its sub-agent's next approval (``tool-approval-request`` after
the results, ``awaiting-input``; tests/test_approval_nested_pass_many.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.grammar import check_grammar

LEADING = ("tool-result", "tool-error", "tool-output-denied", "tool-stream")
REASONS = ("stop", "budget", "awaiting-input", "length")


def stream(*types: str, reason: str = "stop") -> list[dict]:
    chunks = [{"type": t, "seq": i} for i, t in enumerate(("start", *types, "finish"))]
    chunks[-1]["finish_reason"] = reason
    return chunks


def test_a_continuation_a_budget_ended_before_any_step_is_accepted():
    check_grammar(stream("tool-stream", "tool-result", reason="budget"))


@pytest.mark.parametrize("reason", ["budget", "stop"])
def test_start_finish_alone_is_accepted_for_a_hooks_budget_or_an_answered_takeover(reason):
    check_grammar(stream(reason=reason))


def test_a_continuation_asking_for_the_next_passed_approval_is_accepted():
    check_grammar(
        stream("tool-result", "tool-stream", "tool-approval-request", reason="awaiting-input")
    )


@pytest.mark.parametrize(
    "types",
    [
        ("tool-approval-request", "step-start", "step-finish"),  # then a step: it went on
        ("tool-result", "tool-approval-request"),  # "stop": it did not wait
    ],
)
def test_a_leading_approval_request_in_a_turn_that_does_not_wait_is_refused(types):
    with pytest.raises(AssertionError):
        check_grammar(stream(*types, reason="stop"))


@pytest.mark.parametrize(
    ("types", "reason"),
    [
        ((), "awaiting-input"),  # bare, but not a documented reason
        ((), "length"),
        (("tool-result",), "stop"),  # not a budget: a model call was due
        (("tool-stream",), "budget"),  # progress, no result
        (("step-start", "step-finish", "tool-stream"), "stop"),  # after a step: outside
    ],
)
def test_a_turn_with_no_step_otherwise_is_refused(types, reason):
    with pytest.raises(AssertionError):
        check_grammar(stream(*types, reason=reason))


@given(st.lists(st.sampled_from(LEADING), max_size=5), st.sampled_from(REASONS))
def test_a_stream_without_steps_is_accepted_only_as_a_budgets_continuation_or_bare(leading, reason):
    results = any(t != "tool-stream" for t in leading)
    legal = (reason == "budget" and results) or (not leading and reason in ("budget", "stop"))
    chunks = stream(*leading, reason=reason)
    if legal:
        check_grammar(chunks)
    else:
        with pytest.raises(AssertionError):
            check_grammar(chunks)
