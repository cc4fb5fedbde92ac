/**
 * Run locks on PostgreSQL session-level advisory locks: {@linkcode pgLocks}
 * and the {@linkcode PgLock} it hands out.
 *
 * @module
 */

import { hostname } from "node:os";
import process from "node:process";
import { clearInterval, setInterval, setTimeout } from "node:timers";
import { ContendedError, HeldError, RunlockError } from "../errors.ts";
import { checkMeta } from "../meta.ts";
import { granted } from "./_deno.ts";
import { keyOf, lockTagOf } from "./_key.ts";
import {
  describe,
  isSessionError,
  Session,
  type SessionConfig,
  sqlState,
} from "./_session.ts";
import { type Statements, statements } from "./_sql.ts";
import {
  ForeignHolderError,
  KeyCollisionError,
  SessionLostError,
} from "./errors.ts";

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
   * the schema) when missing. Default `"public"`.
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

const DEFAULTS = {
  schema: "public",
  keepalivesIdle: 10,
  keepalivesInterval: 3,
  keepalivesCount: 3,
  tcpUserTimeout: 15_000,
  heartbeatInterval: 2_000,
  heartbeatTimeout: 5_000,
  connectTimeout: 10_000,
  maxIdleSessions: 2,
};

/** A blocked wait holds a snapshot (and VACUUM's horizon): wait in slices. */
const WAIT_SLICE_MS = 5_000;
/** Released sessions close after this long unused. */
const IDLE_MS = 10_000;
/** Attempts when the lock keeps changing hands between our statements. */
const MAX_SPINS = 16;
/** The heartbeat's deadline gets one more event-loop turn (see Session). */
const HEARTBEAT_GRACE_MS = 25;

const runtime: string = "Deno" in globalThis
  ? "deno"
  : "Bun" in globalThis
  ? "bun"
  : "node";

let cachedHost: string | undefined;
function hostName(): string {
  if (cachedHost === undefined) {
    try {
      // Deno without --allow-sys=hostname records no host (no prompt).
      cachedHost = granted({ name: "sys", kind: "hostname" }) ? hostname() : "";
    } catch {
      cachedHost = "";
    }
  }
  return cachedHost;
}

/** What the caller's URL says, for messages (never the password). */
interface Target {
  /** `host:port, database "db", user "u"`. */
  text: string;
  /** `host:port/database`: which locks a name means. */
  where: string;
  host: string;
  port: string;
  password: string;
}

function parseUrl(url: unknown): Target {
  let u: URL;
  try {
    if (typeof url !== "string") throw new TypeError("not a string");
    u = new URL(url);
  } catch {
    throw new TypeError(
      `Cannot create pgLocks as 'url' must be a postgres:// URL: current value is ${
        typeof url === "string" ? JSON.stringify(redact(url)) : String(url)
      }`,
    );
  }
  if (u.protocol !== "postgres:" && u.protocol !== "postgresql:") {
    throw new TypeError(
      `Cannot create pgLocks as 'url' must start with postgres:// or postgresql://: current value is ${
        JSON.stringify(redact(url as string))
      }`,
    );
  }
  // A bad percent-escape (a literal `%` in a password) is the caller's
  // input: a TypeError now, naming the part, never the password itself.
  const decode = (part: string, what: string): string => {
    try {
      return decodeURIComponent(part);
    } catch {
      throw new TypeError(
        `Cannot create pgLocks as the ${what} in 'url' has a bad percent-escape (write a literal % as %25): current value is ${
          JSON.stringify(redact(url as string))
        }`,
      );
    }
  };
  const password = decode(u.password, "password");
  const host = u.searchParams.get("host") ?? (u.hostname || "localhost");
  const port = u.searchParams.get("port") ?? (u.port || "5432");
  const env = granted({ name: "env" })
    ? process.env
    : {} as Record<string, string | undefined>;
  const user = decode(u.username, "user name") || env.PGUSER || env.USER ||
    "";
  const database = decode(u.pathname.replace(/^\//, ""), "database name") ||
    user;
  return {
    text: `${host}:${port}, database ${JSON.stringify(database)}, user ${
      JSON.stringify(user)
    }`,
    where: `${host}:${port}/${database}`,
    host,
    port,
    password,
  };
}

/**
 * The locks this process holds through any pgLocks object, by server,
 * database, schema and name, with when each was taken. Locks are not
 * reentrant (as file locks): acquiring one this process holds fails at
 * once with HeldError (byThisProcess) instead of waiting on itself.
 */
const heldHere = new Map<string, Date>();

/** The URL with its password replaced by `***`, for messages. */
function redact(url: string): string {
  return url.replace(/^([a-z]+:\/\/[^:@/]*:)[^@/]*@/i, "$1***@");
}

function checkName(name: unknown, action: string): string {
  if (
    typeof name !== "string" || name === "" || name.length > 1024 ||
    name.includes("\0")
  ) {
    throw new TypeError(
      `Cannot ${action} as 'name' must be a string of 1 to 1024 characters without NUL: current value is ${
        typeof name === "string" && name.length > 80
          ? `a string of ${name.length} characters`
          : JSON.stringify(name)
      }`,
    );
  }
  return name;
}

function checkTimeout(timeout: unknown): number {
  const value = timeout ?? 0;
  if (typeof value !== "number" || Number.isNaN(value) || value < 0) {
    throw new RangeError(
      `Cannot acquire the lock as 'timeout' must be a non-negative number of milliseconds: current value is ${
        String(value)
      }`,
    );
  }
  return value;
}

function checkOptions(
  options: PgLocksOptions | undefined,
): typeof DEFAULTS {
  const o = { ...DEFAULTS };
  for (const [k, v] of Object.entries(options ?? {})) {
    if (v === undefined) continue;
    if (!(k in DEFAULTS)) {
      throw new TypeError(`Cannot create pgLocks: unknown option '${k}'`);
    }
    (o as Record<string, unknown>)[k] = v;
  }
  if (
    typeof o.schema !== "string" || o.schema === "" ||
    o.schema.length > 63 || o.schema.includes("\0")
  ) {
    throw new TypeError(
      `Cannot create pgLocks as 'schema' must be a name of 1 to 63 characters: current value is ${
        JSON.stringify(o.schema)
      }`,
    );
  }
  for (
    const k of [
      "keepalivesIdle",
      "keepalivesInterval",
      "keepalivesCount",
      "tcpUserTimeout",
      "heartbeatInterval",
      "heartbeatTimeout",
      "connectTimeout",
    ] as const
  ) {
    const v = o[k];
    if (!Number.isInteger(v) || v < 1 || v > 2_147_483_647) {
      throw new RangeError(
        `Cannot create pgLocks as '${k}' must be a positive integer: current value is ${
          String(v)
        }`,
      );
    }
  }
  if (!Number.isInteger(o.maxIdleSessions) || o.maxIdleSessions < 0) {
    throw new RangeError(
      `Cannot create pgLocks as 'maxIdleSessions' must be a non-negative integer: current value is ${
        String(o.maxIdleSessions)
      }`,
    );
  }
  // The client must notice a broken path before the server can: the
  // server drops a silent client no earlier than keepalivesIdle after the
  // last packet (nothing is probed before), or tcpUserTimeout after data
  // it sent went unacknowledged; we notice within interval + timeout
  // (+ one event-loop turn) of the last answer.
  const serverEarliest = Math.min(o.keepalivesIdle * 1000, o.tcpUserTimeout);
  const ours = o.heartbeatInterval + o.heartbeatTimeout + HEARTBEAT_GRACE_MS;
  if (ours >= serverEarliest) {
    throw new RangeError(
      `Cannot create pgLocks as 'heartbeatInterval' + 'heartbeatTimeout' (${
        o.heartbeatInterval + o.heartbeatTimeout
      } ms) must be less than the server's earliest detection of a dead client, ` +
        `min('keepalivesIdle', 'tcpUserTimeout') = ${serverEarliest} ms: ` +
        `otherwise lock.signal could abort after another process took the lock`,
    );
  }
  return o;
}

interface Found {
  info: PgInspection;
  /** Another name with the same key (a collision), if any. */
  other: string | undefined;
}

class PgLockImpl implements PgLock {
  readonly path: string;
  readonly pid: number = process.pid;
  readonly acquiredAt: Date;
  readonly fence: bigint;
  readonly meta: Readonly<Record<string, string>>;
  readonly #controller = new AbortController();
  readonly #owner: PgLocksImpl;
  readonly #session: Session;
  readonly #tag: { classid: string; objid: string };
  readonly #here: string;
  #released = false;

  constructor(
    owner: PgLocksImpl,
    session: Session,
    name: string,
    row: Record<string, unknown>,
    meta: Record<string, string>,
    tag: { classid: string; objid: string },
    here: string,
  ) {
    this.#owner = owner;
    this.#here = here;
    this.#session = session;
    this.path = name;
    this.fence = BigInt(row.fence as string);
    this.acquiredAt = row.started as Date;
    this.meta = Object.freeze({ ...meta });
    this.#tag = tag;
    heldHere.set(here, this.acquiredAt);
    const lose = (what: string) => {
      heldHere.delete(here);
      this.#controller.abort(
        new SessionLostError(name, this.pid, what, this.fence),
      );
    };
    session.onLost = lose;
    owner.startHeartbeat(session);
  }

  get released(): boolean {
    return this.#released;
  }

  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  async isOwned(): Promise<boolean> {
    if (this.#released || this.#session.lost !== undefined) return false;
    try {
      const rows = await this.#session.query(
        this.#owner.sql.owned,
        [this.#tag.classid, this.#tag.objid],
        "runlock_owned",
        false,
        this.#owner.statementTimeout,
      );
      return rows[0]?.owned === true;
    } catch {
      return false;
    }
  }

  async release(): Promise<void> {
    if (this.#released) return;
    this.#released = true;
    heldHere.delete(this.#here);
    const session = this.#session;
    session.stopHeartbeat();
    session.onLost = undefined;
    if (this.#controller.signal.aborted) {
      session.destroy();
      throw this.#controller.signal.reason;
    }
    try {
      await session.query(
        this.#owner.sql.release,
        [this.path, String(this.fence)],
        "runlock_release",
        false,
        this.#owner.statementTimeout,
      );
    } catch (err) {
      session.destroy();
      if (isSessionError(err)) {
        // The session died before or during the release: the lock went
        // with it, possibly before we stopped working.
        const lost = new SessionLostError(
          this.path,
          this.pid,
          `ended: ${describe(err)}`,
          this.fence,
          { cause: err },
        );
        this.#controller.abort(lost);
        throw lost;
      }
      throw this.#owner.refused(this.path, "release the lock", err);
    }
    this.#owner.giveBack(session);
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.release();
  }
}

class PgLocksImpl implements PgLocks {
  readonly sql: Statements;
  readonly #schema: string;
  readonly #options: typeof DEFAULTS;
  readonly #config: SessionConfig;
  readonly #target: Target;
  /** Released sessions, newest last, with when they were released. */
  readonly #idle: { session: Session; since: number }[] = [];
  #sweeper: ReturnType<typeof setInterval> | undefined;
  #table: Promise<void> | undefined;
  #tableReady = false;
  #probe: Promise<Session> | undefined;
  #ended = false;

  constructor(url: string, options: PgLocksOptions | undefined) {
    this.#target = parseUrl(url);
    this.#options = checkOptions(options);
    this.#schema = this.#options.schema;
    this.sql = statements(this.#schema);
    const o = this.#options;
    this.#config = {
      url,
      connectTimeout: o.connectTimeout,
      // Startup-packet settings ("options", as libpq's PGOPTIONS; PostgreSQL
      // manual §20.1.4 "Parameter Interaction via the Shell"): per session,
      // no server change, and they win over ALTER ROLE/DATABASE ... SET
      // (tested: a database with statement_timeout and
      // idle_session_timeout set neither cuts a wait nor ends an idle
      // holder). Keepalives and tcp_user_timeout make the server drop a
      // vanished client in seconds (§20.3.1 "Connection Settings"). No
      // statement_timeout (a wait is one long statement), no lock_timeout
      // outside our waits, and no idle_session_timeout (PostgreSQL 14+):
      // an idle holder's session is the lock.
      settings: {
        tcp_keepalives_idle: String(o.keepalivesIdle),
        tcp_keepalives_interval: String(o.keepalivesInterval),
        tcp_keepalives_count: String(o.keepalivesCount),
        tcp_user_timeout: String(o.tcpUserTimeout),
        statement_timeout: "0",
        lock_timeout: "0",
        idle_in_transaction_session_timeout: "0",
        idle_session_timeout: "0",
      },
    };
  }

  /** Milliseconds a short statement may take before its session counts as dead. */
  get statementTimeout(): number {
    return this.#options.connectTimeout;
  }

  startHeartbeat(session: Session): void {
    session.startHeartbeat(
      this.sql.heartbeat,
      this.#options.heartbeatInterval,
      this.#options.heartbeatTimeout,
    );
  }

  #hereKey(name: string): string {
    return `${this.#target.where}\0${this.#schema}\0${name}`;
  }

  /** A RunlockError for a statement the server refused. */
  refused(name: string, action: string, err: unknown): RunlockError {
    if (err instanceof RunlockError) return err;
    const how = isSessionError(err)
      ? "lost the connection to"
      : "got an error from";
    return new RunlockError(
      name,
      this.#scrub(
        `${name}: cannot ${action}: ${how} PostgreSQL at ${this.#target.text}: ${
          describe(err)
        }`,
      ),
      { cause: err },
    );
  }

  #scrub(text: string): string {
    const pw = this.#target.password;
    return pw.length >= 3 ? text.replaceAll(pw, "***") : text;
  }

  #connectError(name: string, err: unknown): RunlockError {
    const code = (err as { code?: unknown } | null)?.code;
    const message = describe(err);
    const reason = code === "ECONNREFUSED"
      ? "connection refused (is the server running, and listening there?)"
      : code === "ENOTFOUND" || code === "EAI_AGAIN"
      ? "the host name does not resolve"
      : /timeout/i.test(message)
      ? `no answer within ${this.#options.connectTimeout} ms`
      : code === "28P01"
      ? "password authentication failed (check the password in the URL)"
      : /unrecognized configuration parameter "idle_session_timeout"/.test(
          message,
        )
      ? "the server is older than PostgreSQL 14, which runlock needs"
      : message;
    return new RunlockError(
      name,
      this.#scrub(
        `${name}: cannot connect to PostgreSQL at ${this.#target.text}: ${reason}`,
      ),
      { cause: err },
    );
  }

  async #connect(name: string, signal?: AbortSignal): Promise<Session> {
    if (this.#ended) {
      throw new RunlockError(
        name,
        `${name}: cannot use this pgLocks object: end() was called`,
      );
    }
    // Under Deno, a missing grant is an error naming the flag, not a
    // prompt: the client reads PG* variables (PGPASSWORD, PGUSER, ...).
    const { host, port } = this.#target;
    const missing = !granted({ name: "env" })
      ? "--allow-env (the PostgreSQL client reads PG* variables)"
      : !host.startsWith("/") &&
          !granted({ name: "net", host: `${host}:${port}` })
      ? `--allow-net=${host}:${port}`
      : undefined;
    if (missing !== undefined) {
      throw new RunlockError(
        name,
        `${name}: cannot connect to PostgreSQL at ${this.#target.text}: permission denied; grant ${missing}`,
      );
    }
    try {
      return await Session.open(this.#config, signal);
    } catch (err) {
      signal?.throwIfAborted();
      throw this.#connectError(name, err);
    }
  }

  /** A released session of ours, or a new one. */
  async #take(
    name: string,
    signal?: AbortSignal,
  ): Promise<{ session: Session; reused: boolean }> {
    while (this.#idle.length > 0) {
      const { session } = this.#idle.pop()!;
      if (session.lost === undefined) return { session, reused: true };
    }
    return { session: await this.#connect(name, signal), reused: false };
  }

  /** Keeps a released session for the next acquire, or closes it. */
  giveBack(session: Session): void {
    if (
      this.#ended || session.lost !== undefined ||
      this.#idle.length >= this.#options.maxIdleSessions
    ) {
      void session.close();
      return;
    }
    this.#idle.push({ session, since: performance.now() });
    // One unreferenced sweeper closes sessions unused for IDLE_MS (cheaper
    // on the hot path than a timer per release).
    this.#sweeper ??= setInterval(() => this.#sweep(), IDLE_MS / 2);
    this.#sweeper.unref();
  }

  #sweep(): void {
    const old = performance.now() - IDLE_MS;
    while (this.#idle.length > 0 && this.#idle[0].since < old) {
      void this.#idle.shift()!.session.close();
    }
    if (this.#idle.length === 0) {
      clearInterval(this.#sweeper);
      this.#sweeper = undefined;
    }
  }

  /** Creates the schema and table once per object, if missing. */
  #ensureTable(session: Session): Promise<void> | undefined {
    if (this.#tableReady) return undefined;
    this.#table ??= (async () => {
      const rows = await session.query(
        `SELECT to_regnamespace($1) IS NOT NULL AS schema, to_regclass($2) IS NOT NULL AS table`,
        [`"${this.#schema.replaceAll('"', '""')}"`, this.sql.table],
        undefined,
        false,
        this.statementTimeout,
      );
      if (rows[0].table === true) return;
      try {
        // DDL may wait for a concurrent creator's transaction: more time.
        await session.query(
          rows[0].schema === true
            ? this.sql.ensureTable
            : this.sql.ensureSchemaAndTable,
          [],
          undefined,
          false,
          3 * this.statementTimeout,
        );
      } catch (err) {
        // A multi-statement string stops at the error, inside BEGIN.
        await session.query("ROLLBACK").catch(() => {});
        throw err;
      }
    })();
    return this.#table.then(() => {
      this.#tableReady = true;
    }, (err) => {
      this.#table = undefined;
      throw err;
    });
  }

  async acquire(name: string, options?: PgAcquireOptions): Promise<PgLock> {
    checkName(name, "acquire the lock");
    const timeout = checkTimeout(options?.timeout);
    const meta = checkMeta(options?.meta);
    const signal = options?.signal;
    signal?.throwIfAborted();
    const since = heldHere.get(this.#hereKey(name));
    if (since !== undefined) {
      // Waiting would wait on ourselves.
      throw new HeldError(name, process.pid, hostName(), {
        started: since,
        byThisProcess: true,
      });
    }
    const deadline = performance.now() + timeout;
    const key = keyOf(name);
    const tag = lockTagOf(key);
    const params = [
      name,
      String(key),
      process.pid,
      hostName(),
      runtime,
      JSON.stringify(meta),
    ];
    for (let attempt = 0;; attempt++) {
      const { session, reused } = await this.#take(name, signal);
      try {
        return await this.#acquireOn(
          session,
          name,
          key,
          tag,
          params,
          meta,
          deadline,
          signal,
        );
      } catch (err) {
        if (session.lost === undefined) this.giveBack(session);
        else session.destroy();
        // A kept session may have died while idle (server restart): that
        // says nothing about the lock, so try once more on a new one.
        if (reused && attempt === 0 && session.lost !== undefined) {
          if (!(err instanceof HeldError) && !signal?.aborted) continue;
        }
        if (signal?.aborted && !(err instanceof RunlockError)) {
          throw signal.reason;
        }
        throw this.refused(name, "acquire the lock", err);
      }
    }
  }

  async #acquireOn(
    session: Session,
    name: string,
    key: bigint,
    tag: { classid: string; objid: string },
    params: unknown[],
    meta: Record<string, string>,
    deadline: number,
    signal: AbortSignal | undefined,
  ): Promise<PgLock> {
    if (!this.#tableReady) await this.#ensureTable(session);
    for (let spins = 0;;) {
      signal?.throwIfAborted();
      const rows = await this.#attempt(
        session,
        name,
        key,
        this.sql.tryAcquire,
        params,
        "runlock_try",
      );
      if (rows.length > 0) {
        return this.#lockOn(session, name, rows[0], meta, tag);
      }
      const found = await this.#find(session, name, key, tag);
      if (found.other !== undefined && found.info.state === "invalid") {
        throw new KeyCollisionError(name, found.other, key);
      }
      if (found.info.state !== "held") {
        // It was released between our two statements: try again.
        if (++spins >= MAX_SPINS) throw new ContendedError(name, spins);
        continue;
      }
      const remaining = deadline - performance.now();
      if (remaining <= 0) throw heldError(name, found.info);
      const since = heldHere.get(this.#hereKey(name));
      if (since !== undefined) {
        // Another acquire in this process won meanwhile: do not wait on it.
        throw new HeldError(name, process.pid, hostName(), {
          started: since,
          byThisProcess: true,
        });
      }
      const waited = await this.#wait(
        session,
        name,
        key,
        [...params, String(Math.ceil(Math.min(remaining, WAIT_SLICE_MS)))],
        signal,
      );
      if (waited !== undefined) {
        return this.#lockOn(session, name, waited, meta, tag);
      }
    }
  }

  /**
   * The lock for a successful acquire statement. If the session ended
   * after the server answered and before we got here (a restart, a
   * termination), the lock is already gone: say so instead of returning a
   * lock whose signal is aborted before anyone could listen to it.
   */
  #lockOn(
    session: Session,
    name: string,
    row: Record<string, unknown>,
    meta: Record<string, string>,
    tag: { classid: string; objid: string },
  ): PgLock {
    if (session.lost !== undefined) {
      throw new Error(
        `the session ${session.lost} right after taking the lock`,
      );
    }
    return new PgLockImpl(
      this,
      session,
      name,
      row,
      meta,
      tag,
      this.#hereKey(name),
    );
  }

  /**
   * Runs an acquire statement. After any failure, drops whatever advisory
   * lock the failed statement took: session-level advisory locks survive
   * the rollback of the statement that took them (PostgreSQL manual
   * §13.3.5), so a collision or a lock_timeout on the row after the lock
   * was granted would otherwise leave this session holding it.
   */
  async #attempt(
    session: Session,
    name: string,
    key: bigint,
    text: string,
    params: unknown[],
    statement: string,
    timeout = this.statementTimeout,
  ): Promise<Record<string, unknown>[]> {
    try {
      return await session.query(text, params, statement, false, timeout);
    } catch (err) {
      if (session.lost !== undefined) throw err;
      await session.query(
        this.sql.unlockAll,
        [],
        "runlock_unlock_all",
        false,
        this.statementTimeout,
      );
      if (sqlState(err) === "23505") {
        // unique_violation on `key`: another name's row has our key.
        const found = await this.#find(session, name, key, lockTagOf(key));
        throw new KeyCollisionError(name, found.other ?? "(unknown)", key, {
          cause: err,
        });
      }
      throw err;
    }
  }

  /**
   * One slice of waiting in pg_advisory_lock. Returns the record row when
   * the lock was taken, undefined when the slice ran out (lock_timeout).
   * An abort cancels the statement (CancelRequest); the session is then
   * closed, never reused, so a late cancel cannot hit a later statement.
   */
  async #wait(
    session: Session,
    name: string,
    key: bigint,
    params: unknown[],
    signal: AbortSignal | undefined,
  ): Promise<Record<string, unknown> | undefined> {
    let canceled: Promise<void> | undefined;
    const abort = () => canceled = session.cancel();
    signal?.addEventListener("abort", abort, { once: true });
    let rows: Record<string, unknown>[] | undefined;
    let failure: unknown;
    try {
      // The server answers by the end of the slice (lock_timeout); no
      // answer by then plus a heartbeat timeout means it is unreachable.
      rows = await this.#attempt(
        session,
        name,
        key,
        this.sql.waitAcquire,
        params,
        "runlock_wait",
        Number(params[6]) + this.#options.heartbeatTimeout,
      );
    } catch (err) {
      failure = err;
    } finally {
      signal?.removeEventListener("abort", abort);
    }
    if (canceled !== undefined) {
      await canceled;
      if (rows !== undefined && rows.length > 0) {
        // The lock was granted just before the cancel took effect.
        await session.query(
          this.sql.release,
          [name, rows[0].fence],
          "runlock_release",
        ).catch(() => {});
      }
      session.destroy("was closed after a canceled wait");
      throw signal!.reason;
    }
    if (failure !== undefined) {
      if (sqlState(failure) === "55P03") return undefined; // lock_not_available
      throw failure;
    }
    return rows!.length > 0 ? rows![0] : undefined;
  }

  /**
   * Reads the record and pg_locks for a name. A key held by a session
   * whose record we cannot see may be a holder whose acquire committed
   * between our reads of pg_locks and of the table (they are not one
   * snapshot): read again, briefly, before calling it foreign.
   */
  async #find(
    session: Session,
    name: string,
    key: bigint,
    tag: { classid: string; objid: string },
  ): Promise<Found> {
    let found: Found | undefined;
    for (let i = 0; i < 4; i++) {
      if (i > 0) await new Promise((r) => setTimeout(r, 2 * i));
      const rows = await session.query(
        this.sql.inspect,
        [name, String(key), tag.classid, tag.objid],
        "runlock_inspect",
        false,
        this.statementTimeout,
      );
      found = interpret(name, key, rows[0]);
      if (!found.info.foreign) break;
    }
    return found!;
  }

  /**
   * The shared probe session, connected on first use and replaced once
   * when it died (concurrent probes share the replacement, so none leaks
   * past end()).
   */
  async #probeSession(name: string): Promise<Session> {
    const current = this.#probe;
    if (current !== undefined) {
      const session = await current.catch(() => undefined);
      if (session !== undefined && session.lost === undefined) return session;
      if (this.#probe !== current && this.#probe !== undefined) {
        return await this.#probeSession(name); // another probe replaced it
      }
    }
    const next = this.#connect(name);
    this.#probe = next;
    next.catch(() => {
      if (this.#probe === next) this.#probe = undefined;
    });
    return await next;
  }

  async inspect(name: string): Promise<PgInspection> {
    return (await this.#inspect(name)).info;
  }

  async #inspect(name: string): Promise<Found> {
    checkName(name, "inspect the lock");
    const key = keyOf(name);
    for (let attempt = 0;; attempt++) {
      const session = await this.#probeSession(name);
      try {
        if (!this.#tableReady) {
          // Until the table exists, ask first rather than let the inspect
          // statement fail: each failure is an ERROR line in the server's
          // log, and a status command may poll.
          const rows = await session.query(
            `SELECT to_regclass($1) IS NOT NULL AS table`,
            [this.sql.table],
            undefined,
            false,
            this.statementTimeout,
          );
          if (rows[0].table !== true) return interpret(name, key, {});
          this.#tableReady = true;
        }
        return await this.#find(session, name, key, lockTagOf(key));
      } catch (err) {
        // No table (dropped since we looked): nothing is locked here.
        if (sqlState(err) === "42P01") return interpret(name, key, {});
        // The probe session may have died while idle: one more try.
        if (attempt === 0 && session.lost !== undefined) continue;
        throw this.refused(name, "inspect the lock", err);
      }
    }
  }

  async held(name: string): Promise<boolean> {
    return (await this.#checked(name)).state === "held";
  }

  async activePid(name: string): Promise<{ pid: number; alive: boolean }> {
    const info = await this.#checked(name);
    return { pid: info.pid, alive: info.state === "held" };
  }

  async #checked(name: string): Promise<PgInspection> {
    const { info, other } = await this.#inspect(name);
    if (info.state === "invalid") {
      throw new KeyCollisionError(name, other ?? "(unknown)", keyOf(name));
    }
    return info;
  }

  async end(): Promise<void> {
    this.#ended = true;
    clearInterval(this.#sweeper);
    this.#sweeper = undefined;
    const closing = this.#idle.splice(0).map(({ session }) => session.close());
    const probe = this.#probe;
    this.#probe = undefined;
    if (probe !== undefined) {
      closing.push(probe.then((s) => s.close(), () => {}));
    }
    await Promise.all(closing);
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.end();
  }
}

/** The HeldError for what #find saw. */
function heldError(name: string, info: PgInspection): HeldError {
  if (info.foreign) {
    const m = /session \d+(?: \(application "(.*)"\))?/.exec(
      info.reason ?? "",
    );
    return new ForeignHolderError(name, info.backendPid, m?.[1] ?? "");
  }
  return new HeldError(name, info.pid, info.host, { started: info.started });
}

/** Turns the inspect statement's row into an inspection. */
function interpret(
  name: string,
  key: bigint,
  row: Record<string, unknown> | undefined,
): Found {
  const r = row ?? {};
  const holder = (r.holder_backend as number | null) ?? 0;
  const recorded = r.fence !== null && r.fence !== undefined;
  const info: PgInspection = {
    path: name,
    state: "free",
    pid: 0,
    host: "",
    started: undefined,
    foreign: false,
    reason: undefined,
    meta: {},
    runtime: "",
    fence: recorded ? BigInt(r.fence as string) : undefined,
    backendPid: holder,
  };
  const other = typeof r.other_name === "string" ? r.other_name : undefined;
  const fill = () => {
    info.pid = r.pid as number;
    info.host = r.host as string;
    info.started = r.started as Date;
    info.meta = (r.meta ?? {}) as Record<string, string>;
    info.runtime = r.runtime as string;
  };
  if (holder !== 0) {
    if (recorded && r.backend_pid === holder) {
      info.state = "held";
      fill();
    } else if (other !== undefined && r.other_backend === holder) {
      info.state = "invalid";
      info.reason = `collides with ${
        JSON.stringify(other)
      } (same advisory key ${key}), which pid ${r.other_pid} on ${
        r.other_host || "?"
      } holds`;
    } else {
      info.state = "held";
      info.foreign = true;
      const app = r.holder_application as string | null;
      info.reason = `held by database session ${holder}${
        app ? ` (application ${JSON.stringify(app)})` : ""
      }, which wrote no runlock record`;
    }
  } else if (other !== undefined) {
    info.state = "invalid";
    info.reason = `collides with ${
      JSON.stringify(other)
    } (same advisory key ${key}); acquire would fail until one is renamed`;
  } else if (recorded && r.backend_pid !== null) {
    info.state = "stale";
    fill();
  }
  return { info, other };
}

/**
 * Run locks on a PostgreSQL database, for runs on several hosts. Opens
 * nothing until first used.
 *
 * Each held lock is a session-level advisory lock on its own dedicated
 * session (never a pooled connection: the lock is the session), with its
 * record (pid, host, start, runtime, meta, fence) in the table
 * `<schema>.runlock_locks`, created on first use. The server drops the lock
 * when the session ends: on release, on any exit of the holder (SIGKILL
 * included), on `pg_terminate_backend`, or when keepalives find its host
 * gone. A SIGSTOPped holder keeps it, as with flock.
 *
 * Not through a pooler in transaction mode (PgBouncer's
 * `pool_mode=transaction`): session locks need the session. A failover to
 * a replica drops every advisory lock (they are not replicated): holders'
 * signals abort, and fences keep a late writer out.
 *
 * Permissions (Deno): `--allow-net` for the server, `--allow-env` (the
 * client reads `PG*` variables), and optionally `--allow-sys=hostname` to
 * record the host.
 *
 * @param url `postgres://user:password@host:port/database`; the password
 * is never printed.
 * @param options Schema, keepalive and heartbeat settings; see
 * {@linkcode PgLocksOptions}.
 * @returns The locks and probes for that database.
 * @throws {TypeError} `url` is not a postgres:// URL, or an option is invalid.
 * @throws {RangeError} an option is out of range.
 *
 * @example Held, refused with the holder's pid and host, then free
 * ```ts
 * import { pgLocks } from "@runlock/runlock/postgres";
 * import { HeldError } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const url = Deno.env.get("RUNLOCK_TEST_PG_URL") ?? "postgres://postgres@127.0.0.1/postgres";
 * await using locks = pgLocks(url);
 * const lock = await locks.acquire("example/sync", { meta: { cmd: "sync" } });
 * const err = await locks.acquire("example/sync").catch((e) => e);
 * assert.ok(err instanceof HeldError);
 * assert.equal(err.pid, Deno.pid);
 * assert.deepEqual(await locks.activePid("example/sync"), { pid: Deno.pid, alive: true });
 * await lock.release();
 * assert.equal(await locks.held("example/sync"), false);
 * const next = await locks.acquire("example/sync");
 * assert.ok(next.fence > lock.fence);
 * await next.release();
 * ```
 */
export function pgLocks(url: string, options?: PgLocksOptions): PgLocks {
  return new PgLocksImpl(url, options);
}
