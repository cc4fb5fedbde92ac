/**
 * Taking and releasing the lock: {@linkcode acquire}, {@linkcode acquireSync}
 * and the {@linkcode Lock} they return.
 *
 * @module
 */

import { basename, dirname } from "node:path";
import {
  type Acquired,
  attemptLoop,
  errnoOf,
  type HeldBy,
  mapError,
  probe,
  runSync,
} from "./_protocol.ts";
import { ContendedError, HeldError, LockLostError } from "./errors.ts";
import { platform as p } from "./platform/current.ts";
import type { FileInfo, Handle } from "./platform/types.ts";

/**
 * Options for {@linkcode acquire} and {@linkcode acquireSync}.
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
export interface AcquireOptions {
  /**
   * How long to keep trying while another run holds the lock, in
   * milliseconds. `0` (the default) fails at once with {@linkcode HeldError};
   * `Infinity` waits for as long as it takes.
   */
  timeout?: number;
  /**
   * Stops waiting: the promise rejects with the signal's reason.
   * Only {@linkcode acquire} takes it.
   */
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
export interface Lock extends Disposable, AsyncDisposable {
  /** The lock file, as passed to {@linkcode acquire}. */
  readonly path: string;
  /** The PID written into the file: this process. */
  readonly pid: number;
  /** When the lock was taken. */
  readonly acquiredAt: Date;
  /** Whether {@linkcode Lock.release} has run. */
  readonly released: boolean;
  /**
   * Whether the file at {@linkcode Lock.path} is still the one this lock
   * created. `false` when someone deleted or replaced it behind our back
   * (so another run may be active), or once released. One `lstat`.
   */
  isOwned(): boolean;
  /**
   * Removes the file, then drops the flock. Idempotent.
   *
   * @throws {LockLostError} once, if the file had been deleted or replaced
   * by someone else; their file is left alone.
   */
  release(): Promise<void>;
  /** The synchronous form of {@linkcode Lock.release}. */
  releaseSync(): void;
}

class RunLock implements Lock {
  readonly path: string;
  readonly pid: number = p.pid;
  readonly acquiredAt: Date;
  #handle: Handle | undefined;
  #id: FileInfo;

  constructor(path: string, acquired: Acquired) {
    this.path = path;
    this.acquiredAt = acquired.started;
    this.#handle = acquired.handle;
    this.#id = acquired.id;
  }

  get released(): boolean {
    return this.#handle === undefined;
  }

  isOwned(): boolean {
    if (this.#handle === undefined) return false;
    try {
      const now = p.lstat(this.path);
      return now !== null && now.dev === this.#id.dev &&
        now.ino === this.#id.ino;
    } catch {
      return false;
    }
  }

  releaseSync(): void {
    const handle = this.#handle;
    if (handle === undefined) return;
    this.#handle = undefined;
    let lost: string | undefined;
    try {
      // Unlink first, unlock second: while we hold LOCK_EX on the inode that
      // the path names, no other participant can unlink or replace it.
      const now = p.lstat(this.path);
      if (now === null) {
        lost = "was deleted";
      } else if (now.dev !== this.#id.dev || now.ino !== this.#id.ino) {
        lost = "was replaced by another file";
      } else {
        p.unlink(this.path);
      }
    } catch (err) {
      if (errnoOf(err) === "ENOENT") {
        lost = "was deleted";
      } else {
        handle.close();
        throw mapError(err, this.path, "cannot remove the lock file");
      }
    }
    handle.close();
    if (lost !== undefined) throw new LockLostError(this.path, this.pid, lost);
  }

  release(): Promise<void> {
    try {
      this.releaseSync();
      return Promise.resolve();
    } catch (err) {
      return Promise.reject(err);
    }
  }

  [Symbol.dispose](): void {
    this.releaseSync();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.release();
  }
}

function checkArgs(
  path: unknown,
  options: AcquireOptions | undefined,
): number {
  if (typeof path !== "string" || path === "" || path.includes("\0")) {
    throw new TypeError(
      `Cannot acquire the lock as 'path' must be a non-empty string without NUL: current value is ${
        JSON.stringify(path)
      }`,
    );
  }
  if (path.endsWith("/")) {
    throw new TypeError(
      `Cannot acquire the lock as 'path' must name a file, not a directory: current value is ${
        JSON.stringify(path)
      }`,
    );
  }
  const timeout = options?.timeout ?? 0;
  if (typeof timeout !== "number" || Number.isNaN(timeout) || timeout < 0) {
    throw new RangeError(
      `Cannot acquire the lock as 'timeout' must be a non-negative number of milliseconds: current value is ${
        String(timeout)
      }`,
    );
  }
  return timeout;
}

const MAX_POLL_MS = 10;

/**
 * The whole acquire: attempt loops, and between them, while the lock is
 * held and time remains, polls of the read-only probe (no temp files, no
 * writes) until the lock looks free. Yields sleeps; `onWait` is called once
 * when waiting starts.
 */
function* acquireSteps(
  path: string,
  timeout: number,
  onWait: () => void,
): Generator<number, Acquired, void> {
  const deadline = performance.now() + timeout;
  const remaining = () => deadline - performance.now();
  for (let waited = false;; waited = true) {
    let held: HeldBy | ContendedError;
    try {
      const outcome = yield* attemptLoop(path);
      if ("handle" in outcome) return outcome;
      held = outcome;
    } catch (err) {
      if (!(err instanceof ContendedError)) throw err;
      held = err;
    }
    if (remaining() <= 0) {
      if (held instanceof ContendedError) throw held;
      throw new HeldError(path, held.pid, held.host);
    }
    if (!waited) onWait();
    // Poll with a growing interval (1 ms to 10 ms) until the lock looks
    // free or time is up; a watcher may cut a sleep short.
    for (
      let interval = 1;
      remaining() > 0;
      interval = Math.min(interval * 2, MAX_POLL_MS)
    ) {
      yield Math.max(0, Math.min(interval, remaining()));
      if (probe(path).state !== "held") break;
    }
  }
}

/**
 * Takes the run lock at `path`, creating missing parent directories.
 *
 * Fails at once with {@linkcode HeldError} when another live run holds it,
 * unless `timeout` says to wait. A file left by a crashed run is taken over
 * silently. Never blocks a thread in `flock(2)`: waiting retries the
 * non-blocking attempt, and wakes early when the file goes away.
 *
 * Permissions (Deno): `--allow-read` and `--allow-write` for the lock's
 * directory. Optional: `--allow-sys=hostname` to record the host name, and
 * `--allow-run` to judge foreign pidfiles. Never prompts.
 *
 * @param path The lock file, for example `.state/run.lock`.
 * @param options `timeout` (ms) and `signal`.
 * @returns The held {@linkcode Lock}.
 * @throws {HeldError} another live run holds it (after `timeout`).
 * @throws {InvalidLockFileError} the file is not a lock runlock can use; it is left untouched.
 * @throws {LockPermissionError} the OS or Deno refuses access.
 * @throws {UnsupportedFilesystemError} no hard links or no flock there.
 * @throws {ContendedError} every attempt lost a race; try again.
 *
 * @example Holding the lock for a block
 * ```ts
 * import { acquire, held } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * {
 *   await using lock = await acquire(`${dir}/.state/run.lock`);
 *   assert.equal(lock.pid, Deno.pid);
 *   assert.equal(await held(lock.path), true);
 * }
 * assert.equal(await held(`${dir}/.state/run.lock`), false);
 * await Deno.remove(dir, { recursive: true });
 * ```
 */
export async function acquire(
  path: string,
  options?: AcquireOptions,
): Promise<Lock> {
  const timeout = checkArgs(path, options);
  const signal = options?.signal;
  signal?.throwIfAborted();
  let wake: (() => void) | undefined;
  let unwatch: (() => void) | undefined;
  const name = basename(path);
  const steps = acquireSteps(path, timeout, () => {
    unwatch = p.watchDir(dirname(path), (changed) => {
      if (changed === name) wake?.();
    });
  });
  try {
    let step = steps.next();
    while (!step.done) {
      await new Promise<void>((resolve, reject) => {
        const done = () => {
          clearTimeout(timer);
          signal?.removeEventListener("abort", abort);
          wake = undefined;
          resolve();
        };
        const abort = () => {
          clearTimeout(timer);
          wake = undefined;
          reject(signal?.reason);
        };
        const timer = setTimeout(done, step.value as number);
        wake = done;
        signal?.addEventListener("abort", abort, { once: true });
      });
      step = steps.next();
    }
    return new RunLock(path, step.value);
  } finally {
    steps.return(undefined as never); // discards a temp file on abort
    unwatch?.();
  }
}

/**
 * The synchronous form of {@linkcode acquire}: same protocol, same errors.
 * With a `timeout` it blocks the thread between attempts (it never blocks
 * in `flock(2)` itself), so prefer {@linkcode acquire} where you can.
 *
 * Permissions (Deno): as for {@linkcode acquire}.
 *
 * @param path The lock file.
 * @param options `timeout` (ms); `signal` is ignored.
 * @returns The held {@linkcode Lock}.
 * @throws {HeldError} another live run holds it (after `timeout`).
 * @throws {InvalidLockFileError} the file is not a lock runlock can use; it is left untouched.
 * @throws {LockPermissionError} the OS or Deno refuses access.
 * @throws {UnsupportedFilesystemError} no hard links or no flock there.
 * @throws {ContendedError} every attempt lost a race; try again.
 *
 * @example A second acquire in the same process is refused
 * ```ts
 * import { acquireSync, HeldError } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const dir = Deno.makeTempDirSync();
 * using lock = acquireSync(`${dir}/run.lock`);
 * assert.throws(() => acquireSync(lock.path), HeldError);
 * ```
 */
export function acquireSync(path: string, options?: AcquireOptions): Lock {
  const timeout = checkArgs(path, options);
  return new RunLock(path, runSync(acquireSteps(path, timeout, () => {})));
}
