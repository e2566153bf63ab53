"""Loopback servers that bind reasoning to where it was made, as the real APIs do.

Use one as ``loopback_server(respond=SigningAnthropic())``. Each answers every request
with reasoning and a short text, and refuses (400, in the API's own error format) a
request that replays reasoning it did not make for that request:

* :class:`SigningAnthropic` signs each thinking block for the model requested
  (``sig:<model>:<n>``) and refuses a thinking block whose signature it did not mint for
  the model now requested ("Invalid `signature` in `thinking` block"): a signature from
  another model, or from another server (another instance), fails;
* :class:`SealingResponses` seals each reasoning item's ``encrypted_content`` for itself
  and refuses content it did not seal (``invalid_encrypted_content``), as OpenAI does
  for content of another organization;
* :class:`SigningGemini` signs each answer's thought and text for the model requested
  and refuses a ``thoughtSignature`` it did not mint for it ("Corrupted thought
  signature."); for a Gemini 3 model it also refuses a current-turn step whose first
  function call carries no signature ("Function call is missing a thought_signature"),
  accepting the documented sentinel in its place.

``SigningAnthropic`` answers as Claude on Vertex (the model in the URL) and on Bedrock
(``framing="bedrock"``: AWS event-stream frames) as well.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any
from urllib.parse import unquote

import attrs

from tests.support.eventstream import bedrock_stream
from tests.support.loopback import (
    Recorded,
    Reply,
    anthropic_sse,
    anthropic_start,
    responses_sse,
)


def _refuse(error: dict[str, Any]) -> Reply:
    return Reply(status=400, content_type="application/json", body=json.dumps(error).encode())


@attrs.define
class SigningAnthropic:
    """An Anthropic Messages server whose thinking signatures are bound to their model."""

    minted: dict[str, str] = attrs.field(factory=dict)
    """Signature -> the model it was minted for."""
    refused: list[str] = attrs.field(factory=list)
    """The signatures refused, in order."""
    framing: str = "sse"
    """``"sse"`` (Anthropic, Vertex) or ``"bedrock"`` (AWS event-stream frames)."""

    def __call__(self, request: Recorded) -> Reply:
        body = request.json()
        model = body.get("model") or _model_in_path(request.path)
        refusal = self.refusal(body, model)
        if refusal is not None:
            return refusal
        n, signature = self.mint(model)
        events = _anthropic_answer(model, f"thought {n}", signature, f"answer {n}")
        if self.framing == "bedrock":
            return Reply(
                body=bedrock_stream(*events), content_type="application/vnd.amazon.eventstream"
            )
        return Reply(body=anthropic_sse(*events))

    def refusal(self, body: dict[str, Any], model: str) -> Reply | None:
        """The 400 for a request that replays a thinking block whose signature was not
        minted here for ``model``; ``None`` when every signature is valid."""
        for i, message in enumerate(body["messages"]):
            content = message["content"]
            if message["role"] != "assistant" or isinstance(content, str):
                continue
            for j, block in enumerate(content):
                signature = block.get("signature")
                if block.get("type") == "thinking" and self.minted.get(signature) != model:
                    self.refused.append(signature)
                    return _refuse(
                        {
                            "type": "error",
                            "error": {
                                "type": "invalid_request_error",
                                "message": f"messages.{i}.content.{j}: Invalid `signature` "
                                "in `thinking` block",
                            },
                        }
                    )
        return None

    def mint(self, model: str) -> tuple[int, str]:
        """A new signature for ``model``, and its number."""
        n = len(self.minted) + 1
        signature = f"sig:{model}:{n}"
        self.minted[signature] = model
        return n, signature


def _model_in_path(path: str) -> str:
    """The model of a Vertex (``.../models/<model>:streamRawPredict``) or Bedrock
    (``/model/<model>/invoke-with-response-stream``) request."""
    found = re.search(r"/models?/([^/]+?)(?::streamRawPredict|:rawPredict|/invoke)", path)
    assert found is not None, path
    return unquote(found.group(1))


def _anthropic_answer(model: str, thought: str, signature: str, text: str) -> list[dict[str, Any]]:
    def block(index: int, start: dict[str, Any], *deltas: dict[str, Any]) -> list[dict]:
        return [
            {"type": "content_block_start", "index": index, "content_block": start},
            *({"type": "content_block_delta", "index": index, "delta": d} for d in deltas),
            {"type": "content_block_stop", "index": index},
        ]

    return [
        anthropic_start(model),
        *block(
            0,
            {"type": "thinking", "thinking": "", "signature": ""},
            {"type": "thinking_delta", "thinking": thought},
            {"type": "signature_delta", "signature": signature},
        ),
        *block(1, {"type": "text", "text": ""}, {"type": "text_delta", "text": text}),
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
        {"type": "message_stop"},
    ]


@attrs.define
class SealingResponses:
    """An OpenAI Responses server whose ``encrypted_content`` only it can open."""

    name: str
    """Part of every sealed content: two servers never seal alike."""
    sealed: list[str] = attrs.field(factory=list)
    refused: list[str] = attrs.field(factory=list)

    def __call__(self, request: Recorded) -> Reply:
        body = request.json()
        for item in body["input"]:
            content = item.get("encrypted_content")
            if item.get("type") == "reasoning" and content not in self.sealed:
                self.refused.append(content)
                return _refuse(
                    {
                        "error": {
                            "message": f"The encrypted content for item {item.get('id')} "
                            "could not be verified.",
                            "type": "invalid_request_error",
                            "param": None,
                            "code": "invalid_encrypted_content",
                        }
                    }
                )
        n = len(self.sealed) + 1
        content = f"enc:{self.name}:{n}"
        self.sealed.append(content)
        return Reply(body=_responses_answer(body["model"], n, content, f"answer {n}"))


def _responses_answer(model: str, n: int, content: str, text: str) -> bytes:
    summary = [{"type": "summary_text", "text": f"thought {n}"}]
    reasoning = {"id": f"rs_{n}", "type": "reasoning", "summary": summary}
    reasoning["encrypted_content"] = content
    head = {"id": f"msg_{n}", "type": "message", "role": "assistant"}
    part = {"type": "output_text", "text": text, "annotations": []}
    events: list[dict[str, Any]] = [
        {"type": "response.output_item.added", "output_index": 0, "item": reasoning},
        {"type": "response.output_item.done", "output_index": 0, "item": reasoning},
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {**head, "status": "in_progress", "content": []},
        },
        {
            "type": "response.output_text.delta",
            "item_id": head["id"],
            "output_index": 1,
            "content_index": 0,
            "delta": text,
            "logprobs": [],
        },
        {
            "type": "response.output_item.done",
            "output_index": 1,
            "item": {**head, "status": "completed", "content": [part]},
        },
    ]
    return responses_sse(model, n, events)


SENTINEL = "skip_thought_signature_validator"


@attrs.define
class SigningGemini:
    """A Gemini server whose thought signatures are bound to their model."""

    minted: dict[bytes, str] = attrs.field(factory=dict)
    """A signature's bytes -> the model it was minted for."""
    refused: list[str] = attrs.field(factory=list)
    """What was refused, in order: a signature, or ``missing`` for an unsigned call."""
    calls: int = 0
    """Answer the first this many requests with a function call (then text)."""
    answered: int = 0

    def __call__(self, request: Recorded) -> Reply:
        body = request.json()
        found = re.search(r"/models/([^/:]+):streamGenerateContent", request.path)
        assert found is not None, request.path
        model = found.group(1)
        contents = body["contents"]
        for content in contents:
            for part in content.get("parts", ()):
                sig = part.get("thoughtSignature")
                if sig is not None and sig != SENTINEL and self.minted.get(_same(sig)) != model:
                    self.refused.append(sig)
                    return _refuse_gemini("Corrupted thought signature.")
        if re.search(r"gemini-([3-9]|\d\d)", model) and _unsigned_current_call(contents):
            self.refused.append("missing")
            return _refuse_gemini(
                "Function call is missing a thought_signature in functionCall parts."
            )
        self.answered += 1
        n = self.answered
        thought_sig = base64.b64encode(f"thought:{model}:{n}".encode()).decode()
        text_sig = base64.b64encode(f"text:{model}:{n}".encode()).decode()
        self.minted[_same(thought_sig)] = self.minted[_same(text_sig)] = model
        thought = {"text": f"thought {n}", "thought": True, "thoughtSignature": thought_sig}
        if self.calls > 0:
            self.calls -= 1
            answer = {"functionCall": {"name": "lookup", "args": {"key": str(n)}}}
        else:
            answer = {"text": f"answer {n}"}
        answer["thoughtSignature"] = text_sig
        chunk = {
            "candidates": [
                {
                    "content": {"role": "model", "parts": [thought, answer]},
                    "finishReason": "STOP",
                    "index": 0,
                }
            ],
            "usageMetadata": {
                "promptTokenCount": 10,
                "candidatesTokenCount": 5,
                "totalTokenCount": 15,
            },
            "modelVersion": model,
        }
        return Reply(body=f"data: {json.dumps(chunk)}\r\n\r\n".encode())


def _same(sig: str) -> bytes:
    """A signature's bytes, whichever base64 alphabet carried them."""
    return base64.urlsafe_b64decode(sig.replace("+", "-").replace("/", "_"))


def _unsigned_current_call(contents: list[dict[str, Any]]) -> bool:
    """Whether a model content after the last user text has a first call unsigned."""
    start = 0
    for i, content in enumerate(contents):
        if content["role"] == "user" and any("text" in p for p in content["parts"]):
            start = i + 1
    for content in contents[start:]:
        calls = [p for p in content["parts"] if "functionCall" in p]
        if content["role"] == "model" and calls and "thoughtSignature" not in calls[0]:
            return True
    return False


def _refuse_gemini(message: str) -> Reply:
    return _refuse({"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}})
