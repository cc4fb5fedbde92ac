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
 * The read-only probe: never takes LOCK_EX, never writes, needs only read
 * access. LOCK_SH, not LOCK_EX, so two probers never see each other as a
 * holder. With `at` (a lock's pinned directory) it opens `lp.name` there;
 * otherwise the caller's path. `lp` names it in errors.
 */
export function probe(
  lp: LockPath,
  at?: Dir,
  whole = true,
): Probe {
  const result: Probe = {
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
      // held(): every record under a held flock is held; only the takeover
      // rule needs the PID, which is on line 1 (before the marker on line 2).
      const head = handle.readAll(32);
      result.state = "held";
      result.pid = headPid(head);
      // No PID in a file that is not empty: garbage under the flock (see
      // the next case).
      result.racing = result.pid === 0 && head.length > 0;
      if (
        result.pid > 0 && headHasMarker(head) &&
        liveness(result.pid) === "dead"
      ) {
        // Rare: read the whole record to tell a takeover from a holder in
        // another PID namespace, or from a command runlock run handed the
        // lock to.
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
        // A dead holder under a held flock: a takeover in progress, unless
        // the command runlock run handed the lock to lives. A PID that lives
        // elsewhere (another host, boot or PID namespace) cannot be asked:
        // maybe a live holder, maybe a takeover; look again briefly.
        result.far = locked && elsewhere(record) !== undefined;
        if (locked && !result.far && liveness(record.pid) === "dead") {
          // runlock is gone: its command is named only while it holds the
          // lock; otherwise a takeover in progress, or a holder unknown.
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
          // flock(1) or similar holds it, or a lock taken only to read the
          // file lives on for a moment in a child forked meanwhile (until
          // its exec): look again, as during a takeover.
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

/** Sleeps (ms) between looks while a probe sees a takeover in progress. */
export const RACING_SLEEPS = [0, 1, 2, 4, 8, 16, 32, 64, 128];

/**
 * A probe that looks again while it sees a takeover in progress (a dead PID
 * under a held flock), as acquire does, so that the dead PID is not
 * reported as a live holder. Yields sleeps; after the last look it answers
 * what it sees (a tool such as flock(1) may really hold a crashed run's
 * file). `first`: the first look, when the caller made it.
 */
export function* probeSteps(
  lp: LockPath,
  whole = true,
  first?: Probe,
): Generator<number, Probe, void> {
  let found = first ?? probe(lp, undefined, whole);
  // A PID from elsewhere is most likely a live holder in a container: look
  // again only as long as a takeover takes, not as long as flock(1) might.
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
