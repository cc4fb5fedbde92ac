/**
 * The Node.js (and Bun) implementation of {@linkcode Platform}.
 *
 * Node has no flock, so `flock(2)` is called in libc through koffi's FFI
 * (under Bun, through the built-in `bun:ffi`).
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
  fchmodSync,
  fstatSync,
  linkSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  readSync,
  realpathSync,
  type Stats,
  statSync,
  unlinkSync,
  watch,
  writeSync,
} from "node:fs";
import { createRequire } from "node:module";
import { constants as osc, hostname } from "node:os";
import process from "node:process";
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

const ERRNO_NAMES = new Map<number, string>(
  Object.entries(osc.errno).map(([name, value]) => [value, name]),
);

type Flock = (fd: number, operation: number) => number;
let flockFn: Flock | undefined;
let readErrno: () => number = () => 0;

const LIBC: Partial<Record<NodeJS.Platform, string[]>> = {
  linux: ["libc.so.6", "libc.so"],
  darwin: ["libSystem.B.dylib", "/usr/lib/libSystem.B.dylib"],
  freebsd: ["libc.so.7"],
  openbsd: ["libc.so"],
  netbsd: ["libc.so"],
};

const isBun = typeof (globalThis as { Bun?: unknown }).Bun !== "undefined";

// Where libc keeps the calling thread's errno (bun:ffi does not report it).
const ERRNO_LOCATION: Partial<Record<NodeJS.Platform, string>> = {
  linux: "__errno_location",
  darwin: "__error",
  freebsd: "__error",
  openbsd: "__errno",
  netbsd: "__errno",
};

/** Minimal shape of `bun:ffi`, which has no types outside Bun. */
interface BunFfi {
  dlopen(
    name: string,
    symbols: Record<string, { args: string[]; returns: string }>,
  ): { symbols: Record<string, (...args: number[]) => unknown> };
  read: { i32(pointer: unknown, offset: number): number };
}

/**
 * Binds libc's flock: with bun:ffi under Bun (built in, so it also works in
 * a `bun build --compile` binary, where koffi's native addon cannot be
 * found), with koffi under Node.
 */
function bindFlock(libc: string): void {
  // Loaded lazily, with require, so that importing runlock stays cheap.
  const load = createRequire(import.meta.url);
  if (isBun) {
    const ffi = load("bun:ffi") as BunFfi;
    const where = ERRNO_LOCATION[process.platform]!;
    const { symbols } = ffi.dlopen(libc, {
      flock: { args: ["i32", "i32"], returns: "i32" },
      [where]: { args: [], returns: "ptr" },
    });
    flockFn = symbols.flock as Flock;
    readErrno = () => ffi.read.i32(symbols[where](), 0);
    return;
  }
  const koffi = load("koffi") as typeof import("koffi");
  const lib = koffi.load(libc);
  flockFn = lib.func("int flock(int fd, int operation)") as Flock;
  readErrno = () => koffi.errno();
}

function loadFlock(path: string): Flock {
  if (flockFn) return flockFn;
  const names = LIBC[process.platform];
  if (!names) {
    throw new SysError(
      "ENOSYS",
      "flock",
      `flock '${path}': runlock does not support ${process.platform}`,
    );
  }
  let lastError: unknown;
  for (const name of names) {
    try {
      bindFlock(name);
      return flockFn!;
    } catch (err) {
      lastError = err;
    }
  }
  // Not the file system's fault: the FFI module itself failed to load (a
  // missing or broken koffi install, an unsupported CPU). Say so.
  const what = isBun ? "bun:ffi" : "koffi";
  const why = lastError instanceof Error
    ? lastError.message
    : String(lastError);
  throw new SysError(
    "ENOFFI",
    "flock",
    `cannot load ${what}, which runlock uses to call flock(2) in libc ` +
      `(${names.join(", ")}): ${why}`,
    { cause: lastError },
  );
}

function sysError(err: unknown, syscall: string, path: string): SysError {
  if (err instanceof SysError) return err;
  const code = (err as { code?: unknown } | null)?.code;
  const message = err instanceof Error ? err.message : String(err);
  return new SysError(
    typeof code === "string" ? code : "EUNKNOWN",
    syscall,
    `${syscall} '${path}': ${message}`,
    { cause: err },
  );
}

function info(s: Stats): FileInfo {
  return {
    dev: s.dev,
    ino: s.ino,
    size: s.size,
    mode: s.mode & 0o7777,
    uid: s.uid,
    kind: s.isFile()
      ? "file"
      : s.isDirectory()
      ? "directory"
      : s.isSymbolicLink()
      ? "symlink"
      : "other",
  };
}

// One buffer for every read (records are at most 4 KiB): allocating and
// zeroing 4 KiB per probe showed up next to the system calls.
const scratch = new Uint8Array(4097);

class NodeHandle implements Handle {
  #fd: number | undefined;
  #path: string;

  constructor(fd: number, path: string) {
    this.#fd = fd;
    this.#path = path;
  }

  #flock(operation: number): boolean {
    const flock = loadFlock(this.#path);
    for (;;) {
      if (flock(this.#fd!, operation) === 0) return true;
      const errno = readErrno();
      if (errno === osc.errno.EINTR) continue;
      if (errno === osc.errno.EWOULDBLOCK || errno === osc.errno.EAGAIN) {
        return false;
      }
      const name = ERRNO_NAMES.get(errno) ?? `errno ${errno}`;
      throw new SysError(name, "flock", `flock '${this.#path}': ${name}`);
    }
  }

  tryLock(exclusive: boolean): boolean {
    return this.#flock((exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB);
  }

  unlock(): void {
    this.#flock(LOCK_UN);
  }

  write(data: Uint8Array): void {
    try {
      let done = 0;
      while (done < data.length) {
        done += writeSync(this.#fd!, data, done, data.length - done);
      }
    } catch (err) {
      throw sysError(err, "write", this.#path);
    }
  }

  readAll(max: number): Uint8Array {
    try {
      const buf = max <= scratch.length ? scratch : new Uint8Array(max);
      let len = 0;
      while (len < max) {
        const n = readSync(this.#fd!, buf, len, max - len, len);
        if (n === 0) break;
        len += n;
        // A regular file reads short only at its end: no second read.
        if (len < max) break;
      }
      return buf.slice(0, len);
    } catch (err) {
      throw sysError(err, "read", this.#path);
    }
  }

  stat(): FileInfo {
    try {
      return info(fstatSync(this.#fd!));
    } catch (err) {
      throw sysError(err, "fstat", this.#path);
    }
  }

  chmod(mode: number): void {
    try {
      fchmodSync(this.#fd!, mode);
    } catch (err) {
      throw sysError(err, "fchmod", this.#path);
    }
  }

  close(): void {
    if (this.#fd === undefined) return;
    const fd = this.#fd;
    this.#fd = undefined;
    try {
      closeSync(fd);
    } catch {
      // Nothing to do: the descriptor is gone either way.
    }
  }
}

// libuv opens every descriptor with O_CLOEXEC, so children never inherit
// the lock.
const CREATE = fsc.O_RDWR | fsc.O_CREAT | fsc.O_EXCL;
// O_NONBLOCK: opening a FIFO must not hang. O_NOFOLLOW: ELOOP on a symlink.
const OPEN_EXISTING = fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK;
// A directory to pin: O_PATH on Linux (needs only search permission, reads
// nothing), else read-only.
const O_PATH = process.platform === "linux" ? 0o10000000 : 0;
const OPEN_DIR = (O_PATH || fsc.O_RDONLY) | fsc.O_DIRECTORY;
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

function createNew(path: string): Handle | "EEXIST" | "ENOENT" {
  try {
    return new NodeHandle(openSync(path, CREATE, 0o644), path);
  } catch (err) {
    const code = (err as { code?: string }).code;
    if (code === "EEXIST" || code === "ENOENT") return code;
    throw sysError(err, "open", path);
  }
}

function openExisting(path: string): Handle | "ENOENT" {
  let fd: number;
  try {
    fd = openSync(path, OPEN_EXISTING);
  } catch (err) {
    const code = (err as { code?: string }).code;
    if (code === "ENOENT") return code;
    // A UNIX socket cannot be opened: ENXIO. It is not a regular file.
    if (code === "ENXIO") {
      throw new SysError("EFTYPE", "open", `open '${path}': a socket`);
    }
    throw sysError(err, "open", path);
  }
  const handle = new NodeHandle(fd, path);
  const kind = handle.stat().kind;
  if (kind !== "file") {
    handle.close();
    throw new SysError(
      "EFTYPE",
      "open",
      `open '${path}': not a regular file`,
    );
  }
  return handle;
}

function lstat(path: string): FileInfo | null {
  try {
    const s = lstatSync(path, { throwIfNoEntry: false });
    return s ? info(s) : null;
  } catch (err) {
    throw sysError(err, "lstat", path);
  }
}

/** A pinned directory; entries are named `${prefix}/${name}`. */
class NodeDir implements Dir {
  readonly prefix: string;
  readonly byDescriptor: boolean;
  #fd: number | undefined;

  constructor(prefix: string, fd: number | undefined) {
    this.prefix = prefix;
    this.byDescriptor = fd !== undefined;
    this.#fd = fd;
  }

  create(name: string): Handle | "EEXIST" | "ENOENT" {
    return createNew(`${this.prefix}/${name}`);
  }

  open(name: string): Handle | "ENOENT" {
    return openExisting(`${this.prefix}/${name}`);
  }

  link(existing: string, created: string): "EEXIST" | "ENOENT" | undefined {
    const to = `${this.prefix}/${created}`;
    try {
      linkSync(`${this.prefix}/${existing}`, to);
      return undefined;
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (code === "EEXIST" || code === "ENOENT") return code;
      throw sysError(err, "link", to);
    }
  }

  unlink(name: string): "ENOENT" | undefined {
    const path = `${this.prefix}/${name}`;
    try {
      unlinkSync(path);
      return undefined;
    } catch (err) {
      if ((err as { code?: string }).code === "ENOENT") return "ENOENT";
      throw sysError(err, "unlink", path);
    }
  }

  lstat(name: string): FileInfo | null {
    return lstat(`${this.prefix}/${name}`);
  }

  close(): void {
    if (this.#fd === undefined) return;
    const fd = this.#fd;
    this.#fd = undefined;
    try {
      closeSync(fd);
    } catch {
      // Gone either way.
    }
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
    return openExisting(path);
  },

  openDir(path: string) {
    let fd: number;
    try {
      fd = openSync(path, OPEN_DIR);
    } catch (err) {
      throw sysError(err, "open", path);
    }
    if (procWorks(fd)) return new NodeDir(`/proc/self/fd/${fd}`, fd);
    // No /proc: the canonical path, resolved once.
    try {
      return new NodeDir(realpathSync.native(path), undefined);
    } catch (err) {
      throw sysError(err, "realpath", path);
    } finally {
      closeSync(fd);
    }
  },

  lstat(path: string): FileInfo | null {
    return lstat(path);
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
