/**
 * Taking and releasing the lock: {@linkcode acquire}, {@linkcode acquireSync}
 * and the {@linkcode Lock} they return.
 *
 * @module
 */

import {
  type Acquired,
  DEFAULT_MODE,
  errnoOf,
  type HeldBy,
  heldHere,
  identityHere,
  inodeKey,
  lockPath,
  mapError,
  recordSize,
  type Target,
  within,
} from "./_protocol.ts";
import { attemptLoop, pin, runSync } from "./_attempt.ts";
import { probe } from "./_probe.ts";
import { ContendedError, HeldError, LockLostError } from "./errors.ts";
import { checkMeta, type Meta } from "./meta.ts";
import { MAX_RECORD_BYTES, metaLines } from "./record.ts";
import { platform as p } from "./platform/current.ts";
import type { FileInfo, Handle } from "./platform/types.ts";

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
export interface Lock extends Disposable, AsyncDisposable {
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
  readonly meta: Readonly<Meta>;
  #target: Target;
  #handle: Handle | undefined;
  #id: FileInfo;
  #lost = new AbortController();
  #stop: (() => void)[] = [];
  /** The lock file's path as first seen, when pinned by a descriptor. */
  #named: string | undefined;
  /** A watch saw our name created, removed or renamed. */
  #moved = false;

  constructor(
    target: Target,
    acquired: Acquired,
    meta: Meta,
    checkInterval: number,
  ) {
    this.path = target.path;
    this.acquiredAt = acquired.started;
    this.meta = Object.freeze(meta);
    this.#target = target;
    this.#handle = acquired.handle;
    this.#id = acquired.id;
    heldHere.set(inodeKey(acquired.id), acquired.started);
    // Loss is an event: watch the directory where that keeps nothing alive,
    // and check on an unref'd timer.
    const check = () => this.#check();
    // checkInterval 0: the lock never looks at its file on its own (no
    // timer, no watch); only release() finds a loss.
    if (checkInterval === 0) return;
    this.#stop.push(p.unrefInterval(check, checkInterval));
    // The watch starts once the event loop turns, not here: a lock taken
    // and released in one synchronous stretch (a CLI, a tight loop) pays
    // for no watcher, and leaves none waiting to be freed.
    this.#stop.push(p.unrefLater(() => {
      if (this.#handle === undefined) return;
      // Where the directory is pinned by a descriptor, its path can move
      // away from the lock (the directory renamed, another made in its
      // place, where a new run may start): remember where the file is now.
      if (target.pinned.byDescriptor) {
        const dir = p.realDir(target.pinned.prefix);
        if (dir !== "") this.#named = within(dir, target.name);
      }
      const unwatch = p.watchDir(target.pinned.prefix, (name, moved) => {
        if (name !== target.name) return;
        // Nobody else creates, removes or renames our name while we hold
        // it: such an event is a loss even if the file is back by the time
        // we look (moved aside, another run in and out, moved back).
        if (moved) this.#moved = true;
        check();
      }, false);
      if (unwatch) this.#stop.push(unwatch);
      check(); // anything that happened before the watch began
    }));
  }

  get signal(): AbortSignal {
    return this.#lost.signal;
  }

  #stopWatching(): void {
    for (const stop of this.#stop.splice(0)) stop();
  }

  /** What happened to our file, or undefined while it is ours. */
  #loss(): LockLostError | undefined {
    const ours = (info: FileInfo | null) =>
      info !== null && info.dev === this.#id.dev && info.ino === this.#id.ino;
    // The path as it was named is read before the pinned one: a file
    // replaced between the two reads then shows as replaced (the pinned read
    // sees the new file), never as a directory moved away (the order the
    // other way round read our file through the pin, then the replacement
    // through the name, and said the directory had moved).
    // A failed read of the name proves nothing (the pinned read decides).
    let named: FileInfo | null | undefined;
    try {
      if (this.#named !== undefined) named = p.lstat(this.#named);
    } catch {
      named = undefined;
    }
    const now = this.#target.pinned.lstat(this.#target.name);
    if (ours(now)) {
      if (this.#moved) {
        return new LockLostError(
          this.path,
          this.pid,
          "was moved away and back (another run may have held the lock meanwhile)",
        );
      }
      if (named === undefined || ours(named)) return undefined;
      return new LockLostError(
        this.path,
        this.pid,
        "was moved away from its path (its directory was renamed or replaced)",
      );
    }
    if (now === null) {
      return new LockLostError(this.path, this.pid, "was deleted");
    }
    let holder: { pid: number; host: string } | undefined;
    // Who holds it now is a courtesy, not worth a probe that could block
    // (a FIFO swapped in, where open has no O_NONBLOCK): the loss is the news.
    if (!p.openMayBlock) {
      try {
        const found = probe(this.#target, this.#target.pinned);
        if (found.state === "held" && found.pid > 0) {
          holder = { pid: found.pid, host: found.host };
        }
      } catch {
        // The loss is the news.
      }
    }
    return new LockLostError(
      this.path,
      this.pid,
      "was replaced by another file",
      { holder },
    );
  }

  #check(): void {
    if (this.#handle === undefined || this.#lost.signal.aborted) return;
    let loss: LockLostError | undefined;
    try {
      loss = this.#loss();
    } catch {
      return; // A failed lstat proves nothing; look again next time.
    }
    if (loss === undefined) return;
    this.#stopWatching();
    this.#lost.abort(loss);
  }

  get released(): boolean {
    return this.#handle === undefined;
  }

  isOwned(): boolean {
    if (this.#handle === undefined) return false;
    try {
      const now = this.#target.pinned.lstat(this.#target.name);
      return now !== null && now.dev === this.#id.dev &&
        now.ino === this.#id.ino;
    } catch {
      return false;
    }
  }

  releaseSync(): void {
    const handle = this.#handle;
    if (handle === undefined) return;
    this.#stopWatching();
    this.#handle = undefined;
    heldHere.delete(inodeKey(this.#id));
    const target = this.#target;
    let lost: string | undefined;
    try {
      // Unlink first, unlock second: while we hold LOCK_EX on the inode that
      // the name names, no other participant can unlink or replace it. Both
      // calls go through the directory pinned at acquire, so a symlink
      // re-pointed in between cannot make them look at two directories.
      const now = target.pinned.lstat(target.name);
      if (now === null) {
        lost = "was deleted";
      } else if (now.dev !== this.#id.dev || now.ino !== this.#id.ino) {
        lost = "was replaced by another file";
      } else if (target.pinned.unlink(target.name) === "ENOENT") {
        lost = "was deleted";
      }
    } catch (err) {
      if (errnoOf(err) === "ENOENT") {
        lost = "was deleted";
      } else {
        handle.close();
        target.pinned.close();
        throw mapError(err, this.path, "cannot remove the lock file");
      }
    }
    handle.close();
    target.pinned.close();
    if (lost !== undefined) {
      // Say what release finds now; a loss the watch had not reported yet
      // happened while held, so the signal reports it too.
      const error = new LockLostError(this.path, this.pid, lost);
      if (!this.#lost.signal.aborted) this.#lost.abort(error);
      throw error;
    }
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

interface Checked {
  timeout: number;
  mode: number;
  meta: Meta;
  extra: string;
  checkInterval: number;
}

function checkOptions(
  options: AcquireSyncOptions | undefined,
): Checked {
  const timeout = options?.timeout ?? 0;
  if (typeof timeout !== "number" || Number.isNaN(timeout) || timeout < 0) {
    throw new RangeError(
      `Cannot acquire the lock as 'timeout' must be a non-negative number of milliseconds: current value is ${
        String(timeout)
      }`,
    );
  }
  const mode = options?.mode ?? DEFAULT_MODE;
  if (
    typeof mode !== "number" || !Number.isInteger(mode) || mode < 0 ||
    mode > 0o777 || (mode & 0o400) === 0
  ) {
    throw new RangeError(
      `Cannot acquire the lock as 'mode' must be permission bits from 0o400 to 0o777 that let the owner read: current value is ${
        typeof mode === "number" ? `0o${mode.toString(8)}` : String(mode)
      }`,
    );
  }
  const checkInterval = options?.checkInterval ?? 1000;
  if (
    typeof checkInterval !== "number" || !Number.isFinite(checkInterval) ||
    checkInterval < 0 || checkInterval > 0x7fffffff
  ) {
    throw new RangeError(
      `Cannot acquire the lock as 'checkInterval' must be a finite number of milliseconds from 0 (never): current value is ${
        String(checkInterval)
      }`,
    );
  }
  const meta = checkMeta(options?.meta);
  const extra = identityHere() + metaLines(meta);
  const size = recordSize(extra);
  if (size > MAX_RECORD_BYTES) {
    const longest = Object.entries(meta).sort((a, b) =>
      b[1].length - a[1].length
    )[0]?.[0];
    throw new RangeError(
      `Cannot acquire the lock as the record would be ${size} bytes, over ${MAX_RECORD_BYTES}: shorten meta.${longest}`,
    );
  }
  return { timeout, mode, meta, extra, checkInterval };
}

// A SIGKILLed holder's flock drops 2 to 7 ms after the signal (the kernel
// frees memory before files) and no file event says so: 5 ms polls keep the
// hand-off within a few ms for about 10 µs of work per poll.
const MAX_POLL_MS = 5;

/**
 * The whole acquire: attempt loops, and between them, while the lock is
 * held and time remains, polls of the read-only probe (no temp files, no
 * writes) until the lock looks free. Yields sleeps; `onWait` is called once
 * when waiting starts. Closes the pinned directory unless it returns.
 */
function* acquireSteps(
  target: Target,
  { timeout, mode, extra }: Checked,
  onWait: () => void,
): Generator<number, Acquired, void> {
  let done = false;
  try {
    const deadline = performance.now() + timeout;
    const remaining = () => deadline - performance.now();
    for (let waited = false;; waited = true) {
      let held: HeldBy | ContendedError;
      try {
        const outcome = yield* attemptLoop(target, mode, extra);
        if ("handle" in outcome) {
          done = true;
          return outcome;
        }
        held = outcome;
      } catch (err) {
        if (!(err instanceof ContendedError)) throw err;
        held = err;
      }
      if (remaining() <= 0) {
        if (held instanceof ContendedError) throw held;
        throw new HeldError(target.path, held.pid, held.host, {
          started: held.started,
        });
      }
      if (!waited) onWait();
      // Poll with a growing interval (1 ms to 5 ms) until the lock looks
      // free or time is up; a watcher may cut a sleep short.
      for (
        let interval = 1;
        remaining() > 0;
        interval = Math.min(interval * 2, MAX_POLL_MS)
      ) {
        yield Math.max(0, Math.min(interval, remaining()));
        if (probe(target, target.pinned).state !== "held") break;
      }
    }
  } finally {
    if (!done) target.pinned.close();
  }
}

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
 * process does.
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
  const lp = lockPath(path, "acquire the lock");
  const checked = checkOptions(options);
  const signal = options?.signal;
  signal?.throwIfAborted();
  const target = pin(lp);
  let wake: (() => void) | undefined;
  let unwatch: (() => void) | undefined;
  const steps = acquireSteps(target, checked, () => {
    unwatch = p.watchDir(target.pinned.prefix, (changed) => {
      if (changed === target.name) wake?.();
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
    return new RunLock(target, step.value, checked.meta, checked.checkInterval);
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
 * @param options `timeout` (ms) and `mode`.
 * @returns The held {@linkcode Lock}.
 * @throws {TypeError} `path` is empty, holds a NUL, or names a directory.
 * @throws {RangeError} `timeout` or `mode` is out of range.
 * @throws {HeldError} another live run holds it (after `timeout`), or this
 * process does.
 * @throws {InvalidLockFileError} the file is not a lock runlock can use; it is left untouched.
 * @throws {LockPermissionError} the OS or Deno refuses access.
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
    runSync(acquireSteps(target, checked, () => {})),
    checked.meta,
    checked.checkInterval,
  );
}
