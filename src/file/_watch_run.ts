/**
 * {@linkcode watch}'s look at one path, and the read-only descriptor it
 * keeps on a held run's inode.
 *
 * @module
 */

import {
  errnoOf,
  inodeKey,
  lockPath,
  type Probe,
  within,
} from "./_protocol.ts";
import { stemOfTemp } from "./_temp_name.ts";
import { freeProbe, probe } from "./_probe.ts";
import { platform as p } from "../platform/current.ts";
import type { FileInfo, Handle } from "../platform/types.ts";
import { type Inspection, toInspection } from "./probes.ts";
import { MAX_RECORD_BYTES, parseRecord } from "./record.ts";

/** What a look at a path found. */
export type Seen =
  /** No run's lock: nothing, or (`other`) a file that is not one. */
  | { kind: "none"; other: boolean; found?: Probe }
  /** A runlock record (held or stale), and the inode it is in. */
  | { kind: "run"; found: Probe; ino: string; run: string }
  /** A dead PID under a held flock: a takeover of that record under way. */
  | { kind: "racing"; found: Probe; ino: string; run: string }
  /** The look ran out of descriptors: it says nothing of the path. */
  | { kind: "unknown" };

/** Whether `err` (or its cause) is a lack of descriptors. */
function outOfFds(err: unknown): boolean {
  for (let e = err, i = 0; e !== undefined && e !== null && i < 5; i++) {
    const code = errnoOf(e) ?? (e as { code?: unknown }).code;
    if (code === "EMFILE" || code === "ENFILE") return true;
    if (/\b(EMFILE|ENFILE)\b|Too many open files/.test(String(e))) {
      return true;
    }
    e = (e as { cause?: unknown }).cause;
  }
  return false;
}

/** `dev:ino` of a file, or `""`. */
export function keyOf(info: FileInfo | null): string {
  return info === null ? "" : inodeKey(info);
}

/** The identity of the run a record names. */
function runOf(found: Probe): string {
  return `${found.pid}\0${found.host}\0${
    found.started?.getTime() ?? ""
  }\0${found.boot}\0${found.pidns}\0${found.runtime}`;
}

/**
 * Looks at `path`: its inode before and after one probe, again when the
 * file was replaced in between, so that the record and the inode belong
 * together.
 */
export function look(path: string): Seen {
  for (let tries = 0;; tries++) {
    let before: FileInfo | null;
    try {
      before = p.lstat(path);
    } catch (err) {
      if (outOfFds(err)) return { kind: "unknown" };
      before = null;
    }
    if (before === null) return { kind: "none", other: false };
    if (before.kind !== "file") return { kind: "none", other: true };
    let found: Probe;
    try {
      found = probe(lockPath(path, "watch"));
    } catch (err) {
      if (outOfFds(err)) return { kind: "unknown" };
      return { kind: "none", other: true };
    }
    let after: FileInfo | null;
    try {
      after = p.lstat(path);
    } catch (err) {
      if (outOfFds(err)) return { kind: "unknown" };
      after = null;
    }
    const ino = keyOf(before);
    if (ino !== keyOf(after) && tries < 4) continue;
    if (!found.marker) {
      return found.state === "free"
        ? { kind: "none", other: false }
        : { kind: "none", other: true, found };
    }
    const run = runOf(found);
    if (found.racing) return { kind: "racing", found, ino, run };
    return { kind: "run", found, ino, run };
  }
}

/** A run's record as it is once its holder is gone (`stale`). */
export function staleInspection(path: string, found: Probe): Inspection {
  return {
    ...toInspection(path, found),
    state: "stale",
    pidValidHere: undefined,
    pidElsewhere: undefined,
  };
}

/**
 * A read-only descriptor (its close is no `IN_CLOSE_WRITE`) on the inode
 * at `path` if it is `ino`; `"EMFILE"` when out of descriptors.
 */
export function hold(
  path: string,
  ino: string,
): Handle | undefined | "EMFILE" {
  let handle: Handle | "ENOENT";
  try {
    handle = p.openExisting(path);
  } catch (err) {
    return outOfFds(err) ? "EMFILE" : undefined;
  }
  if (handle === "ENOENT") return undefined;
  let same = false;
  try {
    same = keyOf(handle.stat()) === ino;
  } catch {
    same = false;
  }
  if (!same) {
    handle.close();
    return undefined;
  }
  return handle;
}

/**
 * How many descriptors a watch may keep: half of those the process may
 * still open, and at least `margin` fewer (Deno 2.9.6 panics when it cannot
 * get one). `Infinity` where /proc cannot tell.
 */
export function fdBudget(margin: number): number {
  let limit = Infinity;
  let open = 0;
  try {
    const handle = p.openExisting("/proc/self/limits");
    if (handle === "ENOENT") return Infinity;
    let text: string;
    try {
      text = new TextDecoder().decode(handle.readAll(1 << 16));
    } finally {
      handle.close();
    }
    const m = /^Max open files\s+(\d+|unlimited)/m.exec(text);
    if (m === null || m[1] === "unlimited") return Infinity;
    limit = Number(m[1]);
    open = p.readDir("/proc/self/fd").length;
  } catch {
    return Infinity;
  }
  const free = limit - open;
  return Math.max(0, Math.min(Math.floor(free / 2), free - margin));
}

/** Whether no one holds `handle`'s flock: a shared flock, as a probe takes it. */
export function flockFree(handle: Handle): boolean {
  try {
    if (!handle.tryLock(false)) return false;
    handle.unlock();
    return true;
  } catch {
    return true;
  }
}

/** Whether an acquire is under way: a temp file of `stem` is flocked. */
export function acquiring(dir: string, stem: string): boolean {
  let names: string[];
  try {
    names = p.readDir(dir);
  } catch {
    return false;
  }
  for (const name of names) {
    if (stemOfTemp(name) !== stem) continue;
    let handle: Handle | "ENOENT";
    try {
      handle = p.openExisting(within(dir, name));
    } catch {
      continue;
    }
    if (handle === "ENOENT") continue;
    try {
      if (!flockFree(handle)) return true;
    } finally {
      handle.close();
    }
  }
  return false;
}

/** A path's state once a run there ended: its probe, or free. */
export function noneInspection(path: string, seen: Seen): Inspection {
  return toInspection(
    path,
    seen.kind === "none" && seen.found !== undefined ? seen.found : freeProbe(),
  );
}

/** Whether `runlock run` marked the record released (`CHILD_RELEASED`). */
export function releasedByRun(fd: Handle): boolean {
  try {
    const record = parseRecord(fd.readAll(MAX_RECORD_BYTES + 1));
    return record.kind === "runlock" && record.released;
  } catch {
    return false;
  }
}
