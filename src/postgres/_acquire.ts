// The acquire procedure: the one-round-trip try, the probe when that
// fails, and waiting in the server's queue in slices, until the lock is
// taken, the timeout passes, the caller aborts, or something fails.
import process from "node:process";
import { ContendedError, HeldError, RunlockError } from "../errors.ts";
import { checkMeta } from "../meta.ts";
import { keyOf, lockTagOf } from "./_key.ts";
import { heldByThisProcess } from "./_lock.ts";
import { checkName, checkTimeout, hostName, runtime } from "./_options.ts";
import { find, heldError } from "./_probe.ts";
import { type Session, sqlState } from "./_session.ts";
import type { Statements } from "./_sql.ts";
import { KeyCollisionError } from "./errors.ts";
import type { PgAcquireOptions, PgLock } from "./types.ts";

/** A blocked wait holds a snapshot (and VACUUM's horizon): wait in slices. */
const WAIT_SLICE_MS = 5_000;
/** Attempts when the lock keeps changing hands between our statements. */
const MAX_SPINS = 16;

/** What the acquire procedure needs from its pgLocks object. */
export interface AcquireHost {
  readonly sql: Statements;
  /** Milliseconds a short statement may take before its session counts as dead. */
  readonly statementTimeout: number;
  /** The heartbeat's timeout (ms): how late a slice's answer may be. */
  readonly heartbeatTimeout: number;
  /** The schema of the table: part of each name's advisory key. */
  readonly schema: string;
  /** The registry key of `name` (see heldByThisProcess). */
  here(name: string): string;
  /** A released session of this object, or a new one. */
  take(
    name: string,
    signal?: AbortSignal,
  ): Promise<{ session: Session; reused: boolean }>;
  /** Keeps a session for reuse, or closes it. */
  giveBack(session: Session): void;
  /** Creates the table on first use (undefined once it exists). */
  ensureTable(session: Session): Promise<void> | undefined;
  /** A RunlockError for a statement the server refused. */
  refused(name: string, action: string, err: unknown): RunlockError;
  /** The lock object for a successful acquire statement's row. */
  lock(
    session: Session,
    name: string,
    row: Record<string, unknown>,
    meta: Record<string, string>,
    tag: { classid: string; objid: string },
  ): PgLock;
}

/**
 * Takes the lock `name` for `host`'s pgLocks object: at once if free,
 * else waiting (in slices) until `options.timeout`, the signal's abort, or
 * a failure.
 */
export async function acquire(
  host: AcquireHost,
  name: string,
  options?: PgAcquireOptions,
): Promise<PgLock> {
  checkName(name, "acquire the lock");
  const timeout = checkTimeout(options?.timeout);
  const meta = checkMeta(options?.meta);
  const signal = options?.signal;
  signal?.throwIfAborted();
  const since = heldByThisProcess(host.here(name));
  if (since !== undefined) {
    // Waiting would wait on ourselves.
    throw new HeldError(name, process.pid, hostName(), {
      started: since,
      byThisProcess: true,
    });
  }
  const deadline = performance.now() + timeout;
  const key = keyOf(name, host.schema);
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
    const { session, reused } = await host.take(name, signal);
    try {
      return await acquireOn(
        host,
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
      if (session.lost === undefined) host.giveBack(session);
      else session.destroy();
      // A kept session may have died while idle (server restart): that
      // says nothing about the lock, so try once more on a new one.
      if (reused && attempt === 0 && session.lost !== undefined) {
        if (!(err instanceof HeldError) && !signal?.aborted) continue;
      }
      if (signal?.aborted && !(err instanceof RunlockError)) {
        throw signal.reason;
      }
      throw host.refused(name, "acquire the lock", err);
    }
  }
}

async function acquireOn(
  host: AcquireHost,
  session: Session,
  name: string,
  key: bigint,
  tag: { classid: string; objid: string },
  params: unknown[],
  meta: Record<string, string>,
  deadline: number,
  signal: AbortSignal | undefined,
): Promise<PgLock> {
  await host.ensureTable(session);
  for (let spins = 0;;) {
    signal?.throwIfAborted();
    const rows = await attempt(
      host,
      session,
      name,
      key,
      host.sql.tryAcquire,
      params,
      "runlock_try",
    );
    if (rows.length > 0) {
      return lockOn(host, session, name, rows[0], meta, tag);
    }
    const found = await find(
      session,
      host.sql,
      host.statementTimeout,
      name,
      key,
      tag,
    );
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
    const since = heldByThisProcess(host.here(name), found.info);
    if (since !== undefined) {
      // Another acquire in this process won meanwhile: do not wait on it.
      throw new HeldError(name, process.pid, hostName(), {
        started: since,
        byThisProcess: true,
      });
    }
    const waited = await wait(
      host,
      session,
      name,
      key,
      [...params, String(Math.ceil(Math.min(remaining, WAIT_SLICE_MS)))],
      signal,
    );
    if (waited !== undefined) {
      return lockOn(host, session, name, waited, meta, tag);
    }
  }
}

/**
 * The lock for a successful acquire statement. If the session ended
 * after the server answered and before we got here (a restart, a
 * termination), the lock is already gone: say so instead of returning a
 * lock whose signal is aborted before anyone could listen to it.
 */
function lockOn(
  host: AcquireHost,
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
  return host.lock(session, name, row, meta, tag);
}

/**
 * Runs an acquire statement. After any failure, drops whatever advisory
 * lock the failed statement took: session-level advisory locks survive
 * the rollback of the statement that took them (PostgreSQL manual
 * §13.3.5), so a collision or a lock_timeout on the row after the lock
 * was granted would otherwise leave this session holding it.
 */
async function attempt(
  host: AcquireHost,
  session: Session,
  name: string,
  key: bigint,
  text: string,
  params: unknown[],
  statement: string,
  timeout = host.statementTimeout,
): Promise<Record<string, unknown>[]> {
  try {
    return await session.query(text, params, statement, false, timeout);
  } catch (err) {
    if (session.lost !== undefined) throw err;
    await session.query(
      host.sql.unlockAll,
      [],
      "runlock_unlock_all",
      false,
      host.statementTimeout,
    );
    if (sqlState(err) === "23505") {
      // unique_violation on `key`: another name's row has our key.
      const found = await find(
        session,
        host.sql,
        host.statementTimeout,
        name,
        key,
        lockTagOf(key),
      );
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
async function wait(
  host: AcquireHost,
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
    rows = await attempt(
      host,
      session,
      name,
      key,
      host.sql.waitAcquire,
      params,
      "runlock_wait",
      Number(params[6]) + host.heartbeatTimeout,
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
        host.sql.release,
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
