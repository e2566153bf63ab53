"""The structural rules of each provider's request, as validators of a mapped history.

One function per wire format; each takes what a provider's ``map_messages`` returned and
returns the rules it breaks (an empty list: a request the API takes, as far as its
documentation and its SDK's request types say). Written from the APIs' documentation
and the errors they answer, not from the mapping code:

* Anthropic Messages: roles alternate (the provider merges, so a repeat is its bug),
  no empty content, no empty or whitespace-only text block, tool ids match
  ``^[a-zA-Z0-9_-]+$`` and names ``^[a-zA-Z0-9_-]{1,64}$``, an error ``tool_result``
  has content ("content cannot be empty if `is_error` is true"), every ``tool_use`` is
  answered by a ``tool_result`` in the very next (user) message, the results first in
  it, and no result without its call;
  ``thinking`` carries a signature (after text and tool calls too, as interleaved
  thinking writes it, but a message holding thinking starts with it and does not end
  with it); a tool loop opens with thinking when
  thinking is on and holds none when it is off; the request starts with a user message ("first
  message must use the "user" role") and ends with one (models without prefill answer
  a final assistant message with a 400; one that continues a paused answer ends it
  with no whitespace: "final assistant content cannot end with trailing whitespace",
  and its thinking is the tool loop's);
* Chat Completions: every assistant ``tool_calls`` id (1 to 40 characters; its
  function's name ``^[a-zA-Z0-9_-]{1,64}$``, checked in the history too) is
  answered by exactly one ``tool`` message among those right after it, and a ``tool``
  message answers a call of that assistant message; an assistant message has content or
  tool calls; a content list is not empty;
* Responses: a ``function_call_output`` answers an earlier unanswered ``function_call``
  (``call_id`` 1 to 64 characters, ``name`` as Chat Completions') and every call is
  answered; a reasoning item has
  encrypted content and an item after it;
* Gemini: roles ``user`` / ``model``, the first content the user's, no content
  without parts, each part one kind of
  data; a model content with function calls is followed by a user content holding only
  function responses, as many and with the same names (and ids) in order; a name is a
  declaration's (a letter or ``_`` first, then letters, digits, ``_ . : -``, at most 64).

The SDKs' own request types (the ``openai`` and ``anthropic`` TypedDicts, the
``google-genai`` pydantic ``Content``) are checked too, for field names and required
keys (:func:`sdk_errors`).
"""

from __future__ import annotations

import functools
import re
from typing import Any

_ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_GEMINI_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_.:-]{0,63}")
CHAT_ID_MAX = 40
RESPONSES_CALL_ID_MAX = 64


def _blank(text: Any) -> bool:
    return not isinstance(text, str) or not text.strip()


# -- Anthropic ------------------------------------------------------------------------------


def _blank_result(content: Any) -> bool:
    if isinstance(content, list):
        return not content
    return _blank(content)


def _loop_start(messages: list[dict[str, Any]]) -> int | None:
    """The first assistant message of the tool loop a request continues (the API's "final
    assistant message": the loop's steps and their results are one assistant turn, a
    paused answer sent back last to be continued included), or ``None`` when the
    request ends with more than tool results."""
    last = messages[-1].get("content")
    if messages[-1].get("role") == "user" and not (
        isinstance(last, list) and last and last[0].get("type") == "tool_result"
    ):
        return None
    start = None
    for i in range(len(messages) - 1, -1, -1):
        content = messages[i].get("content")
        if messages[i].get("role") == "assistant":
            start = i
        elif not (
            isinstance(content, list) and content and content[0].get("type") == "tool_result"
        ):
            break
    return start


def anthropic_errors(messages: list[dict[str, Any]], *, thinking: bool | None = None) -> list[str]:
    """``thinking``: whether the request turns extended thinking on (``None``: not
    known, neither rule below checked). On, the tool loop the request continues must
    start with a thinking block ("When `thinking` is enabled, a final `assistant`
    message must start with a thinking block (preceeding the lastmost set of `tool_use`
    and `tool_result` blocks)"); off, no message of that loop may hold one ("When
    thinking is disabled, an `assistant` message in the final position cannot contain
    `thinking`"). Thinking after text or a tool call in one message is allowed: Claude
    writes it so with interleaved thinking."""
    errs: list[str] = []
    if not messages:
        return ["no messages"]
    start = _loop_start(messages)
    if thinking is not None and start is not None:
        loop = messages[start:]
        opening = loop[0].get("content")
        first = opening[0] if isinstance(opening, list) and opening else {}
        if thinking and first.get("type") not in ("thinking", "redacted_thinking"):
            errs.append(
                f"messages.{start}.content.0.type: Expected `thinking` or `redacted_thinking`, "
                f"but found `{first.get('type')}`. When `thinking` is enabled, a final "
                "`assistant` message must start with a thinking block"
            )
        if not thinking:
            for k, msg in enumerate(loop, start):
                content = msg.get("content")
                for j, b in enumerate(content if isinstance(content, list) else []):
                    if msg.get("role") == "assistant" and b.get("type") in (
                        "thinking",
                        "redacted_thinking",
                    ):
                        errs.append(
                            f"messages.{k}.content.{j}: When thinking is disabled, an "
                            "`assistant` message in the final position cannot contain "
                            "`thinking`"
                        )
    for i, msg in enumerate(messages):
        role, content = msg.get("role"), msg.get("content")
        where = f"messages[{i}]"
        if role not in ("user", "assistant"):
            errs.append(f"{where}: role {role!r}")
        if i and messages[i - 1].get("role") == role:
            errs.append(f"{where}: role {role} repeats")
        if isinstance(content, str):
            if _blank(content):
                errs.append(f"{where}: empty or whitespace-only string content")
            blocks: list[dict[str, Any]] = []
        elif isinstance(content, list):
            if not content:
                errs.append(f"{where}: empty content list")
            blocks = content
        else:
            errs.append(f"{where}: content is {type(content).__name__}")
            continue
        for j, block in enumerate(blocks):
            kind = block.get("type")
            at = f"{where}.content[{j}]"
            if kind == "text" and _blank(block.get("text")):
                errs.append(f"{at}: empty or whitespace-only text block")
            if kind == "tool_use":
                if role != "assistant":
                    errs.append(f"{at}: tool_use in a {role} message")
                if not _ANTHROPIC_ID.match(block.get("id") or ""):
                    errs.append(f"{at}: tool_use.id {block.get('id')!r} breaks the id pattern")
                if not _NAME.fullmatch(block.get("name") or ""):
                    errs.append(f"{at}: tool_use.name {block.get('name')!r} breaks the pattern")
                if not isinstance(block.get("input"), dict):
                    errs.append(f"{at}: tool_use.input is not an object")
            if kind in ("thinking", "redacted_thinking"):
                if role != "assistant":
                    errs.append(f"{at}: {kind} in a {role} message")
                if kind == "thinking" and not block.get("signature"):
                    errs.append(f"{at}: thinking without a signature")
                if kind == "redacted_thinking" and not block.get("data"):
                    errs.append(f"{at}: redacted_thinking without data")
            if kind == "tool_result":
                if role != "user":
                    errs.append(f"{at}: tool_result in a {role} message")
                if not _ANTHROPIC_ID.match(block.get("tool_use_id") or ""):
                    errs.append(f"{at}: tool_result.tool_use_id breaks the id pattern")
                if _blank_result(block.get("content")):  # with is_error or not (Zed #27130)
                    errs.append(f"{at}: a tool_result with empty content")
        thinks = [b.get("type") in ("thinking", "redacted_thinking") for b in blocks]
        if any(thinks) and not thinks[0]:
            errs.append(
                f"{where}.content.0: If an assistant message contains any thinking blocks, "
                "the first block must be thinking or redacted_thinking."
            )
        if thinks and thinks[-1]:
            errs.append(f"{where}: The final block in an assistant message cannot be `thinking`.")
        # a server tool's use and its result go together, in the same message
        server_uses = {b.get("id") for b in blocks if b.get("type") == "server_tool_use"}
        server_results = {
            b.get("tool_use_id")
            for b in blocks
            if str(b.get("type", "")).endswith("_tool_result") and b.get("type") != "tool_result"
        }
        for missing in sorted(server_uses - server_results, key=str):
            errs.append(f"{where}: server_tool_use {missing!r} without its result block")
        # every tool_use answered in the very next message, results first there
        uses = [b["id"] for b in blocks if b.get("type") == "tool_use"]
        after = messages[i + 1] if i + 1 < len(messages) else None
        after_blocks = after.get("content") if after is not None else None
        after_blocks = after_blocks if isinstance(after_blocks, list) else []
        if uses:
            lead: list[str] = []
            for b in after_blocks:
                if b.get("type") != "tool_result":
                    break
                lead.append(b.get("tool_use_id"))
            if sorted(lead) != sorted(uses):
                errs.append(
                    f"{where}: tool_use ids {uses} answered first in the next message by {lead}"
                )
        if role == "user":
            results = [b.get("tool_use_id") for b in blocks if b.get("type") == "tool_result"]
            prev = messages[i - 1] if i else None
            prev_blocks = prev.get("content") if prev is not None else None
            prev_uses = {
                b.get("id")
                for b in (prev_blocks if isinstance(prev_blocks, list) else [])
                if b.get("type") == "tool_use"
            }
            for r in results:
                if r not in prev_uses:
                    errs.append(
                        f"{where}: tool_result {r!r} answers no tool_use of the message before"
                    )
            if len(results) != len(set(results)):
                errs.append(f"{where}: a tool_use answered twice")
    if messages[0].get("role") != "user":
        errs.append('messages: first message must use the "user" role')
    if messages[-1].get("role") != "user":
        errs.append("the request ends with an assistant message (prefill)")
        content = messages[-1].get("content")
        tail = content[-1] if isinstance(content, list) and content else {}
        text = content if isinstance(content, str) else tail.get("text")
        if isinstance(text, str) and text != text.rstrip():
            errs.append("final assistant content cannot end with trailing whitespace")
    return errs


def anthropic_params_errors(
    body: dict[str, Any], headers: dict[str, str] | None = None
) -> list[str]:
    """The rules of a Messages request's other fields with extended thinking on (the
    API's own texts): a budget of at least 1024 and below ``max_tokens`` (unless the
    request has tools and the ``interleaved-thinking-2025-05-14`` beta in its
    ``anthropic-beta`` header: ``headers``, names in lower case), ``temperature`` 1 or
    unset, no ``top_k``, ``top_p`` from 0.95, no forced tool use; and the history's
    rules."""
    betas = (headers or {}).get("anthropic-beta", "").split(",")
    interleaved = "interleaved-thinking-2025-05-14" in [b.strip() for b in betas]
    errs: list[str] = []
    thinking = body.get("thinking") or {}
    on = thinking.get("type") == "enabled"
    if on:
        budget = thinking.get("budget_tokens", 0)
        if budget < 1024:
            errs.append(
                "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
            )
        if budget >= body.get("max_tokens", 0) and not (interleaved and body.get("tools")):
            errs.append("`max_tokens` must be greater than `thinking.budget_tokens`")
        if body.get("temperature", 1) != 1:
            errs.append("`temperature` may only be set to 1 when thinking is enabled")
        if "top_k" in body:
            errs.append("`top_k` may not be set when thinking is enabled")
        if body.get("top_p", 1) < 0.95:
            errs.append("`top_p` must be greater than or equal to 0.95 when thinking is enabled")
        if (body.get("tool_choice") or {}).get("type") in ("any", "tool"):
            errs.append("Thinking may not be enabled when tool_choice forces tool use.")
    return errs + anthropic_errors(body["messages"], thinking=on)


# -- Chat Completions -----------------------------------------------------------------------


def chat_errors(messages: list[dict[str, Any]]) -> list[str]:
    errs: list[str] = []
    i, n = 0, len(messages)
    while i < n:
        msg = messages[i]
        role = msg.get("role")
        where = f"messages[{i}]"
        content = msg.get("content")
        if isinstance(content, list) and not content:
            errs.append(f"{where}: empty content list")
        if role == "tool":
            errs.append(
                f"{where}: tool message {msg.get('tool_call_id')!r} answers no call before it"
            )
            i += 1
            continue
        if role == "assistant":
            calls = msg.get("tool_calls") or []
            if content is None and not calls:
                errs.append(f"{where}: assistant message with neither content nor tool_calls")
            ids = [c["id"] for c in calls]
            for c in ids:
                if not 0 < len(c) <= CHAT_ID_MAX:
                    errs.append(
                        f"{where}: tool_calls id of {len(c)} characters (1 to {CHAT_ID_MAX})"
                    )
            for c in calls:
                name = (c.get("function") or {}).get("name") or ""
                if not _NAME.fullmatch(name):
                    errs.append(f"{where}: tool_calls function name {name!r} breaks the pattern")
            if len(ids) != len(set(ids)):
                errs.append(f"{where}: two tool_calls with one id")
            j = i + 1
            answered: list[str] = []
            while j < n and messages[j].get("role") == "tool":
                answered.append(messages[j].get("tool_call_id"))
                if not isinstance(messages[j].get("content"), str):
                    errs.append(f"messages[{j}]: tool content is not text")
                j += 1
            if sorted(answered) != sorted(ids):
                errs.append(f"{where}: tool_calls {ids} answered by {answered}")
            i = j
            continue
        if role not in ("system", "user", "developer"):
            errs.append(f"{where}: role {role!r}")
        i += 1
    return errs


# -- Responses ------------------------------------------------------------------------------


_CLIENT_CALLS = {  # a call item the client answers: (its key, the answer's type)
    "custom_tool_call": ("call_id", "custom_tool_call_output"),
    "shell_call": ("call_id", "shell_call_output"),
    "local_shell_call": ("call_id", "local_shell_call_output"),
    "apply_patch_call": ("call_id", "apply_patch_call_output"),
    "computer_call": ("call_id", "computer_call_output"),
    "tool_search_call": ("call_id", "tool_search_output"),  # when execution is "client"
    "mcp_approval_request": ("id", "mcp_approval_response"),
}
_CLIENT_ANSWERS = {  # an answer item: the key naming the call it answers
    "function_call_output": "call_id",
    "custom_tool_call_output": "call_id",
    "shell_call_output": "call_id",
    "local_shell_call_output": "call_id",
    "apply_patch_call_output": "call_id",
    "computer_call_output": "call_id",
    "tool_search_output": "call_id",
    "mcp_approval_response": "approval_request_id",
}


def responses_errors(items: list[dict[str, Any]]) -> list[str]:
    errs: list[str] = []
    open_calls: dict[str, int] = {}
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            content = item.get("content")
            if isinstance(content, list) and not content:
                errs.append(f"{where}: empty content list")
            if item.get("role") not in ("user", "assistant", "system", "developer"):
                errs.append(f"{where}: role {item.get('role')!r}")
        elif kind == "function_call":
            call_id = item.get("call_id") or ""
            if not 0 < len(call_id) <= RESPONSES_CALL_ID_MAX:
                errs.append(f"{where}: call_id of {len(call_id)} characters")
            if not _NAME.fullmatch(item.get("name") or ""):
                errs.append(f"{where}: function_call name {item.get('name')!r} breaks the pattern")
            if call_id in open_calls:
                errs.append(f"{where}: call_id {call_id!r} of an unanswered call used again")
            open_calls[call_id] = i
        elif kind in _CLIENT_CALLS and (
            kind != "tool_search_call" or item.get("execution") == "client"
        ):  # answered like a function call, by its own type
            call_id = item.get(_CLIENT_CALLS[kind][0]) or ""
            if call_id in open_calls:
                errs.append(f"{where}: call_id {call_id!r} used again")
            open_calls[call_id] = i
        elif kind in _CLIENT_ANSWERS and not (
            kind == "tool_search_output" and item.get("execution") == "server"
        ):
            call_id = item.get(_CLIENT_ANSWERS[kind])
            if call_id is None and kind == "local_shell_call_output":
                call_id = item.get("id")
            if call_id not in open_calls:
                errs.append(f"{where}: output for {call_id!r}, no unanswered call before")
            elif _CLIENT_CALLS.get(items[open_calls[call_id]].get("type"), ("", kind))[1] != kind:
                errs.append(f"{where}: a {kind} answers a {items[open_calls[call_id]]['type']}")
            else:
                del open_calls[call_id]
        elif kind == "reasoning":
            if not item.get("encrypted_content"):
                errs.append(f"{where}: reasoning item without encrypted_content (store=False)")
            following = items[i + 1] if i + 1 < len(items) else None
            if (
                following is None
                or following.get("role") == "user"
                or (following.get("type") == "function_call_output")
            ):
                errs.append(f"{where}: reasoning item without its following output item")
    for call_id, at in open_calls.items():
        errs.append(f"{items[at].get('type')} {call_id!r} has no output")
    return errs


# -- Gemini ---------------------------------------------------------------------------------

_GEMINI_DATA = (
    "text",
    "function_call",
    "function_response",
    "inline_data",
    "file_data",
    "executable_code",
    "code_execution_result",
)


def gemini_errors(contents: list[dict[str, Any]]) -> list[str]:
    errs: list[str] = []
    for i, content in enumerate(contents):
        where = f"contents[{i}]"
        role, parts = content.get("role"), content.get("parts")
        if role not in ("user", "model"):
            errs.append(f"{where}: role {role!r}")
        if not parts:
            errs.append(f"{where}: no parts")
            continue
        for j, part in enumerate(parts):
            data = [k for k in _GEMINI_DATA if k in part]
            if len(data) != 1:
                errs.append(f"{where}.parts[{j}]: data fields {data}")
        calls = [p["function_call"] for p in parts if "function_call" in p]
        responses = [p["function_response"] for p in parts if "function_response" in p]
        for named in calls + responses:
            if not _GEMINI_NAME.fullmatch(named.get("name") or ""):
                errs.append(f"{where}: function name {named.get('name')!r} breaks the pattern")
        if calls and role != "model":
            errs.append(f"{where}: function_call in a {role} content")
        if responses:
            prev = contents[i - 1] if i else {}
            prev_calls = [p["function_call"] for p in prev.get("parts", ()) if "function_call" in p]
            if role != "user" or not prev_calls:
                errs.append(f"{where}: function responses not right after function calls")
            if len(responses) != len(parts):
                errs.append(f"{where}: function responses mixed with other parts")
        if calls:
            after = contents[i + 1] if i + 1 < len(contents) else {}
            got = [
                p["function_response"] for p in after.get("parts", ()) if "function_response" in p
            ]
            if [c.get("name") for c in calls] != [r.get("name") for r in got]:
                errs.append(
                    f"{where}: calls {[c.get('name') for c in calls]} answered by "
                    f"{[r.get('name') for r in got]}"
                )
            elif [c.get("id") for c in calls] != [r.get("id") for r in got]:
                errs.append(
                    f"{where}: call ids {[c.get('id') for c in calls]} answered by other ids"
                )
    for i in range(1, len(contents)):
        before, now = contents[i - 1], contents[i]
        responses = ["function_response" in p for c in (before, now) for p in c.get("parts", ())]
        if before.get("role") == now.get("role") and (
            now.get("role") == "model" or not any(responses)
        ):  # only a content of function responses may have a user content after it
            errs.append(f"contents[{i}]: a second {now.get('role')} content in a row")
    if contents and contents[0].get("role") != "user":
        errs.append("the contents start with a model content (multiturn: user first)")
    if contents and contents[-1].get("role") != "user":
        errs.append("the contents end with a model content")
    return errs


# -- the SDKs' request types ----------------------------------------------------------------


@functools.cache
def _adapter(kind: str) -> Any:
    from pydantic import TypeAdapter

    if kind == "anthropic":
        from anthropic.types import MessageParam

        return TypeAdapter(list[MessageParam])
    if kind == "chat":
        from openai.types.chat import ChatCompletionMessageParam

        return TypeAdapter(list[ChatCompletionMessageParam])
    if kind == "responses":
        from openai.types.responses import ResponseInputParam

        return TypeAdapter(ResponseInputParam)
    from google.genai import types

    return TypeAdapter(list[types.Content])


def sdk_errors(kind: str, payload: list[dict[str, Any]]) -> list[str]:
    """What the SDK's request type for ``kind`` (``anthropic``, ``chat``, ``responses``,
    ``gemini``) says of ``payload``: missing required keys, wrong literals, unknown
    fields where the type forbids them."""
    from pydantic import ValidationError

    try:
        _adapter(kind).validate_python(payload)
    except ValidationError as exc:
        return [f"{kind} SDK type: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"]
    return []
