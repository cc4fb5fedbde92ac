/**
 * Run locks on PostgreSQL session-level advisory locks: {@linkcode pgLocks}
 * and the {@linkcode PgLock} it hands out.
 *
 * @module
 */

import { clearInterval, setInterval } from "node:timers";
import { RunlockError } from "../errors.ts";
import { acquire } from "./_acquire.ts";
import { Connector, type Purpose } from "./_connect.ts";
import { causeOf, sqlState } from "./_failure.ts";
import type { AcquireHost, WatchHost } from "./_host.ts";
import { keyOf, type LockTag, lockTagOf } from "./_key.ts";
import { hereKey, PgLockImpl } from "./_lock.ts";
import { refused } from "./_messages.ts";
import {
  checkName,
  checkOptions,
  checkOptionsObject,
  checkPrefix,
  checkSignal,
  type Options,
} from "./_options.ts";
import { find, type Found, interpret } from "./_probe.ts";
import type {
  PgChange,
  PgInspection,
  PgScanOptions,
  PgWatchOptions,
} from "./_probe_types.ts";
import { abortable, ifTable, scanLabel, scanRows } from "./_scan.ts";
import { createTable } from "./_schema.ts";
import type { Session } from "./_session.ts";
import { type Statements, statements } from "./_sql.ts";
import { parseUrl } from "./_url.ts";
import { watchLocks } from "./_watch.ts";
import { KeyCollisionError } from "./errors.ts";
import type {
  PgAcquireOptions,
  PgLock,
  PgLocks,
  PgLocksOptions,
} from "./types.ts";

/** Released sessions close after this long unused. */
const IDLE_MS = 10_000;

class PgLocksImpl implements PgLocks, AcquireHost, WatchHost {
  readonly sql: Statements;
  readonly schema: string;
  readonly #connector: Connector;
  readonly #options: Options;
  /** Released sessions, newest last, with when they were released. */
  readonly #idle: { session: Session; since: number }[] = [];
  #sweeper: ReturnType<typeof setInterval> | undefined;
  #table: Promise<void> | undefined;
  #tableReady = false;
  #probe: Promise<Session> | undefined;
  #ended = false;
  /** The stops of the watches running (see track). */
  readonly #watches = new Set<() => Promise<void>>();
  /** Aborted by end(): the scans in flight reject with its reason. */
  readonly #ending = new AbortController();
  /** Scans in flight. */
  #scans = 0;

  constructor(url: string, options: PgLocksOptions | undefined) {
    const target = parseUrl(url);
    this.#options = checkOptions(options);
    this.#connector = new Connector(target, this.#options);
    this.schema = this.#options.schema;
    this.sql = statements(this.schema);
  }

  /** Milliseconds a short statement may take before its session counts as dead. */
  get statementTimeout(): number {
    return this.#options.connectTimeout;
  }

  get heartbeatTimeout(): number {
    return this.#options.heartbeatTimeout;
  }

  startHeartbeat(session: Session, tag: LockTag): void {
    // pg_locks, guarded: never a bare round trip, which a balancer could
    // answer from another server.
    session.startHeartbeat(
      this.sql.owned,
      [tag.classid, tag.objid, session.nonce],
      this.#options.heartbeatInterval,
      this.#options.heartbeatTimeout,
      (rows) =>
        rows[0]?.owned === true
          ? undefined
          : "no longer holds the lock's advisory key (its heartbeat asked pg_locks)",
    );
  }

  here(name: string): string {
    return hereKey(this.#connector.target.where, this.schema, name);
  }

  refused(name: string, action: string, err: unknown): RunlockError {
    return refused(this.#connector.target, name, action, err, this.schema);
  }

  track(stop: () => Promise<void>): () => void {
    this.#watches.add(stop);
    return () => this.#watches.delete(stop);
  }

  async #connect(
    name: string,
    signal?: AbortSignal,
    purpose: Purpose = "lock",
  ): Promise<Session> {
    if (this.#ended) throw ended(name);
    return await this.#connector.open(name, signal, purpose);
  }

  /** A released session of ours, or a new one. */
  async take(
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
    // One unreferenced sweeper, cheaper than a timer per release.
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
  ensureTable(session: Session): Promise<void> | undefined {
    if (this.#tableReady) return undefined;
    this.#table ??= createTable(
      session,
      this.sql,
      this.schema,
      this.statementTimeout,
    );
    return this.#table.then(() => {
      this.#tableReady = true;
    }, (err) => {
      this.#table = undefined;
      throw err;
    });
  }

  acquire(name: string, options?: PgAcquireOptions): Promise<PgLock> {
    return acquire(this, name, options);
  }

  lock(
    session: Session,
    name: string,
    row: Record<string, unknown>,
    meta: Record<string, string>,
    tag: LockTag,
  ): PgLock {
    return new PgLockImpl(this, session, name, row, meta, tag, this.here(name));
  }

  /**
   * The shared probe session, replaced when it died (concurrent probes
   * share the replacement, so none leaks past end()).
   */
  async #probeSession(name: string, action: string): Promise<Session> {
    const current = this.#probe;
    if (current !== undefined) {
      const session = await current.catch(() => undefined);
      if (session !== undefined && session.lost === undefined) return session;
      if (this.#probe !== current && this.#probe !== undefined) {
        // another probe replaced it
        return await this.#probeSession(name, action);
      }
    }
    const next = this.openProbe(name, action);
    this.#probe = next;
    next.catch(() => {
      if (this.#probe === next) this.#probe = undefined;
    });
    return await next;
  }

  /**
   * A new probe session, not a hot standby's (whose pg_locks lacks the
   * primary's locks: every held lock would read stale).
   */
  async openProbe(
    name: string,
    action: string,
    signal?: AbortSignal,
  ): Promise<Session> {
    const s = await this.#probeConnect(
      name,
      signal,
      action.startsWith("watch") ? "watch" : "probe",
    );
    const rows = await s.query(this.sql.standby, [], this.statementTimeout)
      .catch((err) => {
        s.destroy();
        throw this.refused(name, action, err);
      });
    if (rows[0]?.standby === true) {
      await s.close();
      throw new RunlockError(
        name,
        `${name}: cannot ${action}: PostgreSQL at ${this.#connector.target.text} is a hot standby (in recovery), ` +
          `whose pg_locks shows none of the primary's locks (advisory locks are not replicated): point the URL at the primary`,
      );
    }
    return s;
  }

  /**
   * A new probe session; at a connection limit (53300), closes one of our
   * idle sessions and connects once more.
   */
  async #probeConnect(
    name: string,
    signal: AbortSignal | undefined,
    purpose: "probe" | "watch",
  ): Promise<Session> {
    try {
      return await this.#connect(name, signal, purpose);
    } catch (err) {
      if (sqlState(causeOf(err)) !== "53300" || this.#idle.length === 0) {
        throw err;
      }
      await this.#idle.shift()!.session.close();
      return await this.#connect(name, signal, purpose);
    }
  }

  async inspect(name: string): Promise<PgInspection> {
    return (await this.#inspect(name)).info;
  }

  async #inspect(name: string): Promise<Found> {
    checkName(name, "inspect the lock");
    const key = keyOf(name, this.schema);
    const found = await this.#probing(
      name,
      "inspect the lock",
      (session) =>
        find(
          session,
          this.sql,
          this.statementTimeout,
          name,
          key,
          lockTagOf(key),
        ),
    );
    return found ?? interpret(name, key, {});
  }

  /**
   * `read` on the probe session (see ifTable), once more if that session
   * died while idle.
   */
  async #probing<T>(
    name: string,
    action: string,
    read: (session: Session) => Promise<T>,
  ): Promise<T | undefined> {
    for (let attempt = 0;; attempt++) {
      const session = await this.#probeSession(name, action);
      try {
        const found = await ifTable(
          session,
          this.sql,
          this.statementTimeout,
          this.#tableReady,
          () => read(session),
        );
        this.#tableReady = found !== undefined;
        return found;
      } catch (err) {
        if (attempt === 0 && session.lost !== undefined) continue;
        throw this.refused(name, action, err);
      }
    }
  }

  async scan(options?: PgScanOptions): Promise<PgInspection[]> {
    const o = checkOptionsObject(options, "scan the locks");
    const prefix = checkPrefix(o.prefix, "scan the locks");
    const signal = checkSignal(o.signal, "scan the locks");
    signal?.throwIfAborted();
    if (this.#ended) throw ended(scanLabel(prefix));
    this.#scans++;
    try {
      return await abortable(
        abortable(this.#scan(prefix), this.#ending.signal),
        signal,
      );
    } catch (err) {
      if (err !== this.#ending.signal.reason) throw err;
      throw new RunlockError(
        scanLabel(prefix),
        `${scanLabel(prefix)}: cannot scan the locks: end() was called`,
      );
    } finally {
      this.#scans--;
    }
  }

  async #scan(prefix: string): Promise<PgInspection[]> {
    const rows = await this.#probing(
      scanLabel(prefix),
      "scan the locks",
      (session) => scanRows(session, this.sql, this.statementTimeout, prefix),
    );
    return (rows ?? []).map((r) => r.info);
  }

  watch(options?: PgWatchOptions): AsyncIterable<PgChange[]> {
    return watchLocks(this, options);
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
      throw new KeyCollisionError(
        name,
        other ?? "(unknown)",
        keyOf(name, this.schema),
      );
    }
    return info;
  }

  async end(): Promise<void> {
    this.#ended = true;
    clearInterval(this.#sweeper);
    this.#sweeper = undefined;
    const scanning = this.#scans > 0;
    this.#ending.abort(new Error("end() was called"));
    const closing = this.#idle.splice(0).map(({ session }) => session.close());
    for (const stop of this.#watches) closing.push(stop());
    this.#watches.clear();
    const probe = this.#probe;
    this.#probe = undefined;
    if (probe !== undefined) {
      closing.push(probe.then((s) => {
        if (!scanning) return s.close();
        // A scan's statement may be waiting on the server: stop it.
        void s.cancel();
        s.destroy();
      }, () => {}));
    }
    await Promise.all(closing);
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.end();
  }
}

/** The error of a pgLocks object used after end(). */
function ended(name: string): RunlockError {
  return new RunlockError(
    name,
    `${name}: cannot use this pgLocks object: end() was called`,
  );
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
