"""Which process runs a turn, and whether it still lives: how a host that loads a session
tells a turn killed mid-way (SIGKILL, a power cut) from one another process still runs.

An embedded host's step saves (a turn that goes on after them) carry, in the session's
meta under :data:`RUNNING_META`, the turn, its assistant message and its writer
(:func:`this_process`); the save that ends the turn writes ``None`` there. A marker still
there when a host loads the session names a turn that never ended: if its writer is dead
(:func:`process_state`), the message is marked interrupted, as a stopped turn's is
(:func:`interrupted_record`), and the marker cleared, in one version-checked save
(whichever of two loaders saves first marks it; the other meets the new version).

The writer is ``host:boot:pidns:pid:start`` (Linux): the machine's name, its boot id
(``/proc/sys/kernel/random/boot_id``), the pid namespace, the pid and the process's start
time in clock ticks since boot (``/proc/PID/stat`` field 22). A pid reused by another
process has another start time; a machine restarted since has another boot id. Nothing
is written, so no extra statement: the marker rides in the step save's meta, which every
save writes anyway. A writer this process cannot see (another machine sharing the store,
another container's pid namespace) is ``unknown``, and its turn is left as it is: never
marked while it may run. Off Linux no marker is written (``this_process`` is ``None``).

Such a writer's marker expires instead: each marker carries ``at``, the wall-clock time
of the save that wrote it (every step save of the running turn writes it again, so no
statement more), and an unknown writer's marker older than :func:`marker_ttl` (seconds,
``$AXON_RUNNING_MARKER_TTL``) counts as dead. Why: two ``serve --run-turns-here`` on one
PostgreSQL on two machines never see each other's processes, and a claim whose process
was killed stayed "answered elsewhere" for good (its retry a 409, branch ``attack2``).
A host that claims its turns (its store shared) refreshes the marker every
:func:`touch_interval` while a step's model call or tools run
(:meth:`actors.turn.saving.Saving._touching`); on any other the bound must exceed the
longest step (a model call and its tool calls). Either way it must exceed the machines'
clock skew; a live writer of this machine's pid namespace never expires.
"""

from __future__ import annotations

import json
import math
import os
import time
import weakref
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from runtime.errors import StoreConflict, StoreError
from runtime.messages import AssistantMessage
from runtime.store import SessionRecord, Store, save_keeping

RUNNING_META = "running_turn"
"""The session meta key of the turn running in some process (``None``: none)."""

PAUSED_META = "paused_turn"
"""The session meta key a paused step's save writes: ``{"turn_id", "step", "resumed"}``,
the turn, its last paused step and how many pauses it continued, that one included
(``None`` once the turn ended): what a takeover continues
(:func:`actors.turn.takeover.paused_mark`)."""

PRIVATE_META = (RUNNING_META, PAUSED_META)
"""The session meta keys the turn runner keeps for itself, hidden from applications
(``session.meta``, the web API's and the worker front end's session lists): each names a
turn in flight (a process, a paused step), which only the turn's own saves and a
takeover read or write. A turn's saves write the session's meta as the application holds
it, so a stale copy of these there went back into the store with every later turn
(:data:`runtime.approval.WAITING_META`, which lists of sessions read, is the
application's to see)."""

ALIVE: Literal["alive"] = "alive"
DEAD: Literal["dead"] = "dead"
UNKNOWN: Literal["unknown"] = "unknown"
State = Literal["alive", "dead", "unknown"]

_PROC = "/proc"
_wall = time.time  # (the marker's clock: wall time, comparable across machines)
_mine: tuple[int, str | None] | None = None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _start_time(proc: str, pid: int) -> tuple[str, str] | None:
    """The process's ``(state, start time)`` from ``/proc/PID/stat``, ``None`` if it has
    no entry (it is gone). The name (field 2) may hold spaces and parentheses: the
    fields are read after its last ``)``."""
    stat = _read(f"{proc}/{pid}/stat")
    if stat is None:
        return None
    rest = stat[stat.rfind(")") + 2 :].split()
    if len(rest) < 20:
        return None
    return rest[0], rest[19]  # field 3 (state), field 22 (starttime)


def _namespace(proc: str, pid: int | str) -> str | None:
    try:
        return os.readlink(f"{proc}/{pid}/ns/pid")
    except OSError:
        return None


def _boot(proc: str) -> str | None:
    boot = _read(f"{proc}/sys/kernel/random/boot_id")
    return None if boot is None else boot.strip()


def describe(proc: str, pid: int) -> str | None:
    """The writer name of process ``pid`` as seen through ``proc`` (``None`` when it
    cannot be read: not Linux, or no such process)."""
    boot, ns, st = _boot(proc), _namespace(proc, "self"), _start_time(proc, pid)
    if boot is None or ns is None or st is None:
        return None
    return ":".join(
        (os.uname().nodename, boot, ns.removeprefix("pid:").strip("[]"), str(pid), st[1])
    )


def this_process() -> str | None:
    """This process's writer name (read once per pid: a fork gets its own)."""
    global _mine
    pid = os.getpid()
    if _mine is None or _mine[0] != pid:
        _mine = (pid, describe(_PROC, pid))
    return _mine[1]


def process_state(writer: object, *, proc: str = _PROC) -> State:
    """Whether the process ``writer`` names (:func:`this_process`) still runs, seen from
    this one: ``dead`` when this machine restarted since (same host name, another boot
    id), or when in this boot and pid namespace the pid is gone, a zombie, or another
    process's (another start time); ``alive`` when it is there; ``unknown`` for a writer
    of another machine or pid namespace, or one that cannot be read."""
    if not isinstance(writer, str):
        return UNKNOWN
    fields = writer.rsplit(":", 4)
    if len(fields) != 5 or not fields[3].isdigit():
        return UNKNOWN
    host, boot, ns, pid, start = fields
    if host != os.uname().nodename:
        return UNKNOWN
    mine = _boot(proc)
    if mine is None:
        return UNKNOWN
    if boot != mine:
        return DEAD
    here = _namespace(proc, "self")
    if here is None or here.removeprefix("pid:").strip("[]") != ns:
        return UNKNOWN
    st = _start_time(proc, int(pid))
    if st is None or st[0] in ("Z", "X") or st[1] != start:
        return DEAD
    return ALIVE


def public_meta(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    """``meta`` without the runner's own keys (:data:`PRIVATE_META`; the running marker
    names a machine and a process): what an application and a web client are shown."""
    if RUNNING_META not in meta and PAUSED_META not in meta:
        return meta
    return {key: value for key, value in meta.items() if key not in PRIVATE_META}


def running_marker(turn_id: str, message_id: str, host: str | None = None) -> dict[str, Any] | None:
    """What a save of a turn that goes on after it stores under :data:`RUNNING_META`
    (``at``: when, for :func:`marker_ttl`; ``host``: the writing host's
    :attr:`~runtime.app.host.Host.marker_id`, for :func:`answering_elsewhere`); ``None``
    when this process cannot name itself (nothing to store then)."""
    writer = this_process()
    if writer is None:
        return None
    marker: dict[str, Any] = {"turn_id": turn_id, "message_id": message_id, "writer": writer}
    marker["at"] = round(_wall(), 3)
    if host is not None:
        marker[HOST_KEY] = host
    return marker


HOST_KEY = "host"
"""The running marker's key of the host instance that wrote it (its ``marker_id``): the
writer names a process, and two Hosts in one process (or one host and the session it
evicted and reopens) look alike by it. Read only by the writing host itself
(:func:`answering_elsewhere`'s ``mine``); other processes judge the writer alone, so an
older version reading the marker ignores it."""


_LIVE_HOSTS: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
"""This process's open hosts by :attr:`~runtime.app.host.Host.marker_id`
(:func:`host_opened`): a marker of this process naming a host not here is a closed
host's (:func:`killed_marker`). Weak: a host dropped unclosed leaves no entry."""


def host_opened(host_id: str, host: object) -> None:
    """Host ``host`` of this process writes markers under ``host_id`` from now on."""
    _LIVE_HOSTS[host_id] = host


def host_closed(host_id: str) -> None:
    """The host of ``host_id`` has closed (its tasks ended): its markers left in a store
    are a dead turn's, though their writer, this process, lives."""
    _LIVE_HOSTS.pop(host_id, None)


def _closed_host(marker: Mapping[str, Any]) -> bool:
    """Whether ``marker``, whose writer is alive, was written by a host of this process
    that has closed. Why: a host whose turn's end saves failed (or that was cancelled
    while they ran) leaves its marker; its writer, this process, lives on, so another
    host of it (a library reopening its store, a test) took the turn for one running
    and never settled it: the message stayed "answered elsewhere", every retry a 409,
    for as long as the process lived (branch ``markers``)."""
    host = marker.get(HOST_KEY)
    return (
        isinstance(host, str) and host not in _LIVE_HOSTS and marker.get("writer") == this_process()
    )


MARKER_TTL_ENV = "AXON_RUNNING_MARKER_TTL"
MARKER_TTL_DEFAULT = 900.0
"""Seconds after its last save a running marker whose writer this process cannot see
(another machine's, another pid namespace's) counts as dead: 15 minutes, longer than a
model call and its tool calls take."""


def marker_ttl() -> float | None:
    """The bound of :data:`MARKER_TTL_ENV` (default :data:`MARKER_TTL_DEFAULT`); ``None``
    when it is ``0`` or not a number: such markers never expire (read only for a marker
    of an unknown writer, never on a turn's path)."""
    raw = os.environ.get(MARKER_TTL_ENV)
    if raw is None:
        return MARKER_TTL_DEFAULT
    try:
        ttl = float(raw)
    except ValueError:
        return None
    return ttl if ttl > 0 else None


TOUCHES_PER_TTL = 3
"""How many times within :func:`marker_ttl` a step that runs that long refreshes its
turn's marker (:func:`touch_interval`)."""


def touch_interval() -> float | None:
    """Seconds between two refreshes of a running turn's marker while one step (a model
    call, its tool calls) runs: a third of :func:`marker_ttl`, so a live turn's marker
    never reaches the bound another machine expires it at (two refreshes may fail or be
    late); ``None`` when markers never expire."""
    ttl = marker_ttl()
    return None if ttl is None else ttl / TOUCHES_PER_TTL


def _expired(marker: Mapping[str, Any]) -> bool:
    """Whether ``marker`` (of a writer this process cannot see) is older than the bound."""
    at, ttl = marker.get("at"), marker_ttl()
    if ttl is None or isinstance(at, bool) or not isinstance(at, (int, float)):
        return False
    return _wall() - at > ttl


def writer_row() -> tuple[str, float]:
    """What a host stores in its store's registry of the hosts writing it
    (:meth:`~runtime.app.host.Host.shares_store`): this process's writer name and the
    wall time, for :func:`writer_gone`; and the wall time past which the host writes it
    again (half :func:`marker_ttl` on: another machine expires it at the whole; never
    when the bound is off)."""
    now = round(_wall(), 3)
    ttl = marker_ttl()
    due = math.inf if ttl is None else now + ttl / 2
    return json.dumps({"writer": this_process(), "at": now}), due


def wall() -> float:
    """The wall time the markers and the registry's rows are written and judged by."""
    return _wall()


def _row(value: str) -> Mapping[str, Any]:
    try:
        row = json.loads(value)
    except ValueError:
        return {}
    return row if isinstance(row, dict) else {}


def writer_gone(value: str, *, proc: str = _PROC) -> bool:
    """Whether the host of registry row ``value`` (:func:`writer_row`) no longer writes
    the store: its process is dead (this machine, this pid namespace: as a running
    marker's writer), or it cannot be seen from here and its row is older than
    :func:`marker_ttl` (a live host writes its row again past half that). A row
    not of this shape is gone (nothing would ever remove it): no dict, or, for a host
    not seen from here, no finite ``at`` or one more than the bound ahead of this
    clock (a row dated years ahead, or ``NaN``, never aged: every host opening the
    store claimed for as long as it stayed, branch ``attackregistry``)."""
    row = _row(value)
    if not row:
        return True
    state = process_state(row.get("writer"), proc=proc)
    if state != UNKNOWN:
        return state == DEAD
    at, ttl = row.get("at"), marker_ttl()
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        return True
    return ttl is not None and abs(_wall() - at) > ttl


def rebased_meta(
    meta: Mapping[str, Any], stored: Mapping[str, Any], turn_id: str
) -> Mapping[str, Any]:
    """``meta`` of a save of turn ``turn_id`` rebased on another writer's save whose
    session meta is ``stored``: without its ``None`` for the running marker when the
    marker stored is another turn's (another process runs a turn of the session too, and
    marked it since), so that marker stays.

    Why: the two turns share one meta key; the first to end cleared the other's marker,
    and the other, killed then, was never marked interrupted (branch ``leftmix``). Only
    the rebase knows what is stored; a save based on the version it read met no other
    writer's marker since (the one it read, this turn's own step set over)."""
    if RUNNING_META not in meta or meta[RUNNING_META] is not None:
        return meta
    marker = stored.get(RUNNING_META)
    if not isinstance(marker, Mapping) or marker.get("turn_id") == turn_id:
        return meta
    return {key: value for key, value in meta.items() if key != RUNNING_META}


def killed_marker(meta: Mapping[str, Any], *, proc: str = _PROC) -> Mapping[str, Any] | None:
    """The session's running marker when its writer is dead (its turn never ended and
    never will), or unknown and the marker expired (:func:`marker_ttl`); ``None`` when
    there is none, or its writer lives, or is unknown and saved within the bound. A
    marker of this process whose host has closed (:func:`host_closed`) is dead too."""
    marker = meta.get(RUNNING_META)
    if not isinstance(marker, Mapping):
        return None
    state = process_state(marker.get("writer"), proc=proc)
    if state == ALIVE:
        return marker if _closed_host(marker) else None
    if state == UNKNOWN and not _expired(marker):
        return None
    return marker


@attrs.frozen
class Settled:
    """A killed turn's settlement (:func:`interrupted_record`): the session's messages
    from ``start`` on as they are to be saved (its assistant message marked interrupted),
    and the positions among them that are stored as they are."""

    start: int
    messages: tuple[Any, ...]
    kept: tuple[int, ...]


def interrupted_record(messages: tuple[Any, ...], marker: Mapping[str, Any]) -> Settled | None:
    """The save that marks the killed turn's assistant message (``marker``'s) interrupted,
    as a turn stopped after its last committed step is stored; ``None`` when there is no
    such message, or it is marked interrupted or failed already (the marker alone is
    cleared then). Only the message is written: the tool results after it are kept."""
    message_id = marker.get("message_id")
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, AssistantMessage) and m.id == message_id:
            if m.interrupted or m.error is not None:
                return None
            rest = messages[i + 1 :]
            return Settled(
                start=i,
                messages=(attrs.evolve(m, interrupted=True), *rest),
                kept=tuple(range(1, len(rest) + 1)),
            )
    return None


SETTLE_ATTEMPTS = 3
"""Loads and saves :func:`settle` tries before it leaves the session as it read it."""


async def settle(store: Store, record: SessionRecord, *, proc: str = _PROC) -> SessionRecord:
    """``record`` (as just loaded from ``store``), with its killed turn settled: when its
    running marker names a dead writer, its assistant message marked interrupted and the
    marker cleared in one save based on ``record``'s version; the session as stored then.
    Another loader that saved first (a conflict): the session is read again and judged
    again (its marker is cleared by then, so it is marked once). ``record`` itself when
    there is nothing to settle (no statement for a session without a marker), or when
    the store fails the save: a read never fails for it, a later one marks it."""
    for _ in range(SETTLE_ATTEMPTS):
        marker = killed_marker(record.meta, proc=proc)
        if marker is None:
            return record
        settled = interrupted_record(record.messages, marker)
        if settled is None:  # (nothing to mark: the marker alone is cleared)
            settled = Settled(start=len(record.messages), messages=(), kept=())
        start, messages = settled.start, settled.messages
        meta = {RUNNING_META: None}
        try:
            version = await save_keeping(
                store,
                record.session_id,
                start,
                messages,
                meta,
                kept=settled.kept,
                expected_version=record.version,
            )
        except StoreConflict:
            try:
                again = await store.load(record.session_id)
            except StoreError:
                return record
            if again is None:
                return record
            record = again
            continue
        except StoreError:  # (a busy file, a full disk: marked at a later load)
            return record
        return attrs.evolve(
            record,
            messages=(*record.messages[:start], *messages),
            meta={**record.meta, **meta},
            version=version,
        )
    return record


def answering_elsewhere(meta: Mapping[str, Any], mine: str | None = None) -> bool:
    """Whether a session's stored ``meta`` (read for a post told against the store,
    while no turn of it runs here) names a turn another process is running now: a
    running marker (:data:`RUNNING_META`) whose writer is not known dead. The front
    ends' twin check (the chat endpoint's, AG-UI's, A2A's): the same message posted to
    two ``serve`` at once, once the first claimed it
    (:attr:`~runtime.app.host.Host.claims_turns`), was answered with the claimed empty
    answer. A lookup in meta already read: no store statement more.

    A marker of host ``mine`` (the asking host's ``marker_id``, :data:`HOST_KEY`) is
    never elsewhere: its turn is the host's own, running or not by the session's busy
    state, which each caller checked first. Not running, it is a leftover of a turn
    whose end saves the store refused (its writer, this process, alive): read as
    another server's, it refused every post of the session with 409 ``session_busy``
    for as long as the process lived (branch ``ownmarker``); the next turn's save
    writes over it."""
    marker = meta.get(RUNNING_META)
    if not isinstance(marker, Mapping):
        return False
    if mine is not None and marker.get(HOST_KEY) == mine and marker.get("writer") == this_process():
        return False
    return killed_marker(meta) is None
