/**
 * The public types of runlock's PostgreSQL backend: the options of
 * {@linkcode pgLocks}, the lock it hands out and the object's methods
 * (what a probe reads is in _probe_types.ts).
 *
 * @module
 */

import type { HeldLock, Locks } from "../contract.ts";
import type {
  PgChange,
  PgInspection,
  PgScanOptions,
  PgWatchOptions,
} from "./_probe_types.ts";

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
  /**
   * Server setting `idle_session_timeout` of lock sessions, milliseconds;
   * 0 (the default) leaves it off. Behind a TCP proxy (HAProxy, a cloud
   * load balancer) the server's keepalives reach the proxy, not the
   * client: a holder whose host vanished keeps its lock until the proxy's
   * own timeout ends the server's session (HAProxy's `timeout client`,
   * often 30 minutes). With this set, the server ends a lock session that
   * sent nothing for that long, and a live holder's heartbeat (every
   * `heartbeatInterval`) keeps it going. It must be above `heartbeatInterval
   * + heartbeatTimeout`, so that the holder's `lock.signal` aborts first.
   * The price: a holder stopped for that long (SIGSTOP, a debugger) loses
   * its lock, as it would not on a direct connection.
   */
  idleSessionTimeout?: number;
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
export interface PgLock extends HeldLock {
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
export interface PgLocks extends Locks<PgLock, PgInspection>, AsyncDisposable {
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
   * The {@linkcode PgInspection} of every lock name in the table that is
   * held or stale, sorted by name (by UTF-16 code units, whatever the
   * database's collation), in one statement on the probe session (the
   * records and `pg_locks` read as {@linkcode PgLocks.inspect} reads
   * them). Names never taken or released cleanly (state free) are not
   * listed, as `scan()` of files lists no free lock. Never takes a lock,
   * writes nothing, creates no table (`[]` without one); needs SELECT on
   * the table only. A name read half way through an acquire or a release
   * is read again (about 15 ms at most).
   *
   * @param options `prefix` (literal: `%` and `_` are not wildcards) and
   * `signal`.
   * @returns The inspections, sorted by name.
   * @throws {TypeError} `options` is not an object, `prefix` is not a
   * string of at most 1024 characters without NUL or a lone UTF-16
   * surrogate, or `signal` is not an AbortSignal.
   * @throws {RunlockError} the server cannot be reached or refuses, or
   * end() was called (also while the scan was in flight).
   *
   * @example Which runs are alive, and which crashed
   * ```ts
   * import { pgLocks } from "@runlock/runlock/postgres";
   * import assert from "node:assert/strict";
   *
   * const url = Deno.env.get("RUNLOCK_TEST_PG_URL") ?? "postgres://postgres@127.0.0.1/postgres";
   * await using locks = pgLocks(url);
   * const prefix = `example/scan/${Deno.pid}/`;
   * await using _a = await locks.acquire(`${prefix}sync`, { meta: { cmd: "sync" } });
   * const b = await locks.acquire(`${prefix}gc`);
   * await b.release(); // released: free, not listed
   * const found = await locks.scan({ prefix });
   * assert.deepEqual(found.map((i) => [i.path, i.state]), [[`${prefix}sync`, "held"]]);
   * assert.equal(found[0].meta.cmd, "sync");
   * ```
   */
  scan(options?: PgScanOptions): Promise<PgInspection[]>;
  /**
   * Watches the lock names (those starting with `prefix`) by polling: one
   * scan every `interval` ms on a session of the watch's own, compared
   * with the last. PostgreSQL notifies nobody of an advisory lock taken or
   * dropped, so a change is seen within an interval (plus a query), and a
   * run that starts and ends between two polls is not seen (the fence
   * counts every acquisition). The first batch is the current state (one
   * `present` per name {@linkcode PgLocks.scan} lists; maybe `[]`), each
   * later batch the changes one poll found, sorted by name, one per name
   * (see {@linkcode PgChangeKind}); polls that find nothing yield nothing.
   * No change is reported that a probe a moment later would contradict:
   * an acquire or a release still committing (its commit may wait for a
   * WAL flush or a synchronous standby) is reported once it has committed,
   * and a read that could be half of one counts only when a second read
   * agrees. A write of a record still committing is told from
   * `pg_locks` alone (the row version read has an xmax whose transaction
   * still holds its lock), so this holds without `pg_read_all_stats` and
   * with `track_activities = off`. What remains: a record row-locked by
   * several sessions at once (its xmax a MultiXactId) is told only from
   * `pg_stat_activity`; and a holder first seen without its record (a
   * foreign session) whose record then appears is reported `started`
   * again, with the run's pid and fence.
   *
   * A server restart or a dropped connection does not end it: the next
   * poll opens a new session and reports what changed meanwhile (after a
   * restart, every holder `crashed`: a restart ends every session). After
   * 30 s without a poll that succeeded (a refused connection, a server
   * at its connection limit, 53300, counting as one that may pass), and
   * at once for the first poll or any other error (a missing privilege),
   * the iteration throws a {@linkcode RunlockError}.
   *
   * The `signal` ends the iteration (it returns, without an error) and
   * closes the session; so do leaving a `for await` loop (`break`,
   * `return`, a throw), the iterator's `return()` (also while a `next()`
   * waits: both resolve at once, done) and {@linkcode PgLocks.end}.
   *
   * @param options `prefix`, `interval` (ms, default 1000), `signal`.
   * @returns Batches of changes, the first the current state.
   * @throws {TypeError} at once (before any query): `options` is not an
   * object, `interval` is not a positive finite number, `prefix` not a
   * string of at most 1024 characters without NUL or a lone UTF-16
   * surrogate, `signal` not an AbortSignal.
   * @throws {RunlockError} while iterating, as said above.
   *
   * @example Seeing a run start and end
   * ```ts
   * import { type PgLock, pgLocks } from "@runlock/runlock/postgres";
   * import assert from "node:assert/strict";
   *
   * const url = Deno.env.get("RUNLOCK_TEST_PG_URL") ?? "postgres://postgres@127.0.0.1/postgres";
   * await using locks = pgLocks(url);
   * const prefix = `example/watch/${Deno.pid}/`;
   * const seen: string[] = [];
   * let lock: PgLock | undefined;
   * for await (const batch of locks.watch({ prefix, interval: 50 })) {
   *   seen.push(...batch.map((c) => `${c.kind} ${c.path.slice(prefix.length)}`));
   *   if (lock === undefined) lock = await locks.acquire(`${prefix}sync`); // after the first batch, []
   *   else if (!lock.released) await lock.release(); // after "started sync"
   *   else break; // after "released sync"; leaving the loop closes the watch's session
   * }
   * assert.deepEqual(seen, ["started sync", "released sync"]);
   * ```
   */
  watch(options?: PgWatchOptions): AsyncIterable<PgChange[]>;
  /**
   * Closes the probe session and the idle sessions, and ends every watch
   * of this object (each iteration returns, done, and closes its
   * session) and every scan in flight (it rejects with a RunlockError).
   * Held locks keep their sessions until released (then those close
   * too). Idempotent.
   */
  end(): Promise<void>;
}
