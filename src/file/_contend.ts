/**
 * Protocol step 3 (PROTOCOL.md): who holds the file link found, and the
 * takeover of a stale one; and the read-only look when step 1 is refused.
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
const foreignHeld = (pid: number): Verdict => ({
  kind: "held",
  held: { pid, host: "", started: undefined },
  sure: true,
});

/** Unlinks `file` if it still names the inode we hold LOCK_EX on. */
function removeStale(target: Target, ours: FileInfo): Verdict {
  // Every participant unlinks only under LOCK_EX, after this same check: a
  // fresh lock is never deleted.
  try {
    if (sameFile(target.pinned.lstat(target.name), ours)) {
      target.pinned.unlink(target.name); // "ENOENT": gone already, as good
    }
  } catch (err) {
    const code = errnoOf(err);
    const sticky = code === "EPERM" || code === "EACCES"
      ? stickyRefusal(err, target, ours)
      : undefined;
    throw sticky ?? mapError(err, target.path, "cannot remove the stale lock");
  }
  return TOOK_OVER;
}

/**
 * In a sticky directory (`/tmp`) only the file's owner, the directory's or
 * root may remove it: says so, rather than ask for access the user may
 * have. `undefined` when the directory is not sticky.
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

/** Locks are not reentrant: fails at once if this copy of runlock holds `ours`. */
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
 * Both flocks of `handle` would block: who holds it, from its record, or
 * retry if the name no longer names `ours`. The caller closes `handle`
 * unless the verdict keeps it (`kept`).
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
    // Another copy of runlock in this process (ESM and CommonJS builds, a
    // worker): waiting would wait on ourselves.
    throw new HeldError(target.path, pid, host, {
      started,
      byThisProcess: true,
    });
  }
  // Not sure (look again, see `Probe.racing`): a dead PID under a held flock
  // (a takeover holds LOCK_EX for microseconds), a PID from elsewhere that
  // `kill` cannot judge, or garbage under a flock.
  const live = pid > 0 && !far ? liveness(pid) : "unknown";
  // A dead runlock run's command that holds it on: no takeover.
  const child = live === "dead" ? heir(record, ours.ino) : 0;
  const sure = record.kind !== "garbage" &&
    (pid === 0 || (!far && (live !== "dead" || child > 0)));
  // Spares the waiter's first look an open: it asks this descriptor.
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
    if (!(err instanceof SysError)) {
      throw mapError(err, target.path, "cannot open the lock file");
    }
    const file = within(target.pinned.prefix, target.name);
    if (code === "ELOOP" || code === "EFTYPE") {
      throw invalidOpen(err, target, file);
    }
    throw unreadable(err, target, file);
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
          // Only a provably dead PID (or our own) makes a pidfile stale.
          if (!foreignAlive(record.pid)) return removeStale(target, ours);
          return foreignHeld(record.pid);
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
    // Typed errors pass through as they are.
    throw mapError(err, target.path, "cannot read the lock file");
  } finally {
    if (kept !== handle) handle.close();
  }
}

/**
 * Step 1 was refused (EACCES, EPERM, EROFS): a held lock is still held, and
 * "permission denied" would send the user to fix what is not in the way.
 * Looks read-only, as a probe does, and answers as step 3 would of a held
 * lock; `undefined` when not held or unreadable: then the refusal stands.
 */
export function contendReadOnly(target: Target): Verdict | undefined {
  let handle: Handle | "ENOENT";
  try {
    handle = target.pinned.open(target.name);
  } catch (err) {
    // ERACE: changed between the lstat and the open. Else proves nothing.
    return errnoOf(err) === "ERACE" ? RETRY : undefined;
  }
  if (handle === "ENOENT") return undefined;
  let kept: Handle | undefined;
  try {
    const ours = handle.stat();
    refuseOurOwn(target, ours);
    if (handle.tryLock(false)) {
      // No flock: a foreign pidfile of a live PID is held all the same.
      const record = parseRecord(handle.readAll(MAX_RECORD_BYTES + 1));
      return record.kind === "foreign" && foreignAlive(record.pid)
        ? foreignHeld(record.pid)
        : undefined;
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
