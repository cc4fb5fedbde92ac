/**
 * The directory walk `scan()` and `watch()` share, and their second looks
 * at a file seen in the middle of a takeover.
 *
 * @module
 */

import { within } from "./_protocol.ts";
import { RACING_SLEEPS } from "./_probe.ts";
import { isTempName } from "./_temp_name.ts";
import { platform as p } from "../platform/current.ts";
import type { FileInfo } from "../platform/types.ts";

/**
 * An entry that {@linkcode scan} or {@linkcode watch} did not look at,
 * and why. `path` is the entry's path as far as a string can give it: for
 * a name that is not UTF-8, each byte that is not is shown as U+FFFD
 * (`�`), so the path names no file.
 *
 * @example Saying what was skipped
 * ```ts
 * import type { Skipped } from "@runlock/runlock";
 *
 * const say = (s: Skipped) => console.error(`skipped ${s.path}: ${s.reason}`);
 * say({ path: "/run/.x.lock.0123456789abcdef.tmp", reason: "temp name" });
 * ```
 */
export interface Skipped {
  /** The entry's path (not UTF-8: its bad bytes shown as U+FFFD). */
  path: string;
  /**
   * `temp name`: a file named like runlock's temp files
   * (`.<name>.<16 hex digits>.tmp`), not empty; runlock's own (a lock being
   * taken, or litter), or a lock someone named so. `not UTF-8`: a file or
   * directory whose name is not UTF-8, which a path string cannot name.
   */
  reason: "temp name" | "not UTF-8";
}

/** An entry worth looking at. */
export interface Entry {
  name: string;
  kind: "file" | "directory";
}

/**
 * The files and directories of `dir`'s listing `entries`, less temp names
 * and names that are not UTF-8, each reported to `skip` but an empty temp
 * file (a marker, or an acquire before its write).
 */
export function lockEntries(
  dir: string,
  entries: { name: string; kind: string }[],
  skip: ((skipped: Skipped) => void) | undefined,
): Entry[] {
  // A name that is not UTF-8 arrives with U+FFFD for its bad bytes (Deno
  // and Node): several can arrive as one string, a real name's among them.
  // Of n copies at most one is real: the one lstat finds.
  let copies: Map<string, number> | undefined;
  for (const { name } of entries) {
    if (!name.includes("\uFFFD")) continue;
    copies ??= new Map();
    copies.set(name, (copies.get(name) ?? 0) + 1);
  }
  const out: Entry[] = [];
  for (const { name, kind: listed } of entries) {
    let kind = listed;
    const n = copies?.get(name);
    if (n !== undefined) {
      if (n === 0) continue; // Its copies were dealt with at the first.
      copies!.set(name, 0);
      // Racy: a real name removed since the listing is reported once.
      const real = lstatOf(within(dir, name));
      for (let bad = real === null ? n : n - 1; bad > 0; bad--) {
        skip?.({ path: within(dir, name), reason: "not UTF-8" });
      }
      if (real === null) continue;
      kind = real.kind;
    }
    if (kind !== "file" && kind !== "directory") continue;
    if (kind === "file" && isTempName(name)) {
      if (skip !== undefined) {
        const info = lstatOf(within(dir, name));
        if (info !== null && info.kind === "file" && info.size > 0) {
          skip({ path: within(dir, name), reason: "temp name" });
        }
      }
      continue;
    }
    out.push({ name, kind });
  }
  return out;
}

/** An entry of a {@linkcode walk}, with its directory and path. */
export type Walked<D> = Entry & { dir: D; path: string };

/**
 * Every entry under `top` that may be a lock (see {@linkcode lockEntries}),
 * going down into the subdirectories `down` gives. A subdirectory that
 * cannot be listed is left out; for `top`, `topError(err)` is thrown
 * (`undefined`: nothing is walked).
 */
export function* walk<D extends { readonly path: string }>(
  top: D,
  down: ((dir: D, name: string) => D | undefined) | undefined,
  skip: ((skipped: Skipped) => void) | undefined,
  topError: (err: unknown) => unknown,
): Generator<Walked<D>> {
  const dirs = [top];
  for (let dir = dirs.pop(); dir !== undefined; dir = dirs.pop()) {
    let entries;
    try {
      entries = p.readDirKinds(dir.path);
    } catch (err) {
      // A subdirectory gone or closed since its parent was listed.
      if (dir !== top) continue;
      const error = topError(err);
      if (error === undefined) return;
      throw error;
    }
    for (const { name, kind } of lockEntries(dir.path, entries, skip)) {
      const path = within(dir.path, name);
      if (kind === "directory" && down !== undefined) {
        const sub = down(dir, name);
        if (sub !== undefined) dirs.push(sub);
      }
      yield { dir, path, name, kind };
    }
  }
}

/**
 * Looks again, as inspect() does, while `racing(seen)`: `wait` each of
 * {@linkcode RACING_SLEEPS} (`false`: stop). `first`: the look already made.
 */
export async function lookAgain<T>(
  look: () => T,
  racing: (seen: T) => boolean,
  wait: (ms: number) => Promise<boolean>,
  first: T = look(),
): Promise<T> {
  let seen = first;
  for (const ms of RACING_SLEEPS) {
    if (!racing(seen) || !await wait(ms)) break;
    seen = look();
  }
  return seen;
}

/** `lstat(2)`, or `null` when the path is gone or cannot be looked at. */
export function lstatOf(path: string): FileInfo | null {
  try {
    return p.lstat(path);
  } catch {
    return null;
  }
}
