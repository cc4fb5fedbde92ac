/**
 * Protocol steps 1, 2 and 4 (PROTOCOL.md, "Acquire") and the bounded attempt
 * loop around them.
 *
 * @module
 */

import { ContendedError, RunlockError } from "../errors.ts";
import { platform as p } from "../platform/current.ts";
import type { Dir, FileInfo, Handle } from "../platform/types.ts";
import { mapError } from "./_error_map.ts";
import {
  type Acquired,
  dirOf,
  errnoOf,
  type HeldBy,
  type LockPath,
  MAX_ATTEMPTS,
  sameFile,
  type Target,
} from "./_protocol.ts";
import { recordBytes, type RecordTemplate } from "./_record_here.ts";
import { tempName } from "./_temp_name.ts";
import { contend, contendReadOnly } from "./_contend.ts";
import { sweepAfter } from "./_sweep.ts";

/** Step 1 refused: the error to throw unless the lock is held anyway. */
interface Refused {
  refused: Error;
}

/** The errors of a create that this user or the filesystem refuses. */
const REFUSALS = new Set(["EACCES", "EPERM", "EROFS"]);

interface Temp {
  /** The temp file's name in the pinned directory. */
  name: string;
  handle: Handle;
  started: Date;
  id: FileInfo;
}

/**
 * Step 1: a new temp file under LOCK_EX holding the record, in the lock's
 * mode. `undefined`: a sweeper got to it first, or the name collided.
 */
function createTemp(
  target: Target,
  mode: number,
  record: RecordTemplate,
): Temp | Refused | undefined {
  const name = tempName(target.name);
  let handle: Handle | "EEXIST" | "ENOENT";
  try {
    handle = target.pinned.create(name);
  } catch (err) {
    const error = mapError(err, target.path, "cannot create the lock");
    if (REFUSALS.has(errnoOf(err) ?? "")) return { refused: error };
    throw error;
  }
  if (handle === "EEXIST") return undefined;
  if (handle === "ENOENT") {
    // The pinned directory exists (or existed): it refuses new files.
    throw new RunlockError(
      target.path,
      `${target.path}: cannot create the lock: ${target.dir} does not accept new files ` +
        `(creating one there fails with ENOENT: a virtual filesystem such as /proc or /sys, ` +
        `or a directory removed since); choose a lock path on a real filesystem`,
    );
  }
  try {
    if (!handle.tryLock(true)) {
      // A sweeper holds it and is about to remove it as litter.
      handle.close();
      return undefined;
    }
    const id = handle.stat();
    // The umask may have taken bits away (077: other users' probes could not
    // read it); EUNSAFE: see the Deno platform's chmod.
    if (id.mode !== mode) {
      try {
        handle.chmod(mode);
      } catch (err) {
        if (errnoOf(err) !== "EUNSAFE") throw err;
      }
    }
    const started = new Date();
    handle.write(recordBytes(record, started));
    return { name, handle, started, id };
  } catch (err) {
    discardTemp(target.pinned, { name, handle });
    throw mapError(err, target.path, "cannot write the lock");
  }
}

function discardTemp(dir: Dir, temp: Pick<Temp, "name" | "handle">): void {
  try {
    dir.unlink(temp.name); // we hold LOCK_EX on it, so no sweeper can race us
  } catch {
    // Not ours to remove: a later sweep handles it.
  }
  temp.handle.close();
}

function backoffMs(attempt: number): number {
  return Math.min(0.05 * 2 ** attempt, 8) * (0.5 + Math.random() / 2);
}

/** The nearest existing ancestor of `dir`: what a mkdir -p refusal is about. */
function existingAncestor(dir: string): string | undefined {
  for (let d = dir; d !== "" && d !== ".";) {
    const up = dirOf(d);
    try {
      p.openDir(up).close();
      return up;
    } catch (err) {
      if (errnoOf(err) !== "ENOENT" || up === d) return undefined;
    }
    d = up;
  }
  return undefined;
}

/** Pins the lock's directory, creating it (and its parents) if missing. */
export function pin(lp: LockPath): Target {
  let pinned: Dir;
  try {
    pinned = p.openDir(lp.dir);
  } catch (err) {
    if (errnoOf(err) !== "ENOENT") {
      throw mapError(err, lp.path, "cannot open the lock's directory");
    }
    try {
      p.mkdirp(lp.dir);
      pinned = p.openDir(lp.dir);
    } catch (err) {
      throw mapError(
        err,
        lp.path,
        "cannot create the lock's directory",
        existingAncestor(lp.dir),
      );
    }
  }
  return { path: lp.path, dir: lp.dir, name: lp.name, pinned };
}

/**
 * Where a file just linked is: `false` when the lock's directory path no
 * longer names the pinned directory (moved, mounted over, removed or no
 * longer searchable), else the pinned directory's canonical path, verified
 * (`""` where it cannot be told). The lock remembers that path, which no
 * chdir or re-pointed symlink changes. `<dir>/.` resolves a final symlink.
 */
function placed(target: Target): string | false {
  const pinned = target.pinned;
  if (!pinned.byDescriptor) return "";
  const dot = (dir: string) => dir === "/" ? "/." : `${dir}/.`;
  try {
    // Deno's prefix is the name already; Node's and Bun's is the
    // descriptor's /proc/self/fd/N.
    const prefix = pinned.prefix;
    const name = prefix.startsWith("/proc/self/fd/")
      ? p.realDir(prefix)
      : prefix;
    const here = pinned.lstat(".");
    if (here === null || !sameFile(p.lstat(dot(target.dir)), here)) {
      return false;
    }
    // The same path (no symlink, no `..`, absolute) was just looked up.
    if (name === target.dir) return name;
    return name !== "" && sameFile(p.lstat(dot(name)), here) ? name : "";
  } catch {
    return false;
  }
}

/**
 * One bounded attempt loop (steps 1 to 4): yields each sleep, for sync and
 * async callers. Returns the lock, or who holds it.
 */
export function* attemptLoop(
  target: Target,
  mode: number,
  record: RecordTemplate,
): Generator<number, Acquired | HeldBy, void> {
  let temp: Temp | undefined;
  let lastHeld: HeldBy | undefined;
  let tookOver = false;
  try {
    for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
      if (temp === undefined) {
        const made = createTemp(target, mode, record);
        if (made === undefined) continue;
        if ("refused" in made) {
          // A held lock is held all the same (PROTOCOL.md, step 1).
          const verdict = contendReadOnly(target);
          if (verdict === undefined) throw made.refused;
          if (verdict.kind === "retry") continue;
          if (verdict.kind === "held") {
            if (verdict.sure) return verdict.held;
            lastHeld = verdict.held;
          }
          yield backoffMs(attempt);
          continue;
        }
        temp = made;
      }
      let linked: "EEXIST" | "ENOENT" | undefined;
      try {
        linked = target.pinned.link(temp.name, target.name);
      } catch (err) {
        throw mapError(err, target.path, "cannot create the lock");
      }
      if (linked === "ENOENT") {
        // A sweeper removed our temp file just before we locked it.
        discardTemp(target.pinned, temp);
        temp = undefined;
        continue;
      }
      if (linked === "EEXIST") {
        const verdict = contend(target);
        if (verdict.kind === "retry") {
          tookOver ||= verdict.tookOver;
          continue;
        }
        if (verdict.kind === "held") {
          if (verdict.sure) return verdict.held;
          lastHeld = verdict.held;
        }
        yield backoffMs(attempt);
        continue;
      }
      const dir = placed(target);
      if (dir === false) {
        // The directory moved since it was pinned: our lock is not at the
        // path, where another run may hold its own. Undo it and pin again.
        if (sameFile(target.pinned.lstat(target.name), temp.id)) {
          target.pinned.unlink(target.name);
        }
        discardTemp(target.pinned, temp);
        temp = undefined;
        const moved = target.pinned;
        target.pinned = pin(target).pinned;
        moved.close();
        continue;
      }
      const { handle, started, name, id } = temp;
      temp = undefined;
      try {
        target.pinned.unlink(name);
      } catch {
        // A second name of our inode: the sweep removes it once we are gone.
      }
      sweepAfter(target, tookOver);
      return { handle, id, started, dir };
    }
  } finally {
    if (temp !== undefined) discardTemp(target.pinned, temp);
  }
  if (lastHeld !== undefined) return lastHeld;
  throw new ContendedError(target.path, MAX_ATTEMPTS);
}

const sleeper = new Int32Array(new SharedArrayBuffer(4));

/** Drives a generator of sleeps with blocking sleeps. */
export function runSync<T>(steps: Generator<number, T, void>): T {
  let step = steps.next();
  while (!step.done) {
    Atomics.wait(sleeper, 0, 0, step.value);
    step = steps.next();
  }
  return step.value;
}
