/**
 * The runlock protocol (see PROTOCOL.md): one bounded attempt loop, the
 * contention verdict, the litter sweep and the read-only probe. Everything
 * here goes through the platform interface, never a runtime directly.
 *
 * @module
 */

import { basename, dirname, join } from "node:path";
import {
  ContendedError,
  InvalidLockFileError,
  LockPermissionError,
  RunlockError,
  UnsupportedFilesystemError,
} from "./errors.ts";
import { platform as p } from "./platform/current.ts";
import {
  type FileInfo,
  type Handle,
  type Liveness,
  SysError,
} from "./platform/types.ts";
import {
  formatRecord,
  MAX_PID,
  MAX_RECORD_BYTES,
  parseRecord,
  recordHead,
} from "./record.ts";

/** Attempts in one acquire loop before giving up as contended. */
export const MAX_ATTEMPTS = 16;

/** The lock was taken: our descriptor (holding LOCK_EX) and its inode. */
export interface Acquired {
  handle: Handle;
  id: FileInfo;
  started: Date;
}

/** A live run holds the lock. */
export interface HeldBy {
  pid: number;
  host: string;
}

/** The three answers a probe gives, plus `invalid`. */
export type State = "free" | "held" | "stale" | "invalid";

/** What a probe found. */
export interface Probe {
  state: State;
  pid: number;
  host: string;
  started: Date | undefined;
  foreign: boolean;
  reason: string | undefined;
}

export function errnoOf(err: unknown): string | undefined {
  return err instanceof SysError ? err.code : undefined;
}

const LINK_UNSUPPORTED = new Set(["EPERM", "ENOTSUP", "EOPNOTSUPP", "ENOSYS"]);
const LOCK_UNSUPPORTED = new Set([
  "ENOLCK",
  "ENOTSUP",
  "EOPNOTSUPP",
  "ENOSYS",
  "EINVAL",
]);

/** Maps a failed system call to one of runlock's typed errors. */
export function mapError(err: unknown, path: string, action: string): Error {
  if (err instanceof RunlockError) return err;
  if (!(err instanceof SysError)) {
    return new RunlockError(path, `${path}: ${action}: ${err}`, {
      cause: err,
    });
  }
  const dir = dirname(path);
  const { code, syscall } = err;
  if (code === "NOTCAPABLE") {
    return new LockPermissionError(
      path,
      action,
      `run Deno with --allow-read=${dir} --allow-write=${dir} (runlock never prompts)`,
      { cause: err },
    );
  }
  if (syscall === "link" && LINK_UNSUPPORTED.has(code)) {
    return new UnsupportedFilesystemError(path, "hard links", { cause: err });
  }
  if (syscall === "flock" && LOCK_UNSUPPORTED.has(code)) {
    return new UnsupportedFilesystemError(path, "flock", { cause: err });
  }
  if (code === "EACCES" || code === "EPERM") {
    return new LockPermissionError(
      path,
      action,
      `this user needs read and write access to ${dir}`,
      { cause: err },
    );
  }
  if (code === "EROFS") {
    return new LockPermissionError(
      path,
      action,
      `${dir} is on a read-only filesystem`,
      { cause: err },
    );
  }
  if (code === "ENOTDIR") {
    return new RunlockError(
      path,
      `${path}: ${action}: a parent of the path is not a directory`,
      { cause: err },
    );
  }
  return new RunlockError(path, `${path}: ${action}: ${err.message}`, {
    cause: err,
  });
}

function invalidOpen(err: SysError, path: string): InvalidLockFileError {
  if (err.code === "ELOOP") {
    return new InvalidLockFileError(
      path,
      "is a symbolic link (runlock never follows one)",
      { cause: err },
    );
  }
  const kind = p.lstat(path)?.kind;
  return new InvalidLockFileError(
    path,
    kind === "directory"
      ? "is a directory"
      : "is not a regular file (a FIFO, socket or device)",
    { cause: err },
  );
}

/**
 * `kill(pid, 0)` as a second opinion. Never with 0 or a negative number:
 * `kill(0, 0)` probes our own process group and `kill(-1, 0)` every
 * process, so both always say "alive". (parsePid already returns 0 for
 * anything else; this is the one gate every caller passes.)
 */
function liveness(pid: number): Liveness {
  if (!Number.isInteger(pid) || pid < 1 || pid > MAX_PID) return "unknown";
  if (pid === p.pid) return "alive";
  return p.processAlive(pid);
}

function sameFile(a: FileInfo | null, b: FileInfo): boolean {
  return a !== null && a.dev === b.dev && a.ino === b.ino;
}

const encoder = new TextEncoder();

// Temp names: a random 32-bit prefix per process and a counter, so that a
// name costs no system call and no random draw on the hot path, and other
// processes still cannot predict it. O_EXCL settles any collision.
const processTag = Array.from(
  crypto.getRandomValues(new Uint8Array(4)),
  (b) => b.toString(16).padStart(2, "0"),
).join("");
let tempCounter = 0;

// Per lock path, the parts of the temp path and of the record that never
// change: computed once, since node:path and string building show up on a
// hot path that is otherwise a handful of system calls.
const cache = new Map<string, { tempPrefix: string; head: string }>();
function parts(path: string): { tempPrefix: string; head: string } {
  let found = cache.get(path);
  if (found === undefined) {
    found = {
      tempPrefix: join(dirname(path), `.${basename(path)}.${processTag}`),
      head: recordHead(p.pid, p.hostname()),
    };
    cache.set(path, found);
  }
  return found;
}

const TEMP = /^[0-9a-f]{16}$/;

interface Temp {
  path: string;
  handle: Handle;
  started: Date;
}

/**
 * Step 1: a temp file, created new, locked LOCK_EX at once, holding the whole
 * record. `undefined` means a sweeper got to it before our flock: try again.
 */
function createTemp(path: string): Temp | undefined {
  const { tempPrefix, head } = parts(path);
  tempCounter = (tempCounter + 1) >>> 0;
  const tempPath = `${tempPrefix}${
    tempCounter.toString(16).padStart(8, "0")
  }.tmp`;
  let handle: Handle;
  try {
    handle = p.createNew(tempPath);
  } catch (err) {
    const code = errnoOf(err);
    if (code === "EEXIST") return undefined; // 64 random bits collided
    if (code !== "ENOENT") throw mapError(err, path, "cannot create the lock");
    // The directory is missing: create it, once, off the hot path.
    try {
      p.mkdirp(dirname(path));
      handle = p.createNew(tempPath);
    } catch (err) {
      throw mapError(err, path, "cannot create the lock's directory");
    }
  }
  try {
    if (!handle.tryLock(true)) {
      // A sweeper holds it and is about to remove it as litter.
      handle.close();
      return undefined;
    }
    const started = new Date();
    handle.write(encoder.encode(formatRecord(head, started, p.runtime)));
    return { path: tempPath, handle, started };
  } catch (err) {
    discardTemp({ path: tempPath, handle, started: new Date(0) });
    throw mapError(err, path, "cannot write the lock");
  }
}

function discardTemp(temp: Temp): void {
  try {
    p.unlink(temp.path); // we hold LOCK_EX on it, so no sweeper can race us
  } catch {
    // Gone already, or not ours to remove: a later sweep handles it.
  }
  temp.handle.close();
}

/**
 * Removes `.<name>.<random>.tmp` files whose creator is dead: their
 * LOCK_EX|LOCK_NB succeeds. Best effort; never throws.
 */
export function sweep(path: string): number {
  const dir = dirname(path);
  const prefix = `.${basename(path)}.`;
  let names: string[];
  try {
    names = p.readDir(dir);
  } catch {
    return 0;
  }
  let removed = 0;
  for (const name of names) {
    if (!name.startsWith(prefix) || !name.endsWith(".tmp")) continue;
    if (!TEMP.test(name.slice(prefix.length, -4))) continue;
    const tempPath = join(dir, name);
    let handle: Handle;
    try {
      handle = p.openExisting(tempPath);
    } catch {
      continue;
    }
    try {
      // Unlink only while holding LOCK_EX on the inode the name still names.
      if (handle.tryLock(true) && sameFile(p.lstat(tempPath), handle.stat())) {
        p.unlink(tempPath);
        removed++;
      }
    } catch {
      // Best effort.
    } finally {
      handle.close();
    }
  }
  return removed;
}

type Verdict =
  | { kind: "retry"; tookOver: boolean }
  | { kind: "backoff" }
  | { kind: "held"; held: HeldBy; sure: boolean };

const RETRY: Verdict = { kind: "retry", tookOver: false };
const TOOK_OVER: Verdict = { kind: "retry", tookOver: true };

/** Unlinks `path` if it still names the inode we hold LOCK_EX on. */
function removeStale(path: string, ours: FileInfo): Verdict {
  // We hold LOCK_EX on this inode and every participant unlinks only under
  // that lock, after this same check, so a fresh lock is never deleted.
  if (sameFile(p.lstat(path), ours)) {
    try {
      p.unlink(path);
    } catch (err) {
      if (errnoOf(err) !== "ENOENT") {
        throw mapError(err, path, "cannot remove the stale lock");
      }
    }
  }
  return TOOK_OVER;
}

/** Step 3: link said EEXIST. Decide who, if anyone, holds `path`. */
function contend(path: string): Verdict {
  let handle: Handle;
  try {
    handle = p.openExisting(path);
  } catch (err) {
    const code = errnoOf(err);
    if (code === "ENOENT") return RETRY; // released in the meantime
    if (code === "ELOOP" || code === "EFTYPE") {
      throw invalidOpen(err as SysError, path);
    }
    throw mapError(err, path, "cannot open the lock file");
  }
  try {
    const ours = handle.stat();
    if (handle.tryLock(true)) {
      const record = parseRecord(handle.readAll(MAX_RECORD_BYTES + 1));
      switch (record.kind) {
        case "empty":
        case "runlock":
          return removeStale(path, ours);
        case "foreign": {
          // Seed policy: only a provably dead PID makes a pidfile stale.
          if (liveness(record.pid) === "dead") {
            return removeStale(path, ours);
          }
          return {
            kind: "held",
            held: { pid: record.pid, host: "" },
            sure: true,
          };
        }
        case "garbage":
          throw new InvalidLockFileError(path, record.reason);
      }
    }
    if (handle.tryLock(false)) {
      // Only probers (LOCK_SH) are looking. Let them finish.
      handle.unlock();
      return { kind: "backoff" };
    }
    // Both would block: a live holder, or a peer in the middle of a takeover.
    if (!sameFile(p.lstat(path), ours)) return RETRY;
    const record = parseRecord(handle.readAll(MAX_RECORD_BYTES + 1));
    const pid = record.kind === "runlock" || record.kind === "foreign"
      ? record.pid
      : 0;
    const host = record.kind === "runlock" ? record.host : "";
    // A dead PID under a held flock is a peer taking over a crashed run's
    // file (it holds LOCK_EX for microseconds): look again before saying
    // "held by a dead pid". `kill` is only a second opinion here.
    const sure = pid === 0 || liveness(pid) !== "dead";
    return { kind: "held", held: { pid, host }, sure };
  } finally {
    handle.close();
  }
}

// Paths this process has swept litter for. One sweep per path per process
// (and one after each takeover, when a crash is known to have happened)
// keeps the directory scan off the hot path.
const swept = new Set<string>();

function backoffMs(attempt: number): number {
  return Math.min(0.05 * 2 ** attempt, 8) * (0.5 + Math.random() / 2);
}

/**
 * One bounded attempt loop (protocol steps 1 to 4). Yields how long to sleep
 * between attempts, so that the same loop serves sync and async callers.
 * Returns the lock, or who holds it; throws typed errors.
 */
export function* attemptLoop(
  path: string,
): Generator<number, Acquired | HeldBy, void> {
  let temp: Temp | undefined;
  let lastHeld: HeldBy | undefined;
  let tookOver = false;
  try {
    for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
      temp ??= createTemp(path);
      if (temp === undefined) continue;
      try {
        p.link(temp.path, path);
      } catch (err) {
        const code = errnoOf(err);
        if (code === "ENOENT") {
          // A sweeper removed our temp file just before we locked it.
          discardTemp(temp);
          temp = undefined;
          continue;
        }
        if (code !== "EEXIST") {
          throw mapError(err, path, "cannot create the lock");
        }
        const verdict = contend(path);
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
      const { handle, started, path: tempPath } = temp;
      temp = undefined;
      try {
        p.unlink(tempPath);
      } catch {
        // Left behind, it is a second name of our locked inode; the sweep
        // removes it once we are gone.
      }
      let id: FileInfo;
      try {
        id = handle.stat();
      } catch (err) {
        // Without our inode we could not release safely: give the lock up.
        // Closing drops the flock, so the file is stale for the next taker.
        handle.close();
        throw mapError(err, path, "cannot read back the lock");
      }
      if (tookOver || !swept.has(path)) {
        swept.add(path);
        sweep(path);
      }
      return { handle, id, started };
    }
  } finally {
    if (temp !== undefined) discardTemp(temp);
  }
  if (lastHeld !== undefined) return lastHeld;
  throw new ContendedError(path, MAX_ATTEMPTS);
}

const sleeper = new Int32Array(new SharedArrayBuffer(4));

/** Drives {@linkcode attemptLoop} with blocking sleeps. */
export function runSync<T>(steps: Generator<number, T, void>): T {
  let step = steps.next();
  while (!step.done) {
    Atomics.wait(sleeper, 0, 0, step.value);
    step = steps.next();
  }
  return step.value;
}

/**
 * The read-only probe: never takes LOCK_EX, never writes, needs only read
 * access. LOCK_SH, not LOCK_EX, so two probers never see each other as a
 * holder.
 */
export function probe(path: string): Probe {
  const result: Probe = {
    state: "free",
    pid: 0,
    host: "",
    started: undefined,
    foreign: false,
    reason: undefined,
  };
  let handle: Handle;
  try {
    handle = p.openExisting(path);
  } catch (err) {
    const code = errnoOf(err);
    if (code === "ENOENT") return result;
    if (code === "ELOOP" || code === "EFTYPE") {
      const error = invalidOpen(err as SysError, path);
      return { ...result, state: "invalid", reason: error.reason };
    }
    throw mapError(err, path, "cannot read the lock file");
  }
  try {
    const locked = !handle.tryLock(false);
    if (!locked) handle.unlock();
    const record = parseRecord(handle.readAll(MAX_RECORD_BYTES + 1));
    switch (record.kind) {
      case "runlock":
        result.pid = record.pid;
        result.host = record.host;
        result.started = record.started;
        result.state = locked ? "held" : "stale";
        return result;
      case "foreign":
        result.pid = record.pid;
        result.foreign = true;
        result.state = locked || liveness(record.pid) !== "dead"
          ? "held"
          : "stale";
        return result;
      case "empty":
        result.state = locked ? "held" : "stale";
        return result;
      case "garbage":
        if (locked) {
          result.state = "held"; // flock(1) or similar holds it
        } else {
          result.state = "invalid";
          result.reason = record.reason;
        }
        return result;
    }
  } catch (err) {
    throw mapError(err, path, "cannot read the lock file");
  } finally {
    handle.close();
  }
}
