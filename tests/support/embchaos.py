"""A seeded, randomized fault run of the embedded deployment: ``python -m runtime serve``
on an SQLite file, driven over HTTP only, the way the AI SDK's ``useChat`` drives it.

A real ``serve`` process on a temporary SQLite file with the agent of
:mod:`tests.support.embedded_agent` (a tool with a side effect keyed by its idempotency
key, a tool that needs approval, a client-side tool), a busy strategy drawn by the seed,
several sessions at once, each a client that posts a user message (``POST /api/chat``),
reads the UI message stream, answers approvals and client tools as ``useChat`` does (the
messages ending with the assistant message, its tool part ``approval-responded`` or
``output-available``), and faults chosen by ``random.Random(seed)`` at random moments:

* ``kill``: SIGKILL ``serve`` and start it again on the same file and port;
* ``term``: SIGTERM it (graceful: running turns end with ``abort``, saved) and restart;
* ``down``: SIGTERM it and keep it down a moment: requests meanwhile fail to connect and
  the client retries them (a decision too) once it is back;
* ``second``: a second ``serve`` on the same file at once (docs/architecture.md,
  "Persistence": several writers may share a file); some turns and one of each pair of
  racing decisions go to it while it runs;
* client side: a client that leaves mid-stream, two clients deciding one approval at
  once with opposite decisions, a client posting its next message while its turn runs.

Then, from one last ``serve`` over HTTP (``GET /api/sessions/{id}``) and the ledger, the
invariants (:class:`Violations`, seed first: replay with ``AXON_EMBCHAOS_SEEDS=<seed>``):
each stored history is well-formed (one assistant message per user input, every call
exactly one result or still waiting, a decided approval its result), every side effect
once per key and every attempt once (the embedded host never re-runs a tool), exactly one
of two racing decisions recorded and the other a 4xx, every turn whose stream ended with
``finish`` and ``[DONE]`` stored, and its stored UI message what the stream showed.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import attrs
import httpx
import trio

from runtime.messages import AssistantMessage, Message, ToolCallPart, ToolMessage, UserMessage
from runtime.serde import structure
from tests.support.embedded_agent import answer_text, read_ledger

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AGENT = "tests.support.embedded_agent:agent"


@attrs.define
class Config:
    sessions: int = 4
    turns: int = 4
    faults: int = 5
    delay: float = 0.01
    tool_hold: float = 0.05
    limit: float = 50.0
    """Seconds the run may take (it never hangs)."""


SMALL = Config()
LARGE = Config(sessions=8, turns=6, faults=10, limit=150.0)


class Violations(AssertionError):
    """The invariants a seed broke, one a line, the seed first."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One ``serve`` process slot on a fixed port; restarted on the same file."""

    def __init__(self, name: str, db: str, ledger: str, logs: str, args: list[str]) -> None:
        self.name, self.db, self.ledger, self.logs, self.args = name, db, ledger, logs, args
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.env: dict[str, str] = {}

    def spawn(self) -> str:
        """Start the process; the line it printed, once it serves (or why it did not)."""
        self.starts += 1
        env = {
            **os.environ,
            "PYTHONPATH": REPO,
            "PYTHONUNBUFFERED": "1",
            "AXON_TEST_LEDGER": self.ledger,
            **self.env,
        }
        log = open(os.path.join(self.logs, f"{self.name}-{self.starts}.log"), "wb")
        with log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runtime", "serve", "--port", str(self.port),
                 "--store", self.db, "--agent", AGENT, "--log-level", "info", *self.args],
                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log,
            )  # fmt: skip
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().decode()

    async def start(self) -> None:
        for _ in range(20):  # the port of a just-killed process may still be held a moment
            line = await trio.to_thread.run_sync(self.spawn)
            if "Axon web UI" in line:
                return
            assert self.proc is not None
            await trio.to_thread.run_sync(self.proc.wait, 10)
            await trio.sleep(0.2)
        raise AssertionError(f"{self.name} does not start: {self.log()[-2000:]}")

    def log(self) -> str:
        out = ""
        for i in range(1, self.starts + 1):
            with contextlib.suppress(OSError):
                with open(os.path.join(self.logs, f"{self.name}-{i}.log"), errors="replace") as f:
                    out += f"--- {self.name} start {i}\n" + f.read()
        return out

    async def stop(self, sig: int) -> int | None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return None
        proc.send_signal(sig)
        try:
            return await trio.to_thread.run_sync(proc.wait, 20)
        except subprocess.TimeoutExpired:
            proc.kill()
            return await trio.to_thread.run_sync(proc.wait, 10)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@attrs.define
class Turn:
    """What one client saw of one user input."""

    session_id: str
    text: str
    message_id: str
    mode: str
    posted: list[str] = attrs.Factory(list)
    """Per POST of the input: its outcome (status, ``done``, ``cut``, ``left``)."""
    assistant_id: str | None = None
    streams: list[list[dict[str, Any]]] = attrs.Factory(list)
    """Each response's chunks for the assistant message (first part, continuations)."""
    ended: list[bool] = attrs.Factory(list)
    """Per stream: ended with ``finish`` and ``[DONE]``."""
    decisions: list[tuple[str, bool | None, int]] = attrs.Factory(list)
    """``(server, approved, status)`` of each decision POST that got an answer."""
    steered: bool = False
    retried: list[int] = attrs.Factory(list)
    """The statuses of a decision sent again after its continuation was cut."""
    """Its POST got 202: it joined the session's running turn (``steer``)."""
    answers: list[Any] = attrs.Factory(list)
    """The JSON bodies of the decision POSTs refused."""


def _body(session_id: str, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"id": session_id, "messages": messages, "trigger": "submit-message", **extra}


def _user(message_id: str, text: str) -> dict[str, Any]:
    return {"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}


class Run:
    def __init__(self, seed: int, config: Config) -> None:
        self.seed, self.config = seed, config
        self.rng = random.Random(seed)
        self.dir = tempfile.mkdtemp(prefix="axon-embchaos-")
        self.db = os.path.join(self.dir, "sessions.db")
        self.ledger = os.path.join(self.dir, "ledger.db")
        self.on_busy = self.rng.choice(("reject", "enqueue", "interrupt", "steer"))
        args = ["--delay", "0", "--on-busy", self.on_busy]
        self.env_args = args
        self.main = self.new_server("main")
        self.second: Server | None = None
        self.up = trio.Event()
        self.turns: list[Turn] = []
        self.events: list[tuple[float, str]] = []
        self.t0 = time.monotonic()
        self.done = trio.Event()
        self.to_second = 0
        """Requests sent to the second process on the same file."""
        self.plan = self._plan()

    def new_server(self, name: str) -> Server:
        server = Server(name, self.db, self.ledger, self.dir, self.env_args)
        server.env = {
            "AXON_TEST_DELAY": str(self.config.delay),
            "AXON_TEST_TOOL_HOLD": str(self.config.tool_hold),
        }
        return server

    def note(self, what: str) -> None:
        self.events.append((round(time.monotonic() - self.t0, 2), what))

    def _plan(self) -> dict[str, list[tuple[str, str]]]:
        sessions: dict[str, list[tuple[str, str]]] = {}
        for s in range(self.config.sessions):
            turns = []
            for t in range(self.config.turns):
                kind = self.rng.choice(("tools", "tools", "approve", "approve", "client", "echo"))
                if kind == "approve":
                    mode = self.rng.choice(("approve", "deny", "race", "race", "leave", "new"))
                elif kind == "client":
                    mode = self.rng.choice(("answer", "answer", "leave"))
                else:
                    mode = self.rng.choice(("wait", "wait", "leave", "overlap"))
                turns.append((f"{kind} s{s} t{t}", mode))
            sessions[f"e{self.seed}s{s}"] = turns
        kinds = ("kill", "kill", "term", "down", "second")
        self.faults = [
            (self.rng.uniform(0.1, 0.8), self.rng.choice(kinds)) for _ in range(self.config.faults)
        ]
        return sessions

    # -- servers ---------------------------------------------------------------------------

    def server_for(self, rng: random.Random) -> Server:
        if self.second is not None and rng.random() < 0.5:
            return self.second
        return self.main

    async def fault(self, kind: str) -> None:
        if kind in ("kill", "term", "down"):
            self.up = trio.Event()
            code = await self.main.stop(signal.SIGKILL if kind == "kill" else signal.SIGTERM)
            if kind == "term" and code not in (0, None):
                self.note(f"term: serve exited {code}")
                self.bad_exits.append(f"serve exited {code} on SIGTERM")
            if kind == "down":
                await trio.sleep(self.rng.uniform(0.2, 0.8))
            await self.main.start()
            self.up.set()
            self.note(f"{kind}: main restarted")
        elif kind == "second" and self.second is None:
            self.second = self.new_server("second")
            await self.second.start()
            self.note("second: started")
            await trio.sleep(self.rng.uniform(0.5, 1.5))
            second, self.second = self.second, None
            await trio.sleep(0.3)  # requests already sent to it go on
            code = await second.stop(signal.SIGTERM)
            if code not in (0, None):
                self.bad_exits.append(f"second serve exited {code} on SIGTERM")
            self.note("second: stopped")

    async def faults_loop(self) -> None:
        for pause, kind in self.faults:
            with trio.move_on_after(pause):
                await self.done.wait()
            if self.done.is_set():
                return
            await self.fault(kind)

    # -- clients ---------------------------------------------------------------------------

    async def post(
        self,
        client: httpx.AsyncClient,
        server: Server,
        body: dict[str, Any],
        leave_after: int | None = None,
        answered: trio.Event | None = None,
    ) -> tuple[int, list[Any], str]:
        """POST ``body``; ``(status, chunks, how it ended)``: ``done`` ([DONE] read),
        ``cut`` (the connection broke), ``left`` (this client left), ``json``. A refused
        connection (the server is down) is retried until it is back."""
        deadline = time.monotonic() + self.config.limit
        if server is not self.main:
            self.to_second += 1
        while True:
            chunks: list[Any] = []
            status = 0
            try:
                async with client.stream("POST", f"{server.url}/api/chat", json=body) as r:
                    status = r.status_code
                    if answered is not None:
                        answered.set()
                    if r.headers.get("content-type", "").startswith("application/json"):
                        await r.aread()
                        return r.status_code, [r.json()], "json"
                    buf = ""
                    async for text in r.aiter_text():
                        buf += text
                        while "\n\n" in buf:
                            block, buf = buf.split("\n\n", 1)
                            for line in block.split("\n"):
                                if line.startswith("data: "):
                                    data = line[6:]
                                    if data == "[DONE]":
                                        return r.status_code, chunks, "done"
                                    chunks.append(json.loads(data))
                        if leave_after is not None and len(chunks) >= leave_after:
                            return r.status_code, chunks, "left"
                    return r.status_code, chunks, "cut"
            except httpx.ConnectError:
                if time.monotonic() > deadline:
                    raise
                if server is not self.main:
                    server = self.main  # the second process went away: the main one
                await trio.sleep(0.1)
            except (httpx.RemoteProtocolError, httpx.ReadError):
                if answered is not None:
                    answered.set()
                return status, chunks, "cut"

    async def session(self, client: httpx.AsyncClient, session_id: str, script: list[Any]) -> None:
        rng = random.Random(f"{self.seed}:{session_id}")
        messages: list[dict[str, Any]] = []
        async with trio.open_nursery() as overlapping:
            for i, (text, mode) in enumerate(script):
                turn = Turn(session_id, text, f"u{i}-{session_id}", mode)
                self.turns.append(turn)
                messages = [_user(turn.message_id, text)]
                if mode == "overlap" and i + 1 < len(script):
                    # the next input is posted while this one streams (the busy strategy),
                    # once this one's POST was answered (its turn runs, or was refused)
                    answered = trio.Event()
                    overlapping.start_soon(self.one_turn, client, turn, messages, rng, answered)
                    with trio.move_on_after(10):
                        await answered.wait()
                    await trio.sleep(rng.uniform(0.0, 0.1))
                    continue
                await self.one_turn(client, turn, messages, rng)

    async def one_turn(
        self,
        client: httpx.AsyncClient,
        turn: Turn,
        messages: list[Any],
        rng: random.Random,
        answered: trio.Event | None = None,
    ) -> None:
        leave = rng.randint(2, 12) if turn.mode == "leave" else None
        server = self.server_for(rng)
        status, chunks, how = await self.post(
            client, server, _body(turn.session_id, messages), leave_after=leave, answered=answered
        )
        turn.posted.append(f"{status} {how}")
        if how == "json":
            if status == 202 and chunks[0].get("steered"):
                turn.steered = True
            return
        self.take(turn, chunks, how)
        if how != "done" or not chunks or turn.mode == "leave":
            return
        requests = [c for c in chunks if c.get("type") == "tool-approval-request"]
        calls = {c["toolCallId"]: c for c in chunks if c.get("type") == "tool-input-available"}
        if turn.text.startswith("approve") and requests and turn.mode != "new":
            await self.decide(client, turn, messages, requests[0], calls, rng)
        elif turn.text.startswith("client") and "call_c" in calls:
            part = {
                "type": "tool-locate", "toolCallId": "call_c", "state": "output-available",
                "input": {}, "output": {"city": "Oslo"},
            }  # fmt: skip
            await self.answer(client, turn, messages, part, self.main, None)

    def take(self, turn: Turn, chunks: list[Any], how: str) -> None:
        start = next((c for c in chunks if c.get("type") == "start"), None)
        if start is not None and turn.assistant_id is None:
            turn.assistant_id = start.get("messageId")
        turn.streams.append(chunks)
        ended = how == "done" and any(c.get("type") == "finish" for c in chunks)
        turn.ended.append(ended)

    async def decide(
        self,
        client: httpx.AsyncClient,
        turn: Turn,
        messages: list[Any],
        request: dict[str, Any],
        calls: dict[str, Any],
        rng: random.Random,
    ) -> None:
        def part(approved: bool) -> dict[str, Any]:
            approval: dict[str, Any] = {"id": request["approvalId"], "approved": approved}
            if not approved:
                approval["reason"] = "chaos says no"
            return {
                "type": "tool-guarded", "toolCallId": request["toolCallId"],
                "state": "approval-responded", "input": {"n": 1}, "approval": approval,
            }  # fmt: skip

        if turn.mode == "race":
            other = self.second or self.main
            async with trio.open_nursery() as n:
                n.start_soon(self.answer, client, turn, messages, part(True), self.main, True)
                n.start_soon(self.answer, client, turn, messages, part(False), other, False)
        else:
            approved = turn.mode != "deny"
            await self.answer(
                client, turn, messages, part(approved), self.server_for(rng), approved
            )

    async def answer(
        self,
        client: httpx.AsyncClient,
        turn: Turn,
        messages: list[Any],
        part: dict[str, Any],
        server: Server,
        approved: bool | None,
    ) -> None:
        assistant = {"id": turn.assistant_id, "role": "assistant", "parts": [
            {"type": "step-start"}, part]}  # fmt: skip
        body = _body(turn.session_id, [*messages, assistant], messageId=turn.assistant_id)
        status, chunks, how = await self.post(client, server, body)
        turn.decisions.append((server.name, approved, status))
        if how == "json":
            turn.answers.append(chunks[0])
        else:
            self.take(turn, chunks, how)
        if how == "cut":
            # the server went away during the continuation: the client sends its answers
            # again once it is back (a reloaded useChat sends the same message again)
            await self.up.wait()
            status, chunks, how = await self.post(client, self.main, body)
            turn.retried.append(status)
            if how == "json":
                turn.answers.append(chunks[0])
            else:
                self.take(turn, chunks, how)

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        self.bad_exits: list[str] = []
        try:
            with trio.fail_after(self.config.limit):
                await self.main.start()
                self.up.set()
                timeout = httpx.Timeout(10.0, read=15.0)
                async with httpx.AsyncClient(timeout=timeout) as client:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self.faults_loop)
                        async with trio.open_nursery() as sessions:
                            for sid, script in self.plan.items():
                                sessions.start_soon(self.session, client, sid, script)
                        self.done.set()
                    await self.up.wait()
                    await self.main.stop(signal.SIGTERM)  # the last turns saved
                    await self.main.start()  # a fresh process reads the file
                    stored = {}
                    for sid in self.plan:
                        r = await client.get(f"{self.main.url}/api/sessions/{sid}")
                        stored[sid] = r.json() if r.status_code == 200 else None
                await self.main.stop(signal.SIGTERM)
            report = self.check(stored)
        except BaseException:
            self.close(keep=True)
            raise
        self.close(keep=False)
        return report

    def close(self, keep: bool) -> None:
        self.main.close()
        if self.second is not None:
            self.second.close()
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- invariants ------------------------------------------------------------------------

    def check(self, stored: dict[str, Any]) -> dict[str, Any]:
        bad: list[str] = list(self.bad_exits)
        effects, attempts = read_ledger(self.ledger)
        stored_keys: set[str] = set()
        for sid in self.plan:
            got = stored.get(sid)
            turns = [t for t in self.turns if t.session_id == sid]
            if got is None:
                if any(any(t.ended) or t.steered for t in turns):
                    bad.append(f"{sid}: not stored")
                continue
            messages = structure(got["messages"], list[Message])
            bad += self.check_history(sid, messages, turns, stored_keys)
            bad += self.check_streams(sid, got["ui_messages"], messages, turns)
        for key, n in attempts.items():
            if n != 1:
                bad.append(f"side effect {key} attempted {n} times")
        for key in stored_keys:
            if effects.get(key) != 1:
                bad.append(f"stored result {key} has no side effect in the ledger")
        for turn in self.turns:
            answered = [d for d in turn.decisions if d[2]]  # not cut before an answer
            if turn.mode == "race" and len(answered) == 2:
                won = [d for d in turn.decisions if d[2] in (200, 202)]
                lost = [d for d in turn.decisions if 400 <= d[2] < 500]
                if len(won) != 1 or len(lost) != 1:
                    bad.append(
                        f"{turn.session_id} {turn.text!r}: racing decisions {turn.decisions}"
                    )
        if bad:
            raise Violations(
                f"seed {self.seed} (on-busy {self.on_busy}) broke {len(bad)} invariant(s) "
                f"(replay: AXON_EMBCHAOS_SEEDS={self.seed}); logs in {self.dir}:\n  "
                + "\n  ".join(bad)
                + f"\nevents: {self.events}"
                + "\nturns: "
                + "\n  ".join(
                    f"{t.session_id} {t.text!r} {t.mode} {t.posted} {t.decisions} "
                    f"{t.answers} {t.retried} {t.ended}"
                    for t in self.turns
                )
            )
        return {
            "turns": len(self.turns),
            "on_busy": self.on_busy,
            "ended": sum(all(t.ended) and bool(t.ended) for t in self.turns),
            "effects": len(effects),
            "to_second": self.to_second,
            "faults": [e for _, e in self.events],
        }

    def check_history(
        self, sid: str, messages: list[Any], turns: list[Turn], keys: set[str]
    ) -> list[str]:
        bad: list[str] = []
        groups: list[list[Any]] = []
        for m in messages:
            if isinstance(m, UserMessage):
                groups.append([m])
            elif not groups:
                bad.append(f"{sid}: a {m.role} message before any user message")
            else:
                groups[-1].append(m)
        by_id = {t.message_id: t for t in turns}
        for g, group in enumerate(groups):
            user = group[0]
            where = f"{sid} input {user.id} ({user.content!r})"
            assistants = [m for m in group if isinstance(m, AssistantMessage)]
            steered = user.id in by_id and by_id[user.id].steered
            after = messages.index(group[-1]) + 1
            if not assistants and steered and after < len(messages):
                # two inputs steered into one turn at one step boundary: stored one after
                # the other, the model answering both in the next step's message
                continue
            if len(assistants) != 1:
                bad.append(
                    f"{where}: {len(assistants)} assistant messages: {[m.role for m in group]}"
                )
                continue
            (assistant,) = assistants
            results: dict[str, int] = {}
            for m in group:
                if isinstance(m, ToolMessage):
                    results[m.tool_call_id] = results.get(m.tool_call_id, 0) + 1
            for p in assistant.content:
                if not isinstance(p, ToolCallPart):
                    continue
                n = results.get(p.tool_call_id, 0)
                waiting = p.awaiting is not None and not p.awaiting.decided
                last = g == len(groups) - 1
                if n == 0 and not (waiting and last):
                    bad.append(f"{where}: call {p.tool_call_id} has no result ({p.awaiting})")
                elif n > 1:
                    bad.append(f"{where}: call {p.tool_call_id} has {n} results")
                if p.awaiting is not None and p.awaiting.decided and n == 0:
                    bad.append(f"{where}: approval {p.tool_call_id} decided, no result")
                result = next(
                    (
                        m
                        for m in group
                        if isinstance(m, ToolMessage) and m.tool_call_id == p.tool_call_id
                    ),
                    None,
                )
                if result is None:
                    continue
                if p.tool_name in ("record", "guarded") and result.error is None:
                    key = str(result.output).rsplit(" ", 1)[-1]
                    if not key.endswith(f":{p.step}:{p.tool_call_id}"):
                        bad.append(f"{where}: {p.tool_call_id} ran under the key {key}")
                    keys.add(key)
                if p.tool_name == "guarded" and p.awaiting is not None and p.awaiting.decided:
                    # a shutdown cut it, or a new input came before it was resumed
                    cut = str(result.error).startswith("interrupted") or "superseded" in str(
                        result.error
                    )
                    if bool(p.awaiting.approved) != (result.error is None) and not cut:
                        bad.append(f"{where}: approved={p.awaiting.approved}, result {result}")
            if user.id not in by_id:
                bad.append(f"{where}: an input no client sent")
        stored_ids = [g[0].id for g in groups]
        if len(set(stored_ids)) != len(stored_ids):
            bad.append(f"{sid}: an input stored twice: {stored_ids}")
        return bad

    def check_streams(
        self, sid: str, ui: list[dict[str, Any]], messages: list[Any], turns: list[Turn]
    ) -> list[str]:
        bad: list[str] = []
        ui_by_id = {m["id"]: m for m in ui}
        for turn in turns:
            if turn.steered and turn.message_id not in ui_by_id:
                bad.append(f"{sid} {turn.text!r}: steered (202), its input is not stored")
            if not turn.ended or not turn.ended[-1] or turn.assistant_id is None:
                continue
            if turn.mode in ("leave", "new"):
                continue  # cut by its client, or superseded by the next input
            last = turn.streams[-1]
            if any(c.get("type") == "data-steered" for c in last):
                continue  # the steered inputs split the message in the store (by design)
            if any(
                c.get("finishReason") == "tool-calls" for c in last if c.get("type") == "finish"
            ):
                continue  # still waiting when its client went on: a later input superseded it
            where = f"{sid} {turn.text!r} ({turn.mode}, {turn.posted}, {turn.decisions})"
            if turn.message_id not in ui_by_id:
                bad.append(f"{where}: acknowledged, its input is not stored")
                continue
            stored = ui_by_id.get(turn.assistant_id)
            if stored is None:
                bad.append(f"{where}: acknowledged, its answer {turn.assistant_id} is not stored")
                continue
            if not all(turn.ended):
                continue  # a part of it was cut: the stream cannot be compared
            seen = _rebuild(turn.streams)
            if seen != _project(stored):
                bad.append(f"{where}: the stream showed {seen}, stored {_project(stored)}")
        return bad


def _rebuild(streams: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """The assistant message as the client rebuilt it from its streams."""
    text = ""
    tools: dict[str, str] = {}
    for chunks in streams:
        for c in chunks:
            kind = c.get("type")
            if kind == "text-delta":
                text += c["delta"]
            elif kind == "tool-input-available":
                tools[c["toolCallId"]] = "input-available"
            elif kind == "tool-approval-request":
                tools[c["toolCallId"]] = "approval-requested"
            elif kind == "tool-output-available" and not c.get("preliminary"):
                tools[c["toolCallId"]] = f"output-available {c['output']!r}"
            elif kind == "tool-output-error":
                tools[c["toolCallId"]] = f"output-error {c['errorText']}"
            elif kind == "tool-output-denied":
                tools[c["toolCallId"]] = "output-denied"
    return {"text": text, "tools": tools}


def _project(message: dict[str, Any]) -> dict[str, Any]:
    text = ""
    tools: dict[str, str] = {}
    for p in message["parts"]:
        kind = p.get("type", "")
        if kind == "text":
            text += p["text"]
        elif kind.startswith("tool-"):
            state = p.get("state")
            if state == "output-available":
                state = f"output-available {p.get('output')!r}"
            elif state == "output-error":
                state = f"output-error {p.get('errorText')}"
            elif state == "approval-responded":
                state = "approval-requested"  # the client answered it itself
            tools[p["toolCallId"]] = state
    return {"text": text, "tools": tools}


async def run_embedded_chaos(seed: int, config: Config = SMALL) -> dict[str, Any]:
    return await Run(seed, config).run()


__all__ = ["LARGE", "SMALL", "Config", "Violations", "answer_text", "run_embedded_chaos"]
