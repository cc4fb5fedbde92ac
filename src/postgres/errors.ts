/**
 * The errors only the PostgreSQL backend throws. Everything else it
 * reports with runlock's own classes ({@linkcode HeldError},
 * {@linkcode LockLostError}, {@linkcode RunlockError}), so one `catch`
 * handles both backends.
 *
 * @module
 */

import { HeldError, LockLostError, RunlockError } from "../errors.ts";

/** Replaces an error's message, and the first line of its stack with it. */
function retitle<E extends Error>(err: E, message: string): E {
  const old = `${err.name}: ${err.message}`;
  err.message = message;
  if (typeof err.stack === "string" && err.stack.startsWith(old)) {
    err.stack = `${err.name}: ${message}${err.stack.slice(old.length)}`;
  }
  return err;
}

/**
 * Two lock names hash to the same 64-bit advisory key. runlock refuses
 * rather than let the two names share one lock. `other` is the name that
 * already uses the key. Astronomically rare by chance (SHA-256, 64 bits);
 * more likely another application takes advisory locks on runlock's keys.
 *
 * @example What the message says
 * ```ts
 * import { KeyCollisionError } from "@runlock/runlock/postgres";
 * import assert from "node:assert/strict";
 *
 * const err = new KeyCollisionError("sync/a", "sync/b", 42n);
 * assert.equal(err.path, "sync/a");
 * assert.equal(err.other, "sync/b");
 * assert.match(err.message, /same advisory key 42 as "sync\/b"/);
 * ```
 */
export class KeyCollisionError extends RunlockError {
  /** The name that already uses the key. */
  readonly other: string;
  /** The advisory key both names hash to. */
  readonly key: bigint;

  /**
   * Creates the error.
   *
   * @param name The lock name being taken or inspected.
   * @param other The name that already uses the key.
   * @param key The shared advisory key.
   * @param options `cause`, when there is one.
   */
  constructor(
    name: string,
    other: string,
    key: bigint,
    options?: ErrorOptions,
  ) {
    super(
      name,
      `${name}: has the same advisory key ${key} as ${
        JSON.stringify(other)
      }, so the two names cannot be locked separately; rename one of them ` +
        `(or delete the stale row of ${
          JSON.stringify(other)
        } from the runlock_locks table if it is no longer used)`,
      options,
    );
    this.name = "KeyCollisionError";
    this.other = other;
    this.key = key;
  }
}

/**
 * The lock's database session ended while the lock was held (server
 * restart, `pg_terminate_backend`, network loss, no heartbeat answer): the
 * server has released the lock or is about to. A {@linkcode LockLostError}.
 */
export class SessionLostError extends LockLostError {
  constructor(
    name: string,
    pid: number,
    what: string,
    fence: bigint,
    options?: ErrorOptions,
  ) {
    super(name, pid, what, options);
    retitle(
      this,
      `${name}: the database session holding the lock ${what} while pid ${pid} held it; ` +
        `another process may hold it now. Stop the work, and reject writes fenced ${fence} or lower`,
    );
  }
}

/**
 * The key is held by a database session that wrote no runlock record (not
 * a runlock holder: another application's advisory lock on the same key).
 * A {@linkcode HeldError} with `pid` 0.
 */
export class ForeignHolderError extends HeldError {
  constructor(name: string, backendPid: number, application: string) {
    super(name, 0, "");
    retitle(
      this,
      `${name}: the lock's advisory key is held by database session ${backendPid}` +
        `${
          application ? ` (application ${JSON.stringify(application)})` : ""
        }, ` +
        `which is not a runlock holder; find it in pg_stat_activity`,
    );
  }
}

/**
 * A connection that cannot hold a session-level advisory lock: a pooler in
 * transaction or statement mode, or a load balancer, sends one client's
 * statements to several server sessions (or several clients' to one).
 * Acquires through it are refused, never granted.
 *
 * @example What the message says
 * ```ts
 * import { PoolerError } from "@runlock/runlock/postgres";
 * import assert from "node:assert/strict";
 *
 * const err = new PoolerError("sync/main", "the test says so");
 * assert.equal(err.path, "sync/main");
 * assert.match(err.message, /session mode/);
 * ```
 */
export class PoolerError extends RunlockError {
  /**
   * Creates the error.
   *
   * @param name The lock name.
   * @param why What was seen, in a person's words.
   * @param options `cause`, when there is one.
   */
  constructor(name: string, why: string, options?: ErrorOptions) {
    super(
      name,
      `${name}: cannot hold a lock through this connection: ${why}. ` +
        `A PostgreSQL lock lives in one server session, and a pooler in ` +
        `transaction or statement mode (PgBouncer's pool_mode = transaction ` +
        `or statement) or a load balancer (pgpool-II's load_balance_mode) ` +
        `sends a client's statements to several: connect directly, or ` +
        `through a pooler in session mode (pool_mode = session)`,
      options,
    );
    this.name = "PoolerError";
  }
}
