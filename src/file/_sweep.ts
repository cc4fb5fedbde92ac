/**
 * The litter sweep (PROTOCOL.md, "Litter"). A small directory is listed on
 * the acquire; a larger one later, by a pass on an unreferenced timer that
 * checks a few temp files per turn, so an acquire's cost stays bounded.
 *
 * @module
 */

import { platform as p } from "../platform/current.ts";
import type { Dir, Handle } from "../platform/types.ts";
import { MAX_RECORD_BYTES, parseRecord } from "./record.ts";
import { sameFile, type Target } from "./_protocol.ts";
import { stemOfTemp, tempStem } from "./_temp_name.ts";

/**
 * The `st_size` listed on the acquire: one ext4 block (100 to 200 names).
 * A listing costs about the size (ext4 reads every block, even emptied ones).
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
 * Removes the temp file `name` if its LOCK_EX|LOCK_NB succeeds, it holds a
 * runlock record or nothing, and the name still names that inode.
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

/** Removes the dead temp files of the lock `name`; how many. Never throws. */
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

// Lock paths swept (or noted): once per process, and after each takeover.
// Bounded: a server may lock a new name per job.
const swept = new Set<string>();
const MAX_SWEPT = 1024;

/** A larger directory's pass. */
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

// Larger directories, by the directory as the caller named it.
const passes = new Map<string, Pass>();

/** After each acquisition (`tookOver`: a stale file was removed). */
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
    // The lock's pinned descriptor may be closed (its number reused) by then.
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

/** One pass: list the directory, then check CHECKS_PER_TURN per turn. */
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
