// The lock object a successful acquire returns, and the registry of the
// locks this process holds (locks are not reentrant).
import { process } from "../_process.ts";
import { describe, isSessionError } from "./_failure.ts";
import type { LockOwner } from "./_host.ts";
import type { LockTag } from "./_key.ts";
import type { PgInspection } from "./_probe_types.ts";
import { hostName } from "../platform/runtime.ts";
import type { Session } from "./_session.ts";
import { SessionLostError } from "./errors.ts";
import type { PgLock } from "./types.ts";

/** This copy's held locks by hereKey, with when taken: no round trip. */
const heldHere = new Map<string, Date>();

/**
 * The locks this process holds through any copy of runlock, by backend
 * pid, fence and name. In the global symbol registry (versioned name):
 * the npm package's ESM and CommonJS builds in one Node process are two
 * copies, each of which would wait on the other's lock.
 */
const heldInProcess: Map<string, Date> = (() => {
  const slot = Symbol.for("runlock.postgres.heldInProcess.v1");
  const g = globalThis as unknown as Record<symbol, Map<string, Date>>;
  return g[slot] ??= new Map();
})();

function inProcessKey(backendPid: number, fence: bigint, name: string) {
  return `${backendPid}\0${fence}\0${name}`;
}

/**
 * When this process took the lock a probe just read (`info`), through any
 * pgLocks object, copy of runlock or spelling of the server; else
 * undefined. Pid and host are not enough (another container may share
 * them): the key's holder session must also be one of ours with this name
 * and fence. A false match (a twin on another server with the same
 * backend pid, name and fence) costs a HeldError, never two holders.
 *
 * @param info What a probe of the lock read.
 * @returns When this process took it, or undefined.
 */
export function ownedByThisProcess(info: PgInspection): Date | undefined {
  if (
    info.state !== "held" || info.foreign || info.fence === undefined ||
    info.backendPid === 0 || info.pid !== process.pid ||
    info.host !== hostName()
  ) {
    return undefined;
  }
  return heldInProcess.get(
    inProcessKey(info.backendPid, info.fence, info.path),
  );
}

/**
 * When this process took the lock `here` (server, database, schema and
 * name, see {@linkcode hereKey}), or undefined when it does not hold it.
 * `info`, when given, is what a probe of the lock just read: then a lock
 * this process holds through another URL spelling or another copy of
 * runlock counts too (see {@linkcode ownedByThisProcess}).
 *
 * @param here The lock's registry key, from {@linkcode hereKey}.
 * @param info What a probe of the lock just read, if any.
 * @returns When this process took it, or undefined.
 */
export function heldByThisProcess(
  here: string,
  info?: PgInspection,
): Date | undefined {
  const since = heldHere.get(here);
  if (since !== undefined || info === undefined) return since;
  return ownedByThisProcess(info);
}

/**
 * The registry key of a lock name on one server, database and schema.
 *
 * @param where `host:port/database`, as the URL spells it.
 * @param schema The schema of the table.
 * @param name The lock name.
 * @returns The key.
 */
export function hereKey(where: string, schema: string, name: string): string {
  return `${where}\0${schema}\0${name}`;
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
  readonly #tag: LockTag;
  readonly #here: string;
  readonly #inProcess: string;
  #released = false;

  constructor(
    owner: LockOwner,
    session: Session,
    name: string,
    row: Record<string, unknown>,
    meta: Record<string, string>,
    tag: LockTag,
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
    this.#inProcess = inProcessKey(session.backendPid, this.fence, name);
    heldHere.set(here, this.acquiredAt);
    heldInProcess.set(this.#inProcess, this.acquiredAt);
    const lose = (what: string) => {
      heldHere.delete(here);
      heldInProcess.delete(this.#inProcess);
      this.#controller.abort(
        new SessionLostError(name, this.pid, what, this.fence),
      );
    };
    session.onLost = lose;
    owner.startHeartbeat(session, tag);
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
        [this.#tag.classid, this.#tag.objid, this.#session.nonce],
        this.#owner.statementTimeout,
        "runlock_owned",
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
    heldInProcess.delete(this.#inProcess);
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
        [this.path, String(this.fence), session.nonce],
        this.#owner.statementTimeout,
        "runlock_release",
      );
    } catch (err) {
      const why = session.lost;
      session.destroy();
      if (isSessionError(err)) {
        // The session died before or during the release (or its statement
        // reached another client's server session): the lock went with
        // it, possibly before we stopped working.
        const lost = new SessionLostError(
          this.path,
          this.pid,
          why ?? `ended: ${describe(err)}`,
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
