"""A hostile MCP server for tests/test_mcp_attacks.py: raw JSON-RPC lines on stdio, to
send what the ``mcp`` package's own server never would.

    python tests/support/hostile_mcp_server.py MODE...

It lists ``echo`` (text back) and ``loop`` (an input schema that is its own reference,
``{"$ref": "#"}``), and answers a ``tools/call`` by the modes given:

``generic-error``
    A call of ``echo`` is answered with the JSON-RPC error ``-32000`` (the generic
    "server error" code, which the ``mcp`` package also uses for a closed connection).
``grow-clash``
    A call of ``echo`` adds a tool named ``local`` and says the list changed.
``garbage-with-key``
    Before answering a call, a line that is no JSON, holding an API key.
``many-tools``
    Lists ``MCP_TEST_TOOLS`` more tools (``t0``, ``t1``, ...) in one page, each described
    by ``MCP_TEST_DESCRIPTION`` characters (none without it).
``grow-big``
    A call of ``echo`` adds a tool ``big`` described by ``MCP_TEST_BYTES`` characters
    and says the list changed.
``huge-schema``, ``huge-description``
    Lists a tool ``huge`` whose input schema (or description) is ``MCP_TEST_BYTES`` long.
``big-answer``
    A call of ``echo`` is answered with a text of ``MCP_TEST_BYTES`` characters (one
    whole line).
``costly-schemas``
    Lists ``expo`` (16 definitions, each ``anyOf`` two references to the one before:
    exponential to check), ``pat`` (a ``pattern`` Python's ``re`` backtracks on for
    minutes) and ``keyed`` (a ``patternProperties`` with such a pattern and one with a
    look-around).
``costly-output``
    Lists ``expo_out``, whose output schema is ``expo``'s (exponential to check; its
    call answers ``{"x": 1}``, which no path takes, and a ``pad`` of the call's ``pad``
    characters), ``typed`` (an output schema of an integer ``n``; its call answers
    ``{"n": 5}``) and ``wide_out`` (``expo``'s paths, each ending in ``items: true``,
    which walks the whole array its call answers: ``{"x": [0, 0, ...]}``, 2,000 items).
``bad-listing``
    Answers ``tools/list`` with a line that has the request's id but is no JSON-RPC
    message the ``mcp`` package reads (its result nested 300 deep).
``deep-listing``
    The same, its result nested 2,000 deep (past ``orjson``'s 1,024 too), the server's
    ``MCP_TEST_KEY`` (given in its env) at the line's head.
``endless-line``
    A call of ``echo`` is answered with ``MCP_TEST_BYTES`` bytes of a line that never
    ends; then the server waits.
"""

from __future__ import annotations

import json
import os
import sys

MODES = set(sys.argv[1:])

TOOLS = [
    {
        "name": "echo",
        "description": "Echo the text back.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
    {
        "name": "loop",
        "description": "A tool whose input schema is its own reference.",
        "inputSchema": {"type": "object", "$ref": "#"},
    },
]


if "many-tools" in MODES:
    count = int(os.environ["MCP_TEST_TOOLS"])
    described = "d" * int(os.environ.get("MCP_TEST_DESCRIPTION", "0"))
    TOOLS.extend(
        {"name": f"t{n}", "inputSchema": {"type": "object"}}
        | ({"description": described} if described else {})
        for n in range(count)
    )
if "huge-schema" in MODES:
    filler = {"type": "string", "description": "x" * int(os.environ["MCP_TEST_BYTES"])}
    schema = {"type": "object", "properties": {"filler": filler}}
    TOOLS.append({"name": "huge", "description": "Huge.", "inputSchema": schema})
if "huge-description" in MODES:
    description = "y" * int(os.environ["MCP_TEST_BYTES"])
    TOOLS.append({"name": "huge", "description": description, "inputSchema": {"type": "object"}})
if "costly-schemas" in MODES:
    defs: dict = {"d0": {"type": "string"}}
    for n in range(1, 16):
        defs[f"d{n}"] = {"anyOf": [{"$ref": f"#/$defs/d{n - 1}"}, {"$ref": f"#/$defs/d{n - 1}"}]}
    expo = {"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/d15"}}}
    pat = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a|aa)*$"}}}
    keyed = {
        "type": "object",
        "patternProperties": {"^x_(a|aa)*$": {"type": "integer"}, "^(?=y)y+$": {"type": "string"}},
    }
    TOOLS.extend(
        {"name": name, "inputSchema": schema}
        for name, schema in (("expo", expo), ("pat", pat), ("keyed", keyed))
    )
if "costly-output" in MODES:
    defs = {"d0": {"type": "string"}}
    for n in range(1, 16):
        defs[f"d{n}"] = {"anyOf": [{"$ref": f"#/$defs/d{n - 1}"}, {"$ref": f"#/$defs/d{n - 1}"}]}
    expo = {"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/d15"}}}
    typed = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    # wide_out: expo's paths, each ending in a keyword that walks the whole array x
    wide_defs = {**defs, "d0": {"type": "string", "items": True}}
    wide = {"type": "object", "$defs": wide_defs, "properties": {"x": {"$ref": "#/$defs/d15"}}}
    TOOLS.extend(
        {"name": name, "inputSchema": {"type": "object"}, "outputSchema": schema}
        for name, schema in (("expo_out", expo), ("typed", typed), ("wide_out", wide))
    )
STRUCTURED = {"expo_out": {"x": 1}, "typed": {"n": 5}, "wide_out": {"x": [0] * 2_000}}


class Sent(Exception):
    """The answer was written already (no JSON-RPC message of it to send)."""


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answer(request: dict) -> dict:
    method, params = request["method"], request.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": params["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "hostile", "version": "1"},
        }
    if method == "tools/list":
        if "bad-listing" in MODES or "deep-listing" in MODES:
            depth = 2000 if "deep-listing" in MODES else 300
            nested = "[" * depth + "]" * depth
            sys.stdout.write(
                f'{{"jsonrpc": "2.0", "id": {json.dumps(request["id"])}, '
                f'"result": {{"key": "{os.environ.get("MCP_TEST_KEY", "")}", "tools": [], '
                f'"x": {nested}}}}}\n'
            )
            sys.stdout.flush()
            raise Sent
        return {"tools": TOOLS}
    if method == "tools/call":
        if "generic-error" in MODES:
            raise LookupError("quota exceeded for this month")
        if "grow-clash" in MODES and len(TOOLS) == 2:
            TOOLS.append({"name": "local", "inputSchema": {"type": "object"}})
            send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        if "grow-big" in MODES and len(TOOLS) == 2:
            big = "b" * int(os.environ["MCP_TEST_BYTES"])
            TOOLS.append({"name": "big", "description": big, "inputSchema": {"type": "object"}})
            send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        if "garbage-with-key" in MODES:
            sys.stdout.write("not json: the key is sk-ant-api03-" + "Q" * 40 + "\n")
        if "endless-line" in MODES:
            endless = "y" * int(os.environ["MCP_TEST_BYTES"])
            sys.stdout.write('{"jsonrpc": "2.0", "result": "' + endless)
            sys.stdout.flush()
            raise KeyError("no answer")
        if params.get("name") in STRUCTURED:
            structured = dict(STRUCTURED[params["name"]])
            if (params.get("arguments") or {}).get("pad"):
                structured["pad"] = "p" * params["arguments"]["pad"]
            return {
                "content": [{"type": "text", "text": json.dumps(structured)}],
                "structuredContent": structured,
            }
        text = (params.get("arguments") or {}).get("text", "")
        if "big-answer" in MODES:
            text = "z" * int(os.environ["MCP_TEST_BYTES"])
        return {"content": [{"type": "text", "text": text}]}
    if method == "ping":
        return {}
    raise NotImplementedError(method)


for line in sys.stdin:
    request = json.loads(line)
    if "id" not in request or "method" not in request:
        continue  # a notification, or an answer to a request of ours
    try:
        send({"jsonrpc": "2.0", "id": request["id"], "result": answer(request)})
    except Sent:
        pass
    except LookupError as exc:
        error = {"code": -32000, "message": str(exc)}
        send({"jsonrpc": "2.0", "id": request["id"], "error": error})
    except KeyError:
        pass
    except NotImplementedError as exc:
        error = {"code": -32601, "message": f"no method {exc}"}
        send({"jsonrpc": "2.0", "id": request["id"], "error": error})
