"""A PostgreSQL store's schema on open: created when missing, checked when present.

The first connection of a :class:`~actors.stores.postgres.PostgresStore` runs
:func:`_first_connect`: it refuses a schema that holds another program's tables, creates
the tables (:mod:`actors.stores.postgres_tables`) and the server-side functions
(:mod:`actors.stores.postgres_calls`) a version of Axon needs, and brings a database made
by an older version up to date (added columns, the waiting status, the head triggers split
by ``CREATE OR REPLACE TRIGGER``), each step safe to run concurrently from many processes
opening one database at once, and while processes of the older version write (the tables an
upgrade alters are taken together first: :func:`_create_or_upgrade`).
"""

from __future__ import annotations

import random
import re
import time
from typing import Any

import runtime.store as store_contract
from actors.stores.postgres_calls import (
    CLAIM_FUNCTION,
    CLAIM_FUNCTION_NAME,
    CLAIM_V4_FUNCTION,
    CLAIM_V4_FUNCTION_NAME,
    DECIDE_FUNCTION,
    DECIDE_FUNCTION_NAME,
    SAVE_FUNCTION,
    SAVE_FUNCTION_NAME,
    SAVE_NEXT_FUNCTION,
    SAVE_NEXT_FUNCTION_NAME,
    SAVE_NEXT_V6_FUNCTION,
    SAVE_NEXT_V6_FUNCTION_NAME,
    SAVE_NEXT_V7_FUNCTION,
    SAVE_NEXT_V7_FUNCTION_NAME,
    SAVE_V5_FUNCTION,
    SAVE_V5_FUNCTION_NAME,
    SAVE_V6_FUNCTION,
    SAVE_V6_FUNCTION_NAME,
    SAVE_V7_FUNCTION,
    SAVE_V7_FUNCTION_NAME,
    SUBMIT_FUNCTION,
    SUBMIT_FUNCTION_NAME,
    SUBMIT_V1_FUNCTION,
    SUBMIT_V1_FUNCTION_NAME,
    SUBMIT_V2_FUNCTION,
    SUBMIT_V2_FUNCTION_NAME,
    SUBMIT_V3_FUNCTION,
    SUBMIT_V3_FUNCTION_NAME,
)
from actors.stores.postgres_lane import (
    CONNECT_TIMEOUT,
    SESSION_SETTINGS,
    set_session,
    unlike_session,
)
from actors.stores.postgres_tables import (
    _CALLER_SCHEMA,
    _CALLER_TRIGGER,
    _DELETION_TRIGGER,
    _HEAD_INSERT_TRIGGER,
    _HEAD_SCHEMA,
    _HEAD_TRIGGER,
    _HEAD_TRIGGERS,
    _INCARNATION_SCHEMA,
    _INCARNATION_TRIGGER,
    _MESSAGE_ID_SCHEMA,
    _QUEUE_INDEXES,
    _SCHEMA,
    _SESSION_COLUMNS,
    _TURN_COLUMNS,
    MESSAGE_ID_INDEX,
    deletion_schema,
)
from runtime.errors import ConfigurationError, StoreCorrupt, StoreError
from runtime.logging import get_logger

MAGIC = "axon-session-store"
SCHEMA_VERSION = 1


UPGRADE_WAIT = 60.0
"""Seconds an open keeps trying to take the tables an upgrade alters (each try gives up
after a fraction of the server's ``deadlock_timeout``, see :func:`_lock_for_upgrade`)
before it fails saying they stayed busy."""


def _first_connect(libpq: str, schema: str, pooled: bool = False) -> str:
    """Connect once (the real error, not a pool timeout, if it fails) and create or
    check the schema, serialized across processes by an advisory lock; the database's
    encoding (``UTF8``, ``LATIN1``...). Then :func:`_check_pooling` (``pooled``: the URL
    says ``?pooler=transaction``).

    A try whose upgrade could not take the tables it alters in time (they were in use:
    ``lock_timeout``) is rolled back whole and tried again after a short pause, for up
    to :data:`UPGRADE_WAIT` seconds: every step is idempotent, and a writer is never
    kept waiting on an opening that itself waits."""
    import psycopg

    try:
        conn = psycopg.connect(
            libpq, connect_timeout=CONNECT_TIMEOUT, autocommit=True, prepare_threshold=None
        )
    except psycopg.ProgrammingError as err:  # an unparseable conninfo
        raise ConfigurationError(f"invalid PostgreSQL URL: {err}") from None
    with conn:
        if pooled and (unlike := unlike_session(conn)):
            name, got = next(iter(unlike.items()))
            raise ConfigurationError(
                f"schema {schema!r} behind a transaction pooler (pooler=transaction): its "
                f"sessions' {name} is {got!r}, which the store's SQL cannot run under, "
                "and no SET outlives a transaction there: ALTER ROLE ... IN DATABASE ... "
                f"SET {name} = '{SESSION_SETTINGS[name]}'"
            )
        deadline = time.monotonic() + UPGRADE_WAIT
        delay = 0.01
        while True:
            try:
                with conn.transaction():
                    # (LOCAL: nothing left on a pooler's server connection, if it is one)
                    set_session(conn, local=True)  # (a trigger keeps its literals as read)
                    _create_or_upgrade(conn, schema)
                _check_pooling(conn, libpq, schema, pooled)
                return str(conn.info.parameter_status("server_encoding"))
            except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as err:
                if time.monotonic() + delay > deadline:
                    raise StoreError(
                        f"schema {schema!r}: the upgrade of its tables found them in use "
                        f"for {UPGRADE_WAIT:g} s (another transaction held them): {err}"
                    ) from err
                time.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, 0.5)


POOLER_FIX = "add pooler=transaction to the URL's query (docs/deployment.md#behind-pgbouncer)"


def _check_pooling(conn: Any, libpq: str, schema: str, pooled: bool) -> None:
    """Refuse, in one line naming the fix, what cannot work behind a transaction pooler.

    Without ``pooled``: a server reached through one (PgBouncer's ``pool_mode =
    transaction``) hands each transaction of a connection to any of its server
    connections, so the store's per-connection state (``SET search_path``, prepared
    statements, ``LISTEN``) is lost or lands on another client's: reads failed with
    ``prepared statement "_pg3_0" does not exist`` or ``relation "axon_sessions" does not
    exist``, or ran in another store's schema. Told apart by two connections whose
    statements one after the other ran on one backend (``pg_backend_pid``): a server
    never gives two open connections one backend; a pooler in transaction mode reuses
    the server connection the first just left (PgBouncer: the last used first). A busy
    pooler may hand the second another one: then this is not seen here.

    With ``pooled``: the schema must be the sessions' own (``current_schema()`` without
    a ``SET``), since no ``SET search_path`` outlives its transaction there."""
    import psycopg

    if pooled:
        (current,) = conn.execute("SELECT current_schema()").fetchone()
        if current != schema:
            raise ConfigurationError(
                f"schema {schema!r} behind a transaction pooler (pooler=transaction): its "
                f"sessions start in {current!r}, and no SET search_path outlives a "
                f"transaction there: ALTER ROLE ... IN DATABASE ... SET search_path = "
                f"{schema}" + ("" if current is None else f", or schema={current}")
            )
        (idle,) = conn.execute(
            "SELECT current_setting('idle_in_transaction_session_timeout')"
        ).fetchone()
        if idle == "0":
            # The store sets its own 10 s on a direct connection; here it cannot.
            get_logger("axon.store.postgres").warning(
                "store.pooled_idle_unlimited",
                schema=schema,
                hint="behind a transaction pooler the store sets no "
                "idle_in_transaction_session_timeout, and the role's is 0: a frozen "
                "worker's row locks would hide its turn from every takeover until it "
                "wakes: ALTER ROLE ... SET idle_in_transaction_session_timeout = '10s' "
                "(or PgBouncer's idle_transaction_timeout)",
            )
        return
    (mine,) = conn.execute("SELECT pg_backend_pid()").fetchone()
    try:
        with psycopg.connect(libpq, connect_timeout=CONNECT_TIMEOUT, autocommit=True) as other:
            got = other.execute("SELECT pg_backend_pid()").fetchone()
            theirs = None if got is None else got[0]
    except psycopg.Error:
        return  # no second connection now (the server's max_connections): not checked
    if mine == theirs:
        raise ConfigurationError(
            "the server is reached through a pooler in transaction mode (two connections "
            f"ran on one server backend, PgBouncer's pool_mode = transaction): {POOLER_FIX}"
        )


def _create_or_upgrade(conn: Any, schema: str) -> None:
    """One try of :func:`_first_connect`'s work, inside its transaction.

    An upgrade (a table of an older store that lacks a column, a trigger or an index)
    first takes every table it alters, at once and before altering any
    (:func:`_lock_for_upgrade`): altering them one by one, the opening held one table
    while it waited for the next, and a worker's save holding the second while it waited
    for the first (a fenced save locks the turn's row, writes the session, then updates
    the turn's row) made a deadlock that PostgreSQL broke by failing the opening
    (``deadlock detected``: a worker or front end of the new version that did not start).
    A store already up to date takes no table lock at all."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('axon-schema'))")
    # Only when missing: CREATE SCHEMA checks the database's CREATE privilege before it
    # looks, so IF NOT EXISTS alone refused a role that owns its schema and may create
    # nothing else in the database ("permission denied for database").
    if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    conn.execute(f"SET LOCAL search_path TO {schema}, {PINNED_LAST}")
    _check_schema_is_ours(conn, schema)
    relations = {
        name
        for (name,) in conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace", (schema,)
        )
    }
    _lock_for_upgrade(conn, schema, relations)
    for statement in _SCHEMA:
        # Only what is missing: CREATE ... IF NOT EXISTS locks the table (an index's) and
        # checks the schema's CREATE privilege before it looks (a role granted only reads
        # and writes of the tables could not open the store).
        if _created_name(statement) not in relations:
            conn.execute(statement)
    _add_turn_columns(conn, schema)
    _add_session_columns(conn, schema)
    _ensure_incarnation_trigger(conn)
    _ensure_caller_trigger(conn)
    _ensure_deletion_trigger(conn)
    if MESSAGE_ID_INDEX not in relations:  # a store of before builds it, once
        for statement in _MESSAGE_ID_SCHEMA:
            conn.execute(statement)
    _ensure_turn_heads(conn)
    _ensure_claim_function(conn)
    _ensure_save_function(conn)
    _ensure_function(conn, SAVE_V5_FUNCTION_NAME, SAVE_V5_FUNCTION)  # (called by the next two)
    _ensure_function(conn, DECIDE_FUNCTION_NAME, DECIDE_FUNCTION)
    _ensure_function(conn, SAVE_NEXT_FUNCTION_NAME, SAVE_NEXT_FUNCTION)
    _ensure_function(conn, SUBMIT_FUNCTION_NAME, SUBMIT_FUNCTION)
    # The versions before this one's, which its processes call while a fleet is mixed
    # (a rolling deploy): kept, and created for a database this version made first.
    _ensure_function(conn, CLAIM_V4_FUNCTION_NAME, CLAIM_V4_FUNCTION)
    _ensure_function(conn, SAVE_V6_FUNCTION_NAME, SAVE_V6_FUNCTION)
    _ensure_function(conn, SAVE_NEXT_V6_FUNCTION_NAME, SAVE_NEXT_V6_FUNCTION)
    _ensure_function(conn, SAVE_V7_FUNCTION_NAME, SAVE_V7_FUNCTION)
    _ensure_function(conn, SAVE_NEXT_V7_FUNCTION_NAME, SAVE_NEXT_V7_FUNCTION)
    _ensure_function(conn, SUBMIT_V1_FUNCTION_NAME, SUBMIT_V1_FUNCTION)
    _ensure_function(conn, SUBMIT_V2_FUNCTION_NAME, SUBMIT_V2_FUNCTION)
    _ensure_function(conn, SUBMIT_V3_FUNCTION_NAME, SUBMIT_V3_FUNCTION)
    _pin_function_paths(conn)
    conn.execute(
        """INSERT INTO axon_meta (key, value) VALUES ('magic', %s), ('schema_version', %s)
        ON CONFLICT (key) DO NOTHING""",
        (MAGIC, str(SCHEMA_VERSION)),
    )


_ALTERED_TABLES = ("axon_turns", "axon_sessions", "axon_messages")
"""The tables an upgrade may alter, in the order writers lock them (a fenced save: the
turn's row, then the session's, then its messages)."""


def _created_name(statement: str) -> str:
    """The name a ``CREATE ... IF NOT EXISTS name`` statement creates."""
    match = re.search(r"IF NOT EXISTS (\w+)", statement)
    assert match is not None, statement
    return match.group(1)


def _lock_for_upgrade(conn: Any, schema: str, relations: set[str]) -> None:
    """Take the existing tables the upgrade alters (:func:`_tables_to_alter`) in
    ``ACCESS EXCLUSIVE`` mode in one statement, waiting at most a fifth of the server's
    ``deadlock_timeout`` for each (``LockNotAvailable``: the caller tries again); none
    when nothing is to be altered.

    Once they are held, the upgrade's statements wait for no table, so the opening
    cannot be part of a deadlock; while it waits here, a writer waiting on it has been
    waiting for less time than it has, and PostgreSQL looks for a deadlock only after a
    waiter's ``deadlock_timeout``: the opening gives up first, and the writer goes on.
    Only those tables: an upgrade of the turns table alone (its head triggers' backfill
    reads every turn) leaves the sessions' saves and loads free meanwhile."""
    tables = _tables_to_alter(conn, schema, relations)
    if not tables:
        return
    (deadlock_ms,) = conn.execute(
        "SELECT setting::int FROM pg_settings WHERE name = 'deadlock_timeout'"
    ).fetchone()
    conn.execute(f"SET LOCAL lock_timeout = {max(1, min(100, deadlock_ms // 5))}")
    conn.execute(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")


def _tables_to_alter(conn: Any, schema: str, relations: set[str]) -> list[str]:
    """The existing tables of :data:`_ALTERED_TABLES` that lack a column, an index or a
    trigger of this version (the conditions under which the steps below alter them)."""
    columns = set(
        conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name IN ('axon_turns', 'axon_sessions')",
            (schema,),
        ).fetchall()
    )
    triggers = {
        (table, name)
        for table, name in conn.execute(
            "SELECT c.relname, t.tgname FROM pg_trigger AS t "
            "JOIN pg_class AS c ON c.oid = t.tgrelid WHERE c.relnamespace = %s::regnamespace",
            (schema,),
        )
    }
    lacking = {
        "axon_turns": (
            any(
                _created_name(statement) not in relations
                for statement in _SCHEMA
                if " ON axon_turns " in statement
            )
            or any(("axon_turns", column) not in columns for column, _ in _TURN_COLUMNS)
            or ("axon_turns", _HEAD_TRIGGER) not in triggers
            or (
                ("axon_turns", _HEAD_INSERT_TRIGGER) not in triggers
                and conn.info.server_version >= 140000
            )
        ),
        "axon_sessions": (
            any(
                _created_name(statement) not in relations
                for statement in _SCHEMA
                if " ON axon_sessions " in statement
            )
            or any(("axon_sessions", column) not in columns for column, _ in _SESSION_COLUMNS)
            or ("axon_sessions", _INCARNATION_TRIGGER) not in triggers
            or ("axon_sessions", _DELETION_TRIGGER) not in triggers
            or ("axon_sessions", _CALLER_TRIGGER) not in triggers
        ),
        "axon_messages": MESSAGE_ID_INDEX not in relations,
    }
    return [name for name in _ALTERED_TABLES if name in relations and lacking[name]]


def _check_schema_is_ours(conn: Any, schema: str) -> None:
    """Refuse, untouched, a schema holding another program's ``axon_`` tables or a newer
    Axon schema; an empty schema or an Axon one of this version or older passes."""
    tables = {
        name
        for (name,) in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,),
        )
    }
    if tables and "axon_meta" not in tables and tables & {"axon_sessions", "axon_messages"}:
        raise StoreCorrupt(
            f"schema {schema!r} has axon tables but no axon_meta: it is not an Axon store "
            "(refusing to touch it)"
        )
    if "axon_meta" not in tables:
        return
    marker: dict[str, str] = dict(conn.execute("SELECT key, value FROM axon_meta").fetchall())
    if marker.get("magic") != MAGIC:
        raise StoreCorrupt(
            f"schema {schema!r}: axon_meta magic is {marker.get('magic')!r}, "
            f"expected {MAGIC!r}; refusing to touch it"
        )
    try:
        found = int(marker.get("schema_version", "0"))
    except ValueError:  # (a raw ValueError escaped PostgresStore.open, naming nothing)
        raise StoreCorrupt(
            f"schema {schema!r} is damaged: axon_meta schema_version "
            f"{marker['schema_version']!r} is not a version number; refusing to touch it"
        ) from None
    if found > SCHEMA_VERSION:
        raise StoreError(
            f"schema {schema!r} has Axon schema version {found}, newer than the "
            f"{SCHEMA_VERSION} this version understands; upgrade axon-runtime"
        )


def _add_turn_columns(conn: Any, schema: str) -> None:
    """Add the :data:`_TURN_COLUMNS` an older store lacks (only those: see there)."""
    present = {
        name
        for (name,) in conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = 'axon_turns'",
            (schema,),
        )
    }
    for column, definition in _TURN_COLUMNS:
        if column not in present:
            conn.execute(f"ALTER TABLE axon_turns ADD COLUMN IF NOT EXISTS {column} {definition}")
            if column == "message_key":  # its index, in the same transaction
                conn.execute(
                    "CREATE INDEX IF NOT EXISTS axon_turns_by_message_key "
                    "ON axon_turns (message_key, seq) WHERE message_key IS NOT NULL"
                )
            if column == "expires_at":  # the waits a worker looks at, and their status
                conn.execute(
                    "CREATE INDEX IF NOT EXISTS axon_turns_waiting "
                    "ON axon_turns (expires_at) WHERE status = 'awaiting-input'"
                )
                _allow_waiting_status(conn)


def _add_session_columns(conn: Any, schema: str) -> None:
    """Add the :data:`_SESSION_COLUMNS` an older store lacks (only those, as
    :func:`_add_turn_columns`)."""
    present = {
        name
        for (name,) in conn.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = 'axon_sessions'",
            (schema,),
        )
    }
    for column, definition in _SESSION_COLUMNS:
        if column not in present:
            conn.execute(
                f"ALTER TABLE axon_sessions ADD COLUMN IF NOT EXISTS {column} {definition}"
            )


def _ensure_incarnation_trigger(conn: Any) -> None:
    """The trigger that records a new session's incarnation (:data:`_INCARNATION_TRIGGER`),
    created with its function when missing."""
    found = conn.execute(
        "SELECT 1 FROM pg_trigger WHERE tgrelid = 'axon_sessions'::regclass AND tgname = %s",
        (_INCARNATION_TRIGGER,),
    ).fetchone()
    if found is None:
        for statement in _INCARNATION_SCHEMA:
            conn.execute(statement)


def _ensure_caller_trigger(conn: Any) -> None:
    """The triggers that keep a session's ``caller`` (:data:`_CALLER_TRIGGER`), created
    with their functions and index when missing, the sessions stored before filled."""
    found = conn.execute(
        "SELECT 1 FROM pg_trigger WHERE tgrelid = 'axon_sessions'::regclass AND tgname = %s",
        (_CALLER_TRIGGER,),
    ).fetchone()
    if found is None:
        for statement in _CALLER_SCHEMA:
            conn.execute(statement)


def _ensure_deletion_trigger(conn: Any) -> None:
    """The trigger that sets a deleted session's deletion mark (:data:`_DELETION_TRIGGER`),
    created with its function when missing."""
    found = conn.execute(
        "SELECT 1 FROM pg_trigger WHERE tgrelid = 'axon_sessions'::regclass AND tgname = %s",
        (_DELETION_TRIGGER,),
    ).fetchone()
    if found is None:
        for statement in deletion_schema(store_contract.DELETION_MARKS_KEPT):
            conn.execute(statement)


WAITING_CHECK = (
    "CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled', 'awaiting-input'))"
)
"""The statuses ``axon_turns`` allows since turns can wait for a person."""


def _allow_waiting_status(conn: Any) -> None:
    """A table created before turns could wait gets the status ``awaiting-input`` in its
    CHECK (run once, with the ``expires_at`` column, in the same transaction)."""
    conn.execute(
        "ALTER TABLE axon_turns DROP CONSTRAINT IF EXISTS axon_turns_status_check, "
        f"ADD CONSTRAINT axon_turns_status_check {WAITING_CHECK}"
    )


def _ensure_turn_heads(conn: Any) -> None:
    """The queue's head triggers and indexes (:data:`_HEAD_TRIGGER`), created when
    missing; a store whose one trigger ran on every status change gets the two of
    :data:`_HEAD_TRIGGERS` in its place, in the opening's transaction (no writer sees the
    table without them), on PostgreSQL 14 and later: ``CREATE OR REPLACE TRIGGER`` locks
    the table as ``CREATE TRIGGER`` does, where ``DROP TRIGGER`` would take it exclusively
    (and deadlock with a claim's transaction that read it first). Before 14 such a store
    keeps its one trigger, which does the same, dearer."""
    found = {
        name
        for (name,) in conn.execute(
            "SELECT tgname FROM pg_trigger "
            "WHERE tgrelid = 'axon_turns'::regclass AND tgname IN (%s, %s)",
            (_HEAD_TRIGGER, _HEAD_INSERT_TRIGGER),
        ).fetchall()
    }
    if _HEAD_TRIGGER not in found:
        if _HEAD_INSERT_TRIGGER in found:  # only if there (a drop locks the table whole)
            conn.execute(f"DROP TRIGGER {_HEAD_INSERT_TRIGGER} ON axon_turns")
        for statement in (*_HEAD_SCHEMA, *_QUEUE_INDEXES):
            conn.execute(statement)
    elif _HEAD_INSERT_TRIGGER not in found and conn.info.server_version >= 140000:
        update, insert = _HEAD_TRIGGERS
        conn.execute(insert)
        conn.execute(update.replace("CREATE TRIGGER", "CREATE OR REPLACE TRIGGER", 1))


def _ensure_claim_function(conn: Any) -> None:
    """The claim's function (:data:`CLAIM_FUNCTION`), created when missing (a store
    created before it gains it on open; the check first: ``CREATE OR REPLACE`` would
    drop every connection's cached plans of it)."""
    found = conn.execute(
        "SELECT 1 FROM pg_proc "
        "WHERE proname = %s AND pronamespace = current_schema()::regnamespace",
        (CLAIM_FUNCTION_NAME,),
    ).fetchone()
    if found is None:
        conn.execute(CLAIM_FUNCTION)


def _ensure_function(conn: Any, name: str, create: str) -> None:
    """The server-side function ``name``, created by ``create`` when missing (as the
    claim's, :func:`_ensure_claim_function`)."""
    found = conn.execute(
        "SELECT 1 FROM pg_proc "
        "WHERE proname = %s AND pronamespace = current_schema()::regnamespace",
        (name,),
    ).fetchone()
    if found is None:
        conn.execute(create)


PINNED_LAST = "pg_temp"
"""The path the server-side functions are created with (``SET search_path FROM CURRENT``)
ends with this: a path that does not name ``pg_temp`` searches the session's temporary
tables FIRST, so a temporary ``axon_turns`` on the calling connection (one a transaction
pooler hands over from another client) took a submit's rows. Named last, it is searched
last (functions are never looked up in it)."""


def _pin_function_paths(conn: Any) -> None:
    """The functions of the schema that pin a ``search_path`` other than the current one
    (:data:`PINNED_LAST`: created by a version of before, without ``pg_temp``) pinned to
    it, those this role may alter (it owns them); none altered once done (a look only)."""
    stale = conn.execute(
        """SELECT p.oid::regprocedure::text FROM pg_proc AS p
        WHERE p.pronamespace = current_schema()::regnamespace
            AND EXISTS (SELECT 1 FROM unnest(p.proconfig) AS c WHERE c LIKE 'search_path=%')
            AND NOT ('search_path=' || current_setting('search_path')) = ANY(p.proconfig)
            AND pg_has_role(p.proowner, 'USAGE')"""
    ).fetchall()
    for (signature,) in stale:
        conn.execute(f"ALTER FUNCTION {signature} SET search_path FROM CURRENT")


def recreate_submit_function(conn: Any, schema: str) -> None:
    """The submit's function (:data:`SUBMIT_FUNCTION`) created again when it is missing
    (dropped, or not restored with the tables) while processes run: in one transaction,
    under the open's lock, with the open's path (a submit that met it missing calls this,
    then calls the function again, once)."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('axon-schema'))")
    conn.execute(f"SET LOCAL search_path TO {schema}, {PINNED_LAST}")
    _ensure_function(conn, SUBMIT_FUNCTION_NAME, SUBMIT_FUNCTION)


def _ensure_save_function(conn: Any) -> None:
    """The save's function (:data:`SAVE_FUNCTION`), created when missing (as the
    claim's, :func:`_ensure_claim_function`)."""
    found = conn.execute(
        "SELECT 1 FROM pg_proc "
        "WHERE proname = %s AND pronamespace = current_schema()::regnamespace",
        (SAVE_FUNCTION_NAME,),
    ).fetchone()
    if found is None:
        conn.execute(SAVE_FUNCTION)
