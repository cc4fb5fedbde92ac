/**
 * Taking the lock: {@linkcode acquire} and {@linkcode acquireSync}, and the
 * {@linkcode Lock} they return (its types in `types.ts`). Beside them: the
 * held lock (`_held.ts`), the option checks (`_options.ts`) and the wait
 * (`_wait.ts`).
 *
 * @module
 */

import { lockPath, within } from "./_protocol.ts";
import { pin, runSync } from "./_attempt.ts";
import { fileKey, type Listener, listenFile } from "./_events.ts";
import { RunLock } from "./_held.ts";
import { checkOptions } from "./_options.ts";
import {
  acquireSteps,
  ASYNC_SLEEPS,
  SYNC_SLEEPS,
  type Woken,
} from "./_wait.ts";
import type { AcquireOptions, AcquireSyncOptions, Lock } from "./types.ts";
import { platform as p } from "../platform/current.ts";

export type { AcquireOptions, AcquireSyncOptions, Lock } from "./types.ts";

/**
 * Takes the run lock at `path`, creating missing parent directories.
 *
 * Fails at once with {@linkcode HeldError} when another live run holds it,
 * unless `timeout` says to wait, and at once when this process holds it
 * already (locks are not reentrant). A file left by a crashed run is taken
 * over silently. Never blocks a thread in `flock(2)`: waiting retries the
 * non-blocking attempt, and wakes early when the file goes away.
 *
 * The lock's directory is resolved once, here, and pinned: the lock means
 * the file it took, whatever later happens to the path (a re-pointed
 * symlink, a `chdir` after a relative path). The file lands where the
 * kernel resolves `path`, `..` and symlinked directories included.
 *
 * Permissions (Deno): `--allow-read` and `--allow-write` for the lock's
 * directory. Optional: `--allow-sys=hostname` to record the host name, and
 * `--allow-run` to judge foreign pidfiles. Never prompts.
 *
 * @param path The lock file, for example `.state/run.lock`.
 * @param options `timeout` (ms), `signal` and `mode`.
 * @returns The held {@linkcode Lock}.
 * @throws {TypeError} `path` is empty, holds a NUL, or names a directory.
 * @throws {RangeError} `timeout` or `mode` is out of range.
 * @throws {HeldError} another live run holds it (after `timeout`), or this
 * process does; also for a user who may not write the lock's directory, or
 * who finds it on a read-only mount (such a waiter waits like any other).
 * @throws {InvalidLockFileError} the file is not a lock runlock can use; it is left untouched.
 * @throws {LockPermissionError} the OS or Deno refuses access: where this
 * user may not create files in the lock's directory (or its filesystem is
 * read-only), when the lock is free, stale or unreadable, not while a live
 * run holds it.
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
  const lp = lockPath(path, "acquire the lock");
  const checked = checkOptions(options);
  const signal = options?.signal;
  signal?.throwIfAborted();
  const target = pin(lp);
  let wake: (() => void) | undefined;
  let listener: Listener | undefined;
  const woken: Woken = { woken: false };
  // A waiter watches the lock file there now (PROTOCOL.md, "Waiting"). The
  // close watch (Node and Bun on Linux) sees every end of the file: no
  // fs.watch beside it (Bun's first costs 2 ms of CPU and a thread).
  let unclose: (() => void) | undefined;
  let closeKey = "";
  // Watch anew after an event: the next file may get the old inode number
  // (ext4 reuses them at once).
  let stale = false;
  const onEvent = () => {
    stale = true;
    woken.ended = true;
    wake?.();
  };
  const watch = (): string | undefined => {
    const key = fileKey(target.pinned, target.name);
    if (key === "") return "";
    if (stale) {
      stale = false;
      closeKey = "";
      unclose?.();
      unclose = undefined;
      listener?.stop();
      listener = undefined;
    }
    if (closeKey !== key) {
      unclose?.();
      closeKey = key;
      const prefix = target.pinned.prefix;
      unclose = p.watchClose(within(prefix, target.name), onEvent, true);
    }
    // Armed by path: the key, read again after arming, is of what they watch.
    if (unclose !== undefined) {
      listener?.stop();
      listener = undefined;
      woken.watched = true;
      return fileKey(target.pinned, target.name) === key ? key : "";
    }
    // One Deno refused (see `Platform.watchDir`) is asked for at each sleep.
    if (listener?.key !== key || !listener.watching()) {
      listener?.stop();
      const made = listenFile(target.pinned, target.name, onEvent);
      listener = typeof made === "object" ? made : undefined;
      if (made === "ENOENT") return "";
    }
    const watching = listener?.watching() === true;
    woken.watched = watching && p.watchSeesClose;
    if (!watching) return undefined;
    return fileKey(target.pinned, target.name) === key && listener!.key === key
      ? key
      : "";
  };
  const steps = acquireSteps(target, checked, watch, ASYNC_SLEEPS, woken);

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
        const woke = () => {
          woken.woken = true;
          done();
        };
        const abort = () => {
          clearTimeout(timer);
          wake = undefined;
          reject(signal?.reason);
        };
        const timer = setTimeout(done, step.value as number);
        wake = woke;
        signal?.addEventListener("abort", abort, { once: true });
      });
      step = steps.next();
    }
    return new RunLock(target, step.value, checked.meta, checked.checkInterval);
  } finally {
    steps.return(undefined as never); // discards a temp file on abort
    listener?.stop();
    unclose?.();
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
 * @param options `timeout` (ms) and `mode`.
 * @returns The held {@linkcode Lock}.
 * @throws {TypeError} `path` is empty, holds a NUL, or names a directory.
 * @throws {RangeError} `timeout` or `mode` is out of range.
 * @throws {HeldError} another live run holds it (after `timeout`), or this
 * process does; also for a user who may not write the lock's directory, or
 * who finds it on a read-only mount (such a waiter waits like any other).
 * @throws {InvalidLockFileError} the file is not a lock runlock can use; it is left untouched.
 * @throws {LockPermissionError} the OS or Deno refuses access: where this
 * user may not create files in the lock's directory (or its filesystem is
 * read-only), when the lock is free, stale or unreadable, not while a live
 * run holds it.
 * @throws {UnsupportedFilesystemError} no hard links or no flock there.
 * @throws {ContendedError} every attempt lost a race; try again.
 *
 * @example A second acquire in the same process is refused at once
 * ```ts
 * import { acquireSync, HeldError } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const dir = Deno.makeTempDirSync();
 * using lock = acquireSync(`${dir}/run.lock`);
 * assert.throws(
 *   () => acquireSync(lock.path, { timeout: 60_000 }),
 *   (err) => err instanceof HeldError && err.byThisProcess,
 * );
 * ```
 */
export function acquireSync(path: string, options?: AcquireSyncOptions): Lock {
  const lp = lockPath(path, "acquire the lock");
  const checked = checkOptions(options);
  const target = pin(lp);
  return new RunLock(
    target,
    runSync(
      acquireSteps(target, checked, () => undefined, SYNC_SLEEPS, {
        woken: false,
      }),
    ),
    checked.meta,
    checked.checkInterval,
  );
}
