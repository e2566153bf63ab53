"""The tables, indexes and head triggers of the PostgreSQL store's schema.

What :func:`~actors.stores.postgres_schema._first_connect` creates in a store's schema when
missing: the sessions, their messages, the durable turns and their queue's indexes, and
the head triggers that keep each session's next queued turn marked claimable. Apart from
:mod:`actors.stores.postgres` because it is data (DDL text) read once per schema, not
code a call runs; the layout is drawn in that module's docstring.
"""

from __future__ import annotations

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS axon_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)""",
    "CREATE SEQUENCE IF NOT EXISTS axon_versions",
    "CREATE SEQUENCE IF NOT EXISTS axon_update_seq",
    """CREATE TABLE IF NOT EXISTS axon_sessions (
        session_id TEXT PRIMARY KEY,
        meta BYTEA NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        update_seq BIGINT NOT NULL,
        version BIGINT NOT NULL,
        incarnation BIGINT NOT NULL DEFAULT 0,
        caller TEXT
    )""",
    # The sessions' ids in code point order, whatever the database's collation: a
    # delete of subturnedge's version reads a session's sub-sessions (ids
    # ``<caller>.``...) as a range of them (this version reads ``caller``, see
    # _CALLER_SCHEMA), which a primary key in a linguistic collation (where '.' need
    # not sort before '/') cannot serve. Kept while such processes may run. Only a new
    # session writes it (an id never changes: a save's update stays HOT).
    """CREATE INDEX IF NOT EXISTS axon_sessions_by_code_point
        ON axon_sessions ((session_id COLLATE "C"))""",
    # No index on update_seq (stores of before have axon_sessions_by_update; nothing reads
    # it: listing every session sorts them all, a walk of the whole index buys nothing):
    # every save bumps update_seq, and an indexed column changed makes the row's update
    # non-HOT, a new entry in each of the table's indexes at every save of a stored
    # session; unindexed, that update can be HOT (issue 24 goal 3, branch pg3).
    """CREATE TABLE IF NOT EXISTS axon_messages (
        session_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        role TEXT NOT NULL,
        body BYTEA NOT NULL,
        PRIMARY KEY (session_id, idx)
    )""",
    # A running turn's answer as its head (axon_messages.body) and segments of its parts
    # (actors.stores.postgres, "Grown messages"): one row a step's save of a long turn.
    """CREATE TABLE IF NOT EXISTS axon_message_segments (
        session_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        first INTEGER NOT NULL,
        body BYTEA NOT NULL,
        PRIMARY KEY (session_id, idx, first)
    )""",
    # Each deleted id's deletion mark (runtime.store.Store, "Deletion marks"): grows with
    # each deletion of it, one row an id, written by :data:`_DELETION_TRIGGER`'s trigger
    # (the last DELETION_MARKS_KEPT deletions'). A store of before gains it empty on open.
    """CREATE TABLE IF NOT EXISTS axon_deletions (
        session_id TEXT PRIMARY KEY,
        deletions BIGINT NOT NULL
    )""",
    # The marks in order: the trigger's highest mark and its drop of the old ones read
    # this index, not every mark (up to DELETION_MARKS_KEPT of them) each delete.
    "CREATE INDEX IF NOT EXISTS axon_deletions_by_mark ON axon_deletions (deletions)",
    """CREATE TABLE IF NOT EXISTS axon_turns (
        turn_id TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        seq BIGSERIAL NOT NULL,
        idempotency_key TEXT,
        input TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'queued'
            CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled',
                              'awaiting-input')),
        owner TEXT,
        epoch BIGINT NOT NULL DEFAULT 0,
        lease_until TIMESTAMPTZ,
        attempts INTEGER NOT NULL DEFAULT 0,
        saved BOOLEAN NOT NULL DEFAULT false,
        cancel_requested BOOLEAN NOT NULL DEFAULT false,
        finish_reason TEXT,
        error TEXT,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        started_at TIMESTAMPTZ,
        finished_at TIMESTAMPTZ
    )""",
    # A key names one submission: unique where given. Partial (stores of before have the
    # column's UNIQUE, named the same): a NULL key is no entry, where a UNIQUE column
    # indexes every turn's NULL again at each of its non-HOT updates (its claim, its end).
    # Submits insert with ON CONFLICT DO NOTHING and no target, which every unique index
    # arbitrates, this one as the constraint did (NULLs never conflicted).
    """CREATE UNIQUE INDEX IF NOT EXISTS axon_turns_idempotency_key_key
        ON axon_turns (idempotency_key) WHERE idempotency_key IS NOT NULL""",
    # At most one running turn per session: two workers can never run one session.
    """CREATE UNIQUE INDEX IF NOT EXISTS axon_turns_one_running
        ON axon_turns (session_id) WHERE status = 'running'""",
    """CREATE INDEX IF NOT EXISTS axon_turns_open
        ON axon_turns (seq) WHERE status IN ('queued', 'running')""",
    "CREATE INDEX IF NOT EXISTS axon_turns_by_session ON axon_turns (session_id, seq)",
    # Named stops that came before the POST of the message they name (a front end found
    # no turn of it): the submit of that message takes its stop in its insert, and its
    # worker stops the turn as it starts (actors.stores.turn_submit). A minute each, at
    # most ``TurnQueue.held_stops_kept`` of them, the oldest dropped: what a stop adds.
    # A store of before gains it empty on open.
    """CREATE TABLE IF NOT EXISTS axon_held_stops (
        session_id TEXT NOT NULL,
        message_id TEXT NOT NULL,
        reason TEXT NOT NULL,
        held_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
        PRIMARY KEY (session_id, message_id)
    )""",
    "CREATE INDEX IF NOT EXISTS axon_held_stops_by_age ON axon_held_stops (held_at)",
)

_TURN_COLUMNS = (
    ("meta", "BYTEA NOT NULL DEFAULT '{}'"),  # a JSON object, like axon_sessions.meta
    ("regenerate", "BOOLEAN NOT NULL DEFAULT false"),
    ("cancel_reason", "TEXT"),
    # A keyed submit's caller key, hashed (the ``idempotency_key`` column is unique per
    # submission of it: a message id sent again with other text is an edit, another row).
    ("message_key", "TEXT"),
    ("input_hash", "TEXT"),  # what the turn was asked: an identical retry is a replay
    ("head", "BOOLEAN NOT NULL DEFAULT false"),
    ("head_seq", "BIGINT"),
    # A turn that waits for a person (status 'awaiting-input', docs/approval.md): when
    # its wait expires (wall-clock seconds since the epoch; NULL: never), how many times
    # it was resumed after a wait, and whether the next claim runs its continuation.
    ("expires_at", "DOUBLE PRECISION"),
    ("resumes", "INTEGER NOT NULL DEFAULT 0"),
    ("resume_pending", "BOOLEAN NOT NULL DEFAULT false"),
    # What a protocol's turn carries beyond its input (runtime.turn_queue.TurnOptions):
    # a JSON object, '{}' for none.
    ("options", "BYTEA NOT NULL DEFAULT '{}'"),
    # A message submitted to steer the session's running turn (on_busy='steer'): that
    # turn's id. Its worker takes the row at a step boundary; else it runs as a turn.
    ("steer_of", "TEXT"),
    # How many steer submits named this running turn: its fenced saves read it, so its
    # worker reads the steering rows only when new ones came (runtime.turn_queue.SteerWatch).
    ("steers", "INTEGER NOT NULL DEFAULT 0"),
    # The claim that last took the running turn (a token of the claiming call, drawn by
    # its worker): a claim retried after its answer was lost finds the turn its first
    # try took and gives it back with its attempt (actors.stores.turn_claims).
    ("claim_token", "TEXT"),
)
"""Columns the turn queue (:mod:`actors.stores.turns`) added after schema 1 shipped: a
store created before them gains them on open, in place, without a version change. Each
runs only when its column is missing: ``ALTER TABLE`` takes an exclusive lock even when
it has nothing to do, and a worker opening the store while others claim turns would
deadlock with them."""

_SESSION_COLUMNS = (
    # The version of the session's first save (runtime.store.SessionRecord.incarnation),
    # written by :data:`_INCARNATION_SCHEMA`'s trigger; 0 for the sessions stored before.
    ("incarnation", "BIGINT NOT NULL DEFAULT 0"),
    # The calling session its meta names (a sub-session's owner, :data:`_CALLER_SCHEMA`),
    # written by its triggers; NULL for a session an application opened.
    ("caller", "TEXT"),
)
"""Columns ``axon_sessions`` gained after schema 1 shipped: added on open when missing,
as :data:`_TURN_COLUMNS` are."""

_INCARNATION_TRIGGER = "axon_sessions_incarnation_v1"
"""The trigger (and its function) that records a new session row's ``version`` as its
``incarnation``: a session deleted and saved again is a new row, whose first version (a
draw of the database-wide ``axon_versions``) is above every version the deleted one had.
In the insert's own statement (no statement more for a save), and kept by the database
like :data:`_HEAD_TRIGGER`, so every writer records it: the save's function of every
version, the Python insert, a front end of an earlier version during a rolling upgrade.
A new version of it gets a new name."""

_INCARNATION_SCHEMA = (
    f"""CREATE OR REPLACE FUNCTION {_INCARNATION_TRIGGER}() RETURNS trigger
        LANGUAGE plpgsql AS $$
    BEGIN
        NEW.incarnation := NEW.version;
        RETURN NEW;
    END $$""",
    f"""CREATE TRIGGER {_INCARNATION_TRIGGER} BEFORE INSERT ON axon_sessions
        FOR EACH ROW EXECUTE FUNCTION {_INCARNATION_TRIGGER}()""",
)
"""Created once, when the trigger is missing (``CREATE TRIGGER`` locks the table)."""

CALLER_FUNCTION = "axon_meta_caller_v1"
"""The calling session a stored meta names (its JSON's ``parent_session_id``,
:data:`~runtime.tools.PARENT_SESSION_META`), ``NULL`` for a meta that names none, and
``''`` (no session's id) for one that names it but cannot be read here (a database
that is not UTF-8 cannot hold every character; JSON text may hold ``\\u0000``, which
``->>`` refuses): a delete reads those too and decides in Python."""

_CALLER_KEY = "'\\x22706172656e745f73657373696f6e5f696422'::bytea"
"""``"parent_session_id"`` (with its quotes) as bytes: a meta whose bytes do not hold
it names no caller, told without parsing it (the triggers' ``WHEN``, the function's
first test): a session an application opened costs no call of a function."""

_CALLER_TRIGGER = "axon_sessions_caller_v1"
"""The triggers (and their function) that keep ``axon_sessions.caller``: the caller a
session's meta names, so a delete finds a session's sub-sessions by an index
(``axon_sessions_by_caller``, :mod:`actors.stores.owned`) without reading the calls in
its messages. On an insert whose meta names one, and on an update whose meta changed and
names one or named one: only sub-sessions run the function (a save whose meta is the
stored one runs nothing; the column unchanged, a save's update stays HOT). Kept by the
database, as :data:`_INCARNATION_TRIGGER`, so every writer records it: the save's
function of every version, a process of an earlier version during a rolling upgrade. A
new version of it gets a new name."""

_CALLER_UPDATE_TRIGGER = "axon_sessions_caller_update_v1"
""":data:`_CALLER_TRIGGER`'s function run on an update (a trigger's ``WHEN`` cannot read
``OLD`` on an insert)."""

CALLER_INDEX = "axon_sessions_by_caller"
"""The sub-sessions by their caller (partial: a session naming none has no entry)."""

_CALLER_SCHEMA = (
    f"""CREATE OR REPLACE FUNCTION {CALLER_FUNCTION}(meta BYTEA) RETURNS TEXT
        LANGUAGE plpgsql IMMUTABLE STRICT AS $$
    DECLARE
        found JSON;
    BEGIN
        IF position({_CALLER_KEY} IN meta) = 0 THEN
            RETURN NULL;
        END IF;
        BEGIN  -- (a subtransaction: only for the metas that hold the key)
            found := convert_from(meta, 'UTF8')::json -> 'parent_session_id';
            IF json_typeof(found) = 'string' THEN
                RETURN found #>> '{{}}';
            END IF;
            RETURN NULL;
        EXCEPTION WHEN OTHERS THEN
            RETURN '';
        END;
    END $$""",
    f"""CREATE OR REPLACE FUNCTION {_CALLER_TRIGGER}() RETURNS trigger
        LANGUAGE plpgsql AS $$
    BEGIN
        NEW.caller := {CALLER_FUNCTION}(NEW.meta);
        RETURN NEW;
    END $$""",
    f"""CREATE TRIGGER {_CALLER_TRIGGER} BEFORE INSERT ON axon_sessions
        FOR EACH ROW WHEN (position({_CALLER_KEY} IN NEW.meta) > 0)
        EXECUTE FUNCTION {_CALLER_TRIGGER}()""",
    f"""CREATE TRIGGER {_CALLER_UPDATE_TRIGGER} BEFORE UPDATE OF meta ON axon_sessions
        FOR EACH ROW WHEN (OLD.meta IS DISTINCT FROM NEW.meta
            AND (OLD.caller IS NOT NULL OR position({_CALLER_KEY} IN NEW.meta) > 0))
        EXECUTE FUNCTION {_CALLER_TRIGGER}()""",
    # The sessions stored before the triggers (a store of before: under the upgrade's
    # lock, so no writer adds one meanwhile); a read of every meta, once.
    f"""UPDATE axon_sessions SET caller = {CALLER_FUNCTION}(meta)
        WHERE position({_CALLER_KEY} IN meta) > 0""",
    f"""CREATE INDEX IF NOT EXISTS {CALLER_INDEX}
        ON axon_sessions (caller) WHERE caller IS NOT NULL""",
)
"""Created once, when the insert's trigger is missing, after the column (a store of
before gains them under the upgrade's lock: ``CREATE TRIGGER`` locks the table)."""

_DELETION_TRIGGER = "axon_sessions_deletion_v1"
"""The trigger (and its function) that sets a deleted session row's id's deletion mark
(``axon_deletions``): one above the highest mark held (read from
``axon_deletions_by_mark``; above the id's own, as it stands locked), and every tenth of
``kept`` deletions drops the marks ``kept`` deletions old (the planner scans the marks
for it: the marks stay bounded, at most a tenth more than ``kept``, whatever the number
of sessions deleted). Kept by the database, as :data:`_INCARNATION_TRIGGER`,
so every delete moves the mark: this version's, a process's of before the marks (a bare
``DELETE``, whose deletions went uncounted: a turn begun before it was rebased onto the
session created again, or saved it back), or of before this trigger (its own ``+ 1``
then moves it once more). A new version of it gets a new name."""


def deletion_schema(kept: int) -> tuple[str, ...]:
    """:data:`_DELETION_TRIGGER`'s function and trigger, keeping the marks of the last
    ``kept`` deletions; created once, when the trigger is missing."""
    return (
        f"""CREATE OR REPLACE FUNCTION {_DELETION_TRIGGER}() RETURNS trigger
            LANGUAGE plpgsql AS $$
        DECLARE
            top BIGINT;
        BEGIN
            SELECT coalesce(max(deletions), 0) + 1 INTO top FROM axon_deletions;
            INSERT INTO axon_deletions (session_id, deletions) VALUES (OLD.session_id, top)
            ON CONFLICT (session_id) DO UPDATE
            SET deletions = greatest(axon_deletions.deletions + 1, EXCLUDED.deletions);
            IF top % {max(1, int(kept) // 10)} = 0 THEN  -- a scan: every tenth of ``kept``
                DELETE FROM axon_deletions WHERE deletions <= top - {int(kept)};
            END IF;
            RETURN NULL;
        END $$""",
        f"""CREATE TRIGGER {_DELETION_TRIGGER} AFTER DELETE ON axon_sessions
            FOR EACH ROW EXECUTE FUNCTION {_DELETION_TRIGGER}()""",
    )


_HEAD_TRIGGER = "axon_turns_head_v1"
"""The trigger (and its function) that keeps ``axon_turns.head``: true on exactly the
oldest queued turn of each session that has one, so a claim walks one row per session
(the ``axon_turns_heads`` index) instead of every queued turn. ``head_seq`` is a head's
place in line, drawn (``axon_turns_heads_seq``) when it became its session's head: a
session's next turn queues up behind the heads already waiting, so sessions take turns
(round robin) however many turns one of them queued. Kept by the database, not by the
queue's code, so every writer keeps it, including a front end or worker of an earlier
version during a rolling upgrade. A new version of it gets a new name."""

_HEAD_FUNCTION = f"""CREATE OR REPLACE FUNCTION {_HEAD_TRIGGER}() RETURNS trigger
    LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    next_id TEXT;
BEGIN
    -- The session's lock (also taken by TurnQueue.submit): a submit and a claim or
    -- cancel of the same session's head see each other's rows, never miss them.
    IF TG_OP = 'INSERT' THEN
        IF NEW.status <> 'queued' THEN
            NEW.head := false;
            RETURN NEW;
        END IF;
        PERFORM pg_advisory_xact_lock(
            hashtextextended('axon_turns:' || current_schema() || ':' || NEW.session_id, 0));
        -- "session_id >= x AND session_id <= x" is "= x" that leaves ORDER BY
        -- (session_id, seq) to the axon_turns_queued index alone: with "= x" the cached
        -- generic plan may walk axon_turns_open by seq through other sessions' backlogs.
        SELECT turn_id INTO next_id FROM axon_turns
        WHERE session_id >= NEW.session_id AND session_id <= NEW.session_id
          AND status = 'queued'
        ORDER BY session_id, seq LIMIT 1;
        NEW.head := next_id IS NULL;
        NEW.head_seq := CASE WHEN NEW.head THEN nextval('axon_turns_heads_seq') END;
        RETURN NEW;
    END IF;
    IF OLD.status = 'queued' AND NEW.status <> 'queued' THEN
        NEW.head := false;
        IF OLD.head THEN
            PERFORM pg_advisory_xact_lock(
                hashtextextended('axon_turns:' || current_schema() || ':' || NEW.session_id, 0));
            LOOP  -- a next turn cancelled meanwhile is skipped: take the one after it
                SELECT turn_id INTO next_id FROM axon_turns
                WHERE session_id >= NEW.session_id AND session_id <= NEW.session_id
                  AND status = 'queued' AND turn_id <> NEW.turn_id
                ORDER BY session_id, seq LIMIT 1;
                EXIT WHEN next_id IS NULL;
                UPDATE axon_turns SET head = true, head_seq = nextval('axon_turns_heads_seq')
                WHERE turn_id = next_id AND status = 'queued' RETURNING turn_id INTO next_id;
                EXIT WHEN next_id IS NOT NULL;
            END LOOP;
        END IF;
    END IF;
    RETURN NEW;
END $$"""

_HEAD_INSERT_TRIGGER = "axon_turns_head_insert_v1"
"""The head trigger's function run on an insert (:data:`_HEAD_TRIGGERS`)."""

_HEAD_TRIGGERS = (
    # An update runs the function only when it takes a turn out of the queue: the one
    # change it has something to do for. A running turn's end (`done`, every turn), a
    # suspension, a decision's requeue wrote the row through a PL/pgSQL call for nothing.
    # Its name stays the one trigger's of before (a process of an earlier version looks
    # for it and, missing, would create it again beside these).
    f"""CREATE TRIGGER {_HEAD_TRIGGER} BEFORE UPDATE OF status ON axon_turns
        FOR EACH ROW WHEN (OLD.status = 'queued' AND NEW.status <> 'queued')
        EXECUTE FUNCTION {_HEAD_TRIGGER}()""",
    f"""CREATE TRIGGER {_HEAD_INSERT_TRIGGER} BEFORE INSERT ON axon_turns
        FOR EACH ROW EXECUTE FUNCTION {_HEAD_TRIGGER}()""",
)
"""The head trigger as two (a trigger's ``WHEN`` cannot read ``OLD`` on an insert): the
function on every insert, and on an update only of a queued turn's status away from
``queued``, exactly where the function writes anything."""

_HEAD_SCHEMA = (
    "CREATE SEQUENCE IF NOT EXISTS axon_turns_heads_seq",
    _HEAD_FUNCTION,
    *_HEAD_TRIGGERS,
    # Heads for the turns queued before the trigger existed, in line by their seq (only
    # the rows that change are written: the table holds every turn ever run).
    "UPDATE axon_turns SET head = false, head_seq = NULL WHERE head",
    """UPDATE axon_turns SET head = true, head_seq = seq WHERE turn_id IN (
        SELECT DISTINCT ON (session_id) turn_id FROM axon_turns
        WHERE status = 'queued' ORDER BY session_id, seq)""",
    """SELECT setval('axon_turns_heads_seq', greatest(max(seq), 1))
        FROM axon_turns""",
    "CREATE INDEX IF NOT EXISTS axon_turns_heads ON axon_turns (head_seq) WHERE head",
)
"""Created once, when the trigger is missing (``CREATE TRIGGER`` locks the table), with
:data:`_QUEUE_INDEXES`: ``CREATE INDEX IF NOT EXISTS`` too locks the table before it finds
the index there, and a store opening must not wait for every claim in flight."""

_QUEUE_INDEXES = (
    # A session's queued turns (its backlog count, its next head) without its history.
    """CREATE INDEX IF NOT EXISTS axon_turns_queued
        ON axon_turns (session_id, seq) WHERE status = 'queued'""",
    # Expired leases without walking the queued turns.
    """CREATE INDEX IF NOT EXISTS axon_turns_leases
        ON axon_turns (lease_until) WHERE status = 'running'""",
)

MESSAGE_ID_FUNCTION = "axon_message_id_v1"
"""The id a stored message's body holds (its JSON's ``id``), what :data:`_MESSAGE_ID_SCHEMA`
indexes for the user's messages only: "was user message id X saved in this session"
answered from the index (:meth:`~actors.stores.postgres.PostgresStore.has_user_messages`),
where a front end read the whole session (A2A's ``message/send``: a message sent again).
A partial index (``WHERE role = 'user'``): PostgreSQL runs an index's expression only for
the rows its predicate admits, so a save parses the JSON of its user message and of none
of its assistant and tool messages (a 100 KB tool output is the rows it would cost most,
~1.5 ms of the server's time a save; the ids a front end asks about are those its client
sent, user messages). ``NULL`` for a body it cannot read as PostgreSQL text: JSON text may
hold ``\\u0000``, which ``->>`` refuses to turn into text, and a database that is not
UTF-8 may not hold every character; the exception is caught (a save never fails on it)
and a reader that meets a ``NULL`` reads the session's ids the long way. An expression
index, not a column: every writer keeps it (a save's function of any version, a process
of before during a rolling upgrade) and the messages stored before it are indexed when
it is built; the save's statements and bytes are the same. A new version of it gets a
new name (the index's expression names this one). Not ``PARALLEL SAFE``: its exception
block starts a subtransaction, which a parallel worker cannot, and PostgreSQL builds the
index of a large table in parallel ("cannot start subtransactions during a parallel
operation" failed the upgrade)."""

MESSAGE_ID_INDEX = "axon_user_messages_by_id"
"""The partial index of the user messages' ids (:data:`MESSAGE_ID_FUNCTION`)."""

_MESSAGE_ID_SCHEMA = (
    f"""CREATE OR REPLACE FUNCTION {MESSAGE_ID_FUNCTION}(body BYTEA) RETURNS TEXT
        LANGUAGE plpgsql IMMUTABLE STRICT AS $$
    BEGIN
        RETURN convert_from(body, 'UTF8')::json ->> 'id';
    EXCEPTION WHEN OTHERS THEN
        RETURN NULL;
    END $$""",
    f"""CREATE INDEX IF NOT EXISTS {MESSAGE_ID_INDEX}
        ON axon_messages (session_id, {MESSAGE_ID_FUNCTION}(body)) WHERE role = 'user'""",
)
"""Created once, when the index is missing (``CREATE INDEX`` locks the table: a store of
before takes it for the upgrade, :func:`~actors.stores.postgres_schema._lock_for_upgrade`,
and builds the index over every user message it holds)."""
