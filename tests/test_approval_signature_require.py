"""Requiring signed approvals (``serve --require-approval-signature``,
``$AXON_REQUIRE_APPROVAL_SIGNATURE``, ``create_app(require_approval_signature=True)``)
and the secret read from a file (``--approval-secret-file``, ``$AXON_APPROVAL_SECRET_FILE``):
docs/approval.md, "Signed approvals".

With the requirement an AI SDK approval answer without a ``signature`` is a 403 saying
which ``ai`` versions send one, and nothing is recorded; one with a good signature goes
through; the default still takes an unsigned answer. A client tool's output (no
approval, nothing signed) is not refused. AG-UI and ``session.respond`` carry no
signature and decide as before (the decision pinned here; ``serve`` warns of it)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Host, Tool
from runtime.app.web.answers import _answers
from runtime.app.web.app import create_app
from runtime.app.web.http import ApiError
from runtime.app.web.serve import (
    SECRET_FILE_MAX,
    add_serve_parser,
    approval_secret,
    approval_settings,
    read_secret_file,
    unsigned_decisions_warning,
)
from runtime.app.web.signing import (
    REQUIRE_ENV,
    SECRET_ENV,
    SECRET_FILE_ENV,
    ApprovalSigner,
    for_session,
)
from runtime.errors import ConfigurationError
from tests.support.approval_tools import (
    clear_ran,  # noqa: F401 (fixture)
    delete_file,
    ran,
    waiting_delete,
)
from tests.support.redis import require_redis
from tests.test_agui import run, run_input, user
from tests.test_approval_node import chat_through_an_approval
from tests.test_approval_web import answer, approval_part, post, request_of
from tests.test_approval_web import serve as serve_process
from tests.test_frontend import LIMIT, deployment
from tests.test_relay_web import sse_events
from tests.test_web_http import body, events
from tests.test_worker_approval import answer as worker_answer
from tests.test_worker_approval import approval_agent, payloads
from tests.test_worker_approval import chat as worker_chat
from tests.web.harness import ensure_ai_package, web_server

SECRET = "Quokka-Lantern-Umbrella-42"
REQUIRED = {"approval_secret": SECRET, "require_approval_signature": True}
SIGNER = ApprovalSigner(secret=SECRET.encode(), required=True)


def agent() -> Agent:
    steps = [[*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")], ["done"]]
    return Agent(provider=ScriptedProvider(steps), tools=[delete_file])


def _message(**approval: Any) -> dict[str, Any]:
    return {"parts": [approval_part("a1", True, **approval)]}


# -- the parser ---------------------------------------------------------------------------


def test_a_required_signature_missing_is_a_403_naming_the_clients_that_sign():
    signer = for_session(SIGNER, "s")
    with pytest.raises(ApiError) as refused:
        _answers(_message(), [waiting_delete("a1")], signer)
    assert refused.value.status == 403
    message = str(refused.value.message)
    assert "carries no signature" in message and "nothing was recorded" in message
    assert "6.0.221" in message and "7.0.16" in message
    assert "--require-approval-signature" in message and REQUIRE_ENV in message
    assert SECRET not in message
    signature = SIGNER.sign("s", "a1", "D", "delete_file", {"path": "/x"})
    assert _answers(_message(signature=signature), [waiting_delete("a1")], signer)
    # not required (the default): the unsigned answer is checked against the store alone
    lenient = for_session(ApprovalSigner(secret=SECRET.encode()), "s")
    assert _answers(_message(), [waiting_delete("a1")], lenient)


@pytest.mark.parametrize(
    ("part", "status"),
    [
        # the approval named by its call's id (``decide`` takes either key)
        (approval_part("D", True), 403),
        # a denial sneaked past as well: an unsigned answer either way
        (approval_part("a1", False, reason="no"), 403),
        # the call's output given by the client, as for a client tool: no approval at all
        (
            {
                "type": "tool-delete_file",
                "toolCallId": "D",
                "state": "output-available",
                "input": {"path": "/x"},
                "output": "deleted",
            },
            400,
        ),
        (
            {
                "type": "tool-delete_file",
                "toolCallId": "D",
                "state": "output-error",
                "input": {"path": "/x"},
                "errorText": "gone",
            },
            400,
        ),
        # a signature for the call made over another input (a client-edited one)
        (
            approval_part(
                "a1", True, signature=SIGNER.sign("s", "a1", "D", "delete_file", {"path": "/"})
            ),
            403,
        ),
    ],
)
def test_no_other_shape_of_answer_decides_an_approval_unsigned(part, status):
    """Attacked (attacktoday): with signatures required, the waiting approval cannot be
    answered unsigned by its call id instead of its approval id, nor by a denial, nor by
    an ``output-available``/``output-error`` part (a client tool's answer, which needs
    no signature) for the server's call: each refused before anything is recorded."""
    signer = for_session(SIGNER, "s")
    with pytest.raises(ApiError) as refused:
        _answers({"parts": [part]}, [waiting_delete("a1")], signer)
    assert refused.value.status == status


async def test_requiring_a_signature_without_a_secret_is_refused_at_creation():
    with pytest.raises(ValueError, match="needs a secret"):
        ApprovalSigner.of(None, required=True)
    async with Host.open(log_tap=False) as host:
        with pytest.raises(ValueError, match="needs a secret"):
            create_app(host, agent(), require_approval_signature=True)


# -- over HTTP ------------------------------------------------------------------------------


async def test_embedded_an_unsigned_answer_is_refused_and_a_signed_one_runs(tmp_path):
    async with web_server(agent(), store=str(tmp_path / "w.db"), **REQUIRED) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            asked = request_of(first)
            unsigned = answer("s", first[0]["messageId"], approval_part(asked["approvalId"], True))
            refused = await client.post("/api/chat", json=unsigned)
            assert (await client.get("/api/sessions/s")).json()["waiting"] == 1
            assert ran == []
            signed = answer(
                "s",
                first[0]["messageId"],
                approval_part(asked["approvalId"], True, signature=asked["signature"]),
            )
            done = await client.post("/api/chat", json=signed)
    assert refused.status_code == 403 and "carries no signature" in refused.json()["error"]
    assert done.status_code == 200 and ran == ["/x"]


pick_color = Tool.client("pick_color", {"type": "object", "properties": {}}, "Pick a color.")


async def test_a_client_tools_output_needs_no_signature(tmp_path):
    """A client-side tool's output answers no approval: nothing was signed for it."""
    steps = [[*tool_call("pick_color", {}, tool_call_id="C")], ["done"]]
    chat_agent = Agent(provider=ScriptedProvider(steps), tools=[pick_color])
    async with web_server(chat_agent, store=str(tmp_path / "w.db"), **REQUIRED) as srv:
        async with httpx.AsyncClient(base_url=srv.url) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            part = {
                "type": "tool-pick_color",
                "toolCallId": "C",
                "state": "output-available",
                "input": {},
                "output": "red",
            }
            done = await client.post("/api/chat", json=answer("s", first[0]["messageId"], part))
            after = (await client.get("/api/sessions/s")).json()
    assert done.status_code == 200, done.text
    assert after["waiting"] == 0


async def test_agui_and_session_respond_decide_as_before_with_the_requirement():
    """The decision: AG-UI's resume and ``session.respond`` carry no signature (not the
    AI SDK's protocol), so the requirement does not apply to them; it would otherwise
    refuse every decision they make (docs/approval.md)."""

    def one(path: str) -> Agent:
        steps = [[*tool_call("delete_file", {"path": path}, tool_call_id="D")], ["done"]]
        return Agent(provider=ScriptedProvider(steps), tools=[delete_file])

    shared = one("/a")
    async with web_server(shared, protocols=("ai-sdk", "ag-ui"), **REQUIRED) as srv:
        first = await run(srv, run_input("t", user("go", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        resume = [
            {"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}
        ]
        await run(srv, run_input("t", user("go", "m1"), resume=resume, runId="r2"))
        assert ran == ["/a"]
        session = await srv.host.open_session(one("/b"), session_id="p")
        async with session.stream("go") as out:
            _ = [c async for c in out]
        (pending,) = out.result.pending
        await session.respond(pending.approval_id, approved=True)
    assert ran == ["/a", "/b"]


async def test_an_a2a_decision_goes_through_with_the_requirement():
    """A2A's ``decisions`` carry no signature either: decided as before."""
    from a2a.types.a2a_pb2 import TaskState
    from google.protobuf.json_format import MessageToDict

    from tests.support.approval_agents import agent as weather_agent
    from tests.test_a2a import BOTH, answer_of, collect, last_state, sdk
    from tests.test_a2a import user as a2a_user

    async with web_server(weather_agent, protocols=BOTH, **REQUIRED) as server:

        async def run(client: Any) -> Any:
            asked = await collect(client, a2a_user("weather?", message_id="q"))
            task = asked[0].task
            pending = MessageToDict(asked[-1].status_update.status.message.parts[1].data)
            decision = {"decisions": [{"id": pending["pending"][0]["id"], "approved": True}]}
            return await collect(
                client,
                a2a_user(
                    message_id="d", task_id=task.id, context_id=task.context_id, data=decision
                ),
            )

        answered = await sdk(server, run)
    assert last_state(answered) == TaskState.TASK_STATE_COMPLETED
    assert answer_of(answered) == "It is sunny in Oslo."


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_worker_front_end_refuses_an_unsigned_answer_recording_nothing(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, approval_agent(), fronts=0) as d:
        d.app_options = dict(REQUIRED)
        await d.start_front_end()
        (url,) = d.urls
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            first = payloads(
                sse_events((await client.post(f"{url}/api/chat", json=worker_chat("s1"))).text)
            )
            asked = request_of(first)
            sent = worker_answer("s1", first[0]["messageId"], asked["approvalId"], True)
            refused = await client.post(f"{url}/api/chat", json=sent)
            after = (await client.get(f"{url}/api/sessions/s1")).json()
            (turn,) = await d.queue.turns("s1")
    assert refused.status_code == 403 and "carries no signature" in refused.json()["error"]
    assert after["waiting"] == 1 and turn.status == "awaiting-input"


# -- the real `ai` package ------------------------------------------------------------------


@pytest.fixture(scope="module")
def node() -> str:
    return ensure_ai_package()


@pytest.fixture(scope="module", params=["ai7", "ai6"])
def ai(request: pytest.FixtureRequest, node: str) -> dict[str, str]:
    from tests.test_approval_node import ai6_entry

    return {} if request.param == "ai7" else {"ai": ai6_entry()}


async def test_the_ai_package_answers_a_server_that_requires_the_signature(node, ai, tmp_path):
    from tests.test_approval_node import ran as node_ran

    chat, stored = await chat_through_an_approval(node, tmp_path, REQUIRED, approved=True, **ai)
    assert chat["error"] is None and chat["status"] == "ready", chat["error"]
    assert node_ran == ["/x"] and stored["waiting"] == 0


async def test_a_client_that_sends_no_signature_is_told_which_clients_do(node, ai, tmp_path):
    from tests.test_approval_node import ran as node_ran

    chat, stored = await chat_through_an_approval(
        node, tmp_path, REQUIRED, approved=True, dropSignature=True, **ai
    )
    assert chat["status"] == "error" and "6.0.221" in chat["error"]
    assert node_ran == [] and stored["waiting"] == 1


# -- serve: the options, the variable, the file -------------------------------------------


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_the_secret_file_is_read_with_its_trailing_newline_left_out(tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(SECRET_FILE_ENV, raising=False)
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    path = tmp_path / "secret"
    path.write_bytes(SECRET.encode() + b"\r\n\n")
    assert read_secret_file(str(path)) == SECRET.encode()
    assert approval_settings(_args("--approval-secret-file", str(path))) == (SECRET.encode(), False)
    # the file's bytes sign as the same text given by option or variable does
    from_file = ApprovalSigner.of(read_secret_file(str(path)))
    from_text = ApprovalSigner.of(SECRET)
    assert from_file is not None and from_text is not None
    assert from_file.sign("s", "a", "c", "t", {}) == from_text.sign("s", "a", "c", "t", {})
    # the file wins over the variable, as an option does
    monkeypatch.setenv(SECRET_ENV, "from-env")
    assert approval_secret(_args("--approval-secret-file", str(path))) == SECRET.encode()


@pytest.mark.parametrize("case", ["missing", "empty", "newlines-only", "directory", "huge"])
def test_a_secret_file_that_gives_no_secret_is_a_clear_error_without_its_contents(tmp_path, case):
    path = tmp_path / "secret"
    if case == "empty":
        path.write_bytes(b"")
    elif case == "newlines-only":
        path.write_bytes(b"\n\r\n")
    elif case == "directory":
        path.mkdir()
    elif case == "huge":
        path.write_text((SECRET + "\n") * (SECRET_FILE_MAX // len(SECRET) + 1))
    with pytest.raises(ConfigurationError) as refused:
        approval_settings(_args("--approval-secret-file", str(path)))
    message = str(refused.value)
    assert message.startswith(f"--approval-secret-file {str(path)!r} ")
    expected = {
        "missing": "cannot be read: No such file",
        "empty": "is empty",
        "newlines-only": "is empty",
        "directory": "cannot be read: Is a directory",
        "huge": "is larger than",
    }[case]
    assert expected in message and SECRET not in message


def test_an_unreadable_secret_file_is_a_clear_error(tmp_path, monkeypatch):
    path = tmp_path / "secret"
    path.write_text(SECRET)
    path.chmod(0)
    if os.geteuid() == 0:  # (root reads any file: the refusal as the system gives it)
        import runtime.app.web.serve as serve

        def refused(*args: Any, **kwargs: Any) -> Any:
            raise PermissionError(13, "Permission denied", str(path))

        monkeypatch.setattr(serve, "open", refused, raising=False)
    with pytest.raises(ConfigurationError) as refused_read:
        read_secret_file(str(path))
    assert "cannot be read: Permission denied" in str(refused_read.value)
    assert SECRET not in str(refused_read.value)


def test_the_requirement_from_option_or_variable_and_what_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(SECRET_FILE_ENV, raising=False)
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    assert approval_settings(_args("--approval-secret", "s")) == ("s", False)
    assert approval_settings(_args("--approval-secret", "s", "--require-approval-signature")) == (
        "s",
        True,
    )
    for value, required in (("1", True), ("on", True), ("TRUE", True), ("0", False), ("", False)):
        monkeypatch.setenv(REQUIRE_ENV, value)
        assert approval_settings(_args("--approval-secret", "s"))[1] is required
    monkeypatch.setenv(REQUIRE_ENV, "maybe")
    with pytest.raises(ConfigurationError, match="must be 1 or 0"):
        approval_settings(_args("--approval-secret", "s"))
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(ConfigurationError, match="needs an approval secret"):
        approval_settings(_args())
    path = tmp_path / "secret"
    path.write_text(SECRET)
    with pytest.raises(ConfigurationError, match="once"):
        approval_settings(_args("--approval-secret", "s", "--approval-secret-file", str(path)))


def test_the_secret_file_variable_is_read_as_the_option_reads_its_file(tmp_path, monkeypatch):
    """``$AXON_APPROVAL_SECRET_FILE`` names a file read as ``--approval-secret-file``'s
    is; an empty value is none given, as ``$AXON_APPROVAL_SECRET``'s is."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    path = tmp_path / "secret"
    path.write_bytes(SECRET.encode() + b"\n")
    monkeypatch.setenv(SECRET_FILE_ENV, str(path))
    assert approval_settings(_args()) == (SECRET.encode(), False)
    monkeypatch.setenv(REQUIRE_ENV, "1")
    assert approval_settings(_args()) == (SECRET.encode(), True)
    monkeypatch.setenv(SECRET_FILE_ENV, "")
    assert approval_secret(_args()) is None
    with pytest.raises(ConfigurationError, match="needs an approval secret"):
        approval_settings(_args())


@pytest.mark.parametrize("case", ["missing", "empty", "directory", "huge"])
def test_a_secret_file_variable_that_gives_no_secret_names_the_variable_not_the_contents(
    tmp_path, monkeypatch, case
):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    path = tmp_path / "secret"
    if case == "empty":
        path.write_bytes(b"\r\n")
    elif case == "directory":
        path.mkdir()
    elif case == "huge":
        path.write_text((SECRET + "\n") * (SECRET_FILE_MAX // len(SECRET) + 1))
    monkeypatch.setenv(SECRET_FILE_ENV, str(path))
    with pytest.raises(ConfigurationError) as refused:
        approval_settings(_args())
    message = str(refused.value)
    assert message.startswith(f"${SECRET_FILE_ENV} {str(path)!r} ")
    assert "--approval-secret-file" not in message and SECRET not in message


def test_the_command_line_overrides_the_environment_and_two_in_one_place_are_refused(
    tmp_path, monkeypatch
):
    """The precedence (docs/approval.md): an option, either one, overrides both variables,
    and a variable it overrides is not read (a broken path there stops nothing); two
    options, or two variables, at once are an error naming both, never a guess."""
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    path = tmp_path / "secret"
    path.write_text(SECRET)
    other = tmp_path / "other"
    other.write_text("from-the-variable's-file")
    monkeypatch.setenv(SECRET_ENV, "from-env")
    monkeypatch.setenv(SECRET_FILE_ENV, str(other))
    # both variables: refused, naming both, without either's secret
    with pytest.raises(ConfigurationError) as refused:
        approval_settings(_args())
    message = str(refused.value)
    assert SECRET_ENV in message and SECRET_FILE_ENV in message and "once" in message
    assert "from-env" not in message and "from-the-variable" not in message
    # an option overrides both (so the refusal above has a way out without unsetting)
    assert approval_secret(_args("--approval-secret", "given")) == "given"
    assert approval_secret(_args("--approval-secret-file", str(path))) == SECRET.encode()
    # the overridden variable's file is not read: a path that cannot be read stops nothing
    monkeypatch.delenv(SECRET_ENV)
    monkeypatch.setenv(SECRET_FILE_ENV, str(tmp_path / "missing"))
    assert approval_secret(_args("--approval-secret", "given")) == "given"
    assert approval_secret(_args("--approval-secret-file", str(path))) == SECRET.encode()
    # the file variable over nothing else; the plain one over nothing else
    monkeypatch.setenv(SECRET_FILE_ENV, str(path))
    assert approval_secret(_args()) == SECRET.encode()
    monkeypatch.delenv(SECRET_FILE_ENV)
    monkeypatch.setenv(SECRET_ENV, "from-env")
    assert approval_secret(_args()) == "from-env"


def _serve(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    unset = (SECRET_ENV, SECRET_FILE_ENV, REQUIRE_ENV)
    clean = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run(
        [sys.executable, "-m", "runtime", "serve", "--port", "0", *argv],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=60,
    )


def test_serve_stops_before_binding_on_a_bad_secret_file_and_never_shows_the_secret(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(b"")
    empty = _serve("--approval-secret-file", str(path))
    required = _serve("--require-approval-signature")
    assert empty.returncode == 2 and "error: --approval-secret-file" in empty.stderr
    assert "is empty" in empty.stderr and "http://" not in empty.stdout
    assert required.returncode == 2 and "needs an approval secret" in required.stderr
    assert SECRET_FILE_ENV in required.stderr  # (among the sources it names)
    from_env = _serve(env={SECRET_FILE_ENV: str(path)})
    assert from_env.returncode == 2 and f"error: ${SECRET_FILE_ENV} " in from_env.stderr
    both = _serve(env={SECRET_FILE_ENV: str(path), SECRET_ENV: SECRET})
    assert both.returncode == 2 and f"${SECRET_ENV} or ${SECRET_FILE_ENV}" in both.stderr
    assert SECRET not in both.stdout + both.stderr and "http://" not in both.stdout
    helped = _serve("--help", env={SECRET_ENV: SECRET})
    assert (
        "--approval-secret-file" in helped.stdout
        and "--require-approval-signature" in helped.stdout
    )
    assert SECRET not in helped.stdout + helped.stderr


async def test_a_serve_process_signs_with_the_secret_its_file_variable_names(tmp_path, monkeypatch):
    """A real ``serve`` given nothing but ``$AXON_APPROVAL_SECRET_FILE`` signs its
    approval requests with that file's secret and takes the signed answer."""
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    secret_path, mark = tmp_path / "secret", tmp_path / "mark"
    secret_path.write_bytes(SECRET.encode() + b"\n")
    monkeypatch.setenv(SECRET_FILE_ENV, str(secret_path))
    async with serve_process(tmp_path / "s.db", mark) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            first = await post(client, body("s"))
            asked = request_of(first)
            signed = SIGNER.sign("s", asked["approvalId"], "M", "write_mark", {"path": str(mark)})
            assert asked["signature"] == signed
            part = {
                **approval_part(asked["approvalId"], True, signature=signed),
                **{"type": "tool-write_mark", "toolCallId": "M", "input": {"path": str(mark)}},
            }
            second = await post(client, answer("s", first[0]["messageId"], part))
    assert second[1]["type"] == "tool-output-available" and mark.read_text() == "x"


def test_the_requirements_decision_for_agui_and_a2a_is_said_at_start():
    """``serve`` with the requirement and AG-UI or A2A says at start that their
    decisions carry no signature; nothing is said without them or the requirement."""
    said = unsigned_decisions_warning(True, ("ai-sdk", "ag-ui", "a2a"))
    assert said is not None and "ag-ui and a2a" in said and "--protocols" in said
    assert unsigned_decisions_warning(True, ("ai-sdk", "openai", "mcp")) is None
    assert unsigned_decisions_warning(False, ("ai-sdk", "ag-ui")) is None
