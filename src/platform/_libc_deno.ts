/**
 * libc for the Deno platform through `Deno.dlopen`, bound on first use:
 * `fstatat(2)` for a probe's lstat where reading has no scope (Deno's op
 * throws for a missing file: 11 µs, here 0.7 µs), and with every
 * permission the calls of `_at.ts` and inotify. A path that is no C
 * string, or a process without the grant, goes through Deno's ops.
 *
 * @module
 */

import { decodeStat, STAT_BYTES, STAT_VER, statIsFile } from "./_stat.ts";
import {
  agrees,
  AT_FDCWD,
  AT_SYMLINK_NOFOLLOW,
  type Libc as AtLibc,
} from "./_at.ts";
import { type FileInfo, SysError } from "./types.ts";

// Linux x86-64's values.
const O_CLOEXEC = 0o2000000;
const O_NONBLOCK = 0o4000;
const OPEN_FLAGS = {
  create: 2 | 0o100 | 0o200 | O_CLOEXEC, // O_RDWR | O_CREAT | O_EXCL
  // O_NOFOLLOW | O_NONBLOCK | O_NOCTTY
  existing: 0o400000 | O_NONBLOCK | 0o400 | O_CLOEXEC,
  dir: 0o10000000 | 0o200000 | O_CLOEXEC, // O_PATH | O_DIRECTORY
};
const F_DUPFD_CLOEXEC = 1030;
const ENOENT = 2;
const ENAMETOOLONG = 36;

/** Linux's errno names: libc's, and those Deno gives as "(os error N)". */
export const ERRNO: Record<number, string> = {
  1: "EPERM",
  2: "ENOENT",
  4: "EINTR",
  5: "EIO",
  6: "ENXIO",
  9: "EBADF",
  11: "EWOULDBLOCK",
  12: "ENOMEM",
  13: "EACCES",
  16: "EBUSY",
  17: "EEXIST",
  18: "EXDEV",
  20: "ENOTDIR",
  21: "EISDIR",
  22: "EINVAL",
  23: "ENFILE",
  24: "EMFILE",
  27: "EFBIG",
  28: "ENOSPC",
  30: "EROFS",
  31: "EMLINK",
  36: "ENAMETOOLONG",
  37: "ENOLCK",
  38: "ENOSYS",
  40: "ELOOP",
  95: "EOPNOTSUPP",
  122: "EDQUOT",
};

const statBuf = new Uint8Array(STAT_BYTES);
const statView = new DataView(statBuf.buffer);
const encoder = new TextEncoder();
const decoder = new TextDecoder();
// linkat's two names, each up to PATH_MAX (4096) and its NUL.
const nameA = new Uint8Array(4097);
const nameB = new Uint8Array(4097);
const linkBuf = new Uint8Array(4097);

/**
 * {@linkcode AtLibc} and the platform's other calls. A name that is no C
 * string fails without a call: ENAMETOOLONG, or ENOENT for a NUL.
 */
export interface Libc extends AtLibc {
  /** `kill(pid, sig)`: with 0, whether the process exists. */
  kill(pid: number, sig: number): number;
  /** `readlink(path)`, or `undefined` on failure. */
  readlink(path: string): string | undefined;
  /** `inotify_init1(IN_NONBLOCK | IN_CLOEXEC)`. */
  inotifyInit(): number;
  inotifyAddWatch(fd: number, path: string, mask: number): number;
  inotifyRmWatch(fd: number, wd: number): number;
  /** `eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)`. */
  eventfd(): number;
  read(fd: number, buf: Uint8Array): number;
  /** `poll(2)` on a thread of Deno's blocking pool, off the event loop. */
  poll(fds: Uint8Array, nfds: number, ms: number): Promise<number>;
}

/** A failed `syscall` on `path`, worded as Deno words one. */
export function errnoError(
  errno: number,
  syscall: string,
  path: string,
): SysError {
  const name = ERRNO[errno] ?? "EUNKNOWN";
  return new SysError(
    name,
    syscall,
    `${syscall} '${path}': ${name} (os error ${errno})`,
  );
}

const statInfo = (): FileInfo => decodeStat(statView);

let bound: Libc | undefined;
let tried = false;
// A call that failed before it was made (a name that is no C string).
let pending = 0;

/**
 * libc, or `undefined` without the FFI grant (asked once) or libc.so.6, or
 * where an `fstatat` of `/` reads otherwise than `Deno.lstatSync`.
 */
export function libc(): Libc | undefined {
  if (tried) return bound;
  tried = true;
  try {
    const { state, partial } = Deno.permissions.querySync({ name: "ffi" });
    if (state !== "granted" || partial) return undefined;
    const i32 = "i32";
    const { symbols: s } = Deno.dlopen(
      "libc.so.6",
      {
        // glibc 2.33 and later, musl.
        fstatat: {
          parameters: [i32, "buffer", "buffer", i32],
          result: i32,
          optional: true,
        },
        fstat: { parameters: [i32, "buffer"], result: i32, optional: true },
        // glibc before 2.33 (see STAT_VER).
        __fxstatat64: {
          parameters: [i32, i32, "buffer", "buffer", i32],
          result: i32,
          optional: true,
        },
        __fxstat64: {
          parameters: [i32, i32, "buffer"],
          result: i32,
          optional: true,
        },
        // No variadic calls in Deno's FFI: openat's mode and fcntl's third
        // argument go as fixed ones, as x86-64 SysV passes them (%al only
        // bounds the vector registers a variadic callee saves).
        openat: { parameters: [i32, "buffer", i32, i32], result: i32 },
        fcntl: { parameters: [i32, i32, i32], result: i32 },
        linkat: {
          parameters: [i32, "buffer", i32, "buffer", i32],
          result: i32,
        },
        unlinkat: { parameters: [i32, "buffer", i32], result: i32 },
        flock: { parameters: [i32, i32], result: i32 },
        // ssize_t results read as their low 32 bits: -1 stays -1, and no
        // count here reaches 2 GiB.
        pread: { parameters: [i32, "buffer", "usize", "i64"], result: i32 },
        write: { parameters: [i32, "buffer", "usize"], result: i32 },
        pwrite: { parameters: [i32, "buffer", "usize", "i64"], result: i32 },
        fchmod: { parameters: [i32, "u32"], result: i32 },
        close: { parameters: [i32], result: i32 },
        kill: { parameters: [i32, i32], result: i32 },
        readlink: {
          parameters: ["buffer", "buffer", "usize"],
          result: "isize",
        },
        inotify_init1: { parameters: [i32], result: i32 },
        inotify_add_watch: { parameters: [i32, "buffer", "u32"], result: i32 },
        inotify_rm_watch: { parameters: [i32, i32], result: i32 },
        eventfd: { parameters: ["u32", i32], result: i32 },
        read: { parameters: [i32, "buffer", "usize"], result: i32 },
        poll: {
          parameters: ["buffer", "u64", i32],
          result: i32,
          nonblocking: true,
        },
        __errno_location: { parameters: [], result: "pointer" },
      } as const,
    );
    const ver = STAT_VER;
    const xat = s.__fxstatat64;
    const xfd = s.__fxstat64;
    const at = s.fstatat ??
      (xat &&
        ((d: number, p: Uint8Array, b: Uint8Array, f: number) =>
          xat(ver, d, p, b, f)));
    const fd = s.fstat ??
      (xfd && ((n: number, b: Uint8Array) => xfd(ver, n, b)));
    const where = s.__errno_location();
    if (!at || !fd || where === null) return undefined;
    // The main thread's errno lives at one address for the thread's life
    // (a Worker loads its own copy of this module, on its own thread).
    const view = new Deno.UnsafePointerView(where);
    const errno = () => {
      if (pending === 0) return view.getInt32();
      const e = pending;
      pending = 0;
      return e;
    };
    const candidate: Libc = {
      openat(dirfd, path, flags, mode) {
        const p = cString(path, nameA);
        return p ? s.openat(dirfd, p, flags, mode) : -1;
      },
      linkat(dirfd, from, to) {
        const a = cString(from, nameA);
        const b = a && cString(to, nameB);
        return b ? s.linkat(dirfd, a, dirfd, b, 0) : -1;
      },
      unlinkat(dirfd, path) {
        const p = cString(path, nameA);
        return p ? s.unlinkat(dirfd, p, 0) : -1;
      },
      fstatat(dirfd, path, flags) {
        const p = cString(path, nameA);
        return p ? at(dirfd, p, statBuf, flags) : -1;
      },
      fstat: (n) => fd(n, statBuf),
      flock: (n, op) => s.flock(n, op),
      // Deno's FFI takes 64-bit arguments as bigints on its fast path
      // (measured: a number there takes its slow path, ~0.7 µs more).
      pread: (n, buf, count, offset) =>
        s.pread(n, buf, BigInt(count), offset === 0 ? 0n : BigInt(offset)),
      write: (n, buf, count) => s.write(n, buf, BigInt(count)),
      pwrite: (n, buf, count, offset) =>
        s.pwrite(n, buf, BigInt(count), BigInt(offset)),
      fchmod: (n, mode) => s.fchmod(n, mode),
      dupfd: (n, min) => s.fcntl(n, F_DUPFD_CLOEXEC, min),
      close: (n) => s.close(n),
      kill: (pid, sig) => s.kill(pid, sig),
      readlink(path) {
        const p = cString(path, nameA);
        if (!p) return undefined;
        const n = Number(s.readlink(p, linkBuf, BigInt(linkBuf.length)));
        if (n < 0 || n >= linkBuf.length) return undefined;
        return decoder.decode(linkBuf.subarray(0, n));
      },
      inotifyInit: () => s.inotify_init1(O_NONBLOCK | O_CLOEXEC),
      inotifyAddWatch(n, path, mask) {
        const p = cString(path, nameA);
        return p ? s.inotify_add_watch(n, p, mask) : -1;
      },
      inotifyRmWatch: (n, wd) => s.inotify_rm_watch(n, wd),
      eventfd: () => s.eventfd(0, O_NONBLOCK | O_CLOEXEC),
      read: (n, buf) => s.read(n, buf, BigInt(buf.length)),
      poll: (fds, nfds, ms) => s.poll(fds, BigInt(nfds), ms),
      errno,
      statInfo,
      statIsFile: () => statIsFile(statView),
      error: errnoError,
      flags: OPEN_FLAGS,
      doubtfulEagain: true,
      // A Deno holder has no inotify instance (see watchDir).
      renumber: false,
    };
    if (agrees(candidate, () => Deno.lstatSync("/"))) bound = candidate;
  } catch {
    // No libc.so.6 (a static or non-glibc build), or a refusal: Deno's ops.
  }
  return bound;
}

/**
 * `s` as a C string in `buf`, or `undefined` when it cannot be one (then
 * the next `errno()` is ENOENT for a NUL, ENAMETOOLONG for a long name).
 */
function cString(s: string, buf: Uint8Array): Uint8Array | undefined {
  if (s.includes("\0")) {
    pending = ENOENT;
    return undefined;
  }
  const { read, written } = encoder.encodeInto(s, buf);
  if (read !== s.length || written >= buf.length) {
    pending = ENAMETOOLONG;
    return undefined;
  }
  buf[written] = 0;
  return buf;
}

let readOk: boolean | undefined;

/** Asks the read permission again at the next `lstatLibc` (it changed). */
export function forgetReadGrant(): void {
  readOk = undefined;
}

/**
 * `lstat(2)` through libc: the struct, `null` for ENOENT, another errno,
 * or `undefined` where libc is not asked (then `Deno.lstatSync`): only
 * where reading has no scope or --deny-read, so that Deno's op would
 * refuse no path libc answers for.
 */
export function lstatLibc(path: string): FileInfo | null | number | undefined {
  if (readOk === undefined) {
    const read = Deno.permissions.querySync({ name: "read" });
    // Deno refuses reading errno through the FFI without ffi access.
    const ffi = Deno.permissions.querySync({ name: "ffi" });
    readOk = read.state === "granted" && !read.partial &&
      ffi.state === "granted";
  }
  const l = readOk ? bound ?? libc() : undefined;
  if (l === undefined || path.includes("\0")) return undefined;
  if (l.fstatat(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW) === 0) return statInfo();
  const errno = l.errno();
  return errno === ENOENT ? null : errno;
}
