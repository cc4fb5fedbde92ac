// The acquire procedure: the one-round-trip try, the probe when that
// fails, and waiting first come, first served, in slices, until the lock
// is taken, the timeout passes, the caller aborts, or something fails; a
// waiter whose server goes away reconnects while it has time left.
//
// Waiting (issue 16 case 8). A blocked statement holds a snapshot (and so
// VACUUM's horizon), so no wait statement lasts longer than a slice
// (WAIT_SLICE_MS). The server's queue of a lock is first come, first
// served, but a waiter whose slice ran out and that waits again goes to
// its back: with everyone waiting on the name's key, 20 workers saw waits
// of 3 times the FIFO bound. So waiters queue in the server's lock manager
// themselves (a CLH queue; the statements are queueStatements in _sql.ts):
//
// - a waiter takes a ticket, one more than the greatest in the name's
//   queue, and holds its node, the advisory lock (queue, ticket);
// - it waits on its live predecessor's node (the greatest ticket below
//   its own still held), a lock nobody else waits on, so a slice that runs
//   out and a wait that starts again lose nothing; when that node is let
//   go of (its holder was granted the lock, gave up, was aborted, or its
//   session ended), it looks for its predecessor again, in the same
//   statement, and waits on the key if it has none;
// - the head (no predecessor) waits on the name's key; when granted it, it
//   lets go of its node in the same statement, so its successor becomes
//   the head and waits on the key while it holds the lock (before its
//   answer has even reached it: no round trip of ours in between), and
//   the server hands the lock over the instant it is released, as before.
// Tickets need no durability: a node lives only as long as its session,
// and a server restart ends every session, so every waiter queues again
// (in the order it reconnects). What can still go out of order: an
// acquire that does not wait (the try) or a waiter at the end of a slice
// (it tries too, see below) can take the lock in the moment it is free
// between a holder's release and the next head's wait, which needs a
// holder that holds for less time than the hand-over takes (a few round
// trips); waiters of older runlock versions wait on the key itself, in
// the server's queue, beside our head. Two names whose queue numbers (32
// bits of the key) collide share a queue: a waiter may then wait behind
// one of the other name. Every waiter tries the lock at the end of each
// slice, so that costs it at most a slice, as does a predecessor that is
// stopped (SIGSTOP) while the server hands it the node. In pg_locks a
// queue shows as one granted lock (classid queue, objid ticket, objsubid
// 2) per waiter, each but the head's watched by one ungranted lock, and
// the head waiting on the name's key.
import process from "node:process";
import { clearTimeout, setTimeout } from "node:timers";
import { ContendedError, HeldError, RunlockError } from "../errors.ts";
import { checkMeta } from "../meta.ts";
import { keyOf, lockTagOf } from "./_key.ts";
import { heldByThisProcess } from "./_lock.ts";
import { checkName, checkTimeout, hostName, runtime } from "./_options.ts";
import { find, heldError } from "./_probe.ts";
import { type Session, sqlState } from "./_session.ts";
import {
  type QueueStatements,
  queueStatements,
  type Statements,
} from "./_sql.ts";
import { KeyCollisionError } from "./errors.ts";
import type { PgAcquireOptions, PgLock } from "./types.ts";

/** A blocked wait holds a snapshot (and VACUUM's horizon): wait in slices. */
const WAIT_SLICE_MS = 5_000;
/** Attempts when the lock keeps changing hands between our statements. */
const MAX_SPINS = 16;
/** Tickets to try when other waiters keep taking the same one. */
const ENQUEUE_TRIES = 8;
/**
 * Reconnecting after the server went away while we waited: the first
 * pause, doubled after each failed attempt up to the last. A server that
 * restarts sends no event to wait for, so this is a backoff.
 */
const RECONNECT_FIRST_MS = 20;
const RECONNECT_MAX_MS = 1_000;
/** The DDL lock's first key (_sql.ts), which no queue may use. */
const DDL_KEY = 1920298604;

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

/** One acquire: what every step needs. */
interface Call {
  host: AcquireHost;
  name: string;
  key: bigint;
  tag: { classid: string; objid: string };
  /** The acquire statements' $1-$6. */
  params: unknown[];
  /** Whether it may wait (a timeout above 0). */
  waits: boolean;
  deadline: number;
  signal: AbortSignal | undefined;
}

const queueSql = new Map<string, QueueStatements>();

/**
 * Takes the lock `name` for `host`'s pgLocks object: at once if free,
 * else waiting (in slices, in order of arrival) until `options.timeout`,
 * the signal's abort, or a failure. An acquire that may wait replaces a
 * session the server ended while there is time left (a restart, a crash,
 * a terminated backend), and retries a server that is starting up or
 * shutting down until its deadline; one that refuses connections before
 * it ever answered, only for connectTimeout.
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
  // An acquire that may wait retries a server that is not there yet (a
  // connection refused, "starting up", "shutting down": a restart) until
  // its deadline, whether its first session or a later one meets it. But
  // a server that never answered this acquire (a refused or reset
  // connection, no SQLSTATE) is retried only for connectTimeout: that is
  // as likely a wrong host or port as a restart, and a long timeout must
  // not hide it.
  const began = performance.now();
  let reached = false;
  let pause = 0;
  for (let attempt = 0;; attempt++) {
    let taken: { session: Session; reused: boolean };
    try {
      taken = await host.take(name, signal);
      reached = true;
    } catch (err) {
      const answered = reached || serverAnswered(err) ||
        performance.now() - began < host.statementTimeout;
      if (call.waits && comingBack(err) && timeLeft(call) && answered) {
        pause = Math.min(
          Math.max(2 * pause, RECONNECT_FIRST_MS),
          RECONNECT_MAX_MS,
        );
        await sleep(Math.min(pause, call.deadline - performance.now()), signal);
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
      // A kept session may have died while idle (server restart): that
      // says nothing about the lock, so try once more on a new one.
      if (reused && attempt === 0 && session.lost !== undefined) {
        if (!(err instanceof HeldError) && !signal?.aborted) continue;
      }
      if (signal?.aborted && !(err instanceof RunlockError)) {
        throw signal.reason;
      }
      // The session ended under us (issue 16 case 7: a server restart
      // gave every waiter 57P01 at once, although the server was back
      // 0.2 s later): a waiter with time left connects again and waits on.
      // A lock granted to that session went with it. Not a session we
      // gave up on ourselves (no answer in time: a silent server or link),
      // which fails as before rather than wait out the timeout on it.
      if (
        session.lost !== undefined &&
        !session.lost.startsWith("did not answer") &&
        !(err instanceof RunlockError) && timeLeft(call)
      ) {
        // A session that died young may be a server that keeps ending
        // them: do not reconnect in a tight loop.
        if (performance.now() - opened > RECONNECT_MAX_MS) pause = 0;
        else {
          pause = Math.min(
            Math.max(2 * pause, RECONNECT_FIRST_MS),
            RECONNECT_MAX_MS,
          );
          await sleep(
            Math.min(pause, call.deadline - performance.now()),
            signal,
          );
        }
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
 * Whether a failed connection is a server on its way back: refused (not
 * listening yet), reset or ended during the handshake, or refusing with
 * 57P01-57P03 (shutting down, crashed, starting up / in recovery).
 */
function comingBack(err: unknown): boolean {
  const cause = (err as { cause?: unknown } | null)?.cause ?? err;
  const code = (cause as { code?: unknown } | null)?.code;
  if (code === "ECONNREFUSED" || code === "ECONNRESET" || code === "EPIPE") {
    return true;
  }
  const state = sqlState(cause);
  if (state !== undefined) return /^57P0[1-3]$/.test(state);
  return /Connection terminated/i.test(String(cause));
}

/** Whether a failed connection got an answer from a server (a SQLSTATE). */
function serverAnswered(err: unknown): boolean {
  const cause = (err as { cause?: unknown } | null)?.cause ?? err;
  return sqlState(cause) !== undefined;
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
 * Takes the lock on one session, or fails. From the first statement to
 * the last, an abort cancels whatever statement the session runs (the
 * session's cancel holds until it has settled, so a cancel that reaches
 * the server before the statement does is sent again: issue 16 case 6),
 * and no statement starts once the signal is aborted. The session then
 * ends (with any lock it was granted meanwhile, released first).
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
    // Aborted: the lock, if this session was just granted it, is not
    // handed out. The abort listener may not have run (aborted before it
    // was added): cancel now.
    await (canceled ?? session.cancel());
    if (row !== undefined) {
      await session.query(
        host.sql.release,
        [name, row.fence],
        "runlock_release",
        false,
        host.statementTimeout,
      ).catch(() => {});
    }
    session.destroy("was closed after a canceled acquire");
    throw signal.reason;
  }
  if (failure !== undefined) {
    // Leave the queue before the session goes back to the pool: our node
    // would hold up every waiter behind it.
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
    // An acquire that may wait and is not queued yet takes the lock only
    // if nobody is queued for it; a queued one, at the end of a slice,
    // takes it if it is free (a predecessor that is stopped, or of another
    // name, would hold it up for longer); one that may not wait, if free.
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
    // Others are queued, or we are: the lock may be free for a moment, on
    // its way to the queue's head.
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
      throw new ContendedError(name, ++spins);
    }
    const since = held
      ? heldByThisProcess(host.here(name), found.info)
      : undefined;
    if (since !== undefined) {
      // Another acquire in this process won meanwhile: do not wait on it.
      throw new HeldError(name, process.pid, hostName(), {
        started: since,
        byThisProcess: true,
      });
    }
    const waited = await queue.wait();
    if (waited !== undefined) return waited;
  }
}

/** This acquire's place in the name's queue, on one session. */
class Queue {
  readonly #call: Call;
  readonly #session: Session;
  readonly sql: QueueStatements;
  /** The queue's number: 32 bits of the key, never the DDL lock's. */
  readonly number: number;
  /** Whether we tried to join the queue (its marker may be ours). */
  #joined = false;
  /** Our ticket while we hold our node. */
  ticket: number | undefined;
  /** False once the queue failed us: wait on the key, as before. */
  #usable = true;

  constructor(call: Call, session: Session) {
    this.#call = call;
    this.#session = session;
    const schema = call.host.schema;
    let sql = queueSql.get(schema);
    if (sql === undefined) {
      sql = queueStatements(schema);
      if (queueSql.size >= 64) queueSql.clear();
      queueSql.set(schema, sql);
    }
    this.sql = sql;
    const q = Number(BigInt.asIntN(32, (call.key >> 32n) ^ call.key));
    this.number = q === DDL_KEY ? q ^ 1 : q;
  }

  #query(
    text: string,
    params: unknown[],
    statement: string,
    timeout: number,
  ): Promise<Record<string, unknown>[]> {
    this.#call.signal?.throwIfAborted();
    return this.#session.query(text, params, statement, false, timeout);
  }

  /**
   * Waits for one slice, or less: returns the record row once the lock
   * is ours, undefined when the slice ran out (the caller tries again).
   */
  async wait(): Promise<Record<string, unknown> | undefined> {
    const call = this.#call;
    if (this.ticket === undefined && this.#usable) await this.#enqueue();
    // Unknown at first: the statement finds it (and waits on the key if
    // there is none).
    let pred: number | null = null;
    for (;;) {
      const remaining = call.deadline - performance.now();
      if (remaining <= 0) return undefined;
      const slice = Math.ceil(Math.min(remaining, WAIT_SLICE_MS));
      // The server answers by the end of the slice (lock_timeout); no
      // answer by then plus a heartbeat timeout means it is unreachable.
      const late = slice + call.host.heartbeatTimeout;
      if (this.ticket === undefined) {
        return await waitOnKey(call, this.#session, slice, late);
      }
      const ticket = this.ticket;
      let row: Record<string, unknown> | undefined;
      try {
        [row] = await this.#query(
          this.sql.wait,
          [...call.params, String(slice), this.number, ticket, pred],
          "runlock_queue_wait",
          late,
        );
      } catch (err) {
        if (this.#session.lost !== undefined || call.signal?.aborted) {
          throw err;
        }
        // Session-level advisory locks outlive the failed statement
        // (§13.3.5): drop the key if it was granted, and learn whether our
        // node is still ours (it is unless the key was granted).
        const [state] = await this.#session.query(
          this.sql.afterWait,
          [
            String(call.key),
            call.tag.classid,
            call.tag.objid,
            this.number,
            ticket,
          ],
          "runlock_queue_after_wait",
          false,
          call.host.statementTimeout,
        );
        if (state?.node_held !== true) this.ticket = undefined;
        if (sqlState(err) === "55P03") return undefined; // lock_not_available
        if (sqlState(err) === "23505") {
          await this.leaveAll();
          throw await collision(call, this.#session, err);
        }
        throw err;
      }
      if (row?.fence !== null && row?.fence !== undefined) {
        this.ticket = undefined; // let go of in the statement
        return row;
      }
      // Not the head: our predecessor, to wait for next.
      pred = row?.pred as number;
    }
  }

  /** Takes a ticket and its node; on failure, waits outside the queue. */
  async #enqueue(): Promise<void> {
    this.#joined = true;
    for (let i = 0; i < ENQUEUE_TRIES; i++) {
      let rows: Record<string, unknown>[];
      try {
        rows = await this.#query(
          this.sql.enqueue,
          [this.number],
          "runlock_queue_enqueue",
          this.#call.host.statementTimeout,
        );
      } catch (err) {
        if (this.#session.lost !== undefined || this.#call.signal?.aborted) {
          throw err;
        }
        break; // e.g. tickets overflowed: wait the old way
      }
      if (rows[0]?.ok === true) {
        this.ticket = rows[0].ticket as number;
        return;
      }
    }
    this.#usable = false;
  }

  /** Lets go of our node (the lock was taken by the try). */
  async leave(): Promise<void> {
    if (this.ticket === undefined) return;
    const ticket = this.ticket;
    this.ticket = undefined;
    await this.#session.query(
      this.sql.unlockNode,
      [this.number, ticket],
      "runlock_queue_leave",
      false,
      this.#call.host.statementTimeout,
    );
  }

  /** Takes the ticket (and node and marker) a try took for us. */
  adopt(ticket: number): void {
    this.#joined = true;
    this.ticket = ticket;
  }

  /** Whether the session may hold a node or the marker of this queue. */
  get joined(): boolean {
    return this.#joined;
  }

  /** Drops every advisory lock of the session (it holds no lock of ours). */
  async leaveAll(): Promise<void> {
    this.ticket = undefined;
    await this.#session.query(
      this.#call.host.sql.unlockAll,
      [],
      "runlock_unlock_all",
      false,
      this.#call.host.statementTimeout,
    );
  }
}

/**
 * One slice of waiting on the key itself (outside the queue, as older
 * versions wait). Returns the record row when the lock was taken,
 * undefined when the slice ran out (lock_timeout).
 */
async function waitOnKey(
  call: Call,
  session: Session,
  slice: number,
  late: number,
): Promise<Record<string, unknown> | undefined> {
  try {
    const rows = await attempt(
      call,
      session,
      call.host.sql.waitAcquire,
      [...call.params, String(slice)],
      "runlock_wait",
      late,
    );
    return rows.length > 0 ? rows[0] : undefined;
  } catch (err) {
    if (sqlState(err) === "55P03") return undefined; // lock_not_available
    throw err;
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
 * was granted would otherwise leave this session holding it. (Used
 * outside the queue only: it drops a queue node too.)
 */
async function attempt(
  call: Call,
  session: Session,
  text: string,
  params: unknown[],
  statement: string,
  timeout = call.host.statementTimeout,
): Promise<Record<string, unknown>[]> {
  call.signal?.throwIfAborted();
  try {
    return await session.query(text, params, statement, false, timeout);
  } catch (err) {
    // An aborted acquire ends its session, which drops everything.
    if (session.lost !== undefined || call.signal?.aborted) throw err;
    await session.query(
      call.host.sql.unlockAll,
      [],
      "runlock_unlock_all",
      false,
      call.host.statementTimeout,
    );
    if (sqlState(err) === "23505") throw await collision(call, session, err);
    throw err;
  }
}

/** The KeyCollisionError for a unique_violation on `key`. */
async function collision(
  call: Call,
  session: Session,
  err: unknown,
): Promise<KeyCollisionError> {
  // unique_violation on `key`: another name's row has our key.
  const found = await find(
    session,
    call.host.sql,
    call.host.statementTimeout,
    call.name,
    call.key,
    call.tag,
  );
  return new KeyCollisionError(
    call.name,
    found.other ?? "(unknown)",
    call.key,
    { cause: err },
  );
}
