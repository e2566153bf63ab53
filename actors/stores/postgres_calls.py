"""The server-side functions a worker's turn calls, one statement each (issue 24 goal 3).

A claim (:data:`CLAIM_FUNCTION`), a save (:data:`SAVE_FUNCTION`), a last save that also
claims the slot's next turn (:data:`SAVE_NEXT_FUNCTION`) and a person's decision
(:data:`DECIDE_FUNCTION`), with the columns each returns. Each is versioned by its name:
a new version gets a new name, so workers of the version before keep calling their own
while a fleet is mixed. Created on open when missing
(:mod:`actors.stores.postgres_schema`); called by :mod:`actors.stores.postgres` and the
turn queue's modules, which read their rows by these column lists.
"""

from __future__ import annotations

from typing import Final

from actors.stores.validation import HEAD_PREFIX

CLAIMED_COLUMNS: Final = (
    ("turn_id", "TEXT"),
    ("session_id", "TEXT"),
    ("seq", "BIGINT"),
    ("input", "TEXT"),
    ("meta", "BYTEA"),
    ("regenerate", "BOOLEAN"),
    ("status", "TEXT"),
    ("owner", "TEXT"),
    ("epoch", "BIGINT"),
    ("attempts", "INTEGER"),
    ("saved", "BOOLEAN"),
    ("cancel_requested", "BOOLEAN"),
    ("cancel_reason", "TEXT"),
    ("finish_reason", "TEXT"),
    ("error", "TEXT"),
    ("idempotency_key", "TEXT"),
    ("resumes", "INTEGER"),
    ("expires_at", "DOUBLE PRECISION"),
    ("steer_of", "TEXT"),
    ("options", "BYTEA"),
)
"""The columns a turn is read with (the turn queue's ``_COLUMNS``, in this order) and
their types in ``axon_turns``: what :data:`CLAIM_FUNCTION` returns of the turn it starts."""

SUPERSEDE: Final = """UPDATE axon_turns AS w SET status = 'done', finish_reason = 'superseded',
    expires_at = NULL, finished_at = clock_timestamp()"""
"""The waiting turn a later turn of its session supersedes (its ``WHERE`` follows)."""

CLAIM_V4_FUNCTION_NAME: Final = "axon_claim_v4"
CLAIM_FUNCTION_NAME: Final = "axon_claim_v5"
"""The server-side function of a claim's common case (:data:`CLAIM_FUNCTION`); a new
version of it gets a new name (a worker of the version before keeps calling its own:
``axon_claim_v1`` left a decided turn's continuation to the takeover transaction;
``axon_claim_v2``'s look for an expired lease read every running turn of the fleet, see
:data:`CLAIM_FUNCTION`; ``axon_claim_v3`` left no mark of the call that claimed: a retry
after a lost answer could not find its turn, see :data:`RESUMED_TOKEN`; ``axon_claim_v4``
(:data:`CLAIM_V4_FUNCTION`, still created: a process of the version before calls it, and
so does ``axon_save_next_v6``) returned a continuation's session with a running turn's
answer's head unfolded, so its decode failed and the turn read its session again, see
:data:`FOLDED_BODY`)."""

RESUMED_TOKEN: Final = ":resumed"
"""What a continuation's claim appends to its call's token in ``axon_turns.claim_token``
(a started turn's and a takeover's hold the token as it is): a claim whose answer was
lost after its commit is retried, and the retry gives back what the first try took
(:func:`actors.stores.turn_claims.give_back`), a continuation as one again."""

SESSION_COLUMNS: Final = (
    ("s_meta", "BYTEA"),
    ("s_version", "BIGINT"),
    ("m_idx", "INTEGER"),
    ("m_role", "TEXT"),
    ("m_body", "BYTEA"),
)
"""The columns of :func:`load_rows` (a session's row and its messages, one a row), as the
claim's function returns them after a continuation's turn."""

_CLAIM_COLUMNS_OUT = ", ".join(
    f"o_{name} {kind}" for name, kind in (*CLAIMED_COLUMNS, *SESSION_COLUMNS)
)
_STARTED_COLUMNS = ", ".join(f"started.{name}" for name, _ in CLAIMED_COLUMNS)
_RESUMED_COLUMNS = ", ".join(f"resumed.{name}" for name, _ in CLAIMED_COLUMNS)
_NO_TURN = ", ".join(f"NULL::{kind}" for _, kind in CLAIMED_COLUMNS)
_NO_SESSION = ", ".join(f"NULL::{kind}" for _, kind in SESSION_COLUMNS)

CLAIM_V4_FUNCTION: Final = f"""CREATE OR REPLACE FUNCTION {CLAIM_V4_FUNCTION_NAME}(
    p_owner TEXT, p_lease DOUBLE PRECISION, p_channel TEXT, p_token TEXT DEFAULT NULL)
    RETURNS TABLE (o_expired BOOLEAN, o_stored BOOLEAN, o_resumed BOOLEAN, {_CLAIM_COLUMNS_OUT})
    LANGUAGE plpgsql SET enable_sort = off SET search_path FROM CURRENT AS $$
DECLARE
    v_turn TEXT;
    v_resume BOOLEAN;
    v_session TEXT;
    v_now TIMESTAMPTZ := clock_timestamp();
BEGIN
    -- The first lease that expired, in the order the takeover's transaction takes them.
    -- The time is a variable (a parameter of the plan), so the leases' index is entered
    -- at it: `clock_timestamp()` in the condition is volatile, a filter on every running
    -- turn of every worker, read from the oldest lease up.
    SELECT e.turn_id, e.resume_pending, e.session_id INTO v_turn, v_resume, v_session
        FROM axon_turns AS e
        WHERE e.status = 'running' AND e.lease_until < v_now
        ORDER BY e.lease_until LIMIT 1 FOR UPDATE SKIP LOCKED;
    IF FOUND AND NOT v_resume THEN
        -- A worker's lease that ran out is taken over by the client's own transaction
        -- (its takeover and poison paths): say so and start nothing.
        o_expired := true;
        RETURN NEXT;
        RETURN;
    ELSIF FOUND THEN
        -- Decided while it waited (no owner, its lease lapsed on purpose): its
        -- continuation's first run, here, as the takeover's transaction runs it, with
        -- the session the decisions moved, read after the turn in the same call.
        RETURN QUERY WITH resumed AS (
            UPDATE axon_turns AS u SET owner = p_owner, epoch = u.epoch + 1, attempts = 1,
                resume_pending = false, claim_token = p_token || '{RESUMED_TOKEN}',
                lease_until = clock_timestamp() + make_interval(secs => p_lease)
            WHERE u.turn_id = v_turn
            RETURNING u.*
        )
        SELECT false, true, true, {_RESUMED_COLUMNS}, {_NO_SESSION} FROM resumed;
        -- Sorting back on for the session's read (off, the planner reads the messages
        -- in hundreds of milliseconds, not a fraction of one).
        PERFORM set_config('enable_sort', 'on', true);
        RETURN QUERY SELECT NULL::boolean, NULL::boolean, NULL::boolean, {_NO_TURN},
            s.meta, s.version, m.idx, m.role, m.body
        FROM axon_sessions AS s
        LEFT JOIN axon_messages AS m ON m.session_id = s.session_id
        WHERE s.session_id = v_session ORDER BY m.idx;
        RETURN;
    END IF;
    -- The first claimable head, started, and in the same statement the end of a turn of
    -- the session that waits for a decision: superseded (its runner denies what still
    -- waits, as the embedded host does), so no decision resumes it any more.
    RETURN QUERY WITH head AS (
        SELECT t.turn_id FROM axon_turns AS t
        WHERE t.head AND t.status = 'queued' AND NOT t.cancel_requested
          AND NOT EXISTS (SELECT 1 FROM axon_turns AS r
              WHERE r.session_id = t.session_id AND r.status = 'running')
        ORDER BY t.head_seq LIMIT 1 FOR UPDATE SKIP LOCKED
    ), started AS (
        UPDATE axon_turns AS u SET status = 'running', owner = p_owner,
            epoch = u.epoch + 1, attempts = u.attempts + 1, claim_token = p_token,
            lease_until = clock_timestamp() + make_interval(secs => p_lease),
            started_at = coalesce(u.started_at, clock_timestamp())
        WHERE u.turn_id = (SELECT head.turn_id FROM head) AND u.status = 'queued'
        RETURNING u.*
    ), superseded AS ({SUPERSEDE} FROM started AS s
        WHERE w.session_id = s.session_id AND w.status = 'awaiting-input'
        RETURNING pg_notify(p_channel, current_schema() || ':' || w.turn_id)
    )
    SELECT false, EXISTS (
        SELECT 1 FROM axon_sessions AS s WHERE s.session_id = started.session_id
    ), false, {_STARTED_COLUMNS}, {_NO_SESSION} FROM started;
END $$"""
"""A claim's common case in one call (issue 24 goal 3): no lease has expired, so the
first claimable head in line starts (``o_expired`` false; no row: none is claimable);
``o_stored`` says whether its session is stored. The row it claims keeps ``p_token``
(the worker's token of the call) in ``claim_token``: a retry after a lost answer finds
it there. Where a worker's lease has expired it
only says so (``o_expired``), and the client takes the turn over in a transaction of its
own. Where the first expired lease is a decided turn's (issue 21: the decision put it
back with no owner and a lapsed lease, ``resume_pending``), it claims the continuation
itself (``o_resumed``), as the takeover's transaction did (epoch bumped, one attempt,
``resume_pending`` cleared), and returns after the turn's row the session's rows
(:data:`SESSION_COLUMNS`, :func:`load_rows`'s, the turn's columns ``NULL``): the
continuation starts from them. Where that was a thread's transaction of five round trips
after this call (``BEGIN``, the look, the ``UPDATE``, the session's read, ``COMMIT``),
it is this one call sent from the event loop.

The look for an expired lease enters the leases' index at the call's time, a variable
(issue 24 goal 3, ``pg2w``): none expired, it reads no row. ``axon_claim_v2`` compared
``clock_timestamp()``, volatile, so a filter: every claim read every running turn of
every worker (its index entry and its row, from the oldest lease up), so each worker's
turns were read by every other worker's claims. (The heads' check of a running turn of
their session still reads the running turns into a list once a claim, as the planner
likes it on a small table: a per-head probe was planned on the leases' index, which
holds the same rows, and walked them all per head.)

One statement in autocommit where the claim was a transaction of four round trips
(``BEGIN``, the look for expired leases, the head's start, ``COMMIT``), each a wait of
the store's thread; the function's plans are cached per connection as a prepared
statement's are (a simple query of several statements is planned at every call: measured
dearer on the server), and its ``SET enable_sort = off`` is what the look's ``SET LOCAL``
did for the head's start: the heads walked in line, whatever the table's statistics."""

_HEAD_HEX = HEAD_PREFIX.hex()
FOLDED_BODY: Final = f"""CASE WHEN substring(m.body FROM 1 FOR {len(HEAD_PREFIX)})
        <> '\\x{_HEAD_HEX}'::bytea THEN m.body
    ELSE coalesce((SELECT '\\x7b22636f6e74656e74223a5b'::bytea
            || string_agg(g.body, '\\x2c'::bytea ORDER BY g.first) || '\\x5d2c'::bytea
            || substring(m.body FROM position('\\x7d2c'::bytea IN m.body) + 2)
        FROM axon_message_segments AS g WHERE g.session_id = m.session_id AND g.idx = m.idx),
        m.body) END"""
"""A message's body as the readers decode it (``m`` its row): a whole row's as it is; a
head's (:data:`~actors.stores.validation.HEAD_PREFIX`, a running turn's answer) folded
with its segments, in the same statement (one snapshot), as
:func:`~actors.stores.validation.fold_grown` folds them: ``{"content":[`` and the
segments joined by commas, ``],`` and the head's fields. A head without segments is
read as it is (its decode then fails: never a message without its parts). The readers'
statements (:func:`~actors.stores.postgres_rows.load_rows`, the last turn's) and the
claim's function's read of a continuation's session (:data:`CLAIM_FUNCTION`) use it."""

_V4_SESSION_READ = "s.meta, s.version, m.idx, m.role, m.body\n"


def _claim_v5(v4: str) -> str:
    """:data:`CLAIM_V4_FUNCTION`'s text with its name and its session's read folded."""
    text = v4.replace(CLAIM_V4_FUNCTION_NAME + "(", CLAIM_FUNCTION_NAME + "(", 1)
    assert text.count(_V4_SESSION_READ) == 1, "the continuation's read of its session"
    return text.replace(_V4_SESSION_READ, f"s.meta, s.version, m.idx, m.role, {FOLDED_BODY}\n", 1)


CLAIM_FUNCTION: Final = _claim_v5(CLAIM_V4_FUNCTION)
""":data:`CLAIM_V4_FUNCTION` whose continuation's session is read with each running
turn's answer folded (:data:`FOLDED_BODY`), as :func:`~actors.stores.postgres_rows.load_rows`
reads it: a session that holds a head (a turn killed mid-answer left it, and a later
turn waited for a person) is the claim's, where v4's rows failed their decode there
and the continuation read its session again (one more statement, a thread's hop)."""

SAVE_V5_FUNCTION_NAME: Final = "axon_save_v5"
"""The server-side function of a save without a guard (:data:`SAVE_FUNCTION`); a new
version of it gets a new name (a process of the version before keeps calling its own:
``axon_save_v1`` had no suspension, ``p_suspend`` and ``p_expires``; ``axon_save_v2`` woke
the workers at every turn's end, v3 only when the session has a turn queued behind it;
v3 still woke them at every suspension, planned its hole check at every call and wrote
the ``saved`` mark of a turn already marked (an ``UPDATE`` of no row); v4 wakes them at a
suspension as at an end, and does neither of the others: issue 24 goal 3, ``apw``, ``pg3``;
v4 wrote rows from ``p_start`` on only, where v5 also writes rows below it over their
places: a save's kept rows, :class:`~runtime.store.Store`, branch ``steprows``)."""

SAVE_V5_FUNCTION: Final = f"""CREATE OR REPLACE FUNCTION {SAVE_V5_FUNCTION_NAME}(
    p_session TEXT, p_start INTEGER, p_expected BIGINT, p_meta BYTEA,
    p_idx INTEGER[], p_roles TEXT[], p_bodies BYTEA[],
    p_turn TEXT, p_owner TEXT, p_epoch BIGINT, p_mark BOOLEAN, p_ends TEXT, p_channel TEXT,
    p_suspend BOOLEAN, p_expires DOUBLE PRECISION,
    OUT o_status TEXT, OUT o_version BIGINT, OUT o_steers INTEGER,
    OUT o_owner TEXT, OUT o_epoch BIGINT, OUT o_turn_status TEXT)
    LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    s_meta BYTEA;
    s_version BIGINT;
    t_saved BOOLEAN;
BEGIN
    -- Every refusal returns before anything is written: the call is its own transaction.
    -- The fence: the turn's row locked (a takeover's epoch bump waits for this save, or
    -- this save sees it), strongly when this save writes the row (its `saved` mark, its
    -- end, its suspension), as the transaction's UPDATE did.
    IF p_turn IS NOT NULL THEN
        IF p_mark OR p_ends IS NOT NULL OR p_suspend THEN
            SELECT owner, epoch, status, steers, saved
            INTO o_owner, o_epoch, o_turn_status, o_steers, t_saved
            FROM axon_turns WHERE turn_id = p_turn FOR NO KEY UPDATE;
        ELSE
            SELECT owner, epoch, status, steers INTO o_owner, o_epoch, o_turn_status, o_steers
            FROM axon_turns WHERE turn_id = p_turn FOR SHARE;
        END IF;
        IF o_owner IS DISTINCT FROM p_owner OR o_epoch IS DISTINCT FROM p_epoch
                OR o_turn_status IS DISTINCT FROM 'running' THEN
            o_status := 'lost';
            RETURN;
        END IF;
    END IF;
    SELECT meta, version INTO s_meta, s_version FROM axon_sessions
    WHERE session_id = p_session FOR UPDATE;
    IF p_expected IS NOT NULL AND p_expected <> coalesce(s_version, 0) THEN
        o_status := 'conflict';
        o_version := coalesce(s_version, 0);
        RETURN;
    END IF;
    IF s_version IS NULL THEN
        IF p_start > 0 THEN
            o_status := 'hole';
            o_version := 0;
            RETURN;
        END IF;
        INSERT INTO axon_sessions (session_id, meta, update_seq, version)
        VALUES (p_session, coalesce(p_meta, '\\x7b7d'::bytea), nextval('axon_update_seq'),
                nextval('axon_versions'))
        ON CONFLICT (session_id) DO NOTHING RETURNING version INTO o_version;
        IF o_version IS NULL THEN  -- a concurrent creator committed since the look
            SELECT version INTO o_version FROM axon_sessions WHERE session_id = p_session;
            o_status := 'created';
            RETURN;
        END IF;
    ELSE
        -- No hole: a save may append (start = the message count), not beyond. Two IFs:
        -- `p_start > 0` alone is evaluated without a query (a save from 0, a worker's
        -- every save of a session its turn created, runs none), and the look's plan is
        -- cached; as one condition it was planned at every call (folded to false for a
        -- save from 0, its custom plan always looked cheaper than the generic one).
        IF p_start > 0 THEN
            IF NOT EXISTS (SELECT 1 FROM axon_messages
                    WHERE session_id = p_session AND idx = p_start - 1) THEN
                SELECT coalesce(max(idx) + 1, 0) INTO o_version FROM axon_messages
                WHERE session_id = p_session AND idx < p_start;
                o_status := 'hole';
                RETURN;
            END IF;
        END IF;
        -- The meta merged as dict.update does: the patch's keys over the stored ones, a
        -- stored key in its place, a new one after them. Merged as `json`, whose values
        -- keep their text: `jsonb` would sort the keys and print 1e16 as an integer.
        -- A stored key holding an escaped NUL cannot be text: the client merges it.
        IF p_meta IS NOT NULL AND p_meta <> s_meta THEN
            IF position('\\x5c7530303030'::bytea IN s_meta) > 0 THEN
                o_status := 'meta';
                RETURN;
            END IF;
            SELECT convert_to('{{' || coalesce(string_agg(to_json(m.key)::text || ':'
                    || m.value::text, ',' ORDER BY m.ord), '') || '}}', 'UTF8')
            INTO s_meta
            FROM (SELECT s.key, coalesce(p.value, s.value) AS value, s.ord
                  FROM json_each(convert_from(s_meta, 'UTF8')::json) WITH ORDINALITY
                      AS s(key, value, ord)
                  LEFT JOIN json_each(convert_from(p_meta, 'UTF8')::json) AS p(key, value)
                      ON p.key = s.key
                  UNION ALL
                  SELECT p.key, p.value, 1000000000 + p.ord
                  FROM json_each(convert_from(p_meta, 'UTF8')::json) WITH ORDINALITY
                      AS p(key, value, ord)
                  WHERE NOT EXISTS (SELECT 1 FROM json_each(convert_from(s_meta, 'UTF8')::json)
                      AS q(key, value) WHERE q.key = p.key)) AS m;
        END IF;
        DELETE FROM axon_messages WHERE session_id = p_session AND idx >= p_start;
        -- Rows below p_start (first in p_idx) go over their places: a save whose kept
        -- rows (stored as they are, not sent) lie between them and p_start. Evaluated
        -- without a query for a save of none (p_idx[1] is p_start, or NULL).
        IF p_idx[1] < p_start THEN
            DELETE FROM axon_messages
            WHERE session_id = p_session AND idx = ANY(p_idx) AND idx < p_start;
        END IF;
        UPDATE axon_sessions SET meta = s_meta, updated_at = now(),
            update_seq = nextval('axon_update_seq'), version = nextval('axon_versions')
        WHERE session_id = p_session RETURNING version INTO o_version;
    END IF;
    INSERT INTO axon_messages (session_id, idx, role, body)
    SELECT p_session, u.idx, u.role, u.body
    FROM unnest(p_idx, p_roles, p_bodies) AS u(idx, role, body);
    IF p_suspend OR p_ends IS NOT NULL THEN
        IF p_suspend THEN  -- the turn waits for a person: no owner, no lease
            UPDATE axon_turns SET status = 'awaiting-input', owner = NULL,
                lease_until = NULL, finish_reason = 'awaiting-input',
                expires_at = p_expires, saved = true
            WHERE turn_id = p_turn;
        ELSE  -- the turn ends with this save: its row `done`
            UPDATE axon_turns SET status = 'done', finish_reason = p_ends, error = NULL,
                lease_until = NULL, finished_at = clock_timestamp(), saved = true
            WHERE turn_id = p_turn;
        END IF;
        -- Either frees the session, nothing else: the workers are woken only for a
        -- turn of the session queued behind this one (claimable once this commits;
        -- the worker whose slot this frees claims again by itself). Every worker
        -- listens, and a wake-up for nothing cost each a signal, its LISTEN backend's
        -- read and a claim. Under the session's lock (a submit's insert takes it, after
        -- its row locks, as this does): a submit that inserted first is seen here; one
        -- after waits for this commit and wakes the workers itself.
        PERFORM pg_advisory_xact_lock(
            hashtextextended('axon_turns:' || current_schema() || ':' || p_session, 0));
        IF EXISTS (SELECT 1 FROM axon_turns
                WHERE session_id >= p_session AND session_id <= p_session
                  AND status = 'queued'
                ORDER BY session_id, seq LIMIT 1) THEN
            PERFORM pg_notify(p_channel, current_schema() || ':' || p_turn);
        END IF;
    ELSIF p_mark AND NOT t_saved THEN  -- read under the fence's lock: an UPDATE of no row
        -- cost its executor start (the table's ten indexes opened) at every later save
        UPDATE axon_turns SET saved = true WHERE turn_id = p_turn AND NOT saved;
    END IF;
    o_status := 'ok';
END $$"""
"""A save without a guard in one call (issue 24 goal 3): the fence's check of the turn's
row (``p_turn`` ``NULL``: an unfenced save), the session's lock, the version check, the
hole check, the writes (the session row, meta merged, the messages from ``p_start`` on)
and, for a worker's last save, the turn's end (``p_ends``), or for the step that makes
it wait for a person, its suspension (``p_suspend``: ``awaiting-input``, no owner, no
lease, until ``p_expires``; as ``turn_sql._SUSPEND``), either waking the workers only
when a turn of the session is queued behind it, or its first save's ``saved`` mark
(``p_mark``). ``o_status`` says how it went: ``ok`` (the new
version in ``o_version``, the turn's ``steers`` in ``o_steers``); or, with nothing
written, ``lost`` (the turn's row as found in ``o_owner``, ``o_epoch``,
``o_turn_status``), ``conflict`` (the session's version in ``o_version``), ``created``
(another writer created the session meanwhile: its version), ``hole`` (``p_start`` is
past the end: the message count), ``meta`` (the stored meta cannot be merged in SQL:
the client saves in its transaction instead).

One statement in autocommit where a save was a transaction of four or five round trips
(``BEGIN``, the fence and lock, the write, the end, ``COMMIT``), each a wait of the
store's thread; PL/pgSQL keeps the plans of its statements per connection."""


SAVE_V6_FUNCTION_NAME: Final = "axon_save_v6"
"""The server-side function of a save without a guard of the version before
(:data:`SAVE_V6_FUNCTION`; :data:`SAVE_FUNCTION_NAME` now). ``axon_save_v5``
(:data:`SAVE_V5_FUNCTION`, still created: a process of the version before calls it, and
so do :data:`SAVE_NEXT_V6_FUNCTION` and :data:`DECIDE_FUNCTION`) had no
``p_absent_mark``: a first save's deletion mark was read in a call of its own just
before it, and a create and delete by another process between the two was missed
(branch ``delsave``)."""

_V5_CREATE = """        INSERT INTO axon_sessions (session_id, meta, update_seq, version)
        VALUES (p_session, coalesce(p_meta, '\\x7b7d'::bytea), nextval('axon_update_seq'),
                nextval('axon_versions'))
        ON CONFLICT (session_id) DO NOTHING RETURNING version INTO o_version;
"""
_V6_CREATE = (
    """        -- With p_absent_mark (the deletion mark the turn read before it began), the
        -- session's mark is read after the insert: another process's create and delete
        -- that committed before it shows there (read before, it could fall between the
        -- two). Moved above: created and deleted since, the insert is undone (the
        -- block's savepoint, entered only then) and nothing written: 'deleted'.
        IF p_absent_mark IS NULL THEN
"""
    + _V5_CREATE.replace("        ", "            ", 1).replace("\n        ", "\n            ")
    + """        ELSE
            BEGIN
"""
    + _V5_CREATE.replace("        ", "                ", 1).replace(
        "\n        ", "\n                "
    )
    + """                IF o_version IS NOT NULL AND coalesce((SELECT deletions FROM axon_deletions
                        WHERE session_id = p_session), 0) > p_absent_mark THEN
                    RAISE EXCEPTION USING ERRCODE = 'AXDEL';
                END IF;
            EXCEPTION WHEN SQLSTATE 'AXDEL' THEN
                o_status := 'deleted';
                o_version := (SELECT deletions FROM axon_deletions
                    WHERE session_id = p_session);
                RETURN;
            END;
        END IF;
"""
)


def _save_v6(v5: str) -> str:
    """:data:`SAVE_V5_FUNCTION`'s text with its name, ``p_absent_mark`` and the check."""
    text = v5.replace(SAVE_V5_FUNCTION_NAME + "(", SAVE_V6_FUNCTION_NAME + "(", 1)
    head = "p_suspend BOOLEAN, p_expires DOUBLE PRECISION,\n"
    assert text.count(head) == 1 and text.count(_V5_CREATE) == 1
    text = text.replace(head, head[:-1] + " p_absent_mark BIGINT DEFAULT NULL,\n", 1)
    return text.replace(_V5_CREATE, _V6_CREATE, 1)


SAVE_V6_FUNCTION: Final = _save_v6(SAVE_V5_FUNCTION)
""":data:`SAVE_V5_FUNCTION` with ``p_absent_mark``: a save that creates the session
checks its deletion mark under the insert (``o_status`` ``deleted``, its mark in
``o_version``, nothing written, when it is above; :func:`runtime.store.checks_absent_mark`)."""


def drop_segments_sql(session: str) -> str:
    """The ``DELETE`` of session ``session``'s (a parameter's or variable's name) segments
    whose rows are no heads: a whole save's garbage ("Grown messages" in
    :mod:`actors.stores.postgres`), which no reader folds."""
    return f"""DELETE FROM axon_message_segments AS g WHERE g.session_id = {session}
    AND NOT EXISTS (SELECT 1 FROM axon_messages AS m
        WHERE m.session_id = g.session_id AND m.idx = g.idx
          AND substring(m.body FROM 1 FOR {len(HEAD_PREFIX)}) = '\\x{_HEAD_HEX}'::bytea)"""


SAVE_V7_FUNCTION_NAME: Final = "axon_save_v7"
"""The server-side function of a save without a guard of the version before
(:data:`SAVE_V7_FUNCTION`, still created: its processes call it). ``axon_save_v6``
(:data:`SAVE_V6_FUNCTION`, still created too) wrote no segment: a running turn's grown
save (its answer's head and new parts, "Grown messages" in :mod:`actors.stores.postgres`)
was a transaction of five round trips, and the drop of the segments after the turn's
last save a statement of its own (branch ``appendpg``)."""

_V6_PARAMS = "p_absent_mark BIGINT DEFAULT NULL,\n"
_V6_INSERT = "    FROM unnest(p_idx, p_roles, p_bodies) AS u(idx, role, body);\n"
_V7_SEGMENTS = f"""    -- A grown save's segments ("Grown messages", actors.stores.postgres): those
    -- of the rows that became heads anew go (p_fresh: left by a save of another version
    -- or process), then the new parts' segments are written (over any at their keys).
    -- A save with no head, of a session whose rows had some (p_drop: the turn's last
    -- save wrote its answer whole), drops the segments no head holds: garbage. Under
    -- the session's lock, in the save's commit; each evaluated without a query when
    -- its parameter is NULL (every save of a short answer).
    IF p_fresh IS NOT NULL THEN
        DELETE FROM axon_message_segments
        WHERE session_id = p_session AND idx = ANY(p_fresh);
    END IF;
    IF p_seg_idx IS NOT NULL THEN
        INSERT INTO axon_message_segments (session_id, idx, first, body)
        SELECT p_session, g.idx, g.first, g.body
        FROM unnest(p_seg_idx, p_seg_first, p_seg_bodies) AS g(idx, first, body)
        ON CONFLICT (session_id, idx, first) DO UPDATE SET body = excluded.body;
    END IF;
    IF p_drop THEN
        {drop_segments_sql("p_session").replace(chr(10), chr(10) + "        ")};
    END IF;
"""


def _save_v7(v6: str) -> str:
    """:data:`SAVE_V6_FUNCTION`'s text with its name, the segments' parameters and their
    writes after the messages' insert."""
    text = v6.replace(SAVE_V6_FUNCTION_NAME + "(", SAVE_V7_FUNCTION_NAME + "(", 1)
    assert text.count(_V6_PARAMS) == 1 and text.count(_V6_INSERT) == 1
    text = text.replace(
        _V6_PARAMS,
        _V6_PARAMS[:-1] + " p_fresh INTEGER[] DEFAULT NULL, p_seg_idx INTEGER[] DEFAULT NULL,\n"
        "    p_seg_first INTEGER[] DEFAULT NULL, p_seg_bodies BYTEA[] DEFAULT NULL,\n"
        "    p_drop BOOLEAN DEFAULT false,\n",
        1,
    )
    return text.replace(_V6_INSERT, _V6_INSERT + _V7_SEGMENTS, 1)


SAVE_V7_FUNCTION: Final = _save_v7(SAVE_V6_FUNCTION)
""":data:`SAVE_V6_FUNCTION` with a grown save's segments: ``p_fresh`` (the heads whose
old segments go), ``p_seg_idx``/``p_seg_first``/``p_seg_bodies`` (the new segments: the
row's index, the first part each holds, its parts' JSON), ``p_drop`` (a save without
heads drops the segments no head holds), all written in the call's commit, after the
messages, only when it says ``ok``: a running turn's step save of a long answer is one
call as any other save, and so is its last save with the drop."""

SAVE_FUNCTION_NAME: Final = "axon_save_v8"
"""The server-side function of a save without a guard (:data:`SAVE_FUNCTION`), the one
the store calls. ``axon_save_v7`` (:data:`SAVE_V7_FUNCTION`) dropped, at ``p_drop``, the
segments of rows that are no heads only: a head a killed turn left (its last save never
came) kept its segments for good, and the store sent ``p_drop`` only for a session its
own saves had segmented, so a whole save by another process (a takeover's, a worker of
an older version) left the segments it wrote over until the session's delete (branch
``segleft``)."""


def compact_segments_sql(session: str) -> str:
    """The statement that deletes every segment of session ``session`` (a parameter's or
    variable's name) and writes each head they belonged to whole, folded from them: a
    save that writes no head (:data:`SAVE_FUNCTION`'s ``p_drop``), under the session's
    lock, in its commit. One statement: its ``DELETE`` and its ``UPDATE`` read one
    snapshot, so the fold (:data:`FOLDED_BODY`, every read's: it writes what a load of
    the session read before) still sees the segments the ``DELETE`` takes."""
    return f"""WITH gone AS (DELETE FROM axon_message_segments
        WHERE session_id = {session} RETURNING idx)
    UPDATE axon_messages AS m SET body = {FOLDED_BODY}
    WHERE m.session_id = {session} AND m.idx IN (SELECT idx FROM gone)
      AND substring(m.body FROM 1 FOR {len(HEAD_PREFIX)}) = '\\x{_HEAD_HEX}'::bytea"""


_V7_DROP = f"""    IF p_drop THEN
        {drop_segments_sql("p_session").replace(chr(10), chr(10) + "        ")};
    END IF;
"""
_V8_DROP = f"""    IF p_drop AND s_segmented THEN
        -- A save with no head (p_drop), of a session that holds segments: the heads a
        -- killed turn left are written whole, folded, and every segment goes (segleft).
        {compact_segments_sql("p_session").replace(chr(10), chr(10) + "        ")};
    END IF;
"""
_V7_LOCK = """    SELECT meta, version INTO s_meta, s_version FROM axon_sessions
    WHERE session_id = p_session FOR UPDATE;
"""
_V8_LOCK = """    SELECT meta, version, EXISTS (SELECT 1 FROM axon_message_segments AS g
            WHERE g.session_id = p_session)
    INTO s_meta, s_version, s_segmented FROM axon_sessions
    WHERE session_id = p_session FOR UPDATE;
"""
_V7_DECLARE = "    s_version BIGINT;\n"


def _save_v8(v7: str) -> str:
    """:data:`SAVE_V7_FUNCTION`'s text with its name and ``p_drop`` folding the heads
    left before it deletes the session's segments."""
    text = v7.replace(SAVE_V7_FUNCTION_NAME + "(", SAVE_FUNCTION_NAME + "(", 1)
    for part in (_V7_DROP, _V7_LOCK, _V7_DECLARE):
        assert text.count(part) == 1, part
    text = text.replace(_V7_DECLARE, _V7_DECLARE + "    s_segmented BOOLEAN;\n", 1)
    text = text.replace(_V7_LOCK, _V8_LOCK, 1)
    return text.replace(_V7_DROP, _V8_DROP, 1)


SAVE_FUNCTION: Final = _save_v8(SAVE_V7_FUNCTION)
""":data:`SAVE_V7_FUNCTION` whose ``p_drop`` (the store sends it with every save that
writes no head) folds every head its session holds into a whole row and deletes all its
segments (:func:`compact_segments_sql`), in the call's commit, when the session holds
any: the lock of the session's row reads that too (an index probe in a statement every
save runs, where a statement of its own would be one more a turn). A killed turn's
answer is so written whole by the session's next save, and the segments a whole save
of another process left beside its rows go."""


SAVE_NEXT_V6_FUNCTION_NAME: Final = "axon_save_next_v6"
"""The server-side function of a turn's last save that also claims the next turn for the
slot the turn frees (:data:`SAVE_NEXT_FUNCTION`); a new version of it gets a new name
(``axon_save_next_v1`` called ``axon_claim_v2``, ``axon_save_next_v2`` ``axon_claim_v3``
and ``axon_save_v3``, with no token; ``axon_save_next_v4`` ended the turn only, where v5
also suspends it: ``p_suspend``, the step that waits for a person, its slot freed too;
v6 calls ``axon_save_v5``, which writes a save's rows below ``p_start``)."""

_SAVE_OUT = (
    ("o_status", "TEXT"),
    ("o_version", "BIGINT"),
    ("o_steers", "INTEGER"),
    ("o_owner", "TEXT"),
    ("o_epoch", "BIGINT"),
    ("o_turn_status", "TEXT"),
)
SAVE_NEXT_KINDS: Final = tuple(kind for _, kind in _SAVE_OUT)
"""The types of :data:`SAVE_NEXT_FUNCTION`'s first columns (the save's); the claim
function's columns follow, as :data:`CLAIM_FUNCTION` returns them."""
_SAVE_NEXT_OUT = ", ".join(f"{name} {kind}" for name, kind in _SAVE_OUT)
_SAVE_NEXT_CLAIM_OUT = ", ".join(
    f"n_{name} {kind}"
    for name, kind in (
        ("expired", "BOOLEAN"),
        ("stored", "BOOLEAN"),
        ("resumed", "BOOLEAN"),
        *CLAIMED_COLUMNS,
        *SESSION_COLUMNS,
    )
)
_NO_CLAIM = ", ".join(["NULL::boolean"] * 3 + [_NO_TURN, _NO_SESSION])

SAVE_NEXT_V6_FUNCTION: Final = f"""CREATE OR REPLACE FUNCTION {SAVE_NEXT_V6_FUNCTION_NAME}(
    p_session TEXT, p_start INTEGER, p_expected BIGINT, p_meta BYTEA,
    p_idx INTEGER[], p_roles TEXT[], p_bodies BYTEA[],
    p_turn TEXT, p_owner TEXT, p_epoch BIGINT, p_ends TEXT, p_channel TEXT,
    p_lease DOUBLE PRECISION, p_token TEXT DEFAULT NULL,
    p_suspend BOOLEAN DEFAULT false, p_expires DOUBLE PRECISION DEFAULT NULL)
    RETURNS TABLE ({_SAVE_NEXT_OUT}, {_SAVE_NEXT_CLAIM_OUT})
    LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
#variable_conflict use_variable
DECLARE
    v_claimed BOOLEAN := false;
    v_save RECORD;
BEGIN
    -- The save, fenced, its turn's row locked for writing (the mark asked for: the lock
    -- a last save takes), nothing ended yet: every refusal returns here, before anything
    -- is written and before anything is claimed. Called as an expression, its one row a
    -- record: PL/pgSQL evaluates it without a query of its own (`SELECT ... FROM` the
    -- function was one more executor start-up, a function scan and its tuplestore).
    v_save := {SAVE_V5_FUNCTION_NAME}(p_session, p_start, p_expected, p_meta, p_idx, p_roles,
        p_bodies, p_turn, p_owner, p_epoch, true, NULL, p_channel, false, NULL);
    o_status := v_save.o_status;
    o_version := v_save.o_version;
    o_steers := v_save.o_steers;
    o_owner := v_save.o_owner;
    o_epoch := v_save.o_epoch;
    o_turn_status := v_save.o_turn_status;
    IF o_status <> 'ok' THEN
        RETURN QUERY SELECT o_status, o_version, o_steers, o_owner, o_epoch, o_turn_status,
            {_NO_CLAIM};
        RETURN;
    END IF;
    -- The turn's end, or its suspension for a person, as the save function writes them.
    IF p_suspend THEN
        UPDATE axon_turns SET status = 'awaiting-input', owner = NULL,
            lease_until = NULL, finish_reason = 'awaiting-input',
            expires_at = p_expires, saved = true
        WHERE turn_id = p_turn;
    ELSE
        UPDATE axon_turns SET status = 'done', finish_reason = p_ends, error = NULL,
            lease_until = NULL, finished_at = clock_timestamp(), saved = true
        WHERE turn_id = p_turn;
    END IF;
    -- The claim for the slot the end frees, as a claim after the commit makes it (its
    -- function: an expired lease first, said and not taken; a decided turn's
    -- continuation; the first claimable head, this session's next turn included). A
    -- concurrent claim of the same session (the unique index) undoes the claim alone:
    -- the save stands, nothing is claimed (its rows are only returned once it succeeded:
    -- the claim function's result is whole before a row of it is read).
    BEGIN
        RETURN QUERY SELECT o_status, o_version, o_steers, o_owner, o_epoch, o_turn_status,
            c.* FROM {CLAIM_V4_FUNCTION_NAME}(p_owner, p_lease, p_channel, p_token) AS c;
        v_claimed := FOUND;
    EXCEPTION WHEN unique_violation THEN
        v_claimed := false;
    END;
    IF NOT v_claimed THEN
        RETURN QUERY SELECT o_status, o_version, o_steers, o_owner, o_epoch, o_turn_status,
            {_NO_CLAIM};
    END IF;
    -- The wake-up, as the save function's: under the session's lock, only for a turn of
    -- the session queued behind this one and claimable (the claim above did not start
    -- one of the session: then that turn's end wakes the workers).
    PERFORM pg_advisory_xact_lock(
        hashtextextended('axon_turns:' || current_schema() || ':' || p_session, 0));
    IF EXISTS (SELECT 1 FROM axon_turns
            WHERE session_id >= p_session AND session_id <= p_session
              AND status = 'queued'
            ORDER BY session_id, seq LIMIT 1)
       AND NOT EXISTS (SELECT 1 FROM axon_turns
            WHERE session_id = p_session AND status = 'running') THEN
        PERFORM pg_notify(p_channel, current_schema() || ':' || p_turn);
    END IF;
END $$"""
"""A worker turn's last save and the claim of the next turn in one call (issue 24 goal
3): :data:`SAVE_FUNCTION`'s fenced save (its refusals return before anything is written
or claimed, ``o_status`` as it says), the turn's end ``done`` with ``p_ends`` (or with
``p_suspend`` its suspension, ``awaiting-input`` until ``p_expires``), then
:data:`CLAIM_FUNCTION` for ``p_owner`` with a lease of ``p_lease`` seconds, its columns
after the save's (``n_``; ``NULL`` when it claimed nothing), then the wake-up of the
workers when a claimable turn of the session is queued behind. One statement where the
last save and the claim for the slot it frees were two calls, the second only sent once
the first's answer came back.

A database created by a version before it gains it on open; it calls the save's and the
claim's functions, which workers of the version before call themselves: a mixed fleet
claims and saves by the same statements."""

SAVE_NEXT_V7_FUNCTION_NAME: Final = "axon_save_next_v7"
"""The function of a last save that claims the next turn too of the version before
(:data:`SAVE_NEXT_V7_FUNCTION`, still created: it calls ``axon_save_v7``);
``axon_save_next_v6`` (:data:`SAVE_NEXT_V6_FUNCTION`,
still created for the processes of the version before) called ``axon_save_v5`` and
``axon_claim_v4``: the segments a turn's answer left were dropped by a statement of
their own after it, and a continuation's session came with its heads unfolded."""

_V6_NEXT_PARAMS = "p_suspend BOOLEAN DEFAULT false, p_expires DOUBLE PRECISION DEFAULT NULL)"
_V6_NEXT_SAVE = "p_bodies, p_turn, p_owner, p_epoch, true, NULL, p_channel, false, NULL);"


def _save_next_v7(v6: str) -> str:
    """:data:`SAVE_NEXT_V6_FUNCTION`'s text with its name, the segments' parameters and
    ``p_drop``, and the calls of :data:`SAVE_FUNCTION` (no absent mark: a last save's
    session is stored) and :data:`CLAIM_FUNCTION`."""
    text = v6.replace(SAVE_NEXT_V6_FUNCTION_NAME + "(", SAVE_NEXT_V7_FUNCTION_NAME + "(", 1)
    claim = f"FROM {CLAIM_V4_FUNCTION_NAME}("
    save = f"v_save := {SAVE_V5_FUNCTION_NAME}("
    for part in (_V6_NEXT_PARAMS, _V6_NEXT_SAVE, claim, save):
        assert text.count(part) == 1, part
    segments = (
        ",\n    p_fresh INTEGER[] DEFAULT NULL, p_seg_idx INTEGER[] DEFAULT NULL,"
        "\n    p_seg_first INTEGER[] DEFAULT NULL, p_seg_bodies BYTEA[] DEFAULT NULL,"
        "\n    p_drop BOOLEAN DEFAULT false)"
    )
    text = text.replace(_V6_NEXT_PARAMS, _V6_NEXT_PARAMS[:-1] + segments)
    text = text.replace(
        _V6_NEXT_SAVE,
        _V6_NEXT_SAVE[:-2]
        + ",\n        NULL, p_fresh, p_seg_idx, p_seg_first, p_seg_bodies, p_drop);",
    )
    text = text.replace(claim, f"FROM {CLAIM_FUNCTION_NAME}(")
    return text.replace(save, f"v_save := {SAVE_V7_FUNCTION_NAME}(")


SAVE_NEXT_V7_FUNCTION: Final = _save_next_v7(SAVE_NEXT_V6_FUNCTION)
""":data:`SAVE_NEXT_V6_FUNCTION` calling the save (with its segments: the
step that waits for a person may save a long answer's head and new parts; and
``p_drop``: the segments the turn's answer left go in a last save's commit) and claim
(a continuation's session folded) functions."""

SAVE_NEXT_FUNCTION_NAME: Final = "axon_save_next_v8"
"""The function of a last save that claims the next turn too, the one the store calls
(:data:`SAVE_NEXT_FUNCTION`)."""


def _save_next_v8(v7: str) -> str:
    """:data:`SAVE_NEXT_V7_FUNCTION`'s text with its name and its call of
    :data:`SAVE_FUNCTION`."""
    save = f"v_save := {SAVE_V7_FUNCTION_NAME}("
    text = v7.replace(SAVE_NEXT_V7_FUNCTION_NAME + "(", SAVE_NEXT_FUNCTION_NAME + "(", 1)
    assert text.count(save) == 1, save
    return text.replace(save, f"v_save := {SAVE_FUNCTION_NAME}(")


SAVE_NEXT_FUNCTION: Final = _save_next_v8(SAVE_NEXT_V7_FUNCTION)
""":data:`SAVE_NEXT_V7_FUNCTION` calling this version's save (its ``p_drop`` folds the
heads a killed turn left: a turn's last save sends it always)."""

STATUS_COLUMNS: Final = (
    "turn_id",
    "session_id",
    "seq",
    "status",
    "owner",
    "epoch",
    "attempts",
    "saved",
    "cancel_requested",
    "cancel_reason",
    "finish_reason",
    "error",
    "resumes",
    "expires_at",
)
"""What a turn's status read selects (the turn queue's ``_STATUS_COLUMNS``): never
``input`` or ``meta``, which may be megabytes."""
STATUS_KINDS: Final = tuple(dict(CLAIMED_COLUMNS)[name] for name in STATUS_COLUMNS)

DECIDE_FUNCTION_NAME: Final = "axon_decide_v4"
"""The server-side function of a decision's save (:data:`DECIDE_FUNCTION`); a new version
of it gets a new name (``axon_decide_v1`` called ``axon_save_v3``, v2 ``axon_save_v4``;
v4 takes the call's deadline)."""

_DECIDE_OUT = ", ".join(
    f"OUT o_{name} {kind}" for name, kind in zip(STATUS_COLUMNS, STATUS_KINDS, strict=True)
)
_DECIDE_SELECT = ", ".join(f"t.{name}" for name in STATUS_COLUMNS)
_DECIDE_INTO = ", ".join(f"o_{name}" for name in STATUS_COLUMNS)

DECIDE_FUNCTION: Final = f"""CREATE OR REPLACE FUNCTION {DECIDE_FUNCTION_NAME}(
    p_turn TEXT, p_complete BOOLEAN, p_session TEXT, p_start INTEGER, p_expected BIGINT,
    p_meta BYTEA, p_idx INTEGER[], p_roles TEXT[], p_bodies BYTEA[], p_channel TEXT,
    p_deadline DOUBLE PRECISION,
    OUT o_result TEXT, OUT o_version BIGINT, {_DECIDE_OUT})
    LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    -- The waiting turn's row locked first (the order every save locks the turn's row,
    -- then the session's). A second decision waits here for the first one's commit,
    -- then reads the row as the first left it.
    SELECT {_DECIDE_SELECT} INTO {_DECIDE_INTO}
    FROM axon_turns AS t WHERE t.turn_id = p_turn FOR UPDATE;
    IF NOT FOUND OR o_session_id IS DISTINCT FROM p_session
            OR o_status IS DISTINCT FROM 'awaiting-input' THEN
        o_result := 'refused';  -- the row as found (or none) says why; nothing written
        RETURN;
    END IF;
    -- The call's wait expired by the database's clock (the one every worker expires
    -- waits by), though no worker has noticed yet: refused, nothing written; the turn
    -- stays waiting, past its deadline, for the next worker's look to deny it.
    IF p_deadline IS NOT NULL
            AND p_deadline <= extract(epoch FROM clock_timestamp())::float8 THEN
        o_result := 'expired';
        RETURN;
    END IF;
    -- The decision's save, unfenced (not the turn's own write), version-checked: its
    -- refusals (a conflict: a concurrent decision saved first) write nothing.
    SELECT s.o_status, s.o_version INTO o_result, o_version
    FROM {SAVE_V5_FUNCTION_NAME}(p_session, p_start, p_expected, p_meta, p_idx, p_roles,
        p_bodies, NULL, NULL, NULL, false, NULL, p_channel, false, NULL) AS s;
    IF o_result <> 'ok' OR NOT p_complete THEN
        RETURN;
    END IF;
    -- The last call decided: the turn goes back to be claimed (its continuation), no
    -- owner, its lease lapsed, the workers woken at the commit. Another running turn
    -- of the session (the unique index) fails the whole call: nothing is written.
    UPDATE axon_turns AS t SET status = 'running', owner = NULL,
        lease_until = clock_timestamp() - interval '1 second',
        resume_pending = true, resumes = t.resumes + 1, expires_at = NULL,
        finish_reason = NULL
    WHERE t.turn_id = p_turn
    RETURNING {_DECIDE_SELECT} INTO {_DECIDE_INTO};
    PERFORM pg_notify(p_channel, current_schema() || ':' || p_turn);
END $$"""
"""A person's decision recorded in one call (issue 21): the waiting turn's row locked
and checked (this session's, still ``awaiting-input``: else ``o_result`` ``refused``
with the row as found; ``expired`` when ``p_deadline``, the call's stored deadline, is
at or before ``clock_timestamp()``), the decision's save (:data:`SAVE_FUNCTION`, version-checked,
unfenced), and, when the decision is the last its turn waited for (``p_complete``), the
row back to ``running`` with no owner, a lapsed lease and ``resume_pending``, and the
workers' wake-up; the row after in the ``o_`` status columns. ``o_result`` is the
save's status otherwise (``ok``; ``conflict``, ``meta``... with nothing written).

One statement in autocommit, sent from the event loop, where the decision was a thread's
transaction of four round trips (``BEGIN``, the row's requeue with the session's lock,
the write, ``COMMIT``). Of two decisions for one call exactly one is
recorded: the second waits on the turn's row, then finds it no longer waiting (the
first completed the turn's calls) or the session's version moved (it did not)."""


SUBMIT_V1_FUNCTION_NAME: Final = "axon_submit_v1"
"""The first version of the submit's function (:data:`SUBMIT_V1_FUNCTION`, still
created: a process of the version before calls it). A process of before it submits in a
transaction of its own statements (the same locks, in the same order, on the same tables:
a mixed fleet's submits count each other under both caps)."""
SUBMIT_V2_FUNCTION_NAME: Final = "axon_submit_v2"
"""The second version (:data:`SUBMIT_V2_FUNCTION`, still created: a process of the
version before calls it)."""
SUBMIT_V3_FUNCTION_NAME: Final = "axon_submit_v3"
"""The third version (:data:`SUBMIT_V3_FUNCTION`, still created: a process of the
version before calls it). v2 left interrupts racing in one session each queued: v3 has
such a call sent again (:data:`INTERRUPT_RACED`)."""
SUBMIT_FUNCTION_NAME: Final = "axon_submit_v4"
"""The server-side function of a front end's submit (:data:`SUBMIT_FUNCTION`); a new
version of it gets a new name. v3 queued two different edits of one message sent at
once (the later one's turn replaced the first's answer) and counted a twin's steer:
v4 sends such an edit again (:data:`INTERRUPT_RACED`) and gives the steer back."""

SUBMIT_REFUSALS: Final = {
    "AXQ01": "session",
    "AXQ02": "total",
    "AXB01": "busy",
    "AXC01": "later",
    "AXC02": "open",
    "AXT01": "turn id",
}
"""The ``SQLSTATE`` s :data:`SUBMIT_FUNCTION` refuses a submit with (its ``DETAIL`` the
count a cap found, or the status of a turn an edit cannot replace), by what they mean: a
refusal is an error so that the call's writes before it (an ``interrupt``'s, a
``steer``'s, the row a total cap counts) roll back with it, its wake-ups unsent."""

_T_COLUMNS = ", ".join(f"t.{name}" for name, _ in CLAIMED_COLUMNS)
_INTO_COLUMNS = ", ".join(f"o_{name}" for name, _ in CLAIMED_COLUMNS)
_SUBMIT_OUT = ", ".join(f"o_{name} {kind}" for name, kind in CLAIMED_COLUMNS)
_INSERTED = ", ".join(name for name, _ in CLAIMED_COLUMNS)
_SESSION_LOCK = (
    "PERFORM pg_advisory_xact_lock("
    "hashtextextended('axon_turns:' || current_schema() || ':' || p_session, 0))"
)
_WAITS_OPEN = """EXISTS (SELECT 1 FROM axon_turns AS o
                WHERE o.session_id = p_session AND o.status IN ('queued', 'running'))"""
_STOPPED = """s.reason,
            CASE WHEN s.waits THEN 'cancelled' ELSE 'queued' END,
            CASE WHEN s.waits THEN 'aborted' END,
            coalesce(s.waits, false),
            CASE WHEN s.waits THEN clock_timestamp() END"""
_HELD = """DELETE FROM axon_held_stops AS h
            WHERE h.session_id = p_session
                AND (h.message_id = v_name OR h.message_id = p_turn_name)
                AND h.held_at >= clock_timestamp() - make_interval(secs => p_held_for)
            RETURNING h.reason"""

SUBMIT_V1_FUNCTION: Final = f"""CREATE OR REPLACE FUNCTION {SUBMIT_V1_FUNCTION_NAME}(
    p_session TEXT, p_turn TEXT, p_message_key TEXT, p_input_hash TEXT, p_new_key TEXT,
    p_input TEXT, p_meta BYTEA, p_options BYTEA, p_regenerate BOOLEAN, p_on_busy TEXT,
    p_stop_name TEXT, p_turn_name TEXT, p_held_for DOUBLE PRECISION,
    p_per_session INTEGER, p_total INTEGER, p_large BOOLEAN,
    p_channel TEXT, p_cancel_channel TEXT, p_interrupted TEXT)
    RETURNS TABLE ({_SUBMIT_OUT})
    LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    v_key TEXT;  -- the row's idempotency key (NULL: a submit without one)
    v_regenerate BOOLEAN := p_regenerate;
    v_name TEXT;  -- the client's id of a message never submitted before
    v_old TEXT;
    v_old_session TEXT;
    v_seq BIGINT;
    v_status TEXT;
    v_saved BOOLEAN;
    v_hash TEXT;
    v_ids TEXT[];
    v_statuses TEXT[];
    v_stopped TEXT;  -- a held stop the interrupt's statement took
    v_steer TEXT;
    v_stored BOOLEAN;
    v_count BIGINT;
BEGIN
    -- Every statement below is one of its own, with its own snapshot (read committed, a
    -- volatile function): a count after a lock sees every submit that held it before.
    IF p_message_key IS NOT NULL THEN
        -- The message's latest turn: none (a new message), its replay, or its edit.
        SELECT t.turn_id, t.session_id, t.seq, t.status, t.saved, t.input_hash
            INTO v_old, v_old_session, v_seq, v_status, v_saved, v_hash
        FROM axon_turns AS t WHERE t.message_key = p_message_key
        ORDER BY t.seq DESC LIMIT 1;
        IF NOT FOUND THEN
            v_key := p_new_key;
            v_name := p_stop_name;  -- (a retry's or an edit's: maybe a late stop)
        ELSIF v_old_session = p_session AND v_hash IS DISTINCT FROM p_input_hash THEN
            IF EXISTS (SELECT 1 FROM axon_turns AS t
                    WHERE t.session_id = p_session AND t.seq > v_seq) THEN
                RAISE EXCEPTION 'only the last message can be edited' USING ERRCODE = 'AXC01';
            END IF;
            IF v_status NOT IN ('done', 'failed', 'cancelled') THEN
                RAISE EXCEPTION 'the turn of the edited message is %', v_status
                    USING ERRCODE = 'AXC02', DETAIL = v_status;
            END IF;
            -- The key of an edit names the turn it replaces (sha256 of the JSON array
            -- [message key, input hash, old turn id], as the transaction's code made it).
            v_key := encode(sha256(convert_to('[' || to_json(p_message_key)::text || ','
                || to_json(p_input_hash)::text || ',' || to_json(v_old)::text || ']',
                'UTF8')), 'hex');
            v_regenerate := p_regenerate OR v_saved;
        ELSE  -- a replay (or another session's key: the caller refuses it)
            RETURN QUERY SELECT {_T_COLUMNS} FROM axon_turns AS t WHERE t.turn_id = v_old;
            RETURN;
        END IF;
    END IF;
    IF p_on_busy = 'interrupt' THEN
        -- Row locks first, in line order, as a claim takes them; a stop held for this
        -- message is taken in the same statement, and then nothing is interrupted.
        WITH held AS (
            {_HELD}
        ), open AS (
            SELECT o.turn_id, o.status, o.seq FROM axon_turns AS o
            WHERE o.session_id = p_session AND o.status IN ('queued', 'running')
                AND NOT EXISTS (SELECT 1 FROM held)
            ORDER BY o.seq FOR UPDATE
        )
        SELECT (SELECT h.reason FROM held AS h LIMIT 1),
            (SELECT array_agg(o.turn_id ORDER BY o.seq) FROM open AS o),
            (SELECT array_agg(o.status ORDER BY o.seq) FROM open AS o)
        INTO v_stopped, v_ids, v_statuses;
        IF v_stopped IS NULL AND v_ids IS NOT NULL THEN
            FOR i IN 1 .. array_length(v_ids, 1) LOOP
                -- one statement a row: the head trigger moves the head on to the next
                IF v_statuses[i] = 'queued' THEN
                    UPDATE axon_turns SET status = 'cancelled', finish_reason = 'aborted',
                        cancel_requested = true, cancel_reason = p_interrupted,
                        finished_at = clock_timestamp()
                    WHERE turn_id = v_ids[i];
                    PERFORM pg_notify(p_channel, current_schema() || ':' || v_ids[i]);
                ELSE
                    UPDATE axon_turns SET cancel_requested = true,
                        cancel_reason = coalesce(cancel_reason, p_interrupted)
                    WHERE turn_id = v_ids[i];
                END IF;
                PERFORM pg_notify(p_cancel_channel, v_ids[i]);
            END LOOP;
        END IF;
    END IF;
    IF p_on_busy = 'steer' AND NOT v_regenerate THEN
        -- (row locks first here too: the running turn's count of steers)
        UPDATE axon_turns SET steers = steers + 1
        WHERE session_id = p_session AND status = 'running' RETURNING turn_id INTO v_steer;
    END IF;
    IF p_per_session IS NOT NULL OR p_total IS NOT NULL THEN
        -- The session's lock (the head trigger's), held to the commit; a submit that
        -- repeats one stored (its key, or its turn id) is never refused.
        {_SESSION_LOCK};
        IF p_per_session IS NULL THEN
            IF v_key IS NOT NULL THEN
                v_stored := EXISTS (SELECT 1 FROM axon_turns AS t WHERE t.idempotency_key = v_key);
            ELSE
                v_stored := EXISTS (SELECT 1 FROM axon_turns AS t WHERE t.turn_id = p_turn);
            END IF;
        ELSE
            -- ">= x AND <= x" with ORDER BY keeps a generic plan on the queued index.
            IF v_key IS NOT NULL THEN
                SELECT EXISTS (SELECT 1 FROM axon_turns AS t WHERE t.idempotency_key = v_key)
                    INTO v_stored;
            ELSE
                SELECT EXISTS (SELECT 1 FROM axon_turns AS t WHERE t.turn_id = p_turn)
                    INTO v_stored;
            END IF;
            IF NOT v_stored THEN
                SELECT count(*) INTO v_count FROM (SELECT 1 FROM axon_turns AS t
                    WHERE t.session_id >= p_session AND t.session_id <= p_session
                        AND t.status = 'queued'
                    ORDER BY t.session_id, t.seq LIMIT p_per_session) AS q;
                IF v_count >= p_per_session THEN
                    RAISE EXCEPTION 'the session''s queue is full' USING ERRCODE = 'AXQ01',
                        DETAIL = v_count::text;
                END IF;
            END IF;
        END IF;
        IF NOT v_stored AND p_total IS NOT NULL AND p_large THEN
            -- a large row: the queue looked at without its lock, refused before the insert
            SELECT count(*) INTO v_count FROM (SELECT 1 FROM axon_turns AS t
                WHERE t.status = 'queued' ORDER BY t.seq LIMIT p_total) AS q;
            IF v_count >= p_total THEN
                RAISE EXCEPTION 'the turn queue is full' USING ERRCODE = 'AXQ02',
                    DETAIL = v_count::text;
            END IF;
        END IF;
    END IF;
    IF p_on_busy = 'reject' THEN
        {_SESSION_LOCK};
        IF {_WAITS_OPEN} THEN
            RAISE EXCEPTION 'the session is running a turn' USING ERRCODE = 'AXB01';
        END IF;
    END IF;
    IF p_on_busy IS DISTINCT FROM 'interrupt'
            AND (v_name IS NOT NULL OR p_turn_name IS NOT NULL) THEN
        -- A new message takes the stop held for it (by the client's id of it, or by its
        -- turn id): cancelled at once when the session has a turn open, else queued
        -- with the stop's reason and no cancel_requested (stopped as it starts). A
        -- stopped message steers nothing: the count of steers raised is given back.
        WITH held AS (
            {_HELD}
        ), unsteer AS (
            UPDATE axon_turns AS u SET steers = u.steers - 1
            WHERE u.turn_id = v_steer AND EXISTS (SELECT 1 FROM held)
        )
        INSERT INTO axon_turns (turn_id, session_id, idempotency_key, message_key,
            input_hash, input, meta, regenerate, options, steer_of, cancel_reason, status,
            finish_reason, cancel_requested, finished_at)
        SELECT p_turn, p_session, v_key, p_message_key, p_input_hash, p_input, p_meta,
            v_regenerate, p_options, CASE WHEN s.reason IS NULL THEN v_steer END,
            {_STOPPED}
        FROM (VALUES (1)) AS one LEFT JOIN LATERAL (
            SELECT h.reason, {_WAITS_OPEN} AS waits
            FROM held AS h LIMIT 1) AS s ON true
        ON CONFLICT DO NOTHING RETURNING {_INSERTED} INTO {_INTO_COLUMNS};
    ELSIF v_stopped IS NOT NULL THEN  -- taken by the interrupt's statement
        INSERT INTO axon_turns (turn_id, session_id, idempotency_key, message_key,
            input_hash, input, meta, regenerate, options, cancel_reason, status,
            finish_reason, cancel_requested, finished_at)
        SELECT p_turn, p_session, v_key, p_message_key, p_input_hash, p_input, p_meta,
            v_regenerate, p_options, {_STOPPED}
        FROM (SELECT v_stopped AS reason, {_WAITS_OPEN} AS waits) AS s
        ON CONFLICT DO NOTHING RETURNING {_INSERTED} INTO {_INTO_COLUMNS};
    ELSE
        INSERT INTO axon_turns (turn_id, session_id, idempotency_key, message_key,
            input_hash, input, meta, regenerate, options, steer_of)
        VALUES (p_turn, p_session, v_key, p_message_key, p_input_hash, p_input, p_meta,
            v_regenerate, p_options, v_steer)
        ON CONFLICT DO NOTHING RETURNING {_INSERTED} INTO {_INTO_COLUMNS};
    END IF;
    IF FOUND THEN
        IF p_total IS NOT NULL THEN
            -- The queue's lock, taken after the row is written (a large row's insert
            -- holds no other submit of the fleet), held to the commit; the count, a
            -- statement after it, counts this row and every turn queued before.
            PERFORM pg_advisory_xact_lock(
                hashtextextended('axon_turns:' || current_schema(), 0));
            SELECT count(*) INTO v_count FROM (SELECT 1 FROM axon_turns AS t
                WHERE t.status = 'queued' ORDER BY t.seq LIMIT p_total + 1) AS q;
            IF v_count > p_total THEN
                RAISE EXCEPTION 'the turn queue is full' USING ERRCODE = 'AXQ02',
                    DETAIL = (v_count - 1)::text;
            END IF;
        END IF;
        -- the workers' wake-up, sent at the commit (a refused submit rolls it back)
        PERFORM pg_notify(p_channel, current_schema() || ':' || p_turn);
        RETURN NEXT;
        RETURN;
    END IF;
    -- Its twin: this very submit (a call retried after its answer was lost), or the
    -- same request sent twice; never another session's or message's turn.
    IF v_key IS NOT NULL THEN
        RETURN QUERY SELECT {_T_COLUMNS} FROM axon_turns AS t WHERE t.idempotency_key = v_key;
    ELSE
        RETURN QUERY SELECT {_T_COLUMNS} FROM axon_turns AS t
        WHERE t.turn_id = p_turn AND t.session_id = p_session
            AND t.input_hash = p_input_hash AND t.regenerate = v_regenerate;
    END IF;
    IF NOT FOUND THEN  -- the conflict was on the turn id, another turn's
        RAISE EXCEPTION 'the turn id is taken' USING ERRCODE = 'AXT01';
    END IF;
END $$"""
"""A front end's submit (:meth:`actors.stores.turn_submit.TurnSubmitting.submit`) in one
call, in autocommit, sent from the event loop: the message's latest turn (a replay
returns it; an edit is refused unless its turn ended and is the session's last, else
keyed by the turn it replaces), the busy strategy (``interrupt``: the session's open rows
locked in line order, queued ones cancelled and the running one asked to stop, or the
stop held for this message taken instead; ``steer``: the running turn's count of steers
raised), the session's lock and cap (the look for a repeat, then the count, each a
statement after the lock), a large row's early look at the queue's cap, ``reject``'s
look under the session's lock, the insert (taking a held stop in its statement), then
the queue's lock and its count with this row, and the workers' wake-up; or the turn a
twin of this submit stored. Where the transaction it replaces cost seven to eight round
trips with both caps on (``BEGIN``, the message's look, the session's lock, its count,
the insert, the queue's lock, its count, ``COMMIT``). Refusals are errors
(:data:`SUBMIT_REFUSALS`): the call's writes roll back."""

_V1_OPEN = """WHERE o.session_id = p_session AND o.status IN ('queued', 'running')
                AND NOT EXISTS (SELECT 1 FROM held)
"""
_V2_OPEN = """WHERE o.session_id = p_session AND o.status IN ('queued', 'running')
                AND NOT EXISTS (SELECT 1 FROM held)
                AND o.turn_id <> p_turn AND NOT coalesce(o.idempotency_key = v_key, false)
"""
_V1_REJECT = f"""IF {_WAITS_OPEN} THEN
            RAISE EXCEPTION 'the session is running a turn' USING ERRCODE = 'AXB01';"""
_V2_REJECT = f"""IF {_WAITS_OPEN} AND NOT EXISTS (SELECT 1 FROM axon_turns AS t
                WHERE t.idempotency_key = v_key OR (t.turn_id = p_turn
                    AND t.session_id = p_session AND t.input_hash = p_input_hash
                    AND t.regenerate = v_regenerate)) THEN
            RAISE EXCEPTION 'the session is running a turn' USING ERRCODE = 'AXB01';"""


def _submit_v2(v1: str) -> str:
    """:data:`SUBMIT_V1_FUNCTION`'s text with its name, and its interrupt's and its
    ``reject``'s looks passing over this submit's twin."""
    text = v1.replace(SUBMIT_V1_FUNCTION_NAME + "(", SUBMIT_V2_FUNCTION_NAME + "(", 1)
    for part in (_V1_OPEN, _V1_REJECT):
        assert text.count(part) == 1, part
    text = text.replace(_V1_OPEN, _V2_OPEN, 1)
    return text.replace(_V1_REJECT, _V2_REJECT, 1)


SUBMIT_V2_FUNCTION: Final = _submit_v2(SUBMIT_V1_FUNCTION)
""":data:`SUBMIT_V1_FUNCTION` whose ``interrupt`` and ``reject`` pass over this submit's
twin (the row of its idempotency key, or its turn id's): the same message sent twice at
once (a client's retry to another front end, an AG-UI run posted again) is one submit,
its second call returning the first's turn. v1's ``reject``, waiting for the session's
lock the first held to its commit, then found that turn open and refused the message
as busy (409) while its turn ran; its ``interrupt``, when the first committed between
the message's look and the interrupt's statement (each statement its own snapshot),
cancelled it (``interrupted by a new message``: the message never answered)."""

_V1_QUEUE_LOCK = """    IF FOUND THEN
        IF p_total IS NOT NULL THEN
"""
_RACED_INTERRUPT = """    IF FOUND THEN
        IF p_on_busy = 'interrupt' AND v_stopped IS NULL AND EXISTS (
                SELECT 1 FROM axon_turns AS o
                WHERE o.session_id = p_session AND o.status IN ('queued', 'running')
                    AND o.turn_id <> p_turn AND NOT o.cancel_requested) THEN
            -- Another open turn of the session this interrupt did not stop: a racing
            -- interrupt's, committed after this call's statement read the open turns
            -- (it waited on the row that one locked). Its row's insert took the
            -- session's lock, which this insert waited for: it is seen now. The call
            -- rolls back and is sent again, and stops it then (the last one wins).
            RAISE EXCEPTION 'an interrupt of the session raced this one'
                USING ERRCODE = '{INTERRUPT_RACED}';
        END IF;
        IF p_total IS NOT NULL THEN
"""

INTERRUPT_RACED: Final = "40001"
"""The ``SQLSTATE`` (``serialization_failure``) :data:`SUBMIT_FUNCTION` ends an interrupt
with when, its row inserted, it finds another open turn of its session it did not stop:
the caller sends the call again (:data:`~actors.stores.turn_submit.RACE_TRIES`)."""


_V1_CAPS_LOCK = f"""is never refused.
        {_SESSION_LOCK};
"""
_RACED_BEFORE_COUNT = """is never refused.
        {_SESSION_LOCK};
        IF p_on_busy = 'interrupt' AND v_stopped IS NULL AND EXISTS (
                SELECT 1 FROM axon_turns AS o
                WHERE o.session_id = p_session AND o.status IN ('queued', 'running')
                    AND o.turn_id <> p_turn AND NOT o.cancel_requested
                    AND (v_key IS NULL OR o.idempotency_key IS DISTINCT FROM v_key)) THEN
            -- (the same, before a cap counts a racing interrupt's turn this one stops)
            RAISE EXCEPTION 'an interrupt of the session raced this one'
                USING ERRCODE = '{INTERRUPT_RACED}';
        END IF;
"""


def _submit_v3(v2: str) -> str:
    """:data:`SUBMIT_V2_FUNCTION`'s text with its name and the racing interrupts' checks:
    after its insert, and before a cap's count (which counted a racing interrupt's turn,
    to refuse a message that would have stopped it)."""
    text = v2.replace(SUBMIT_V2_FUNCTION_NAME + "(", SUBMIT_V3_FUNCTION_NAME + "(", 1)
    assert text.count(_V1_QUEUE_LOCK) == 1, "the insert's success, then the queue's lock"
    assert text.count(_V1_CAPS_LOCK) == 1, "the caps' session lock"
    check = _RACED_INTERRUPT.replace("{INTERRUPT_RACED}", INTERRUPT_RACED)
    text = text.replace(_V1_QUEUE_LOCK, check, 1)
    before_count = _RACED_BEFORE_COUNT.replace("{_SESSION_LOCK}", _SESSION_LOCK)
    return text.replace(
        _V1_CAPS_LOCK, before_count.replace("{INTERRUPT_RACED}", INTERRUPT_RACED), 1
    )


SUBMIT_V3_FUNCTION: Final = _submit_v3(SUBMIT_V2_FUNCTION)
""":data:`SUBMIT_V2_FUNCTION` that, an interrupt, ends with :data:`INTERRUPT_RACED` after
its insert when another open turn of the session is not asked to stop: interrupts
racing in one session (each one's statement reading the open turns before another's row
was committed) each queued their turn, to run one after the other. Sent again, the call
stops that turn: exactly one interrupt, the last to commit, survives."""

_V3_RACED_CHECK = """    IF FOUND THEN
        IF p_on_busy = 'interrupt' AND v_stopped IS NULL AND EXISTS ("""
_RACED_EDIT = f"""    IF FOUND THEN
        IF v_old IS NOT NULL AND EXISTS (SELECT 1 FROM axon_turns AS t
                WHERE t.message_key = p_message_key AND t.seq > v_seq
                    AND t.turn_id <> p_turn) THEN
            -- An edit of the message whose look found its old turn ended, as another
            -- edit's did (another content: another key, so both inserted): that one's
            -- row, committed before this insert took the session's lock (the head
            -- trigger's), is seen now. Sent again, the call's look finds that turn: a
            -- 409 while it is open, an edit of it once ended; never both queued.
            RAISE EXCEPTION 'another edit of the message raced this one'
                USING ERRCODE = '{INTERRUPT_RACED}';
        END IF;
        IF p_on_busy = 'interrupt' AND v_stopped IS NULL AND EXISTS ("""
_V3_TWIN = """    -- Its twin: this very submit (a call retried after its answer was lost), or the
    -- same request sent twice; never another session's or message's turn.
"""
_UNSTEERED_TWIN = """    -- Its twin: this very submit (a call retried after its answer was lost),
    -- or the same request sent twice; never another session's or message's turn.
    -- A steer raised for it is given back (the twin's own raised the count once).
    IF v_steer IS NOT NULL THEN
        UPDATE axon_turns SET steers = steers - 1 WHERE turn_id = v_steer;
    END IF;
"""


def _submit_v4(v3: str) -> str:
    """:data:`SUBMIT_V3_FUNCTION`'s text with its name, the racing edits' check after its
    insert, and a twin's steer given back."""
    text = v3.replace(SUBMIT_V3_FUNCTION_NAME + "(", SUBMIT_FUNCTION_NAME + "(", 1)
    for part in (_V3_RACED_CHECK, _V3_TWIN):
        assert text.count(part) == 1, part
    text = text.replace(_V3_RACED_CHECK, _RACED_EDIT, 1)
    return text.replace(_V3_TWIN, _UNSTEERED_TWIN, 1)


SUBMIT_FUNCTION: Final = _submit_v4(SUBMIT_V3_FUNCTION)
""":data:`SUBMIT_V3_FUNCTION` that ends an edit with :data:`INTERRUPT_RACED` when, its row
inserted, it finds a turn of the same message after the old one it replaces: two
different edits of one message sent at once each found the old turn ended and both were
queued, the later one's turn replacing the first's answer. Sent again, the later one is
a 409 (the first's turn still open) or an edit of the first's ended turn: exactly one
of them is queued after the old turn. And a twin (its insert met the first's row) gives
back the steer it raised: a duplicate ``steer`` counted one steer too many."""
