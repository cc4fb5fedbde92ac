/**
 * One directory's entries as `scan()` and `watch()` look at them: the
 * names that may be locks, with what is left out reported to the caller.
 *
 * @module
 */

import { within } from "./_protocol.ts";
import { isTempName } from "./_temp_name.ts";
import { platform as p } from "../platform/current.ts";

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
 * The files and directories of `dir` from its listing `entries`, less the
 * temp-named files and the names a string cannot hold, each reported to
 * `skip` (when given) except an empty temp file (a watch's marker, an
 * acquire before its write: never a lock).
 */
export function lockEntries(
  dir: string,
  entries: { name: string; kind: string }[],
  skip: ((skipped: Skipped) => void) | undefined,
): Entry[] {
  // A name that is not UTF-8 arrives decoded with U+FFFD in place of its
  // bad bytes (Deno and Node alike): it names another file or none, and
  // two such names can arrive as one string, the same as a real name's
  // (a lock listed twice, and the other one never). Each name
  // in a listing is unique, so of n copies of a string at most one is
  // real: the one lstat finds, if any.
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
      // This can be racy: a real name removed since the listing reads as
      // a bad one here, and is reported as skipped once.
      const real = lstat(within(dir, name));
      for (let bad = real === null ? n : n - 1; bad > 0; bad--) {
        skip?.({ path: within(dir, name), reason: "not UTF-8" });
      }
      if (real === null) continue;
      kind = real.kind;
    }
    if (kind !== "file" && kind !== "directory") continue;
    if (kind === "file" && isTempName(name)) {
      if (skip !== undefined) {
        const info = lstat(within(dir, name));
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

/** `lstat`, or `null` when the path is gone or cannot be looked at. */
function lstat(path: string) {
  try {
    return p.lstat(path);
  } catch {
    return null;
  }
}
