"""Context compaction (runtime/compaction.py): the history processors, the stored
summary, and their place before every model call of the turn runner."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.providers import ScriptedProvider, anthropic, openai, openai_responses
from actors.providers.scripted import tool_call
from runtime import Agent, DropToolResults, Host, KeepTurns, Summarize
from runtime.compaction import (
    SUMMARY_INSTRUCTIONS,
    SUMMARY_PREFIX,
    CompactionContext,
    apply_summaries,
    estimate_tokens,
    is_summary,
    run_processors,
    split_turns,
)
from runtime.errors import ConfigurationError
from runtime.events import HistoryCompacted
from runtime.history import repair
from runtime.messages import (
    AssistantMessage,
    Message,
    ReasoningPart,
    SystemMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from runtime.serde import from_json, to_json
from tests.support.faults import (
    check_anthropic_body,
    check_history,
    check_openai_body,
    check_responses_body,
)


def turn(n: int, *, result: str | None = None, thinking: bool = False) -> list[Message]:
    """Turn ``n``: a question and an answer; with ``result``, a tool call of step 0 with
    that output, answered at step 1 (signed thinking before the call with ``thinking``)."""
    user = UserMessage(content=f"question {n}", id=f"u{n}")
    if result is None:
        return [user, AssistantMessage(content=(TextPart(text=f"answer {n}", step=0),), id=f"a{n}")]
    parts: list[Any] = []
    if thinking:
        parts.append(ReasoningPart(text="plan", signature=f"sig{n}", step=0, provider="anthropic"))
    parts += [
        ToolCallPart(tool_call_id=f"c{n}", tool_name="lookup", input={"n": n}, step=0),
        TextPart(text=f"answer {n}", step=1),
    ]
    return [
        user,
        AssistantMessage(content=tuple(parts), id=f"a{n}"),
        ToolMessage(tool_call_id=f"c{n}", tool_name="lookup", step=0, output=result, id=f"t{n}"),
    ]


def history(*turns: list[Message]) -> tuple[Message, ...]:
    return tuple(m for t in turns for m in t)


def context(summaries: list[str] | None = None) -> CompactionContext:
    """A context whose model call answers ``summary <k>`` (and records the text asked)."""
    asked = summaries if summaries is not None else []

    async def summarize(instructions: str, text: str, settings: Any) -> str:
        asked.append(text)
        return f"summary {len(asked)}"

    return CompactionContext(session_id="s", turn_id="t", step=0, summarizer=summarize)


def run(processors: list[Any], messages: tuple[Message, ...], ctx: CompactionContext) -> tuple:
    return trio.run(run_processors, processors, messages, ctx)


# -- turns and stored summaries ------------------------------------------------------------


def test_a_history_is_cut_into_turns_at_its_user_messages():
    system = SystemMessage(content="be brief")
    turns = split_turns((system, *history(turn(1, result="r"), turn(2))))
    assert turns.head == (system,)
    assert [[m.id for m in t] for t in turns.turns] == [["u1", "a1", "t1"], ["u2", "a2"]]


def test_a_stored_summary_stands_for_the_messages_before_the_one_it_names():
    summary = SystemMessage(content="S", summarizes_before="u2")
    stored = (*turn(1), *turn(2), summary, *turn(3))
    assert [m.id for m in apply_summaries(stored)] == [summary.id, "u2", "a2", "u3", "a3"]


def test_the_latest_summary_wins_and_plain_system_messages_stay():
    system = SystemMessage(content="be brief")
    old = SystemMessage(content="S1", summarizes_before="u2")
    new = SystemMessage(content="S2", summarizes_before="u3")
    stored = (system, *turn(1), *turn(2), old, *turn(3), new, *turn(4))
    assert [m.id for m in apply_summaries(stored)] == [
        system.id,
        new.id,
        "u3",
        "a3",
        "u4",
        "a4",
    ]


def test_a_summary_whose_message_is_gone_stands_for_what_came_before_it():
    summary = SystemMessage(content="S", summarizes_before="u-regenerated")
    stored = (*turn(1), summary, *turn(2))
    assert [m.id for m in apply_summaries(stored)] == [summary.id, "u2", "a2"]


def test_a_summary_is_stored_as_json_with_the_message_it_stops_before():
    summary = SystemMessage(content="S", summarizes_before="u2")
    back = from_json(to_json(summary), Message)
    assert back == summary and is_summary(back)
    assert b"summarizes_before" not in to_json(SystemMessage(content="plain"))


# -- the processors ------------------------------------------------------------------------


def test_keep_turns_keeps_the_last_turns_and_the_system_messages():
    system = SystemMessage(content="be brief")
    messages = (system, *history(turn(1), turn(2), turn(3)))
    out = run([KeepTurns(n=2)], messages, context())
    assert [m.id for m in out] == [system.id, "u2", "a2", "u3", "a3"]


def test_drop_tool_results_shortens_long_old_results_only():
    long, short = "x" * 500, "ok"
    messages = history(turn(1, result=long), turn(2, result=short), turn(3, result=long))
    out = run([DropToolResults(max_chars=100, keep_turns=1)], messages, context())
    results = {m.tool_call_id: m.output for m in out if isinstance(m, ToolMessage)}
    assert "removed to save context" in results["c1"] and "500 characters" in results["c1"]
    assert (results["c2"], results["c3"]) == (short, long)
    assert [m.id for m in out] == [m.id for m in messages]  # the same messages, in place


def test_summarize_under_its_limit_changes_nothing_and_makes_no_call():
    asked: list[str] = []
    messages = history(turn(1), turn(2))
    ctx = context(asked)
    assert run([Summarize(max_tokens=10_000)], messages, ctx) == messages
    assert (asked, ctx.stored) == ([], [])


def test_summarize_over_its_limit_sends_a_summary_for_the_older_turns_and_stores_it():
    asked: list[str] = []
    messages = history(turn(1, result="r" * 400), turn(2), turn(3), turn(4))
    ctx = context(asked)
    out = run([Summarize(max_tokens=60, keep_turns=2)], messages, ctx)
    (stored,) = ctx.stored
    assert stored.message.summarizes_before == "u3"
    assert stored.message.content == SUMMARY_PREFIX + "summary 1"
    assert [m.id for m in out] == [stored.message.id, "u3", "a3", "u4", "a4"]
    assert "User: question 1" in asked[0] and "lookup returned: rrr" in asked[0]
    assert stored.tokens_after < stored.tokens_before and stored.covered == 5


def test_a_stored_summary_is_folded_into_the_next_one():
    asked: list[str] = []
    earlier = SystemMessage(content=SUMMARY_PREFIX + "earlier", summarizes_before="u2")
    messages = (*turn(1), earlier, *history(turn(2), turn(3), turn(4)))
    ctx = context(asked)
    run([Summarize(max_tokens=30, keep_turns=1)], messages, ctx)
    assert asked[0].startswith("Earlier summary:\nearlier\n")
    assert "question 1" not in asked[0] and "question 3" in asked[0]


def test_summarize_summarizes_more_turns_while_the_request_is_still_over_its_limit():
    asked: list[str] = []
    messages = history(turn(1), turn(2), turn(3, result="r" * 2000), turn(4))
    ctx = context(asked)
    out = run([Summarize(max_tokens=200, keep_turns=2)], messages, ctx)
    assert len(asked) == 2  # keeping turns 3 and 4 was still too much; then only turn 4
    assert [m.id for m in out][1:] == ["u4", "a4"]
    assert ctx.stored[-1].message.summarizes_before == "u4"


def test_the_current_turn_is_sent_whole_even_when_it_alone_is_over_the_limit():
    messages = history(turn(1, result="r" * 5000))
    ctx = context()
    assert run([Summarize(max_tokens=10)], messages, ctx) == messages
    assert ctx.stored == []


@pytest.mark.parametrize(
    "make",
    [
        lambda: KeepTurns(n=0),
        lambda: Summarize(max_tokens=0),
        lambda: DropToolResults(keep_turns=0),
    ],
)
def test_a_processor_that_could_cut_the_current_turn_is_refused(make):
    with pytest.raises(ConfigurationError):
        make()


def test_history_processors_is_a_list():
    with pytest.raises(ConfigurationError, match="list of processors"):
        Agent(history_processors=KeepTurns(n=2))  # type: ignore[arg-type]


def test_the_estimate_counts_bytes_so_other_scripts_are_not_undercounted():
    latin = estimate_tokens(None, [UserMessage(content="a" * 350)])
    cjk = estimate_tokens(None, [UserMessage(content="語" * 350)])
    assert latin == 104 and cjk == 304


# -- the property: no cut between a call and its result, the current turn whole ------------


@st.composite
def sessions(draw: st.DrawFn) -> tuple[Message, ...]:
    """A repaired history of 1-7 turns: some with a plain system message, steps of text,
    signed thinking and tool calls (some cut: no result), results of any size."""
    out: list[Message] = []
    for n in range(draw(st.integers(1, 7))):
        if draw(st.integers(0, 5)) == 0:
            out.append(SystemMessage(content=f"note {n}"))
        out.append(UserMessage(content=f"question {n} " + "q" * draw(st.integers(0, 300))))
        parts: list[Any] = []
        results: list[ToolMessage] = []
        steps = draw(st.integers(1, 3))
        for step in range(steps):
            if draw(st.booleans()):
                sig = f"sig-{n}-{step}"
                parts.append(
                    ReasoningPart(text="think", signature=sig, step=step, provider="anthropic")
                )
            calls = draw(st.integers(0, 2)) if step < steps - 1 else 0
            if calls == 0 or draw(st.booleans()):
                parts.append(TextPart(text=f"answer {n}.{step}", step=step))
            for c in range(calls):
                call_id = f"c{n}-{step}-{c}"
                parts.append(ToolCallPart(tool_call_id=call_id, tool_name="t", input={}, step=step))
                if draw(st.integers(0, 4)):  # else cut: repair answers it interrupted
                    size = draw(st.sampled_from([0, 10, 3000]))
                    results.append(
                        ToolMessage(
                            tool_call_id=call_id, tool_name="t", step=step, output="r" * size
                        )
                    )
        out.append(AssistantMessage(content=tuple(parts)))
        out.extend(results)
    return tuple(repair(out))


processors = st.lists(
    st.one_of(
        st.builds(KeepTurns, n=st.integers(1, 4)),
        st.builds(DropToolResults, max_chars=st.integers(0, 50), keep_turns=st.integers(1, 3)),
        st.builds(Summarize, max_tokens=st.integers(40, 3000), keep_turns=st.integers(1, 4)),
    ),
    min_size=1,
    max_size=3,
)


def current_turn(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    last = max(i for i, m in enumerate(messages) if isinstance(m, UserMessage))
    return messages[last:]


def sent_to_every_provider(messages: tuple[Message, ...]) -> None:
    """The messages as each provider maps them pass its API's pairing rules."""
    check_openai_body({"messages": openai.map_messages("be helpful", messages)})
    check_responses_body({"input": openai_responses.map_messages(messages)})
    check_anthropic_body({"messages": anthropic.map_messages("be helpful", messages)[1]})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions(), processors)
def test_no_processor_chain_cuts_a_call_from_its_result_or_touches_the_current_turn(
    messages, chain
):
    ctx = context()
    out = run(chain, messages, ctx)
    check_history(out)
    assert current_turn(out) == current_turn(messages)  # thinking and calls of the loop kept
    sent_to_every_provider(out)
    ids = {m.id for m in messages}
    assert all(m.id in ids or is_summary(m) for m in out)


@settings(max_examples=200, deadline=None)
@given(sessions(), st.integers(40, 3000), st.integers(1, 4))
def test_a_stored_summary_is_not_made_again_on_the_next_call(messages, limit, keep):
    """Stored where the runner stores it (before the current user message), the summary
    makes the next call send the same messages, with no new summary while under the limit."""
    first = context()
    out = run([Summarize(max_tokens=limit, keep_turns=keep)], messages, first)
    if not first.stored:
        return
    user = max(i for i, m in enumerate(messages) if isinstance(m, UserMessage))
    stored = (*messages[:user], first.stored[-1].message, *messages[user:])
    again = context()
    out_again = run([Summarize(max_tokens=limit, keep_turns=keep)], stored, again)
    assert apply_summaries(stored) == out
    if first.stored[-1].tokens_after <= limit:
        assert again.stored == [] and out_again == out
    sent_to_every_provider(out_again)


# -- in the turn runner --------------------------------------------------------------------


def summarizing_model(calls: dict[str, int]):
    """A scripted model: answers each question (a tool call first on the first step of
    even turns), and answers summary requests with ``summary <k>``."""

    def respond(request):
        if request.instructions == SUMMARY_INSTRUCTIONS:
            calls["summary"] += 1
            return [f"summary {calls['summary']}"]
        calls["model"] += 1
        last = request.messages[-1]
        if isinstance(last, UserMessage) and "even" in last.text:
            return [*tool_call("lookup", {"q": "x"}, tool_call_id=f"call{calls['model']}")]
        return ["an answer of some length " * 4]

    return respond


def lookup(q: str) -> str:
    """Look something up."""
    return "found " + "z" * 300


async def test_a_session_stores_each_summary_before_the_user_message_of_its_turn():
    calls = {"summary": 0, "model": 0}
    provider = ScriptedProvider(responder=summarizing_model(calls))
    agent = Agent(
        provider=provider,
        tools=[lookup],
        history_processors=[DropToolResults(max_chars=50), Summarize(max_tokens=300, keep_turns=2)],
    )
    async with Host.open(log_tap=False) as host:
        heard = host.bus.subscribe([HistoryCompacted], name="t")
        session = await host.open_session(agent)
        for n in range(20):
            result = await session.run(f"question {n} {'even' if n % 2 == 0 else 'odd'}")
            assert result.error is None
        stored = session.messages
    events = []
    while True:
        try:
            events.append(heard.inbox.get_nowait())
        except trio.WouldBlock:
            break
    summaries = [i for i, m in enumerate(stored) if is_summary(m)]
    assert calls["summary"] == len(summaries) == len(events) >= 2
    assert all(isinstance(stored[i + 1], UserMessage) for i in summaries)
    check_history([m for m in stored if not is_summary(m)])
    assert sum(isinstance(m, UserMessage) for m in stored) == 20  # the store keeps every turn
    sent = provider.requests[-1].messages
    assert is_summary(sent[0]) and sent[0].id == stored[summaries[-1]].id
    assert all(e.tokens_after < e.tokens_before and e.usage.total_tokens > 0 for e in events)
