"""SSE bodies in the providers' wire formats, generated here (deterministic, no fixtures).

Both the loopback server (which serves them) and the benchmarks (which know how many
deltas to expect) build them from the same parameters, so the two sides of every
comparison read exactly the same bytes.
"""

from __future__ import annotations

import json
import random
import string

# Word-sized deltas like a model's; no "<" so the think-tag splitter sees plain text
# (its fast path), as it does for almost all real answers.
_WORDS = (
    " the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", ",",
    " and", " then", " it", " runs", " back", " home", " again", ".", " Weather", " in",
    " Paris", " is", " sunny", " today", " with", " 21", "°C", " light", " wind", "!",
)  # fmt: skip


def delta_texts(n: int) -> list[str]:
    """The ``n`` text deltas every body of ``n`` deltas carries, in order."""
    return [_WORDS[i % len(_WORDS)] for i in range(n)]


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def openai_body(n: int) -> bytes:
    """A Chat Completions stream (``stream_options.include_usage``) of ``n`` text deltas.

    Shaped like api.openai.com's: a role chunk, one chunk per delta with ``usage: null``,
    a finish chunk, the trailing usage chunk with empty ``choices``, then ``[DONE]``; every
    chunk ends with the API's ``obfuscation`` field, a random padding string of 0 to 15
    letters and digits (as in a real recording), here from a fixed seed.
    """
    rng = random.Random(20260101)
    alphabet = string.ascii_letters + string.digits

    def padding() -> str:
        return "".join(rng.choices(alphabet, k=rng.randrange(16)))

    head = {
        "id": "chatcmpl-BENCH000000000000000000000",
        "object": "chat.completion.chunk",
        "created": 1735689600,
        "model": "gpt-4o-mini-2024-07-18",
        "service_tier": "default",
        "system_fingerprint": "fp_bench0001",
    }

    def chunk(delta: dict, finish: str | None = None, **extra: object) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        doc = {**head, "choices": [choice], "usage": None, **extra, "obfuscation": padding()}
        return "data: " + _dumps(doc) + "\n\n"

    out = [chunk({"role": "assistant", "content": "", "refusal": None})]
    out += [chunk({"content": t}) for t in delta_texts(n)]
    out.append(chunk({}, "stop"))
    usage = {
        "prompt_tokens": 25,
        "completion_tokens": n,
        "total_tokens": 25 + n,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }
    last = {**head, "choices": [], "usage": usage, "obfuscation": padding()}
    out.append("data: " + _dumps(last) + "\n\n")
    out.append("data: [DONE]\n\n")
    return "".join(out).encode()


def anthropic_body(n: int) -> bytes:
    """A Messages API stream of one text block of ``n`` deltas (with a ping), ``end_turn``."""

    def event(obj: dict, spaced: bool = False) -> str:
        data = json.dumps(obj) if spaced else _dumps(obj)
        return f"event: {obj['type']}\ndata: {data}\n\n"

    message = {
        "id": "msg_01BENCH00000000000000000",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 25,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 1,
            "service_tier": "standard",
        },
    }
    out = [event({"type": "message_start", "message": message})]
    out.append(
        event(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            }
        )
    )
    out.append(event({"type": "ping"}, spaced=True))
    for t in delta_texts(n):
        delta = {"type": "text_delta", "text": t}
        out.append(event({"type": "content_block_delta", "index": 0, "delta": delta}))
    out.append(event({"type": "content_block_stop", "index": 0}))
    out.append(
        event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": n},
            }
        )
    )
    out.append(event({"type": "message_stop"}))
    return "".join(out).encode()


def gemini_body(n: int) -> bytes:
    """A ``streamGenerateContent?alt=sse`` stream of ``n`` text deltas, shaped like the
    Gemini API's: one chunk per delta (its candidate, the running ``usageMetadata``, the
    model version and response id), the last with ``finishReason``; CRLF framing."""

    def chunk(parts: list[dict], k: int, finish: str | None = None) -> str:
        candidate: dict = {"content": {"parts": parts, "role": "model"}, "index": 0}
        if finish is not None:
            candidate["finishReason"] = finish
        usage = {
            "promptTokenCount": 25,
            "candidatesTokenCount": k,
            "totalTokenCount": 25 + k,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 25}],
        }
        obj = {
            "candidates": [candidate],
            "usageMetadata": usage,
            "modelVersion": "gemini-2.5-flash",
            "responseId": "BENCHgemini000000000000",
        }
        return "data: " + _dumps(obj) + "\r\n\r\n"

    out = [chunk([{"text": t}], k + 1) for k, t in enumerate(delta_texts(n))]
    out.append(chunk([{"text": ""}], n, "STOP"))
    return "".join(out).encode()


BODIES = {"openai": openai_body, "anthropic": anthropic_body, "gemini": gemini_body}


def body(fmt: str, n: int) -> bytes:
    return BODIES[fmt](n)


def split_events(data: bytes) -> list[bytes]:
    """The body cut after each SSE event (blank-line terminated: LF, or CRLF as
    Gemini's), bytes unchanged."""
    end = b"\r\n\r\n" if b"\r\n\r\n" in data[:4096] else b"\n\n"
    parts = data.split(end)
    return [p + end for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
