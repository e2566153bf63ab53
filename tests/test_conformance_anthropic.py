"""Conformance: every shared Anthropic recording, replayed through the provider.

The recordings are real API responses collected in ``shared/fixtures/streams`` (see its
``PROVENANCE.md``); the expected values below are copied from that file's "Expected"
lines. Texts PROVENANCE abbreviates (``…`` and a count) are checked by prefix and total
length. Every file must also be covered by the table, so a new recording fails loudly
until someone writes down what it should give. Skipped when the fixtures are absent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.providers.anthropic import TRUNCATED_BY_MAX_TOKENS, AnthropicProvider
from runtime.actor_messages import InferRequest
from runtime.chunks import (
    FinishChunk,
    ProviderDataChunk,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    ToolInputStartChunk,
    UsageChunk,
)
from runtime.inbox import Inbox
from runtime.messages import UserMessage
from tests.support.loopback import Reply, loopback_server

STREAMS = Path(__file__).resolve().parents[1].parent / "shared/fixtures/streams"
ANTHROPIC = STREAMS / "anthropic"

pytestmark = pytest.mark.skipif(not ANTHROPIC.is_dir(), reason="shared Anthropic fixtures absent")


def Text(prefix: str, length: int | None = None) -> tuple[str, int]:
    """A text check: exact when ``length`` is omitted, else prefix + total length."""
    return (prefix, len(prefix) if length is None else length)


# file -> what PROVENANCE.md says it contains. "segments" is the content in stream order:
# ("text", Text), ("thinking", Text, signature length), ("redacted", data length),
# ("tool", id, name, input | Text of json.dumps(input)), ("data", block type).
EXPECTED: dict[str, dict[str, Any]] = {
    "text-basic.sse": {
        "segments": [("text", Text("- Captain\n- Scoop"))],
        "stop": "end_turn",
        "usage": (17, 10),
    },
    "text-basic-unpadded.sse": {
        "segments": [
            (
                "text",
                Text(
                    "Hello! I'm doing well, thank you for asking. How are you doing today? "
                    "Is there anything I can help you with?"
                ),
            )
        ],
        "stop": "end_turn",
        "usage": (12, 30),
    },
    "thinking-signature.sse": {
        "segments": [
            (
                "thinking",
                Text(
                    "The user wants two names for a pet pelican, and wants me to be brief. "
                    "I'll give two simple, fitting names.\n\nSome options:\n- Pete\n- Percy\n- C",
                    218,
                ),
                512,
            ),
            ("text", Text("- Captain\n- Scoop")),
        ],
        "stop": "end_turn",
        "usage": (46, 84),
    },
    "redacted-thinking.sse": {
        "segments": [
            ("redacted", 744),
            ("redacted", 296),
            (
                "text",
                Text(
                    "I notice that you've sent what appears to be some kind of test string or "
                    'command. I don\'t have any special "magic string" triggers or backdo',
                    359,
                ),
            ),
        ],
        "stop": "end_turn",
        "usage": (92, 189),
    },
    "interleaved-text-thinking-text.sse": {
        "segments": [
            ("text", Text("\n\n")),
            ("thinking", Text("Brief answer with two pet pelican names."), 284),
            ("text", Text("1. **Captain Scoop**\n2. **Gullet**")),
        ],
        "stop": "end_turn",
        "usage": (34, 44),
    },
    "thinking-tool-use-step1.sse": {
        "segments": [
            (
                "thinking",
                Text(
                    "The user wants me to:\n1. Use the fixed_version tool\n"
                    "2. Tell them the version\n3. Make a short joke about it\n\n"
                    "Let me first call the fixed_vers",
                    180,
                ),
                524,
            ),
            ("tool", "toolu_01825dXWLSoJwCst1qTsiWdb", "fixed_version", {}),
        ],
        "stop": "tool_use",
        "usage": (598, 92),
    },
    "thinking-tool-use-step2.sse": {
        "segments": [
            (
                "text",
                Text(
                    "The version is **0.32a0**.\n\nHere's a joke about it: \n\nLooks like this "
                    "version is still in alpha testing... I guess you could say it's going ",
                    277,
                ),
            )
        ],
        "stop": "end_turn",
        "usage": (707, 89),
    },
    "tool-use-step1-get-weather.sse": {
        "segments": [
            (
                "tool",
                "toolu_018acGYLtfR52q9yDbWaEdQZ",
                "get_weather",
                {"location": "San Francisco, CA", "units": "f"},
            )
        ],
        "stop": "tool_use",
        "usage": (656, 74),
    },
    "tool-use-step2-answer.sse": {
        "segments": [
            (
                "text",
                Text(
                    "The weather in San Francisco, CA is currently:\n- **Temperature:** 68°F\n"
                    "- **Condition:** Sunny\n\nIt's a nice sunny day!"
                ),
            )
        ],
        "stop": "end_turn",
        "usage": (770, 38),
    },
    "tool-use-empty-input.sse": {
        "segments": [
            ("text", Text("I'll update the issue list for you.")),
            ("tool", "toolu_01QE1WLsSVp5hy5Q3GmGTmjP", "updateIssueList", {}),
        ],
        "stop": "tool_use",
        "usage": (565, 48),
    },
    "tool-use-multiple-blocks.sse": {
        "segments": [
            ("tool", "toolu_01LtEf4h1QW7KCKLsYMuhTNB", "searchDocs", {"query": "alpha"}),
            ("tool", "toolu_016tfZE7otAFSBjhc67wu189", "searchDocs", {"query": "beta"}),
            ("tool", "toolu_01XkU35z8BVWqqc9tijDuLrA", "searchDocs", {"query": "gamma"}),
        ],
        "stop": "tool_use",
        "usage": (798, 110),
    },
    "tool-use-escaped-quotes.sse": {
        "segments": [
            (
                "tool",
                "toolu_01Cr31vcGoeeRgi3Eo5Ds8qN",
                "website_update",
                Text(
                    '{"website_path": "/home/user/pace-landing", "tasks": [{"description": '
                    '"Today you post every run to Strava, but Strava does not answer the '
                    'question: \\"What should I do next after this run?\\". It is a great log, '
                    "but it is ",
                    273,
                ),
            )
        ],
        "stop": "tool_use",
        "usage": (912, 118),
    },
    "max-tokens-truncated-tool-input.sse": {
        "segments": [
            (
                "text",
                Text(
                    "I'll create a comprehensive tax guide for someone with multiple W2s and "
                    "save it in a file called taxes.txt. Let me do that for you now."
                ),
            ),
            # cut by max_tokens: the raw text, an input_error, never a parsed input
            (
                "truncated",
                "toolu_01EKqbqmZrGRXy18eN7m9kvY",
                "make_file",
                '{"filename": "taxes.txt", "lines_of_text": [\n"# COMPREHENSIVE TAX GUIDE FOR '
                'INDIVIDUALS WITH MULTIPLE W-2s",\n"",\n"## INTRODUCTION",\n"",\n"Filing taxes',
            ),
        ],
        "stop": "max_tokens",
        "usage": (450, 124),
    },
    "claude3-thinking-tags-in-text-tool-use.sse": {
        "segments": [
            (
                "text",
                Text(
                    "<thinking>\nThe get_weather tool is relevant for answering this question "
                    "as it provides weather information for a specified location.\n\nThe to",
                    375,
                ),
            ),
            (
                "tool",
                "toolu_01DYJo37oETVsCdLTTcCWcdq",
                "get_weather",
                {"location": "San Francisco, CA"},
            ),
        ],
        "stop": "tool_use",
        "usage": (599, 135),
        "cache": (None, None),  # old-style usage: the counters are unknown, not zero
    },
    "server-tool-code-execution-thinking.sse": {
        "segments": [
            ("thinking", Text("Let me calculate this mathematical expression."), 320),
            ("text", Text("I'll calculate that expression for you right away!")),
            ("data", "server_tool_use"),
            ("data", "bash_code_execution_tool_result"),
            (
                "text",
                Text(
                    "Following the standard **order of operations (PEMDAS/BODMAS)** — "
                    "multiplication is performed before addition and subtraction — here's the br",
                    451,
                ),
            ),
        ],
        "stop": "end_turn",
        "usage": (4714, 304),
    },
}

FINISH = {"end_turn": "stop", "tool_use": "tool-calls", "max_tokens": "length"}


def recordings() -> list[str]:
    return sorted(p.name for p in ANTHROPIC.glob("*.sse")) if ANTHROPIC.is_dir() else []


def segments(chunks: list[Any]) -> list[tuple[Any, ...]]:
    """Fold chunks into the content they describe, in stream order."""
    out: list[tuple[Any, ...]] = []
    text: list[str] = []
    thinking: list[str] | None = None
    for chunk in chunks:
        if not isinstance(chunk, TextChunk) and text:
            out.append(("text", "".join(text)))
            text = []
        if isinstance(chunk, TextChunk):
            text.append(chunk.text)
        elif isinstance(chunk, ReasoningChunk) and chunk.redacted_data is not None:
            out.append(("redacted", chunk.redacted_data))
        elif isinstance(chunk, ReasoningChunk):
            assert chunk.provider == "anthropic"
            thinking = thinking if thinking is not None else []
            thinking.append(chunk.text)
            if chunk.signature is not None:
                out.append(("thinking", "".join(thinking), chunk.signature))
                thinking = None
        elif isinstance(chunk, ToolCallChunk):
            out.append(("tool", chunk))
        elif isinstance(chunk, ProviderDataChunk):
            out.append(("data", chunk.data))
    assert thinking is None, "a thinking block was left without its signature"
    if text:
        out.append(("text", "".join(text)))
    return out


async def replay(name: str) -> list[Any]:
    chunks: list[Any] = []

    async def emit(chunk: Any) -> None:
        chunks.append(chunk)

    body = (ANTHROPIC / name).read_bytes()
    async with loopback_server(Reply(body=body, write_size=97)) as server:
        provider = AnthropicProvider(
            "claude-sonnet-4-5", base_url=server.url, api_key="sk-ant-dummy"
        )
        request = InferRequest(
            request_id="r",
            session_id="s",
            turn_id="t",
            step=0,
            instructions=None,
            messages=(UserMessage(content="replay"),),
            tools=(),
            reply=Inbox(),
            cancel_scope=trio.CancelScope(),
        )
        await provider.stream(request, emit)
        await provider.aclose()
    return chunks


def check_text(actual: str, expected: tuple[str, int]) -> None:
    prefix, length = expected
    assert actual.startswith(prefix), (actual[:80], prefix[:80])
    assert len(actual) == length


def test_every_recording_has_expectations():
    assert recordings(), "no Anthropic recordings found"
    assert set(recordings()) == set(EXPECTED)


@pytest.mark.parametrize("name", recordings())
async def test_recording_conforms(name: str):
    expected = EXPECTED[name]
    chunks = await replay(name)
    got = segments(chunks)
    assert [g[0] if g[0] != "tool" or g[1].input_error is None else "truncated" for g in got] == [
        e[0] for e in expected["segments"]
    ]
    for actual, want in zip(got, expected["segments"], strict=True):
        kind = want[0]
        if kind == "text":
            check_text(actual[1], want[1])
        elif kind == "thinking":
            check_text(actual[1], want[1])
            assert len(actual[2]) == want[2]
        elif kind == "redacted":
            assert len(actual[1]) == want[1]
        elif kind == "data":
            assert actual[1]["type"] == want[1]
        else:
            call: ToolCallChunk = actual[1]
            assert (call.tool_call_id, call.tool_name) == (want[1], want[2])
            if kind == "truncated":
                assert (call.input, call.input_error) == (want[3], TRUNCATED_BY_MAX_TOKENS)
            elif isinstance(want[3], tuple):
                check_text(json.dumps(call.input), want[3])
            else:
                assert call.input == want[3]
    # one start per client tool call, none for server tools
    starts = [c.tool_call_id for c in chunks if isinstance(c, ToolInputStartChunk)]
    assert starts == [g[1].tool_call_id for g in got if g[0] == "tool"]
    # usage, then finish, last
    usage, finish = chunks[-2], chunks[-1]
    assert isinstance(usage, UsageChunk) and isinstance(finish, FinishChunk)
    assert (usage.usage.input_tokens, usage.usage.output_tokens) == expected["usage"]
    assert usage.usage.total_tokens == sum(expected["usage"])
    if "cache" in expected:
        assert (usage.usage.cache_read, usage.usage.cache_write) == expected["cache"]
    assert (finish.reason, finish.raw_reason) == (FINISH[expected["stop"]], expected["stop"])
    assert sum(isinstance(c, (UsageChunk, FinishChunk)) for c in chunks) == 2
