"""The logs and the supervision attacked where the last round left them: a stderr whose
reader has left, a crash written twice, a supervisor whose own handling of a crash
raises."""

from __future__ import annotations

import errno
import fcntl
import io
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trio

import runtime.logging
from actors.providers.scripted import ScriptedProvider
from runtime import Actor, Agent, Host, RestartPolicy
from runtime.errors import ActorFailed
from runtime.events import ActorGaveUp, TurnStarted
from runtime.logging import NonBlockingSink, configure_logging, unblocked

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
HANG_GUARD = 600  # seconds of the autojump clock: a hang fails instead of stalling
PROCESS_GUARD = 60  # seconds: only so a regression fails instead of hanging the suite
COMMAND_GUARD = 240
"""Seconds a ``python -m runtime`` child may take before it counts as hung: under the
pytest-timeout of 300, far over what load makes of it. A ``run`` is about 1 s of CPU, and
took 17-23 s of wall time beside a dozen busy processes on 2 cores (load 14-15); 60 s
left that a margin of three, and the test failed once in a full run under heavy load."""


def axon_with_stderr_gone(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m runtime ARGS`` with stderr a pipe whose reader has already left (as
    ``axon run ... 2>&1 | head -1`` leaves it after the first line): every write to it
    raises ``BrokenPipeError``."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "runtime", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=write,
            text=True,
            timeout=COMMAND_GUARD,
            cwd=cwd,
            env=ENV,
        )
    finally:
        os.close(write)


def saved_sessions(db: Path) -> int:
    """How many sessions ``db`` holds; ``-1`` if it holds no store (a failed assertion then
    says so beside the exit status, rather than raising before it)."""
    if not db.exists():
        return -1
    with closing(sqlite3.connect(db)) as conn:
        try:
            count: int = conn.execute("select count(*) from sessions").fetchone()[0]
        except sqlite3.Error:
            return -1
    return count


def test_a_run_whose_stderr_reader_left_shows_saves_and_exits_0(tmp_path):
    """The log tap's write raised BrokenPipeError: the tap crashed, the supervisor raised
    logging that, the host went down; ``run`` took it for stdout's reader leaving and
    exited 0, the answer not shown and the turn not saved."""
    db = tmp_path / "s.db"
    proc = axon_with_stderr_gone(
        "run", "--log-level", "info", "--store", str(db), "--session", "s1", "hi", cwd=tmp_path
    )
    seen = (proc.returncode, "windy in Paris" in proc.stdout, saved_sessions(db))
    assert seen == (0, True, 1), proc.stdout  # all three said at once, with what it showed


def test_a_run_without_a_session_id_whose_stderr_reader_left_saves_and_exits_0(tmp_path):
    """The line naming the new session (on stderr) is dropped, not raised."""
    db = tmp_path / "s.db"
    proc = axon_with_stderr_gone("run", "--store", str(db), "hi", cwd=tmp_path)
    seen = (proc.returncode, "windy in Paris" in proc.stdout, saved_sessions(db))
    assert seen == (0, True, 1), proc.stdout


def test_bad_input_whose_stderr_reader_left_still_exits_2(tmp_path):
    """The ``error: ...`` line raised BrokenPipeError out of the command: a traceback
    (into the broken pipe) and status 1, as if the command had crashed."""
    proc = axon_with_stderr_gone("run", "--file", str(tmp_path / "missing.png"), "hi", cwd=tmp_path)
    assert proc.returncode == 2


class BrokenPipeStream(io.StringIO):
    """A stderr whose reader left after ``lines`` writes."""

    def __init__(self, lines: int = 0) -> None:
        super().__init__()
        self.lines = lines
        self.attempts = 0

    def write(self, text: str) -> int:
        self.attempts += 1
        if self.attempts > self.lines:
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(text)


async def test_lines_to_a_broken_stderr_are_dropped_and_turns_run_and_save(tmp_path):
    stream = BrokenPipeStream(lines=1)
    configure_logging("info", stream=stream)  # type: ignore[arg-type]
    with trio.fail_after(PROCESS_GUARD):
        async with Host.open(store=str(tmp_path / "s.db")) as host:
            session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
            first = await session.run("hello")
            second = await session.run("again")
    assert (first.finish_reason, first.saved) == ("stop", True)
    assert (second.finish_reason, second.saved) == ("stop", True)
    assert stream.getvalue().startswith("{")  # what went out before the pipe broke


async def test_a_broken_stderr_is_not_written_to_again(tmp_path):
    """Dropped without a try once broken, as ``logging.Handler.handleError`` does: a
    syscall a line that can only fail."""
    stream = BrokenPipeStream(lines=0)
    configure_logging("info", stream=stream)  # type: ignore[arg-type]
    with trio.fail_after(PROCESS_GUARD):
        async with Host.open(store=str(tmp_path / "s.db")) as host:
            session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
            await session.run("hello")
            await session.run("again")
    assert stream.attempts == 1


class FullDisk(io.StringIO):
    """A log file on a disk that is full for its first write only."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def write(self, text: str) -> int:
        if not self.failed:
            self.failed = True
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(text)


async def test_a_write_that_fails_once_drops_its_lines_not_the_log_tap(tmp_path):
    """The failed write crashed the log tap (a crash line, a restart, its queued events
    lost); only the lines of that write are lost now."""
    stream = FullDisk()
    configure_logging("info", stream=stream)  # type: ignore[arg-type]
    with trio.fail_after(PROCESS_GUARD):
        async with Host.open(store=str(tmp_path / "s.db")) as host:
            session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
            await session.run("hello")
            await session.run("again")
    kinds = [line["event"] for line in json_lines(stream)]
    assert "actor.crashed" not in kinds
    assert kinds.count("turn.finished") == 2


async def test_a_line_the_log_file_cannot_encode_drops_that_line_only(tmp_path):
    """A log file opened ``ascii``, strict: the first line with ``é`` raises
    UnicodeEncodeError (a ValueError, as a closed file's is); the stream is not gone."""
    path = tmp_path / "axon.log"
    with path.open("w", encoding="ascii") as stream:
        configure_logging("info", stream=stream)
        with trio.fail_after(PROCESS_GUARD):
            async with Host.open(store=str(tmp_path / "s.db")) as host:
                session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
                await session.run("h\u00e9llo")
                await session.run("plain")
    lines = [orjson.loads(line) for line in path.read_text().splitlines()]
    assert [line["input"] for line in lines if line["event"] == "turn.started"] == ["plain"]


class CrashesOnce(Actor):
    subscribes_to = (TurnStarted,)

    def __init__(self, name: str = "crashes-once") -> None:
        super().__init__(name=name)
        self.crashed = False
        self.seen = 0

    async def handle(self, message: object) -> None:
        if not self.crashed:
            self.crashed = True
            raise ValueError("an observer's bug")
        self.seen += 1


def json_lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in out.getvalue().splitlines()]


async def test_a_crash_is_one_log_line_with_its_traceback_and_the_events_fields(autojump_clock):
    """The supervisor wrote ``actor.crashed`` (with the traceback) and the log tap wrote
    the bus event again (with ``error_type`` and ``restarts``): two lines a crash."""
    out = io.StringIO()
    configure_logging("info", stream=out)
    with trio.fail_after(HANG_GUARD):
        async with Host.open() as host:  # the log tap on
            observer = await host.start_actor(CrashesOnce())
            session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
            await session.run("hello")
            await session.run("again")
    assert observer.seen == 1
    lines = json_lines(out)
    (crashed,) = [line for line in lines if line["event"] == "actor.crashed"]
    assert crashed["actor"] == "crashes-once" and crashed["restarts"] == 0
    assert (crashed["error_type"], crashed["error"]) == (
        "ValueError",
        "ValueError: an observer's bug",
    )
    assert 'raise ValueError("an observer\'s bug")' in crashed["exception"]


async def test_a_restart_is_one_log_line(autojump_clock):
    out = io.StringIO()
    configure_logging("info", stream=out)
    with trio.fail_after(HANG_GUARD):
        async with Host.open() as host:
            await host.start_actor(CrashesOnce())
            session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
            await session.run("hello")
            await trio.sleep(1)  # past the restart's backoff: the tap has its event
    (restarted,) = [line for line in json_lines(out) if line["event"] == "actor.restarted"]
    assert (restarted["actor"], restarted["restarts"]) == ("crashes-once", 1)


class AlwaysCrashes(Actor):
    subscribes_to = (TurnStarted,)

    async def handle(self, message: object) -> None:
        raise ValueError("always")


async def test_a_give_up_is_one_log_line(autojump_clock):
    out = io.StringIO()
    configure_logging("info", stream=out)
    with trio.fail_after(HANG_GUARD):
        async with Host.open() as host:
            await host.start_actor(AlwaysCrashes(name="doomed"), policy=RestartPolicy(intensity=0))
            session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
            await session.run("hello")
    (gave_up,) = [line for line in json_lines(out) if line["event"] == "actor.gave-up"]
    assert (gave_up["actor"], gave_up["error"]) == ("doomed", "ValueError: always")


class ResetRaises(Actor):
    """An observer whose crash handler has a bug of its own."""

    subscribes_to = (TurnStarted,)

    def __init__(self) -> None:
        super().__init__(name="reset-raises")
        self.given_up = 0

    async def handle(self, message: object) -> None:
        raise ValueError("first bug")

    def on_crash(self, exc: BaseException) -> None:
        raise RuntimeError("second bug, in on_crash")

    def on_give_up(self, exc: BaseException) -> None:
        self.given_up += 1


async def test_an_on_crash_that_raises_gives_its_actor_up_and_the_turn_beside_it_ends(
    autojump_clock,
):
    """``on_crash`` raised in the supervisor's ``except``: out of the supervisor, into the
    host's nursery, which cancelled the turn running beside the actor and closed the
    host with the error."""
    with trio.fail_after(HANG_GUARD):
        async with Host.open() as host:
            watch = host.bus.subscribe([ActorGaveUp], name="watch")
            observer = await host.start_actor(ResetRaises())
            session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
            first = await session.run("hello")
            second = await session.run("again")
            await observer.stopped.wait()
            gave_up = watch.inbox.get_nowait()
    assert (first.finish_reason, first.text, first.saved) == ("stop", "hi", True)
    assert (second.finish_reason, second.text) == ("stop", "hi")
    assert observer.given_up == 1 and observer.inbox.closed
    assert (gave_up.actor, gave_up.error) == ("reset-raises", "ValueError: first bug")


async def test_a_supervisor_whose_crash_handling_fails_says_so_in_one_line(
    autojump_clock, monkeypatch
):
    """A bug in the supervisor's own crash path (here its event, refused by the bus):
    the actor is given up on, in a line that names both failures."""
    import runtime.lifecycle

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the supervisor's own bug")

    monkeypatch.setattr(runtime.lifecycle, "ActorCrashed", refuse)
    out = io.StringIO()
    configure_logging("info", stream=out)
    with trio.fail_after(HANG_GUARD):
        async with Host.open() as host:
            await host.start_actor(AlwaysCrashes(name="crashy"))
            session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
            result = await session.run("hello")
    assert (result.finish_reason, result.text) == ("stop", "hi")
    (gave_up,) = [line for line in json_lines(out) if line["event"] == "actor.gave-up"]
    assert gave_up["actor"] == "crashy" and gave_up["error"] == "ValueError: always"
    assert gave_up["supervisor_error"] == "RuntimeError: the supervisor's own bug"


class CannotStart(Actor):
    async def on_start(self) -> None:
        raise ValueError("no config")

    def on_crash(self, exc: BaseException) -> None:
        raise RuntimeError("and a bug in on_crash")


async def test_an_actor_that_cannot_start_and_whose_on_crash_raises_fails_its_start(
    autojump_clock,
):
    """Its starter is told (``ActorFailed``), as for an actor past its restart policy;
    the host stays up."""
    with trio.fail_after(HANG_GUARD):
        async with Host.open(log_tap=False) as host:
            try:
                await host.start_actor(CannotStart(name="nostart"))
            except ActorFailed as exc:
                failed = str(exc)
            session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
            result = await session.run("hello")
    assert failed == (
        "actor 'nostart' could not start: ValueError: no config (its crash could not be handled)"
    )
    assert result.finish_reason == "stop"


SERVE = [sys.executable, "-m", "runtime", "serve", "--port", "0", "--delay", "0"]
SMALL_PIPE = 4096  # bytes: one turn's info lines (about 6 KB) fill it
TURNS = 5


def small_pipe(stream: Any) -> None:
    """Shrink the pipe behind ``stream`` to :data:`SMALL_PIPE` bytes (``F_SETPIPE_SZ``), so
    a few lines fill it: a pipe nobody reads, filled without writing 64 KiB first."""
    fcntl.fcntl(stream.fileno(), fcntl.F_SETPIPE_SZ, SMALL_PIPE)


class UnreadServe:
    """``python -m runtime serve --log-level info`` whose stderr or stdout (``unread``) is a
    small pipe nobody reads (or ``stderr``, given: a socket the test reads when it likes);
    the other is read (stdout: past its first line, the URL) or discarded."""

    def __init__(self, unread: str, stderr: socket.socket | None = None) -> None:
        self.proc = subprocess.Popen(
            [*SERVE, "--log-level", "info"],
            cwd=ROOT,
            env=ENV,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=(
                stderr.fileno()
                if stderr is not None
                else subprocess.PIPE
                if unread == "stderr"
                else subprocess.DEVNULL
            ),
            text=True,
        )
        assert self.proc.stdout is not None
        if stderr is None:
            small_pipe(self.proc.stderr if unread == "stderr" else self.proc.stdout)
        line = self.proc.stdout.readline()
        assert line.startswith("Axon web UI on"), line
        self.url = line.split()[4].rstrip("/")
        if unread == "stderr":  # stdout read to its end, so only stderr fills
            stdout = self.proc.stdout
            threading.Thread(target=stdout.read, daemon=True).start()

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(PROCESS_GUARD)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def finished_turns(url: str, turns: int, first: int = 0) -> int:
    """How many of ``turns`` chat turns (sessions ``s{first}``, ``s{first + 1}`` ...), one
    after another, stream to their ``finish`` (the first that does not, in
    :data:`STALL_GUARD` seconds, ends the count)."""
    finished = 0
    with httpx.Client(base_url=url, timeout=STALL_GUARD) as client:
        for n in range(first, first + turns):
            body = {
                "id": f"s{n}",
                "messages": [
                    {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
                ],
                "trigger": "submit-message",
            }
            try:
                reply = client.post("/api/chat", json=body)
            except httpx.TimeoutException:
                break
            finished += reply.status_code == 200 and '"type":"finish"' in reply.text
    return finished


STALL_GUARD = 15  # seconds a turn may take before it counts as stalled


def test_a_serve_whose_stderr_nobody_reads_finishes_every_turn():
    """The log lines' write to the full pipe blocked the event loop: the server stopped
    answering within the first turn (ten turns on a 64 KiB pipe), every session stalled."""
    server = UnreadServe("stderr")
    try:
        assert finished_turns(server.url, TURNS) == TURNS
    finally:
        server.close()


def test_a_serve_whose_stdout_nobody_reads_answers_every_request():
    """Hypercorn's access log (``--log-level info``) wrote a line a request to stdout: with
    stdout a pipe nobody read past the URL line, the loop blocked at the 28th request."""
    server = UnreadServe("stdout")
    answered = 0
    try:
        with httpx.Client(base_url=server.url, timeout=STALL_GUARD) as client:
            for _ in range(100):
                try:
                    answered += client.get("/api/sessions").status_code == 200
                except httpx.TimeoutException:
                    break
    finally:
        server.close()
    assert answered == 100


SMALL_SOCKET_BUFFER = 4096  # bytes asked for (the kernel doubles it): a turn fills it


def small_socketpair() -> tuple[socket.socket, socket.socket]:
    """A unix stream socket pair whose buffers are shrunk, as systemd connects a service's
    stderr to the journal: the first end is the reader's, the second the writer's."""
    reader, writer = socket.socketpair()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_SOCKET_BUFFER)
    writer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SMALL_SOCKET_BUFFER)
    return reader, writer


def read_in_thread(reader: socket.socket) -> list[bytes]:
    """Start reading ``reader`` to its end (or :data:`STALL_GUARD` seconds of silence) in
    a thread; the list it returns gets what it reads."""
    received: list[bytes] = []
    reader.settimeout(STALL_GUARD)

    def read() -> None:
        try:
            while chunk := reader.recv(1 << 16):
                received.append(chunk)
        except OSError:  # TimeoutError: the guard; closed by the test
            pass

    threading.Thread(target=read, daemon=True).start()
    return received


def wait_for(received: list[bytes], marker: bytes) -> bool:
    """Whether ``marker`` is in what ``received`` gets within :data:`STALL_GUARD` seconds."""
    for _ in range(STALL_GUARD * 20):
        if marker in b"".join(received):
            return True
        time.sleep(0.05)
    return False


def test_a_serve_whose_stderr_socket_nobody_reads_finishes_every_turn():
    """systemd's journal connects a service's stderr to a stream socket: with its reader
    stopped, the first full send blocked the event loop and every session stalled
    (``/proc/self/fd`` cannot open a socket anew: the sink kept it blocking). Every turn
    finishes; the lines held meanwhile go out, in order, once the reader reads."""
    reader, writer = small_socketpair()
    server = UnreadServe("stderr", stderr=writer)
    writer.close()
    try:
        assert finished_turns(server.url, TURNS) == TURNS
        received = read_in_thread(reader)
        # the next turn's first line sends the held ones before it
        assert finished_turns(server.url, 1, first=TURNS) == 1
        last = f'"session_id":"s{TURNS}","turn_id"'.encode()
        assert wait_for(received, last)
    finally:
        server.close()
        reader.close()
    lines = b"".join(received).splitlines()
    events = [orjson.loads(line) for line in lines if line.startswith(b"{")]  # not Hypercorn's
    started = [e["session_id"] for e in events if e["event"] == "turn.started"]
    assert started == [f"s{n}" for n in range(TURNS + 1)]  # each turn's, none dropped


def test_a_serve_whose_stdout_socket_nobody_reads_answers_every_request():
    """Hypercorn's access log (a line a request, on stdout) to a stream socket nobody read
    past the URL line blocked the loop at the 12th request."""
    reader, writer = small_socketpair()
    proc = subprocess.Popen(
        [*SERVE, "--log-level", "info"],
        cwd=ROOT,
        env=ENV,
        stdin=subprocess.DEVNULL,
        stdout=writer.fileno(),
        stderr=subprocess.DEVNULL,
    )
    writer.close()
    answered = 0
    try:
        first = reader.makefile("rb").readline().decode()
        assert first.startswith("Axon web UI on"), first
        with httpx.Client(base_url=first.split()[4].rstrip("/"), timeout=STALL_GUARD) as client:
            for _ in range(100):
                try:
                    answered += client.get("/api/sessions").status_code == 200
                except httpx.TimeoutException:
                    break
    finally:
        proc.kill()
        proc.wait(PROCESS_GUARD)
        reader.close()
    assert answered == 100


def full_pipe() -> tuple[int, Any]:
    """A pipe's read end and its write end as a text stream, the pipe already full."""
    read, write = os.pipe()
    fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, SMALL_PIPE)
    os.set_blocking(write, False)
    try:
        while True:
            os.write(write, b"x" * SMALL_PIPE)
    except BlockingIOError:
        pass
    os.set_blocking(write, True)  # as stderr is: a write to it would wait
    return read, open(write, "w", closefd=True)


def read_all(fd: int) -> bytes:
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 1 << 16):
            data += chunk
    except BlockingIOError:
        pass
    return data


def test_a_line_to_a_full_pipe_returns_and_goes_out_once_the_reader_reads():
    read, stream = full_pipe()
    sink = unblocked(stream)
    assert isinstance(sink, NonBlockingSink)
    sink.write('{"event":"a"}\n')  # returns: it would have waited for ever
    got = read_all(read)
    sink.write('{"event":"b"}\n')
    sink.flush()
    assert (got + read_all(read)).strip(b"x") == b'{"event":"a"}\n{"event":"b"}\n'
    os.close(read)
    stream.close()


def test_a_held_line_goes_out_once_the_reader_reads_with_no_line_after_it():
    """The last lines of a turn, held while the reader was behind, went out only with the
    next line logged: on a quiet server, never. The sink's thread sends them."""
    read, stream = full_pipe()
    sink = unblocked(stream)
    sink.write('{"event":"last"}\n')
    got = read_all(read)
    for _ in range(STALL_GUARD * 20):
        if b"last" in got:
            break
        time.sleep(0.05)
        got += read_all(read)
    assert got.strip(b"x") == b'{"event":"last"}\n'
    os.close(read)
    stream.close()


def test_lines_past_the_limit_are_dropped_and_said_in_one_line(monkeypatch):
    monkeypatch.setattr(runtime.logging, "PENDING_LIMIT", 30)
    read, stream = full_pipe()
    sink = unblocked(stream)
    for n in range(5):
        sink.write(f'{{"event":"{n}"}}\n')  # 14 bytes each: two held, three dropped
    got = read_all(read)
    sink.write('{"event":"5"}\n')
    lines = (got + read_all(read)).strip(b"x").decode().splitlines()
    assert lines[:2] == ['{"event":"0"}', '{"event":"1"}']
    assert "3 log lines dropped" in lines[2]
    assert lines[3:] == ['{"event":"5"}']
    os.close(read)
    stream.close()


def full_socket() -> tuple[socket.socket, Any]:
    """A stream socket's reading end and its writing end as a text stream, the writer's
    buffer already full (the writing end blocking, as an inherited stderr is)."""
    reader, writer = small_socketpair()
    writer.setblocking(False)
    try:
        while True:
            writer.send(b"x" * SMALL_SOCKET_BUFFER)
    except BlockingIOError:
        pass
    writer.setblocking(True)
    return reader, open(writer.detach(), "w", closefd=True)


def received_now(reader: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := reader.recv(1 << 16, socket.MSG_DONTWAIT):
            data += chunk
    except BlockingIOError:
        pass
    return data


def test_lines_past_the_limit_to_a_full_socket_are_dropped_and_said_in_one_line(monkeypatch):
    """A write to the socket returns at once (it would have waited for ever), without
    making the socket non-blocking for anyone else sharing it."""
    monkeypatch.setattr(runtime.logging, "PENDING_LIMIT", 30)
    reader, stream = full_socket()
    sink = unblocked(stream)
    for n in range(5):
        sink.write(f'{{"event":"{n}"}}\n')  # 14 bytes each: two held, three dropped
    assert os.get_blocking(stream.fileno())
    got = received_now(reader)
    sink.write('{"event":"5"}\n')
    lines = (got + received_now(reader)).strip(b"x").decode().splitlines()
    assert lines[:2] == ['{"event":"0"}', '{"event":"1"}']
    assert "3 log lines dropped" in lines[2]
    assert lines[3:] == ['{"event":"5"}']
    reader.close()
    stream.close()


@pytest.mark.parametrize("mode", [[], ["--jsonl"]], ids=["rendered", "jsonl"])
def test_a_run_whose_stdout_reader_left_mid_turn_exits_0_whatever_the_output(tmp_path, mode):
    """``axon run ... | head -1``: the rendered output's next write raised BrokenPipeError
    inside rich, which exits with ``SystemExit(1)``: status 1 (``--jsonl``: 0), the turn
    aborted as ``consumer failed: SystemExit``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime", "run", "--delay", "0.05", *mode, "hi"],
        cwd=tmp_path,
        env=ENV,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline()  # then the reader leaves, the turn still streaming
    proc.stdout.close()
    assert proc.wait(PROCESS_GUARD) == 0
