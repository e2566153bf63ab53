"""A Responses ``custom_tool_call`` (a custom tool passed through ``request_options``):
kept, never run, and answered in the next request so the API takes it. The events are
checked against the SDK's ``ResponseStreamEvent`` union, the next request's input items
against its ``ResponseInputParam``."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from actors.providers import openai_responses
from actors.providers.openai_responses import PROVIDER
from runtime.chunks import ProviderDataChunk
from runtime.messages import AssistantMessage, ProviderDataPart, UserMessage
from tests.support import wire_rules
from tests.support.loopback import Reply
from tests.test_provider_openai_responses import (
    added,
    body,
    completed,
    created,
    done,
    make_request,
    run,
)

GRAMMAR_TOOL = {"type": "custom", "name": "code_exec", "description": "Runs Python."}
CALL = {
    "type": "custom_tool_call",
    "id": "ctc_01",
    "call_id": "call_custom_1",
    "name": "code_exec",
    "input": "print(6 * 7)",
    "status": "completed",
}


def custom_call_events() -> list[dict[str, Any]]:
    head = {k: v for k, v in CALL.items() if k != "status"}
    return [
        created(),
        added(0, {**head, "input": ""}),
        {
            "type": "response.custom_tool_call_input.delta",
            "item_id": "ctc_01",
            "output_index": 0,
            "delta": "print(6 * 7)",
        },
        done(0, CALL),
        completed(),
    ]


def test_the_custom_call_events_are_ones_the_sdk_knows():
    from openai.types.responses import ResponseStreamEvent

    adapter = TypeAdapter(ResponseStreamEvent)
    items = custom_call_events()[1:-1]  # the call's own events (not the inline envelope)
    for n, event in enumerate(items):
        typed = adapter.validate_python({**event, "sequence_number": n})
        assert typed.type == event["type"]
    assert len(items) == 3


async def test_a_custom_tool_call_is_answered_as_not_run_in_the_next_request():
    options = {"tools": [GRAMMAR_TOOL]}
    first = await run(Reply(body=body(*custom_call_events())), **options)
    assert first.error is None and first.calls == []  # no Axon tool runs its text
    (kept,) = first.of(ProviderDataChunk)
    history = (
        UserMessage(content="compute 6*7"),
        AssistantMessage(content=(ProviderDataPart(provider=PROVIDER, data=kept.data, step=0),)),
        UserMessage(content="and?"),
    )
    second = await run(
        Reply(body=body(created(), completed())), request=make_request(history), **options
    )
    items = second.body()["input"]
    assert [i.get("type", "message") for i in items] == [
        "message",
        "custom_tool_call",
        "custom_tool_call_output",
        "message",
    ]
    assert items[2] == {
        "type": "custom_tool_call_output",
        "call_id": "call_custom_1",
        "output": openai_responses.CUSTOM_TOOL_NOT_RUN,
    }
    assert wire_rules.responses_errors(items) == []
    assert wire_rules.sdk_errors("responses", items) == []


async def test_a_custom_tool_call_already_answered_gets_no_second_output():
    output = {"type": "custom_tool_call_output", "call_id": "call_custom_1", "output": "42"}
    history = (
        UserMessage(content="compute 6*7"),
        AssistantMessage(
            content=(
                ProviderDataPart(provider=PROVIDER, data=CALL, step=0),
                ProviderDataPart(provider=PROVIDER, data=output, step=0),
            )
        ),
    )
    call = await run(Reply(body=body(created(), completed())), request=make_request(history))
    items = call.body()["input"]
    assert [i for i in items if i.get("type") == "custom_tool_call_output"] == [output]
