"""MCP tool servers: real servers (tests/support/mcp_server.py, written with the ``mcp``
package) launched over stdio and streamable HTTP, used through the Host, the tool
executor and both real provider SDKs replaying SSE from the loopback server."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import attrs
import cattrs
import pytest
import trio
from structlog.testing import capture_logs

from actors.mcp import MCPServer, MCPServerActor
from actors.plugins import ApprovalActor
from actors.providers import AnthropicProvider, OpenAIProvider, ScriptedProvider
from actors.providers.scripted import tool_call
from runtime import Agent, Budget, Host, ToolDefinitionError, tool
from runtime.errors import ConfigurationError, MCPServerUnavailable
from tests.support.grammar import check_grammar
from tests.support.listener import recording_server
from tests.support.loopback import (
    Reply,
    anthropic_end,
    anthropic_sse,
    anthropic_start,
    loopback_server,
    sse,
)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "tests" / "support" / "mcp_server.py")


def stdio_server(*flags: str, **options) -> MCPServer:
    return MCPServer.stdio(sys.executable, [SCRIPT, *flags], name="test", **options)


def calling(*calls: tuple[str, dict]) -> ScriptedProvider:
    """One step calling ``calls``, then a step answering ``done``."""
    chunks = [c for name, args in calls for c in tool_call(name, args, tool_call_id=f"c_{name}")]
    return ScriptedProvider([chunks, ["done"]])


def tool_messages(session) -> dict:
    return {m.tool_name: m for m in session.messages if m.role == "tool"}


async def wait_for_file(path: Path, attempts: int = 400) -> None:
    """Poll for a file another process writes (there is no event to wait on)."""
    for _ in range(attempts):
        if path.exists():  # noqa: ASYNC240 - a tiny local stat
            return
        await trio.sleep(0.05)


async def run_turn(agent: Agent, text: str = "go", **host_options):
    async with Host.open(log_tap=False, **host_options) as host:
        session = await host.open_session(agent)
        async with session.stream(text) as out:
            chunks = [c async for c in out]
        return session, out.result, chunks


# -- configuration ----------------------------------------------------------------------


def test_agent_keeps_mcp_servers_apart_from_its_local_tools():
    @tool
    def local(x: int) -> int:
        """Local."""
        return x

    server = stdio_server()
    agent = Agent(tools=[local, server])
    assert [t.name for t in agent.tools] == ["local"]
    assert agent.mcp_servers == (server,)


def test_equal_configurations_are_one_server():
    assert stdio_server(env={"A": "1"}) == stdio_server(env={"A": "1"})
    assert len({stdio_server(), stdio_server(), stdio_server(prefix="x")}) == 2


def test_a_server_with_env_and_headers_survives_evolve_and_a_cattrs_round_trip():
    """The converters take back the sorted pairs they store (evolve and cattrs pass the
    stored form through ``__init__``); they once accepted only a mapping."""
    server = MCPServer.http("http://127.0.0.1:9/mcp", headers={"B": "2", "A": "1"})
    server = attrs.evolve(server, env={"K": "v"})
    assert attrs.evolve(server) == server
    assert attrs.evolve(server, prefix="p").headers == (("A", "1"), ("B", "2"))
    converter = cattrs.Converter()
    assert converter.structure(converter.unstructure(server), MCPServer) == server


def test_parse_reads_a_url_or_a_command_line():
    assert MCPServer.parse("http://127.0.0.1:9/mcp").transport == "http"
    server = MCPServer.parse("python3 'my dir/notes.py' --fast")
    assert (server.command, server.args, server.name) == (
        "python3",
        ("my dir/notes.py", "--fast"),
        "notes",
    )


def test_parse_names_a_server_launched_by_env_after_its_package_not_a_variable():
    server = MCPServer.parse("env GITHUB_TOKEN=ghp_x1 LOG=1 npx -y @mcp/server-github")
    assert server.name == "server-github"


@pytest.mark.parametrize("spec", ["", "   ", "python 'unclosed"])
def test_parse_refuses_an_empty_or_broken_command_line(spec):
    with pytest.raises(ConfigurationError):
        MCPServer.parse(spec)


def test_http_refuses_a_url_that_is_not_http():
    with pytest.raises(ConfigurationError, match="http"):
        MCPServer.http("ftp://example.com/mcp")


def test_cli_mcp_flag_adds_servers_to_the_agent():
    from runtime.app.cli import build_parser, make_agent

    args = build_parser().parse_args(
        ["run", "--mcp", f"{sys.executable} {SCRIPT}", "--mcp", "http://127.0.0.1:9/mcp", "hi"]
    )
    servers = make_agent(args).mcp_servers
    assert [(s.transport, s.name) for s in servers] == [
        ("stdio", "mcp_server"),
        ("http", "127.0.0.1:9"),
    ]


def test_importing_runtime_and_actors_does_not_import_mcp():
    code = (
        "import sys, runtime, actors, actors.mcp, actors.turn.runner; print('mcp' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.stdout.strip() == "False", proc.stderr


# -- a real server over stdio -----------------------------------------------------------


async def test_turn_calls_mcp_tools_and_saves_their_results():
    agent = Agent(
        provider=calling(("add", {"a": 2, "b": 3}), ("echo", {"text": "hi"})),
        tools=[stdio_server()],
    )
    session, result, chunks = await run_turn(agent)
    check_grammar(chunks)
    results = {c.tool_name: c.output for c in chunks if c.type == "tool-result"}
    assert results == {"add": 5, "echo": "hi"}
    saved = tool_messages(session)
    assert (saved["add"].output, saved["echo"].output) == (5, "hi")
    assert result.text == "done"


async def test_server_is_error_result_is_a_tool_error_the_model_sees():
    agent = Agent(provider=calling(("fail", {"reason": "disk full"})), tools=[stdio_server()])
    session, _, chunks = await run_turn(agent)
    error = tool_messages(session)["fail"].error
    assert "MCPToolError" in error and "failed on purpose: disk full" in error
    assert [c.error for c in chunks if c.type == "tool-error"] == [error]


async def test_arguments_are_checked_against_the_server_schema_before_the_call():
    agent = Agent(provider=calling(("add", {"a": "two", "b": 3})), tools=[stdio_server()])
    session, _, _ = await run_turn(agent)
    error = tool_messages(session)["add"].error
    assert error.startswith("invalid arguments for add: a:") and "integer" in error


async def test_one_server_is_started_once_and_shared_by_sessions():
    agent = Agent(provider=calling(("echo", {"text": "x"})), tools=[stdio_server()])
    other = Agent(provider=calling(("echo", {"text": "y"})), tools=[stdio_server()])
    async with Host.open(log_tap=False) as host:
        first = await host.open_session(agent)
        second = await host.open_session(other)
        await first.run("go")
        await second.run("go")
        assert len(host.mcp_servers) == 1
    assert tool_messages(second)["echo"].output == "y"


async def test_a_tool_name_clash_with_a_local_tool_is_a_tool_definition_error():
    @tool
    def add(a: int, b: int) -> int:
        """Local add."""
        return a + b

    agent = Agent(provider=calling(), tools=[add, stdio_server()])
    async with Host.open(log_tap=False) as host:
        with pytest.raises(ToolDefinitionError, match=r"'add' of MCP server 'test'.*prefix"):
            await host.open_session(agent)


async def test_a_prefix_renames_the_offered_tools():
    seen = []

    def responder(request):
        seen.append(sorted(t.name for t in request.tools))
        if len(seen) == 1:
            return tool_call("m_add", {"a": 1, "b": 1}, tool_call_id="c1")
        return ["done"]

    agent = Agent(provider=ScriptedProvider(responder=responder), tools=[stdio_server(prefix="m")])
    session, _, _ = await run_turn(agent)
    assert "m_add" in seen[0] and "add" not in seen[0]
    assert tool_messages(session)["m_add"].output == 2


async def test_a_server_that_cannot_start_fails_open_session_with_its_name():
    agent = Agent(
        provider=calling(), tools=[MCPServer.stdio("/nonexistent/mcp-server", name="ghost")]
    )
    async with Host.open(log_tap=False) as host:
        with pytest.raises(MCPServerUnavailable, match="MCP server 'ghost' could not start"):
            await host.open_session(agent)


async def test_a_tool_with_an_invalid_schema_is_refused_and_the_others_work():
    offered = []

    def responder(request):
        offered.append({t.name for t in request.tools})
        if len(offered) == 1:
            return [
                *tool_call("broken", {"x": 1}, tool_call_id="c1"),
                *tool_call("add", {"a": 1, "b": 2}, tool_call_id="c2"),
            ]
        return ["done"]

    agent = Agent(
        provider=ScriptedProvider(responder=responder), tools=[stdio_server("--bad-schema")]
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        await session.run("go")
        refused = host.mcp_servers[agent.mcp_servers[0]].refused
    assert refused["broken"].startswith(
        "MCP server 'test': tool 'broken' has an invalid input schema:"
    )
    assert "broken" not in offered[0] and "add" in offered[0]
    saved = tool_messages(session)
    assert saved["broken"].error.startswith("unknown tool 'broken'")
    assert saved["add"].output == 3


async def test_a_tool_schema_referring_outside_itself_is_refused_when_listed_and_never_fetched():
    with recording_server() as attacker:
        agent = Agent(
            provider=calling(("remote", {"x": 1}), ("passwd", {"x": 1}), ("relative", {"x": 1})),
            tools=[stdio_server("--ref-schemas", f"{attacker.url}/latest/meta-data/iam")],
        )
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            await session.run("go")
            refused = host.mcp_servers[agent.mcp_servers[0]].refused
    assert attacker.contacts == []
    assert set(refused) == {"remote", "passwd", "relative"}
    assert "'file:///etc/passwd' points outside the schema" in refused["passwd"]
    assert refused["remote"].startswith(
        "MCP server 'test': tool 'remote' has an invalid input schema: $ref 'http://127.0.0.1:"
    )
    saved = tool_messages(session)
    assert all(saved[name].error.startswith("unknown tool") for name in refused)


async def test_a_tool_schema_referring_to_its_own_defs_is_offered_and_checked():
    steps = []

    def responder(request):
        steps.append(request)
        if len(steps) == 1:
            return [
                *tool_call("defs", {"x": -1}, tool_call_id="c1"),
                *tool_call("defs", {"x": 4}, tool_call_id="c2"),
            ]
        return ["done"]

    with recording_server() as attacker:
        agent = Agent(
            provider=ScriptedProvider(responder=responder),
            tools=[stdio_server("--ref-schemas", attacker.url)],
        )
        session, _, _ = await run_turn(agent)
    results = {m.tool_call_id: m for m in session.messages if m.role == "tool"}
    assert "x: -1 is less than the minimum of 0" in results["c1"].error
    assert results["c2"].output == 4


async def test_tools_list_changed_refreshes_the_tools_before_the_next_step():
    offered = []

    def responder(request):
        offered.append({t.name for t in request.tools})
        if len(offered) == 1:
            return tool_call("grow", {}, tool_call_id="c1")
        if len(offered) == 2:
            return tool_call("double", {"x": 21}, tool_call_id="c2")
        return ["done"]

    agent = Agent(provider=ScriptedProvider(responder=responder), tools=[stdio_server()])
    session, _, _ = await run_turn(agent)
    assert "double" not in offered[0] and "double" in offered[1]
    assert tool_messages(session)["double"].output == 42


async def test_server_death_mid_call_is_a_tool_error_then_the_restarted_server_answers(tmp_path):
    agent = Agent(
        provider=ScriptedProvider(
            turns=[
                [tool_call("die", {}, tool_call_id="c1"), ["noted"]],
                [tool_call("count_starts", {}, tool_call_id="c2"), ["ok"]],
            ]
        ),
        tools=[stdio_server(env={"MCP_TEST_STATE": str(tmp_path)})],
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        await session.run("first")
        await session.run("second")
    saved = tool_messages(session)
    assert (
        saved["die"].error
        == ("tool die raised MCPServerDied: MCP server 'test' died during the call")
        or "MCP server 'test' died during the call" in saved["die"].error
    )
    assert saved["count_starts"].output == 2


async def test_a_timed_out_call_is_cancelled_on_the_server(tmp_path):
    agent = Agent(
        provider=calling(("slow", {"seconds": 60})),
        tools=[stdio_server(env={"MCP_TEST_STATE": str(tmp_path)})],
        budget=Budget(tool_timeout=0.5),
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        await session.run("go")
        await wait_for_file(tmp_path / "cancelled")  # the notice travels to the server
    assert tool_messages(session)["slow"].error == "tool slow timed out after 0.5s"
    assert (tmp_path / "cancelled").exists()


async def test_cancelling_the_turn_cancels_the_call_on_the_server(tmp_path):
    agent = Agent(
        provider=calling(("slow", {"seconds": 60})),
        tools=[stdio_server(env={"MCP_TEST_STATE": str(tmp_path)})],
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        async with session.stream("go") as out:
            async for chunk in out:
                if chunk.type == "tool-call":
                    await trio.sleep(0.5)  # let the request reach the server
                    out.cancel("user pressed stop")
        await wait_for_file(tmp_path / "cancelled")  # the notice travels to the server
    assert out.result.finish_reason == "aborted"
    assert (tmp_path / "cancelled").exists()


async def test_the_approval_plugin_gates_the_tools_the_server_config_names():
    asked = []

    def deny_adds(request):
        asked.append(request.tool_name)
        return False, "no arithmetic today"

    agent = Agent(
        provider=calling(("add", {"a": 1, "b": 2}), ("echo", {"text": "free"})),
        tools=[stdio_server(needs_approval=["add"])],
    )
    async with Host.open(log_tap=False) as host:
        await host.start_actor(ApprovalActor(deny_adds))
        session = await host.open_session(agent)
        await session.run("go")
    saved = tool_messages(session)
    assert asked == ["add"]
    assert saved["add"].error == "the tool call was denied: no arithmetic today"
    assert saved["echo"].output == "free"


def test_needs_approval_given_one_name_as_a_str_is_refused():
    """``needs_approval="add"`` was the set of its letters: no tool waited, ``add`` ran
    without asking."""
    with pytest.raises(ConfigurationError, match=r"not a str \(needs_approval=\['add'\]"):
        stdio_server(needs_approval="add")


async def test_a_prefixed_tool_named_as_offered_in_needs_approval_waits():
    """Named as the model, the events and the page show it (``m_add``), not as the
    server lists it (``add``): the call ran without asking."""
    asked = []

    def deny(request):
        asked.append(request.tool_name)
        return False, "no"

    agent = Agent(
        provider=calling(("m_add", {"a": 1, "b": 2}), ("m_echo", {"text": "free"})),
        tools=[stdio_server(prefix="m", needs_approval=["m_add"])],
    )
    async with Host.open(log_tap=False) as host:
        await host.start_actor(ApprovalActor(deny))
        session = await host.open_session(agent)
        await session.run("go")
    saved = tool_messages(session)
    assert asked == ["m_add"]
    assert saved["m_add"].error == "the tool call was denied: no"
    assert saved["m_echo"].output == "free"


async def test_a_needs_approval_name_the_server_does_not_list_is_logged_once():
    agent = Agent(
        provider=calling(("echo", {"text": "x"})),
        tools=[stdio_server(needs_approval=["add", "adds"])],
    )
    with capture_logs() as logs:
        await run_turn(agent)
    [warned] = [line for line in logs if line["event"] == "mcp.approval-names-unknown"]
    assert warned["names"] == ["adds"]
    assert warned["error"] == (
        "MCP server 'test' lists no tool named 'adds' of its needs_approval: no call "
        "waits for approval by those names"
    )


async def test_the_server_process_ends_with_the_host():
    agent = Agent(provider=calling(("echo", {"text": "x"})), tools=[stdio_server()])
    async with Host.open(log_tap=False) as host:
        await host.open_session(agent)
        actor: MCPServerActor = host.mcp_servers[agent.mcp_servers[0]]
    assert actor.stopped.is_set()
    with pytest.raises(MCPServerUnavailable):
        await actor.call_tool("echo", text="late")


# -- a real server over streamable HTTP --------------------------------------------------


@pytest.fixture(scope="module")
def http_url():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait()


async def test_turn_calls_a_tool_of_a_streamable_http_server(http_url):
    agent = Agent(provider=calling(("add", {"a": 20, "b": 22})), tools=[MCPServer.http(http_url)])
    session, result, chunks = await run_turn(agent)
    check_grammar(chunks)
    assert tool_messages(session)["add"].output == 42
    assert result.text == "done"


async def test_an_http_server_that_is_not_listening_fails_open_session():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agent = Agent(
        provider=calling(),
        tools=[MCPServer.http(f"http://127.0.0.1:{port}/mcp", name="nobody", connect_timeout=10)],
    )
    async with Host.open(log_tap=False) as host:
        with pytest.raises(MCPServerUnavailable, match="MCP server 'nobody'"):
            await host.open_session(agent)


# -- both providers, through their real SDKs -----------------------------------------------


def oa_chunk(delta: dict, finish: str | None = None) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


async def test_openai_turn_offers_the_server_schema_and_sends_back_its_result():
    call = {
        "index": 0,
        "id": "call_A",
        "type": "function",
        "function": {"name": "add", "arguments": json.dumps({"a": 2, "b": 3})},
    }
    replies = [
        Reply(
            body=sse(
                oa_chunk({"role": "assistant", "tool_calls": [call]}), oa_chunk({}, "tool_calls")
            )
        ),
        Reply(body=sse(oa_chunk({"role": "assistant", "content": "5"}), oa_chunk({}, "stop"))),
    ]
    async with loopback_server(*replies) as server:
        agent = Agent(
            provider=OpenAIProvider("m", base_url=server.url + "/v1", api_key="test"),
            tools=[stdio_server()],
        )
        _, result, chunks = await run_turn(agent)
    check_grammar(chunks)
    first, second = server.requests[0].json(), server.requests[1].json()
    add = next(t["function"] for t in first["tools"] if t["function"]["name"] == "add")
    assert add["parameters"]["properties"] == {
        "a": {"title": "A", "type": "integer"},
        "b": {"title": "B", "type": "integer"},
    }
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_A", "content": "5"}
    assert result.text == "5"


async def test_anthropic_turn_offers_the_server_schema_and_sends_back_its_result():
    start = anthropic_start()
    end = anthropic_end

    tool_use = [
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "toolu_A", "name": "echo", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": '{"text": "hi"}'},
        },
        {"type": "content_block_stop", "index": 0},
    ]
    text = [
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
        {"type": "content_block_stop", "index": 0},
    ]
    replies = [
        Reply(body=anthropic_sse(start, *tool_use, *end("tool_use"))),
        Reply(body=anthropic_sse(start, *text, *end("end_turn"))),
    ]
    async with loopback_server(*replies) as server:
        agent = Agent(
            provider=AnthropicProvider("m", base_url=server.url, api_key="test"),
            tools=[stdio_server()],
        )
        _, result, chunks = await run_turn(agent)
    check_grammar(chunks)
    first, second = server.requests[0].json(), server.requests[1].json()
    echo = next(t for t in first["tools"] if t["name"] == "echo")
    assert echo["input_schema"]["properties"] == {"text": {"title": "Text", "type": "string"}}
    assert echo["description"] == "Echo the text back."
    assert second["messages"][-1]["content"][0]["content"] in (
        "hi",
        [{"type": "text", "text": "hi"}],
    )
    assert second["messages"][-1]["content"][0]["tool_use_id"] == "toolu_A"
    assert result.text == "ok"


def test_attrs_evolve_keeps_the_servers():
    agent = Agent(tools=[stdio_server()])
    assert attrs.evolve(agent, name="other").mcp_servers == agent.mcp_servers


async def test_an_mcp_release_without_the_borrowed_stdio_internals_still_runs_the_server(
    monkeypatch,
):
    # The bounded stdio reader borrows private names of mcp.client.stdio; a release that
    # renamed one must fall back to the package's own client, not fail every server.
    import actors.mcp as module

    monkeypatch.setattr(module, "_STDIO_INTERNALS", ("_a_name_gone_in_a_later_release",))
    monkeypatch.setattr(module, "_warned_stdio", [])
    borrowed = []
    monkeypatch.setattr(module, "_stdio_client", lambda *a: borrowed.append(a))
    agent = Agent(provider=calling(("add", {"a": 2, "b": 3})), tools=[stdio_server()])
    session, _, _ = await run_turn(agent)
    assert tool_messages(session)["add"].output == 5
    assert borrowed == [] and module._warned_stdio == [True]
