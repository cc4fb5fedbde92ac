/**
 * {@linkcode watch}'s look at one path: what is there now (a probe, with
 * the inode it saw), and the read-only descriptor it keeps on a held run's
 * inode to tell, once the name has gone, whether the holder still holds it.
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
import { probe } from "./_probe.ts";
import { platform as p } from "../platform/current.ts";
import type { FileInfo, Handle } from "../platform/types.ts";
import { type Inspection, toInspection } from "./probes.ts";
import { MAX_RECORD_BYTES, parseRecord } from "./record.ts";

/** What a look at a path found. */
export type Seen =
  /**
   * Nothing (`found` undefined), or a file that is not a run's lock (a
   * foreign pidfile, an invalid file: its probe), or one that cannot be
   * probed (a directory, an unreadable file: `other` without `found`).
   */
  | { kind: "none"; other: boolean; found?: Probe }
  /** A runlock record (held or stale), and the inode it is in. */
  | { kind: "run"; found: Probe; ino: string; run: string }
  /** A dead PID under a held flock: a takeover of that record under way. */
  | { kind: "racing"; found: Probe; ino: string; run: string }
  /**
   * Not known: the look ran out of descriptors (`EMFILE`, `ENFILE`). Look
   * again later (the re-scan does); it says nothing of the path.
   */
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

/**
 * The identity of the run a record names: a new holder (or a record
 * rewritten in place) has another PID or another start.
 */
function runOf(found: Probe): string {
  return `${found.pid}\0${found.host}\0${
    found.started?.getTime() ?? ""
  }\0${found.boot}\0${found.pidns}\0${found.runtime}`;
}

/**
 * Looks at `path`: its inode before and after one probe (the probe as
 * inspect() makes it: a shared flock, one read), looking again when the
 * file was replaced in between, so that the record and the inode belong
 * together. `other`: a file is there, but it is not a run's lock (a
 * foreign pidfile, an invalid or unreadable file, a directory).
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

/** What a probe of a path with no file says. */
function freeInspection(path: string): Inspection {
  return {
    path,
    state: "free",
    pid: 0,
    host: "",
    started: undefined,
    foreign: false,
    reason: undefined,
    runtime: "",
    meta: {},
    bootId: "",
    pidNamespace: "",
    pidValidHere: undefined,
    pidElsewhere: undefined,
    child: 0,
  };
}

/**
 * A read-only descriptor on the inode at `path`, when that inode is `ino`
 * (else `undefined`: the file changed since the look, or cannot be
 * opened), `"EMFILE"` when out of descriptors. Read-only: its close is no
 * `IN_CLOSE_WRITE`, so it never looks like a holder's.
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
 * How many descriptors a watch may keep on held runs: half of those the
 * process may still open (its soft `RLIMIT_NOFILE`, from
 * `/proc/self/limits`, less those open in `/proc/self/fd`), and at least
 * `margin` fewer, so that the runtime itself never runs out (Deno 2.9.6
 * panics when it cannot get one). `Infinity` where neither can be read.
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

/**
 * Whether no one holds the flock of the inode `handle` is open on: a
 * shared flock taken and dropped at once (as a probe takes it), so that it
 * never stands in an acquirer's way longer than a probe does.
 */
export function flockFree(handle: Handle): boolean {
  try {
    if (!handle.tryLock(false)) return false;
    handle.unlock();
    return true;
  } catch {
    return true;
  }
}

/**
 * Whether an acquire of `name` in `dir` is under way: one of its temp
 * files (`.<stem>.<16 hex digits>.tmp`) is there and flocked.
 */
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
  return seen.kind === "none" && seen.found !== undefined
    ? toInspection(path, seen.found)
    : freeInspection(path);
}

/**
 * Whether `runlock run` marked the record released (`child=released--`)
 * before it let go: the flock left on the inode is held by what its
 * command left running with the descriptor open, not by a run.
 */
export function releasedByRun(fd: Handle): boolean {
  try {
    const record = parseRecord(fd.readAll(MAX_RECORD_BYTES + 1));
    return record.kind === "runlock" && record.released;
  } catch {
    return false;
  }
}
