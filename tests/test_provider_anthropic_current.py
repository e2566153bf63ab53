"""The Anthropic provider and what the newest SDK (anthropic 2.17) and API bring: adaptive
thinking, citations, the ``compaction`` stop reason. Through the real ``AsyncAnthropic``
client and a loopback server, the events and request bodies checked against the SDK's
own types."""

from __future__ import annotations

import warnings
from typing import Any

from pydantic import TypeAdapter

from actors.providers import anthropic as anthropic_provider
from actors.providers.anthropic import AnthropicProvider, map_messages
from runtime.chunks import FinishChunk
from runtime.messages import AssistantMessage, ToolCallPart, ToolMessage, UserMessage
from tests.support.loopback import Reply, anthropic_sse, loopback_server
from tests.support.provider_calls import make_request, replay_with

KEY = "sk-ant-test-not-a-real-key"
ADAPTIVE_MODEL = "claude-opus-4-6"


def message_start(model: str) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_01Current",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        },
    }


def answer(
    *events: dict[str, Any], stop_reason: str = "end_turn", model: str = ADAPTIVE_MODEL
) -> Reply:
    """A whole message: ``events`` (a text block "ok" when none) and its stop."""
    if not events:
        events = (
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "ok"},
            },
            {"type": "content_block_stop", "index": 0},
        )
    tail = [
        {"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": {}},
        {"type": "message_stop"},
    ]
    return Reply(body=anthropic_sse(message_start(model), *events, *tail))


# -- adaptive thinking --------------------------------------------------------------------


async def test_a_model_the_sdk_wants_adaptive_thinks_adaptively_with_no_warning():
    from anthropic.types import ThinkingConfigParam

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = await replay_with(
            lambda url: AnthropicProvider(
                ADAPTIVE_MODEL, base_url=url, api_key=KEY, thinking_budget=2048
            ),
            answer(),
        )
    assert [w for w in caught if issubclass(w.category, UserWarning)] == []
    assert run.body["thinking"] == {"type": "adaptive"}
    TypeAdapter(ThinkingConfigParam).validate_python(run.body["thinking"], strict=True)
    assert "anthropic-beta" not in run.server.requests[-1].headers


def test_every_model_the_sdk_warns_for_thinks_adaptively_by_default():
    from anthropic._data import MODELS_TO_WARN_WITH_THINKING_ENABLED

    assert len(MODELS_TO_WARN_WITH_THINKING_ENABLED) == 2
    for model in MODELS_TO_WARN_WITH_THINKING_ENABLED:
        assert anthropic_provider.wants_adaptive(model)
        provider = AnthropicProvider(model, api_key=KEY, thinking_budget=2048)
        assert provider.request_params(make_request())["thinking"] == {"type": "adaptive"}


def test_other_models_keep_their_thinking_budget():
    provider = AnthropicProvider("claude-sonnet-4-5", api_key=KEY, thinking_budget=2048)
    assert provider.adaptive_thinking is False
    thinking = provider.request_params(make_request())["thinking"]
    assert thinking == {"type": "enabled", "budget_tokens": 2048}


def test_adaptive_thinking_false_keeps_the_budget_for_a_model_that_wants_adaptive():
    provider = AnthropicProvider(
        ADAPTIVE_MODEL, api_key=KEY, thinking_budget=2048, adaptive_thinking=False
    )
    thinking = provider.request_params(make_request())["thinking"]
    assert thinking == {"type": "enabled", "budget_tokens": 2048}


def test_adaptive_thinking_needs_no_budget_and_no_budget_below_max_tokens():
    bare = AnthropicProvider("claude-sonnet-4-6", api_key=KEY, adaptive_thinking=True)
    assert bare.request_params(make_request())["thinking"] == {"type": "adaptive"}
    large = AnthropicProvider(ADAPTIVE_MODEL, api_key=KEY, thinking_budget=8000, max_tokens=4096)
    assert large.request_params(make_request())["thinking"] == {"type": "adaptive"}


def test_adaptive_thinking_goes_on_through_a_tool_loop_begun_without_thinking():
    call = ToolCallPart(tool_call_id="toolu_1", tool_name="t", input={}, step=0)
    history = (
        UserMessage(content="go"),
        AssistantMessage(content=(call,)),  # Claude chose not to think on this step
        ToolMessage(tool_call_id="toolu_1", tool_name="t", output="done", step=0),
    )
    provider = AnthropicProvider(ADAPTIVE_MODEL, api_key=KEY, thinking_budget=2048)
    assert provider.request_params(make_request(history))["thinking"] == {"type": "adaptive"}
    budgeted = AnthropicProvider("claude-sonnet-4-5", api_key=KEY, thinking_budget=2048)
    assert "thinking" not in budgeted.request_params(make_request(history))


def test_adaptive_thinking_keeps_a_forced_tool_choice():
    forced = {"type": "tool", "name": "t"}
    request = make_request(settings={"tool_choice": forced, "temperature": 0.2})
    provider = AnthropicProvider(ADAPTIVE_MODEL, api_key=KEY, thinking_budget=2048)
    params = provider.request_params(request)
    assert params["tool_choice"] == forced  # the docs: adaptive supports forced tool use
    assert "temperature" not in params  # still refused with thinking on


def test_adaptive_thinking_asks_no_interleaved_thinking_beta():
    provider = AnthropicProvider(
        ADAPTIVE_MODEL, api_key=KEY, thinking_budget=2048, interleaved_thinking=True
    )
    params = provider.request_params(make_request())
    assert params["thinking"] == {"type": "adaptive"} and "extra_headers" not in params


def test_the_effort_goes_in_output_config_through_request_options():
    from anthropic.types import OutputConfigParam

    provider = AnthropicProvider(
        ADAPTIVE_MODEL, api_key=KEY, adaptive_thinking=True, output_config={"effort": "medium"}
    )
    params = provider.request_params(make_request())
    assert params["output_config"] == {"effort": "medium"}
    TypeAdapter(OutputConfigParam).validate_python(params["output_config"], strict=True)


def _unused() -> Any:  # keep the imports used by later sections
    return map_messages, loopback_server, FinishChunk
