/**
 * The runlock protocol (see PROTOCOL.md): one bounded attempt loop, the
 * contention verdict, the litter sweep and the read-only probe. Everything
 * here goes through the platform interface, never a runtime directly.
 *
 * @module
 */

import {
  ContendedError,
  HeldError,
  InvalidLockFileError,
  LockPermissionError,
  RunlockError,
  UnsupportedFilesystemError,
} from "./errors.ts";
import { platform as p } from "./platform/current.ts";
import {
  type Dir,
  type FileInfo,
  type Handle,
  type Liveness,
  SysError,
} from "./platform/types.ts";
import {
  formatRecord,
  MAX_PID,
  MAX_RECORD_BYTES,
  parsePid,
  parseRecord,
  recordHead,
} from "./record.ts";

/** Attempts in one acquire loop before giving up as contended. */
export const MAX_ATTEMPTS = 16;

/** The lock file's mode unless the caller asks for another. */
export const DEFAULT_MODE = 0o644;

/**
 * A lock path, split once. `dir` and `name` are what the kernel sees: the
 * path's directory part (as given, resolved only when pinned) and its last
 * component.
 */
export interface LockPath {
  /** The path as the caller gave it, for messages. */
  path: string;
  /** The directory part (`"."` for a bare name). */
  dir: string;
  /** The last component. */
  name: string;
}

/**
 * The lock's directory, resolved once and pinned at acquire: every later
 * system call of that acquire and of the lock it returns names `file` (or a
 * temp file beside it), never the caller's path again.
 */
export interface Target extends LockPath {
  /** The pinned directory. */
  pinned: Dir;
  /** The lock file, through the pinned directory. */
  file: string;
}

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
  started: Date | undefined;
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
  /** Whether the file holds a runlock record (the marker on line 2). */
  marker: boolean;
  /** The record's `runtime=`, or `""`. */
  runtime: string;
  /** The record's boot id and PID namespace, or `""`. */
  boot: string;
  pidns: string;
  /** The record's user fields. */
  meta: { [key: string]: string };
  /** With `racing`: the PID lives elsewhere, so `kill` could not judge it. */
  far: boolean;
  /**
   * `held`, but by a PID that is provably dead: a peer in the microseconds
   * of a takeover (or a tool such as flock(1) on a crashed run's file); or
   * a garbage file under a flock, which may be a lock taken only to read it
   * that lives on in a child forked meanwhile, until its exec (or flock(1)
   * holding a file it wrote). Callers look again before answering.
   */
  racing: boolean;
}

export function errnoOf(err: unknown): string | undefined {
  return err instanceof SysError ? err.code : undefined;
}

/**
 * Splits and checks a lock path: one rule for every entry point, before
 * anything touches the disk. The last component must name a file.
 */
export function lockPath(path: unknown, action: string): LockPath {
  if (typeof path !== "string" || path === "" || path.includes("\0")) {
    throw new TypeError(
      `Cannot ${action} as 'path' must be a non-empty string without NUL: current value is ${
        typeof path === "string" ? JSON.stringify(path) : String(path)
      }`,
    );
  }
  const slash = path.lastIndexOf("/");
  const name = path.slice(slash + 1);
  if (name === "" || name === "." || name === "..") {
    throw new TypeError(
      `Cannot ${action} as 'path' must name a file, not a directory: current value is ${
        JSON.stringify(path)
      }`,
    );
  }
  const dir = slash < 0 ? "." : slash === 0 ? "/" : path.slice(0, slash);
  return { path, dir, name };
}

/** `dir + "/" + name` without doubling the slash after "/". */
export function within(dir: string, name: string): string {
  return dir.endsWith("/") ? dir + name : `${dir}/${name}`;
}

const LINK_UNSUPPORTED = new Set(["EPERM", "ENOTSUP", "EOPNOTSUPP", "ENOSYS"]);
const LOCK_UNSUPPORTED = new Set([
  "ENOLCK",
  "ENOTSUP",
  "EOPNOTSUPP",
  "ENOSYS",
  "EINVAL",
]);

// What probes do: they need read access only.
const PROBE_ACTIONS = new Set([
  "cannot read the lock file",
  "cannot list the directory",
]);

/** Maps a failed system call to one of runlock's typed errors. */
export function mapError(err: unknown, path: string, action: string): Error {
  if (err instanceof RunlockError) return err;
  if (!(err instanceof SysError)) {
    return new RunlockError(path, `${path}: ${action}: ${err}`, {
      cause: err,
    });
  }
  const slash = path.lastIndexOf("/");
  const dir = slash < 0 ? "." : slash === 0 ? "/" : path.slice(0, slash);
  const { code, syscall } = err;
  if (code === "NOTCAPABLE") {
    // The directory Deno wants a grant for: the real one, where the path
    // goes through a symlink. Probes need read access only.
    const where = err.grant?.replace(/^--allow-\w+=/, "") ?? dir;
    const grant = PROBE_ACTIONS.has(action)
      ? `--allow-read=${where}`
      : `--allow-read=${where} --allow-write=${where}`;
    return new LockPermissionError(
      path,
      action,
      `run Deno with ${grant} (runlock never prompts)`,
      { cause: err },
    );
  }
  if (code === "ENOFFI") {
    return new RunlockError(path, `${path}: ${action}: ${err.message}`, {
      cause: err,
    });
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
  if (code === "ENAMETOOLONG") {
    return new RunlockError(
      path,
      `${path}: ${action}: the name or the path is longer than the filesystem allows`,
      { cause: err },
    );
  }
  return new RunlockError(path, `${path}: ${action}: ${err.message}`, {
    cause: err,
  });
}

/**
 * The error for a lock file this user may not open for reading: the file
 * itself is unreadable (its mode), or the directory is. Says which.
 */
function unreadable(err: SysError, lp: LockPath, file: string): Error {
  let info: FileInfo | null = null;
  try {
    info = p.lstat(file);
  } catch (lstatErr) {
    if (errnoOf(lstatErr) === "EACCES") {
      // The directory itself is not searchable: a probe needs to enter it
      // (and read the file), never to write there.
      return new LockPermissionError(
        lp.path,
        "cannot read the lock file",
        `this user cannot enter ${lp.dir} (probes need search (x) ` +
          `permission on the lock's directory and read permission on the file)`,
        { cause: err },
      );
    }
  }
  if (info === null || (err.code !== "EACCES" && err.code !== "EPERM")) {
    return mapError(err, lp.path, "cannot read the lock file");
  }
  return new LockPermissionError(
    lp.path,
    "cannot read the lock file",
    `the file is not readable by this user (mode ${
      info.mode.toString(8).padStart(4, "0")
    }, owner uid ${info.uid}); probes need read access to the file`,
    { cause: err },
  );
}

function invalidOpen(err: SysError, lp: LockPath, file: string): Error {
  if (err.code === "ELOOP") {
    return new InvalidLockFileError(
      lp.path,
      "is a symbolic link (runlock never follows one)",
      { cause: err },
    );
  }
  let kind: FileInfo["kind"] | undefined;
  try {
    kind = p.lstat(file)?.kind;
  } catch {
    kind = undefined;
  }
  return new InvalidLockFileError(
    lp.path,
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

/**
 * Whether a foreign pidfile (no runlock marker) names a run that may be
 * alive. Its PID being our own means nothing: this process cannot hold a
 * lock it has not taken (a container's service is PID 1 on every boot, and
 * so was the run that left the file).
 */
function foreignAlive(pid: number): boolean {
  if (pid === p.pid) return false;
  return liveness(pid) !== "dead";
}

/**
 * Whether a record's PID lives where it cannot mean a process of ours: it
 * names another host, boot or PID namespace than this process's (each only
 * when both sides know it). Such a PID cannot be checked with `kill` here.
 */
export function elsewhere(
  record: { host: string; boot: string; pidns: string },
): "host" | "boot" | "namespace" | undefined {
  const { boot, pidns } = p.identity();
  // The boot id and the PID namespace decide when both sides know them: the
  // same kernel boot and namespace mean the same PID, whatever the host
  // name says (a container has a name of its own). Else the host name.
  if (record.boot && boot && record.boot !== boot) return "boot";
  if (record.pidns && pidns && record.pidns !== pidns) return "namespace";
  if (record.boot && boot && record.pidns && pidns) return undefined;
  const host = p.hostname();
  if (record.host && host && record.host !== host) return "host";
  return undefined;
}

function sameFile(a: FileInfo | null, b: FileInfo): boolean {
  return a !== null && a.dev === b.dev && a.ino === b.ino;
}

/** A map key for an inode. */
export function inodeKey(id: FileInfo): string {
  return `${id.dev}:${id.ino}`;
}

/**
 * The locks this process holds, by inode, with when each was taken. A
 * second acquire of one of them (through any path: the same, a relative
 * one, a symlinked directory, a hard link) fails at once with HeldError
 * instead of waiting on our own flock: locks are not reentrant.
 */
export const heldHere = new Map<string, Date>();

const encoder = new TextEncoder();
const decoder = new TextDecoder();

const MARKER_LINE = /^runlock [1-9][0-9]{0,8}\r?$/;

/** Whether the first bytes of a file hold the runlock marker on line 2. */
function headHasMarker(head: Uint8Array): boolean {
  const text = decoder.decode(head);
  const first = text.indexOf("\n");
  const second = text.indexOf("\n", first + 1);
  return first >= 0 && second > first &&
    MARKER_LINE.test(text.slice(first + 1, second));
}

// Temp names: a random 32-bit prefix per process and a counter, so that a
// name costs no system call and no random draw on the hot path, and other
// processes still cannot predict it. O_EXCL settles any collision.
const processTag = Array.from(
  crypto.getRandomValues(new Uint8Array(4)),
  (b) => b.toString(16).padStart(2, "0"),
).join("");
let tempCounter = 0;

// The longest file name (NAME_MAX) on the filesystems runlock supports.
const NAME_MAX = 255;
// "." + name + "." + 16 hex digits + ".tmp"
const TEMP_EXTRA = 22;

/**
 * The part of a temp file's name that comes from the lock's name: the name,
 * cut (at a character boundary) so that the temp name still fits in
 * NAME_MAX bytes. Every lock name the filesystem accepts can then be
 * locked.
 */
export function tempStem(name: string): string {
  const room = NAME_MAX - TEMP_EXTRA;
  if (name.length * 3 <= room) return name; // fast path: fits whatever it is
  let bytes = 0;
  let end = 0;
  for (const ch of name) {
    const size = encoder.encode(ch).length;
    if (bytes + size > room) break;
    bytes += size;
    end += ch.length;
  }
  return name.slice(0, end);
}

// The record's first lines are the same for every lock of this process,
// and so are the identity lines that follow runtime=.
let head: string | undefined;
function recordHeadHere(): string {
  return head ??= recordHead(p.pid, p.hostname());
}
let identityLines: string | undefined;
/** `boot=` and `pidns=` lines for this process, where they can be read. */
export function identityHere(): string {
  if (identityLines === undefined) {
    const { boot, pidns } = p.identity();
    identityLines = (boot ? `boot=${boot}\n` : "") +
      (pidns ? `pidns=${pidns}\n` : "");
  }
  return identityLines;
}

/** The size in bytes of the record this process would write with `extra`. */
export function recordSize(extra: string): number {
  return encoder.encode(
    formatRecord(recordHeadHere(), new Date(0), p.runtime, extra),
  ).length;
}

const TEMP = /^[0-9a-f]{16}$/;

interface Temp {
  path: string;
  handle: Handle;
  started: Date;
  id: FileInfo;
}

/**
 * Step 1: a temp file, created new, locked LOCK_EX at once, holding the whole
 * record, with the lock's mode whatever the umask. `undefined` means a
 * sweeper got to it before our flock: try again.
 */
function createTemp(
  target: Target,
  mode: number,
  extra: string,
): Temp | undefined {
  tempCounter = (tempCounter + 1) >>> 0;
  const tempPath = within(
    target.pinned.prefix,
    `.${tempStem(target.name)}.${processTag}${
      tempCounter.toString(16).padStart(8, "0")
    }.tmp`,
  );
  let handle: Handle;
  try {
    handle = p.createNew(tempPath);
  } catch (err) {
    const code = errnoOf(err);
    if (code === "EEXIST") return undefined; // 64 random bits collided
    if (code === "ENOENT") {
      // The directory was pinned, so it exists (or existed): it refuses
      // new files. Say that, not "missing directory".
      throw new RunlockError(
        target.path,
        `${target.path}: cannot create the lock: ${target.dir} does not accept new files ` +
          `(creating one there fails with ENOENT: a virtual filesystem such as /proc or /sys, ` +
          `or a directory removed since); choose a lock path on a real filesystem`,
        { cause: err },
      );
    }
    throw mapError(err, target.path, "cannot create the lock");
  }
  try {
    if (!handle.tryLock(true)) {
      // A sweeper holds it and is about to remove it as litter.
      handle.close();
      return undefined;
    }
    const id = handle.stat();
    // The umask may have taken bits away (077 makes it 0600, which other
    // users' probes could not read): set the mode we promise, where that is
    // safe (see the Deno platform's chmod).
    if (id.mode !== mode) {
      try {
        handle.chmod(mode);
      } catch (err) {
        if (errnoOf(err) !== "EUNSAFE") throw err;
      }
    }
    const started = new Date();
    handle.write(
      encoder.encode(formatRecord(recordHeadHere(), started, p.runtime, extra)),
    );
    return { path: tempPath, handle, started, id };
  } catch (err) {
    discardTemp({ path: tempPath, handle, started: new Date(0), id: EMPTY });
    throw mapError(err, target.path, "cannot write the lock");
  }
}

const EMPTY: FileInfo = {
  dev: 0,
  ino: 0,
  size: 0,
  mode: 0,
  uid: 0,
  kind: "other",
};

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
 * LOCK_EX|LOCK_NB succeeds, and they hold nothing but a runlock record (or
 * nothing: the creator died before writing). A file that only looks like
 * ours is left alone. Best effort; never throws.
 */
export function sweep(target: Target): number {
  const dir = target.pinned.prefix;
  const prefix = `.${tempStem(target.name)}.`;
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
    const tempPath = within(dir, name);
    let handle: Handle;
    try {
      handle = p.openExisting(tempPath);
    } catch {
      continue;
    }
    try {
      // Unlink only while holding LOCK_EX on the inode the name still names.
      if (!handle.tryLock(true)) continue;
      const kind = parseRecord(handle.readAll(MAX_RECORD_BYTES + 1)).kind;
      if (kind !== "empty" && kind !== "runlock") continue;
      if (sameFile(p.lstat(tempPath), handle.stat())) {
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

/** Unlinks `file` if it still names the inode we hold LOCK_EX on. */
function removeStale(target: Target, ours: FileInfo): Verdict {
  // We hold LOCK_EX on this inode and every participant unlinks only under
  // that lock, after this same check, through the same pinned directory,
  // so a fresh lock is never deleted.
  try {
    if (sameFile(p.lstat(target.file), ours)) p.unlink(target.file);
  } catch (err) {
    const code = errnoOf(err);
    if (code === "ENOENT") return TOOK_OVER;
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
    dir = p.lstat(within(target.pinned.prefix, "."));
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

/** Step 3: link said EEXIST. Decide who, if anyone, holds the file. */
function contend(target: Target): Verdict {
  let handle: Handle;
  try {
    handle = p.openExisting(target.file);
  } catch (err) {
    const code = errnoOf(err);
    if (code === "ENOENT" || code === "ERACE") return RETRY; // changed meanwhile
    if (code === "ELOOP" || code === "EFTYPE") {
      throw invalidOpen(err as SysError, target, target.file);
    }
    if (err instanceof SysError) throw unreadable(err, target, target.file);
    throw mapError(err, target.path, "cannot open the lock file");
  }
  try {
    const ours = handle.stat();
    const since = heldHere.get(inodeKey(ours));
    if (since !== undefined) {
      throw new HeldError(target.path, p.pid, p.hostname(), {
        started: since,
        byThisProcess: true,
      });
    }
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
    if (!sameFile(p.lstat(target.file), ours)) return RETRY;
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
    const sure = record.kind !== "garbage" &&
      (pid === 0 || (!far && liveness(pid) !== "dead"));
    return { kind: "held", held: { pid, host, started }, sure };
  } catch (err) {
    // A failed fstat, flock, read or lstat of the file we found: a typed
    // error that names the file and the action (HeldError and the other
    // typed errors pass through as they are).
    throw mapError(err, target.path, "cannot read the lock file");
  } finally {
    handle.close();
  }
}

// Lock paths this process has swept litter for. One sweep per path per
// process (and one after each takeover, when a crash is known to have
// happened) keeps the directory scan off the hot path. Bounded: a server
// that locks a new name per job must not grow without end; forgetting a
// path only costs one more sweep.
const swept = new Set<string>();
const MAX_SWEPT = 1024;

function backoffMs(attempt: number): number {
  return Math.min(0.05 * 2 ** attempt, 8) * (0.5 + Math.random() / 2);
}

/**
 * Resolves the lock's directory once and pins it, creating it (and its
 * parents) if it is missing. Every later call of the acquire, and of the
 * lock it returns, goes through the pinned directory.
 */
export function pin(lp: LockPath): Target {
  let pinned: Dir;
  try {
    pinned = p.openDir(lp.dir);
  } catch (err) {
    if (errnoOf(err) !== "ENOENT") {
      throw mapError(err, lp.path, "cannot open the lock's directory");
    }
    // The directory is missing: create it, once, off the hot path.
    try {
      p.mkdirp(lp.dir);
      pinned = p.openDir(lp.dir);
    } catch (err) {
      throw mapError(err, lp.path, "cannot create the lock's directory");
    }
  }
  return { ...lp, pinned, file: within(pinned.prefix, lp.name) };
}

/**
 * One bounded attempt loop (protocol steps 1 to 4). Yields how long to sleep
 * between attempts, so that the same loop serves sync and async callers.
 * Returns the lock, or who holds it; throws typed errors.
 */
export function* attemptLoop(
  target: Target,
  mode: number,
  extra: string,
): Generator<number, Acquired | HeldBy, void> {
  let temp: Temp | undefined;
  let lastHeld: HeldBy | undefined;
  let tookOver = false;
  try {
    for (let attempt = 1; attempt <= MAX_ATTEMPTS; attempt++) {
      temp ??= createTemp(target, mode, extra);
      if (temp === undefined) continue;
      try {
        p.link(temp.path, target.file);
      } catch (err) {
        const code = errnoOf(err);
        if (code === "ENOENT") {
          // A sweeper removed our temp file just before we locked it.
          discardTemp(temp);
          temp = undefined;
          continue;
        }
        if (code !== "EEXIST") {
          throw mapError(err, target.path, "cannot create the lock");
        }
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
      const { handle, started, path: tempPath, id } = temp;
      temp = undefined;
      try {
        p.unlink(tempPath);
      } catch {
        // Left behind, it is a second name of our locked inode; the sweep
        // removes it once we are gone.
      }
      if (tookOver || !swept.has(target.path)) {
        if (swept.size >= MAX_SWEPT) swept.clear();
        swept.add(target.path);
        sweep(target);
      }
      return { handle, id, started };
    }
  } finally {
    if (temp !== undefined) discardTemp(temp);
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

/**
 * The read-only probe: never takes LOCK_EX, never writes, needs only read
 * access. LOCK_SH, not LOCK_EX, so two probers never see each other as a
 * holder. `file` is the path to open (the pinned file while acquiring, the
 * caller's path otherwise); `lp` names it in errors.
 */
export function probe(
  lp: LockPath,
  file: string = lp.path,
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
    racing: false,
    far: false,
  };
  let handle: Handle;
  try {
    handle = p.openExisting(file);
  } catch (err) {
    const code = errnoOf(err);
    if (code === "ENOENT") return result;
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
  try {
    const locked = !handle.tryLock(false);
    if (locked && !whole) {
      // held(): every record under a held flock is held; only the takeover
      // rule needs the PID, which is on line 1 (before the marker on line 2).
      const head = handle.readAll(32);
      result.state = "held";
      result.pid = parsePid(
        decoder.decode(head.subarray(0, head.indexOf(10) >>> 0)),
      );
      // No PID in a file that is not empty: garbage under the flock (see
      // the next case).
      result.racing = result.pid === 0 && head.length > 0;
      if (
        result.pid > 0 && headHasMarker(head) &&
        liveness(result.pid) === "dead"
      ) {
        // Rare: read the whole record to tell a takeover from a holder in
        // another PID namespace.
        const record = parseRecord(handle.readAll(MAX_RECORD_BYTES + 1));
        result.racing = record.kind === "runlock";
        result.far = record.kind === "runlock" &&
          elsewhere(record) !== undefined;
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
        result.state = locked ? "held" : "stale";
        // A dead holder under a held flock: a takeover in progress. A PID
        // that lives elsewhere (another host, boot or PID namespace) cannot
        // be asked: maybe a live holder, maybe a takeover; look again
        // briefly.
        result.far = locked && elsewhere(record) !== undefined;
        result.racing = locked &&
          (result.far || liveness(record.pid) === "dead");
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
 * file).
 */
export function* probeSteps(
  lp: LockPath,
  whole = true,
): Generator<number, Probe, void> {
  let found = probe(lp, lp.path, whole);
  // A PID from elsewhere is most likely a live holder in a container: look
  // again only as long as a takeover takes, not as long as flock(1) might.
  const sleeps = found.far ? FAR_SLEEPS : RACING_SLEEPS;
  for (const ms of sleeps) {
    if (!found.racing) return found;
    yield ms;
    found = probe(lp, lp.path, whole);
  }
  return found;
}

/** Sleeps (ms) between looks at a held lock whose PID lives elsewhere. */
const FAR_SLEEPS = [0, 1, 2, 4, 8];
