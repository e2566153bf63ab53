"""Responses output items that wait for the client's answer (a shell, local shell,
apply_patch or computer call, a client tool search, an MCP approval request: tools given
in ``request_options``, which no Axon tool runs): kept, never run, and answered as not
run in the next request, so the API takes it. Through the real ``openai`` client on a
loopback server; the items checked against the SDK's ``ResponseOutputItem`` union, the
next request's input against its ``ResponseInputParam`` and the API's pairing rules."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter

from actors.providers import openai_responses
from actors.providers.openai_responses import PROVIDER
from runtime.chunks import ProviderDataChunk
from runtime.messages import AssistantMessage, ProviderDataPart, UserMessage
from tests.support import wire_rules
from tests.support.loopback import Reply
from tests.test_provider_openai_responses import (
    added,
    body,
    completed,
    created,
    done,
    make_request,
    run,
)

CALLER = {"type": "program", "caller_id": "call_prog_1"}
SHELL = {
    "type": "shell_call",
    "id": "sh_01",
    "call_id": "call_shell_1",
    "action": {"commands": ["ls -la"], "timeout_ms": 1000},
    "status": "completed",
    "caller": CALLER,
}
LOCAL_SHELL = {
    "type": "local_shell_call",
    "id": "lsh_01",
    "call_id": "call_local_1",
    "action": {"type": "exec", "command": ["ls"], "env": {}},
    "status": "completed",
}
APPLY_PATCH = {
    "type": "apply_patch_call",
    "id": "apc_01",
    "call_id": "call_patch_1",
    "operation": {"type": "update_file", "path": "a.py", "diff": "@@\n-a = 1\n+a = 2\n"},
    "status": "completed",
}
COMPUTER = {
    "type": "computer_call",
    "id": "cu_01",
    "call_id": "call_computer_1",
    "action": {"type": "click", "button": "left", "x": 10, "y": 20},
    "pending_safety_checks": [{"id": "cu_sc_1", "code": "malicious_instructions"}],
    "status": "completed",
}
TOOL_SEARCH = {
    "type": "tool_search_call",
    "id": "ts_01",
    "call_id": "call_search_1",
    "arguments": {"query": "weather"},
    "execution": "client",
    "status": "completed",
}
MCP_APPROVAL = {
    "type": "mcp_approval_request",
    "id": "mcpr_01",
    "arguments": '{"path": "/"}',
    "name": "delete_files",
    "server_label": "files",
}
NOT_RUN = openai_responses.CLIENT_CALL_NOT_RUN.format

ANSWERS: dict[str, list[dict[str, Any]]] = {
    "shell_call": [
        {
            "type": "shell_call_output",
            "call_id": "call_shell_1",
            "output": [
                {
                    "stdout": "",
                    "stderr": NOT_RUN(kind="shell"),
                    "outcome": {"type": "exit", "exit_code": 1},
                }
            ],
            "caller": CALLER,
        }
    ],
    "local_shell_call": [
        {
            "type": "local_shell_call_output",
            "id": "call_local_1",
            "call_id": "call_local_1",
            "output": NOT_RUN(kind="local shell"),
        }
    ],
    "apply_patch_call": [
        {
            "type": "apply_patch_call_output",
            "call_id": "call_patch_1",
            "status": "failed",
            "output": NOT_RUN(kind="apply_patch"),
        }
    ],
    "computer_call": [
        {
            "type": "computer_call_output",
            "call_id": "call_computer_1",
            "output": {
                "type": "computer_screenshot",
                "image_url": openai_responses.BLANK_SCREENSHOT,
            },
        },
        {
            "role": "developer",
            "content": f"computer_call call_computer_1: {NOT_RUN(kind='computer')}",
        },
    ],
    "tool_search_call": [
        {
            "type": "tool_search_output",
            "call_id": "call_search_1",
            "execution": "client",
            "status": "completed",
            "tools": [],
        },
        {
            "role": "developer",
            "content": f"tool_search_call call_search_1: {NOT_RUN(kind='tool search')}",
        },
    ],
    "mcp_approval_request": [
        {
            "type": "mcp_approval_response",
            "approval_request_id": "mcpr_01",
            "approve": False,
            "reason": (
                "Not approved: this application does not answer MCP approval requests, "
                "so the MCP tool call was not run."
            ),
        }
    ],
}
ITEMS = [SHELL, LOCAL_SHELL, APPLY_PATCH, COMPUTER, TOOL_SEARCH, MCP_APPROVAL]


def item_events(item: dict[str, Any]) -> list[dict[str, Any]]:
    head = {**item, "status": "in_progress"} if "status" in item else item
    return [created(), added(0, head), done(0, item), completed()]


def test_the_items_are_ones_the_sdk_knows_and_every_client_call_is_covered():
    from openai.types.responses import ResponseOutputItem, ResponseStreamEvent

    events = TypeAdapter(ResponseStreamEvent)
    for item in ITEMS:
        for n, event in enumerate(item_events(item)[1:-1]):
            assert events.validate_python({**event, "sequence_number": n}).type == event["type"]
    # every output item of the installed SDK whose name says the client answers it (a
    # call with a *_output item, an approval request) is answered or run by Axon
    kinds = {
        arg.model_fields["type"].annotation.__args__[0]
        for arg in ResponseOutputItem.__origin__.__args__  # type: ignore[attr-defined]
    }
    answers = {k for k in kinds if k.endswith("_output") or k.endswith("_response")}
    calls = {k for k in kinds if k.endswith("_call") or k.endswith("_request")}
    run_by_axon = {"function_call"}
    server_side = {  # the server runs them and sends their outcome in the item itself
        "file_search_call",
        "web_search_call",
        "image_generation_call",
        "code_interpreter_call",
        "mcp_call",
    }
    answered = set(openai_responses._ANSWERS)
    assert calls - run_by_axon - server_side == answered == {*ANSWERS, "custom_tool_call"}
    assert {a["type"] for answer in ANSWERS.values() for a in answer if "type" in a} <= answers


@pytest.mark.parametrize("item", ITEMS, ids=[i["type"] for i in ITEMS])
async def test_a_client_call_is_kept_and_answered_as_not_run_in_the_next_request(item):
    first = await run(Reply(body=body(*item_events(item))))
    assert first.error is None and first.calls == []  # no Axon tool runs it
    (kept,) = first.of(ProviderDataChunk)
    assert kept.data == item  # kept verbatim, as it came
    history = (
        UserMessage(content="do it"),
        AssistantMessage(content=(ProviderDataPart(provider=PROVIDER, data=kept.data, step=0),)),
        UserMessage(content="and?"),
    )
    second = await run(Reply(body=body(created(), completed())), request=make_request(history))
    items = second.body()["input"]
    assert items == [
        {"role": "user", "content": "do it"},
        item,
        *ANSWERS[item["type"]],
        {"role": "user", "content": "and?"},
    ]
    assert wire_rules.responses_errors(items) == []
    assert wire_rules.sdk_errors("responses", items) == []


def test_without_its_answer_the_next_request_breaks_the_apis_pairing():
    # what the rules see when the answer is missing: the check above is not vacuous
    for item in ITEMS:
        errs = wire_rules.responses_errors([{"role": "user", "content": "x"}, item])
        assert errs == [f"{item['type']} {item.get('call_id') or item['id']!r} has no output"]


async def test_a_call_the_server_ran_with_its_output_gets_no_second_answer():
    hosted = {**SHELL, "environment": {"type": "container_reference", "container_id": "cntr_1"}}
    ran = {
        "type": "shell_call_output",
        "id": "sho_01",
        "call_id": "call_shell_1",
        "output": [{"stdout": "a.py", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}],
        "status": "completed",
    }
    searched = {**TOOL_SEARCH, "execution": "server"}
    found = {
        "type": "tool_search_output",
        "id": "tso_01",
        "call_id": "call_search_1",
        "execution": "server",
        "status": "completed",
        "tools": [],
    }
    answered = {"type": "mcp_approval_response", "approval_request_id": "mcpr_01", "approve": True}
    parts = tuple(
        ProviderDataPart(provider=PROVIDER, data=d, step=0)
        for d in (hosted, ran, searched, found, MCP_APPROVAL, answered)
    )
    history = (UserMessage(content="go"), AssistantMessage(content=parts))
    call = await run(Reply(body=body(created(), completed())), request=make_request(history))
    items = call.body()["input"]
    assert items[1:] == [hosted, ran, searched, found, MCP_APPROVAL, answered]
    assert wire_rules.responses_errors(items) == []
    assert wire_rules.sdk_errors("responses", items) == []


def test_the_blank_screenshot_is_a_whole_png():
    import base64
    import struct
    import zlib

    data = base64.b64decode(openai_responses.BLANK_SCREENSHOT.split(",", 1)[1])
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, kinds = 8, []
    while at < len(data):
        (size,) = struct.unpack(">I", data[at : at + 4])
        kind, chunk = data[at + 4 : at + 8], data[at + 8 : at + 8 + size]
        (crc,) = struct.unpack(">I", data[at + 8 + size : at + 12 + size])
        assert crc == zlib.crc32(kind + chunk)
        kinds.append(kind)
        at += 12 + size
    assert kinds == [b"IHDR", b"IDAT", b"IEND"]
