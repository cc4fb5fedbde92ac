/**
 * What the steps of the runlock protocol (see PROTOCOL.md) share: lock
 * paths, error mapping, liveness and the locks this process holds. The
 * steps live beside it: the attempt loop (`_attempt.ts`), contention and
 * takeover (`_contend.ts`), the litter sweep (`_sweep.ts`) and the
 * read-only probe (`_probe.ts`); so does what this process writes, its
 * record and its temp files' names (`_record_here.ts`).
 * Everything goes through the platform interface, never a runtime directly.
 *
 * @module
 */

import {
  InvalidLockFileError,
  LockPermissionError,
  RunlockError,
  UnsupportedFilesystemError,
} from "../errors.ts";
import { platform as p } from "../platform/current.ts";
import {
  type Dir,
  type FileInfo,
  type Handle,
  type Liveness,
  SysError,
} from "../platform/types.ts";
import { MAX_PID, MAX_RECORD_BYTES } from "./record.ts";

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
}

/** The lock was taken: our descriptor (holding LOCK_EX) and its inode. */
export interface Acquired {
  handle: Handle;
  id: FileInfo;
  started: Date;
  /**
   * The pinned directory's canonical path when the file was linked there,
   * or `""` where it cannot be told (see `placed` in `_attempt.ts`).
   */
  dir?: string;
}

/** A live run holds the lock. */
export interface HeldBy {
  pid: number;
  host: string;
  started: Date | undefined;
  /**
   * The live command `runlock run` handed the lock to, when `pid` (that
   * runlock) is gone; otherwise 0 or absent.
   */
  child?: number;
  /**
   * The identity of the file (`fileKey`'s form) when the attempt saw it
   * held by a live runlock holder of this host, as a whole look would.
   */
  key?: string;
  /**
   * With `key`: the attempt's read-only descriptor of that file, open and
   * unlocked, for the caller's first look (its flock), which the caller
   * closes.
   */
  kept?: Handle;
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
  /** The record's `child=`: the command `runlock run` handed it to, or 0. */
  child: number;
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

/**
 * What Deno's refusal `err` (NOTCAPABLE) of an operation on `dir` asks to
 * grant: `real`, the directory it wants (the real one, where `dir` goes
 * through a symlink), and `read`, the paths `--allow-read` must name.
 * Resolving the symlink needs read access to it as well, so both are named
 * (granting the real one alone would only move the refusal there).
 */
export function grants(
  err: SysError,
  dir: string,
): { read: string; real: string } {
  const real = err.grant?.replace(/^--allow-\w+=/, "") ?? dir;
  return { read: real === dir ? dir : `${dir},${real}`, real };
}

/**
 * Maps a failed system call to one of runlock's typed errors. `where`: the
 * directory the call needed, when it is not the path's own (a missing
 * parent's first existing ancestor, for mkdir).
 */
export function mapError(
  err: unknown,
  path: string,
  action: string,
  where?: string,
): Error {
  if (err instanceof RunlockError) return err;
  if (!(err instanceof SysError)) {
    return new RunlockError(path, `${path}: ${action}: ${err}`, {
      cause: err,
    });
  }
  const slash = path.lastIndexOf("/");
  const dir = where ??
    (slash < 0 ? "." : slash === 0 ? "/" : path.slice(0, slash));
  const { code, syscall } = err;
  if (code === "NOTCAPABLE") {
    // Probes need read access only.
    const { read, real } = grants(err, dir);
    const grant = PROBE_ACTIONS.has(action)
      ? `--allow-read=${read}`
      : `--allow-read=${read} --allow-write=${real}`;
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
export function unreadable(err: SysError, lp: LockPath, file: string): Error {
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

export function invalidOpen(err: SysError, lp: LockPath, file: string): Error {
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
 * process, so both always say "alive". (The record's readers already read
 * anything else as no PID; this is the one gate every caller passes.)
 */
export function liveness(pid: number): Liveness {
  if (!Number.isInteger(pid) || pid < 1 || pid > MAX_PID) return "unknown";
  if (pid === p.pid) return "alive";
  return p.processAlive(pid);
}

const fdinfoDecoder = new TextDecoder();

/**
 * Whether the command `runlock run` handed a lock to (the record's
 * `child=`) holds the flock of the lock file, inode `ino`: one of its
 * descriptors shows that inode's FLOCK WRITE lock in
 * `/proc/<child>/fdinfo`. Then a held flock under a dead runlock is that
 * command's, not a takeover in progress. A PID that lives but holds no
 * such lock (reused, or a command that closed fd 9 while what it started
 * keeps it) is not named. Where its descriptors may not be read (another
 * user's command, or Deno without --allow-all, which guards /proc), a
 * live command is taken at its record's word. False without /proc.
 */
export function childHolds(child: number, ino: number): boolean {
  if (liveness(child) !== "alive" || child === p.pid) return false;
  const dir = `/proc/${child}/fdinfo`;
  let names: string[];
  try {
    names = p.readDir(dir);
  } catch (err) {
    return !(err instanceof SysError && err.code === "ENOENT");
  }
  // The device in these lines is the superblock's, which can differ from
  // stat's: the inode alone is matched, with the lock's kind.
  const lock = new RegExp(
    `FLOCK +ADVISORY +WRITE +[0-9]+ +[0-9a-f]+:[0-9a-f]+:${ino} `,
  );
  let unread = false;
  for (const name of names) {
    let h: Handle | "ENOENT";
    try {
      h = p.openExisting(`${dir}/${name}`);
    } catch {
      unread = true;
      continue;
    }
    if (h === "ENOENT") continue;
    try {
      if (lock.test(fdinfoDecoder.decode(h.readAll(MAX_RECORD_BYTES)))) {
        return true;
      }
    } catch {
      // Closed meanwhile: not this one.
    } finally {
      h.close();
    }
  }
  return unread;
}

/**
 * Whether a foreign pidfile (no runlock marker) names a run that may be
 * alive. Its PID being our own means nothing: this process cannot hold a
 * lock it has not taken (a container's service is PID 1 on every boot, and
 * so was the run that left the file).
 */
export function foreignAlive(pid: number): boolean {
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

export function sameFile(a: FileInfo | null, b: FileInfo): boolean {
  return a !== null && a.dev === b.dev && a.ino === b.ino;
}

/** One held inode of {@linkcode HeldInodes}, chained by inode number. */
interface HeldInode {
  readonly dev: number;
  readonly started: Date;
  next: HeldInode | undefined;
}

/**
 * Dates by inode (device and inode number), keyed by the inode number: a
 * number key, where a `dev:ino` string cost two number-to-string
 * conversions and a string hash per acquire and per release. Inodes of
 * the same number on other devices are chained.
 */
export class HeldInodes {
  #byIno = new Map<number, HeldInode>();

  /** When the inode `id` was taken, or `undefined` if it is not held. */
  get(id: FileInfo): Date | undefined {
    for (let e = this.#byIno.get(id.ino); e !== undefined; e = e.next) {
      if (e.dev === id.dev) return e.started;
    }
    return undefined;
  }

  /** Notes the inode `id` as held since `started`. */
  set(id: FileInfo, started: Date): void {
    this.delete(id);
    this.#byIno.set(id.ino, {
      dev: id.dev,
      started,
      next: this.#byIno.get(id.ino),
    });
  }

  /** Forgets the inode `id`. */
  delete(id: FileInfo): void {
    const first = this.#byIno.get(id.ino);
    if (first === undefined) return;
    if (first.dev === id.dev) {
      if (first.next === undefined) this.#byIno.delete(id.ino);
      else this.#byIno.set(id.ino, first.next);
      return;
    }
    for (let e = first; e.next !== undefined; e = e.next) {
      if (e.next.dev === id.dev) {
        e.next = e.next.next;
        return;
      }
    }
  }
}

/**
 * The locks this process holds, by inode, with when each was taken. A
 * second acquire of one of them (through any path: the same, a relative
 * one, a symlinked directory, a hard link) fails at once with HeldError
 * instead of waiting on our own flock: locks are not reentrant.
 */
export const heldHere = new HeldInodes();
