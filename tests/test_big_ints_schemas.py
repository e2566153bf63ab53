"""Schemas with an integer bound past 64 bits (``"maximum": 123456789012345678901234567890``):
an AG-UI client's tool schemas, a ``run --output-schema`` file (the ``response_format``
the OpenAI provider sends) and a schema stored with a wait. orjson reads such a bound as
the float 1.2345678901234568e+29 and writes none: the model was sent another bound than
the client gave, and a wait whose tool has such a schema could not be stored."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import httpx
import orjson

from actors.providers import OpenAIProvider
from actors.providers.scripted import ScriptedProvider
from runtime import Agent, Host, approval, json_exact
from runtime.app.cli import read_output_schema
from runtime.messages import schema_ref
from tests.support.loopback import Reply, loopback_server
from tests.test_agui import run_input, user
from tests.test_provider_e2e import oa_answer
from tests.web.harness import web_server

BIG = 123456789012345678901234567890
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "maximum": BIG}},
    "required": ["n"],
    "additionalProperties": False,
}


async def test_an_agui_client_tools_bound_past_64_bits_reaches_the_model_exactly() -> None:
    provider = ScriptedProvider([["ok"]])
    tools = [{"name": "pick", "description": "Ask the user.", "parameters": SCHEMA}]
    body = json.dumps(run_input("t", user("go", "m1"), tools=tools)).encode()
    async with web_server(Agent(provider=provider), protocols=("ag-ui",)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            r = await client.post(
                "/ag-ui", content=body, headers={"content-type": "application/json"}
            )
    assert r.status_code == 200, r.text
    (pick,) = provider.requests[0].tools
    bound = pick.parameters["properties"]["n"]["maximum"]
    assert bound == BIG and type(bound) is int


async def test_an_output_schema_files_bound_past_64_bits_is_the_response_format_sent(
    tmp_path: Any,
) -> None:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    schema = read_output_schema(str(path))
    async with loopback_server(Reply(body=oa_answer('{"n": 1}'))) as server:
        provider = OpenAIProvider("m", base_url=server.url + "/v1", api_key="t")
        agent = Agent(provider=provider, output_type=schema)
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent, session_id="s")
            await session.run("go")
        await provider.aclose()
    sent = json.loads(server.requests[0].body)["response_format"]["json_schema"]["schema"]
    assert sent == SCHEMA and type(sent["properties"]["n"]["maximum"]) is int


def test_a_schema_with_a_bound_past_64_bits_is_named_for_storing_with_a_wait() -> None:
    """``schema_ref`` (orjson) raised TypeError: the wait of an MCP tool with such a
    schema was not stored. Its name is the digest of the exact JSON; a schema without
    such a bound keeps the name it had."""
    assert schema_ref(SCHEMA) != schema_ref({**SCHEMA, "properties": {"n": {"maximum": 1}}})
    small = {"type": "object", "properties": {"n": {"maximum": 1}}}
    data = orjson.dumps(small, option=orjson.OPT_SORT_KEYS)
    assert schema_ref(small) == hashlib.sha256(data).hexdigest()[:16]


def test_an_edit_is_checked_against_a_stored_bound_past_64_bits_exactly() -> None:
    """The stored schema was read back with orjson: ``maximum`` 1.2345678901234568e+29,
    below BIG, so an edit of the very bound was refused."""
    approval._stored_validator.cache_clear()
    validator = approval._stored_validator(json_exact.dumps(SCHEMA, option=orjson.OPT_SORT_KEYS))
    assert not list(validator.iter_errors({"n": BIG}))
    assert list(validator.iter_errors({"n": BIG + 1}))
