// The lock object a successful acquire returns, and the registry of the
// locks this process holds (locks are not reentrant).
import process from "node:process";
import type { RunlockError } from "../errors.ts";
import { describe, isSessionError, type Session } from "./_session.ts";
import type { Statements } from "./_sql.ts";
import { SessionLostError } from "./errors.ts";
import type { PgInspection, PgLock } from "./types.ts";

/**
 * The locks this process holds through any pgLocks object, by server,
 * database, schema and name, with when each was taken. Locks are not
 * reentrant (as file locks): acquiring one this process holds fails at
 * once with HeldError (byThisProcess) instead of waiting on itself.
 */
const heldHere = new Map<string, Date>();

/**
 * When this process took the lock `here` (server, database, schema and
 * name, see {@linkcode hereKey}), or undefined when it does not hold it.
 * `info`, when given, is what a probe of the lock just read.
 */
export function heldByThisProcess(
  here: string,
  _info?: PgInspection,
): Date | undefined {
  return heldHere.get(here);
}

/** The registry key of a lock name on one server, database and schema. */
export function hereKey(where: string, schema: string, name: string): string {
  return `${where}\0${schema}\0${name}`;
}

/** What a lock needs from the pgLocks object that handed it out. */
export interface LockOwner {
  readonly sql: Statements;
  /** Milliseconds a short statement may take before its session counts as dead. */
  readonly statementTimeout: number;
  startHeartbeat(session: Session): void;
  refused(name: string, action: string, err: unknown): RunlockError;
  giveBack(session: Session): void;
}

/** A held lock: its session, its record's fields and its loss signal. */
export class PgLockImpl implements PgLock {
  readonly path: string;
  readonly pid: number = process.pid;
  readonly acquiredAt: Date;
  readonly fence: bigint;
  readonly meta: Readonly<Record<string, string>>;
  readonly #controller = new AbortController();
  readonly #owner: LockOwner;
  readonly #session: Session;
  readonly #tag: { classid: string; objid: string };
  readonly #here: string;
  #released = false;

  constructor(
    owner: LockOwner,
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
