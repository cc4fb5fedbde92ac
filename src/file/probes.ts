/**
 * Read-only probes for status commands: {@linkcode held},
 * {@linkcode activePid} and {@linkcode inspect}. They never take the lock,
 * never write, and need only read access to the lock's directory.
 *
 * By the time you use an answer, the state may have changed: a probe
 * reports, it does not reserve. To act on "free", {@linkcode acquire}.
 *
 * @module
 */

import { elsewhere } from "./_liveness.ts";
import { type LockPath, lockPath, type Probe } from "./_protocol.ts";
import { probe, probeSteps } from "./_probe.ts";
import type { LockInspection } from "../contract.ts";
import { InvalidLockFileError } from "../errors.ts";
import { platform as p } from "../platform/current.ts";

/**
 * What {@linkcode inspect} found at a lock path.
 *
 * @example Describing a crashed run's file
 * ```ts
 * import { inspect, type Inspection } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * const path = `${dir}/run.lock`;
 * // A record whose holder is gone: nobody holds its flock.
 * await Deno.writeTextFile(path, "4242\nrunlock 1\nhost=build-7\n");
 * const info: Inspection = await inspect(path);
 * assert.equal(info.state, "stale");
 * assert.equal(info.pid, 4242);
 * assert.equal(info.host, "build-7");
 * ```
 */
export interface Inspection extends LockInspection {
  /** The lock file. */
  path: string;
  /**
   * - `free`: no file.
   * - `held`: a live run holds it (its flock is held, or it is a foreign
   *   pidfile whose PID is alive or cannot be checked).
   * - `stale`: a file left by a run that is gone; the next acquire takes it.
   * - `invalid`: not a lock file runlock can use; see `reason`.
   */
  state: "free" | "held" | "stale" | "invalid";
  /** The PID the file names, or 0 (free, empty, or unreadable). */
  pid: number;
  /** The holder's host, or `""` when the record has none. */
  host: string;
  /** When the holder took the lock, when the record says. */
  started: Date | undefined;
  /** `true` for a plain pidfile written by another tool (no runlock marker). */
  foreign: boolean;
  /** For `invalid`: what is wrong with the file. */
  reason: string | undefined;
  /** The holder's runtime (`deno`, `node`, `bun`), or `""` when unknown. */
  runtime: string;
  /**
   * The record's user fields (the `meta` option of acquire, `runlock run`'s
   * command line); `{}` when none, and for foreign or older records.
   */
  meta: Record<string, string>;
  /** The holder's Linux boot id, or `""` when the record has none. */
  bootId: string;
  /** The inode of the holder's PID namespace, or `""` when the record has none. */
  pidNamespace: string;
  /**
   * The PID of the command `runlock run` handed the lock to (the record's
   * `child=`), or 0. While that run lives, `pid` is runlock's; if runlock
   * was killed, the command (or what it started in its process group)
   * holds the lock on, and this is the live process to look at.
   */
  child: number;
  /**
   * Whether a live holder's recorded PID names the same process from where
   * you ask: `true` in the same boot and PID namespace; `false` when they
   * (or, where they are unknown, the host names) differ (see
   * `pidElsewhere`): `kill(pid)` here would hit another process, or none;
   * `undefined` when it cannot be told (a record or a runtime that does not
   * say) and for locks that are not held. Liveness stays the flock's: this
   * is about what an operator may safely do with the number.
   */
  pidValidHere: boolean | undefined;
  /**
   * Why `pidValidHere` is `false`: the holder runs under another kernel
   * `"boot"` (another machine sharing the file, or a record from before a
   * reboot), in another PID `"namespace"` (a container), or, where those
   * are unknown, on another `"host"`. `undefined` otherwise.
   */
  pidElsewhere: "host" | "boot" | "namespace" | undefined;
}

/** The public form of a probe's answer. */
export function toInspection(path: string, found: Probe): Inspection {
  let pidValidHere: boolean | undefined;
  let pidElsewhere: Inspection["pidElsewhere"];
  // Only a live holder's namespace cannot have had its inode number reused.
  if (found.state === "held" && found.pid !== 0 && found.marker) {
    // A held runlock record's `far` is the probe's own `elsewhere` check:
    // only then is the answer not "the same process here" (or unknown).
    const where = found.far ? elsewhere(found) : undefined;
    if (where !== undefined) {
      pidValidHere = false;
      pidElsewhere = where;
    } else if (found.boot && found.pidns) {
      const { boot, pidns } = p.identity();
      if (boot && pidns) pidValidHere = true;
    }
  }
  return {
    path,
    state: found.state,
    pid: found.pid,
    host: found.host,
    started: found.started,
    foreign: found.foreign,
    reason: found.reason,
    runtime: found.runtime,
    meta: { ...found.meta },
    bootId: found.boot,
    pidNamespace: found.pidns,
    pidValidHere,
    pidElsewhere,
    child: found.child,
  };
}

/**
 * Describes the lock at `path` without taking it.
 *
 * Permissions (Deno): `--allow-read` for the lock's directory; `--allow-run`
 * only to judge a foreign pidfile (without it such a file counts as held).
 *
 * @param path The lock file.
 * @returns The state, with the holder's pid, host and start time where known.
 * @throws {TypeError} `path` is empty, holds a NUL, or names a directory.
 * @throws {LockPermissionError} the lock's directory or file cannot be read.
 *
 * @example A status command
 * ```ts
 * import { acquire, inspect } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * const path = `${dir}/run.lock`;
 * assert.equal((await inspect(path)).state, "free");
 * await using lock = await acquire(path);
 * const info = await inspect(path);
 * assert.equal(info.state, "held");
 * assert.equal(info.pid, lock.pid);
 * ```
 */
export async function inspect(path: string): Promise<Inspection> {
  const found = look(path, "inspect the lock", true);
  return toInspection(path, found instanceof Promise ? await found : found);
}

/**
 * Probes `path`, looking again while `racing` (see `probeSteps`). `whole:
 * false`: no record read under a held flock (all `held()` needs).
 */
function look(
  path: string,
  action: string,
  whole: boolean,
): Probe | Promise<Probe> {
  const lp = lockPath(path, action);
  // One look, no promise, usually: the caller awaits only a promise (an
  // await of a value is one more microtask turn, 0.07 µs on Node).
  const found = probe(lp, undefined, whole);
  return found.racing ? lookAgain(lp, whole, found) : found;
}

async function lookAgain(
  lp: LockPath,
  whole: boolean,
  first: Probe,
): Promise<Probe> {
  const steps = probeSteps(lp, whole, first);
  let step = steps.next();
  while (!step.done) {
    const ms = step.value;
    await new Promise((resolve) => setTimeout(resolve, ms));
    step = steps.next();
  }
  return step.value;
}

/**
 * Whether a live run holds the lock at `path`. A missing file or one left
 * by a crashed run is not held.
 *
 * Permissions (Deno): as for {@linkcode inspect}.
 *
 * @param path The lock file.
 * @returns `true` while a live run holds it.
 * @throws {TypeError} `path` is empty, holds a NUL, or names a directory.
 * @throws {InvalidLockFileError} the file is not a lock runlock can use.
 * @throws {LockPermissionError} the lock's directory or file cannot be read.
 *
 * @example Nothing holds a missing lock
 * ```ts
 * import { held } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * assert.equal(await held(`${dir}/run.lock`), false);
 * ```
 */
export async function held(path: string): Promise<boolean> {
  const first = look(path, "inspect the lock", false);
  const found = first instanceof Promise ? await first : first;
  if (found.state === "invalid") {
    throw new InvalidLockFileError(path, found.reason ?? "is invalid");
  }
  return found.state === "held";
}

/**
 * The PID the lock file names, and whether that run is alive (holds the
 * lock). A missing file gives `{ pid: 0, alive: false }`; a crashed run's
 * file gives its PID with `alive: false`.
 *
 * Permissions (Deno): as for {@linkcode inspect}.
 *
 * @param path The lock file.
 * @returns `{ pid, alive }`.
 * @throws {TypeError} `path` is empty, holds a NUL, or names a directory.
 * @throws {InvalidLockFileError} the file is not a lock runlock can use.
 * @throws {LockPermissionError} the lock's directory or file cannot be read.
 *
 * @example "a run is already active as pid N"
 * ```ts
 * import { acquire, activePid } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * const path = `${dir}/run.lock`;
 * assert.deepEqual(await activePid(path), { pid: 0, alive: false });
 * await using _lock = await acquire(path);
 * assert.deepEqual(await activePid(path), { pid: Deno.pid, alive: true });
 * ```
 */
export async function activePid(
  path: string,
): Promise<{ pid: number; alive: boolean }> {
  const info = await inspect(path);
  if (info.state === "invalid") {
    throw new InvalidLockFileError(path, info.reason ?? "is invalid");
  }
  return { pid: info.pid, alive: info.state === "held" };
}
