// The server settings of runlock's sessions (docs/postgres.md, "Server
// settings").
//
// References (PostgreSQL 15 manual):
//   [options]   §55.7 Message Formats, StartupMessage "options" (spaces
//               separate arguments unless escaped with a backslash), as
//               libpq's PGOPTIONS (§20.1.4)
//   [guc]       PostgreSQL's src/include/utils/guc.h, enum GucSource: a
//               value from the client at connection start (PGC_S_CLIENT)
//               ranks above ALTER ROLE/DATABASE ... SET (PGC_S_USER,
//               PGC_S_DATABASE, PGC_S_DATABASE_USER), ALTER SYSTEM and
//               postgresql.conf (PGC_S_FILE); tested, one setting each,
//               in tests/postgres/settings_test.ts
//   [search]    §5.9.3 The Schema Search Path
//   [upsert]    §13.2.1 Read Committed Isolation Level

/**
 * The settings every session starts with, in the startup packet
 * ("options" [options]), where they win over role, database and server
 * settings [guc]. Each is pinned because a common setting breaks a
 * promise:
 *
 * - tcp_keepalives_*, tcp_user_timeout: the server drops a vanished
 *   client in seconds (§20.3.1), before our heartbeat gives up.
 * - statement_timeout, lock_timeout, idle_in_transaction_session_timeout,
 *   idle_session_timeout = 0: a wait is one long statement and an idle
 *   holder's session is the lock; none may be cut (our waits set
 *   lock_timeout per statement).
 * - synchronous_commit = on: the record and its fence are durable (WAL
 *   flushed, and replicated to synchronous standbys if any) before
 *   acquire returns. With `off` (a common tuning) a postmaster crash loses
 *   the last commits and the next holder gets a fence already handed out.
 * - default_transaction_isolation = 'read committed': the acquire
 *   statements rely on ON CONFLICT DO UPDATE reading the latest committed
 *   row [upsert]; under repeatable read or serializable every waiter
 *   fails at the hand-off with 40001.
 * - default_transaction_read_only = off: so that only a server that truly
 *   cannot write (a hot standby) refuses the record.
 * - search_path = pg_catalog, pg_temp: no user function, view or
 *   operator can stand in for a system one [search].
 * - DateStyle = ISO: the client parses timestamps only in ISO output; a
 *   role with 'SQL, DMY' or 'German' makes acquiredAt null.
 *
 * Values are written as the startup "options" string needs them (a
 * space escaped with a backslash): the session joins them as
 * `-c name=value`, unchanged.
 */
export function sessionSettings(o: {
  keepalivesIdle: number;
  keepalivesInterval: number;
  keepalivesCount: number;
  tcpUserTimeout: number;
}): Record<string, string> {
  return {
    tcp_keepalives_idle: String(o.keepalivesIdle),
    tcp_keepalives_interval: String(o.keepalivesInterval),
    tcp_keepalives_count: String(o.keepalivesCount),
    tcp_user_timeout: String(o.tcpUserTimeout),
    statement_timeout: "0",
    lock_timeout: "0",
    idle_in_transaction_session_timeout: "0",
    idle_session_timeout: "0",
    synchronous_commit: "on",
    default_transaction_isolation: optionValue("read committed"),
    default_transaction_read_only: "off",
    search_path: "pg_catalog,pg_temp",
    DateStyle: "ISO",
  };
}

/** A value for "options", escaped: it is split at whitespace [options]. */
export function optionValue(value: string): string {
  return value.replace(/[\\\s]/g, (c) => `\\${c}`);
}

/** The custom setting holding a lock session's nonce (_bind.ts). */
export const SESSION_SETTING = "runlock.session";
