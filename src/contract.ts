/**
 * What every backend of runlock gives: lock files (`@runlock/runlock`) and
 * PostgreSQL (`@runlock/runlock/postgres`). Code written against these
 * types runs on either; each backend's own types add to them (a file lock's
 * `releaseSync()`, a PostgreSQL lock's `fence`).
 *
 * @example One function for both backends
 * ```ts
 * import * as files from "@runlock/runlock";
 * import type { HeldLock, Locks } from "@runlock/runlock";
 *
 * async function once(locks: Locks, name: string, work: (lock: HeldLock) => Promise<void>) {
 *   await using lock = await locks.acquire(name);
 *   await work(lock);
 * }
 *
 * const dir = await Deno.makeTempDir();
 * await once(files, `${dir}/run.lock`, async (lock) => {
 *   console.log(`pid ${lock.pid} holds ${lock.path}`);
 * });
 * ```
 *
 * @module
 */

import type { Meta } from "./meta.ts";

/**
 * A held lock, of either backend. Release it exactly once, best with
 * `await using`.
 *
 * @example Stopping work when the lock is lost
 * ```ts
 * import { acquire, type HeldLock } from "@runlock/runlock";
 *
 * const dir = await Deno.makeTempDir();
 * const lock: HeldLock = await acquire(`${dir}/run.lock`);
 * lock.signal.throwIfAborted(); // in a long loop: stop once exclusion is gone
 * await lock.release();
 * ```
 */
export interface HeldLock extends AsyncDisposable {
  /** The lock's path or name, as given to acquire. */
  readonly path: string;
  /** The PID in the record: this process. */
  readonly pid: number;
  /** When the lock was taken. */
  readonly acquiredAt: Date;
  /** Whether `release()` has run. */
  readonly released: boolean;
  /** The user fields written into the record (`{}` when none). */
  readonly meta: Readonly<Meta>;
  /**
   * Aborted, with a `LockLostError` as its reason, once the lock is found
   * lost while held. Never aborted by a clean release.
   */
  readonly signal: AbortSignal;
  /** Whether this lock is still this process's (`false` once released). */
  isOwned(): boolean | Promise<boolean>;
  /**
   * Releases the lock. Idempotent.
   *
   * @throws {LockLostError} once, if the lock had been lost while held.
   */
  release(): Promise<void>;
}

/**
 * What an inspection found, in either backend.
 *
 * @example Saying who runs
 * ```ts
 * import { inspect, type LockInspection } from "@runlock/runlock";
 *
 * const say = (i: LockInspection) =>
 *   i.state === "held" ? `running as pid ${i.pid} on ${i.host}` : i.state;
 * const dir = await Deno.makeTempDir();
 * console.log(say(await inspect(`${dir}/run.lock`))); // "free"
 * ```
 */
export interface LockInspection {
  /** The lock's path or name. */
  path: string;
  /**
   * - `free`: nobody holds it.
   * - `held`: a live run holds it.
   * - `stale`: a record left by a run that is gone; the next acquire
   *   takes it over.
   * - `invalid`: not a lock runlock can use; see `reason`.
   */
  state: "free" | "held" | "stale" | "invalid";
  /** The holder's PID (held) or the last holder's (stale); else 0. */
  pid: number;
  /** The holder's host, or `""`. */
  host: string;
  /** When the holder took the lock, when known. */
  started: Date | undefined;
  /** `true` when what holds it is not a runlock record (another tool's). */
  foreign: boolean;
  /** For `invalid` and foreign holders: what was found. */
  reason: string | undefined;
  /** The holder's runtime (`deno`, `node`, `bun`), or `""`. */
  runtime: string;
  /** The record's user fields; `{}` when none. */
  meta: Record<string, string>;
}

/**
 * Where locks are, as both backends offer them: the file backend's module
 * (`import * as files from "@runlock/runlock"`) and `pgLocks(url)`.
 *
 * @example A status line from either backend
 * ```ts
 * import * as files from "@runlock/runlock";
 * import type { Locks } from "@runlock/runlock";
 *
 * async function status(locks: Locks, name: string): Promise<string> {
 *   const { pid, alive } = await locks.activePid(name);
 *   return alive ? `running as pid ${pid}` : "not running";
 * }
 * const dir = await Deno.makeTempDir();
 * console.log(await status(files, `${dir}/run.lock`)); // "not running"
 * ```
 */
export interface Locks<
  L extends HeldLock = HeldLock,
  I extends LockInspection = LockInspection,
> {
  /**
   * Takes the lock `name`, waiting up to `timeout` ms (default 0: one
   * attempt).
   *
   * @throws {HeldError} a live run holds it, with its `pid` and `host`.
   */
  acquire(
    name: string,
    options?: { timeout?: number; signal?: AbortSignal; meta?: Meta },
  ): Promise<L>;
  /** Describes the lock `name` without taking it. */
  inspect(name: string): Promise<I>;
  /** Whether a live run holds the lock `name`. */
  held(name: string): Promise<boolean>;
  /** The holder's PID (or the last holder's) and whether it holds now. */
  activePid(name: string): Promise<{ pid: number; alive: boolean }>;
}

/**
 * What happened to a lock, as a watch of either backend reports it:
 * - `present`: the lock was there when the watch began (first batch only);
 * - `started`: a run took it;
 * - `released`: the run ended cleanly, or a crashed run's record was
 *   removed;
 * - `crashed`: the holder died and left its record: it is now stale;
 * - `taken over`: a new live holder, where a stale one was;
 * - `lost`: the run's record was deleted or replaced while its holder
 *   still holds it (that holder's `lock.signal` says so too).
 *
 * @example Counting the runs that ended badly
 * ```ts
 * import type { ChangeKind } from "@runlock/runlock";
 *
 * const bad = new Set<ChangeKind>(["crashed", "lost"]);
 * console.log(bad.has("released")); // false
 * ```
 */
export type ChangeKind =
  | "present"
  | "started"
  | "released"
  | "crashed"
  | "taken over"
  | "lost";

/**
 * One change of a lock, with what an inspection found after it.
 *
 * @example A change as a log line, from either backend
 * ```ts
 * import type { LockChange } from "@runlock/runlock";
 *
 * const line = (c: LockChange) =>
 *   `${c.kind} ${c.path} pid=${c.inspection.pid} (${c.inspection.state})`;
 * ```
 */
export interface LockChange<I extends LockInspection = LockInspection> {
  /** The lock's path or name. */
  path: string;
  /** What happened; `present` only in the first batch. */
  kind: ChangeKind;
  /** The lock's state after the change. */
  inspection: I;
}
