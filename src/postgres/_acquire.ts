// The acquire procedure: the try, the probe when that fails, and waiting
// (_wait.ts); a waiter whose server goes away reconnects while it has time.
import { clearTimeout, setTimeout } from "node:timers";
import { process } from "../_process.ts";
import { ContendedError, HeldError, RunlockError } from "../errors.ts";
import { checkMeta } from "../meta.ts";
import {
  causeOf,
  messageOf,
  REROUTED,
  SOCKET_GONE,
  sqlState,
} from "./_failure.ts";
import type { AcquireHost } from "./_host.ts";
import { keyOf, type LockTag, lockTagOf } from "./_key.ts";
import { heldByThisProcess } from "./_lock.ts";
import { checkName, checkTimeout } from "./_options.ts";
import { find, heldError, heldHere } from "./_probe.ts";
import { hostName, runtime } from "../platform/runtime.ts";
import type { Session } from "./_session.ts";
import { attempt, type Call, Queue } from "./_wait.ts";
import { KeyCollisionError, PoolerError } from "./errors.ts";
import type { PgAcquireOptions, PgLock } from "./types.ts";

/** Attempts when the lock keeps changing hands between our statements. */
const MAX_SPINS = 16;
/** Reconnection backoff (a restarting server sends no event to wait for). */
const RECONNECT_FIRST_MS = 20;
const RECONNECT_MAX_MS = 1_000;

/**
 * Takes the lock `name` for `host`'s pgLocks object, waiting until
 * `options.timeout`, an abort or a failure (docs/postgres.md, "Waiting
 * through a restart or a failover").
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
  if (since !== undefined) throw heldHere(name, since);
  const key = keyOf(name, host.schema);
  const call: Call = {
    host,
    name,
    key,
    tag: lockTagOf(key),
    params: [
      name,
      String(key),
      process.pid,
      hostName(),
      runtime,
      JSON.stringify(meta),
    ],
    deadline: performance.now() + timeout,
    waits: timeout > 0,
    signal,
  };
  // A server that never answered this acquire is retried only for
  // connectTimeout: as likely a wrong host or port as a restart.
  const began = performance.now();
  let reached = false;
  let pause = 0;
  /** Waits twice as long as the last time, within bounds and the deadline. */
  const backOff = () => {
    pause = Math.min(Math.max(2 * pause, RECONNECT_FIRST_MS), RECONNECT_MAX_MS);
    return sleep(Math.min(pause, call.deadline - performance.now()), signal);
  };
  for (let attempt = 0;; attempt++) {
    let taken: { session: Session; reused: boolean };
    try {
      taken = await host.take(name, signal);
      reached = true;
    } catch (err) {
      const answered = reached || serverAnswered(err) ||
        performance.now() - began < host.statementTimeout;
      if (call.waits && comingBack(err) && timeLeft(call) && answered) {
        await backOff();
        continue;
      }
      throw err;
    }
    const { session, reused } = taken;
    const opened = performance.now();
    try {
      const row = await acquireOn(call, session);
      return lockOn(host, session, name, row, meta, call.tag);
    } catch (err) {
      if (session.lost === undefined) host.giveBack(session);
      else session.destroy();
      // A kept session that died while idle says nothing: once more.
      if (reused && attempt === 0 && session.lost !== undefined) {
        if (!(err instanceof HeldError) && !signal?.aborted) continue;
      }
      if (signal?.aborted && !(err instanceof RunlockError)) {
        throw signal.reason;
      }
      // A pooler that cannot hold a session lock: never retried.
      if (session.lost === REROUTED) {
        throw new PoolerError(name, `its session ${REROUTED}`, {
          cause: err,
        });
      }
      // The server ended the session (a restart gives every waiter 57P01,
      // and may be back 0.2 s later): connect again while there is time.
      // Not one we gave up on (no answer: a silent server or link).
      if (
        session.lost !== undefined &&
        !session.lost.startsWith("did not answer") &&
        !(err instanceof RunlockError) && timeLeft(call)
      ) {
        // A server that keeps ending young sessions: no tight loop.
        if (performance.now() - opened > RECONNECT_MAX_MS) pause = 0;
        else await backOff();
        continue;
      }
      throw host.refused(name, "acquire the lock", err);
    }
  }
}

/** Whether the deadline is still ahead. */
function timeLeft(call: Call): boolean {
  return call.deadline - performance.now() > 0;
}

/**
 * Whether a failed connection is a server on its way back: a socket
 * error, no answer within connectTimeout, 57P01-57P03 (shutting down,
 * crashed, starting up) or 53300 (a restart's waiters all reconnecting).
 */
function comingBack(err: unknown): boolean {
  const cause = causeOf(err) ?? err;
  const code = (cause as { code?: unknown } | null)?.code;
  if (
    typeof code === "string" && (SOCKET_GONE.has(code) || code === "EHOSTDOWN")
  ) {
    return true;
  }
  const state = sqlState(cause);
  if (state !== undefined) return /^57P0[1-3]$|^53300$/.test(state);
  return /Connection terminated|timeout expired/i.test(messageOf(cause));
}

/** Whether a failed connection got an answer from a server (a SQLSTATE). */
function serverAnswered(err: unknown): boolean {
  return sqlState(causeOf(err) ?? err) !== undefined;
}

/** Resolves after `ms`, or rejects with the signal's reason on its abort. */
function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  signal?.throwIfAborted();
  return new Promise((resolve, reject) => {
    const done = () => {
      signal?.removeEventListener("abort", abort);
      resolve();
    };
    const timer = setTimeout(done, Math.max(0, ms));
    const abort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", abort, { once: true });
  });
}

/**
 * Takes the lock on one session, or fails. An abort cancels the running
 * statement (see Session.cancel), starts none after, and ends the session
 * (releasing a lock granted meanwhile).
 */
async function acquireOn(
  call: Call,
  session: Session,
): Promise<Record<string, unknown>> {
  const { host, name, signal } = call;
  await host.ensureTable(session);
  const queue = new Queue(call, session);
  let canceled: Promise<void> | undefined;
  const abort = () => canceled ??= session.cancel();
  signal?.addEventListener("abort", abort, { once: true });
  let row: Record<string, unknown> | undefined;
  let failure: unknown;
  try {
    row = await takeOrWait(call, session, queue);
  } catch (err) {
    failure = err;
  } finally {
    signal?.removeEventListener("abort", abort);
  }
  if (signal?.aborted) {
    // The listener may not have run (aborted before it was added).
    await (canceled ?? session.cancel());
    if (row !== undefined) {
      await session.query(
        host.sql.release,
        [name, row.fence, session.nonce],
        host.statementTimeout,
        "runlock_release",
      ).catch(() => {});
    }
    session.destroy("was closed after a canceled acquire");
    throw signal.reason;
  }
  if (failure !== undefined) {
    // Our node would hold up every waiter behind it.
    if (queue.joined && session.lost === undefined) {
      await queue.leaveAll().catch(() => session.destroy());
    }
    throw failure;
  }
  return row!;
}

/** The try, the probe, and waiting, until the lock is ours. */
async function takeOrWait(
  call: Call,
  session: Session,
  queue: Queue,
): Promise<Record<string, unknown>> {
  const { host, name, key, tag, signal } = call;
  for (let spins = 0;;) {
    signal?.throwIfAborted();
    // Not queued yet: take it only if nobody is queued. Queued, at a
    // slice's end, or not waiting: take it if free (a stopped predecessor,
    // or another name's, would hold us up longer).
    const unqueued = call.waits && queue.ticket === undefined;
    const rows = await attempt(
      call,
      session,
      unqueued ? queue.sql.tryUnqueued : host.sql.tryAcquire,
      unqueued ? [...call.params, queue.number] : call.params,
      unqueued ? "runlock_try_unqueued" : "runlock_try",
    );
    const tried = rows[0];
    if (tried !== undefined && tried.fence !== null) {
      await queue.leave();
      return tried;
    }
    if (unqueued && tried?.queued === true) queue.adopt(tried.ticket as number);
    // A queue: the lock may be free for a moment, on its way to the head.
    const queued = unqueued &&
      (tried?.empty === false || tried?.queued === true);
    signal?.throwIfAborted();
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
    const held = found.info.state === "held";
    if (!held && !queued) {
      // It was released between our two statements: try again.
      if (++spins >= MAX_SPINS) throw new ContendedError(name, spins);
      continue;
    }
    if (!timeLeft(call)) {
      if (held) throw heldError(name, found.info);
      // Time is up while the lock is on its way to the head: a last try
      // past the queue, so the answer is the lock or its holder.
      const last = await attempt(
        call,
        session,
        host.sql.tryAcquire,
        call.params,
        "runlock_try",
      );
      if (last.length > 0) {
        await queue.leave();
        return last[0];
      }
      if (++spins >= MAX_SPINS) throw new ContendedError(name, spins);
      continue;
    }
    const since = held
      ? heldByThisProcess(host.here(name), found.info)
      : undefined;
    // Another acquire in this process won meanwhile: do not wait on it.
    if (since !== undefined) throw heldHere(name, since);
    const waited = await queue.wait();
    if (waited !== undefined) return waited;
  }
}

/**
 * The lock for a successful acquire statement, unless the session ended
 * since: never a lock whose signal aborted before anyone could listen.
 */
function lockOn(
  host: AcquireHost,
  session: Session,
  name: string,
  row: Record<string, unknown>,
  meta: Record<string, string>,
  tag: LockTag,
): PgLock {
  if (session.lost !== undefined) {
    throw new Error(
      `the session ${session.lost} right after taking the lock`,
    );
  }
  return host.lock(session, name, row, meta, tag);
}
