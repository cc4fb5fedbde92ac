/**
 * The Node.js (and Bun) implementation of {@linkcode Platform}.
 *
 * Node has neither flock nor the `*at()` system calls, so they are called
 * in libc through koffi's FFI (under Bun, through the built-in `bun:ffi`):
 * see `_libc_node.ts`. On Linux x86-64 and arm64 every call of a lock goes
 * through its pinned directory's descriptor (`openat`, `linkat`,
 * `unlinkat`, `fstatat`) and its file's (`flock`, `fstat`, `pread`, `write`,
 * `close`), and the answers the protocol expects (ENOENT, EEXIST,
 * EWOULDBLOCK) are values, never exceptions. Elsewhere `node:fs` serves
 * (`_fs_node.ts`), with flock through the FFI.
 *
 * Not `fs-native-extensions` or `os-lock`: those take fcntl/OFD locks, which
 * do not conflict with flock, so they would not exclude a Deno process,
 * `flock(1)` or Python. Only `LOCK_NB` is ever used: a blocking flock would
 * hold the event loop, or a libuv pool thread (fs-ext's known deadlock).
 *
 * The FFI is loaded on the first lock operation, not at import, so a CLI that
 * imports runlock but does not lock pays nothing for it.
 *
 * @module
 */

import {
  closeSync,
  constants as fsc,
  fstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  realpathSync,
  statSync,
  watch,
} from "node:fs";
import { hostname } from "node:os";
import process from "node:process";
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
import {
  fsLstat,
  fsOpenExisting,
  PathDir,
  scratch,
  sysError,
} from "./_fs_node.ts";
import {
  type Dir,
  type FileInfo,
  type Handle,
  type Liveness,
  type Platform,
  SysError,
} from "./types.ts";

const LOCK_SH = 1;
const LOCK_EX = 2;
const LOCK_NB = 4;
const LOCK_UN = 8;
const ENXIO = 6;

const isBun = typeof (globalThis as { Bun?: unknown }).Bun !== "undefined";

// The *at() path: libc with `at`, or null where node:fs serves. Resolved on
// the first lock operation.
let fast: Libc | null | undefined;
function ffi(): Libc | null {
  if (fast === undefined) {
    const l = libc();
    fast = l?.at ? l : null;
  }
  return fast;
}

const CREATE = fsc.O_RDWR | fsc.O_CREAT | fsc.O_EXCL | O_CLOEXEC;
// O_NONBLOCK: opening a FIFO must not hang. O_NOFOLLOW: ELOOP on a symlink.
const OPEN_EXISTING = fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK |
  O_CLOEXEC;
// A directory to pin: O_PATH on Linux (needs only search permission, reads
// nothing), else read-only.
const OPEN_DIR = (process.platform === "linux" ? O_PATH : fsc.O_RDONLY) |
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

  tryLock(exclusive: boolean): boolean {
    return flockFd(
      this.#fd,
      (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB,
      named(this.#dir, this.#name),
    );
  }

  unlock(): void {
    flockFd(this.#fd, LOCK_UN, named(this.#dir, this.#name));
  }

  write(data: Uint8Array): void {
    const l = fast!;
    let done = 0;
    while (done < data.length) {
      const n = l.write(
        this.#fd,
        done === 0 ? data : data.subarray(done),
        data.length - done,
      );
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
    return buf.slice(0, len);
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

  close(): void {
    if (this.#fd < 0) return;
    // Linux frees the descriptor (and the flock) whatever close returns.
    fast!.close(this.#fd);
    this.#fd = -1;
  }
}

/**
 * Opens the existing regular file `name` relative to `dirfd` (`dir` names
 * it in messages; AT_FDCWD and "" for a whole path), as
 * {@linkcode Platform.openExisting} promises.
 */
function openAt(dirfd: number, dir: string, name: string): Handle | "ENOENT" {
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
        `open '${named(dir, name)}': a socket`,
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

function lstatAt(dirfd: number, dir: string, name: string): FileInfo | null {
  const l = fast!;
  while (l.fstatat(dirfd, name, AT_SYMLINK_NOFOLLOW) !== 0) {
    const errno = l.errno();
    if (errno === EINTR) continue;
    if (errno === ENOENT) return null;
    throw errnoError(errno, "lstat", named(dir, name));
  }
  return statInfo();
}

let hostnameCache: string | undefined;
let identityCache: { boot: string; pidns: string } | undefined;
// Whether /proc/self/fd/N names the open directory N (Linux with /proc
// mounted). Asked once per process.
let procFd: boolean | undefined;

function procWorks(fd: number): boolean {
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
function openDirAt(l: Libc, path: string): Dir {
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

/** The Node.js and Bun platform. */
export const platform: Platform = {
  runtime: isBun ? "bun" : "node",
  pid: process.pid,
  openMayBlock: false,

  realDir(path: string): string {
    try {
      return realpathSync.native(path);
    } catch {
      return "";
    }
  },

  hostname(): string {
    hostnameCache ??= hostname().replace(/[\r\n]/g, "");
    return hostnameCache;
  },

  openExisting(path: string): Handle | "ENOENT" {
    return ffi() ? openAt(AT_FDCWD, "", path) : fsOpenExisting(path);
  },

  openDir(path: string): Dir {
    const l = ffi();
    if (l) return openDirAt(l, path);
    let fd: number;
    try {
      fd = openSync(path, OPEN_DIR);
    } catch (err) {
      throw sysError(err, "open", path);
    }
    if (procWorks(fd)) return new PathDir(`/proc/self/fd/${fd}`, fd);
    // No /proc: the canonical path, resolved once.
    try {
      return new PathDir(realpathSync.native(path), undefined);
    } catch (err) {
      throw sysError(err, "realpath", path);
    } finally {
      closeSync(fd);
    }
  },

  lstat(path: string): FileInfo | null {
    return ffi() ? lstatAt(AT_FDCWD, "", path) : fsLstat(path);
  },

  mkdirp(path: string): void {
    try {
      mkdirSync(path, { recursive: true });
    } catch (err) {
      throw sysError(err, "mkdir", path);
    }
  },

  readDir(path: string): string[] {
    try {
      return readdirSync(path);
    } catch (err) {
      throw sysError(err, "readdir", path);
    }
  },

  readDirKinds(path: string) {
    try {
      return readdirSync(path, { withFileTypes: true }).map((d) => ({
        name: d.name,
        kind: d.isFile()
          ? "file" as const
          : d.isDirectory()
          ? "directory" as const
          : d.isSymbolicLink()
          ? "symlink" as const
          : "other" as const,
      }));
    } catch (err) {
      throw sysError(err, "readdir", path);
    }
  },

  identity() {
    if (identityCache === undefined) {
      let boot = "";
      let pidns = "";
      try {
        boot = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
      } catch {
        // Not Linux, or no /proc.
      }
      try {
        pidns =
          /^pid:\[(\d+)\]$/.exec(readlinkSync("/proc/self/ns/pid"))?.[1] ??
            "";
      } catch {
        // Not Linux, or no /proc.
      }
      identityCache = { boot, pidns };
    }
    return identityCache;
  },

  unrefLater(fn: () => void, ms = 0): () => void {
    const timer = setTimeout(fn, ms);
    timer.unref();
    return () => clearTimeout(timer);
  },

  unrefInterval(fn: () => void, ms: number): () => void {
    const timer = setInterval(fn, ms);
    timer.unref();
    return () => clearInterval(timer);
  },

  processAlive(pid: number): Liveness {
    try {
      process.kill(pid, 0);
      return "alive";
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (code === "ESRCH") return "dead";
      if (code === "EPERM") return "alive";
      return "unknown";
    }
  },

  watchDir(
    dir: string,
    onChange: (name: string, moved: boolean) => void,
    _keepAlive?: boolean,
  ): (() => void) | undefined {
    try {
      const watcher = watch(dir, { persistent: false }, (event, name) => {
        if (name) onChange(String(name), event === "rename");
      });
      watcher.on("error", () => watcher.close());
      return () => watcher.close();
    } catch {
      return undefined;
    }
  },
};
