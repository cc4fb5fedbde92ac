// Waiting for a lock, first come, first served, in slices.
//
// No wait statement outlasts a slice (WAIT_SLICE_MS): a blocked statement
// holds a snapshot, so VACUUM's horizon. The server's own queue is FIFO,
// but a waiter whose slice ran out rejoins at its back (with 20 workers
// on one key, waits of 3 times the FIFO bound). So waiters form a CLH
// queue of advisory locks (statements: _queue_sql.ts):
// - a waiter takes a ticket after the greatest in the name's queue and
//   holds its node (queue, ticket);
// - it waits on its live predecessor's node, which nobody else waits on,
//   so a slice that runs out loses nothing; when that node is let go of,
//   it finds its next predecessor in the same statement, or waits on the
//   key if it has none;
// - the head, once granted the key, lets go of its node in the same
//   statement, so its successor waits on the key before the head's answer
//   has even reached it.
// A node lives as long as its session: after a restart every waiter
// queues again. Out of order still: a try, or a waiter's try at the end
// of a slice, in the moment between a release and the next head's wait;
// waiters of runlock versions without the queue, which wait on the key
// beside our head; two names whose queue numbers (32 bits of the key)
// collide, sharing a queue; a predecessor stopped (SIGSTOP) as it is
// handed its node. Each costs a waiter at most a slice, since it tries
// the lock at the end of each. In pg_locks a queue is one granted lock
// (classid queue, objid ticket, objsubid 2) per waiter, each but the
// head's watched by one ungranted lock.
import { sqlState } from "./_failure.ts";
import type { AcquireHost } from "./_host.ts";
import type { LockTag } from "./_key.ts";
import { find } from "./_probe.ts";
import { type QueueStatements, queueStatements } from "./_queue_sql.ts";
import type { Session } from "./_session.ts";
import { KeyCollisionError } from "./errors.ts";

/** A blocked wait holds a snapshot (and VACUUM's horizon): wait in slices. */
export const WAIT_SLICE_MS = 5_000;
/** Tickets to try when other waiters keep taking the same one. */
const ENQUEUE_TRIES = 8;
/** The DDL lock's first key (_sql.ts), which no queue may use. */
const DDL_KEY = 1920298604;

/** One acquire: what every step needs. */
export interface Call {
  host: AcquireHost;
  name: string;
  key: bigint;
  tag: LockTag;
  /** The acquire statements' $1-$6. */
  params: unknown[];
  /** Whether it may wait (a timeout above 0). */
  waits: boolean;
  deadline: number;
  signal: AbortSignal | undefined;
}

const queueSql = new Map<string, QueueStatements>();

/** This acquire's place in the name's queue, on one session. */
export class Queue {
  readonly #call: Call;
  readonly #session: Session;
  readonly sql: QueueStatements;
  /** The queue's number: 32 bits of the key, never the DDL lock's. */
  readonly number: number;
  /** Whether we tried to join the queue (its marker may be ours). */
  #joined = false;
  /** Our ticket while we hold our node. */
  ticket: number | undefined;
  /** False once the queue failed us: wait on the key itself. */
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
    return this.#session.query(text, params, timeout, statement);
  }

  /**
   * Waits for one slice, or less: returns the record row once the lock
   * is ours, undefined when the slice ran out (the caller tries again).
   */
  async wait(): Promise<Record<string, unknown> | undefined> {
    const call = this.#call;
    if (this.ticket === undefined && this.#usable) await this.#enqueue();
    // Unknown at first: the statement finds it.
    let pred: number | null = null;
    for (;;) {
      const remaining = call.deadline - performance.now();
      if (remaining <= 0) return undefined;
      const slice = Math.ceil(Math.min(remaining, WAIT_SLICE_MS));
      // No answer by the slice's end plus a heartbeat timeout: unreachable.
      const late = slice + call.host.heartbeatTimeout;
      if (this.ticket === undefined) {
        return await waitOnKey(call, this.#session, slice, late);
      }
      const ticket = this.ticket;
      let row: Record<string, unknown> | undefined;
      try {
        [row] = await this.#query(
          this.sql.wait,
          [
            ...call.params,
            String(slice),
            this.number,
            ticket,
            pred,
            this.#session.nonce,
          ],
          "runlock_queue_wait",
          late,
        );
      } catch (err) {
        if (this.#session.lost !== undefined || call.signal?.aborted) {
          throw err;
        }
        // The key, if granted, outlives the failure (§13.3.5): drop it,
        // and learn whether our node is still ours.
        const [state] = await this.#session.query(
          this.sql.afterWait,
          [
            String(call.key),
            call.tag.classid,
            call.tag.objid,
            this.number,
            ticket,
            this.#session.nonce,
          ],
          call.host.statementTimeout,
          "runlock_queue_after_wait",
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
          [this.number, this.#session.nonce],
          "runlock_queue_enqueue",
          this.#call.host.statementTimeout,
        );
      } catch (err) {
        if (this.#session.lost !== undefined || this.#call.signal?.aborted) {
          throw err;
        }
        break; // e.g. tickets overflowed: wait on the key itself
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
      [this.number, ticket, this.#session.nonce],
      this.#call.host.statementTimeout,
      "runlock_queue_leave",
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
      [this.#session.nonce],
      this.#call.host.statementTimeout,
      "runlock_unlock_all",
    );
  }
}

/**
 * One slice of waiting on the key itself, outside the queue: the record
 * row, or undefined when the slice ran out (lock_timeout).
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
 * Runs an acquire statement with the session's nonce as its last
 * parameter. After a failure, drops every advisory lock of the session:
 * one the statement was granted outlives its rollback (§13.3.5). Outside
 * the queue only: it drops a queue node too.
 */
export async function attempt(
  call: Call,
  session: Session,
  text: string,
  params: unknown[],
  statement: string,
  timeout = call.host.statementTimeout,
): Promise<Record<string, unknown>[]> {
  call.signal?.throwIfAborted();
  try {
    return await session.query(
      text,
      [...params, session.nonce],
      timeout,
      statement,
    );
  } catch (err) {
    // An aborted acquire ends its session, which drops everything.
    if (session.lost !== undefined || call.signal?.aborted) throw err;
    await session.query(
      call.host.sql.unlockAll,
      [session.nonce],
      call.host.statementTimeout,
      "runlock_unlock_all",
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
