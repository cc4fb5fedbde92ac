/**
 * The Node.js (and Bun) platform's pinned directories and open files on
 * Linux x86-64 and arm64: every entry named relative to the directory's
 * descriptor with libc's `*at()` calls (`_libc_node.ts`), every file call on
 * the file's descriptor, and the answers the protocol expects (ENOENT,
 * EEXIST, EWOULDBLOCK) returned as values. No `node:fs` on these paths: it
 * has no `*at()` calls (a pinned directory had to be named
 * `/proc/self/fd/N/<name>`), and it throws an exception per ENOENT.
 *
 * @module
 */

import { fs, inNodeWorker } from "./_node.ts";
import { release } from "node:os";
import { process } from "../_process.ts";
import {
  AT_FDCWD,
  AT_SYMLINK_NOFOLLOW,
  EEXIST,
  EINTR,
  ENOENT,
  errnoError,
  flockFd,
  type Libc,
  libc,
  O_CLOEXEC,
  O_PATH,
  statInfo,
  statIsFile,
} from "./_libc_node.ts";
import { scratch, sysError } from "./_fs_node.ts";
import { type Dir, type FileInfo, type Handle, SysError } from "./types.ts";

const { constants: fsc, fstatSync, realpathSync, statSync } = fs;

const LOCK_SH = 1;
const LOCK_EX = 2;
const LOCK_NB = 4;
const LOCK_UN = 8;
const ENXIO = 6;

// The *at() path: libc with `at`, or null where node:fs serves. Resolved on
// the first lock operation. Not in a Node worker thread: Node closes the
// descriptors node:fs opened in a worker when it ends (so the kernel drops
// the flocks of a terminated worker's locks), never those the FFI opened.
let fast: Libc | null | undefined;
/** libc with the `*at()` calls, or `null` where `node:fs` must serve. */
export function ffi(): Libc | null {
  if (fast === undefined) {
    const l = inNodeWorker() ? null : libc();
    fast = l?.at ? l : null;
  }
  return fast;
}

const CREATE = fsc.O_RDWR | fsc.O_CREAT | fsc.O_EXCL | O_CLOEXEC;
// O_NONBLOCK: opening a FIFO must not hang. O_NOFOLLOW: ELOOP on a symlink.
// O_NOCTTY: a terminal put at the path never becomes the controlling
// terminal of a process without one (a daemon that leads its session).
const OPEN_EXISTING = fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK |
  (fsc.O_NOCTTY ?? 0) | O_CLOEXEC;
// A directory to pin: O_PATH on Linux (needs only search permission, reads
// nothing), else read-only.
export const OPEN_DIR = (process.platform === "linux" ? O_PATH : fsc.O_RDONLY) |
  fsc.O_DIRECTORY;

/** `dir/name` for messages, or `name` when it is a whole path. */
const named = (dir: string, name: string) =>
  dir === "" ? name : `${dir}/${name}`;

/**
 * An open regular file, every call through the FFI. Its name (`dir` and
 * `name`) is only for messages.
 */
class FdHandle implements Handle {
  #fd: number;
  #dir: string;
  #name: string;

  constructor(fd: number, dir: string, name: string) {
    this.#fd = fd;
    this.#dir = dir;
    this.#name = name;
  }

  fd(): number | undefined {
    return this.#fd >= 0 ? this.#fd : undefined;
  }

  tryLock(exclusive: boolean): boolean {
    return flockFd(
      this.#fd,
      (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB,
      this.#dir,
      this.#name,
    );
  }

  unlock(): void {
    flockFd(this.#fd, LOCK_UN, this.#dir, this.#name);
  }

  write(data: Uint8Array): void {
    this.#writeAll(data, -1);
  }

  writeAt(data: Uint8Array, offset: number): void {
    this.#writeAll(data, offset);
  }

  /** All of `data`: at the file's offset (`write`), or at `at` (`pwrite`). */
  #writeAll(data: Uint8Array, at: number): void {
    const l = fast!;
    let done = 0;
    while (done < data.length) {
      const rest = done === 0 ? data : data.subarray(done);
      const n = at < 0
        ? l.write(this.#fd, rest, data.length - done)
        : l.pwrite(this.#fd, rest, data.length - done, at + done);
      if (n > 0) {
        done += n;
        continue;
      }
      const errno = n < 0 ? l.errno() : 5; // no progress: EIO
      if (errno === EINTR) continue;
      throw errnoError(errno, "write", named(this.#dir, this.#name));
    }
  }

  readAll(max: number): Uint8Array {
    const l = fast!;
    const buf = max <= scratch.length ? scratch : new Uint8Array(max);
    let len = 0;
    while (len < max) {
      const n = l.pread(
        this.#fd,
        len === 0 ? buf : buf.subarray(len),
        max - len,
        len,
      );
      if (n < 0) {
        const errno = l.errno();
        if (errno === EINTR) continue;
        throw errnoError(errno, "read", named(this.#dir, this.#name));
      }
      if (n === 0) break;
      len += n;
      // A regular file reads short only at its end: no second read.
      if (len < max) break;
    }
    return buf.subarray(0, len); // a view: see Handle.readAll
  }

  stat(): FileInfo {
    const l = fast!;
    while (l.fstat(this.#fd) !== 0) {
      const errno = l.errno();
      if (errno !== EINTR) {
        throw errnoError(errno, "fstat", named(this.#dir, this.#name));
      }
    }
    return statInfo();
  }

  chmod(mode: number): void {
    const l = fast!;
    while (l.fchmod(this.#fd, mode) !== 0) {
      const errno = l.errno();
      if (errno !== EINTR) {
        throw errnoError(errno, "fchmod", named(this.#dir, this.#name));
      }
    }
  }

  closeFirstAtExit(): void {
    if (!LAST_IN_FIRST_OUT || this.#fd < 0) return;
    const l = fast!;
    // 1024 and up, or 256 and up where the limit of descriptors is lower
    // (EINVAL); anything else (EMFILE) keeps the descriptor as it is.
    for (const min of [1024, 256]) {
      if (this.#fd >= min) return;
      const high = l.dupfd(this.#fd, min);
      if (high >= 0) {
        // The flock is the open file's, which `high` keeps open: closing
        // the old number drops nothing and reports no close to waiters.
        l.close(this.#fd);
        this.#fd = high;
        return;
      }
      if (l.errno() !== EINVAL) return;
    }
  }

  close(): void {
    if (this.#fd < 0) return;
    // Linux frees the descriptor (and the flock) whatever close returns.
    fast!.close(this.#fd);
    this.#fd = -1;
  }
}

/**
 * Whether the kernel closes a dying process's files from its highest
 * descriptor down: Linux 4.3 and later (commit c82199061009, "task_work:
 * remove fifo ordering guarantee"; before it, from the lowest up, where
 * the descriptor had best stay low).
 */
const LAST_IN_FIRST_OUT = (() => {
  const [major, minor] = release().split(".").map((n) => parseInt(n, 10));
  return major > 4 || (major === 4 && minor >= 3);
})();
const EINVAL = 22;

/**
 * Opens the existing regular file `name` relative to `dirfd` (`dir` names
 * it in messages; AT_FDCWD and "" for a whole path), as
 * {@linkcode Platform.openExisting} promises.
 */
export function openAt(
  dirfd: number,
  dir: string,
  name: string,
): Handle | "ENOENT" {
  const l = fast!;
  let fd: number;
  for (;;) {
    fd = l.openat(dirfd, name, OPEN_EXISTING, 0);
    if (fd >= 0) break;
    const errno = l.errno();
    if (errno === EINTR) continue;
    if (errno === ENOENT) return "ENOENT";
    // A UNIX socket cannot be opened: ENXIO. It is not a regular file.
    if (errno === ENXIO) {
      throw new SysError(
        "EFTYPE",
        "open",
        `open '${named(dir, name)}': a socket, or a device without a driver`,
      );
    }
    // ELOOP for a symlink (O_NOFOLLOW), which is never followed.
    throw errnoError(errno, "open", named(dir, name));
  }
  while (l.fstat(fd) !== 0) {
    const errno = l.errno();
    if (errno === EINTR) continue;
    l.close(fd);
    throw errnoError(errno, "fstat", named(dir, name));
  }
  if (!statIsFile()) {
    l.close(fd);
    throw new SysError(
      "EFTYPE",
      "open",
      `open '${named(dir, name)}': not a regular file`,
    );
  }
  return new FdHandle(fd, dir, name);
}

/**
 * A directory pinned by its descriptor: every entry is named relative to
 * it, with the *at() calls. `prefix` names it for watches and messages.
 */
class FdDir implements Dir {
  readonly prefix: string;
  readonly byDescriptor = true;
  // -1 once closed: a later call fails EBADF, never lands elsewhere.
  #fd: number;

  constructor(prefix: string, fd: number) {
    this.prefix = prefix;
    this.#fd = fd;
  }

  create(name: string): Handle | "EEXIST" | "ENOENT" {
    const l = fast!;
    for (;;) {
      const fd = l.openat(this.#fd, name, CREATE, 0o644);
      if (fd >= 0) return new FdHandle(fd, this.prefix, name);
      const errno = l.errno();
      if (errno === EINTR) continue;
      if (errno === EEXIST) return "EEXIST";
      if (errno === ENOENT) return "ENOENT";
      throw errnoError(errno, "open", `${this.prefix}/${name}`);
    }
  }

  open(name: string): Handle | "ENOENT" {
    return openAt(this.#fd, this.prefix, name);
  }

  link(existing: string, created: string): "EEXIST" | "ENOENT" | undefined {
    const l = fast!;
    while (l.linkat(this.#fd, existing, created) !== 0) {
      const errno = l.errno();
      if (errno === EINTR) continue;
      if (errno === EEXIST) return "EEXIST";
      if (errno === ENOENT) return "ENOENT";
      throw errnoError(errno, "link", `${this.prefix}/${created}`);
    }
    return undefined;
  }

  unlink(name: string): "ENOENT" | undefined {
    const l = fast!;
    while (l.unlinkat(this.#fd, name) !== 0) {
      const errno = l.errno();
      if (errno === EINTR) continue;
      if (errno === ENOENT) return "ENOENT";
      throw errnoError(errno, "unlink", `${this.prefix}/${name}`);
    }
    return undefined;
  }

  lstat(name: string): FileInfo | null {
    return lstatAt(this.#fd, this.prefix, name);
  }

  close(): void {
    if (this.#fd < 0) return;
    fast!.close(this.#fd);
    this.#fd = -1;
  }
}

export function lstatAt(
  dirfd: number,
  dir: string,
  name: string,
): FileInfo | null {
  const l = fast!;
  while (l.fstatat(dirfd, name, AT_SYMLINK_NOFOLLOW) !== 0) {
    const errno = l.errno();
    if (errno === EINTR) continue;
    if (errno === ENOENT) return null;
    throw errnoError(errno, "lstat", named(dir, name));
  }
  return statInfo();
}

// Whether /proc/self/fd/N names the open directory N (Linux with /proc
// mounted). Asked once per process.
let procFd: boolean | undefined;

/** Whether /proc/self/fd/N names the open directory N. */
export function procWorks(fd: number): boolean {
  if (procFd === undefined) {
    try {
      procFd = statSync(`/proc/self/fd/${fd}`).ino === fstatSync(fd).ino;
    } catch {
      procFd = false;
    }
  }
  return procFd;
}

/** Pins `path` by an O_PATH descriptor opened through the FFI. */
export function openDirAt(l: Libc, path: string): Dir {
  let fd: number;
  for (;;) {
    fd = l.openat(AT_FDCWD, path, OPEN_DIR | O_CLOEXEC, 0);
    if (fd >= 0) break;
    const errno = l.errno();
    if (errno !== EINTR) throw errnoError(errno, "open", path);
  }
  if (procWorks(fd)) return new FdDir(`/proc/self/fd/${fd}`, fd);
  // No /proc: still pinned by the descriptor; the canonical path names it.
  try {
    return new FdDir(realpathSync.native(path), fd);
  } catch (err) {
    l.close(fd);
    throw sysError(err, "realpath", path);
  }
}
