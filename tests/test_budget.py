"""``Budget`` owns its checks: which limit a turn ran into, by name."""

from __future__ import annotations

import pytest

from runtime import Budget, BudgetExceeded, Usage


def test_check_step_raises_max_steps_only_past_the_last_allowed_step():
    budget = Budget(max_steps=2)
    budget.check_step(1)
    with pytest.raises(BudgetExceeded) as caught:
        budget.check_step(2)
    assert caught.value.budget == "max_steps"


@pytest.mark.parametrize(
    ("limits", "name"),
    [
        ({"max_input_tokens": 99}, "max_input_tokens"),
        ({"max_output_tokens": 9}, "max_output_tokens"),
        ({"max_total_tokens": 109}, "max_total_tokens"),
        ({"max_total_tokens": 110}, None),
        ({}, None),
    ],
)
def test_tokens_exceeded_names_the_token_budget_usage_went_over(limits, name):
    usage = Usage(input_tokens=100, output_tokens=10, total_tokens=110)
    assert Budget(**limits).tokens_exceeded(usage) == name


def test_output_left_is_what_max_output_tokens_leaves_never_below_zero():
    usage = Usage(input_tokens=100, output_tokens=10, total_tokens=110)
    assert Budget(max_output_tokens=25).output_left(usage) == 15
    assert Budget(max_output_tokens=8).output_left(usage) == 0
    assert Budget().output_left(usage) is None


@pytest.mark.parametrize(
    ("more", "cut", "limit", "name"),
    [
        (True, False, 10, "max_output_tokens"),  # tool calls, and no call may write more
        (False, True, 10, "max_output_tokens"),  # the call was cut at the budget's cap
        (False, False, 10, None),  # an answer that ended on exactly the budget is whole
        (True, False, 11, None),  # a token left: the next call may write it
        (False, True, 11, "max_output_tokens"),  # cut at the cap, counted short of it
        (True, True, None, None),
    ],
)
def test_output_spent_ends_the_turn_when_the_budget_cut_a_call_or_left_nothing_for_more(
    more, cut, limit, name
):
    usage = Usage(input_tokens=100, output_tokens=10, total_tokens=110)
    assert Budget(max_output_tokens=limit).output_spent(usage, more=more, cut=cut) == name


def test_admits_tool_call_counts_calls_already_used_against_max_tool_calls():
    assert Budget(max_tool_calls=2).admits_tool_call(1)
    assert not Budget(max_tool_calls=2).admits_tool_call(2)
    assert Budget().admits_tool_call(10_000)


def test_a_budget_of_zero_steps_is_refused_when_it_is_made():
    from runtime import ConfigurationError

    with pytest.raises(ConfigurationError, match="max_steps must be at least 1"):
        Budget(max_steps=0)
