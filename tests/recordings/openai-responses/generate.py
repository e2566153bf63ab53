"""Writes the ``*.sse`` bodies of this folder (``python3 generate.py``); see README.md.

Each body is the event sequence that ``openai`` (``types/responses``: the
``ResponseStreamEvent`` union) defines for ``client.responses.create(stream=True)``:
``event: <type>`` and ``data: <event json>`` per event, every event with its
``sequence_number``, no ``[DONE]`` line (the Responses stream ends after its terminal
event). Nothing here was recorded from a live API; the ids, texts and encrypted blobs
are made up, in the shapes the SDK's types declare.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODEL = "gpt-5-mini-2025-08-07"
ENC = "gAAAAABoZ0ENCRYPTED-{n}-" + "Qk9HVVMtUkVBU09OSU5HLUJMT0I" * 3


def response(status: str, output: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "id": "resp_0a1b2c3d4e5f",
        "object": "response",
        "created_at": 1735689600,
        "status": status,
        "model": MODEL,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "store": False,
        "instructions": None,
        "metadata": {},
        "reasoning": {"effort": "medium", "summary": "auto"},
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "error": None,
        "incomplete_details": None,
        "usage": None,
        **extra,
    }


def usage(inp: int, out: int, *, cached: int = 0, reasoning: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": inp,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": inp + out,
    }


class Body:
    """Builds one stream; ``add`` numbers the events."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.output: list[dict[str, Any]] = []
        self.add("response.created", response=response("in_progress", []))
        self.add("response.in_progress", response=response("in_progress", []))

    def add(self, type_: str, **fields: Any) -> None:
        self.events.append({"type": type_, **fields, "sequence_number": len(self.events)})

    def reasoning(self, item_id: str, summaries: list[list[str]], n: int) -> None:
        index = len(self.output)
        head = {"id": item_id, "type": "reasoning", "summary": []}
        self.add(
            "response.output_item.added",
            output_index=index,
            item={**head, "encrypted_content": None},
        )
        done_summary = []
        for s_index, pieces in enumerate(summaries):
            ids = {"item_id": item_id, "output_index": index, "summary_index": s_index}
            self.add(
                "response.reasoning_summary_part.added",
                **ids,
                part={"type": "summary_text", "text": ""},
            )
            for piece in pieces:
                self.add("response.reasoning_summary_text.delta", **ids, delta=piece)
            text = "".join(pieces)
            self.add("response.reasoning_summary_text.done", **ids, text=text)
            self.add(
                "response.reasoning_summary_part.done",
                **ids,
                part={"type": "summary_text", "text": text},
            )
            done_summary.append({"type": "summary_text", "text": text})
        item = {**head, "summary": done_summary, "encrypted_content": ENC.format(n=n)}
        self.add("response.output_item.done", output_index=index, item=item)
        self.output.append(item)

    def message(
        self, item_id: str, pieces: list[str], *, annotations: list[dict] | None = None
    ) -> None:
        index = len(self.output)
        head = {"id": item_id, "type": "message", "role": "assistant"}
        self.add(
            "response.output_item.added",
            output_index=index,
            item={**head, "status": "in_progress", "content": []},
        )
        ids = {"item_id": item_id, "output_index": index, "content_index": 0}
        self.add(
            "response.content_part.added",
            **ids,
            part={"type": "output_text", "text": "", "annotations": []},
        )
        for piece in pieces:
            self.add("response.output_text.delta", **ids, delta=piece, logprobs=[])
        text = "".join(pieces)
        for a_index, annotation in enumerate(annotations or ()):
            self.add(
                "response.output_text.annotation.added",
                **ids,
                annotation_index=a_index,
                annotation=annotation,
            )
        self.add("response.output_text.done", **ids, text=text, logprobs=[])
        part = {"type": "output_text", "text": text, "annotations": annotations or []}
        self.add("response.content_part.done", **ids, part=part)
        item = {**head, "status": "completed", "content": [part]}
        self.add("response.output_item.done", output_index=index, item=item)
        self.output.append(item)

    def refusal(self, item_id: str, pieces: list[str]) -> None:
        index = len(self.output)
        head = {"id": item_id, "type": "message", "role": "assistant"}
        self.add(
            "response.output_item.added",
            output_index=index,
            item={**head, "status": "in_progress", "content": []},
        )
        ids = {"item_id": item_id, "output_index": index, "content_index": 0}
        self.add("response.content_part.added", **ids, part={"type": "refusal", "refusal": ""})
        for piece in pieces:
            self.add("response.refusal.delta", **ids, delta=piece)
        text = "".join(pieces)
        self.add("response.refusal.done", **ids, refusal=text)
        self.add("response.content_part.done", **ids, part={"type": "refusal", "refusal": text})
        item = {**head, "status": "completed", "content": [{"type": "refusal", "refusal": text}]}
        self.add("response.output_item.done", output_index=index, item=item)
        self.output.append(item)

    def call(
        self, item_id: str, call_id: str, name: str, pieces: list[str], *, done: bool = True
    ) -> None:
        index = len(self.output)
        head = {"id": item_id, "type": "function_call", "call_id": call_id, "name": name}
        self.add(
            "response.output_item.added",
            output_index=index,
            item={**head, "arguments": "", "status": "in_progress"},
        )
        for piece in pieces:
            self.add(
                "response.function_call_arguments.delta",
                item_id=item_id,
                output_index=index,
                delta=piece,
            )
        if not done:
            return
        args = "".join(pieces)
        self.add(
            "response.function_call_arguments.done",
            item_id=item_id,
            output_index=index,
            arguments=args,
        )
        item = {**head, "arguments": args, "status": "completed"}
        self.add("response.output_item.done", output_index=index, item=item)
        self.output.append(item)

    def web_search(self, item_id: str, query: str) -> None:
        index = len(self.output)
        ids = {"item_id": item_id, "output_index": index}
        self.add(
            "response.output_item.added",
            output_index=index,
            item={
                "id": item_id,
                "type": "web_search_call",
                "status": "in_progress",
                "action": {"type": "search"},
            },
        )
        self.add("response.web_search_call.in_progress", **ids)
        self.add("response.web_search_call.searching", **ids)
        self.add("response.web_search_call.completed", **ids)
        item = {
            "id": item_id,
            "type": "web_search_call",
            "status": "completed",
            "action": {"type": "search", "query": query},
        }
        self.add("response.output_item.done", output_index=index, item=item)
        self.output.append(item)

    def end(self, status: str, **extra: Any) -> None:
        self.add(f"response.{status}", response=response(status, self.output, **extra))

    def write(self, name: str) -> None:
        text = "".join(
            f"event: {e['type']}\ndata: {json.dumps(e, ensure_ascii=False)}\n\n"
            for e in self.events
        )
        (HERE / name).write_text(text, encoding="utf-8")


def main() -> None:
    b = Body()
    b.message("msg_text0001", ["Bonjour", " — ça va", " très bien", " 🙂."])
    b.end("completed", usage=usage(19, 9, cached=12))
    b.write("text.sse")

    b = Body()
    b.reasoning(
        "rs_reason001",
        [
            [
                "**Checking the weather**\n\n",
                "The user wants Paris;",
                " I should call get_weather.",
            ],
            ["**Choosing units**\n\n", "Celsius is the default."],
        ],
        n=1,
    )
    b.call("fc_call00001", "call_Weather01", "get_weather", ['{"ci', 'ty": "Pa', 'ris"}'])
    b.end("completed", usage=usage(80, 64, reasoning=48))
    b.write("reasoning-function-call.sse")

    b = Body()
    b.reasoning("rs_parallel1", [], n=2)
    b.call("fc_parA00001", "call_ParA0001", "get_weather", ['{"city":', '"Paris"}'])
    b.call("fc_parB00002", "call_ParB0002", "get_time", ['{"tz":"Eur', 'ope/Paris"}'])
    b.end("completed", usage=usage(61, 40, reasoning=20))
    b.write("parallel-function-calls.sse")

    b = Body()
    b.web_search("ws_search001", "trio structured concurrency")
    citation = {
        "type": "url_citation",
        "start_index": 0,
        "end_index": 4,
        "url": "https://trio.readthedocs.io/",
        "title": "Trio",
    }
    b.message("msg_cited001", ["Trio", " uses nurseries."], annotations=[citation])
    b.end("completed", usage=usage(300, 25))
    b.write("web-search-call.sse")

    b = Body()
    b.message("msg_long0001", ["Saving", " the note."])
    b.call(
        "fc_trunc0001",
        "call_Trunc001",
        "write_file",
        ['{"path": "notes.txt", "text": "Once up'],
        done=False,
    )
    b.end("incomplete", incomplete_details={"reason": "max_output_tokens"}, usage=usage(40, 64))
    b.write("incomplete-max-output-tokens.sse")

    b = Body()
    b.refusal("msg_refuse01", ["I'm sorry,", " I can't help", " with that."])
    b.end("completed", usage=usage(40, 9))
    b.write("refusal.sse")

    b = Body()
    b.events = b.events[:1]
    b.message("msg_failed01", ["The answer", " is"])
    error = {"code": "server_error", "message": "The server had an error processing your request."}
    b.end("failed", error=error)
    b.write("failed-server-error.sse")

    b = Body()
    b.events = b.events[:1]
    b.add(
        "response.output_item.added",
        output_index=0,
        item={
            "id": "msg_err00001",
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        },
    )
    b.add(
        "response.output_text.delta",
        item_id="msg_err00001",
        output_index=0,
        content_index=0,
        delta="Let me think",
        logprobs=[],
    )
    b.add(
        "error",
        code="rate_limit_exceeded",
        message="Rate limit reached for gpt-5-mini on tokens per min.",
        param=None,
    )
    b.write("error-event.sse")

    b = Body()
    b.message("msg_cut00001", ["Once", " upon", " a time"])
    b.events = [
        e
        for e in b.events
        if e["type"]
        not in (
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
        )
    ]
    b.write("cut-no-terminal-event.sse")


if __name__ == "__main__":
    main()
