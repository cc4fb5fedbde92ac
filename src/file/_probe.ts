/**
 * The read-only probe (see PROTOCOL.md): never takes LOCK_EX, never writes.
 *
 * @module
 */

import { platform as p } from "../platform/current.ts";
import type { InvalidLockFileError, RunlockError } from "../errors.ts";
import { type Dir, type Handle, SysError } from "../platform/types.ts";
import { MAX_RECORD_BYTES, parseRecord } from "./record.ts";
import { invalidOpen, mapError, unreadable } from "./_error_map.ts";
import { elsewhere, foreignAlive, heir, liveness } from "./_liveness.ts";
import { errnoOf, type LockPath, type Probe } from "./_protocol.ts";
import { headHasMarker, headPid } from "./_record_here.ts";

/**
 * The read-only probe, under LOCK_SH so that two probers never see each
 * other as a holder. With `at` (a pinned directory) it opens `lp.name` there.
 */
export function probe(
  lp: LockPath,
  at?: Dir,
  whole = true,
): Probe {
  const result = freeProbe();
  let handle: Handle | "ENOENT";
  try {
    handle = at === undefined ? p.openExisting(lp.path) : at.open(lp.name);
  } catch (err) {
    const file = at === undefined ? lp.path : `${at.prefix}/${lp.name}`;
    const code = errnoOf(err);
    if (code === "ERACE") return { ...result, state: "held", racing: true };
    if (code === "ELOOP" || code === "EFTYPE") {
      const error = invalidOpen(err as SysError, lp, file) as
        | InvalidLockFileError
        | RunlockError;
      return {
        ...result,
        state: "invalid",
        reason: "reason" in error ? String(error.reason) : error.message,
      };
    }
    if (err instanceof SysError) throw unreadable(err, lp, file);
    throw mapError(err, lp.path, "cannot read the lock file");
  }
  if (handle === "ENOENT") return result;
  try {
    const locked = !handle.tryLock(false);
    if (locked && !whole) {
      // held(): only the takeover rule needs the record, from line 1's PID.
      const head = handle.readAll(32);
      result.state = "held";
      result.pid = headPid(head);
      // No PID in a file that is not empty: garbage under the flock.
      result.racing = result.pid === 0 && head.length > 0;
      if (
        result.pid > 0 && headHasMarker(head) &&
        liveness(result.pid) === "dead"
      ) {
        // Rare: the whole record tells a takeover from a holder elsewhere or
        // a command runlock run handed the lock to.
        const record = parseRecord(handle.readAll(MAX_RECORD_BYTES + 1));
        result.far = record.kind === "runlock" &&
          elsewhere(record) !== undefined;
        const child = result.far ? 0 : heir(record, handle.stat().ino);
        result.child = child;
        result.racing = record.kind === "runlock" &&
          (result.far || child === 0);
      }
      return result;
    }
    // Closing drops a shared lock: no unlock needed.
    const record = parseRecord(handle.readAll(MAX_RECORD_BYTES + 1));
    switch (record.kind) {
      case "runlock":
        result.pid = record.pid;
        result.host = record.host;
        result.started = record.started;
        result.marker = true;
        result.runtime = record.runtime;
        result.boot = record.boot;
        result.pidns = record.pidns;
        result.meta = record.meta;
        result.child = record.child;
        result.state = locked ? "held" : "stale";
        // A dead holder under a held flock: a takeover, unless the command
        // runlock run handed the lock to holds on. A PID from elsewhere
        // cannot be asked: look again briefly.
        result.far = locked && elsewhere(record) !== undefined;
        if (locked && !result.far && liveness(record.pid) === "dead") {
          result.child = heir(record, handle.stat().ino);
          result.racing = result.child === 0;
        } else {
          result.racing = locked && result.far;
        }
        return result;
      case "foreign":
        result.pid = record.pid;
        result.foreign = true;
        result.state = locked || foreignAlive(record.pid) ? "held" : "stale";
        return result;
      case "empty":
        result.state = locked ? "held" : "stale";
        return result;
      case "garbage":
        if (locked) {
          // See `Probe.racing`.
          result.state = "held";
          result.racing = true;
        } else {
          result.state = "invalid";
          result.reason = record.reason;
        }
        return result;
    }
  } catch (err) {
    throw mapError(err, lp.path, "cannot read the lock file");
  } finally {
    handle.close();
  }
}

/** What a probe of a path with no file finds. */
export function freeProbe(): Probe {
  return {
    state: "free",
    pid: 0,
    host: "",
    started: undefined,
    foreign: false,
    reason: undefined,
    marker: false,
    runtime: "",
    boot: "",
    pidns: "",
    meta: {},
    child: 0,
    racing: false,
    far: false,
  };
}

/** Sleeps (ms) between looks while a probe sees a takeover in progress. */
export const RACING_SLEEPS = [0, 1, 2, 4, 8, 16, 32, 64, 128];

/**
 * A probe that looks again while `racing`, yielding each sleep; the last
 * look is the answer (flock(1) may really hold a crashed run's file).
 */
export function* probeSteps(
  lp: LockPath,
  whole = true,
  first?: Probe,
): Generator<number, Probe, void> {
  let found = first ?? probe(lp, undefined, whole);
  // A PID from elsewhere is most likely a live holder in a container: look
  // again only as long as a takeover takes.
  const sleeps = found.far ? FAR_SLEEPS : RACING_SLEEPS;
  for (const ms of sleeps) {
    if (!found.racing) return found;
    yield ms;
    found = probe(lp, undefined, whole);
  }
  return found;
}

/** Sleeps (ms) between looks at a held lock whose PID lives elsewhere. */
const FAR_SLEEPS = [0, 1, 2, 4, 8];
