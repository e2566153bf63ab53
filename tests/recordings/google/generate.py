"""Writes the ``*.sse`` bodies of this folder (``python3 generate.py``); see README.md.

Each body is what ``POST /v1/models/{model}:streamGenerateContent?alt=sse`` answers:
one ``data: <GenerateContentResponse json>`` per chunk, events separated by ``\\r\\n\\r\\n``
as Google's servers write them, no ``[DONE]``: the stream ends after the chunk with a
``finishReason``. An error after the stream started is one more ``data:`` line holding
``{"error": {"code", "message", "status"}}``. Field names are the API's camelCase, bytes
(``thoughtSignature``) base64. Nothing here was recorded from a live API: the texts,
ids, signatures and counts are made up, in the shapes the ``google-genai`` SDK's types
(``GenerateContentResponse``, ``Candidate``, ``Content``, ``Part``,
``GenerateContentResponseUsageMetadata``) and its converters
(``_GenerateContentResponse_from_mldev``) read.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODEL = "gemini-2.5-flash"
RESPONSE_ID = "mC1daOq8Lb2Dz7IPuPzqkQg"


def signature(n: int) -> str:
    """A made-up thought signature: opaque bytes, base64 on the wire."""
    return base64.b64encode(
        f"\x12\x0bgemini-sig-{n}\x1a\x04\xfe\xff\x00{n}".encode("latin-1")
    ).decode()


def usage(prompt: int, candidates: int | None = None, thoughts: int | None = None) -> dict:
    out: dict[str, Any] = {"promptTokenCount": prompt}
    if candidates is not None:
        out["candidatesTokenCount"] = candidates
    if thoughts is not None:
        out["thoughtsTokenCount"] = thoughts
    out["totalTokenCount"] = prompt + (candidates or 0) + (thoughts or 0)
    out["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": prompt}]
    return out


def chunk(
    parts: list[dict[str, Any]] | None,
    *,
    finish: str | None = None,
    use: dict[str, Any] | None = None,
    **candidate: Any,
) -> dict[str, Any]:
    cand: dict[str, Any] = {}
    if parts is not None:
        cand["content"] = {"parts": parts, "role": "model"}
    if finish is not None:
        cand["finishReason"] = finish
    cand.update(candidate)
    cand["index"] = 0
    out: dict[str, Any] = {"candidates": [cand]}
    if use is not None:
        out["usageMetadata"] = use
    out["modelVersion"] = MODEL
    out["responseId"] = RESPONSE_ID
    return out


def body(*events: dict[str, Any]) -> str:
    return "".join(f"data: {json.dumps(e, ensure_ascii=False)}\r\n\r\n" for e in events)


FILES: dict[str, str] = {
    "text.sse": body(
        chunk([{"text": "Hello"}], use=usage(8)),
        chunk([{"text": ", wor"}], use=usage(8)),
        chunk([{"text": "ld! It is 21°C."}], finish="STOP", use=usage(8, 9)),
    ),
    "thought-summary.sse": body(
        chunk(
            [{"text": "**Adding numbers**\n\nThe user asks for 2+2.", "thought": True}],
            use=usage(12),
        ),
        chunk([{"text": " That is 4.", "thought": True}], use=usage(12)),
        chunk([{"text": "2 + 2 = "}], use=usage(12)),
        chunk(
            [{"text": "4", "thoughtSignature": signature(1)}],
            finish="STOP",
            use=usage(12, 6, 40),
        ),
    ),
    "function-call-signed.sse": body(
        chunk([{"text": "**Checking the weather**", "thought": True}], use=usage(30)),
        chunk(
            [
                {
                    "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                    "thoughtSignature": signature(2),
                }
            ],
            finish="STOP",
            use=usage(30, 7, 52),
        ),
    ),
    "parallel-function-calls.sse": body(
        chunk(
            [
                {
                    "functionCall": {
                        "id": "fc-1a2b",
                        "name": "get_weather",
                        "args": {"city": "Paris"},
                    },
                    "thoughtSignature": signature(3),
                },
                {
                    "functionCall": {
                        "id": "fc-3c4d",
                        "name": "get_time",
                        "args": {"tz": "Europe/Paris"},
                    }
                },
            ],
            finish="STOP",
            use=usage(30, 14, 21),
        ),
    ),
    "signature-empty-part.sse": body(
        chunk([{"text": "The capital of France"}], use=usage(9)),
        chunk([{"text": " is Paris."}], use=usage(9)),
        chunk([{"text": "", "thoughtSignature": signature(4)}], finish="STOP", use=usage(9, 7, 18)),
    ),
    "max-tokens.sse": body(
        chunk([{"text": "Once upon a time"}], use=usage(5)),
        chunk([{"text": " there was"}], finish="MAX_TOKENS", use=usage(5, 6, 250)),
    ),
    "safety.sse": body(
        chunk([{"text": "I can"}], use=usage(7)),
        chunk(
            None,
            finish="SAFETY",
            use=usage(7, 2),
            safetyRatings=[
                {
                    "category": "HARM_CATEGORY_DANGEROUS_CONTENT",
                    "probability": "HIGH",
                    "blocked": True,
                }
            ],
        ),
    ),
    "prompt-blocked.sse": body(
        {
            "promptFeedback": {
                "blockReason": "PROHIBITED_CONTENT",
            },
            "usageMetadata": usage(11),
            "modelVersion": MODEL,
            "responseId": RESPONSE_ID,
        }
    ),
    "overloaded-midstream.sse": body(
        chunk([{"text": "Partial "}], use=usage(6)),
        chunk([{"text": "answer"}], use=usage(6)),
        {
            "error": {
                "code": 503,
                "message": "The model is overloaded. Please try again later.",
                "status": "UNAVAILABLE",
            }
        },
    ),
    "cut-no-finish.sse": body(
        chunk([{"text": "Never "}], use=usage(4)),
        chunk([{"text": "finished"}], use=usage(4)),
    ),
    "code-execution.sse": body(
        chunk(
            [
                {
                    "executableCode": {
                        "language": "PYTHON",
                        "code": "print(sum(range(1, 101)))",
                    }
                }
            ],
            use=usage(20),
        ),
        chunk(
            [{"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "5050\n"}}],
            use=usage(20),
        ),
        chunk([{"text": "The sum is 5050."}], finish="STOP", use=usage(20, 30)),
    ),
    "malformed-function-call.sse": body(
        chunk(None, finish="MALFORMED_FUNCTION_CALL", use=usage(25, 0)),
    ),
}


def main() -> None:
    for name, text in FILES.items():
        (HERE / name).write_text(text, encoding="utf-8", newline="")


if __name__ == "__main__":
    main()
