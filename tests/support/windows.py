"""Loopback model servers with a context window, for the compaction tests.

Each serves one API (Anthropic Messages, OpenAI Chat Completions, OpenAI Responses) to
the real SDK client, as ``loopback_server(respond=...)``, and refuses with the API's 400
what the real one refuses:

* a request over its context window (``prompt is too long`` /
  ``context_length_exceeded``), measured by its own count of the request's text
  (:class:`Chars4`, four characters a token, through
  :func:`actors.providers.openai_common.count_payload`): every count is recorded;
* a tool call without its result right after it, or a result without its call
  (:func:`tests.support.faults.check_anthropic_body` and its siblings);
* reasoning it did not mint, and, in the current turn's tool loop, a call sent back
  without the reasoning that came before it (Anthropic with thinking on: "Expected
  `thinking` or `redacted_thinking`, but found `tool_use`"; Responses: a
  ``function_call`` of the turn whose ``reasoning`` item was dropped).

The model's part is simple: a request whose system prompt asks for a summary gets
``summary <n>``; otherwise questions whose number is odd get a tool call (``lookup``)
first, then every request gets an answer. Anthropic's ``/v1/messages/count_tokens``
answers with the same count the window is checked by.
"""

from __future__ import annotations

import base64
import json
import math
import re
from typing import Any

import attrs

from actors.providers.openai_common import count_payload
from runtime.compaction import SUMMARY_INSTRUCTIONS
from tests.support.faults import (
    a_body,
    a_end,
    a_start,
    a_text,
    a_thinking,
    a_tool_use,
    check_anthropic_body,
    check_openai_body,
    check_responses_body,
    oa_text,
    oa_tool_calls,
)
from tests.support.loopback import Recorded, Reply, responses_sse

ANSWER = "Here is a considered answer to that question, with some detail. " * 5
"""About 80 tokens of answer text."""


class Chars4:
    """A tokenizer of four characters a token (the servers' count; a fake ``tiktoken``
    encoding for the OpenAI providers' count in the tests)."""

    def encode(self, text: str, disallowed_special: Any = ()) -> range:
        return range(math.ceil(len(text) / 4))


def fake_tiktoken() -> Any:
    """A stand-in ``tiktoken`` module whose every encoding is :class:`Chars4`."""
    import types

    module = types.ModuleType("tiktoken")
    module.encoding_for_model = lambda model: Chars4()  # type: ignore[attr-defined]
    module.get_encoding = lambda name: Chars4()  # type: ignore[attr-defined]
    return module


def _refuse(error: dict[str, Any]) -> Reply:
    return Reply(status=400, content_type="application/json", body=json.dumps(error).encode())


def _question(text: str) -> int:
    found = re.search(r"question (\d+)", text)
    return int(found.group(1)) if found else 0


@attrs.define
class WindowServer:
    """What the three servers share: the window, the counts, the refusals."""

    window: int
    counts: list[int] = attrs.field(factory=list)
    """The count of every model request (summary requests included), in order."""
    summaries: int = 0
    refused: list[str] = attrs.field(factory=list)
    minted: set[str] = attrs.field(factory=set)

    def check(self, tokens: int, validate: Any, body: dict[str, Any]) -> str | None:
        """Why the request is refused, or ``None``; records its count."""
        self.counts.append(tokens)
        if tokens > self.window:
            return f"prompt is too long: {tokens} tokens > {self.window} maximum"
        try:
            validate(body)
        except AssertionError as exc:
            return f"invalid request: {exc}"
        return None

    def refuse(self, why: str) -> None:
        self.refused.append(why)


@attrs.define
class AnthropicWindow(WindowServer):
    """An Anthropic Messages server with thinking on: see the module docstring."""

    def tokens(self, body: dict[str, Any]) -> int:
        return count_payload(Chars4(), [body.get("system"), *body["messages"], body.get("tools")])

    def __call__(self, request: Recorded) -> Reply:
        body = request.json()
        if request.path.endswith("/count_tokens"):
            count = {"input_tokens": self.tokens(body)}
            return Reply(content_type="application/json", body=json.dumps(count).encode())
        why = self.check(self.tokens(body), self.validate, body)
        if why is not None:
            self.refuse(why)
            kind = "invalid_request_error"
            return _refuse({"type": "error", "error": {"type": kind, "message": why}})
        n = len(self.minted) + 1
        signature = f"sig-{n}"
        self.minted.add(signature)
        thinking = a_thinking(0, "thinking it over", signature=signature)
        if SUMMARY_INSTRUCTIONS in (body.get("system") or ""):
            self.summaries += 1
            return Reply(body=a_body(a_start(), thinking, a_text(1, f"summary {n}"), a_end()))
        last = body["messages"][-1]
        text = last["content"] if isinstance(last["content"], str) else ""
        if _question(text) % 2:  # the turn's first step: a tool call
            call = a_tool_use(1, f"toolu_{n}", "lookup", json.dumps({"q": text[:20]}))
            return Reply(body=a_body(a_start(), thinking, call, a_end("tool_use")))
        return Reply(body=a_body(a_start(), thinking, a_text(1, ANSWER), a_end()))

    def validate(self, body: dict[str, Any]) -> None:
        messages = check_anthropic_body(body)
        for message in messages:
            for block in message["content"] if isinstance(message["content"], list) else ():
                if block["type"] == "thinking":
                    assert block["signature"] in self.minted, "Invalid `signature` in `thinking`"
        last_assistant = (
            next(m for m in reversed(messages) if m["role"] == "assistant")
            if (len(messages) > 1)
            else None
        )
        tool_loop = messages[-1]["role"] == "user" and isinstance(messages[-1]["content"], list)
        tool_loop = tool_loop and any(b["type"] == "tool_result" for b in messages[-1]["content"])
        if tool_loop and last_assistant is not None:
            first = last_assistant["content"][0]["type"]
            assert first in ("thinking", "redacted_thinking"), (
                f"Expected `thinking` or `redacted_thinking`, but found `{first}`"
            )


@attrs.define
class ChatWindow(WindowServer):
    """An OpenAI Chat Completions server: see the module docstring."""

    def tokens(self, body: dict[str, Any]) -> int:
        tools = [body["tools"]] if body.get("tools") else []
        return count_payload(Chars4(), [*body["messages"], *tools])

    def __call__(self, request: Recorded) -> Reply:
        body = request.json()
        why = self.check(self.tokens(body), check_openai_body, body)
        if why is not None:
            self.refuse(why)
            code = "context_length_exceeded" if "too long" in why else None
            error = {"message": why, "type": "invalid_request_error", "code": code, "param": None}
            return _refuse({"error": error})
        n = len(self.counts)
        system = " ".join(m["content"] for m in body["messages"] if m["role"] == "system")
        if SUMMARY_INSTRUCTIONS in system:
            self.summaries += 1
            return Reply(body=oa_text(f"summary {n}"))
        last = body["messages"][-1]
        if last["role"] == "user" and _question(last["content"]) % 2:
            return Reply(body=oa_tool_calls((f"call_{n}", "lookup", ['{"q": "x"}'])))
        return Reply(body=oa_text(ANSWER))


# -- Responses ----------------------------------------------------------------------------------


def _events(model: str, n: int, items: list[dict[str, Any]]) -> bytes:
    events: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        events.append({"type": "response.output_item.added", "output_index": index, "item": item})
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events.append(
                {
                    "type": "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "delta": text,
                    "logprobs": [],
                }
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return responses_sse(model, n, events)


@attrs.define
class ResponsesWindow(WindowServer):
    """An OpenAI Responses server (reasoning sealed with ``encrypted_content``): see the
    module docstring."""

    def tokens(self, body: dict[str, Any]) -> int:
        head = [body["instructions"]] if body.get("instructions") else []
        tools = [body["tools"]] if body.get("tools") else []
        return count_payload(Chars4(), [*head, *body["input"], *tools])

    def __call__(self, request: Recorded) -> Reply:
        body = request.json()
        why = self.check(self.tokens(body), self.validate, body)
        if why is not None:
            self.refuse(why)
            code = "context_length_exceeded" if "too long" in why else "invalid_encrypted_content"
            error = {"message": why, "type": "invalid_request_error", "code": code, "param": None}
            return _refuse({"error": error})
        n = len(self.counts)
        sealed = f"enc-{n}"
        self.minted.add(sealed)
        summary = [{"type": "summary_text", "text": "thinking it over"}]
        reasoning = {"id": f"rs_{n}", "type": "reasoning", "summary": summary}
        reasoning["encrypted_content"] = sealed
        answer = {
            "id": f"msg_{n}",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": ANSWER, "annotations": []}],
        }
        if SUMMARY_INSTRUCTIONS in (body.get("instructions") or ""):
            self.summaries += 1
            answer["content"][0]["text"] = f"summary {n}"
            return Reply(body=_events(body["model"], n, [reasoning, answer]))
        last = body["input"][-1]
        if last.get("role") == "user" and _question(str(last["content"])) % 2:
            call = {
                "id": f"fc_{n}",
                "type": "function_call",
                "call_id": f"call_{n}",
                "name": "lookup",
                "arguments": '{"q": "x"}',
                "status": "completed",
            }
            return Reply(body=_events(body["model"], n, [reasoning, call]))
        return Reply(body=_events(body["model"], n, [reasoning, answer]))

    def validate(self, body: dict[str, Any]) -> None:
        items = check_responses_body(body)
        for item in items:
            if item.get("type") == "reasoning":
                assert item.get("encrypted_content") in self.minted, "invalid_encrypted_content"
        users = [k for k, item in enumerate(items) if item.get("role") == "user"]
        current = items[users[-1] :] if users else items
        for k, item in enumerate(current):
            if item.get("type") == "function_call":
                assert k > 0 and current[k - 1].get("type") == "reasoning", (
                    f"function_call {item['call_id']} of the current turn lost its reasoning"
                )


# -- Gemini -------------------------------------------------------------------------------------


def _gemini_sse(*chunks: dict[str, Any]) -> bytes:
    return "".join(f"data: {json.dumps(c)}\r\n\r\n" for c in chunks).encode()


def _signature_bytes(text: str) -> bytes:
    """A signature's bytes, however it is base64-encoded (the SDK sends URL-safe)."""
    return base64.urlsafe_b64decode(
        text.replace("+", "-").replace("/", "_") + "=" * (-len(text) % 4)
    )


@attrs.define
class GeminiWindow(WindowServer):
    """A Gemini ``streamGenerateContent`` server (a thought summary, and a signature on
    the call or the answer it mints), refusing a request over its window with the API's
    400 ``INVALID_ARGUMENT`` and a call sent back without its response or its signature.
    ``models.countTokens`` answers as documented: the body holds ``contents`` or a
    whole ``generateContentRequest``; the answer is ``{"totalTokens": n}``."""

    counted: int = 0
    """How many ``countTokens`` requests came."""

    def tokens(self, body: dict[str, Any]) -> int:
        return count_payload(
            Chars4(), [body.get("systemInstruction"), *body.get("contents", []), body.get("tools")]
        )

    def __call__(self, request: Recorded) -> Reply:
        body = request.json()
        if request.path.endswith(":countTokens"):
            self.counted += 1
            counted = body.get("generateContentRequest") or {"contents": body.get("contents")}
            answer = {"totalTokens": self.tokens(counted)}
            return Reply(content_type="application/json", body=json.dumps(answer).encode())
        tokens = self.tokens(body)
        why = self.check(tokens, self.validate, body)
        if why is not None:
            self.refuse(why)
            if "too long" in why:
                why = (
                    f"The input token count ({tokens}) exceeds the maximum number of tokens "
                    f"allowed ({self.window})."
                )
            error = {"code": 400, "message": why, "status": "INVALID_ARGUMENT"}
            return _refuse({"error": error})
        n = len(self.counts)
        signature = base64.b64encode(f"sig-{n}".encode()).decode()
        self.minted.add(f"sig-{n}")
        thought = {"text": "thinking it over", "thought": True}
        system = " ".join(
            p.get("text", "") for p in body.get("systemInstruction", {}).get("parts", [])
        )
        last = body["contents"][-1]
        text = " ".join(p.get("text", "") for p in last["parts"])
        if SUMMARY_INSTRUCTIONS in system:
            self.summaries += 1
            part: dict[str, Any] = {"text": f"summary {n}"}
        elif last["role"] == "user" and text and _question(text) % 2:
            part = {"functionCall": {"name": "lookup", "args": {"q": text[:20]}}}
        else:
            part = {"text": ANSWER}
        part["thoughtSignature"] = signature
        usage = {
            "promptTokenCount": tokens,
            "candidatesTokenCount": 20,
            "totalTokenCount": tokens + 20,
        }
        return Reply(
            body=_gemini_sse(
                {"candidates": [{"content": {"role": "model", "parts": [thought, part]}}]},
                {"candidates": [{"finishReason": "STOP"}], "usageMetadata": usage},
            )
        )

    def validate(self, body: dict[str, Any]) -> None:
        contents = body["contents"]
        for k, content in enumerate(contents):
            parts = content["parts"]
            calls = [p["functionCall"]["name"] for p in parts if "functionCall" in p]
            answered = [p["functionResponse"]["name"] for p in parts if "functionResponse" in p]
            if answered:
                before = contents[k - 1]["parts"] if k else []
                asked = [p["functionCall"]["name"] for p in before if "functionCall" in p]
                assert asked == answered, f"function responses {answered} without their calls"
            if calls:
                after = contents[k + 1]["parts"] if k + 1 < len(contents) else []
                got = [p["functionResponse"]["name"] for p in after if "functionResponse" in p]
                assert got == calls, f"function calls {calls} without their responses"
            for p in parts:
                if "thoughtSignature" in p:
                    seen = _signature_bytes(p["thoughtSignature"]).decode("utf-8", "replace")
                    assert seen in self.minted, "Corrupted thought signature."
