// Every statement the PostgreSQL backend sends, one named constant each.
// Values are always parameters ($1, $2, ...). The only text spliced in is
// the table's identifier, quoted by `quoteIdent` (identifiers cannot be
// parameters), once per pgLocks object.
//
// References (PostgreSQL 15 manual):
//   [advisory]  §9.27.10 Advisory Lock Functions
//   [explicit]  §13.3.5 Advisory Locks
//   [pglocks]   §54.12 pg_locks (advisory keys: classid = high half,
//               objid = low half, objsubid = 1 for a bigint key)
//   [upsert]    §13.2.1 Read Committed Isolation Level (INSERT ... ON
//               CONFLICT DO UPDATE), and INSERT, "ON CONFLICT Clause"
//   [with]      §7.8.4 Data-Modifying Statements in WITH
//   [cancel]    §55.2.8 Canceling Requests in Progress
//   [stats]     §28.2.3 pg_stat_activity (backend_xmin)

/** Double-quotes an identifier (`"a""b"`), for the one thing we cannot bind. */
export function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

/** The statements for one table, `schema.runlock_locks`. */
export interface Statements {
  table: string;
  ensureTable: string;
  ensureSchemaAndTable: string;
  tryAcquire: string;
  waitAcquire: string;
  release: string;
  unlockAll: string;
  inspect: string;
  owned: string;
  heartbeat: string;
}

/** The record's columns, in the order the acquire statements bind them. */
const COLUMNS =
  "name, key, fence, pid, host, started, runtime, meta, backend_pid";

// The upsert both acquire statements share. `fence` starts at 1 and grows
// by one on every acquisition, in the statement that writes the record, so
// a record and its fence are committed together. In READ COMMITTED an
// INSERT ... ON CONFLICT DO UPDATE updates the latest committed version of
// the conflicting row even when the statement's snapshot is older [upsert]:
// a waiter whose statement began before the previous holder's acquisition
// still reads that holder's fence. A conflict on `key` (another name with
// the same 64-bit key) is not covered by ON CONFLICT (name): it raises
// unique_violation (23505), which is how a key collision is detected.
const upsert = (table: string, source: string) =>
  `INSERT INTO ${table} AS r (${COLUMNS})
   SELECT $1, $2, 1, $3, $4, clock_timestamp(), $5, $6::jsonb, pg_backend_pid()
   FROM ${source}
   ON CONFLICT (name) DO UPDATE SET
     key = EXCLUDED.key, fence = r.fence + 1, pid = EXCLUDED.pid,
     host = EXCLUDED.host, started = EXCLUDED.started,
     runtime = EXCLUDED.runtime, meta = EXCLUDED.meta,
     backend_pid = EXCLUDED.backend_pid
   RETURNING fence::text AS fence, started`;

/** Builds the statements for the table `schema.runlock_locks`. */
export function statements(schema: string): Statements {
  const table = `${quoteIdent(schema)}.runlock_locks`;
  const ddl = (withSchema: boolean) =>
    `BEGIN;
      SELECT pg_advisory_xact_lock(1920298604, 1);
      ${withSchema ? `CREATE SCHEMA IF NOT EXISTS ${quoteIdent(schema)};` : ""}
      CREATE TABLE IF NOT EXISTS ${table} (
        name text PRIMARY KEY,
        key bigint NOT NULL UNIQUE,
        fence bigint NOT NULL,
        pid integer NOT NULL,
        host text NOT NULL,
        started timestamptz NOT NULL,
        runtime text NOT NULL,
        meta jsonb NOT NULL DEFAULT '{}',
        backend_pid integer
      );
      COMMIT`;
  return {
    table,

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

    // The fast path, one round trip: take the advisory lock without
    // waiting and, only if that worked, write the record. Zero rows means
    // someone holds the key. pg_try_advisory_lock is volatile, so the
    // MATERIALIZED CTE runs it exactly once, before the INSERT reads it.
    // $1 name, $2 key, $3 pid, $4 host, $5 runtime, $6 meta (json text).
    tryAcquire: `WITH got AS MATERIALIZED (
        SELECT pg_try_advisory_lock($2::bigint) AS ok
      ) ${upsert(table, "got WHERE got.ok")}`,

    // Waiting: block in pg_advisory_lock, so the server hands the lock over
    // the instant its holder's session releases it or ends (no polling),
    // then write the record in the same statement. lock_timeout ($7, ms)
    // bounds the wait; set_config(..., true) is local to this statement's
    // implicit transaction, so it is gone afterwards. A blocked statement
    // holds a snapshot, which holds back VACUUM's horizon cluster-wide
    // (pg_stat_activity.backend_xmin [stats]; seen here: a blocked
    // pg_advisory_lock shows a backend_xmin), so callers wait in slices of
    // a few seconds rather than for hours in one statement.
    waitAcquire: `WITH cfg AS MATERIALIZED (
        SELECT set_config('lock_timeout', $7::text, true)
      ), got AS MATERIALIZED (
        SELECT pg_advisory_lock($2::bigint) FROM cfg
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
    // $1 name, $2 fence.
    release: `WITH mark AS (
        UPDATE ${table} SET backend_pid = NULL
        WHERE name = $1 AND fence = $2::bigint AND backend_pid = pg_backend_pid()
        RETURNING 1
      ) SELECT pg_advisory_unlock_all(), (SELECT count(*) FROM mark)::int AS marked`,

    // After a failed acquire statement. Session-level advisory locks are
    // NOT released when the transaction that took them rolls back
    // [explicit]: if the lock was granted and the INSERT then failed (key
    // collision, lock_timeout on the row, cancel), the session still holds
    // it and must drop it before it is reused.
    unlockAll: `SELECT pg_advisory_unlock_all()`,

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
      FROM (SELECT $1::text AS name, $2::bigint AS key) q
      LEFT JOIN ${table} r ON r.name = q.name
      LEFT JOIN ${table} k ON k.key = q.key AND k.name <> q.name
      LEFT JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
        AND l.classid = $3::oid AND l.objid = $4::oid AND l.objsubid = 1
      LEFT JOIN pg_stat_activity a ON a.pid = l.pid
      LIMIT 1`,

    // lock.isOwned(): does this session still hold the key?
    // $1 classid, $2 objid.
    owned: `SELECT EXISTS (
        SELECT 1 FROM pg_locks
        WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()
          AND classid = $1::oid AND objid = $2::oid AND objsubid = 1
      ) AS owned`,

    // The heartbeat: the cheapest round trip. The lock can only go away
    // with the session (nothing else runs on it), so an answer proves it.
    heartbeat: `SELECT 1`,
  };
}
