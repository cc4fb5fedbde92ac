/**
 * The public types of runlock's PostgreSQL backend: the options of
 * {@linkcode pgLocks}, the lock it hands out and what a probe reads.
 *
 * @module
 */

// deno-lint-ignore no-unused-vars
import type { pgLocks } from "./pg_locks.ts";

/**
 * Options for {@linkcode pgLocks}. Every field has a default; the
 * keepalive and heartbeat defaults make a holder whose host vanishes lose
 * the lock in about 10 to 20 seconds, and make `lock.signal` abort
 * (within 7 s) before the server can hand the lock to anyone else.
 *
 * @example Faster loss detection on a reliable network
 * ```ts
 * import { pgLocks, type PgLocksOptions } from "@runlock/runlock/postgres";
 *
 * const options: PgLocksOptions = {
 *   schema: "ops",
 *   keepalivesIdle: 5,
 *   keepalivesInterval: 1,
 *   keepalivesCount: 3,
 *   tcpUserTimeout: 6_000,
 *   heartbeatInterval: 1_000,
 *   heartbeatTimeout: 2_000,
 * };
 * await using _locks = pgLocks("postgres://app@db-host/app", options); // opens nothing
 * ```
 */
export interface PgLocksOptions {
  /**
   * The schema of the `runlock_locks` table, created on first use (with
   * the schema) when missing: 1 to 63 bytes in UTF-8, no control
   * characters. Each schema is its own namespace of lock names. Creating
   * the table needs CREATE on the schema (and on the database for a new
   * schema); `pgSetupSql` prints the SQL to run once instead. Default
   * `"public"`.
   */
  schema?: string;
  /**
   * Server setting `tcp_keepalives_idle` of lock sessions: seconds of
   * silence before the server probes the client's host. Default 10.
   */
  keepalivesIdle?: number;
  /** Server setting `tcp_keepalives_interval`, seconds. Default 3. */
  keepalivesInterval?: number;
  /** Server setting `tcp_keepalives_count`. Default 3. */
  keepalivesCount?: number;
  /**
   * Server setting `tcp_user_timeout`, milliseconds: how long data the
   * server sent may stay unacknowledged before it drops the connection.
   * Default 15000.
   */
  tcpUserTimeout?: number;
  /** Milliseconds between heartbeats of a held lock. Default 2000. */
  heartbeatInterval?: number;
  /**
   * Milliseconds a heartbeat may take before the session counts as lost
   * and `lock.signal` aborts. Default 5000. `heartbeatInterval +
   * heartbeatTimeout` must be less than both `keepalivesIdle` and
   * `tcpUserTimeout`, the earliest the server can declare us dead.
   */
  heartbeatTimeout?: number;
  /** Milliseconds to wait for a connection. Default 10000. */
  connectTimeout?: number;
  /**
   * Released lock sessions kept open (for 10 s) for the next acquire in
   * this process. Default 2; 0 closes each session on release.
   */
  maxIdleSessions?: number;
}

/**
 * Options for {@linkcode PgLocks.acquire}: the same as a file lock's, plus
 * `meta`.
 *
 * @example Waiting up to 30 s, or until shutdown
 * ```ts
 * import type { PgAcquireOptions } from "@runlock/runlock/postgres";
 *
 * const options: PgAcquireOptions = {
 *   timeout: 30_000,
 *   signal: AbortSignal.timeout(60_000),
 *   meta: { cmd: "sync", job: "nightly" },
 * };
 * ```
 */
export interface PgAcquireOptions {
  /**
   * How long to wait while another run holds the lock, in milliseconds.
   * `0` (the default) fails at once with {@linkcode HeldError};
   * `Infinity` waits for as long as it takes. The server hands the lock
   * over the moment its holder releases it or its session ends.
   */
  timeout?: number;
  /** Stops waiting: the promise rejects with the signal's reason. */
  signal?: AbortSignal;
  /**
   * Your fields in the record (keys `/^[a-z0-9_.-]{1,64}$/`, values one
   * line of text), shown by {@linkcode PgLocks.inspect}.
   */
  meta?: Record<string, string>;
}

/**
 * A lock held through a dedicated PostgreSQL session. It has the members
 * of a file lock, except the synchronous ones (`releaseSync`,
 * `Symbol.dispose`), which a network session cannot offer.
 *
 * While it is held, a heartbeat checks the session every few seconds. If
 * the session ends (server restart, `pg_terminate_backend`, network loss,
 * no heartbeat answer in time), {@linkcode PgLock.signal} aborts with a
 * {@linkcode LockLostError} at once: stop the work. With the default
 * settings it aborts before the server can hand the lock to anyone else,
 * as long as this process's event loop runs: a process that blocks it (or
 * is paused) longer than the server's keepalive time can learn late. That,
 * and work already in flight, is what {@linkcode PgLock.fence} is for:
 * another process may already hold the lock.
 *
 * @example Stopping the work when the lock is lost
 * ```ts
 * import { pgLocks } from "@runlock/runlock/postgres";
 * import assert from "node:assert/strict";
 *
 * const url = Deno.env.get("RUNLOCK_TEST_PG_URL") ?? "postgres://postgres@127.0.0.1/postgres";
 * await using locks = pgLocks(url);
 * await using lock = await locks.acquire("example/lock-members");
 * assert.equal(lock.path, "example/lock-members");
 * assert.equal(lock.pid, Deno.pid);
 * assert.equal(typeof lock.fence, "bigint");
 * assert.equal(lock.signal.aborted, false);
 * assert.equal(await lock.isOwned(), true);
 * // A long loop would check lock.signal, or pass it to fetch() and friends:
 * lock.signal.throwIfAborted();
 * ```
 */
export interface PgLock extends AsyncDisposable {
  /** The lock name, as passed to {@linkcode PgLocks.acquire}. */
  readonly path: string;
  /** The PID in the record: this process. */
  readonly pid: number;
  /** When the lock was taken (the server's clock). */
  readonly acquiredAt: Date;
  /** Whether {@linkcode PgLock.release} has run. */
  readonly released: boolean;
  /**
   * Aborted, with a {@linkcode LockLostError} as its reason, when the
   * lock's session is lost while held. Not aborted by a normal release.
   */
  readonly signal: AbortSignal;
  /**
   * The fencing token: strictly increasing per lock name, across hosts,
   * processes and server restarts. Pass it with every write to a store
   * that refuses tokens lower than the highest it has seen, so a holder
   * that lost its session cannot overwrite its successor's work.
   */
  readonly fence: bigint;
  /** The `meta` given to acquire (frozen). */
  readonly meta: Readonly<Record<string, string>>;
  /**
   * Whether this lock's session still holds the advisory lock (asks the
   * server: one round trip). `false` once released or lost.
   */
  isOwned(): Promise<boolean>;
  /**
   * Releases the lock and keeps the session for the next acquire.
   * Idempotent.
   *
   * @throws {LockLostError} once, if the session had been lost while the
   * lock was held (mutual exclusion was not guaranteed all along).
   */
  release(): Promise<void>;
}

/**
 * What {@linkcode PgLocks.inspect} found for a lock name. The fields of a
 * file lock's `Inspection`, plus the record's `meta`, `runtime` and
 * `fence`, and the holder's server process (`backendPid`).
 *
 * @example Reading an inspection
 * ```ts
 * import { pgLocks, type PgInspection } from "@runlock/runlock/postgres";
 * import assert from "node:assert/strict";
 *
 * const url = Deno.env.get("RUNLOCK_TEST_PG_URL") ?? "postgres://postgres@127.0.0.1/postgres";
 * await using locks = pgLocks(url);
 * await using lock = await locks.acquire("example/inspection", { meta: { cmd: "sync" } });
 * const info: PgInspection = await locks.inspect("example/inspection");
 * assert.equal(info.state, "held");
 * assert.equal(info.pid, Deno.pid);
 * assert.deepEqual(info.meta, { cmd: "sync" });
 * assert.equal(info.fence, lock.fence);
 * assert.equal(info.runtime, "deno");
 * ```
 */
export interface PgInspection {
  /** The lock name. */
  path: string;
  /**
   * - `free`: no record, or its holder released it.
   * - `held`: a live session holds the lock (its advisory lock is granted
   *   in `pg_locks`).
   * - `stale`: a record whose holder's session is gone (crashed, killed,
   *   evicted) without releasing; the next acquire takes over.
   * - `invalid`: the name's advisory key collides with another name's
   *   (see `reason`); acquire fails with {@linkcode KeyCollisionError}.
   */
  state: "free" | "held" | "stale" | "invalid";
  /** The holder's PID (held) or the last holder's (stale); else 0. */
  pid: number;
  /** The holder's host, or `""`. */
  host: string;
  /** When the holder took the lock. */
  started: Date | undefined;
  /**
   * `true` when the key is held by a database session that is not a
   * runlock holder (another application's advisory lock on the same
   * key); `pid` is then 0 and `reason` names the session.
   */
  foreign: boolean;
  /** For `invalid` and foreign holders: what was found. */
  reason: string | undefined;
  /** The holder's `meta` (held or stale), else `{}`. */
  meta: Record<string, string>;
  /** The holder's runtime (`deno`, `node`, `bun`), or `""`. */
  runtime: string;
  /** The last fence given out for this name, or undefined if never taken. */
  fence: bigint | undefined;
  /**
   * The server process of the session holding the lock (0 when none):
   * `SELECT pg_terminate_backend(backendPid)` evicts a hung holder.
   */
  backendPid: number;
}

/**
 * Locks and probes on one PostgreSQL database, from {@linkcode pgLocks}.
 *
 * @example A run lock across hosts
 * ```ts
 * import { pgLocks } from "@runlock/runlock/postgres";
 * import { HeldError } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const url = Deno.env.get("RUNLOCK_TEST_PG_URL") ?? "postgres://postgres@127.0.0.1/postgres";
 * await using locks = pgLocks(url);
 * await using _lock = await locks.acquire("example/locks");
 * assert.equal(await locks.held("example/locks"), true);
 * await using other = pgLocks(url); // as if on another host
 * await assert.rejects(other.acquire("example/locks"), HeldError);
 * ```
 */
export interface PgLocks extends AsyncDisposable {
  /**
   * Takes the lock `name` on a dedicated session (a released one of this
   * object's, or a new connection).
   *
   * @param name The lock name (1 to 1024 characters, no NUL).
   * @param options `timeout` (ms), `signal`, `meta`.
   * @returns The held {@linkcode PgLock}.
   * @throws {HeldError} a live run holds it (after `timeout`), with its
   * `pid` and `host`.
   * @throws {KeyCollisionError} another name uses the same advisory key.
   * @throws {RunlockError} the server cannot be reached or refuses.
   */
  acquire(name: string, options?: PgAcquireOptions): Promise<PgLock>;
  /**
   * Describes the lock without taking it (reads the table and
   * `pg_locks`; needs no write access).
   *
   * @param name The lock name.
   * @returns The state, holder, meta and fence.
   * @throws {RunlockError} the server cannot be reached or refuses.
   */
  inspect(name: string): Promise<PgInspection>;
  /**
   * Whether a live session holds the lock.
   *
   * @param name The lock name.
   * @returns `true` while held.
   * @throws {KeyCollisionError} the name collides with another.
   * @throws {RunlockError} the server cannot be reached or refuses.
   */
  held(name: string): Promise<boolean>;
  /**
   * The PID in the record, and whether that run holds the lock.
   *
   * @param name The lock name.
   * @returns `{ pid, alive }`; `{ pid: 0, alive: false }` when never taken.
   * @throws {KeyCollisionError} the name collides with another.
   * @throws {RunlockError} the server cannot be reached or refuses.
   */
  activePid(name: string): Promise<{ pid: number; alive: boolean }>;
  /**
   * Closes the probe session and the idle sessions. Held locks keep their
   * sessions until released (then those close too). Idempotent.
   */
  end(): Promise<void>;
}
