/**
 * The litter sweep (see PROTOCOL.md, "Litter"): temp files left by
 * acquirers that died before they linked or removed them.
 *
 * The sweep never makes an acquire's cost grow with the size of its
 * directory or with how many locks the process holds. A small directory
 * (one block of entries) is listed on the acquire: a bounded
 * cost. A larger one is never listed on the acquire: the acquire notes the
 * lock's name, and a pass on an unreferenced timer lists the directory
 * later, in a process that lives that long, and checks the names' temp
 * files a few per event-loop turn.
 *
 * @module
 */

import { platform as p } from "../platform/current.ts";
import type { Dir, Handle } from "../platform/types.ts";
import { MAX_RECORD_BYTES, parseRecord } from "./record.ts";
import { sameFile, type Target } from "./_protocol.ts";
import { stemOfTemp, tempStem } from "./_temp_name.ts";

/**
 * A directory whose `st_size` is at most this is listed on the acquire:
 * one ext4 block of entries (about 100 to 200 names; tmpfs and btrfs count
 * names and their bytes, to the same order). Listing a directory costs
 * about its size (ext4 reads every block, even emptied ones), so the
 * acquire's cost stays bounded whatever the directory holds.
 */
const SMALL_DIR_BYTES = 4096;
/** A pass over a larger directory starts this long after the acquire. */
const PASS_DELAY_MS = 1000;
/** At most one listing of a larger directory per process this often. */
const PASS_INTERVAL_MS = 30_000;
/** Temp files checked per event-loop turn by a pass. */
const CHECKS_PER_TURN = 64;
/** Temp files one pass checks; the rest wait for the next pass. */
const MAX_CANDIDATES = 4096;
/** Lock names one directory's pass remembers. */
const MAX_STEMS = 256;
/** Larger directories this process remembers. */
const MAX_DIRS = 1024;

/**
 * Removes the temp file `name` if its creator is dead: its LOCK_EX|LOCK_NB
 * succeeds, and it holds nothing but a runlock record (or nothing: the
 * creator died before writing), and the name still names the inode we
 * locked. A file that only looks like ours is left alone. Never throws.
 */
function sweepOne(dir: Dir, name: string): boolean {
  let handle: Handle | "ENOENT";
  try {
    handle = dir.open(name);
  } catch {
    return false;
  }
  if (handle === "ENOENT") return false;
  try {
    // Unlink only while holding LOCK_EX on the inode the name still names.
    if (!handle.tryLock(true)) return false;
    const kind = parseRecord(handle.readAll(MAX_RECORD_BYTES + 1)).kind;
    if (kind !== "empty" && kind !== "runlock") return false;
    return sameFile(dir.lstat(name), handle.stat()) &&
      dir.unlink(name) === undefined;
  } catch {
    return false; // Best effort.
  } finally {
    handle.close();
  }
}

/**
 * Lists `dir` and removes the dead temp files of the lock named `name`
 * (`.<stem>.<16 hex>.tmp`). Best effort; never throws. Returns how many it
 * removed.
 */
function sweep(dir: Dir, name: string): number {
  const stem = tempStem(name);
  let names: string[];
  try {
    names = p.readDir(dir.prefix);
  } catch {
    return 0;
  }
  let removed = 0;
  for (const entry of names) {
    if (stemOfTemp(entry) === stem && sweepOne(dir, entry)) removed++;
  }
  return removed;
}

// Lock paths this process has swept litter for (or noted for a pass). Once
// per path per process, and again after each takeover (a crash is known to
// have happened). Bounded: a server that locks a new name per job must not
// grow without end; forgetting a path only costs one more sweep.
const swept = new Set<string>();
const MAX_SWEPT = 1024;

/** A larger directory's pass: the names noted for it, and when it ran. */
interface Pass {
  /** The directory's canonical path, resolved when it was first noted. */
  readonly path: string;
  /** Stems of the lock names whose temp files the next listing checks. */
  stems: Set<string>;
  /** When the last listing started (`performance.now()`). */
  listedAt: number;
  /** Cancels the pending timer; `undefined` when none is pending. */
  timer: (() => void) | undefined;
  running: boolean;
}

// Larger directories, by the directory as the caller named it (no system
// call to look one up).
const passes = new Map<string, Pass>();

/**
 * Called after each acquisition (`tookOver`: a stale file was removed).
 * Costs at most one `lstat` of the directory and, for a small directory,
 * its listing: never a listing of a larger one.
 */
export function sweepAfter(target: Target, tookOver: boolean): void {
  if (!tookOver && swept.has(target.path)) return;
  if (swept.size >= MAX_SWEPT) swept.clear();
  swept.add(target.path);
  let size: number;
  try {
    size = target.pinned.lstat(".")?.size ?? 0;
  } catch {
    return; // Best effort: a later acquire or process sweeps.
  }
  if (size <= SMALL_DIR_BYTES) sweep(target.pinned, target.name);
  else note(target);
}

/** Notes a lock name of a larger directory for the next pass there. */
function note(target: Target): void {
  let pass = passes.get(target.dir);
  if (pass === undefined) {
    if (passes.size >= MAX_DIRS) {
      for (const [key, idle] of passes) {
        if (idle.timer === undefined && !idle.running) passes.delete(key);
      }
      if (passes.size >= MAX_DIRS) return;
    }
    // The pass opens the directory anew, later: the lock's own pinned
    // descriptor may be closed (and its number reused) by then.
    const path = target.pinned.byDescriptor
      ? p.realDir(target.pinned.prefix)
      : target.pinned.prefix;
    if (path === "") return;
    pass = {
      path,
      stems: new Set(),
      listedAt: -Infinity,
      timer: undefined,
      running: false,
    };
    passes.set(target.dir, pass);
  }
  if (pass.stems.size >= MAX_STEMS) return;
  pass.stems.add(tempStem(target.name));
  schedule(pass);
}

function schedule(pass: Pass): void {
  if (pass.timer !== undefined || pass.running || pass.stems.size === 0) {
    return;
  }
  const wait = Math.max(
    PASS_DELAY_MS,
    pass.listedAt + PASS_INTERVAL_MS - performance.now(),
  );
  pass.timer = p.unrefLater(() => {
    pass.timer = undefined;
    run(pass);
  }, wait);
}

/**
 * One pass: list the directory (one turn), then check the noted names'
 * temp files, CHECKS_PER_TURN per turn, on unreferenced timers: a process
 * that exits first never finishes it, and loses nothing but the sweep.
 */
function run(pass: Pass): void {
  pass.running = true;
  pass.listedAt = performance.now();
  const stems = pass.stems;
  pass.stems = new Set();
  let dir: Dir | undefined;
  const candidates: string[] = [];
  try {
    dir = p.openDir(pass.path);
    for (const name of p.readDir(dir.prefix)) {
      const stem = stemOfTemp(name);
      if (stem === undefined || !stems.has(stem)) continue;
      if (candidates.length < MAX_CANDIDATES) candidates.push(name);
      else pass.stems.add(stem); // the next pass goes on
    }
  } catch {
    // Best effort: gone, or not readable.
  }
  let next = 0;
  const step = () => {
    try {
      const end = Math.min(next + CHECKS_PER_TURN, candidates.length);
      for (; next < end; next++) sweepOne(dir!, candidates[next]);
    } catch {
      next = candidates.length; // sweepOne never throws; stay safe anyway
    }
    if (next < candidates.length) {
      p.unrefLater(step);
      return;
    }
    dir?.close();
    pass.running = false;
    schedule(pass);
  };
  step();
}
