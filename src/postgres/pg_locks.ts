/**
 * Run locks on PostgreSQL session-level advisory locks: {@linkcode pgLocks}
 * and the {@linkcode PgLock} it hands out.
 *
 * @module
 */

import { clearInterval, setInterval } from "node:timers";
import { RunlockError } from "../errors.ts";
import { acquire } from "./_acquire.ts";
import type { AcquireHost, WatchHost } from "./_host.ts";
import { bind } from "./_bind.ts";
import { keyOf, type LockTag, lockTagOf } from "./_key.ts";
import { hereKey, PgLockImpl } from "./_lock.ts";
import { connectError, refused } from "./_messages.ts";
import {
  checkName,
  checkOptions,
  checkOptionsObject,
  checkPrefix,
  checkSignal,
  type Options,
} from "./_options.ts";
import { find, type Found, interpret } from "./_probe.ts";
import { granted } from "./_runtime.ts";
import { abortable, scanLabel, scanTable } from "./_scan.ts";
import { createTable } from "./_schema.ts";
import { causeOf, sqlState } from "./_failure.ts";
import { Session, type SessionConfig } from "./_session.ts";
import { SESSION_SETTING, sessionSettings } from "./_settings.ts";
import { type Statements, statements } from "./_sql.ts";
import { KeyCollisionError } from "./errors.ts";
import { parseUrl, type Target } from "./_url.ts";
import { watchLocks } from "./_watch.ts";
import type {
  PgChange,
  PgInspection,
  PgScanOptions,
  PgWatchOptions,
} from "./_probe_types.ts";
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
  readonly #schema: string;
  readonly #options: Options;
  readonly #config: SessionConfig;
  /** runlock's own session settings, which lock sessions set once bound. */
  readonly #pinned: Record<string, string>;
  readonly #target: Target;
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
    this.#target = parseUrl(url);
    this.#options = checkOptions(options);
    this.#schema = this.#options.schema;
    this.sql = statements(this.#schema);
    const o = this.#options;
    this.#pinned = sessionSettings(o);
    this.#config = {
      url: this.#target.connectUrl,
      connectTimeout: o.connectTimeout,
      // The settings pinned in the startup packet, which win over the
      // role's, the database's, the server's and the URL's (sent after
      // the URL's own `options`; see _settings.ts and _url.ts).
      settings: {
        ...this.#target.settings,
        ...this.#pinned,
        // Whatever a role or database default says, a new session is no
        // client's yet (_bind.ts).
        [SESSION_SETTING]: "",
      },
    };
  }

  /** Milliseconds a short statement may take before its session counts as dead. */
  get statementTimeout(): number {
    return this.#options.connectTimeout;
  }

  get heartbeatTimeout(): number {
    return this.#options.heartbeatTimeout;
  }

  startHeartbeat(session: Session, tag: LockTag): void {
    // The heartbeat asks pg_locks whether this very server session still
    // holds the key (guarded: only the session this client bound
    // answers), never a bare round trip that a balancer could answer
    // from another server.
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

  /** The schema of the table: part of each name's advisory key. */
  get schema(): string {
    return this.#schema;
  }

  here(name: string): string {
    return hereKey(this.#target.where, this.#schema, name);
  }

  refused(name: string, action: string, err: unknown): RunlockError {
    return refused(this.#target, name, action, err, this.#schema);
  }

  track(stop: () => Promise<void>): () => void {
    this.#watches.add(stop);
    return () => this.#watches.delete(stop);
  }

  async #connect(
    name: string,
    signal?: AbortSignal,
    purpose: "lock" | "probe" | "watch" = "lock",
  ): Promise<Session> {
    if (this.#ended) {
      throw new RunlockError(
        name,
        `${name}: cannot use this pgLocks object: end() was called`,
      );
    }
    // Under Deno, a missing grant is an error naming the flag, not a
    // prompt: the client reads PG* variables (PGPASSWORD, PGUSER, ...).
    const { host, port } = this.#target;
    // Every missing grant at once, not one per try.
    const missing: string[] = [];
    if (!granted({ name: "env" })) {
      missing.push("--allow-env (the PostgreSQL client reads PG* variables)");
    }
    if (
      !host.startsWith("/") &&
      !granted({ name: "net", host: `${host}:${port}` })
    ) {
      missing.push(`--allow-net=${host}:${port}`);
    }
    if (missing.length > 0) {
      throw new RunlockError(
        name,
        `${name}: cannot connect to PostgreSQL at ${this.#target.text}: permission denied; grant ${
          missing.join(" and ")
        }`,
      );
    }
    let session: Session;
    try {
      session = await Session.open(this.#config, signal);
    } catch (err) {
      signal?.throwIfAborted();
      throw connectError(this.#target, this.#options, name, err, purpose);
    }
    if (purpose !== "lock") return session;
    try {
      await bind(session, {
        name,
        // Without startup options (refused by a pooler), the URL's own
        // settings are set by statement too.
        settings: {
          ...(this.#config.optionsRefused ? this.#target.settings : {}),
          ...this.#pinned,
          // The server's bound on a silent lock session (behind a TCP
          // proxy, see PgLocksOptions), on lock sessions only.
          idle_session_timeout: String(this.#options.idleSessionTimeout),
          // A lock session reached through a pooler stays in a transaction.
          idle_in_transaction_session_timeout: String(
            this.#options.idleSessionTimeout,
          ),
        },
        timeout: this.statementTimeout,
        open: (limit) =>
          Session.open(
            this.#config,
            signal === undefined ? limit : AbortSignal.any([signal, limit]),
          ),
      });
    } catch (err) {
      if (err instanceof RunlockError) throw err;
      signal?.throwIfAborted();
      throw this.refused(name, "acquire the lock", err);
    }
    return session;
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
  ensureTable(session: Session): Promise<void> | undefined {
    if (this.#tableReady) return undefined;
    this.#table ??= createTable(
      session,
      this.sql,
      this.#schema,
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
   * The shared probe session, connected on first use and replaced once
   * when it died (concurrent probes share the replacement, so none leaks
   * past end()).
   */
  async #probeSession(
    name: string,
    action = "inspect the lock",
  ): Promise<Session> {
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
   * A new probe session (the shared one, or a watch's own), checked not to
   * be a hot standby's: its pg_locks shows none of the primary's locks
   * (they are not replicated), so its probes would read every held lock
   * stale. `signal` abandons the connection attempt.
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
    const rows = await s.query(
      this.sql.standby,
      [],
      undefined,
      false,
      this.statementTimeout,
    ).catch((err) => {
      s.destroy();
      throw this.refused(name, action, err);
    });
    if (rows[0]?.standby === true) {
      await s.close();
      throw new RunlockError(
        name,
        `${name}: cannot ${action}: PostgreSQL at ${this.#target.text} is a hot standby (in recovery), ` +
          `whose pg_locks shows none of the primary's locks (advisory locks are not replicated): point the URL at the primary`,
      );
    }
    return s;
  }

  /**
   * A new probe session. A server (or role, or database) at its
   * connection limit may be full of this object's own idle sessions, kept
   * for the next acquire: close one and connect once more.
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
    const key = keyOf(name, this.#schema);
    for (let attempt = 0;; attempt++) {
      const session = await this.#probeSession(name);
      try {
        if (!this.#tableReady) {
          // Until the table exists, ask first rather than let the inspect
          // statement fail: each failure is an ERROR line in the server's
          // log, and a status command may poll.
          const rows = await session.query(
            this.sql.tableExists,
            [this.sql.table],
            undefined,
            false,
            this.statementTimeout,
          );
          if (rows[0].table !== true) return interpret(name, key, {});
          this.#tableReady = true;
        }
        return await find(
          session,
          this.sql,
          this.statementTimeout,
          name,
          key,
          lockTagOf(key),
        );
      } catch (err) {
        // No table (dropped since we looked): nothing is locked here. But
        // a missing relation may be another's (a function of a row-level
        // security policy, a view an admin put in): then that is an error,
        // never "free".
        if (
          sqlState(err) === "42P01" && session.lost === undefined &&
          !(await this.#tableThere(session))
        ) {
          this.#tableReady = false;
          return interpret(name, key, {});
        }
        // The probe session may have died while idle: one more try.
        if (attempt === 0 && session.lost !== undefined) continue;
        throw this.refused(name, "inspect the lock", err);
      }
    }
  }

  async scan(options?: PgScanOptions): Promise<PgInspection[]> {
    const o = checkOptionsObject(options, "scan the locks");
    const prefix = checkPrefix(o.prefix, "scan the locks");
    const signal = checkSignal(o.signal, "scan the locks");
    signal?.throwIfAborted();
    if (this.#ended) {
      throw new RunlockError(
        scanLabel(prefix),
        `${
          scanLabel(prefix)
        }: cannot use this pgLocks object: end() was called`,
      );
    }
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
    const label = scanLabel(prefix);
    for (let attempt = 0;; attempt++) {
      const session = await this.#probeSession(label, "scan the locks");
      try {
        const { rows, table } = await scanTable(
          session,
          this.sql,
          this.statementTimeout,
          prefix,
          [],
          this.#tableReady,
        );
        this.#tableReady = table;
        return rows.map((r) => r.info);
      } catch (err) {
        // The probe session may have died while idle: one more try.
        if (attempt === 0 && session.lost !== undefined) continue;
        throw this.refused(label, "scan the locks", err);
      }
    }
  }

  watch(options?: PgWatchOptions): AsyncIterable<PgChange[]> {
    return watchLocks(this, options);
  }

  /** Whether the table exists, or true when that cannot be asked. */
  async #tableThere(session: Session): Promise<boolean> {
    try {
      const rows = await session.query(
        this.sql.tableExists,
        [this.sql.table],
        undefined,
        false,
        this.statementTimeout,
      );
      return rows[0].table === true;
    } catch {
      return true;
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
      throw new KeyCollisionError(
        name,
        other ?? "(unknown)",
        keyOf(name, this.#schema),
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
