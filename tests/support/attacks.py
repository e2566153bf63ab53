"""A whole-turn rig for the provider attack tests (tests/test_provider_attacks.py): one
session on a Host whose provider (OpenAI Chat Completions, OpenAI Responses, Anthropic or
Gemini, each over its real SDK client with a dummy key) talks to the loopback server, and
each provider's plain answer and tool call in its own wire format."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from tests.support.faults import (
    a_body,
    a_end,
    a_start,
    a_text,
    a_tool_use,
    check_anthropic_body,
    check_history,
    check_openai_body,
    check_responses_body,
    oa_text,
    oa_tool_calls,
    resolve_platform,
)
from tests.support.loopback import LoopbackServer, Reply, loopback_server, responses_sse

KINDS = ("openai", "responses", "anthropic", "gemini")
KEY = "sk-attack-Q9zT4mLr8vXw2Yb7NcK1pD5e"
"""The dummy key every provider is given (long and unique: a leak is a substring match)."""


def gemini_chunk(parts: list[dict[str, Any]], finish: str | None = None) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        cand["finishReason"] = finish
    out: dict[str, Any] = {"candidates": [cand]}
    if finish:
        out["usageMetadata"] = {
            "promptTokenCount": 10,
            "candidatesTokenCount": 5,
            "totalTokenCount": 15,
        }
    return out


def gemini_sse(*chunks: dict[str, Any]) -> bytes:
    return "".join(f"data: {json.dumps(c)}\r\n\r\n" for c in chunks).encode()


def responses_message(index: int, item_id: str, *pieces: str) -> list[dict[str, Any]]:
    head = {"id": item_id, "type": "message", "role": "assistant", "status": "in_progress"}
    text = "".join(pieces)
    part = {"type": "output_text", "text": text, "annotations": []}
    deltas = [
        {
            "type": "response.output_text.delta",
            "item_id": item_id,
            "output_index": index,
            "content_index": 0,
            "delta": p,
            "logprobs": [],
        }
        for p in pieces
    ]
    return [
        {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {**head, "content": []},
        },
        *deltas,
        {
            "type": "response.output_item.done",
            "output_index": index,
            "item": {**head, "status": "completed", "content": [part]},
        },
    ]


def responses_call(index: int, call_id: str, name: str, *pieces: str) -> list[dict[str, Any]]:
    item_id = f"fc_{call_id}"
    head = {"id": item_id, "type": "function_call", "call_id": call_id, "name": name}
    deltas = [
        {
            "type": "response.function_call_arguments.delta",
            "item_id": item_id,
            "output_index": index,
            "delta": p,
        }
        for p in pieces
    ]
    return [
        {
            "type": "response.output_item.added",
            "output_index": index,
            "item": {**head, "arguments": ""},
        },
        *deltas,
        {
            "type": "response.output_item.done",
            "output_index": index,
            "item": {**head, "arguments": "".join(pieces), "status": "completed"},
        },
    ]


@attrs.define
class AttackRig:
    kind: str
    server: LoopbackServer
    host: Any
    session: Any
    provider: Any
    turns: int = 0

    def answer(self, *pieces: str) -> bytes:
        """A plain text answer streamed in ``pieces``, in this provider's wire format."""
        self.turns += 1
        if self.kind == "openai":
            return oa_text(*pieces)
        if self.kind == "anthropic":
            return a_body(a_start(), a_text(0, *pieces), a_end())
        if self.kind == "responses":
            return responses_sse("gpt-5-mini", self.turns, responses_message(0, "msg_1", *pieces))
        chunks = [gemini_chunk([{"text": p}]) for p in pieces[:-1]]
        chunks.append(gemini_chunk([{"text": pieces[-1]}], "STOP"))
        return gemini_sse(*chunks)

    def tool_call(self, call_id: str, name: str, *pieces: str) -> bytes:
        """One tool call whose arguments stream in ``pieces``."""
        self.turns += 1
        if self.kind == "openai":
            return oa_tool_calls((call_id, name, pieces))
        if self.kind == "anthropic":
            return a_body(a_start(), a_tool_use(0, call_id, name, *pieces), a_end("tool_use"))
        if self.kind == "responses":
            return responses_sse(
                "gpt-5-mini", self.turns, responses_call(0, call_id, name, *pieces)
            )
        call = {"functionCall": {"id": call_id, "name": name, "args": json.loads("".join(pieces))}}
        return gemini_sse(gemini_chunk([call], "STOP"))

    def sent(self, i: int = -1) -> dict[str, Any]:
        return self.server.requests[i].json()

    async def next_turn(self, text: str = "next") -> dict[str, Any]:
        """One more turn (a plain answer) that must succeed; its request body, checked:
        the saved history and the request the provider made of it are valid (every call
        answered, roles in order, no cut reasoning sent back)."""
        self.server.add(Reply(body=self.answer("fine")))
        before = len(self.server.requests)
        with trio.fail_after(60):
            result = await self.session.run(text)
        assert (result.finish_reason, result.text) == ("stop", "fine"), result.error
        assert len(self.server.requests) == before + 1
        check_history(self.session.messages)
        body = self.sent()
        if self.kind == "openai":
            check_openai_body(body)
        elif self.kind == "anthropic":
            check_anthropic_body(body)
        elif self.kind == "responses":
            check_responses_body(body)
        else:
            check_gemini_body(body)
        return body


def check_gemini_body(body: dict[str, Any]) -> None:
    """A ``generateContent`` request's ``contents`` start with the user, hold no empty
    turn, no two model turns in a row (two user turns may follow each other: a failed
    turn saved nothing to send), and answer every ``functionCall`` in the next turn."""
    contents = body["contents"]
    assert contents and contents[0]["role"] == "user", contents[:1]
    for k, content in enumerate(contents):
        assert content["role"] in ("user", "model"), content
        assert content["role"] == "user" or contents[k - 1]["role"] == "user", contents
        assert content["parts"], f"empty turn {k}"
        calls = [p for p in content["parts"] if "functionCall" in p]
        if calls:
            answers = [p for p in contents[k + 1]["parts"] if "functionResponse" in p]
            assert len(answers) == len(calls), (calls, answers)


def make(kind: str, url: str, **kw: Any) -> Any:
    from actors.providers import (
        AnthropicProvider,
        GeminiProvider,
        OpenAIProvider,
        OpenAIResponsesProvider,
    )

    if kind == "openai":
        return OpenAIProvider("gpt-4o-mini", base_url=url + "/v1", api_key=KEY, **kw)
    if kind == "responses":
        return OpenAIResponsesProvider("gpt-5-mini", base_url=url + "/v1", api_key=KEY, **kw)
    if kind == "anthropic":
        return AnthropicProvider("claude-sonnet-4-5", base_url=url, api_key=KEY, **kw)
    return GeminiProvider("gemini-2.5-flash", base_url=url, api_key=KEY, **kw)


@asynccontextmanager
async def attack_rig(
    kind: str, *replies: Reply, provider: dict[str, Any] | None = None, **agent: Any
) -> AsyncIterator[AttackRig]:
    """Serve ``replies`` to a real ``kind`` SDK client behind a whole Host."""
    from runtime import Agent, Host

    async with loopback_server(*replies) as server:
        the_provider = make(kind, server.url, **(provider or {}))
        if kind in ("openai", "responses", "anthropic"):
            resolve_platform(the_provider)
        try:
            async with Host.open(log_tap=False) as host:
                session = await host.open_session(
                    Agent(provider=the_provider, **agent), session_id="s"
                )
                yield AttackRig(kind, server, host, session, the_provider)
        finally:
            with trio.CancelScope(shield=True):
                await the_provider.aclose()
