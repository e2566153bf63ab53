"""``python -m runtime`` (installed as ``axon`` too: the same command): run a turn in the
terminal, or print its chunks as JSON lines.

    python -m runtime run "Weather in Paris?"            # the offline scripted demo
    python -m runtime run --jsonl "Weather in Paris?"    # one OutputChunk per line
    python -m runtime run --file chart.png "What does this show?"   # attach files
    python -m runtime run --provider openai --model gpt-4o-mini "Hello"
    python -m runtime run --provider anthropic --base-url http://127.0.0.1:8080 \
        --model claude-sonnet-4-5 "Hello"
    python -m runtime run --store s.db --session ID --approve-all   # decide a waiting turn

    python -m runtime serve                              # web UI + AI SDK (useChat) API
    python -m runtime mcp-server                         # the agent as an MCP tool (stdio)

Real providers read their key from ``--api-key`` or the SDK's usual environment
variable (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``), only when the call is made. Their
agent has no tools and no instructions unless given (``--instructions``, ``--mcp``,
``--demo-tools``, or ``--agent module:name`` for an agent of one's own); the scripted demo
always has its weather and clock tools.

Bad input (an invalid session id, a store that cannot be opened, a missing file) prints
one ``error: ...`` line on stderr and exits with status 2, before anything is written.
A closed stdout or stderr (``>&-``) is written to as if it were the null device. A
stdout whose reader leaves mid-turn (``| head -1``) ends the turn (saved, interrupted)
and the command with status 0, rendered or ``--jsonl``.

A turn that waits for a person (a tool that needs approval, a client-side tool;
docs/approval.md) is decided here: ``--approve-all`` / ``--deny-all``, or else, when stdin
is a terminal, ``approve NAME(ARGS)? [y/N]`` for each call; then the turn goes on. With
neither (a script, a closed stdin) ``run`` says how to decide it on one line and exits
with status 3: it never waits for an answer that cannot come.
"""

from __future__ import annotations

import argparse
import json
import mimetypes
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

import orjson
import trio

from actors.plugins.recorder import read_jsonl
from actors.stores import is_store_url, open_store
from runtime.actor_messages import TurnResult
from runtime.agent import Agent
from runtime.app.commands import (
    MCP_HELP,
    BadInput,
    add_agent_arguments,
    add_log_level_argument,
    add_plugin_argument,
    agent_options,
    make_agent,
    make_plugins,
    non_negative,
    program_name,
    report_bad_input,
    say_on_stderr,
)
from runtime.app.expiry import TIMED_OUT, deadlines
from runtime.app.host import Host
from runtime.app.mcp_server import add_mcp_server_parser, mcp_server_command
from runtime.app.nested import end_sub_waits
from runtime.app.render import TerminalRenderer, describe_usage, terminal_line, terminal_text
from runtime.app.web.serve import add_serve_parser, serve_command
from runtime.app.worker import add_worker_parser, worker_command
from runtime.approval import APPROVAL, WAITING_META, PendingCall, pending_calls, waiting_calls
from runtime.chunks import Usage
from runtime.errors import (
    ActorFailed,
    AlreadyDecided,
    ConfigurationError,
    InvalidCursor,
    InvalidDecision,
    InvalidMedia,
    StoreError,
    UnknownApproval,
    WaitExpired,
    describe_exception,
)
from runtime.events import Event
from runtime.ids import new_id
from runtime.liveness import public_meta, settle
from runtime.logging import configure_logging
from runtime.media import MediaLimits, check_limits, user_content
from runtime.messages import AssistantMessage, Awaiting, File, Image, Message, is_media_output
from runtime.output import OUTPUT_CHUNK_TYPES
from runtime.output_schema import output_schema
from runtime.redact import redact_url
from runtime.serde import converter, dumps, exact_loads, structure, unstructure
from runtime.store import SessionInfo, list_page, validate_session_id
from runtime.tools import abandoned_calls

__all__ = ["MCP_HELP", "BadInput", "build_parser", "main", "make_agent", "report_bad_input"]


STORE_HELP = "session store: an SQLite file or a postgresql:// URL"
OUTPUT_KINDS = frozenset(cls.kind for cls in OUTPUT_CHUNK_TYPES)  # type: ignore[attr-defined]
"""The output chunks' event kinds (``output.text-delta``...): what ``replay`` renders."""
WAITING_STATUS = 3
"""``run``'s exit status when the turn waits for a decision nobody could give here."""


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m runtime`` command line: ``run``, the stored sessions' commands
    (``replay``, ``sessions``, ``show``, ``delete``),
    ``serve``, ``worker`` and ``mcp-server``."""
    parser = argparse.ArgumentParser(prog=program_name(), description="Axon agent runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_parser(sub)
    _add_history_parsers(sub)
    add_serve_parser(sub)
    add_worker_parser(sub)
    add_mcp_server_parser(sub)
    return parser


def _add_run_parser(sub: Any) -> None:
    """``run``: one turn, rendered (or as JSON lines), with its agent's options."""
    run = sub.add_parser("run", help="run one turn and render it")
    run.add_argument(
        "prompt",
        nargs="?",
        help="the user input (optional with --session when its turn waits for approval)",
    )
    run.set_defaults(usage_error=run.error)  # a prompt is optional with --session only
    run.add_argument("--jsonl", action="store_true", help="print each OutputChunk as a JSON line")
    run.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="PATH_OR_URL",
        help="attach an image or file (a path, or an http(s) URL the provider fetches); repeatable",
    )
    add_agent_arguments(run)
    run.add_argument(
        "--store", default=None, help=f"{STORE_HELP} to save the session in (default: none)"
    )
    run.add_argument(
        "--session", default=None, help="session id in --store (resumes it if it is stored)"
    )
    run.add_argument(
        "--approve-all",
        action="store_true",
        help="approve every tool call that waits for approval (no prompt)",
    )
    run.add_argument(
        "--deny-all", action="store_true", help="deny every tool call that waits for approval"
    )
    run.add_argument(
        "--output-schema",
        default=None,
        metavar="FILE",
        help="a JSON schema file (an object schema): the answer must be JSON matching it",
    )
    run.add_argument(
        "--delay",
        type=non_negative(float),
        default=None,
        help="scripted demo: seconds between chunks (default 0.02 on a terminal)",
    )
    add_log_level_argument(run, "critical", "; the output already shows the turn's errors")
    run.add_argument(
        "--record",
        default=None,
        help="append every bus event to this JSONL file (--plugin recorder:FILE)",
    )
    run.add_argument("--mcp", action="append", default=[], metavar="SERVER", help=MCP_HELP)
    run.add_argument(
        "--otel",
        action="store_true",
        help="export OpenTelemetry traces, configured by the OTEL_* variables "
        "(docs/telemetry.md; --plugin otel)",
    )
    add_plugin_argument(run)


def _add_history_parsers(sub: Any) -> None:
    """``replay``, ``sessions``, ``show`` and ``delete``: what was recorded or stored."""
    replay = sub.add_parser("replay", help="re-render a recorded session from a JSONL file")
    replay.add_argument("file", help="a JSONL event log (see --record)")
    replay.add_argument("--session", default=None, help="only this session's output")
    replay.add_argument("--jsonl", action="store_true", help="print the output chunks as JSON")

    sessions = sub.add_parser(
        "sessions", help="list the sessions in a store, most recently saved first"
    )
    sessions.add_argument("--store", required=True, help=STORE_HELP)
    sessions.add_argument(
        "--limit",
        type=_page_size,
        default=SESSIONS_PAGE,
        metavar="N",
        help=f"list at most N sessions (default {SESSIONS_PAGE}); a line on stderr says "
        "how to list the next ones",
    )
    sessions.add_argument(
        "--after",
        default=None,
        metavar="CURSOR",
        help="list the sessions after this cursor (what the line after a full page names)",
    )
    sessions.add_argument("--all", action="store_true", help="list every session")
    sessions.add_argument(
        "--json",
        action="store_true",
        help='print {"sessions": [...], "next_cursor": ...} as one JSON line',
    )

    show = sub.add_parser("show", help="print one stored conversation with its parts")
    show.add_argument("session_id")
    show.add_argument("--store", required=True, help=STORE_HELP)
    show.add_argument("--json", action="store_true", help="print the messages as JSON")

    delete = sub.add_parser(
        "delete",
        help="delete one stored session (asks first on a terminal; --yes does not ask)",
    )
    delete.add_argument("session_id")
    delete.add_argument("--store", required=True, help=STORE_HELP)
    delete.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help="delete without asking (needed when stdin is not a terminal)",
    )


def load_attachment(source: str) -> Any:
    """An :class:`~runtime.messages.Image` (when the bytes or URL say image) or a
    :class:`~runtime.messages.File` for ``--file``; a missing file is :class:`BadInput`."""
    if source.startswith(("http://", "https://")):
        guessed = mimetypes.guess_type(source.split("?")[0])[0] or ""
        if guessed.startswith("image/"):
            return Image(url=source)
        return File(url=source, filename=os.path.basename(source.split("?")[0]) or None)
    if not os.path.isfile(source):
        raise BadInput(f"no file at {source}")
    with open(source, "rb") as f:
        data = f.read()
    try:
        return Image(data=data)
    except InvalidMedia:
        return File(data=data, filename=os.path.basename(source))


def run_input(args: argparse.Namespace) -> Any:
    """The ``run`` command's user input: the prompt, then each ``--file`` in order, checked
    against the default media limits (before any store is opened). ``None`` without a
    prompt: the stored turn that waits is to be decided and resumed."""
    if args.prompt is None:
        if args.file:
            raise BadInput("--file needs a prompt to attach to")
        return None
    if not args.file:
        return args.prompt
    content = user_content([args.prompt, *(load_attachment(s) for s in args.file)])
    check_limits(content, MediaLimits(allow_urls=args.media_urls != "off"))
    return content


def check_arguments(args: argparse.Namespace) -> None:
    """Reject bad session ids and missing files before any store is opened or created."""
    for name in ("session", "session_id"):
        value = getattr(args, name, None)
        if value is not None:
            validate_session_id(value)
    command = getattr(args, "command", None)
    if (
        command in ("show", "sessions", "delete")
        and not is_store_url(args.store)
        and not os.path.exists(args.store)
    ):
        raise BadInput(f"no session store at {args.store}")  # reading must not create one
    if command == "replay" and not os.path.isfile(args.file):
        raise BadInput(f"no event log at {args.file}")
    if command == "run" and args.session is not None and args.store is None:
        raise BadInput("--session needs --store: without a store there is nothing to resume")
    if command == "run":
        if args.approve_all and args.deny_all:
            raise BadInput("--approve-all and --deny-all cannot be used together")
        if args.prompt is None and not is_store_url(args.store) and not os.path.exists(args.store):
            raise BadInput(f"no session store at {args.store}")  # nothing there waits
        args.input = run_input(args)
    if getattr(args, "output_schema", None) is not None:
        args.output_type = read_output_schema(args.output_schema)


def read_output_schema(path: str) -> dict[str, Any]:
    """The JSON schema in ``path`` (``run --output-schema``), checked as an agent would
    check it; a missing file, invalid JSON or an unusable schema is :class:`BadInput`."""
    try:
        with open(path, "rb") as f:
            schema = exact_loads(f.read())  # (a bound past 64 bits exactly)
    except OSError as exc:
        raise BadInput(f"cannot read the output schema {path}: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise BadInput(f"the output schema {path} is not JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise BadInput(f"the output schema {path} must be a JSON object (a JSON schema)")
    try:
        output_schema(schema)
    except ConfigurationError as exc:
        raise BadInput(f"the output schema {path} cannot be used: {exc}") from None
    return schema


async def run_command(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    session_id = args.session or new_id("session")
    agent = make_agent(args, session_id=session_id)  # an --agent function: called here
    assert isinstance(agent, Agent)
    renderer = None
    if not args.jsonl:
        renderer = TerminalRenderer()
    out_stream = sys.stdout.buffer
    plugins = make_plugins(args)  # a bad name or option: one error line, before any turn
    async with Host.open(store=args.store, handle_signals=True) as host:
        for plugin in plugins:
            try:
                await host.start_actor(plugin)
            except ActorFailed as exc:  # its file cannot be opened, its exporter built...
                raise BadInput(str(exc)) from None  # "actor NAME could not start: ..."
        session = await host.open_session(agent, session_id=session_id)
        result: TurnResult | None = None
        if args.input is None:  # no prompt: the session's waiting turn goes on
            waiting = waiting_calls(session.messages)
            if not waiting:
                raise BadInput(
                    f"session {session_id} has no turn waiting for a decision: give a prompt"
                )
            if renderer is not None:
                renderer.know_calls(waiting)
        else:
            result = await render_turn(session.stream(args.input), renderer, out_stream)
        while result is None or result.finish_reason == "awaiting-input":
            status = await decide_waiting(session, args, renderer)
            if status == WENT_ON:  # (the host ran the continuation; its text is shown)
                break
            if status is not None:
                return status
            result = await render_turn(session.resume(), renderer, out_stream)
    if args.store is not None and args.session is None:  # the id it made: say how to resume
        say_on_stderr(f"session {session_id} (continue it with --session {session_id})\n")
    if result is not None and result.error is not None and result.finish_reason != "error":
        # The answer streamed, but saving it failed (a full disk, a writer that kept
        # overtaking this one): say so, rather than exit 0 as if it were stored.
        say_on_stderr(
            f"the turn was not saved to {redact_url(args.store)}: "
            f"{result.error.kind}: {result.error.message}\n"
        )
        return 1
    if result is not None and args.store is not None and not result.saved:
        # Not confirmed within the turn's bound (another process held the store's write
        # lock): the host's close waited for the save, which landed or failed since.
        # Read the store to tell which, rather than exit 0 over a turn that is lost.
        unsaved = await _turn_unsaved(args.store, session_id, result)
        if unsaved is not None:
            say_on_stderr(f"the turn was not saved to {redact_url(args.store)}: {unsaved}\n")
            return 1
    return 0 if result is not None and result.finish_reason not in ("error", "aborted") else 1


async def _turn_unsaved(store_spec: str, session_id: str, result: TurnResult) -> str | None:
    """Why the turn ``result`` ended is not in the store, or ``None`` if it is."""
    try:
        store = await open_store(store_spec)
        try:
            record = await store.load(session_id)
        finally:
            await store.aclose()
    except StoreError as exc:
        return f"the store cannot be read to check it: {exc}"
    stored = {message.id for message in record.messages} if record is not None else set()
    if all(message.id in stored for message in result.new_messages):
        return None
    return (
        "the store did not take its save (another process holding the file's write lock "
        "for too long?); --log-level error shows why"
    )


async def render_turn(stream: Any, renderer: Any, out: Any) -> TurnResult | None:
    """Run a turn (or a continuation) to its end, rendering each chunk (or writing it as
    a JSON line without a renderer); its result."""
    async with stream as output:
        async for chunk in output:
            if renderer is not None:
                renderer.render(chunk)
            else:
                out.write(json_line(converter.unstructure(chunk)))
                out.flush()
    return output.result


def json_line(data: Any) -> bytes:
    """``data`` as one JSON line. A text holding a lone surrogate (half an emoji a
    provider split across two deltas) is one orjson refuses: it is written with the
    surrogate escaped (``\\ud83d``), as Python's ``json`` writes it, not a traceback."""
    try:
        return orjson.dumps(data) + b"\n"
    except orjson.JSONEncodeError:
        return json.dumps(data, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"


NO_CLIENT = "the command line has no client to run the client-side tool {}"


async def decide_waiting(session: Any, args: argparse.Namespace, renderer: Any) -> int | None:
    """Decide every call the session's turn still waits for: ``--approve-all``,
    ``--deny-all``, or a ``[y/N]`` prompt when stdin is a terminal (a client-side tool,
    which nothing here can run, gets an error as its result). ``None`` once all are
    decided (the turn can resume); else the exit status: :data:`WAITING_STATUS` when
    nobody here can decide (the line on stderr says how to), 130 for Ctrl-C at a prompt."""
    calls = [c for c in waiting_calls(session.messages) if not c.decided]
    interactive = sys.stdin is not None and sys.stdin.isatty()
    if calls and not (args.approve_all or args.deny_all or interactive):
        say_on_stderr(waiting_line(calls, session.id, args) + "\n")
        return WAITING_STATUS
    for call in calls:
        if call.kind == "client":
            name = terminal_line(call.tool_name)  # the stored session's
            say_on_stderr(f"{NO_CLIENT.format(name)}: it gets an error as its result\n")
    prompt_out = sys.stderr if renderer is None else sys.stdout  # --jsonl keeps stdout JSON
    for index, call in enumerate(calls):
        decision: dict[str, Any]
        if call.kind == "client":
            decision = {"error": NO_CLIENT.format(call.tool_name)}
        elif args.approve_all or args.deny_all:
            decision = {"approved": args.approve_all}
            decision["reason"] = None if args.approve_all else "denied by --deny-all"
        else:
            if renderer is not None:
                renderer.end_line()
            try:
                answered = await prompt_decision(session, call, prompt_out)
            except _Expired:
                return await _went_on_without(session, call, args, renderer)
            if not answered:
                prompt_out.write("\n")
                if args.store is not None:  # stored, still waiting: how to decide it later
                    say_on_stderr(waiting_line(calls[index:], session.id, args) + "\n")
                return 130
            continue
        await _decided(session, call, decision)
    return None


WENT_ON = -1
"""What :func:`decide_waiting` returns when the turn went on without ``run`` (an answer
typed after the wait expired: the host ran the continuation, shown as text since)."""
EXPIRED_LOOK = 1.0
"""Seconds between looks at a session whose expired wait the host goes on with in the
background, while ``run`` waits for that continuation (:func:`_went_on_without`)."""


class _Expired(Exception):
    """The answer typed at the prompt came after the call's wait expired: the host denied
    it ``timed out`` and runs the turn on in the background (docs/approval.md, "Expiry")."""


async def _decided(session: Any, call: PendingCall, decision: dict[str, Any]) -> None:
    try:
        await session.decide(call.approval_id, **decision)
    except (AlreadyDecided, UnknownApproval) as exc:  # decided elsewhere meanwhile
        if isinstance(exc, WaitExpired) or _timed_out(session.messages, call.approval_id):
            raise _Expired from None
        raise BadInput(str(exc)) from None


def _timed_out(messages: Sequence[Message], approval_id: str) -> bool:
    """Whether the wait ``approval_id`` was decided by its expiry."""
    return any(
        p.awaiting.decided and p.awaiting.approved is False and p.awaiting.reason == TIMED_OUT
        for p in waiting_parts(messages)
        if p.awaiting is not None and p.awaiting.id == approval_id
    )


def waiting_parts(messages: Sequence[Message]) -> list[Any]:
    """The calls of the last assistant message (the turn's that waited)."""
    for message in reversed(messages):
        if isinstance(message, AssistantMessage):
            return [p for p in message.content if p.type == "tool-call"]
    return []


async def _went_on_without(
    session: Any, call: PendingCall, args: argparse.Namespace, renderer: Any
) -> int | None:
    """A person answered ``call`` after its wait expired: before, ``error: ... was decided
    already`` (exit 2), while the host had denied it ``timed out`` and run the turn on
    in the background, whose answer nobody saw (and, without ``--store``, that the
    host's close then cut). Said so; the continuation is waited for and its text
    printed (:data:`WENT_ON`); calls it asks about anew are asked about (``None``:
    decided, resume)."""
    name = call.asked_tool or call.tool_name
    say_on_stderr(
        terminal_line(
            f"{name}: its wait expired before the answer, so it was denied ({TIMED_OUT}) "
            "and the turn went on without it"
        )
        + "\n"
    )
    step = max((p.step for p in waiting_parts(session.messages)), default=0)
    # (a refusal by the clock alone: the host records the expiry in the background)
    while (
        session.busy
        or call.approval_id in {c.approval_id for c in pending_calls(session.messages)}
        or any(c.decided for c in waiting_calls(session.messages))
    ):
        with trio.move_on_after(EXPIRED_LOOK):  # (a change it is not woken for)
            await session.wait_changed()
    out = sys.stdout if renderer is not None else sys.stderr
    for message in session.messages:
        if isinstance(message, AssistantMessage) and message.id == call.message_id:
            text = "".join(p.text for p in message.content if p.type == "text" and p.step > step)
            if text.strip():
                out.write(terminal_text(text) + "\n")
                out.flush()
    if any(not c.decided for c in waiting_calls(session.messages)):
        return await decide_waiting(session, args, renderer)
    return WENT_ON


async def prompt_decision(session: Any, call: PendingCall, out: Any) -> bool:
    """Ask about ``call`` at the terminal until it is decided: ``y`` approves, ``e``
    approves with an input typed as a JSON object (asked again, saying why, when it is
    not JSON or the tool's schema refuses it: docs/approval.md, "Approving with
    edits"), anything else denies. ``False`` for Ctrl-C (nothing recorded)."""
    while True:
        answer = await ask(f"approve {describe_call(call)}? [y/N] ", out)
        if answer is None:
            return False
        choice = answer.strip().lower()
        if choice not in ("e", "edit"):
            approved = choice in ("y", "yes")
            reason = None if approved else "denied at the prompt"
            await _decided(session, call, {"approved": approved, "reason": reason})
            return True
        edits = call.asked_tool or call.tool_name  # (a sub-agent's approval: its call's)
        typed = await ask(f"input for {terminal_line(edits)} (a JSON object): ", out)
        if typed is None:
            return False
        try:
            # orjson: a thousand "[" typed is a JSONDecodeError (a ValueError), where the
            # json module raised RecursionError out of the prompt and the command failed.
            edited = exact_loads(typed)  # (an integer past 64 bits exactly)
            await _decided(session, call, {"approved": True, "edited_input": edited})
        except InvalidDecision as exc:  # (a ValueError too: caught first)
            say_on_stderr(terminal_line(f"{exc}: asked again") + "\n")
        except ValueError as exc:  # not JSON
            say_on_stderr(terminal_line(f"not JSON: {exc}: asked again") + "\n")
        else:
            return True


def describe_call(call: PendingCall) -> str:
    """``NAME({"arg": ...})``: a waiting call as a person reads it (its control characters
    and bidirectional overrides escaped: what is approved is what is shown). A
    sub-agent's approval passed up names the sub call that asks, after the agent tool's:
    ``helper({...}) asking wire_money({...})``."""
    shown = f"{call.tool_name}({json.dumps(call.input, ensure_ascii=False)})"
    if call.asked_tool is not None:
        asked = json.dumps(call.asked_input, ensure_ascii=False)
        shown = f"{shown} asking {call.asked_tool}({asked})"
    return terminal_line(shown)


def waiting_line(calls: list[PendingCall], session_id: str, args: argparse.Namespace) -> str:
    """The one line ``run`` ends with when nobody here can decide the waiting calls (or
    Ctrl-C left them waiting): with ``--store``, the command that decides them later."""
    store = args.store
    what = ", ".join(
        describe_call(c) + (" (client-side: nothing here runs it)" if c.kind == "client" else "")
        for c in calls
    )
    if store is None:
        return (
            f"the turn waits for approval: {what}; nothing is stored without --store: run "
            "again with --approve-all or --deny-all, or from a terminal to be asked"
        )
    where = redact_url(store)
    # The same agent must decide it: the command repeats the options that built this one.
    command = shlex.join(["run", *agent_options(args), "--store", where, "--session", session_id])
    key = " (and your --api-key)" if getattr(args, "api_key", None) else ""
    return (
        f"the turn waits for approval: {what}; session {session_id} is stored in {where}: "
        f"decide with `{program_name()} {command} --approve-all` (or --deny-all){key}"
    )


async def ask(question: str, out: TextIO) -> str | None:
    """``question`` on ``out``, and the line typed on stdin ("" at its end); ``None`` when
    Ctrl-C interrupts (the host's own SIGINT handler would only cancel turns, and no turn
    runs while a prompt waits, so the prompt listens for it itself)."""
    answer: str | None = None
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        out.write(question)  # only now: a Ctrl-C as soon as it shows reaches this receiver
        out.flush()
        async with trio.open_nursery() as nursery:

            async def read() -> None:
                nonlocal answer
                answer = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
                nursery.cancel_scope.cancel()

            nursery.start_soon(read)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break
    return answer


def replay_command(args: argparse.Namespace) -> int:
    """Render the output chunks of a recorded JSONL event log, in order.

    A recording in which a turn has no ``turn.finished`` (or that has none at all) was cut
    short: what it holds is rendered, then an ``error: ... is incomplete`` line, status 1,
    so a script never takes half an answer for the whole one."""
    renderer = None if args.jsonl else TerminalRenderer()
    try:
        records = read_jsonl(args.file)
    except OSError as exc:
        raise BadInput(f"cannot read {args.file}: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise BadInput(f"{args.file} is not a JSONL event log: {exc}") from None
    turns: dict[Any, bool] = {}  # turn id -> whether its turn.finished was recorded
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict):
            raise BadInput(f"{args.file} is not a JSONL event log: line {number} is no object")
        if args.session and record.get("session_id") != args.session:
            continue
        kind = str(record.get("kind", ""))
        turn_id = record.get("turn_id")
        if turn_id is not None and not isinstance(turn_id, str):  # was a traceback (a dict)
            raise BadInput(
                f"{args.file} is not a JSONL event log: line {number}'s turn_id is no text"
            )
        if kind == "turn.finished":
            turns[turn_id] = True
        elif turn_id:
            turns.setdefault(turn_id, False)
        if not kind.startswith("output."):
            continue
        if renderer is None:
            sys.stdout.write(dumps(record, marked=False).decode() + "\n")
        elif kind in OUTPUT_KINDS:  # a kind a later version records is not shown here
            try:
                chunk = structure(record, Event)
            except Exception as exc:  # cattrs: a class validation error, a missing field...
                raise BadInput(
                    f"{args.file} line {number} is no valid {kind} event: "
                    f"{describe_exception(exc).splitlines()[0]}"
                ) from None
            renderer.render(chunk)
    unfinished = [turn_id for turn_id, finished in turns.items() if not finished]
    if unfinished or not turns:
        if renderer is not None:
            renderer.end_line()
        sys.stdout.flush()
        # the turn id is the recording's: an escape in it must not reach the terminal
        missing = f"turn {terminal_line(unfinished[0])} has" if unfinished else "it has"
        say_on_stderr(
            f"error: {args.file} is incomplete: {missing} no turn.finished event"
            " (the recording was cut short)\n"
        )
        return 1
    return 0


SESSIONS_PAGE = 50
"""How many sessions ``sessions`` lists without ``--limit`` or ``--all``."""


def _page_size(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 10**9):
        raise argparse.ArgumentTypeError(f"invalid --limit {text!r}: a whole number from 1")
    return int(text)


async def sessions_command(args: argparse.Namespace) -> int:
    store = await open_store(args.store)
    infos: list[SessionInfo] = []
    try:
        # (a Namespace made by hand, as before paging, lists the default page)
        after = getattr(args, "after", None)
        limit = 10**9 if getattr(args, "all", False) else getattr(args, "limit", SESSIONS_PAGE)
        while True:
            try:
                page = await list_page(store, limit=limit - len(infos), after=after)
            except InvalidCursor as exc:
                say_on_stderr(f"error: --after: {exc}\n")
                return 2
            infos += page.sessions
            after = page.next_cursor
            if after is None or len(infos) >= limit:
                break
    finally:
        await store.aclose()
    if getattr(args, "json", False):
        # the application's meta, as the web lists and `session.meta` show it: the
        # runner's own keys (runtime.liveness.PRIVATE_META) are no script's to read
        listing = [
            {
                "session_id": i.session_id,
                "message_count": i.message_count,
                "meta": public_meta(i.meta),
            }
            for i in infos
        ]
        body = dumps({"sessions": listing, "next_cursor": after}, default=str, marked=False)
        sys.stdout.write(body.decode() + "\n")
        return 0
    for info in infos:
        agent = terminal_line(str(info.meta.get("agent", "")))  # one field, whatever it holds
        line = f"{terminal_line(info.session_id)}\t{info.message_count} messages\t{agent}"
        waiting = info.meta.get(WAITING_META)
        if isinstance(waiting, int) and waiting > 0:  # docs/approval.md: `show` says what
            line += f"\twaiting for input ({waiting} call{'s' if waiting > 1 else ''})"
        sys.stdout.write(line + "\n")
    if after is not None:  # on stderr: the listing on stdout stays one session a line
        sys.stdout.flush()
        say_on_stderr(  # the cursor is the store's text: a plug-in's, maybe anything
            terminal_line(
                f"(the {len(infos)} most recent; more after them: add --after {after}, "
                "or --all for every session)"
            )
            + "\n"
        )
    return 0


async def show_command(args: argparse.Namespace) -> int:
    from rich.console import Console  # rich: only when printing a conversation

    store = await open_store(args.store)
    try:
        record = await store.load(args.session_id)
        if record is not None:  # a turn a dead process left running (runtime.liveness)
            record = await settle(store, record)
    finally:
        await store.aclose()
    if record is None:
        say_on_stderr(f"no session {args.session_id!r} in {args.store}\n")
        return 1
    if args.json:
        sys.stdout.write(dumps(unstructure(list(record.messages)), marked=False).decode() + "\n")
        return 0
    # stored text is never markup, nor emoji codes (":warning:" was printed as ⚠)
    console = Console(highlight=False, markup=False, emoji=False)

    def say(text: str, **options: Any) -> None:  # stored text never drives the terminal
        console.print(terminal_text(text), **options)

    for msg in record.messages:
        if msg.role == "assistant":
            flag = f" ({msg.status})" if msg.status != "complete" else ""
            say(f"assistant{flag}", style="bold")
            for part in msg.content:
                if part.type == "text":
                    say(f"  [step {part.step}] text: {part.text}")
                elif part.type == "reasoning":
                    signed = " signed" if part.signature else ""
                    line = f"  [step {part.step}] reasoning{signed}: {part.text}"
                    say(line, style="dim")
                elif part.type == "tool-call":
                    call_input = dumps(part.input, marked=False).decode()
                    say(
                        f"  [step {part.step}] tool-call {part.tool_name}({call_input}) "
                        f"id={part.tool_call_id}{_decision(part.awaiting)}"
                    )
                else:
                    say(f"  [step {part.step}] {part.type}")
            if msg.error is not None:
                say(f"  error: {msg.error.kind}: {msg.error.message}", style="red")
            if msg.usage is not None:
                say(f"  usage: {describe_usage(msg.usage)}", style="dim")
        elif msg.role == "tool":
            body = msg.error if msg.error else _describe_output(msg.output)
            label = "error" if msg.error else "result"
            say(f"tool {msg.tool_name} {label} (step {msg.step}): {body}")
        elif msg.role == "user" and not isinstance(msg.content, str):
            say(f"user: {msg.text}")
            for item in msg.media:
                say(f"  [{_describe_media(item)}]", style="dim")
        else:
            say(f"{msg.role}: {msg.content}")
    if (total := session_usage(record.messages)) is not None:
        say(f"session usage: {describe_usage(total)}", style="bold")
    # Last, so what is still to be done (and the ids to do it with) ends the output.
    for line in waiting_lines(record.messages):
        say(line, style="bold", soft_wrap=True)  # ids copied whole
    return 0


async def delete_command(args: argparse.Namespace) -> int:
    """Delete one stored session (the store's ``delete``: in PostgreSQL its open turns
    are cancelled in the same transaction, docs/architecture.md "Deleting a session").
    On a terminal it asks first unless ``--yes``; with stdin not a terminal, ``--yes``
    is required (a script never deletes on a guess). An unknown session is exit 1."""
    store = await open_store(args.store)
    try:
        record = await store.load(args.session_id)
        if record is None:
            say_on_stderr(f"no session {args.session_id!r} in {args.store}\n")
            return 1
        if not args.yes:
            if not sys.stdin.isatty():
                raise BadInput(
                    f"not deleting session {args.session_id!r}: stdin is not a terminal "
                    "to confirm on; add --yes"
                )
            title = record.meta.get("title")
            named = f" ({terminal_text(str(title))!r})" if title else ""
            say_on_stderr(
                f"delete session {args.session_id!r}{named}, "
                f"{len(record.messages)} messages, from {args.store}? [y/N] "
            )
            answer = sys.stdin.readline().strip().lower()
            if answer not in ("y", "yes"):
                say_on_stderr("not deleted\n")
                return 1
        await end_sub_waits(store, args.session_id)  # its sub-sessions' waits for it
        await store.delete(args.session_id)
    finally:
        await store.aclose()
    sys.stdout.write(f"deleted session {args.session_id!r}\n")
    return 0


def _decision(awaiting: Awaiting | None) -> str:
    """What ``show`` adds to a call that waited once it is decided: the stored message
    holds the decision too (docs/approval.md); still waiting, the last lines say so."""
    if awaiting is None or not awaiting.decided:
        return ""
    if awaiting.kind != APPROVAL:
        return ", answered by the client"
    if awaiting.approved and awaiting.original_input is not None:  # the input shown is the edit
        asked = dumps(awaiting.original_input, marked=False).decode()
        return f", approved with edits (the model's input {asked})"
    if awaiting.approved and awaiting.edited_input is not None:  # a sub-agent's call, edited
        edit = dumps(awaiting.edited_input, marked=False).decode()
        return f", approved with edits ({awaiting.asked_tool} runs with {edit})"
    if awaiting.approved:
        return ", approved"
    return f", denied: {awaiting.reason}" if awaiting.reason else ", denied"


def session_usage(messages: Sequence[Message]) -> Usage | None:
    """The usage of every turn of a stored conversation summed (its cost unknown if one
    turn's is), or ``None`` if no turn recorded any (messages stored before usage was)."""
    usages = [m.usage for m in messages if isinstance(m, AssistantMessage) and m.usage is not None]
    return sum(usages[1:], usages[0]) if usages else None


def waiting_lines(messages: Sequence[Message]) -> list[str]:
    """What ``show`` says of the calls the stored last turn still waits for (with the
    wall-clock time a wait expires, when it has one): docs/approval.md."""
    due = deadlines(messages)
    lines = []
    for call in pending_calls(messages):
        what = "approval" if call.kind == APPROVAL else "the client"
        key = "approval id" if call.kind == APPROVAL else "call id"
        call_input = dumps(call.input, marked=False).decode()
        line = f"waiting for {what}: {call.tool_name}({call_input}) {key} {call.approval_id}"
        if call.tool_call_id in due:
            when = datetime.fromtimestamp(due[call.tool_call_id], UTC)
            line += f", expires {when.isoformat(timespec='seconds')}"
        lines.append(line)
    return lines


def _describe_media(part: Any) -> str:
    where = f"{part.size} bytes" if part.data is not None else part.url
    name = getattr(part, "filename", None)
    return f"{part.type} {part.media_type}{f' {name}' if name else ''}, {where}"


def _describe_output(output: Any) -> str:
    if not is_media_output(output):
        return dumps(output, marked=False).decode()
    return " ".join(p.text if p.type == "text" else f"[{_describe_media(p)}]" for p in output)


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _stand_in_for_closed_streams() -> None:
    """A command started with its stdout or stderr closed (``axon run ... >&-``, a
    service manager's) finds ``sys.stdout`` ``None``: it writes to the null device as if
    sent there, instead of failing on its first write with a traceback nobody reads."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))  # the process's own, never closed


def main(argv: list[str] | None = None) -> int:
    _stand_in_for_closed_streams()
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run" and args.prompt is None and args.session is None:
        args.usage_error("the following arguments are required: prompt")  # argparse's own
    return report_bad_input(lambda: _dispatch(args))


async def _ending_abandoned(command: Any, args: argparse.Namespace) -> int:
    """Run ``command``; if its host abandoned a tool call's task (one that shields itself
    from cancellation: ``tool.abandoned``), end the process here, once the host has
    closed (its store too): ``trio.run`` waits for every task at its end, so Ctrl-C on
    ``run`` or ``serve`` hung for ever."""
    code = 1
    try:
        code = await command(args)
        return code
    except KeyboardInterrupt:
        code = 130
        raise
    finally:
        if abandoned_calls():
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # a closed or broken stream: nothing to flush to
                    pass
            os._exit(code)


def _dispatch(args: argparse.Namespace) -> int:
    check_arguments(args)
    if args.command == "replay":
        return replay_command(args)
    if args.command == "sessions":
        return trio.run(sessions_command, args)
    if args.command == "show":
        return trio.run(show_command, args)
    if args.command == "delete":
        return trio.run(delete_command, args)
    if args.command == "serve":
        try:
            return trio.run(_ending_abandoned, serve_command, args)
        except KeyboardInterrupt:
            return 130
    if args.command == "worker":
        try:
            return trio.run(_ending_abandoned, worker_command, args)
        except KeyboardInterrupt:
            return 130
    if args.command == "mcp-server":
        return trio.run(mcp_server_command, args)
    if args.command == "run":
        try:
            return trio.run(_ending_abandoned, run_command, args)
        except KeyboardInterrupt:
            return 130
        except BaseExceptionGroup as group:  # e.g. `... --jsonl | head`: the reader left
            if group.subgroup(BrokenPipeError) is None or group.subgroup(
                lambda e: not isinstance(e, BrokenPipeError | BaseExceptionGroup)
            ):
                raise
            _silence_stdout()
            return 0
        except BrokenPipeError:
            _silence_stdout()
            return 0
    return 2  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
