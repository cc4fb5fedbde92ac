// What the procedures of a pgLocks object (acquire, the lock, watch) need
// from it: types only, so that they depend on it and it on none of them.
import type { RunlockError } from "../errors.ts";
import type { LockTag } from "./_key.ts";
import type { Session } from "./_session.ts";
import type { Statements } from "./_sql.ts";
import type { PgLock } from "./types.ts";

/** What every procedure needs. */
export interface Host {
  readonly sql: Statements;
  /** The schema of the table: part of each name's advisory key. */
  readonly schema: string;
  /** Milliseconds a short statement may take before its session counts as dead. */
  readonly statementTimeout: number;
  /** A RunlockError for a statement the server refused. */
  refused(name: string, action: string, err: unknown): RunlockError;
}

/** What a lock needs from the pgLocks object that handed it out. */
export interface LockOwner extends Host {
  /** Starts the heartbeat that proves `session` still holds `tag`. */
  startHeartbeat(session: Session, tag: LockTag): void;
  /** Keeps a session for reuse, or closes it. */
  giveBack(session: Session): void;
}

/** What the acquire procedure needs. */
export interface AcquireHost extends LockOwner {
  /** The heartbeat's timeout (ms): how late a slice's answer may be. */
  readonly heartbeatTimeout: number;
  /** The registry key of `name` (see heldByThisProcess). */
  here(name: string): string;
  /** A released session of this object, or a new one. */
  take(
    name: string,
    signal?: AbortSignal,
  ): Promise<{ session: Session; reused: boolean }>;
  /** Creates the table on first use (undefined once it exists). */
  ensureTable(session: Session): Promise<void> | undefined;
  /** The lock object for a successful acquire statement's row. */
  lock(
    session: Session,
    name: string,
    row: Record<string, unknown>,
    meta: Record<string, string>,
    tag: LockTag,
  ): PgLock;
}

/** What a watch needs. */
export interface WatchHost extends Host {
  /** A probe session of the watch's own; `signal` abandons connecting. */
  openProbe(
    name: string,
    action: string,
    signal?: AbortSignal,
  ): Promise<Session>;
  /**
   * Keeps `stop` until the returned function is called: end() calls
   * every `stop` kept, and waits for each.
   */
  track(stop: () => Promise<void>): () => void;
}
