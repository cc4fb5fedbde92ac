// Every statement the PostgreSQL backend sends, one named constant each
// (the queue's: _queue_sql.ts; the DDL: _ddl.ts). Values are parameters;
// only the table's identifier is spliced in, quoted by `quoteIdent`.
//
// Every system function, table, type and operator is schema-qualified: a
// role whose search_path puts a schema of its own before pg_catalog makes
// a bare name mean that schema's object [search] (an impostor
// pg_try_advisory_lock returning true would give two holders). Keywords
// that name types (bigint, integer, boolean) are not looked up: bare.
//
// References (PostgreSQL 15 manual):
//   [advisory]  §9.27.10 Advisory Lock Functions
//   [explicit]  §13.3.5 Advisory Locks
//   [pglocks]   §54.12 pg_locks (bigint key: classid = high half,
//               objid = low half, objsubid = 1)
//   [upsert]    §13.2.1 Read Committed Isolation Level, INSERT ... ON
//               CONFLICT DO UPDATE
//   [with]      §7.8.4 Data-Modifying Statements in WITH
//   [stats]     §28.2.3 pg_stat_activity (backend_xmin)
//   [search]    §5.9.3 The Schema Search Path; §10.2, §10.3
import { quoteIdent, tableDefinition, tableName } from "./_ddl.ts";
import { SESSION_SETTING } from "./_settings.ts";

/** Begins the message of a statement that reached another server session. */
export const GUARD_MARK = "runlock: not this client's server session";

/**
 * `expr` (SQL type `type`) only on the server session this client bound
 * (its SESSION_SETTING equals the nonce in `$n`); elsewhere the statement
 * fails (22P02, GUARD_MARK cast to `type`) before the function taking
 * this argument runs. Every advisory lock function takes its key through
 * this, so a pooler or balancer that reroutes a statement can neither
 * take, keep nor release a lock. The ELSE arm is not constant, so the
 * planner never folds it early (§4.2.14). A statement without a keyed
 * function filters on it in a one-row subquery (`WHERE g.ok`): a column
 * nothing reads would be dropped by the planner, guard and all. The
 * message never shows the nonce.
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

// `fence` grows by one on every acquisition, committed with its record,
// and never falls below FENCE_FLOOR (docs/postgres.md, "Failover"). In
// READ COMMITTED, ON CONFLICT DO UPDATE updates the latest committed row
// even under an older snapshot [upsert]: a waiter reads the previous
// holder's fence. A conflict on `key` (another name, same key) raises
// 23505: that is how a key collision is detected.
/**
 * (t - 1) * 2^32 on the server's timeline t, read from the current WAL
 * file's name (its first 8 hex digits, §9.27.3; any role may call it).
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

    // Created on first use, sent only when tableState says it is missing
    // (so a role without CREATE works on an existing table). CREATE ... IF
    // NOT EXISTS is not atomic: two creators at once can fail with 23505 on
    // pg_type_typname_nsp_index (or pg_namespace_nspname_index), so they
    // serialize on a transaction-level lock in the two-int4 key space
    // (objsubid 2), apart from the names' bigint keys [advisory]. `key` is
    // UNIQUE to detect collisions; `backend_pid` is NULL once released, and
    // a row counts as held only while that backend holds the key in
    // pg_locks, so a dead holder's row reads stale.
    ensureTable: ddl(false),
    ensureSchemaAndTable: ddl(true),
    // The same inside a pinned session's transaction (_bind.ts).
    ensureTableIn: ddlIn(false),
    ensureSchemaAndTableIn: ddlIn(true),

    // The one-round-trip try: the record is written only if the lock was
    // taken; zero rows means someone holds the key. The MATERIALIZED CTE
    // runs the volatile pg_try_advisory_lock exactly once.
    // $1 name, $2 key, $3 pid, $4 host, $5 runtime, $6 meta (json text),
    // $7 the session's nonce (see guarded).
    tryAcquire: `WITH got AS MATERIALIZED (
        SELECT pg_catalog.pg_try_advisory_lock(${
      guarded("$2::bigint", "bigint", 7)
    }) AS ok
      ) ${upsert(table, "got WHERE got.ok")}`,

    // Waiting in pg_advisory_lock (the server hands the lock over the
    // instant it is free), then the record, in one statement. lock_timeout
    // ($7, ms), local to the statement's transaction, bounds the wait: a
    // blocked statement holds a snapshot, so VACUUM's horizon
    // (backend_xmin [stats]), and callers wait in slices. $8 the nonce.
    waitAcquire: `WITH cfg AS MATERIALIZED (
        SELECT pg_catalog.set_config('lock_timeout', $7::pg_catalog.text, true)
      ), got AS MATERIALIZED (
        SELECT pg_catalog.pg_advisory_lock(${
      guarded("$2::bigint", "bigint", 8)
    }) FROM cfg
      ) ${upsert(table, "got")}`,

    // Release: mark our record released (so it reads free, not stale) and
    // drop the session's advisory locks. The UPDATE matches only our
    // acquisition (fence and backend), so a successor's row is left alone
    // whatever the order of the WITH and the SELECT [with]. unlock_all:
    // session-level advisory locks stack [explicit], and the session is
    // dedicated to one lock. $1 name, $2 fence, $3 the nonce.
    release: `WITH mark AS (
        UPDATE ${table} SET backend_pid = NULL
        WHERE name OPERATOR(pg_catalog.=) $1
          AND fence OPERATOR(pg_catalog.=) $2::bigint
          AND backend_pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
        RETURNING 1
      ) SELECT pg_catalog.pg_advisory_unlock_all(),
        (SELECT pg_catalog.count(*) FROM mark)::integer AS marked
      FROM (SELECT ${guarded("true", "boolean", 3)} AS ok) g WHERE g.ok`,

    // After a failed acquire statement: a session-level advisory lock
    // outlives the rollback of the statement that took it [explicit] (key
    // collision, lock_timeout on the row, cancel). $1 the nonce.
    unlockAll: `SELECT pg_catalog.pg_advisory_unlock_all()
      FROM (SELECT ${guarded("true", "boolean", 1)} AS ok) g WHERE g.ok`,

    // The probe: the name's record, another name's with the same key (a
    // collision), and who holds the key now in pg_locks [pglocks]. pg_locks
    // is read at call time, the table in the snapshot: a holder committing
    // its record in between looks unrecorded, so callers read again before
    // calling a holder foreign.
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

    // scan() and watch(): as `inspect`, for every record whose name starts
    // with $1 (starts_with: % and _ are plain) that is not released, whose
    // key anyone holds, or whose name is in $2 (a watch's reported names,
    // to see them released). Only those are joined (`listed`, through the
    // key's index and the primary key). An acquire or release in flight
    // (its commit may wait for a WAL flush or a synchronous standby) reads
    // half done:
    // - a key held by a session the record does not name: an acquire
    //   granted, its record not committed yet;
    // - `record_backend_alive`: the key free while the backend the record
    //   names lives and started before it: a release not committed yet, or
    //   a backend on its way out (it drops its locks before it leaves
    //   pg_stat_activity).
    // 'active' (`holder_state`, `record_backend_state`) means still in that
    // statement; pg_stat_activity is read once per transaction, so 'idle'
    // may be stale. Without pg_read_all_stats another role's backend_start
    // and state read NULL (`record_backend_checked` false), as every state
    // does with track_activities = off. Needing no privilege,
    // `record_writing`: the row's xmax still holds its transactionid lock,
    // so another session's update or row lock is uncommitted (a
    // MultiXactId matches none). pg_locks is read once, in `locks`.
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
