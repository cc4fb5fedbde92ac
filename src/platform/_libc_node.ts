/**
 * libc for the Node.js and Bun platform through koffi or `bun:ffi`, bound
 * on the first lock operation: `flock(2)`, and the calls of `_at.ts` (see
 * there why not `node:fs`; a `/proc/self/fd/N/<name>` walk also leaves the
 * kernel's lock-free path lookup, ~2 µs a call).
 *
 * @module
 */

import { constants as osc, release } from "node:os";
import { fs, inNodeWorker, load, util } from "./_node.ts";
import { decodeStat, STAT_BYTES, STAT_VER, statIsFile } from "./_stat.ts";
import { agrees, type Libc as AtLibc } from "./_at.ts";
import { SysError } from "./types.ts";

/**
 * {@linkcode AtLibc} (all but `flock` only where `at` is true) and the
 * platform's other calls. Strings are without NUL.
 */
export interface Libc extends AtLibc {
  /** Whether the calls other than `flock` exist here (see {@linkcode libc}). */
  readonly at: boolean;
  /** `kill(pid, sig)`. */
  kill(pid: number, sig: number): number;
  /** Binds inotify's calls (Linux), or throws. Call it once. */
  inotify(): Inotify;
}

/** inotify's calls, with libc's conventions, and koffi's wait. */
export interface Inotify {
  /** `inotify_init1(IN_NONBLOCK | IN_CLOEXEC)`. */
  init(): number;
  addWatch(fd: number, path: string, mask: number): number;
  rmWatch(fd: number, wd: number): number;
  read(fd: number, buf: Uint8Array): number;
  /**
   * Under koffi (`bun:ffi` has no async calls), what waits off the event
   * loop: `eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)`, `write(2)`, and
   * `poll(2)` on a libuv pool thread, its result to `done`.
   */
  wait?: {
    eventfd(): number;
    write(fd: number, buf: Uint8Array): number;
    poll: (fds: Uint8Array, n: number, ms: number, done: Done) => void;
  };
}

type Done = (err: unknown, res: number) => void;

const O_CLOEXEC = 0o2000000;
const O_NONBLOCK = 0o4000;
const F_DUPFD_CLOEXEC = 1030;
const { constants: fsc } = fs;
/** A directory to pin: `O_PATH` needs only search permission. */
export const OPEN_DIR = 0o10000000 | fsc.O_DIRECTORY;
const OPEN_FLAGS = {
  create: fsc.O_RDWR | fsc.O_CREAT | fsc.O_EXCL | O_CLOEXEC,
  existing: fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK |
    (fsc.O_NOCTTY ?? 0) | O_CLOEXEC,
  dir: OPEN_DIR | O_CLOEXEC,
};
/**
 * Whether the kernel closes a dying process's files from the highest
 * descriptor down: Linux 4.3+ (c82199061009, "task_work: remove fifo
 * ordering guarantee"); before, from the lowest up.
 */
const LAST_IN_FIRST_OUT = (() => {
  const [major, minor] = release().split(".").map((n) => parseInt(n, 10));
  return major > 4 || (major === 4 && minor >= 3);
})();

/** The names libc goes by, in the order they are tried. */
const LIBC = ["libc.so.6", "libc.so"];

type Stat = "stat" | "xstat";

const statBuf = new Uint8Array(STAT_BYTES);
const statView = new DataView(statBuf.buffer);

const isBun = typeof (globalThis as { Bun?: unknown }).Bun !== "undefined";
const ffiName = isBun ? "bun:ffi" : "koffi";

/** Minimal shape of `bun:ffi`, which has no types outside Bun. */
interface BunFfi {
  dlopen(
    name: string,
    symbols: Record<string, { args: string[]; returns: string }>,
  ): { symbols: Record<string, (...args: unknown[]) => unknown> };
  read: { i32(pointer: unknown, offset: number): number };
  ptr(buf: Uint8Array): unknown;
}

type Fn = (...args: unknown[]) => number;

/** What every binding has, whichever calls it binds. */
const COMMON = {
  statInfo: () => decodeStat(statView),
  statIsFile: () => statIsFile(statView),
  error: errnoError,
  flags: OPEN_FLAGS,
  doubtfulEagain: false,
  renumber: LAST_IN_FIRST_OUT,
};

const NO_AT = {
  openat: () => -1,
  linkat: () => -1,
  unlinkat: () => -1,
  fstatat: () => -1,
  fstat: () => -1,
  pread: () => -1,
  write: () => -1,
  pwrite: () => -1,
  fchmod: () => -1,
  dupfd: () => -1,
  close: () => -1,
  kill: () => -1,
};

// bun:ffi takes C strings: linkat's two, each as long as PATH_MAX (4096)
// can encode to; a longer one is ENAMETOOLONG.
const encoder = new TextEncoder();
const nameA = new Uint8Array(3 * 4096 + 4);
const nameB = new Uint8Array(3 * 4096 + 4);

/** `s` as a C string in `buf`, or `undefined` when it is too long. */
function cString(s: string, buf: Uint8Array): Uint8Array | undefined {
  const { read, written } = encoder.encodeInto(s, buf);
  if (read !== s.length || written >= buf.length) return undefined;
  buf[written] = 0;
  return buf;
}

const ENAMETOOLONG = 36;
let bunErrno = 0;

function bindBun(name: string, at: Stat | false): Libc {
  const ffi = load("bun:ffi") as BunFfi;
  const where = "__errno_location"; // bun:ffi does not report errno
  const i32 = "i32";
  const { symbols: s } = ffi.dlopen(name, {
    flock: { args: [i32, i32], returns: i32 },
    [where]: { args: [], returns: "ptr" },
    ...(at
      ? {
        // openat's mode and fcntl's third argument as fixed ones: see
        // bindKoffi.
        openat: { args: [i32, "ptr", i32, i32], returns: i32 },
        linkat: { args: [i32, "ptr", i32, "ptr", i32], returns: i32 },
        unlinkat: { args: [i32, "ptr", i32], returns: i32 },
        ...(at === "stat"
          ? {
            fstatat: { args: [i32, "ptr", "ptr", i32], returns: i32 },
            fstat: { args: [i32, "ptr"], returns: i32 },
          }
          : {
            __fxstatat64: {
              args: [i32, i32, "ptr", "ptr", i32],
              returns: i32,
            },
            __fxstat64: { args: [i32, i32, "ptr"], returns: i32 },
          }),
        // ssize_t results read as their low 32 bits: -1 stays -1, and no
        // count here reaches 2 GiB.
        pread: { args: [i32, "ptr", "u64", "i64"], returns: i32 },
        write: { args: [i32, "ptr", "u64"], returns: i32 },
        pwrite: { args: [i32, "ptr", "u64", "i64"], returns: i32 },
        fchmod: { args: [i32, "u32"], returns: i32 },
        fcntl: { args: [i32, i32, i32], returns: i32 },
        close: { args: [i32], returns: i32 },
        kill: { args: [i32, i32], returns: i32 },
      }
      : {}),
  });
  // One address for the thread's life (a Worker loads its own module).
  const errnoAt = s[where]();
  const read = ffi.read;
  const errno = () => {
    if (bunErrno === 0) return read.i32(errnoAt, 0);
    const e = bunErrno;
    bunErrno = 0;
    return e;
  };
  const flock = s.flock as Fn;
  const base = {
    ...COMMON,
    flock,
    errno,
    inotify: () => bunInotify(ffi, name),
  };
  if (!at) return { at: false, ...base, ...NO_AT };
  const openat = s.openat as Fn;
  const linkat = s.linkat as Fn;
  const unlinkat = s.unlinkat as Fn;
  const xat = s.__fxstatat64 as Fn;
  const xfd = s.__fxstat64 as Fn;
  const fstatat: Fn = at === "stat"
    ? s.fstatat as Fn
    : (dirfd, p, st, flags) => xat(STAT_VER, dirfd, p, st, flags);
  const fstat: Fn = at === "stat"
    ? s.fstat as Fn
    : (fd, st) => xfd(STAT_VER, fd, st);
  // A name that is no C string fails without a call, as the kernel would.
  const tooLong = () => {
    bunErrno = ENAMETOOLONG;
    return -1;
  };
  return {
    at: true,
    ...base,
    openat(dirfd, path, flags, mode) {
      const p = cString(path, nameA);
      return p ? openat(dirfd, p, flags, mode) : tooLong();
    },
    linkat(dirfd, from, to) {
      const a = cString(from, nameA);
      const b = cString(to, nameB);
      return a && b ? linkat(dirfd, a, dirfd, b, 0) : tooLong();
    },
    unlinkat(dirfd, path) {
      const p = cString(path, nameA);
      return p ? unlinkat(dirfd, p, 0) : tooLong();
    },
    fstatat(dirfd, path, flags) {
      const p = cString(path, nameA);
      return p ? fstatat(dirfd, p, statBuf, flags) : tooLong();
    },
    fstat: (fd) => fstat(fd, statBuf),
    pread: s.pread as Fn,
    write: s.write as Fn,
    pwrite: s.pwrite as Fn,
    fchmod: s.fchmod as Fn,
    dupfd: (fd, min) => (s.fcntl as Fn)(fd, F_DUPFD_CLOEXEC, min),
    close: s.close as Fn,
    kill: s.kill as Fn,
  };
}

function bindKoffi(name: string, at: Stat | false): Libc {
  const koffi = load("koffi") as typeof import("npm:koffi@3.3.4");
  const lib = koffi.load(name);
  const flock = lib.func("int flock(int fd, int operation)") as Fn;
  const errno = () => koffi.errno();
  const base = { ...COMMON, flock, errno, inotify: () => koffiInotify(lib) };
  if (!at) return { at: false, ...base, ...NO_AT };
  // Fixed, not variadic as libc declares it: x86-64 SysV passes integer
  // arguments alike (%al only bounds the vector registers a variadic
  // callee saves), and koffi's variadic call costs ~55-70 ns more (3.3.4).
  const openat = lib.func(
    "int openat(int dirfd, str path, int flags, int mode)",
  ) as Fn;
  const linkat = lib.func(
    "int linkat(int olddirfd, str oldpath, int newdirfd, str newpath, int flags)",
  );
  const unlinkat = lib.func("int unlinkat(int dirfd, str path, int flags)");
  let fstatat: Fn;
  let fstat: Fn;
  if (at === "stat") {
    fstatat = lib.func("int fstatat(int dirfd, str path, void *st, int flags)");
    fstat = lib.func("int fstat(int fd, void *st)");
  } else {
    const xat = lib.func(
      "int __fxstatat64(int ver, int dirfd, str path, void *st, int flags)",
    );
    const xfd = lib.func("int __fxstat64(int ver, int fd, void *st)");
    fstatat = (dirfd, path, st, flags) => xat(STAT_VER, dirfd, path, st, flags);
    fstat = (fd, st) => xfd(STAT_VER, fd, st);
  }
  const fcntl = lib.func("int fcntl(int fd, int cmd, ...)");
  return {
    at: true,
    ...base,
    openat,
    dupfd: (fd, min) => fcntl(fd, F_DUPFD_CLOEXEC, "int", min),
    linkat: (dirfd, from, to) => linkat(dirfd, from, dirfd, to, 0),
    unlinkat: (dirfd, path) => unlinkat(dirfd, path, 0),
    fstatat: (dirfd, path, flags) => fstatat(dirfd, path, statBuf, flags),
    fstat: (fd) => fstat(fd, statBuf),
    pread: lib.func(
      "long pread(int fd, void *buf, size_t count, int64_t offset)",
    ) as Fn,
    write: lib.func("long write(int fd, const void *buf, size_t count)") as Fn,
    pwrite: lib.func(
      "long pwrite(int fd, const void *buf, size_t count, int64_t offset)",
    ) as Fn,
    fchmod: lib.func("int fchmod(int fd, uint32_t mode)") as Fn,
    close: lib.func("int close(int fd)") as Fn,
    kill: lib.func("int kill(int pid, int sig)") as Fn,
  };
}

// IN_NONBLOCK and EFD_NONBLOCK are O_NONBLOCK; *_CLOEXEC, O_CLOEXEC.
const IN_NONBLOCK = O_NONBLOCK;
const IN_CLOEXEC = O_CLOEXEC;

function koffiInotify(lib: { func(decl: string): unknown }): Inotify {
  const f = (decl: string) => lib.func(decl) as unknown as Fn;
  const init = f("int inotify_init1(int flags)");
  const read = f("intptr_t read(int fd, _Out_ uint8_t *buf, uintptr_t count)");
  const write = f(
    "intptr_t write(int fd, const uint8_t *buf, uintptr_t count)",
  );
  const eventfd = f("int eventfd(unsigned int initval, int flags)");
  const poll = lib.func(
    "int poll(_Inout_ uint8_t *fds, unsigned long nfds, int timeout)",
  ) as unknown as { async: (...args: [...unknown[], Done]) => void };
  return {
    init: () => init(IN_NONBLOCK | IN_CLOEXEC),
    addWatch: f(
      "int inotify_add_watch(int fd, const char *path, uint32_t mask)",
    ),
    rmWatch: f("int inotify_rm_watch(int fd, int wd)"),
    read: (fd, b) => Number(read(fd, b, b.length)),
    wait: {
      eventfd: () => eventfd(0, IN_NONBLOCK | IN_CLOEXEC),
      write: (fd, b) => write(fd, b, b.length),
      poll: (fds, nfds, ms, done) => poll.async(fds, nfds, ms, done),
    },
  };
}

function bunInotify(ffi: BunFfi, name: string): Inotify {
  const s = ffi.dlopen(name, {
    inotify_init1: { args: ["i32"], returns: "i32" },
    inotify_add_watch: { args: ["i32", "ptr", "u32"], returns: "i32" },
    inotify_rm_watch: { args: ["i32", "i32"], returns: "i32" },
    read: { args: ["i32", "ptr", "u64"], returns: "i64" },
  }).symbols;
  const enc = new TextEncoder();
  return {
    init: () => Number(s.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)),
    addWatch: (fd, path, mask) =>
      Number(s.inotify_add_watch(fd, ffi.ptr(enc.encode(path + "\0")), mask)),
    rmWatch: (fd, wd) => Number(s.inotify_rm_watch(fd, wd)),
    read: (fd, b) => Number(s.read(fd, ffi.ptr(b), b.length)),
  };
}

let loaded: Libc | undefined;
let failure: unknown;
let tried = false;

/**
 * libc, bound on first use; `undefined` when the FFI cannot load (then
 * {@linkcode noFfi} says why). `at` only where a decoded `fstatat` of `/`
 * agreed with `node:fs`'s.
 */
export function libc(): Libc | undefined {
  if (tried) return loaded;
  tried = true;
  const bind = isBun ? bindBun : bindKoffi;
  // fstatat, or glibc's older __fxstatat64, or (neither) flock alone.
  const ways: (Stat | false)[] = ["stat", "xstat", false];
  for (const name of LIBC) {
    for (const way of ways) {
      try {
        loaded = bind(name, way);
        break;
      } catch (err) {
        if (way === ways[0]) failure = err;
      }
    }
    if (loaded) break;
  }
  if (loaded?.at && !agrees(loaded, () => fs.lstatSync("/"))) {
    loaded = { ...loaded, at: false, ...NO_AT };
  }
  return loaded;
}

let fast: Libc | null | undefined;

/**
 * libc with the `*at()` calls, or `null` where `node:fs` serves: in a Node
 * worker thread, whose end closes the descriptors node:fs opened (dropping
 * their flocks), never those the FFI opened.
 */
export function ffi(): Libc | null {
  if (fast === undefined) {
    const l = inNodeWorker() ? null : libc();
    fast = l?.at ? l : null;
  }
  return fast;
}

/** A failed `syscall` on `path`, from its errno. */
export function errnoError(
  errno: number,
  syscall: string,
  path: string,
): SysError {
  // Named as os.constants.errno names them (libuv's map lacks some, such
  // as ENOLCK), worded as node:fs words them where libuv knows the errno.
  errnoNames ??= new Map(
    Object.entries(osc.errno).map(([name, value]) => [value, name]),
  );
  const name = errnoNames.get(errno) ?? `errno ${errno}`;
  const text = util.getSystemErrorMap().get(-errno)?.[1];
  return new SysError(
    name,
    syscall,
    `${syscall} '${path}': ${text ? `${name}: ${text}` : name}`,
  );
}

let errnoNames: Map<number, string> | undefined;

/** Throws why {@linkcode libc} could not load (a missing or broken koffi). */
export function noFfi(): never {
  const why = failure instanceof Error ? failure.message : String(failure);
  throw new SysError(
    "ENOFFI",
    "flock",
    `cannot load ${ffiName}, which runlock uses to call flock(2) in libc ` +
      `(${LIBC.join(", ")}): ${why}`,
    { cause: failure },
  );
}
