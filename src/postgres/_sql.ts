// Every statement the PostgreSQL backend sends, one named constant each
// (the queue's are in _queue_sql.ts, the table's DDL in _ddl.ts). Values
// are always parameters ($1, $2, ...). The only text spliced in is the
// table's identifier, quoted by `quoteIdent` (identifiers cannot be
// parameters), once per pgLocks object.
//
// Every system function, table, type and operator is named with its
// schema (pg_catalog.pg_try_advisory_lock, pg_catalog.pg_locks,
// pg_catalog.text, OPERATOR(pg_catalog.=)): a role whose search_path puts
// a schema of its own before pg_catalog (`SET search_path = app,
// pg_catalog`) makes a bare name mean that schema's function, view or
// operator [search] (an impostor pg_try_advisory_lock that returns true
// would give two holders). The pinned search_path (_settings.ts) puts
// pg_catalog first; the qualified names hold even without it. SQL
// keywords that name types (bigint, integer, boolean) are not looked up
// in search_path and stay bare.
//
// References (PostgreSQL 15 manual):
//   [advisory]  §9.27.10 Advisory Lock Functions
//   [explicit]  §13.3.5 Advisory Locks
//   [pglocks]   §54.12 pg_locks (advisory keys: classid = high half,
//               objid = low half, objsubid = 1 for a bigint key)
//   [upsert]    §13.2.1 Read Committed Isolation Level (INSERT ... ON
//               CONFLICT DO UPDATE), and INSERT, "ON CONFLICT Clause"
//   [with]      §7.8.4 Data-Modifying Statements in WITH
//   [stats]     §28.2.3 pg_stat_activity (backend_xmin)
//   [search]    §5.9.3 The Schema Search Path ("pg_catalog ... is
//               searched after ... if it is listed later in the path"),
//               §10.2 Operators and §10.3 Functions (both resolved
//               through the path)
import { quoteIdent, tableDefinition, tableName } from "./_ddl.ts";
import { SESSION_SETTING } from "./_settings.ts";

/** Begins the message of a statement that reached another server session. */
export const GUARD_MARK = "runlock: not this client's server session";

/**
 * `expr`, of SQL type `type`, when the statement runs on the server
 * session this client bound (its SESSION_SETTING equals the nonce in
 * parameter `$n`); otherwise the statement fails (a cast of GUARD_MARK
 * to `type`, 22P02) before the function whose argument this is runs.
 * Every advisory lock function a lock session calls takes its key through
 * this, so that a pooler that sends a statement to a server session of
 * another client (transaction or statement pooling, a load balancer) can
 * neither take, keep nor release a lock there. The ELSE arm is not a
 * constant (current_setting is stable), so the planner never evaluates it
 * early (manual §4.2.14). A guard of a statement that calls no function
 * with a key (pg_advisory_unlock_all, the owned check) is `true` in a
 * one-row subquery the statement filters on (`WHERE g.ok`): a column
 * nothing reads would be dropped by the planner, guard and all. The
 * message says whether the session has another client's nonce or none,
 * never the nonce.
 */
export function guarded(expr: string, type: string, n: number): string {
  return `(CASE WHEN pg_catalog.current_setting('${SESSION_SETTING}', true)
      OPERATOR(pg_catalog.=) $${n}::pg_catalog.text THEN ${expr}
    ELSE ('${GUARD_MARK.replaceAll("'", "''")} (its nonce is '
      OPERATOR(pg_catalog.||) CASE WHEN COALESCE(
        pg_catalog.current_setting('${SESSION_SETTING}', true), '')
        OPERATOR(pg_catalog.=) '' THEN 'not set)' ELSE 'another)' END)::${type}
    END)`;
}

/** The statements for one table, `schema.runlock_locks`. */
export interface Statements {
  table: string;
  tableState: string;
  tableExists: string;
  standby: string;
  identity: string;
  ensureTable: string;
  ensureSchemaAndTable: string;
  ensureTableIn: string;
  ensureSchemaAndTableIn: string;
  tryAcquire: string;
  waitAcquire: string;
  release: string;
  unlockAll: string;
  inspect: string;
  scan: string;
  owned: string;
}

/** The record's columns, in the order the acquire statements bind them. */
const COLUMNS =
  "name, key, fence, pid, host, started, runtime, meta, backend_pid";

// The upsert both acquire statements share. `fence` grows by one on every
// acquisition, in the statement that writes the record, so a record and
// its fence are committed together. It never falls below the floor of the
// server's timeline (FENCE_FLOOR): on timeline 1 it starts at 1, and a
// standby promoted to timeline t hands out fences above (t - 1) * 2^32,
// above every fence of the timelines before it, even those its
// asynchronous replication missed. In READ COMMITTED an
// INSERT ... ON CONFLICT DO UPDATE updates the latest committed version of
// the conflicting row even when the statement's snapshot is older [upsert]:
// a waiter whose statement began before the previous holder's acquisition
// still reads that holder's fence. A conflict on `key` (another name with
// the same 64-bit key) is not covered by ON CONFLICT (name): it raises
// unique_violation (23505), which is how a key collision is detected.
/**
 * The floor of fences on the server's current timeline, (t - 1) * 2^32:
 * a promotion starts a new timeline, whose number any role can read in
 * the name of the WAL file being written (its first 8 hex digits; manual
 * §9.27.3, pg_walfile_name and pg_current_wal_lsn). Fences of one
 * timeline stay below the next one's floor for the first 2^32
 * acquisitions of a name.
 */
const FENCE_FLOOR = `((('x' OPERATOR(pg_catalog.||) pg_catalog.substr(
       pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))
       ::bit(32)::bigint OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog.<<) 32)`;

/** The record's upsert, writing the acquisition from rows of `source`. */
export const upsert = (table: string, source: string) =>
  `INSERT INTO ${table} AS r (${COLUMNS})
   SELECT $1, $2, ${FENCE_FLOOR} OPERATOR(pg_catalog.+) 1, $3, $4,
     pg_catalog.clock_timestamp(), $5,
     $6::pg_catalog.jsonb, pg_catalog.pg_backend_pid()
   FROM ${source}
   ON CONFLICT (name) DO UPDATE SET
     key = EXCLUDED.key, fence = GREATEST(r.fence OPERATOR(pg_catalog.+) 1,
       EXCLUDED.fence),
     pid = EXCLUDED.pid,
     host = EXCLUDED.host, started = EXCLUDED.started,
     runtime = EXCLUDED.runtime, meta = EXCLUDED.meta,
     backend_pid = EXCLUDED.backend_pid
   RETURNING fence::pg_catalog.text AS fence, started`;

/** Builds the statements for the table `schema.runlock_locks`. */
export function statements(schema: string): Statements {
  const table = tableName(schema);
  const ddlIn = (withSchema: boolean) =>
    `SELECT pg_catalog.pg_advisory_xact_lock(1920298604, 1);
      ${withSchema ? `CREATE SCHEMA IF NOT EXISTS ${quoteIdent(schema)};` : ""}
      ${tableDefinition(table)}`;
  const ddl = (withSchema: boolean) =>
    `BEGIN;
      ${ddlIn(withSchema)};
      COMMIT`;
  return {
    table,

    // Whether the schema and the table exist, before creating them.
    // $1 the quoted schema name, $2 the quoted table name.
    tableState: `SELECT
        pg_catalog.to_regnamespace($1) IS NOT NULL AS schema,
        pg_catalog.to_regclass($2) IS NOT NULL AS table`,

    // Whether the table exists (probes create nothing). $1 the table.
    tableExists: `SELECT pg_catalog.to_regclass($1) IS NOT NULL AS table`,

    // Whether the server is a hot standby (in recovery): advisory locks
    // are not replicated, so its pg_locks shows none of the primary's.
    standby: `SELECT pg_catalog.pg_is_in_recovery() AS standby`,

    // Who we are, for the message when creating the table is refused.
    // CURRENT_USER is a keyword, not a function looked up in search_path.
    identity:
      `SELECT CURRENT_USER AS role, pg_catalog.current_database() AS database`,

    // Created on first use. CREATE ... IF NOT EXISTS is not atomic: two
    // sessions creating the same table (or schema) at once can fail with
    // unique_violation on pg_type_typname_nsp_index (or
    // pg_namespace_nspname_index). So creators serialize on a
    // transaction-level advisory lock in the two-int4 key space (objsubid
    // 2 in pg_locks), which never collides with the bigint keys of lock
    // names [advisory]. Sent only when to_regclass says the table is
    // missing, so a role with only SELECT/INSERT/UPDATE on an existing
    // table works; the schema is created only when to_regnamespace says it
    // is missing (that needs CREATE on the database).
    //   name         the lock name (primary key)
    //   key          its 64-bit advisory key; UNIQUE detects two names
    //                that hash to one key instead of sharing a lock
    //   fence        increments on every acquisition; never reset
    //   pid, host    the holder process and its host
    //   started      when it took the lock (server clock)
    //   runtime      deno, node or bun
    //   meta         the caller's fields
    //   backend_pid  the holder's server process; NULL once released. The
    //                row counts as held only while this backend holds the
    //                advisory lock in pg_locks, so a dead holder's row reads
    //                stale, never held.
    ensureTable: ddl(false),
    ensureSchemaAndTable: ddl(true),
    // The same inside a transaction the session is in already (a lock
    // session through a pooler, _bind.ts), which commits it.
    ensureTableIn: ddlIn(false),
    ensureSchemaAndTableIn: ddlIn(true),

    // The fast path, one round trip: take the advisory lock without
    // waiting and, only if that worked, write the record. Zero rows means
    // someone holds the key. pg_try_advisory_lock is volatile, so the
    // MATERIALIZED CTE runs it exactly once, before the INSERT reads it.
    // $1 name, $2 key, $3 pid, $4 host, $5 runtime, $6 meta (json text),
    // $7 the session's nonce (see guarded).
    tryAcquire: `WITH got AS MATERIALIZED (
        SELECT pg_catalog.pg_try_advisory_lock(${
      guarded("$2::bigint", "bigint", 7)
    }) AS ok
      ) ${upsert(table, "got WHERE got.ok")}`,

    // Waiting: block in pg_advisory_lock, so the server hands the lock over
    // the instant its holder's session releases it or ends (no polling),
    // then write the record in the same statement. lock_timeout ($7, ms)
    // bounds the wait; set_config(..., true) is local to this statement's
    // implicit transaction, so it is gone afterwards. A blocked statement
    // holds a snapshot, which holds back VACUUM's horizon cluster-wide
    // (pg_stat_activity.backend_xmin [stats]: a blocked pg_advisory_lock
    // shows one), so callers wait in slices of a few seconds rather than
    // for hours in one statement. $8 the session's nonce.
    waitAcquire: `WITH cfg AS MATERIALIZED (
        SELECT pg_catalog.set_config('lock_timeout', $7::pg_catalog.text, true)
      ), got AS MATERIALIZED (
        SELECT pg_catalog.pg_advisory_lock(${
      guarded("$2::bigint", "bigint", 8)
    }) FROM cfg
      ) ${upsert(table, "got")}`,

    // Release: mark the record released (so it reads free, not stale),
    // then drop every advisory lock of this session. The UPDATE matches
    // only our own acquisition (fence and backend): if a successor already
    // rewrote the row, it leaves theirs alone. The WITH sub-statement and
    // the SELECT run in one snapshot in no guaranteed order [with]; the
    // fence condition makes the order irrelevant. pg_advisory_unlock_all,
    // not pg_advisory_unlock: session-level advisory locks stack (taken
    // twice, they need two unlocks) [explicit], and this session is
    // dedicated to one lock, so "all" is exactly ours.
    // $1 name, $2 fence, $3 the session's nonce.
    release: `WITH mark AS (
        UPDATE ${table} SET backend_pid = NULL
        WHERE name OPERATOR(pg_catalog.=) $1
          AND fence OPERATOR(pg_catalog.=) $2::bigint
          AND backend_pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
        RETURNING 1
      ) SELECT pg_catalog.pg_advisory_unlock_all(),
        (SELECT pg_catalog.count(*) FROM mark)::integer AS marked
      FROM (SELECT ${guarded("true", "boolean", 3)} AS ok) g WHERE g.ok`,

    // After a failed acquire statement. Session-level advisory locks are
    // NOT released when the transaction that took them rolls back
    // [explicit]: if the lock was granted and the INSERT then failed (key
    // collision, lock_timeout on the row, cancel), the session still holds
    // it and must drop it before it is reused. $1 the session's nonce: only
    // the session this client bound drops anything.
    unlockAll: `SELECT pg_catalog.pg_advisory_unlock_all()
      FROM (SELECT ${guarded("true", "boolean", 1)} AS ok) g WHERE g.ok`,

    // The read-only probe: the record for the name, any record of another
    // name with the same key (a collision), and who holds the key right now
    // in pg_locks (granted advisory lock, this database, bigint key split
    // into classid/objid with objsubid 1 [pglocks]). Never takes the lock.
    // pg_locks is read at call time while the table is read in the
    // statement's snapshot, so a holder that commits its record between
    // the two looks unrecorded: callers read again before calling a
    // holder foreign.
    // $1 name, $2 key, $3 classid (high half), $4 objid (low half).
    inspect: `SELECT
        r.fence::text AS fence, r.pid, r.host, r.started, r.runtime, r.meta,
        r.backend_pid,
        k.name AS other_name, k.pid AS other_pid, k.host AS other_host,
        k.backend_pid AS other_backend,
        l.pid AS holder_backend, a.application_name AS holder_application
      FROM (SELECT $1::pg_catalog.text AS name, $2::bigint AS key) q
      LEFT JOIN ${table} r ON r.name OPERATOR(pg_catalog.=) q.name
      LEFT JOIN ${table} k ON k.key OPERATOR(pg_catalog.=) q.key
        AND k.name OPERATOR(pg_catalog.<>) q.name
      LEFT JOIN pg_catalog.pg_locks l
        ON l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.granted
        AND l.database OPERATOR(pg_catalog.=) (
          SELECT d.oid FROM pg_catalog.pg_database d
          WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
        AND l.classid OPERATOR(pg_catalog.=) $3::pg_catalog.oid
        AND l.objid OPERATOR(pg_catalog.=) $4::pg_catalog.oid
        AND l.objsubid OPERATOR(pg_catalog.=) 1
      LEFT JOIN pg_catalog.pg_stat_activity a
        ON a.pid OPERATOR(pg_catalog.=) l.pid
      LIMIT 1`,

    // scan() and watch(): every record whose name starts with $1 (a
    // literal prefix: starts_with, not LIKE, so % and _ are plain
    // characters), with who holds its key right now, as `inspect` reads one
    // name. Listed: records not released (backend_pid set: held or stale),
    // keys held by anyone, and the names in $2 even when free (a watch
    // passes the names it reported, to see them released). The key is the
    // record's own column, split into pg_locks' two halves [pglocks]. As in
    // `inspect`, pg_locks is read after the statement's snapshot, and an
    // acquire or a release in flight (its commit may wait, for a WAL flush
    // or a synchronous standby) reads half done:
    // - a key held by a session the record does not name: an acquire
    //   granted, its record not yet committed;
    // - `record_backend_alive`: a record whose key is free while the
    //   backend it names still lives and started before it: a release that
    //   dropped the key and has not committed yet, or a backend on its way
    //   out (it drops its locks before it leaves pg_stat_activity).
    // While the backend is 'active' (`holder_state`, `record_backend_state`)
    // it is still in that statement. pg_stat_activity is read once per
    // transaction, not when pg_locks is, so 'idle' may be stale by then.
    // Without pg_read_all_stats (or membership in the role) another role's
    // backend_start and state read NULL (`record_backend_checked` false),
    // and with track_activities = off every state does. What needs no
    // privilege: `record_writing`, the record's row version we read has
    // an xmax whose transaction still holds its transactionid lock in
    // pg_locks: a statement of another session has updated (or row-locked)
    // the record and not committed yet (an acquire's upsert, a release's
    // mark, an UPDATE or SELECT ... FOR UPDATE by hand). pg_locks is read
    // once, in the MATERIALIZED CTE, for the advisory keys and the
    // transactions alike. An xmax that is a MultiXactId (several row
    // lockers) matches no transaction: then only pg_stat_activity tells.
    // Only records that can be held or stale are joined (`listed`): those
    // whose key is granted (through the key's index), those not marked
    // released, and the names in $2 (through the primary key).
    // $1 prefix (text), $2 names (text[]).
    scan: `WITH locks AS MATERIALIZED (
        SELECT l.locktype, l.pid, l.classid, l.objid, l.transactionid
        FROM pg_catalog.pg_locks l
        WHERE l.granted AND (l.locktype OPERATOR(pg_catalog.=) 'transactionid'
          OR (l.locktype OPERATOR(pg_catalog.=) 'advisory'
            AND l.database OPERATOR(pg_catalog.=) (
              SELECT d.oid FROM pg_catalog.pg_database d
              WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
            AND l.objsubid OPERATOR(pg_catalog.=) 1))
      ), held AS (
        SELECT h.pid, h.classid, h.objid FROM locks h
        WHERE h.locktype OPERATOR(pg_catalog.=) 'advisory'
      ), listed AS (
        SELECT k.name FROM held h JOIN ${table} k
          ON k.key OPERATOR(pg_catalog.=) ((h.classid::bigint
            OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.|) h.objid::bigint)
        UNION
        SELECT s.name FROM ${table} s WHERE s.backend_pid IS NOT NULL
        UNION
        SELECT n.name FROM ${table} n
        WHERE n.name OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.text[])
      )
      SELECT r.name, r.key::pg_catalog.text AS key,
        r.fence::pg_catalog.text AS fence, r.pid, r.host, r.started,
        r.runtime, r.meta, r.backend_pid,
        l.pid AS holder_backend, a.application_name AS holder_application,
        a.state AS holder_state,
        o.pid IS NOT NULL AS record_backend_alive, o.state AS record_backend_state,
        o.backend_start IS NOT NULL AS record_backend_checked,
        EXISTS (SELECT 1 FROM locks x
          WHERE x.locktype OPERATOR(pg_catalog.=) 'transactionid'
            AND x.transactionid OPERATOR(pg_catalog.=) r.xmax) AS record_writing
      FROM listed c
      JOIN ${table} r ON r.name OPERATOR(pg_catalog.=) c.name
      LEFT JOIN held l
        ON l.classid OPERATOR(pg_catalog.=) ((r.key OPERATOR(pg_catalog.>>) 32)
          OPERATOR(pg_catalog.&) 4294967295)::pg_catalog.oid
        AND l.objid OPERATOR(pg_catalog.=)
          (r.key OPERATOR(pg_catalog.&) 4294967295)::pg_catalog.oid
      LEFT JOIN pg_catalog.pg_stat_activity a
        ON a.pid OPERATOR(pg_catalog.=) l.pid
      LEFT JOIN pg_catalog.pg_stat_activity o
        ON l.pid IS NULL AND o.pid OPERATOR(pg_catalog.=) r.backend_pid
        AND (o.backend_start IS NULL
          OR o.backend_start OPERATOR(pg_catalog.<=) r.started)
      WHERE pg_catalog.starts_with(r.name, $1::pg_catalog.text)
        AND (r.backend_pid IS NOT NULL OR l.pid IS NOT NULL
          OR r.name OPERATOR(pg_catalog.=) ANY ($2::pg_catalog.text[]))`,

    // lock.isOwned() and the heartbeat: does this session still hold the
    // key? Answered only by the server session this client bound (guarded),
    // so a pooler or balancer that sends it elsewhere makes it fail, never
    // answer for another session. $1 classid, $2 objid, $3 the nonce.
    owned: `SELECT EXISTS (
        SELECT 1 FROM pg_catalog.pg_locks
        WHERE locktype OPERATOR(pg_catalog.=) 'advisory' AND granted
          AND pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
          AND classid OPERATOR(pg_catalog.=) $1::pg_catalog.oid
          AND objid OPERATOR(pg_catalog.=) $2::pg_catalog.oid
          AND objsubid OPERATOR(pg_catalog.=) 1
      ) AS owned
      FROM (SELECT ${guarded("true", "boolean", 3)} AS ok) g WHERE g.ok`,
  };
}
