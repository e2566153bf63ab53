"""Property: any history the runtime can store replays into a valid request of every API.

Histories are generated as the runtime really makes them (one assistant message per
user input, its parts tagged by step; tool results after it in completion order; calls
cut short, waiting for an approval or a client, denied; turns that failed or were
interrupted; user messages steered in between two steps; images and files in user input
and in tool results; stored compaction summaries; reasoning and provider data of every
provider and model), then sent the way the turn runner sends them: the kept repair
(:class:`runtime.history.RepairedHistory`), stored summaries applied and repaired again
as compaction does, then each provider's ``map_messages``, whose output is checked
against the API's structural rules (:mod:`tests.support.wire_rules`) and the SDK's
request types. Nothing the user said or a tool returned may be lost on the way.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Collection
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.providers import anthropic, gemini, openai, openai_responses
from actors.turn.structured import StructuredTurn
from runtime.compaction import apply_summaries
from runtime.history import EMPTY_INPUT, Origin, RepairedHistory, repair
from runtime.messages import (
    AssistantMessage,
    Awaiting,
    File,
    Image,
    Message,
    ProviderDataPart,
    ReasoningPart,
    SystemMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from runtime.output import ErrorInfo
from tests.support import wire_rules

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 24
PDF = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\ntrailer\n<<>>\n%%EOF\n"

ORIGINS = [
    Origin(provider="anthropic", model="claude-a"),
    Origin(provider="anthropic", model="claude-b"),
    Origin(provider="openai", model="gpt-a"),
    Origin(provider="openai-responses", model="o-a"),
    Origin(provider="openai-responses", model="o-b"),
    Origin(provider="google", model="gemini-a"),
]


def tag(origin: Origin) -> str:
    """What a signature (or encrypted content) of ``origin`` says: who may take it."""
    return f"{origin.provider}~{origin.model}"


# -- parts as each provider stores them ----------------------------------------------------

texts = st.one_of(
    st.sampled_from(["", " ", "\n\n", "ok", "héllo wörld ✓", "nul\x00byte", "<think>x</think>"]),
    st.text(max_size=8),
)
# Tool call ids as servers send them: OpenAI, Anthropic, Gemini (own or generated),
# Responses, and compatible servers (Kimi's "functions.name:0", long ones).
call_ids = st.sampled_from(
    [
        "call_abc",
        "toolu_01A",
        "gcall_1a2b_0",
        "functions.lookup:0",
        "call_0",
        "x" * 41,
        "fc_" + "9" * 62,
        "id with space",
    ]
)


@st.composite
def reasoning(draw: st.DrawFn, origin: Origin, step: int) -> list[Any]:
    text = draw(texts)
    kw: dict[str, Any] = {"provider": origin.provider, "model": origin.model, "step": step}
    kind = draw(st.sampled_from(["signed", "unsigned", "redacted", "untagged"]))
    if kind == "untagged":  # <think> tags split from a compatible server's text
        return [ReasoningPart(text=text, step=step)]
    if origin.provider == "anthropic":
        if kind == "redacted":
            return [ReasoningPart(text="", redacted_data="red~" + tag(origin), **kw)]
        sig = "sig~" + tag(origin) if kind == "signed" else None
        return [ReasoningPart(text=text, signature=sig, **kw)]
    if origin.provider == "openai-responses":
        if kind == "unsigned":
            return [ReasoningPart(text=text, **kw)]
        item: dict[str, Any] = {"type": "reasoning", "id": f"rs_{draw(st.integers(0, 9))}"}
        item["summary"] = [{"type": "summary_text", "text": text}] if text else []
        if kind == "signed":
            item["encrypted_content"] = "enc~" + tag(origin)
        following = draw(st.sampled_from([None, {"type": "message", "id": "msg_1"}]))
        return [
            ReasoningPart(
                text=text, signature=openai_responses.encode_reasoning(item, following), **kw
            )
        ]
    if origin.provider == "google":
        sig = base64.b64encode(tag(origin).encode()).decode() if kind == "signed" else None
        return [ReasoningPart(text=text, signature=sig, **kw)]
    return [ReasoningPart(text=text, **kw)]  # Chat Completions reasoning_content


def provider_data(origin: Origin, step: int) -> list[ProviderDataPart]:
    kw: dict[str, Any] = {"provider": origin.provider, "model": origin.model, "step": step}
    if origin.provider == "anthropic":
        return [
            ProviderDataPart(
                data={
                    "type": "server_tool_use",
                    "id": "srvtoolu_1",
                    "name": "web_search",
                    "input": {"query": "q"},
                },
                **kw,
            ),
            ProviderDataPart(
                data={"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
                **kw,
            ),
        ]
    if origin.provider == "openai-responses":
        data = {
            "type": "web_search_call",
            "id": "ws_1",
            "status": "completed",
            "action": {"type": "search", "query": "q"},
        }
        return [ProviderDataPart(data=data, **kw)]
    if origin.provider == "google":
        data = {"executable_code": {"language": "PYTHON", "code": "print(1)"}}
        return [ProviderDataPart(data=data, **kw)]
    return []


media = st.sampled_from(
    [
        Image(data=PNG),
        Image(url="https://example.com/cat.png"),
        File(data=PDF, filename="a.pdf"),
    ]
)
user_contents = st.one_of(
    texts,  # "" and whitespace too: the runtime takes them as input
    st.lists(
        st.one_of(texts.map(lambda t: TextPart(text=t, step=0)), media), min_size=1, max_size=3
    ).map(tuple),  # TextPart("") too: user_content keeps the parts it is given
)
outputs = st.one_of(
    texts,
    st.none(),
    st.dictionaries(st.sampled_from(["a", "b"]), st.one_of(st.integers(), st.floats()), max_size=2),
    st.lists(
        st.one_of(texts.map(lambda t: TextPart(text=t, step=0)), media), min_size=1, max_size=2
    ).map(lambda ps: (*ps, Image(data=PNG))),
)


@st.composite
def step_parts(draw: st.DrawFn, step: int, calls: bool, used: set[str]) -> list[Any]:
    """One step as streamed: reasoning first, then text, server data, then calls."""
    origin = draw(st.sampled_from(ORIGINS))
    parts: list[Any] = []
    if draw(st.booleans()):
        parts += draw(reasoning(origin, step))
    if draw(st.booleans()):
        parts.append(TextPart(text=draw(texts), step=step, refusal=draw(st.booleans())))
    if draw(st.integers(0, 4)) == 0:  # cut short, a server tool's use may lack its result
        parts += provider_data(origin, step)[: draw(st.sampled_from([None, 1]))]
    if calls:
        for _ in range(draw(st.integers(1, 3))):
            call_id = draw(call_ids.filter(lambda c: c not in used))
            used.add(call_id)
            raw = draw(st.sampled_from([{"q": 1}, {}, '{"q": 2}', "{broken", "[1]"]))
            parts.append(
                ToolCallPart(tool_call_id=call_id, tool_name=f"t{len(used)}", input=raw, step=step)
            )
            if origin.provider == "google" and draw(st.booleans()):
                parts.append(
                    ProviderDataPart(
                        provider="google",
                        model=origin.model,
                        step=step,
                        data={
                            "thought_signature": base64.b64encode(tag(origin).encode()).decode(),
                            "of": "function_call",
                        },
                    )
                )
    return parts


def result_for(draw: st.DrawFn, call: ToolCallPart) -> ToolMessage:
    kw = {"tool_call_id": call.tool_call_id, "tool_name": call.tool_name, "step": call.step}
    if draw(st.integers(0, 3)) == 0:
        return ToolMessage(error=draw(st.sampled_from(["denied: no", "boom", "timed out"])), **kw)
    return ToolMessage(output=draw(outputs), **kw)


@st.composite
def assistant_turn(draw: st.DrawFn, current: bool, first_step: int) -> tuple[list[Message], int]:
    """An assistant message and its results. ``current``: the turn a request is made
    in, at a step boundary (every call answered). Else any stored end: complete (the
    last step without calls), interrupted or failed mid-step, waiting for approvals."""
    n = draw(st.integers(0 if current else 1, 3))
    end = "boundary" if current else draw(st.sampled_from(["complete", "cut", "failed", "waiting"]))
    used: set[str] = set()
    parts: list[Any] = []
    calls: list[ToolCallPart] = []
    step = first_step
    for k in range(n):
        last = k == n - 1
        with_calls = not last or end in ("boundary", "cut", "failed", "waiting")
        # compatible servers number calls per response: ids repeat across steps
        step_used: set[str] = set() if draw(st.booleans()) else used
        got = draw(step_parts(step, with_calls, step_used))
        used |= step_used
        if last and end == "waiting":
            got = [
                ToolCallPart(
                    tool_call_id=p.tool_call_id,
                    tool_name=p.tool_name,
                    input=p.input,
                    step=p.step,
                    awaiting=Awaiting(
                        kind=draw(st.sampled_from(["approval", "client"])),
                        id=p.tool_call_id,
                        turn_id="t1",
                    ),
                )
                if isinstance(p, ToolCallPart)
                else p
                for p in got
            ]
        parts += got
        calls += [p for p in got if isinstance(p, ToolCallPart)]
        step += 1
    results: list[ToolMessage] = []
    for call in calls:
        answered = end == "boundary" or call.step < step - 1 or draw(st.booleans())
        if answered:
            results.append(result_for(draw, call))
    results = draw(st.permutations(results))  # parallel calls finish in any order
    msg = AssistantMessage(
        content=tuple(parts),
        interrupted=end == "cut",
        error=ErrorInfo(kind="provider", message="overloaded") if end == "failed" else None,
    )
    return [msg, *results], step


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    out: list[Message] = []
    if draw(st.booleans()):
        out.append(SystemMessage(content=draw(texts)))
    for index in range(draw(st.integers(0, 3)) + 1):
        current = index == -1
        user = UserMessage(content=draw(user_contents))
        out.append(user)
        step = 0
        # steered user messages join a running turn between two steps
        for _ in range(draw(st.integers(0, 1))):
            got, step = draw(assistant_turn(True, step))
            out += got
            out.append(UserMessage(content=draw(user_contents)))
        got, step = draw(assistant_turn(current, step))
        out += got
        if draw(st.integers(0, 5)) == 0:  # a stored compaction summary
            out.append(SystemMessage(content="summary", summarizes_before=user.id))
    # the current turn, at a step boundary
    out.append(UserMessage(content=draw(user_contents)))
    for _ in range(draw(st.integers(0, 1))):
        got, step = draw(assistant_turn(True, 0))
        out += got
        out.append(UserMessage(content=draw(user_contents)))
    got, step = draw(assistant_turn(True, 0))
    feedback: list[tuple[int, str]] = []
    # structured output: answers rejected (a step of text alone), then more steps
    for _ in range(draw(st.integers(0, 2))):
        answer = TextPart(text=draw(texts), step=step)
        feedback.append((step, "not JSON"))
        more, step = draw(assistant_turn(True, step + 1))
        assistant = attrs.evolve(got[0], content=(*got[0].content, answer, *more[0].content))
        got = [assistant, *got[1:], *more[1:]]
    out += got
    return Feedback(out, feedback) if feedback else out


class Feedback(list):  # type: ignore[type-arg]
    """A history whose current turn had structured answers rejected."""

    def __init__(self, messages: list[Message], feedback: list[tuple[int, str]]) -> None:
        super().__init__(messages)
        self.feedback = feedback


def request_messages(history: list[Message]) -> list[Message]:
    """What the turn runner sends: the kept repair; summaries applied, repaired again;
    the retry prompts of a structured answer's rejections put in."""
    messages = repair(apply_summaries(RepairedHistory()(history)))
    if isinstance(history, Feedback):
        turn = SimpleNamespace(
            feedback=history.feedback,
            message_id=history[
                -1 - sum(isinstance(m, ToolMessage) for m in reversed_tail(history))
            ].id,
        )
        messages = list(StructuredTurn.request_messages(turn, messages))  # type: ignore[arg-type]
    return messages


def reversed_tail(history: list[Message]) -> list[Message]:
    """The tool results at the end of ``history`` (after its last assistant message)."""
    tail: list[Message] = []
    for m in reversed(history):
        if not isinstance(m, ToolMessage):
            break
        tail.append(m)
    return tail


# -- what must reach the model ------------------------------------------------------------


def expected_texts(messages: list[Message]) -> list[str]:
    """The user's texts and the tools' text outputs (non-blank), each of which must be
    somewhere in the request."""
    out: list[str] = []
    for m in messages:
        if isinstance(m, UserMessage):
            parts = (
                [m.content]
                if isinstance(m.content, str)
                else [p.text for p in m.content if isinstance(p, TextPart)]
            )
            out += [t for t in parts if t.strip()]
        elif isinstance(m, ToolMessage):
            if m.error is not None:
                out.append(m.error)
            elif isinstance(m.output, str) and m.output.strip():
                out.append(m.output)
            elif isinstance(m.output, tuple):
                out += [p.text for p in m.output if isinstance(p, TextPart) and p.text.strip()]
    return out


def user_media(messages: list[Message]) -> int:
    return sum(len(m.media) for m in messages if isinstance(m, UserMessage))


def dumped(payload: Any) -> str:
    return json.dumps(payload, ensure_ascii=False)


def no_foreign_signatures(payload: Any, target: Origin) -> list[str]:
    """Signed reasoning and server data go only to the origin that made them."""
    own = tag(target)
    errs = []
    text = dumped(payload)
    for other in ORIGINS:
        theirs = tag(other)
        if theirs == own:
            continue
        for marker in (
            f"sig~{theirs}",
            f"red~{theirs}",
            f"enc~{theirs}",
            base64.b64encode(theirs.encode()).decode(),
        ):
            if marker in text:
                errs.append(f"{marker} sent to {own}")
    return errs


foreign_modes = st.sampled_from(["drop", "text"])
SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


MEDIA_MARKS = {
    "anthropic": ('"type": "image"', '"type": "document"'),
    "chat": ('"type": "image_url"', '"type": "file"', "omitted: Chat Completions"),
    "responses": ('"type": "input_image"', '"type": "input_file"'),
    "gemini": ('"inline_data"', '"file_data"', "omitted: function responses"),
}


def media_count(messages: list[Message]) -> int:
    """The images and files of user messages and tool outputs."""
    n = user_media(messages)
    for m in messages:
        if isinstance(m, ToolMessage) and m.error is None and isinstance(m.output, tuple):
            n += sum(isinstance(p, Image | File) for p in m.output)
    return n


def own_signatures(messages: list[Message], target: Origin) -> list[str]:
    """The signatures and redacted data of ``target``'s own reasoning: sent back."""
    out = []
    for m in messages:
        if not isinstance(m, AssistantMessage):
            continue
        for p in m.content:
            if isinstance(p, ReasoningPart) and p.provider == target.provider == "anthropic":
                if p.model == target.model and (p.signature or p.redacted_data):
                    out.append(p.signature or p.redacted_data)
            elif isinstance(p, ReasoningPart | ProviderDataPart) and target.provider == "google":
                sig = (
                    p.signature if isinstance(p, ReasoningPart) else p.data.get("thought_signature")
                )
                if p.provider == "google" and p.model == target.model and sig:
                    out.append(sig)
    return out


def trailing_thinking(messages: list[Message]) -> set[str]:
    """Signatures of Anthropic reasoning with no call or text after it in its step: the
    API refuses a message ending with thinking, so it stays home."""
    out = set()
    for m in messages:
        if not isinstance(m, AssistantMessage):
            continue
        for i, p in enumerate(m.content):
            later = [q for q in m.content[i + 1 :] if q.step == p.step]
            if isinstance(p, ReasoningPart) and not any(
                isinstance(q, ToolCallPart) or (isinstance(q, TextPart) and q.text.strip())
                for q in later
            ):
                out.add(p.signature or p.redacted_data or "")
    return out


def check(
    kind: str,
    payload: list[dict[str, Any]],
    errs: list[str],
    messages: list[Message],
    target: Origin,
    *,
    dropped: Collection[str] = (),
) -> None:
    """``dropped``: own signatures the provider leaves out on purpose (the thinking of a
    tool loop it continues with thinking off)."""
    errs = errs + wire_rules.sdk_errors(kind, payload) + no_foreign_signatures(payload, target)
    if kind == "anthropic":
        dropped = {*dropped, *trailing_thinking(messages)}
    try:  # the body is JSON: no NaN or Infinity, which no API's parser takes
        json.dumps(payload, allow_nan=False)
    except ValueError as exc:
        errs.append(f"not JSON: {exc}")
    text = dumped(payload)
    found = sum(text.count(mark) for mark in MEDIA_MARKS[kind])
    if found < media_count(messages):
        errs.append(f"lost media: {found} of {media_count(messages)} sent")
    for sig in own_signatures(messages, target):
        if sig not in text and sig not in dropped:
            errs.append(f"own reasoning dropped: {sig}")
    for expected in expected_texts(messages):
        if dumped(expected)[1:-1] not in text:
            errs.append(f"lost: {expected!r}")
    assert not errs, errs


@SETTINGS
@given(history=histories(), target=st.sampled_from(ORIGINS[:2]), foreign=foreign_modes)
def test_anthropic_takes_any_history(history, target, foreign):
    messages = request_messages(history)
    _system, payload = anthropic.map_messages(
        "be brief", messages, origin=target, foreign_reasoning=foreign
    )
    thinking = anthropic.thinking_allowed(payload)  # a provider with a thinking budget
    errs = wire_rules.anthropic_errors(payload, thinking=thinking or None)
    # and one with thinking off (or a budget whose loop began without it)
    errs += wire_rules.anthropic_errors(anthropic.without_loop_thinking(payload), thinking=False)
    check("anthropic", payload, errs, messages, target)


@SETTINGS
@given(history=histories(), foreign=foreign_modes)
def test_chat_completions_takes_any_history(history, foreign):
    target = ORIGINS[2]
    messages = request_messages(history)
    payload = openai.map_messages(
        "be brief",
        messages,
        origin=target,
        send_reasoning_content=True,
        foreign_reasoning=foreign,
    )
    check("chat", payload, wire_rules.chat_errors(payload), messages, target)


@SETTINGS
@given(history=histories(), target=st.sampled_from(ORIGINS[3:5]), foreign=foreign_modes)
def test_responses_takes_any_history(history, target, foreign):
    messages = request_messages(history)
    payload = openai_responses.map_messages(messages, origin=target, foreign_reasoning=foreign)
    check("responses", payload, wire_rules.responses_errors(payload), messages, target)


@SETTINGS
@given(history=histories(), sentinel=st.booleans(), foreign=foreign_modes)
def test_gemini_takes_any_history(history, sentinel, foreign):
    target = ORIGINS[5]
    messages = request_messages(history)
    _system, payload = gemini.map_messages(
        "be brief", messages, origin=target, sentinel=sentinel, foreign_reasoning=foreign
    )
    check("gemini", payload, wire_rules.gemini_errors(payload), messages, target)


# -- the defects the property found, each with the history it shrank to ---------------------


def call(call_id: str, step: int = 0, name: str = "t1") -> ToolCallPart:
    return ToolCallPart(tool_call_id=call_id, tool_name=name, input={}, step=step)


def answer(call_id: str, step: int, output: str) -> ToolMessage:
    return ToolMessage(tool_call_id=call_id, tool_name="t1", step=step, output=output)


# A compatible server numbering calls per response: "call_0" in step 0 and in step 1.
REPEATED = [
    UserMessage(content="go"),
    AssistantMessage(content=(call("call_0", 0), call("call_0", 1))),
    answer("call_0", 0, "first"),
    answer("call_0", 1, "second"),
]


def test_an_id_repeated_in_two_steps_keeps_each_steps_result():
    repaired = repair(REPEATED)
    assert [m.output for m in repaired if isinstance(m, ToolMessage)] == ["first", "second"]
    payload = openai.map_messages(None, repaired)
    assert [m["content"] for m in payload if m["role"] == "tool"] == ["first", "second"]
    assert chat_errors_of(payload) == []


def test_an_id_repeated_in_two_steps_keeps_its_results_across_a_rejected_answer():
    history = [
        UserMessage(content="go"),
        AssistantMessage(
            content=(call("call_0", 0), TextPart(text="nope", step=1), call("call_0", 2))
        ),
        answer("call_0", 0, "first"),
        answer("call_0", 2, "second"),
    ]
    turn = SimpleNamespace(feedback=[(1, "not JSON")], message_id=history[1].id)
    sent = StructuredTurn.request_messages(turn, repair(history))  # type: ignore[arg-type]
    _system, payload = gemini.map_messages(None, sent)
    responses = [
        p["function_response"]["response"]["output"]
        for c in payload
        for p in c["parts"]
        if "function_response" in p
    ]
    assert responses == ["first", "second"]


def chat_errors_of(payload: list[dict[str, Any]]) -> list[str]:
    return wire_rules.chat_errors(payload) + wire_rules.sdk_errors("chat", payload)


def test_an_id_anthropic_refuses_is_rewritten_in_the_call_and_its_result():
    history = [
        UserMessage(content="go"),
        AssistantMessage(content=(call("functions.lookup:0"), call("functions.lookup;0"))),
        answer("functions.lookup:0", 0, "a"),
        answer("functions.lookup;0", 0, "b"),
    ]
    _system, payload = anthropic.map_messages(None, repair(history))
    assert wire_rules.anthropic_errors(payload) == []
    uses = [b["id"] for b in payload[1]["content"]]
    results = [b["tool_use_id"] for b in payload[2]["content"]]
    assert uses == results and len(set(uses)) == 2  # still two calls, each paired
    assert anthropic.tool_id("toolu_01A") == "toolu_01A"  # a valid id is left alone


@pytest.mark.parametrize(
    ("module", "limit"), [(openai, 40), (openai_responses, 64)], ids=["chat", "responses"]
)
def test_an_id_longer_than_the_api_takes_is_shortened_in_the_call_and_its_result(module, limit):
    long_id = "x" * (limit + 1)
    history = [
        UserMessage(content="go"),
        AssistantMessage(content=(call(long_id), call("call_abc"))),
        answer(long_id, 0, "a"),
        answer("call_abc", 0, "b"),
    ]
    if module is openai:
        payload = openai.map_messages(None, repair(history))
        ids = [c["id"] for c in payload[1]["tool_calls"]]
        answered = [m["tool_call_id"] for m in payload[2:]]
        assert chat_errors_of(payload) == []
    else:
        payload = openai_responses.map_messages(repair(history))
        ids = [i["call_id"] for i in payload if i.get("type") == "function_call"]
        answered = [i["call_id"] for i in payload if i.get("type") == "function_call_output"]
        assert wire_rules.responses_errors(payload) == []
    assert ids == answered and ids[1] == "call_abc"
    assert max(map(len, ids)) <= limit


BLANK = ["", "  ", (TextPart(text=" ", step=0),), (TextPart(text="", step=0),)]


@pytest.mark.parametrize("content", BLANK)
def test_a_blank_user_message_is_sent_as_the_placeholder(content):
    history = [UserMessage(content="hi"), AssistantMessage(content=(TextPart(text="yes", step=0),))]
    history.append(UserMessage(content=content))  # the runtime takes "" as input
    _system, claude = anthropic.map_messages(None, history)
    assert wire_rules.anthropic_errors(claude) == []
    assert claude[-1] == {"role": "user", "content": EMPTY_INPUT}
    _system, contents = gemini.map_messages(None, history)
    assert wire_rules.gemini_errors(contents) == []
    assert contents[-1]["role"] == "user"


def test_a_tool_output_holding_nan_reaches_gemini_as_json():
    history = [
        UserMessage(content="go"),
        AssistantMessage(content=(call("c1"),)),
        ToolMessage(tool_call_id="c1", tool_name="t1", step=0, output={"a": float("nan")}),
    ]
    _system, contents = gemini.map_messages(None, history)
    json.dumps(contents, allow_nan=False)  # raised ValueError before
    assert contents[-1]["parts"][0]["function_response"]["response"] == {"output": {"a": "NaN"}}


@pytest.mark.parametrize("content", BLANK)
def test_a_blank_user_message_is_never_an_empty_array_for_openai(content):
    history = [UserMessage(content=content)]  # user_content keeps a TextPart("") given
    chat = openai.map_messages(None, history)
    assert chat_errors_of(chat) == []
    assert chat[-1]["content"] != []
    items = openai_responses.map_messages(history)
    assert wire_rules.responses_errors(items) == [] and items[-1]["content"] != []


def thinking_step(model: str) -> list[Message]:
    """A tool loop whose step ``model`` made, with its signed thinking first."""
    thought = ReasoningPart(text="hmm", signature="sig", provider="anthropic", model=model, step=0)
    return [
        UserMessage(content="go"),
        AssistantMessage(content=(thought, call("toolu_1"))),
        answer("toolu_1", 0, "a"),
    ]


@pytest.mark.parametrize(("made_by", "thinks"), [("claude-a", True), ("claude-b", False)])
async def test_thinking_is_off_for_a_call_continuing_another_models_tool_loop(made_by, thinks):
    from tests.support.provider_calls import make_request

    provider = anthropic.AnthropicProvider("claude-a", api_key="k", thinking_budget=1024)
    params = provider.request_params(make_request(tuple(thinking_step(made_by))))
    errs = wire_rules.anthropic_errors(params["messages"], thinking="thinking" in params)
    assert errs == []
    assert ("thinking" in params) is thinks  # on again once its own thinking is there


def test_a_server_tool_use_cut_before_its_result_is_not_sent_to_anthropic():
    use = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
    history = [
        UserMessage(content="search"),
        AssistantMessage(
            content=(ProviderDataPart(provider="anthropic", data=use, step=0),),
            interrupted=True,  # cancelled while the server searched
        ),
        UserMessage(content="never mind"),
    ]
    _system, payload = anthropic.map_messages(None, history)
    assert wire_rules.anthropic_errors(payload) == []
    assert "server_tool_use" not in json.dumps(payload)
