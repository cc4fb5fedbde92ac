/**
 * The litter sweep (see PROTOCOL.md): temp files left by acquirers that
 * died before they linked or removed them.
 *
 * @module
 */

import { platform as p } from "./platform/current.ts";
import type { Handle } from "./platform/types.ts";
import { MAX_RECORD_BYTES, parseRecord } from "./record.ts";
import { sameFile, type Target, TEMP, tempStem } from "./_protocol.ts";

/**
 * Removes `.<name>.<random>.tmp` files whose creator is dead: their
 * LOCK_EX|LOCK_NB succeeds, and they hold nothing but a runlock record (or
 * nothing: the creator died before writing). A file that only looks like
 * ours is left alone. Best effort; never throws.
 */
export function sweep(target: Target): number {
  const dir = target.pinned;
  const prefix = `.${tempStem(target.name)}.`;
  let names: string[];
  try {
    names = p.readDir(dir.prefix);
  } catch {
    return 0;
  }
  let removed = 0;
  for (const name of names) {
    if (!name.startsWith(prefix) || !name.endsWith(".tmp")) continue;
    if (!TEMP.test(name.slice(prefix.length, -4))) continue;
    let handle: Handle | "ENOENT";
    try {
      handle = dir.open(name);
    } catch {
      continue;
    }
    if (handle === "ENOENT") continue;
    try {
      // Unlink only while holding LOCK_EX on the inode the name still names.
      if (!handle.tryLock(true)) continue;
      const kind = parseRecord(handle.readAll(MAX_RECORD_BYTES + 1)).kind;
      if (kind !== "empty" && kind !== "runlock") continue;
      if (sameFile(dir.lstat(name), handle.stat())) {
        if (dir.unlink(name) === undefined) removed++;
      }
    } catch {
      // Best effort.
    } finally {
      handle.close();
    }
  }
  return removed;
}

// Lock paths this process has swept litter for. One sweep per path per
// process (and one after each takeover, when a crash is known to have
// happened) keeps the directory scan off the hot path. Bounded: a server
// that locks a new name per job must not grow without end; forgetting a
// path only costs one more sweep.
const swept = new Set<string>();
const MAX_SWEPT = 1024;

/** Called after each acquisition (`tookOver`: a stale file was removed). */
export function sweepAfter(target: Target, tookOver: boolean): void {
  if (tookOver || !swept.has(target.path)) {
    if (swept.size >= MAX_SWEPT) swept.clear();
    swept.add(target.path);
    sweep(target);
  }
}
