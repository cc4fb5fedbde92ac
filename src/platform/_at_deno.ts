/**
 * The Deno platform's pinned directories and open files through libc
 * (`_libc_deno.ts`), where every permission is granted (`-A`) on Linux
 * x86-64 and arm64: every entry named relative to the directory's
 * descriptor with the `*at()` calls, every file call on the file's
 * descriptor, and the answers the protocol expects (ENOENT, EEXIST,
 * EWOULDBLOCK) returned as values.
 *
 * Why: Deno's ops have no `*at()` calls, so a directory could be pinned
 * only by its canonical path; no `O_NOFOLLOW` and no `O_NONBLOCK`, so a
 * safe open took an lstat before it and an fstat after; and each expected
 * ENOENT or EEXIST threw. An acquire and release made 14 system calls
 * against the C floor's 9 (issue 17).
 *
 * Only with every permission: then Deno's own ops would refuse no path
 * that libc is asked about, and resolve `..` as the kernel does.
 *
 * @module
 */

import {
  AT_FDCWD,
  AT_SYMLINK_NOFOLLOW,
  ERRNO,
  type Libc,
  O_CLOEXEC,
  O_CREAT,
  O_DIRECTORY,
  O_EXCL,
  O_NOCTTY,
  O_NOFOLLOW,
  O_NONBLOCK,
  O_PATH,
  O_RDWR,
  statFile,
  statInfo,
} from "./_libc_deno.ts";
import { linkedDir } from "./_proc.ts";
import { type Dir, type FileInfo, type Handle, SysError } from "./types.ts";

const LOCK_SH = 1;
const LOCK_EX = 2;
const LOCK_NB = 4;
const LOCK_UN = 8;
const ENOENT = 2;
const EINTR = 4;
const ENXIO = 6;
const EAGAIN = 11;
const EEXIST = 17;

const CREATE = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
// O_NONBLOCK: opening a FIFO must not hang. O_NOFOLLOW: ELOOP on a symlink.
// O_NOCTTY: a terminal put at the path never becomes the controlling
// terminal of a process without one (a daemon that leads its session).
const OPEN_EXISTING = O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
// O_PATH needs only search permission on the directory and reads nothing.
const OPEN_DIR = O_PATH | O_DIRECTORY | O_CLOEXEC;

/** How often a call that failed with EAGAIN is made again (see again()). */
const DOUBTFUL_TRIES = 3;

/**
 * Whether a call that failed with `errno` is to be made again, the
 * `tries`th time: EINTR always; EAGAIN a few times. None of the calls made
 * here fails with EAGAIN on a regular file or a directory, but under a
 * flood of signals Deno's signal handler can leave EAGAIN in errno between
 * the failed call and the read of errno (its write to a full pipe fails):
 * made again, the call reports its own errno. A failed call changed
 * nothing, so making it again is safe.
 */
function again(errno: number, tries: number): boolean {
  return errno === EINTR || (errno === EAGAIN && tries < DOUBTFUL_TRIES);
}

/** The error for a failed `syscall` on `path`, worded as Deno words one. */
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

/**
 * Where a file is, for messages: a directory's path ("" when the name is a
 * whole path), or the pinned directory, whose path is found only if a
 * message needs it.
 */
type Where = string | { readonly prefix: string };

/** `dir/name` for messages, or `name` when it is a whole path. */
const named = (dir: Where, name: string) => {
  const path = typeof dir === "string" ? dir : dir.prefix;
  return path === "" ? name : `${path}/${name}`;
};

// One buffer for every read (records are at most 4 KiB).
const scratch = new Uint8Array(4097);

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

  #flock(operation: number): boolean {
    const l = this.#l;
    for (;;) {
      if (l.flock(this.#fd, operation) === 0) return true;
      const errno = l.errno();
      if (errno === EINTR) continue;
      if (errno === EAGAIN) return false;
      throw errnoError(errno, "flock", named(this.#dir, this.#name));
    }
  }

  fd(): number | undefined {
    return this.#fd >= 0 ? this.#fd : undefined;
  }

  tryLock(exclusive: boolean): boolean {
    return this.#flock((exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB);
  }

  unlock(): void {
    this.#flock(LOCK_UN);
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
      const errno = n < 0 ? l.errno() : 5; // no progress: EIO
      if (again(errno, ++tries)) continue;
      throw errnoError(errno, "write", named(this.#dir, this.#name));
    }
  }

  readAll(max: number): Uint8Array {
    const l = this.#l;
    const buf = max <= scratch.length ? scratch : new Uint8Array(max);
    let len = 0;
    let tries = 0;
    while (len < max) {
      const n = l.pread(
        this.#fd,
        len === 0 ? buf : buf.subarray(len),
        max - len,
        len,
      );
      if (n < 0) {
        const errno = l.errno();
        if (again(errno, ++tries)) continue;
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
    const l = this.#l;
    let tries = 0;
    while (l.fstat(this.#fd) !== 0) {
      const errno = l.errno();
      if (!again(errno, ++tries)) {
        throw errnoError(errno, "fstat", named(this.#dir, this.#name));
      }
    }
    return statInfo();
  }

  chmod(mode: number): void {
    const l = this.#l;
    let tries = 0;
    while (l.fchmod(this.#fd, mode) !== 0) {
      const errno = l.errno();
      if (!again(errno, ++tries)) {
        throw errnoError(errno, "fchmod", named(this.#dir, this.#name));
      }
    }
  }

  closeFirstAtExit(): void {
    // A Deno holder makes no inotify instance (its watch would keep the
    // process alive: see the platform's watchDir), so there is nothing for
    // the lock's descriptor to come before.
  }

  close(): void {
    if (this.#fd < 0) return;
    // Linux frees the descriptor (and the flock) whatever close returns.
    this.#l.close(this.#fd);
    this.#fd = -1;
  }
}

/**
 * Opens the existing regular file `name` relative to `dirfd` (`dir` names
 * it in messages; AT_FDCWD and "" for a whole path), as
 * {@linkcode Platform.openExisting} promises.
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
    fd = l.openat(dirfd, name, OPEN_EXISTING, 0);
    if (fd >= 0) break;
    const errno = l.errno();
    if (again(errno, ++tries)) continue;
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
  tries = 0;
  while (l.fstat(fd) !== 0) {
    const errno = l.errno();
    if (again(errno, ++tries)) continue;
    l.close(fd);
    throw errnoError(errno, "fstat", named(dir, name));
  }
  if (!statFile()) {
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
    if (again(errno, ++tries)) continue;
    if (errno === ENOENT) return null;
    throw errnoError(errno, "lstat", named(dir, name));
  }
  return statInfo();
}

/**
 * A directory pinned by its descriptor: every entry is named relative to
 * it. `prefix`, its canonical path, names it for watches and messages
 * (Deno's watches are counted by path, so one directory must always be
 * named alike: not `/proc/self/fd/N`, which differs per lock). It is found
 * when first asked for, which an acquire and release never do: from the
 * descriptor (`/proc/self/fd/N`, one readlink), or by `realpath` of the
 * path given where /proc cannot tell (not mounted, the directory removed,
 * the descriptor closed), or the path as given where neither can.
 */
class FdDir implements Dir {
  readonly byDescriptor = true;
  #l: Libc;
  // -1 once closed: a later call fails EBADF, never lands elsewhere.
  #fd: number;
  #given: string;
  #realpath: (path: string) => string;
  #prefix: string | undefined;

  constructor(
    l: Libc,
    fd: number,
    given: string,
    realpath: (path: string) => string,
  ) {
    this.#l = l;
    this.#fd = fd;
    this.#given = given;
    this.#realpath = realpath;
  }

  get prefix(): string {
    if (this.#prefix === undefined) {
      const real = this.#fd < 0
        ? undefined
        : this.#l.readlink(`/proc/self/fd/${this.#fd}`);
      // The kernel's name of the directory, unless it was removed (then
      // " (deleted)" ends it; a live one may end so too, and is named the
      // other way: the lock checks that a name names its directory).
      const dir = linkedDir(real ?? "");
      if (dir !== "") {
        this.#prefix = dir;
      } else {
        // Never an error of its own: a message about another failure may be
        // what asks (then, with the directory gone, the path as given).
        try {
          this.#prefix = this.#realpath(this.#given);
        } catch {
          return this.#given;
        }
      }
    }
    return this.#prefix;
  }

  create(name: string): Handle | "EEXIST" | "ENOENT" {
    const l = this.#l;
    let tries = 0;
    for (;;) {
      const fd = l.openat(this.#fd, name, CREATE, 0o644);
      if (fd >= 0) return new FdHandle(l, fd, this, name);
      const errno = l.errno();
      if (again(errno, ++tries)) continue;
      if (errno === EEXIST) return "EEXIST";
      if (errno === ENOENT) return "ENOENT";
      throw errnoError(errno, "open", named(this, name));
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
      if (again(errno, ++tries)) continue;
      if (errno === EEXIST) return "EEXIST";
      if (errno === ENOENT) return "ENOENT";
      throw errnoError(errno, "link", named(this, created));
    }
    return undefined;
  }

  unlink(name: string): "ENOENT" | undefined {
    const l = this.#l;
    let tries = 0;
    while (l.unlinkat(this.#fd, name) !== 0) {
      const errno = l.errno();
      if (again(errno, ++tries)) continue;
      if (errno === ENOENT) return "ENOENT";
      throw errnoError(errno, "unlink", named(this, name));
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

/**
 * Pins `path` by an `O_PATH` descriptor (see `FdDir` for its `prefix`,
 * which `realpath` finds where /proc cannot).
 */
export function openDirAt(
  l: Libc,
  path: string,
  realpath: (path: string) => string,
): Dir {
  let tries = 0;
  for (;;) {
    const fd = l.openat(AT_FDCWD, path, OPEN_DIR, 0);
    if (fd >= 0) return new FdDir(l, fd, path, realpath);
    const errno = l.errno();
    if (!again(errno, ++tries)) throw errnoError(errno, "open", path);
  }
}
