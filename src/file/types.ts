/**
 * The file lock's public types: the options of {@linkcode acquire} and
 * {@linkcode acquireSync}, and the {@linkcode Lock} they return. Re-exported
 * by `lock.ts`; they depend on no implementation, so every part of the lock
 * can name them.
 *
 * @module
 */

import type { HeldLock } from "../contract.ts";
import type { Meta } from "../meta.ts";

/**
 * Options for {@linkcode acquireSync}; {@linkcode acquire} also takes a
 * `signal` ({@linkcode AcquireOptions}).
 *
 * @example A private lock, waiting up to 2 seconds
 * ```ts
 * import { acquireSync, type AcquireSyncOptions } from "@runlock/runlock";
 *
 * const dir = Deno.makeTempDirSync();
 * const options: AcquireSyncOptions = { timeout: 2_000, mode: 0o600 };
 * using _lock = acquireSync(`${dir}/run.lock`, options);
 * ```
 */
export interface AcquireSyncOptions {
  /**
   * How long to keep trying while another run holds the lock, in
   * milliseconds. `0` (the default) fails at once with {@linkcode HeldError};
   * `Infinity` waits for as long as it takes.
   */
  timeout?: number;
  /**
   * The lock file's permission bits, whatever the umask: `0o644` by default,
   * so that other users' status commands can read it (probes need read
   * access to the file). `0o600` keeps it private to the owner. The owner
   * must be able to read it.
   */
  mode?: number;
  /**
   * User fields written into the record, where every prober can read them
   * (`inspect(path).meta`, `runlock status`): what this run is. Keys match
   * `[a-z0-9_.-]{1,64}`; values are one line of text; the whole record stays
   * within 4 KiB. The file is world-readable by default: do not put secrets
   * here.
   */
  meta?: Meta;
  /**
   * How often, in milliseconds, the held lock checks (one `lstat`) that its
   * file is still its own, besides watching its directory where the
   * runtime can without keeping the process alive (not under Deno). Default
   * 1000; `0` turns both off: the lock then never looks at its file on its
   * own, and only {@linkcode Lock.release} finds a loss. See
   * {@linkcode Lock.signal}.
   */
  checkInterval?: number;
}

/**
 * Options for {@linkcode acquire}.
 *
 * @example Waiting up to 5 seconds, or until shutdown
 * ```ts
 * import { acquire, type AcquireOptions } from "@runlock/runlock";
 *
 * const dir = await Deno.makeTempDir();
 * const options: AcquireOptions = {
 *   timeout: 5_000,
 *   signal: AbortSignal.timeout(10_000),
 * };
 * await using _lock = await acquire(`${dir}/run.lock`, options);
 * ```
 */
export interface AcquireOptions extends AcquireSyncOptions {
  /** Stops waiting: the promise rejects with the signal's reason. */
  signal?: AbortSignal;
}

/**
 * A held run lock. Release it exactly once, best with `using`/`await using`;
 * if the process dies instead, the kernel drops the flock and the next
 * {@linkcode acquire} takes the file over.
 *
 * @example Checking that nobody removed the file during a long run
 * ```ts
 * import { acquire, LockLostError } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * const lock = await acquire(`${dir}/run.lock`);
 * assert.equal(lock.isOwned(), true);
 * await Deno.remove(lock.path); // a careless cleanup job
 * assert.equal(lock.isOwned(), false);
 * await assert.rejects(lock.release(), LockLostError);
 * assert.equal(lock.released, true);
 * ```
 */
export interface Lock extends HeldLock, Disposable {
  /** The lock file, as passed to {@linkcode acquire}. */
  readonly path: string;
  /** The PID written into the file: this process. */
  readonly pid: number;
  /** When the lock was taken. */
  readonly acquiredAt: Date;
  /** Whether {@linkcode Lock.release} has run. */
  readonly released: boolean;
  /** The user fields written into the record (`{}` when none). */
  readonly meta: Readonly<Meta>;
  /**
   * Aborted, with a {@linkcode LockLostError} as its reason, as soon as the
   * lock is found lost while held: its file deleted or replaced (the reason
   * says which, and who holds it now if the new file names a holder). Found
   * by a watch on the lock's directory (Node, Bun) and by the periodic check
   * (`checkInterval`). Never aborted by a clean release. Pass it to work
   * that must stop when exclusion is gone.
   */
  readonly signal: AbortSignal;
  /**
   * Whether the file at {@linkcode Lock.path} is still the one this lock
   * created. `false` when someone deleted or replaced it behind our back,
   * or renamed its directory and made another in its place (so another run
   * may be active), or once released. A loss it finds aborts
   * {@linkcode Lock.signal}, as the periodic check would. Two `lstat`s: the
   * path as it was found, and the name in the pinned directory. That path
   * is read at the lock's first check or first `isOwned()`, whichever comes
   * first: a directory renamed before that (within the first turn of the
   * event loop, or with `checkInterval: 0` before the first call) is not
   * seen this way; the file itself deleted or replaced always is.
   */
  isOwned(): boolean;
  /**
   * Removes the file, then drops the flock. Idempotent.
   *
   * @throws {LockLostError} once, if the file had been deleted or replaced
   * by someone else (their file is left alone), or if a loss that left it
   * in place was found while held (its directory renamed and another made
   * in its place, or the file moved away and back; it is removed).
   */
  release(): Promise<void>;
  /** The synchronous form of {@linkcode Lock.release}. */
  releaseSync(): void;
}
