/**
 * {@linkcode watch}: every runlock lock in a directory (tree), live: the
 * current state first, then each run's start, end and crash as it happens,
 * for a status page or a TUI that lists runs without calling
 * {@linkcode scan} again and again.
 *
 * @module
 */

import { Session } from "./_watch_session.ts";
import type { Skipped } from "./_listing.ts";
import { checkPath } from "./_protocol.ts";
import type { Change } from "./_watch_types.ts";

export type { Change, ChangeKind } from "./_watch_types.ts";

/**
 * Options for {@linkcode watch}.
 *
 * @example Watching a state tree until a deadline
 * ```ts
 * import { watch, type WatchOptions } from "@runlock/runlock";
 *
 * const dir = await Deno.makeTempDir();
 * const options: WatchOptions = { recursive: true, signal: AbortSignal.timeout(100) };
 * for await (const batch of watch(dir, options)) console.log(batch.length);
 * ```
 */
export interface WatchOptions {
  /**
   * Also watch subdirectories, as they come and go (never following a
   * symlink). Default `false`.
   */
  recursive?: boolean;
  /** Ends the iteration and frees every watch and descriptor. */
  signal?: AbortSignal;
  /**
   * Called once per watch for each entry it leaves out unread, as
   * {@linkcode scan}'s `onSkip` is (see {@linkcode Skipped}): a file
   * named like runlock's temp files, not empty, and a file or directory
   * whose name is not UTF-8. Default: none.
   */
  onSkip?: (skipped: Skipped) => void;
}

/**
 * Watches the runlock locks under `dir`: an async iterable of batches of
 * {@linkcode Change}s. The first batch is the current state, one `present`
 * change per lock {@linkcode scan} would list (sorted by path, maybe
 * empty); each later batch holds the changes seen together, in order per
 * path. A change is reported only when a probe (a shared flock and one
 * read, as {@linkcode inspect} makes it) finds the path's state differ from
 * what was last reported: never one a probe would contradict. A run that
 * starts and ends before the watch can look at it is not seen.
 *
 * Driven by events, not polling: the directory's watch (inotify on
 * Linux) for names that come and go, and the holder's close (inotify's
 * `IN_CLOSE_WRITE` on Node and Bun; on Deno the directory watch reports
 * it) for a holder that dies. After a burst of events, and where a watch
 * cannot be made, a re-scan diffs the directories against what was
 * reported. Idle, a watch makes no system call on Node and Bun; on Deno
 * 2.9 and later one `lstat` of each watched directory every 10 s (Deno's
 * watch of a removed directory can report nothing) and a re-scan every
 * 60 s (its watch can go deaf unsaid), and before 2.9 a re-scan every 5 s
 * (its watch drops events without saying so).
 *
 * A held run whose name goes is `released` when its holder lets go of
 * the file's flock within a second (a clean release unlinks, then
 * closes), else `lost`; the watch keeps a read-only descriptor on each
 * held run's file to tell. See PROTOCOL.md ("Watching") for how each kind
 * is decided and the limits.
 *
 * The iteration ends when `signal` aborts, when the loop leaves it
 * (`break`, which calls `return()`), or after the batch that reports the
 * ends of the runs of a `dir` that was removed (or moved away); each frees
 * every watch and descriptor. While a `next()` is awaited the watch keeps
 * the process alive, as an awaited read does. An iteration that is left
 * without any of these (its `next()` never called again) may keep it alive
 * too: on Deno always (a Deno directory watch cannot be unref'd), on Node
 * and Bun while it watches a held run (the close watch on that run's
 * file). So end every iteration: `break`, `return()` or `signal`.
 *
 * Short of descriptors (`EMFILE`), it keeps fewer: at most half of those
 * the process may still open. A held run without one is looked at in the
 * re-scan, every second; its end is then `released`, never `lost`.
 *
 * Permissions (Deno): `--allow-read` for `dir`.
 *
 * @param dir The directory to watch.
 * @param options `recursive`, `signal` and `onSkip`.
 * @returns Batches of changes, the first the current state.
 * @throws {TypeError} `dir` is not a non-empty string without NUL, or an
 * option has the wrong type (thrown by `watch()` itself).
 * @throws {RunlockError} `dir` does not exist or is not a directory (the
 * first `next()` rejects).
 * @throws {LockPermissionError} `dir` cannot be read (the first `next()`
 * rejects).
 *
 * @example A run that starts and ends, as the watch sees it
 * ```ts
 * import { acquire, watch } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * const changes = watch(dir)[Symbol.asyncIterator]();
 * assert.deepEqual((await changes.next()).value, []); // nothing yet
 * const lock = await acquire(`${dir}/sync.lock`);
 * let [change] = (await changes.next()).value;
 * assert.equal(change.kind, "started");
 * assert.equal(change.inspection.pid, lock.pid);
 * await lock.release();
 * [change] = (await changes.next()).value;
 * assert.equal(change.kind, "released");
 * await changes.return!();
 * ```
 */
export function watch(
  dir: string,
  options?: WatchOptions,
): AsyncIterable<Change[]> {
  checkPath(dir, "dir", "watch");
  const recursive = options?.recursive ?? false;
  if (typeof recursive !== "boolean") bad("recursive", "a boolean", recursive);
  const signal = options?.signal;
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    bad("signal", "an AbortSignal", signal);
  }
  const onSkip = options?.onSkip;
  if (onSkip !== undefined && typeof onSkip !== "function") {
    bad("onSkip", "a function", onSkip);
  }
  return {
    [Symbol.asyncIterator]: () => new Session(dir, recursive, signal, onSkip),
  };
}

/** Throws the `TypeError` of an option of the wrong type. */
function bad(option: string, what: string, value: unknown): never {
  throw new TypeError(
    `Cannot watch as '${option}' must be ${what}: current value is ${
      String(value)
    }`,
  );
}
