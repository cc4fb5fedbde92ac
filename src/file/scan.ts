/**
 * {@linkcode scan}: every runlock lock in a directory tree, inspected at
 * once, for a UI that lists runs and splits them into running and crashed.
 *
 * @module
 */

import { dirError } from "./_error_map.ts";
import { checkPath, errnoOf, lockPath, within } from "./_protocol.ts";
import type { Probe } from "./_protocol.ts";
import { lookAgain, type Skipped, walk } from "./_listing.ts";
import { probe } from "./_probe.ts";
import { platform as p } from "../platform/current.ts";
import { type Inspection, toInspection } from "./probes.ts";

/**
 * Options for {@linkcode scan}.
 *
 * @example Every lock under a state tree, giving up after 5 seconds
 * ```ts
 * import { scan, type ScanOptions } from "@runlock/runlock";
 *
 * const dir = await Deno.makeTempDir();
 * const options: ScanOptions = { recursive: true, signal: AbortSignal.timeout(5_000) };
 * console.log(await scan(dir, options));
 * ```
 */
export interface ScanOptions {
  /** Also look in subdirectories (never following a symlink). Default `false`. */
  recursive?: boolean;
  /** Stops the scan: the promise rejects with the signal's reason. */
  signal?: AbortSignal;
  /**
   * Called for each entry the scan leaves out unread (see
   * {@linkcode Skipped}): a file named like runlock's temp files, and a
   * file or directory whose name is not UTF-8. Default: none.
   */
  onSkip?: (skipped: Skipped) => void;
}

/**
 * The {@linkcode Inspection} of every runlock lock file under `dir`, sorted
 * by path. A lock is found by its record (the `runlock` marker on line 2),
 * so any name works but one like runlock's temp files
 * (`.<name>.<16 hex digits>.tmp`, which is litter or a lock being taken);
 * plain pidfiles and other files are not locks and are not listed, nor
 * are files this user cannot read. A temp-named file (not empty) and a
 * name that is not UTF-8 (which a path string cannot name) are left out
 * unread and reported to `onSkip`.
 * Never takes a lock, never writes: each file is probed as
 * {@linkcode inspect} does (a shared flock, one read).
 *
 * Permissions (Deno): `--allow-read` for `dir`.
 *
 * @param dir The directory to look in.
 * @param options `recursive`, `signal` and `onSkip`.
 * @returns The inspections, sorted by path; `[]` when `dir` does not exist.
 * @throws {TypeError} `dir` is empty or holds a NUL.
 * @throws {LockPermissionError} `dir` cannot be read (a subdirectory that
 * cannot be read is skipped).
 * @throws {RunlockError} `dir` is not a directory.
 *
 * @example Which runs are alive, and which crashed
 * ```ts
 * import { acquire, scan } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * await using _a = await acquire(`${dir}/sync.lock`, { meta: { cmd: "sync" } });
 * await Deno.writeTextFile(`${dir}/gc.lock`, "4242\nrunlock 1\n"); // a crashed run
 * await Deno.writeTextFile(`${dir}/notes.txt`, "not a lock\n");
 * const found = await scan(dir);
 * assert.deepEqual(found.map((i) => [i.path, i.state]), [
 *   [`${dir}/gc.lock`, "stale"],
 *   [`${dir}/sync.lock`, "held"],
 * ]);
 * assert.equal(found[1].meta.cmd, "sync");
 * ```
 */
export async function scan(
  dir: string,
  options?: ScanOptions,
): Promise<Inspection[]> {
  checkPath(dir, "dir", "scan");
  const recursive = options?.recursive ?? false;
  const signal = options?.signal;
  const onSkip = options?.onSkip;
  signal?.throwIfAborted();
  const found: Inspection[] = [];
  const racing: string[] = [];
  let turned = performance.now();
  const walked = walk(
    { path: dir },
    recursive ? (d, name) => ({ path: within(d.path, name) }) : undefined,
    onSkip,
    (err) => errnoOf(err) === "ENOENT" ? undefined : dirError(err, dir, "scan"),
  );
  for (const { path, kind } of walked) {
    // Let the rest of the program run in a big tree (timers: the signal's,
    // a held lock's checks; I/O): a turn of the event loop every 10 ms,
    // not one per file.
    if (performance.now() - turned > 10) {
      await p.turn();
      turned = performance.now();
    }
    signal?.throwIfAborted();
    if (kind === "directory") continue;
    const result = look(path);
    if (result === undefined) continue;
    if (result.racing) racing.push(path);
    else if (result.marker) found.push(toInspection(path, result));
  }
  signal?.throwIfAborted();
  for (const path of racing) {
    // A ref'd timer: the scan's promise keeps the process alive.
    const result = await lookAgain(
      () => look(path),
      (seen) => seen?.racing === true,
      async (ms) => {
        await new Promise((resolve) => setTimeout(resolve, ms));
        signal?.throwIfAborted();
        return true;
      },
    );
    if (result?.marker) found.push(toInspection(path, result));
  }
  return found.sort((a, b) => a.path < b.path ? -1 : a.path > b.path ? 1 : 0);
}

/** One file's probe; `undefined` when it is not something we can read. */
function look(path: string): Probe | undefined {
  try {
    return probe(lockPath(path, "scan"));
  } catch {
    // Unreadable, or gone: not a lock we can report.
    return undefined;
  }
}
