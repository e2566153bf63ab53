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
  for content of another organization.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from tests.support.loopback import Recorded, Reply, anthropic_sse


def _refuse(error: dict[str, Any]) -> Reply:
    return Reply(status=400, content_type="application/json", body=json.dumps(error).encode())


@attrs.define
class SigningAnthropic:
    """An Anthropic Messages server whose thinking signatures are bound to their model."""

    minted: dict[str, str] = attrs.field(factory=dict)
    """Signature -> the model it was minted for."""
    refused: list[str] = attrs.field(factory=list)
    """The signatures refused, in order."""

    def __call__(self, request: Recorded) -> Reply:
        body = request.json()
        refusal = self.refusal(body)
        if refusal is not None:
            return refusal
        n, signature = self.mint(body["model"])
        return Reply(
            body=_anthropic_answer(body["model"], f"thought {n}", signature, f"answer {n}")
        )

    def refusal(self, body: dict[str, Any]) -> Reply | None:
        """The 400 for a request that replays a thinking block whose signature was not
        minted here for the model it asks for; ``None`` when every signature is valid."""
        model = body["model"]
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


def _anthropic_answer(model: str, thought: str, signature: str, text: str) -> bytes:
    def block(index: int, start: dict[str, Any], *deltas: dict[str, Any]) -> list[dict]:
        return [
            {"type": "content_block_start", "index": index, "content_block": start},
            *({"type": "content_block_delta", "index": index, "delta": d} for d in deltas),
            {"type": "content_block_stop", "index": index},
        ]

    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }
    return anthropic_sse(
        {"type": "message_start", "message": message},
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
    )


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
    response = {
        "id": f"resp_{n}",
        "object": "response",
        "created_at": 1,
        "model": model,
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
    usage = {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    }
    summary = [{"type": "summary_text", "text": f"thought {n}"}]
    reasoning = {"id": f"rs_{n}", "type": "reasoning", "summary": summary}
    reasoning["encrypted_content"] = content
    head = {"id": f"msg_{n}", "type": "message", "role": "assistant"}
    part = {"type": "output_text", "text": text, "annotations": []}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {**response, "status": "in_progress"}},
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
        {
            "type": "response.completed",
            "response": {**response, "status": "completed", "usage": usage},
        },
    ]
    return "".join(
        f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': i})}\n\n"
        for i, e in enumerate(events)
    ).encode()
