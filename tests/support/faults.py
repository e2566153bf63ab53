"""Fault-injection helpers for the resilience tests: wire bodies, error replies, and
checks that a captured request body (or a saved history) is one the next call can use.

Bodies are built in the documented wire formats (OpenAI ``data: {json}`` lines ending
with ``data: [DONE]``; Anthropic ``event: <type>`` + ``data: {json}``) and served by
:mod:`tests.support.loopback` to the real SDK clients.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from runtime.messages import AssistantMessage, Message, ToolCallPart, ToolMessage, UserMessage
from tests.support.loopback import LoopbackServer, Reply, anthropic_sse, loopback_server, sse

GARBAGE = bytes(range(256)) * 4
"""Binary noise: not UTF-8, not SSE."""

NOT_SSE = b"<html><body><h1>502 Bad Gateway</h1><p>nginx</p></body></html>\n"
"""A proxy's HTML error page served as a 200 event stream: no events at all."""

# -- OpenAI Chat Completions ---------------------------------------------------------------


def oa_chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any):
    body: dict[str, Any] = {
        "id": "chatcmpl-fault",
        "object": "chat.completion.chunk",
        "created": 1735689600,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }
    body.update(extra)
    return body


def oa_usage(prompt: int = 10, completion: int = 5) -> dict[str, Any]:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    return oa_chunk(choices=[], usage={**usage, "total_tokens": prompt + completion})


def oa_text(*pieces: str, finish: str = "stop", usage: tuple[int, int] = (10, 5)) -> bytes:
    """A text answer streamed in ``pieces``."""
    events = [oa_chunk({"role": "assistant", "content": ""})]
    events += [oa_chunk({"content": p}) for p in pieces]
    events += [oa_chunk({}, finish), oa_usage(*usage)]
    return sse(*events)


def oa_reasoning_then_text(reasoning: Sequence[str], text: Sequence[str]) -> bytes:
    """``reasoning_content`` deltas (DeepSeek style), then the answer."""
    events = [oa_chunk({"role": "assistant", "content": ""})]
    events += [oa_chunk({"reasoning_content": r}) for r in reasoning]
    events += [oa_chunk({"content": t}) for t in text]
    events += [oa_chunk({}, "stop"), oa_usage()]
    return sse(*events)


def oa_tool_calls(
    *calls: tuple[str, str, Sequence[str]],
    text: Sequence[str] = (),
    finish: str = "tool_calls",
    usage: tuple[int, int] = (10, 5),
) -> bytes:
    """Text (optional), then each ``(call_id, name, argument_pieces)`` streamed in order."""
    events = [oa_chunk({"role": "assistant", "content": ""})]
    events += [oa_chunk({"content": t}) for t in text]
    for index, (call_id, name, pieces) in enumerate(calls):
        head = {"index": index, "id": call_id, "type": "function"}
        events.append(
            oa_chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]})
        )
        events += [
            oa_chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]})
            for p in pieces
        ]
    events += [oa_chunk({}, finish), oa_usage(*usage)]
    return sse(*events)


def oa_error_reply(status: int, message: str, kind: str, headers=()) -> Reply:
    """An HTTP error with OpenAI's JSON error body."""
    body = {"error": {"message": message, "type": kind, "code": None, "param": None}}
    return Reply(
        status=status,
        body=json.dumps(body).encode(),
        content_type="application/json",
        headers=list(headers),
    )


# -- Anthropic Messages --------------------------------------------------------------------


def a_start(input_tokens: int = 10) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_fault",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1},
        },
    }


def a_text(index: int, *pieces: str, stop: bool = True) -> list[dict[str, Any]]:
    block = {"type": "text", "text": ""}
    events: list[dict[str, Any]] = [
        {"type": "content_block_start", "index": index, "content_block": block}
    ]
    events += [
        {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": p}}
        for p in pieces
    ]
    if stop:
        events.append({"type": "content_block_stop", "index": index})
    return events


def a_thinking(
    index: int, *pieces: str, signature: str | None = "sig-valid", stop: bool = True
) -> list[dict[str, Any]]:
    """A thinking block; ``signature=None`` and ``stop=False`` leave it cut."""
    events: list[dict[str, Any]] = [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        }
    ]
    events += [
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "thinking_delta", "thinking": p},
        }
        for p in pieces
    ]
    if signature is not None:
        events.append(
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "signature_delta", "signature": signature},
            }
        )
    if stop:
        events.append({"type": "content_block_stop", "index": index})
    return events


def a_tool_use(
    index: int, call_id: str, name: str, *json_pieces: str, stop: bool = True
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}},
        }
    ]
    events += [
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "input_json_delta", "partial_json": p},
        }
        for p in json_pieces
    ]
    if stop:
        events.append({"type": "content_block_stop", "index": index})
    return events


def a_end(stop_reason: str = "end_turn", output_tokens: int = 5) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


def a_error(kind: str = "overloaded_error", message: str = "Overloaded") -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}}


def a_body(*parts: dict[str, Any] | Iterable[dict[str, Any]]) -> bytes:
    """An Anthropic SSE body from events and lists of events."""
    events: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, dict):
            events.append(part)
        else:
            events.extend(part)
    return anthropic_sse(*events)


def a_text_answer(*pieces: str) -> bytes:
    return a_body(a_start(), a_text(0, *pieces), a_end())


def a_error_reply(status: int, kind: str, message: str, headers=()) -> Reply:
    """An HTTP error with Anthropic's JSON error body."""
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return Reply(
        status=status,
        body=json.dumps(body).encode(),
        content_type="application/json",
        headers=list(headers),
    )


def cut_after(body: bytes, marker: bytes | str) -> int:
    """The offset just past the SSE event containing ``marker`` (for ``drop_after``)."""
    if isinstance(marker, str):
        marker = marker.encode()
    at = body.index(marker)
    return body.index(b"\n\n", at) + 2


# -- validity of what goes back to the model ---------------------------------------------


def check_openai_body(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Assert a Chat Completions request's ``messages`` pair every tool call with exactly
    one result, right after it, and hold no result without a call. Returns them."""
    messages = body["messages"]
    i = 0
    while i < len(messages):
        msg = messages[i]
        assert msg["role"] in ("system", "user", "assistant", "tool"), msg
        if msg["role"] == "tool":
            raise AssertionError(f"tool result {msg['tool_call_id']} without a call: {messages}")
        if msg["role"] == "assistant":
            assert msg.get("content") or msg.get("tool_calls"), f"empty assistant: {msg}"
            ids = [c["id"] for c in msg.get("tool_calls") or ()]
            for call in msg.get("tool_calls") or ():
                assert isinstance(call["function"]["arguments"], str), call
            results = []
            j = i + 1
            while j < len(messages) and messages[j]["role"] == "tool":
                results.append(messages[j]["tool_call_id"])
                j += 1
            assert results == ids, f"calls {ids} answered by {results}"
            i = j
            continue
        i += 1
    return messages


def check_anthropic_body(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Assert a Messages request alternates user/assistant starting with user, that every
    ``tool_use`` is answered by a ``tool_result`` at the start of the next user message
    (and every result has its call), that every ``thinking`` block is signed (a cut one
    must not travel back), and that no block is blank. Returns the messages."""
    messages = body["messages"]
    assert messages and messages[0]["role"] == "user", messages[:1]
    for k, msg in enumerate(messages):
        assert msg["role"] == ("user" if k % 2 == 0 else "assistant"), (
            f"roles do not alternate at {k}: {[m['role'] for m in messages]}"
        )
        blocks = msg["content"]
        if isinstance(blocks, str):
            assert blocks.strip(), f"empty message {k}"
            continue
        assert blocks, f"empty message {k}"
        if msg["role"] == "assistant":
            for b in blocks:
                assert b["type"] != "tool_result"
                if b["type"] == "thinking":
                    assert b.get("signature"), f"unsigned thinking sent back: {b}"
                if b["type"] == "text":
                    assert b["text"].strip(), "blank text block"
            calls = [b["id"] for b in blocks if b["type"] == "tool_use"]
            if calls:
                assert k + 1 < len(messages), "tool_use with no following user message"
                nxt = messages[k + 1]["content"]
                assert isinstance(nxt, list)
                got = [b["tool_use_id"] for b in nxt if b["type"] == "tool_result"]
                assert got == calls, f"tool_use {calls} answered by {got}"
                # results come first in that user message
                assert [b["type"] for b in nxt[: len(calls)]] == ["tool_result"] * len(calls)
        else:
            results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
            if results:
                prev = messages[k - 1]["content"] if k else []
                calls = [b["id"] for b in prev if isinstance(b, dict) and b["type"] == "tool_use"]
                assert results == calls, f"results {results} answer calls {calls}"
    return messages


def check_history(messages: Sequence[Message]) -> None:
    """Assert a saved history alternates sensibly: each assistant message follows a user
    message, and its tool calls are each answered by exactly one tool message right
    after it, in call order, with no orphan results."""
    i = 0
    prev: Any = None
    while i < len(messages):
        msg = messages[i]
        if isinstance(msg, ToolMessage):
            raise AssertionError(f"orphan tool result {msg.tool_call_id} at {i}")
        if isinstance(msg, AssistantMessage):
            assert isinstance(prev, UserMessage), f"assistant at {i} does not follow a user"
            calls = [p.tool_call_id for p in msg.content if isinstance(p, ToolCallPart)]
            j = i + 1
            got = []
            while j < len(messages) and isinstance(messages[j], ToolMessage):
                got.append(messages[j].tool_call_id)  # type: ignore[union-attr]
                j += 1
            assert got == calls, f"calls {calls} answered by {got}"
            prev, i = msg, j
            continue
        prev, i = msg, i + 1


def types_of(chunks: Sequence[Any]) -> list[str]:
    return [c.type for c in chunks]


def compact(types: Sequence[str]) -> list[str]:
    """Chunk types with runs of the same delta type collapsed (deltas may merge/split)."""
    out: list[str] = []
    for t in types:
        if t.endswith("-delta") and out and out[-1] == t:
            continue
        out.append(t)
    return out


async def consume(
    output: Any,
    *,
    stop_when: Callable[[Any], bool] | None = None,
    reason: str = "stop",
) -> list[Any]:
    """Every chunk of a turn; ``output.cancel(reason)`` once ``stop_when(chunk)`` holds."""
    chunks: list[Any] = []
    cancelled = False
    async for chunk in output:
        chunks.append(chunk)
        if stop_when is not None and not cancelled and stop_when(chunk):
            cancelled = True
            output.cancel(reason)
    return chunks


def drain(inbox: Any) -> list[Any]:
    out = []
    while True:
        try:
            out.append(inbox.get_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return out


# -- a host, a session and a fault-injecting server, for either provider --------------------

PROVIDERS = ("openai", "anthropic")


@attrs.define
class Rig:
    """One session on a host whose provider talks to a loopback server."""

    kind: str
    server: LoopbackServer
    host: Any
    session: Any
    agent: Any

    def answer(self, *pieces: str) -> bytes:
        """A plain text answer in this provider's wire format."""
        return oa_text(*pieces) if self.kind == "openai" else a_text_answer(*pieces)

    def error_reply(self, status: int, message: str = "boom", headers=()) -> Reply:
        """An HTTP error as this provider sends it (its JSON error body and type)."""
        if self.kind == "openai":
            kind = {429: "rate_limit_error", 500: "server_error"}.get(
                status, "invalid_request_error"
            )
            return oa_error_reply(status, message, kind, headers)
        kind = {
            400: "invalid_request_error",
            401: "authentication_error",
            403: "permission_error",
            429: "rate_limit_error",
            529: "overloaded_error",
        }.get(status, "api_error")
        return a_error_reply(status, kind, message, headers)

    def body(self, i: int = -1) -> dict[str, Any]:
        """The JSON body of request ``i``, checked for validity."""
        body = self.server.requests[i].json()
        if self.kind == "openai":
            check_openai_body(body)
        else:
            check_anthropic_body(body)
        return body

    async def next_turn(self, text: str = "next") -> dict[str, Any]:
        """Run one more turn on the same session (a plain answer) and return its
        request body after checking it is valid; the turn must succeed."""
        self.server.add(Reply(body=self.answer("fine")))
        before = len(self.server.requests)
        with trio.fail_after(30):
            result = await self.session.run(text)
        assert result.finish_reason == "stop", (result.finish_reason, result.error)
        assert result.text == "fine"
        assert len(self.server.requests) == before + 1
        check_history(self.session.messages)
        return self.body()


def resolve_platform(provider: Any) -> None:
    """Resolve the SDK client's platform headers now, on the event loop.

    Both SDKs resolve them in a worker thread on a client's first request. Under the
    autojump clock a thread hop leaves the loop idle, so the clock may jump to the next
    deadline (a turn's budget deadline, a read timeout) while the thread runs: the turn
    would be cut at a random moment. Doing it up front keeps virtual time deterministic.
    """
    client = provider._get_client()
    if getattr(client, "_platform", None) is None:
        if provider.provider_name == "openai":
            from openai._base_client import get_platform
        else:
            from anthropic._base_client import get_platform
        client._platform = get_platform()


def make_provider(kind: str, url: str, **kw: Any) -> Any:
    from actors.providers import AnthropicProvider, OpenAIProvider

    if kind == "openai":
        return OpenAIProvider("gpt-4o-mini", base_url=url + "/v1", api_key="test", **kw)
    return AnthropicProvider("claude-sonnet-4-5", base_url=url, api_key="test", **kw)


@asynccontextmanager
async def rig(
    kind: str,
    *replies: Reply,
    provider: dict[str, Any] | None = None,
    store: Any = None,
    session_id: str = "s",
    **agent: Any,
) -> AsyncIterator[Rig]:
    """Serve ``replies`` to a real ``kind`` SDK client behind a whole :class:`Host`."""
    from runtime import Agent, Host

    async with loopback_server(*replies) as server:
        the_provider = make_provider(kind, server.url, **(provider or {}))
        resolve_platform(the_provider)
        the_agent = Agent(provider=the_provider, **agent)
        try:
            async with Host.open(log_tap=False, store=store) as host:
                session = await host.open_session(the_agent, session_id=session_id)
                yield Rig(kind, server, host, session, the_agent)
        finally:
            with trio.CancelScope(shield=True):
                await the_provider.aclose()


def check_responses_body(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Assert a Responses request's ``input`` answers every ``function_call`` with
    exactly one ``function_call_output`` after it and before the next user message, holds
    no output without its call, and follows every ``reasoning`` item with another item
    (the API refuses one "provided without its required following item"). Returns it."""
    items = body["input"]
    open_calls: list[str] = []
    seen: set[str] = set()
    for k, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "reasoning":
            assert k + 1 < len(items) and items[k + 1].get("type") != "reasoning", (
                f"reasoning item {item.get('id')} without its following item"
            )
        elif kind == "function_call":
            assert item["call_id"] not in seen, f"call {item['call_id']} twice"
            assert isinstance(item["arguments"], str), item
            seen.add(item["call_id"])
            open_calls.append(item["call_id"])
        elif kind == "function_call_output":
            assert item["call_id"] in open_calls, f"output {item['call_id']} without its call"
            open_calls.remove(item["call_id"])
        elif item.get("role") == "user":
            assert not open_calls, f"calls {open_calls} unanswered before a user message"
    assert not open_calls, f"calls {open_calls} unanswered"
    return items
