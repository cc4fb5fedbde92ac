/**
 * Protocol step 3 (see PROTOCOL.md): link said EEXIST. Who, if anyone,
 * holds the file; and the takeover of a stale one. Also the read-only look
 * of step 1 refused (no write access): who holds it, if anyone.
 *
 * @module
 */

import {
  HeldError,
  InvalidLockFileError,
  LockPermissionError,
} from "../errors.ts";
import { platform as p } from "../platform/current.ts";
import { type FileInfo, type Handle, SysError } from "../platform/types.ts";
import { MAX_RECORD_BYTES, parseRecord } from "./record.ts";
import { invalidOpen, mapError, unreadable } from "./_error_map.ts";
import {
  elsewhere,
  foreignAlive,
  heir,
  heldHere,
  liveness,
} from "./_liveness.ts";
import {
  errnoOf,
  type HeldBy,
  sameFile,
  type Target,
  within,
} from "./_protocol.ts";
import { fileWatchKey } from "./_events.ts";

/** What contend() decided. */
export type Verdict =
  | { kind: "retry"; tookOver: boolean }
  | { kind: "backoff" }
  | { kind: "held"; held: HeldBy; sure: boolean };

const RETRY: Verdict = { kind: "retry", tookOver: false };
const TOOK_OVER: Verdict = { kind: "retry", tookOver: true };

/** Unlinks `file` if it still names the inode we hold LOCK_EX on. */
function removeStale(target: Target, ours: FileInfo): Verdict {
  // We hold LOCK_EX on this inode and every participant unlinks only under
  // that lock, after this same check, through the same pinned directory,
  // so a fresh lock is never deleted.
  try {
    if (sameFile(target.pinned.lstat(target.name), ours)) {
      target.pinned.unlink(target.name); // "ENOENT": gone already, as good
    }
  } catch (err) {
    const code = errnoOf(err);
    if (code === "EPERM" || code === "EACCES") {
      throw stickyRefusal(err, target, ours) ??
        mapError(err, target.path, "cannot remove the stale lock");
    }
    throw mapError(err, target.path, "cannot remove the stale lock");
  }
  return TOOK_OVER;
}

/**
 * In a sticky directory (`/tmp`, mode 1777) only a file's owner, the
 * directory's owner or root may remove it: a stale lock another user left
 * there cannot be taken over by this one, whatever access it has to the
 * directory. Says so, with the owner, instead of asking for access the user
 * may already have. `undefined` when the directory is not sticky.
 */
function stickyRefusal(
  err: unknown,
  target: Target,
  stale: FileInfo,
): Error | undefined {
  let dir: FileInfo | null = null;
  try {
    dir = target.pinned.lstat(".");
  } catch {
    return undefined;
  }
  if (dir === null || (dir.mode & 0o1000) === 0) return undefined;
  return new LockPermissionError(
    target.path,
    "cannot remove the stale lock",
    `the file belongs to uid ${stale.uid} and ${target.dir} is sticky (mode ${
      dir.mode.toString(8).padStart(4, "0")
    }), so only uid ${stale.uid}, the directory's owner (uid ${dir.uid}) or ` +
      `root may remove it; remove it as one of them, or choose a lock path ` +
      `in a directory that is not sticky`,
    { cause: err },
  );
}

/**
 * Locks are not reentrant: if this process holds the file `ours` through
 * this copy of runlock, fail at once (waiting would wait on ourselves).
 */
function refuseOurOwn(target: Target, ours: FileInfo): void {
  const since = heldHere.get(ours);
  if (since !== undefined) {
    throw new HeldError(target.path, p.pid, p.hostname(), {
      started: since,
      byThisProcess: true,
    });
  }
}

/**
 * Both flocks of `handle` (the file at the name, `ours` its identity) would
 * block: a live holder, or a peer in the middle of a takeover. Who holds
 * it, from its record; or retry, if the name no longer names the file. A
 * held verdict whose `kept` is `handle` keeps it open for the waiter's
 * first look; the caller closes it otherwise.
 */
function holderOf(target: Target, handle: Handle, ours: FileInfo): Verdict {
  if (!sameFile(target.pinned.lstat(target.name), ours)) return RETRY;
  const record = parseRecord(handle.readAll(MAX_RECORD_BYTES + 1));
  const pid = record.kind === "runlock" || record.kind === "foreign"
    ? record.pid
    : 0;
  const host = record.kind === "runlock" ? record.host : "";
  const started = record.kind === "runlock" ? record.started : undefined;
  const far = record.kind === "runlock" && elsewhere(record) !== undefined;
  if (record.kind === "runlock" && pid === p.pid && !far) {
    // Our own PID holds it, but not through this copy of runlock: another
    // copy in this process (an ES module and a CommonJS build both
    // loaded, a worker). Waiting would wait on ourselves.
    throw new HeldError(target.path, pid, host, {
      started,
      byThisProcess: true,
    });
  }
  // A dead PID under a held flock is a peer taking over a crashed run's
  // file (it holds LOCK_EX for microseconds): look again before saying
  // "held by a dead pid". `kill` is only a second opinion here, and says
  // nothing of a PID that lives on another host or in another namespace
  // (a container sharing the volume): that one may be a live holder or a
  // crashed one being taken over, so look again too, as briefly.
  // Garbage under a held flock: a tool such as flock(1) holding a file it
  // wrote, or a lock that lives on only for a moment after its holder
  // closed it. A child forked at that moment (by any thread of the
  // process that read the file, ourselves included) holds the same open
  // file, and so the flock, until it calls exec. Look again, as for a
  // takeover, before calling it held.
  const live = pid > 0 && !far ? liveness(pid) : "unknown";
  // A dead runlock run's command that holds it on: no takeover.
  const child = live === "dead" ? heir(record, ours.ino) : 0;
  const sure = record.kind !== "garbage" &&
    (pid === 0 || (!far && (live !== "dead" || child > 0)));
  // What a waiter's first look would see: spare it the open (its flock
  // is asked of this descriptor, which the waiter closes).
  if (record.kind === "runlock" && live === "alive") {
    const key = fileWatchKey(ours);
    return {
      kind: "held",
      held: { pid, host, started, key, kept: handle },
      sure,
    };
  }
  return { kind: "held", held: { pid, host, started, child }, sure };
}

/** Step 3: link said EEXIST. Decide who, if anyone, holds the file. */
export function contend(target: Target): Verdict {
  let handle: Handle | "ENOENT";
  try {
    handle = target.pinned.open(target.name);
  } catch (err) {
    const code = errnoOf(err);
    if (code === "ERACE") return RETRY; // changed meanwhile
    if (code === "ELOOP" || code === "EFTYPE") {
      throw invalidOpen(
        err as SysError,
        target,
        within(target.pinned.prefix, target.name),
      );
    }
    if (err instanceof SysError) {
      throw unreadable(
        err,
        target,
        within(target.pinned.prefix, target.name),
      );
    }
    throw mapError(err, target.path, "cannot open the lock file");
  }
  if (handle === "ENOENT") return RETRY; // gone meanwhile
  let kept: Handle | undefined;
  try {
    const ours = handle.stat();
    refuseOurOwn(target, ours);
    if (handle.tryLock(true)) {
      const record = parseRecord(handle.readAll(MAX_RECORD_BYTES + 1));
      switch (record.kind) {
        case "empty":
        case "runlock":
          return removeStale(target, ours);
        case "foreign": {
          // Seed policy: only a provably dead PID (or our own, which we
          // cannot be holding) makes a pidfile stale.
          if (!foreignAlive(record.pid)) return removeStale(target, ours);
          return {
            kind: "held",
            held: { pid: record.pid, host: "", started: undefined },
            sure: true,
          };
        }
        case "garbage":
          throw new InvalidLockFileError(target.path, record.reason);
      }
    }
    if (handle.tryLock(false)) {
      // Only probers (LOCK_SH) are looking. Let them finish.
      handle.unlock();
      return { kind: "backoff" };
    }
    // Both would block: a live holder, or a peer in the middle of a takeover.
    const verdict = holderOf(target, handle, ours);
    if (verdict.kind === "held" && verdict.held.kept === handle) kept = handle;
    return verdict;
  } catch (err) {
    // A failed fstat, flock, read or lstat of the file we found: a typed
    // error that names the file and the action (HeldError and the other
    // typed errors pass through as they are).
    throw mapError(err, target.path, "cannot read the lock file");
  } finally {
    if (kept !== handle) handle.close();
  }
}

/**
 * Step 1 was refused (EACCES, EPERM, EROFS: this user may not create files
 * in the lock's directory, or its filesystem is read-only): a lock that a
 * live run holds is still held, and saying "permission denied" would send
 * the user to fix what is not in the way. Looks at the lock as
 * a probe does, read-only (`LOCK_SH|LOCK_NB`, never `LOCK_EX`, never a
 * write), and answers what step 3 would answer of a held lock: held, with
 * the record's holder, or look again (a takeover in progress, the file
 * replaced meanwhile). `undefined` when it is not held (missing, free,
 * stale, invalid) or cannot be read: then the refusal is the answer, since
 * taking a free lock or taking over a stale one needs the write access
 * this user lacks.
 */
export function contendReadOnly(target: Target): Verdict | undefined {
  let handle: Handle | "ENOENT";
  try {
    handle = target.pinned.open(target.name);
  } catch (err) {
    // Changed between the lstat and the open: look again. Any other
    // failure (unreadable, not a regular file) proves nothing of a holder.
    return errnoOf(err) === "ERACE" ? RETRY : undefined;
  }
  if (handle === "ENOENT") return undefined;
  let kept: Handle | undefined;
  try {
    const ours = handle.stat();
    refuseOurOwn(target, ours);
    if (handle.tryLock(false)) {
      // Nobody holds the flock (probers may be looking). A foreign pidfile
      // of a live PID is held all the same, as in step 3.
      const record = parseRecord(handle.readAll(MAX_RECORD_BYTES + 1));
      if (record.kind !== "foreign" || !foreignAlive(record.pid)) {
        return undefined;
      }
      return {
        kind: "held",
        held: { pid: record.pid, host: "", started: undefined },
        sure: true,
      };
    }
    const verdict = holderOf(target, handle, ours);
    if (verdict.kind === "held" && verdict.held.kept === handle) kept = handle;
    return verdict;
  } catch (err) {
    if (err instanceof HeldError) throw err; // this process holds it
    return undefined; // a failed read proves nothing: the refusal stands
  } finally {
    // Closing drops the shared flock, if we took it.
    if (kept !== handle) handle.close();
  }
}
