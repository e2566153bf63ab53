"""Property: a history a hostile model or a careless client left replays into a valid request.

:mod:`tests.test_replay_property` draws the histories the runtime makes; here they are
bent the ways nothing in the runtime stops: tool calls named as a model invented them
(``repo_browser.open_file``, ``functions.lookup``, ``""``, a space, 200 characters,
letters no API takes) or as a client's history (the OpenAI-compatible and AG-UI
endpoints) holds them, ids no API takes (``""``, 300 characters, ``/`` and ``:``), a
client's history opened by the assistant's greeting, a model's text ending in half a
character (a surrogate a server's escape left),
error results with no message (an exception raised without one, a client tool's
``error: ""``), and user text of a few hundred kilobytes. Each history goes to each API
twice: through ``map_messages``, checked against its rules (:mod:`tests.support.wire_rules`),
and through the provider's real SDK client to the loopback server, so that what is
checked is the body the SDK wrote. Nothing the user said or a tool returned may be
lost on the way (:func:`tests.test_replay_property.check`).
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.providers import anthropic, gemini, openai, openai_responses
from runtime.history import EMPTY_INPUT, repair
from runtime.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from tests.support import wire_rules
from tests.support.attacks import gemini_chunk, gemini_sse, responses_message
from tests.support.faults import a_text_answer, oa_text, resolve_platform
from tests.support.loopback import Reply, loopback_server, responses_sse
from tests.support.provider_calls import make_request
from tests.test_replay_property import ORIGINS, Feedback, check, histories, request_messages

HOSTILE_NAMES = [
    "",
    " ",
    "repo_browser.open_file",  # gpt-oss's invented tool
    "functions.lookup",  # Kimi's id prefix taken for a name
    "assistant<|channel|>commentary",  # a chat template's tokens leaked into the name
    "name with space",
    "x:y",
    "1starts_with_a_digit",
    "ünïcödé",
    "a" * 65,
    "b" * 200,
]
HOSTILE_IDS = ["", "c" * 300, "id/with/slash", "üñí", "a.b", "a:b", "call 1"]
HUGE = "lorem ipsum " * 20_000  # 240 KB of user text


@st.composite
def hostile_histories(draw: st.DrawFn) -> list[Message]:
    """A history of :func:`~tests.test_replay_property.histories` with some tool names
    and ids replaced (the same way in a call and its results), some error results made
    blank, maybe a huge user text, maybe an assistant's greeting first, and the model's
    text maybe ending in half a character."""
    history = draw(histories())
    names: dict[str, str] = {}
    ids: dict[str, str] = {}

    def name_of(name: str) -> str:
        if name not in names:
            names[name] = draw(st.sampled_from(HOSTILE_NAMES)) if draw(st.booleans()) else name
        return names[name]

    def id_of(call_id: str) -> str:
        if call_id not in ids:
            new = draw(st.sampled_from(HOSTILE_IDS)) if draw(st.integers(0, 2)) == 0 else call_id
            ids[call_id] = call_id if new in ids.values() else new  # ids stay unique
        return ids[call_id]

    out: list[Message] = []
    if draw(st.integers(0, 3)) == 0:  # a chat UI's greeting opens a client's history
        at = 1 if isinstance(history[0], SystemMessage) else 0
        greeting = AssistantMessage(content=(TextPart(text="Hi! How can I help?", step=0),))
        copy = [*history[:at], greeting, *history[at:]]
        history = Feedback(copy, history.feedback) if isinstance(history, Feedback) else copy
    for m in history:
        if isinstance(m, AssistantMessage):
            half = draw(st.sampled_from(["", "", "\ud83d", "\udc80"]))  # half a character
            content = tuple(
                attrs.evolve(p, tool_name=name_of(p.tool_name), tool_call_id=id_of(p.tool_call_id))
                if isinstance(p, ToolCallPart)
                else attrs.evolve(p, text=p.text + half)
                if isinstance(p, TextPart) and p.text.strip()
                else p
                for p in m.content
            )
            m = attrs.evolve(m, content=content)
        elif isinstance(m, ToolMessage):
            error = m.error
            if error is not None and draw(st.integers(0, 2)) == 0:
                error = draw(st.sampled_from(["", " "]))
            m = attrs.evolve(
                m,
                tool_name=name_of(m.tool_name),
                tool_call_id=id_of(m.tool_call_id),
                error=error,
            )
        elif isinstance(m, UserMessage) and draw(st.integers(0, 9)) == 0:
            m = attrs.evolve(m, content=HUGE)
        out.append(m)
    return Feedback(out, history.feedback) if isinstance(history, Feedback) else out


SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
foreign_modes = st.sampled_from(["drop", "text"])


# -- map_messages, checked against each API's rules ---------------------------------------


@SETTINGS
@given(history=hostile_histories(), target=st.sampled_from(ORIGINS[:2]), foreign=foreign_modes)
def test_anthropic_takes_any_hostile_history(history, target, foreign):
    messages = request_messages(history)
    _system, payload = anthropic.map_messages(
        "be brief", messages, origin=target, foreign_reasoning=foreign
    )
    errs = wire_rules.anthropic_errors(
        payload, thinking=anthropic.thinking_allowed(payload) or None
    )
    errs += wire_rules.anthropic_errors(anthropic.without_loop_thinking(payload), thinking=False)
    check("anthropic", payload, errs, messages, target)


@SETTINGS
@given(history=hostile_histories(), foreign=foreign_modes)
def test_chat_completions_takes_any_hostile_history(history, foreign):
    target = ORIGINS[2]
    messages = request_messages(history)
    payload = openai.map_messages(
        "be brief", messages, origin=target, send_reasoning_content=True, foreign_reasoning=foreign
    )
    check("chat", payload, wire_rules.chat_errors(payload), messages, target)


@SETTINGS
@given(history=hostile_histories(), target=st.sampled_from(ORIGINS[3:5]), foreign=foreign_modes)
def test_responses_takes_any_hostile_history(history, target, foreign):
    messages = request_messages(history)
    payload = openai_responses.map_messages(messages, origin=target, foreign_reasoning=foreign)
    check("responses", payload, wire_rules.responses_errors(payload), messages, target)


@SETTINGS
@given(history=hostile_histories(), sentinel=st.booleans(), foreign=foreign_modes)
def test_gemini_takes_any_hostile_history(history, sentinel, foreign):
    target = ORIGINS[5]
    messages = request_messages(history)
    _system, payload = gemini.map_messages(
        "be brief", messages, origin=target, sentinel=sentinel, foreign_reasoning=foreign
    )
    check("gemini", payload, wire_rules.gemini_errors(payload), messages, target)


# -- the same histories through each SDK client, as the server receives them --------------

# Each provider is made for the model of one of the strategy's origins, so that its own
# signed reasoning goes back (and must be found in the body) and the rest is foreign.
SDK_TARGETS = {
    "anthropic": ("claude-a", ORIGINS[0]),
    "openai": ("gpt-a", ORIGINS[2]),
    "responses": ("o-a", ORIGINS[3]),
    "gemini": ("gemini-a", ORIGINS[5]),
}
WIRE = {"anthropic": "anthropic", "openai": "chat", "responses": "responses", "gemini": "gemini"}


def answer(kind: str) -> bytes:
    """A one-word text answer in ``kind``'s wire format."""
    if kind == "openai":
        return oa_text("ok")
    if kind == "anthropic":
        return a_text_answer("ok")
    if kind == "responses":
        return responses_sse("o-a", 1, responses_message(0, "msg_1", "ok"))
    return gemini_sse(gemini_chunk([{"text": "ok"}], "STOP"))


_CAPITAL = re.compile(r"(?<=[a-z0-9])([A-Z])")


def snake(value: Any) -> Any:
    """Gemini's wire JSON (``functionCall``) with the keys the mapping writes
    (``function_call``), which the rules and the checks read."""
    if isinstance(value, dict):
        return {_CAPITAL.sub(r"_\1", k).lower(): snake(v) for k, v in value.items()}
    if isinstance(value, list):
        return [snake(v) for v in value]
    return value


async def sent_body(kind: str, messages: list[Message]) -> dict[str, Any]:
    """The JSON body the provider's SDK client sent for one call with ``messages``."""
    model, _origin = SDK_TARGETS[kind]
    async with loopback_server(Reply(body=answer(kind))) as server:
        provider = provider_class(kind)(model, base_url=provider_url(kind, server.url), api_key="k")
        if kind != "gemini":
            resolve_platform(provider)
        try:
            with trio.fail_after(30):
                await provider.stream(make_request(tuple(messages)), _ignore)
        finally:
            await provider.aclose()
        return server.requests[-1].json()


def provider_class(kind: str) -> type:
    from actors.providers import (
        AnthropicProvider,
        GeminiProvider,
        OpenAIProvider,
        OpenAIResponsesProvider,
    )

    return {
        "anthropic": AnthropicProvider,
        "openai": OpenAIProvider,
        "responses": OpenAIResponsesProvider,
        "gemini": GeminiProvider,
    }[kind]


def provider_url(kind: str, url: str) -> str:
    return url + "/v1" if kind in ("openai", "responses") else url


async def _ignore(chunk: Any) -> None:
    return None


def wire_payload(kind: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The history part of ``body``: ``messages``, ``input`` or ``contents``."""
    if kind == "responses":
        return body["input"]
    if kind == "gemini":
        return snake(body["contents"])
    return body["messages"]


def wire_errors(kind: str, payload: list[dict[str, Any]]) -> list[str]:
    if kind == "anthropic":
        return wire_rules.anthropic_errors(payload)
    if kind == "openai":
        return wire_rules.chat_errors(payload)
    if kind == "responses":
        return wire_rules.responses_errors(payload)
    return wire_rules.gemini_errors(payload)


SDK_SETTINGS = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def through_the_sdk(kind: str, history: list[Message]) -> None:
    messages = request_messages(history)
    body = trio.run(sent_body, kind, messages)
    payload = wire_payload(kind, body)
    if kind == "anthropic":  # a provider without thinking: a loop's thinking stays home
        errs = wire_rules.anthropic_errors(payload, thinking="thinking" in body)
        check("anthropic", payload, errs, messages, ORIGINS[0], dropped=loop_thinking(messages))
        return
    check(WIRE[kind], payload, wire_errors(kind, payload), messages, SDK_TARGETS[kind][1])


def loop_thinking(messages: list[Message]) -> set[str]:
    """The signatures and redacted data of the thinking in the tool loop ``messages``
    continue (as mapped for ``ORIGINS[0]``)."""
    _system, mapped = anthropic.map_messages(None, messages, origin=ORIGINS[0])
    start = anthropic.tool_loop_start(mapped)
    return {
        b.get("signature") or b.get("data")
        for m in (mapped[start:] if start is not None else [])
        for b in (m["content"] if isinstance(m["content"], list) else [])
        if b.get("type") in ("thinking", "redacted_thinking")
    }


@SDK_SETTINGS
@given(history=hostile_histories())
def test_anthropic_sdk_sends_any_hostile_history_valid(history):
    through_the_sdk("anthropic", history)


@SDK_SETTINGS
@given(history=hostile_histories())
def test_chat_completions_sdk_sends_any_hostile_history_valid(history):
    through_the_sdk("openai", history)


@SDK_SETTINGS
@given(history=hostile_histories())
def test_responses_sdk_sends_any_hostile_history_valid(history):
    through_the_sdk("responses", history)


@SDK_SETTINGS
@given(history=hostile_histories())
def test_gemini_sdk_sends_any_hostile_history_valid(history):
    through_the_sdk("gemini", history)


# -- the defects the properties found, each with the history it shrank to -------------------


def invented_call(name: str, call_id: str = "call_1") -> list[Message]:
    """A model's call of a tool it invented, answered by the executor's error."""
    return [
        UserMessage(content="open the file"),
        AssistantMessage(
            content=(ToolCallPart(tool_call_id=call_id, tool_name=name, input={}, step=0),)
        ),
        ToolMessage(
            tool_call_id=call_id,
            tool_name=name,
            step=0,
            error=f"unknown tool {name!r}; available tools: read",
        ),
        UserMessage(content="use read"),
    ]


INVENTED = ["repo_browser.open_file", "", "assistant<|channel|>commentary", "a" * 65]


def test_an_invented_tool_name_is_sent_to_chat_completions_as_its_pattern_takes_it():
    for name in INVENTED:
        payload = openai.map_messages(None, repair(invented_call(name)))
        assert wire_rules.chat_errors(payload) == [], name
        sent = payload[1]["tool_calls"][0]["function"]["name"]
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", sent), sent
        assert name in json.loads(json.dumps(payload[2]["content"]))  # the error names it


def test_an_invented_tool_name_is_sent_to_responses_as_its_pattern_takes_it():
    for name in INVENTED:
        items = openai_responses.map_messages(repair(invented_call(name)))
        assert wire_rules.responses_errors(items) == [], name
        assert items[1]["name"] == openai.tool_name(name)


def test_an_invented_tool_name_is_sent_to_anthropic_as_its_pattern_takes_it():
    for name in INVENTED:
        _system, payload = anthropic.map_messages(None, repair(invented_call(name)))
        assert wire_rules.anthropic_errors(payload) == [], name
        assert payload[1]["content"][0]["name"] == anthropic.tool_name(name)


def test_an_invented_tool_name_is_the_same_valid_name_in_gemini_s_call_and_response():
    for name in INVENTED:
        _system, contents = gemini.map_messages(None, repair(invented_call(name)))
        assert wire_rules.gemini_errors(contents) == [], name
        called = contents[1]["parts"][0]["function_call"]["name"]
        answered = contents[2]["parts"][0]["function_response"]["name"]
        assert called == answered == gemini.tool_name(name)


def test_a_valid_tool_name_is_sent_as_it_is():
    for fitted in (openai.tool_name, anthropic.tool_name, gemini.tool_name):
        assert fitted("read_file-2") == "read_file-2"
    assert gemini.tool_name("fs.read:v1") == "fs.read:v1"  # Gemini takes dots and colons
    assert gemini.tool_name("2fs") == "_2fs"  # but a letter or _ first


def test_an_empty_call_id_is_replaced_in_the_chat_completions_call_and_its_result():
    chat = openai.map_messages(None, repair(invented_call("read", call_id="")))
    assert wire_rules.chat_errors(chat) == []
    assert chat[1]["tool_calls"][0]["id"] == chat[2]["tool_call_id"] != ""


def test_an_empty_call_id_is_replaced_in_the_responses_call_and_its_output():
    items = openai_responses.map_messages(repair(invented_call("read", call_id="")))
    assert wire_rules.responses_errors(items) == []
    assert items[1]["call_id"] == items[2]["call_id"] != ""


def test_an_error_result_without_a_message_is_sent_to_anthropic_with_one():
    history = [
        UserMessage(content="go"),
        AssistantMessage(
            content=(ToolCallPart(tool_call_id="toolu_1", tool_name="t", input={}, step=0),)
        ),
        ToolMessage(tool_call_id="toolu_1", tool_name="t", step=0, error=""),  # a client's
    ]
    _system, payload = anthropic.map_messages(None, history)
    assert wire_rules.anthropic_errors(payload) == []
    result = payload[2]["content"][0]
    assert result["is_error"] is True and result["content"] == anthropic.BLANK_ERROR


# -- a client's history (the OpenAI-compatible and AG-UI endpoints) --------------------------


def chat_call(call_id: str, name: str = "read") -> dict[str, Any]:
    """A tool call as both endpoints take it (AG-UI's ``toolCalls`` are OpenAI's)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def chat_body(*messages: dict[str, Any]) -> dict[str, Any]:
    return {"model": "agent", "messages": [*messages, {"role": "user", "content": "go on"}]}


def test_a_client_chat_history_with_one_id_on_two_calls_of_a_message_is_refused():
    from runtime.app.web.openai_wire import OpenAIError, parse_chat_request

    body = chat_body(
        {"role": "user", "content": "read both"},
        {"role": "assistant", "tool_calls": [chat_call("c", "a"), chat_call("c", "b")]},
        {"role": "tool", "tool_call_id": "c", "content": "first"},
        {"role": "tool", "tool_call_id": "c", "content": "second"},  # was lost
    )
    with pytest.raises(OpenAIError) as caught:
        parse_chat_request(body)
    assert (caught.value.status, caught.value.param) == (400, "messages[1].tool_calls[1]")


def test_a_client_chat_tool_result_after_a_user_message_is_refused():
    from runtime.app.web.openai_wire import OpenAIError, parse_chat_request

    body = chat_body(
        {"role": "user", "content": "read it"},
        {"role": "assistant", "tool_calls": [chat_call("c")]},
        {"role": "user", "content": "and then?"},
        {"role": "tool", "tool_call_id": "c", "content": "the file"},  # was lost
    )
    with pytest.raises(OpenAIError) as caught:
        parse_chat_request(body)
    assert (caught.value.status, caught.value.param) == (400, "messages[3].tool_call_id")


def test_an_agui_history_with_one_id_on_two_calls_of_a_message_is_refused():
    from runtime.app.web.agui_input import AGUIError, history_of

    messages = [
        {"id": "m1", "role": "user", "content": "read both"},
        {"id": "m2", "role": "assistant", "toolCalls": [chat_call("c", "a"), chat_call("c")]},
        {"id": "m3", "role": "tool", "toolCallId": "c", "content": "first"},
        {"id": "m4", "role": "tool", "toolCallId": "c", "content": "second"},  # was lost
    ]
    with pytest.raises(AGUIError) as caught:
        history_of(messages)
    assert caught.value.status == 400 and "messages[1].toolCalls[1].id" in caught.value.message


def test_an_agui_tool_result_after_a_user_message_is_refused():
    from runtime.app.web.agui_input import AGUIError, history_of

    messages = [
        {"id": "m1", "role": "user", "content": "read it"},
        {"id": "m2", "role": "assistant", "toolCalls": [chat_call("c")]},
        {"id": "m3", "role": "user", "content": "and then?"},
        {"id": "m4", "role": "tool", "toolCallId": "c", "content": "the file"},  # was lost
    ]
    with pytest.raises(AGUIError) as caught:
        history_of(messages)
    assert caught.value.status == 400 and "messages[3].toolCallId" in caught.value.message


GREETED = [
    AssistantMessage(content=(TextPart(text="Hi! How can I help?", step=0),)),
    UserMessage(content="what is 2+2?"),
]
"""A client's history opened by its chat UI's greeting (the AG-UI and OpenAI endpoints
take it as the thread's start)."""


def test_a_history_opened_by_the_assistant_starts_with_a_user_message_for_anthropic():
    _system, payload = anthropic.map_messages(None, GREETED)
    assert wire_rules.anthropic_errors(payload) == []
    assert payload[0] == {"role": "user", "content": EMPTY_INPUT}
    assert payload[1]["content"] == [{"type": "text", "text": "Hi! How can I help?"}]


def test_a_history_opened_by_the_model_starts_with_a_user_content_for_gemini():
    _system, contents = gemini.map_messages(None, GREETED)
    assert wire_rules.gemini_errors(contents) == []
    assert contents[0] == {"role": "user", "parts": [{"text": EMPTY_INPUT}]}
    assert contents[1]["parts"] == [{"text": "Hi! How can I help?"}]


JOINED_HALVES = "a" + "\ud83d" + "\ude00" + "b"
"""A model's text whose emoji a server sent as two escapes in two deltas: joined, the two
halves of the pair side by side, which UTF-8 cannot write."""


@pytest.mark.parametrize("kind", ["openai", "responses", "anthropic"])
def test_a_text_holding_halves_of_characters_is_sent_as_valid_text(kind):
    history = [
        UserMessage(content="hi"),
        AssistantMessage(
            content=(TextPart(text=JOINED_HALVES, step=0), TextPart(text=" x\udc80", step=0))
        ),
        UserMessage(content="next"),
    ]
    body = trio.run(sent_body, kind, history)  # raised ProviderError (UnicodeEncodeError)
    text = json.dumps(wire_payload(kind, body), ensure_ascii=False)
    assert "a😀b" in text and "x\ufffd" in text
