/**
 * Pinned directories and open files through libc, for each runtime's
 * binding (a {@linkcode Libc}): entries named relative to the directory's
 * descriptor, and ENOENT, EEXIST and EWOULDBLOCK returned as values. Why:
 * neither Deno's ops nor `node:fs` have `*at()` calls, Deno's have no
 * `O_NOFOLLOW` or `O_NONBLOCK`, and both throw for each ENOENT and EEXIST
 * the protocol expects.
 *
 * @module
 */

import { type Dir, type FileInfo, type Handle, SysError } from "./types.ts";

/**
 * One runtime's binding of libc, with libc's conventions (a negative result
 * on failure; then {@linkcode Libc.errno} tells why).
 */
export interface Libc {
  openat(dirfd: number, path: string, flags: number, mode: number): number;
  linkat(dirfd: number, from: string, to: string): number;
  unlinkat(dirfd: number, path: string): number;
  /** `fstatat(dirfd, path, &st, flags)`; {@linkcode Libc.statInfo} decodes it. */
  fstatat(dirfd: number, path: string, flags: number): number;
  /** `fstat(fd, &st)`; {@linkcode Libc.statInfo} decodes it. */
  fstat(fd: number): number;
  flock(fd: number, operation: number): number;
  pread(fd: number, buf: Uint8Array, count: number, offset: number): number;
  write(fd: number, buf: Uint8Array, count: number): number;
  pwrite(fd: number, buf: Uint8Array, count: number, offset: number): number;
  fchmod(fd: number, mode: number): number;
  /** `fcntl(fd, F_DUPFD_CLOEXEC, min)`. */
  dupfd(fd: number, min: number): number;
  close(fd: number): number;
  /** The calling thread's errno, as the last call left it. */
  errno(): number;
  /** The last successful `fstatat`/`fstat`, decoded. */
  statInfo(): FileInfo;
  /** Whether the last successful `fstatat`/`fstat` found a regular file. */
  statIsFile(): boolean;
  /** A failed `syscall` on `path`, worded as the runtime words one. */
  error(errno: number, syscall: string, path: string): SysError;
  /**
   * `open(2)` flags: `create` (`O_RDWR|O_CREAT|O_EXCL|O_CLOEXEC`),
   * `existing` (`O_RDONLY|O_NOFOLLOW|O_NONBLOCK|O_NOCTTY|O_CLOEXEC`: ELOOP
   * on a symlink; a FIFO's open must not hang; a terminal there never
   * becomes a daemon's controlling terminal), `dir`
   * (`O_PATH|O_DIRECTORY|O_CLOEXEC`: needs only search permission).
   */
  readonly flags: { create: number; existing: number; dir: number };
  /**
   * Whether errno may read EAGAIN after a call that failed otherwise: under
   * a flood of signals, Deno's handler's write to a full pipe can leave it
   * there before errno is read. Such a call is made again (see `again`).
   */
  readonly doubtfulEagain: boolean;
  /**
   * Whether {@linkcode Handle.closeFirstAtExit} renumbers: where the kernel
   * closes from the highest descriptor down and a holder may use inotify.
   */
  readonly renumber: boolean;
}

const LOCK_SH = 1;
const LOCK_EX = 2;
const LOCK_NB = 4;
const LOCK_UN = 8;
const ENOENT = 2;
const EINTR = 4;
const EIO = 5;
const ENXIO = 6;
const EAGAIN = 11; // EWOULDBLOCK too
const EEXIST = 17;
const EINVAL = 22;
export const AT_FDCWD = -100;
export const AT_SYMLINK_NOFOLLOW = 0x100;

/** How often a call that failed with a doubtful EAGAIN is made again. */
const DOUBTFUL_TRIES = 3;

/**
 * Whether a failed call (which changed nothing) is made again, the
 * `tries`th time: EINTR always; a doubtful EAGAIN a few times (no call here
 * fails with EAGAIN on a regular file or a directory).
 */
function again(l: Libc, errno: number, tries: number): boolean {
  return errno === EINTR ||
    (errno === EAGAIN && l.doubtfulEagain && tries < DOUBTFUL_TRIES);
}

/** For messages: a directory's path ("" for a whole path), or a Dir. */
type Where = string | { readonly prefix: string };

/** `dir/name` for messages, or `name` when it is a whole path. */
const named = (dir: Where, name: string) => {
  const path = typeof dir === "string" ? dir : dir.prefix;
  return path === "" ? name : `${path}/${name}`;
};

/** One buffer for every read of every runtime (records are at most 4 KiB). */
export const scratch = new Uint8Array(4097);

/**
 * `flock(fd, LOCK_NB | (exclusive ? LOCK_EX : LOCK_SH))`, or `LOCK_UN` for
 * `null`: `false` when it would block. `dir`/`name` are for messages.
 */
export function flock(
  l: Libc,
  fd: number,
  exclusive: boolean | null,
  dir: Where,
  name: string,
): boolean {
  const op = exclusive === null
    ? LOCK_UN
    : (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB;
  for (;;) {
    if (l.flock(fd, op) === 0) return true;
    const errno = l.errno();
    if (errno === EINTR) continue;
    if (errno === EAGAIN) return false;
    throw l.error(errno, "flock", named(dir, name));
  }
}

/** An open regular file; `dir` and `name` are only for messages. */
class FdHandle implements Handle {
  #l: Libc;
  #fd: number;
  #dir: Where;
  #name: string;

  constructor(l: Libc, fd: number, dir: Where, name: string) {
    this.#l = l;
    this.#fd = fd;
    this.#dir = dir;
    this.#name = name;
  }

  #fail(errno: number, syscall: string): SysError {
    return this.#l.error(errno, syscall, named(this.#dir, this.#name));
  }

  fd(): number | undefined {
    return this.#fd >= 0 ? this.#fd : undefined;
  }

  tryLock(exclusive: boolean): boolean {
    return flock(this.#l, this.#fd, exclusive, this.#dir, this.#name);
  }

  unlock(): void {
    flock(this.#l, this.#fd, null, this.#dir, this.#name);
  }

  write(data: Uint8Array): void {
    this.#writeAll(data, -1);
  }

  writeAt(data: Uint8Array, offset: number): void {
    this.#writeAll(data, offset);
  }

  /** All of `data`: at the file's offset (`write`), or at `at` (`pwrite`). */
  #writeAll(data: Uint8Array, at: number): void {
    const l = this.#l;
    let done = 0;
    let tries = 0;
    while (done < data.length) {
      const rest = done === 0 ? data : data.subarray(done);
      const n = at < 0
        ? l.write(this.#fd, rest, data.length - done)
        : l.pwrite(this.#fd, rest, data.length - done, at + done);
      if (n > 0) {
        done += n;
        continue;
      }
      const errno = n < 0 ? l.errno() : EIO; // no progress
      if (again(l, errno, ++tries)) continue;
      throw this.#fail(errno, "write");
    }
  }

  readAll(max: number): Uint8Array {
    const l = this.#l;
    const buf = max <= scratch.length ? scratch : new Uint8Array(max);
    let tries = 0;
    for (;;) {
      // One read: a regular file reads short only at its end.
      const n = l.pread(this.#fd, buf, max, 0);
      if (n >= 0) return buf.subarray(0, n); // a view: see Handle.readAll
      const errno = l.errno();
      if (!again(l, errno, ++tries)) throw this.#fail(errno, "read");
    }
  }

  stat(): FileInfo {
    const l = this.#l;
    let tries = 0;
    while (l.fstat(this.#fd) !== 0) {
      const errno = l.errno();
      if (!again(l, errno, ++tries)) throw this.#fail(errno, "fstat");
    }
    return l.statInfo();
  }

  chmod(mode: number): void {
    const l = this.#l;
    let tries = 0;
    while (l.fchmod(this.#fd, mode) !== 0) {
      const errno = l.errno();
      if (!again(l, errno, ++tries)) throw this.#fail(errno, "fchmod");
    }
  }

  closeFirstAtExit(): void {
    const l = this.#l;
    if (!l.renumber || this.#fd < 0) return;
    // 256 and up where 1024 is over the limit (EINVAL); EMFILE keeps it.
    for (const min of [1024, 256]) {
      if (this.#fd >= min) return;
      const high = l.dupfd(this.#fd, min);
      if (high >= 0) {
        // `high` keeps the open file (and its flock): no close is seen.
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
    this.#l.close(this.#fd);
    this.#fd = -1;
  }
}

/**
 * {@linkcode Platform.openExisting} of `name` relative to `dirfd`
 * ({@linkcode AT_FDCWD} and `dir` "" for a whole path).
 */
export function openAt(
  l: Libc,
  dirfd: number,
  dir: Where,
  name: string,
): Handle | "ENOENT" {
  let fd: number;
  let tries = 0;
  for (;;) {
    fd = l.openat(dirfd, name, l.flags.existing, 0);
    if (fd >= 0) break;
    const errno = l.errno();
    if (again(l, errno, ++tries)) continue;
    if (errno === ENOENT) return "ENOENT";
    if (errno === ENXIO) { // a UNIX socket
      throw new SysError(
        "EFTYPE",
        "open",
        `open '${named(dir, name)}': a socket, or a device without a driver`,
      );
    }
    throw l.error(errno, "open", named(dir, name));
  }
  tries = 0;
  while (l.fstat(fd) !== 0) {
    const errno = l.errno();
    if (again(l, errno, ++tries)) continue;
    l.close(fd);
    throw l.error(errno, "fstat", named(dir, name));
  }
  if (!l.statIsFile()) {
    l.close(fd);
    throw new SysError(
      "EFTYPE",
      "open",
      `open '${named(dir, name)}': not a regular file`,
    );
  }
  return new FdHandle(l, fd, dir, name);
}

/** `lstat` of `name` relative to `dirfd`, or `null` when it is missing. */
export function lstatAt(
  l: Libc,
  dirfd: number,
  dir: Where,
  name: string,
): FileInfo | null {
  let tries = 0;
  while (l.fstatat(dirfd, name, AT_SYMLINK_NOFOLLOW) !== 0) {
    const errno = l.errno();
    if (again(l, errno, ++tries)) continue;
    if (errno === ENOENT) return null;
    throw l.error(errno, "lstat", named(dir, name));
  }
  return l.statInfo();
}

/** Whether `l`'s decoded `fstatat` of `/` reads as the runtime's lstat. */
export function agrees(
  l: Libc,
  theirs: () => {
    dev: number;
    ino: number | null;
    mode: number | null;
    uid: number | null;
    size: number;
  },
): boolean {
  try {
    if (l.fstatat(AT_FDCWD, "/", AT_SYMLINK_NOFOLLOW) !== 0) return false;
    const ours = l.statInfo();
    const t = theirs();
    return ours.dev === t.dev && ours.ino === t.ino &&
      ours.kind === "directory" && ours.mode === ((t.mode ?? 0) & 0o7777) &&
      ours.uid === t.uid && ours.size === t.size;
  } catch {
    return false;
  }
}

/** Opens the directory `path` to pin it; its descriptor. */
export function pinDir(l: Libc, path: string): number {
  let tries = 0;
  for (;;) {
    const fd = l.openat(AT_FDCWD, path, l.flags.dir, 0);
    if (fd >= 0) return fd;
    const errno = l.errno();
    if (!again(l, errno, ++tries)) throw l.error(errno, "open", path);
  }
}

/**
 * A directory pinned by its descriptor ({@linkcode pinDir}). `prefix` is
 * given, or found on first use by a function of the descriptor (-1 once
 * closed; `undefined`: the path as given).
 */
export class FdDir implements Dir {
  readonly byDescriptor = true;
  #l: Libc;
  // -1 once closed: a later call fails EBADF, never lands elsewhere.
  #fd: number;
  #given: string;
  #prefix: string | ((fd: number) => string | undefined);

  constructor(
    l: Libc,
    fd: number,
    given: string,
    prefix: string | ((fd: number) => string | undefined),
  ) {
    this.#l = l;
    this.#fd = fd;
    this.#given = given;
    this.#prefix = prefix;
  }

  get prefix(): string {
    if (typeof this.#prefix === "string") return this.#prefix;
    const found = this.#prefix(this.#fd);
    if (found === undefined) return this.#given;
    return this.#prefix = found;
  }

  create(name: string): Handle | "EEXIST" | "ENOENT" {
    const l = this.#l;
    let tries = 0;
    for (;;) {
      const fd = l.openat(this.#fd, name, l.flags.create, 0o644);
      if (fd >= 0) return new FdHandle(l, fd, this, name);
      const errno = l.errno();
      if (again(l, errno, ++tries)) continue;
      if (errno === EEXIST) return "EEXIST";
      if (errno === ENOENT) return "ENOENT";
      throw l.error(errno, "open", named(this, name));
    }
  }

  open(name: string): Handle | "ENOENT" {
    return openAt(this.#l, this.#fd, this, name);
  }

  link(existing: string, created: string): "EEXIST" | "ENOENT" | undefined {
    const l = this.#l;
    let tries = 0;
    while (l.linkat(this.#fd, existing, created) !== 0) {
      const errno = l.errno();
      if (again(l, errno, ++tries)) continue;
      if (errno === EEXIST) return "EEXIST";
      if (errno === ENOENT) return "ENOENT";
      throw l.error(errno, "link", named(this, created));
    }
    return undefined;
  }

  unlink(name: string): "ENOENT" | undefined {
    const l = this.#l;
    let tries = 0;
    while (l.unlinkat(this.#fd, name) !== 0) {
      const errno = l.errno();
      if (again(l, errno, ++tries)) continue;
      if (errno === ENOENT) return "ENOENT";
      throw l.error(errno, "unlink", named(this, name));
    }
    return undefined;
  }

  lstat(name: string): FileInfo | null {
    return lstatAt(this.#l, this.#fd, this, name);
  }

  close(): void {
    if (this.#fd < 0) return;
    this.#l.close(this.#fd);
    this.#fd = -1;
  }
}
