/**
 * runlock on PostgreSQL: the same run lock for runs on several hosts, on
 * session-level advisory locks, with fencing tokens and loss detection.
 *
 * ```ts ignore
 * import { pgLocks } from "@runlock/runlock/postgres";
 *
 * const locks = pgLocks("postgres://app@db-host/app"); // opens nothing yet
 * await using lock = await locks.acquire("sync/main", { timeout: 30_000, meta: { cmd: "sync" } });
 * lock.fence;  // bigint, strictly increasing per name: pass it with every write
 * lock.signal; // aborted (reason: LockLostError) if the session is lost
 * await locks.inspect("sync/main"); // "free" | "held" | "stale" | "invalid", pid, host, meta, fence
 * await locks.scan({ prefix: "sync/" }); // every held or stale name, sorted
 * for await (const changes of locks.watch({ interval: 1_000 })) {} // started, released, crashed, ... by polling
 * ```
 *
 * A separate entry point, so that file-lock users never load a database
 * client. The errors are runlock's own ({@linkcode HeldError},
 * {@linkcode LockLostError}, {@linkcode RunlockError}), re-exported here,
 * plus {@linkcode KeyCollisionError} and {@linkcode PoolerError}.
 *
 * @module
 */

export { pgLocks } from "./pg_locks.ts";
export type {
  PgAcquireOptions,
  PgLock,
  PgLocks,
  PgLocksOptions,
} from "./types.ts";
export type {
  PgChange,
  PgChangeKind,
  PgInspection,
  PgScanOptions,
  PgWatchOptions,
} from "./_probe_types.ts";
export { KeyCollisionError, PoolerError } from "./errors.ts";
export { type PgSetupOptions, pgSetupSql } from "./_schema.ts";
export {
  ContendedError,
  HeldError,
  LockLostError,
  RunlockError,
} from "../errors.ts";
