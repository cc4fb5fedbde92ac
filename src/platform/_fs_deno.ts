/**
 * The Deno platform's open files and pinned directories through Deno's own
 * ops, where libc is not to be had (`_at.ts` serves with every permission
 * on Linux): a directory pinned by its canonical path, each permission
 * checked before an op would prompt, and `..` resolved as the kernel does
 * (`_perm_deno.ts`).
 *
 * @module
 */

import { AT_FDCWD, openAt, scratch } from "./_at.ts";
import { ERRNO, errnoError, lstatLibc } from "./_libc_deno.ts";
import { at, kernelPath, need, parent, sysError } from "./_perm_deno.ts";
import type { PathCalls } from "./_path_dir.ts";
import { type FileInfo, type Handle, SysError } from "./types.ts";

/** What Deno's stat tells, as a {@linkcode FileInfo}. */
function info(s: Deno.FileInfo): FileInfo {
  return {
    dev: s.dev,
    ino: s.ino ?? 0,
    size: s.size,
    mode: (s.mode ?? 0) & 0o7777,
    uid: s.uid ?? 0,
    kind: kindOf(s),
  };
}

/** The kind of file that a `Deno.FileInfo` or `Deno.DirEntry` tells. */
export function kindOf(
  s: { isFile: boolean; isDirectory: boolean; isSymlink: boolean },
): FileInfo["kind"] {
  if (s.isFile) return "file";
  if (s.isDirectory) return "directory";
  return s.isSymlink ? "symlink" : "other";
}

/** A file opened through Deno's ops; `path` names it in messages. */
class DenoHandle implements Handle {
  #file: Deno.FsFile;
  #path: string;
  #fresh = true;

  constructor(file: Deno.FsFile, path: string) {
    this.#file = file;
    this.#path = path;
  }

  fd(): number | undefined {
    return undefined; // Deno's files have resource ids, not descriptors
  }

  tryLock(exclusive: boolean): boolean {
    try {
      return this.#file.tryLockSync(exclusive);
    } catch (err) {
      throw sysError(err, "flock", this.#path);
    }
  }

  unlock(): void {
    try {
      this.#file.unlockSync();
    } catch (err) {
      throw sysError(err, "flock", this.#path);
    }
  }

  write(data: Uint8Array): void {
    this.#fresh = false;
    try {
      let done = 0;
      while (done < data.length) {
        done += this.#file.writeSync(data.subarray(done));
      }
    } catch (err) {
      throw sysError(err, "write", this.#path);
    }
  }

  writeAt(data: Uint8Array, offset: number, path: string): void {
    // Through a second open file of the same inode: a seek of our own
    // would move the offset that every descriptor of this open file
    // shares, such as the command's fd 9 (`runlock run`), whose writes
    // would then land in the record. The name may lead to another file
    // by now: only our inode is written.
    let other: Deno.FsFile | undefined;
    try {
      other = Deno.openSync(path, { write: true });
      const ours = this.#file.statSync();
      const theirs = other.statSync();
      if (ours.dev !== theirs.dev || ours.ino !== theirs.ino) {
        throw new SysError(
          "ESTALE",
          "write",
          `write '${path}': the name leads to another file now`,
        );
      }
      other.seekSync(offset, Deno.SeekMode.Start);
      let done = 0;
      while (done < data.length) {
        done += other.writeSync(data.subarray(done));
      }
    } catch (err) {
      if (err instanceof SysError) throw err;
      throw sysError(err, "write", path);
    } finally {
      other?.close();
    }
  }

  readAll(max: number): Uint8Array {
    try {
      // A fresh descriptor is at offset 0: no seek.
      if (!this.#fresh) this.#file.seekSync(0, Deno.SeekMode.Start);
      this.#fresh = false;
      const buf = max <= scratch.length ? scratch : new Uint8Array(max);
      let len = 0;
      while (len < max) {
        const n = this.#file.readSync(buf.subarray(len, max));
        if (n === null || n === 0) break;
        len += n;
        // A regular file reads short only at its end: no second read.
        if (len < max) break;
      }
      return buf.subarray(0, len); // a view: see Handle.readAll
    } catch (err) {
      throw sysError(err, "read", this.#path);
    }
  }

  stat(): FileInfo {
    try {
      return info(this.#file.statSync());
    } catch (err) {
      throw sysError(err, "fstat", this.#path);
    }
  }

  chmod(mode: number): void {
    // Deno.FsFile has no fchmod, and chmod(2) by path follows a symlink: if
    // someone else could replace our fresh temp file with a symlink to, say,
    // /etc/shadow, we would change that file's mode. So only where nobody
    // but us (and root) can replace entries of the directory: it is ours or
    // root's, and not writable by others, or sticky (where only a file's
    // owner may rename or remove it). Elsewhere the umask's mode stays.
    try {
      const me = this.#file.statSync().uid;
      const dir = Deno.statSync(parent(this.#path));
      const dirMode = dir.mode ?? 0;
      const owner = dir.uid === me || dir.uid === 0;
      const closed = (dirMode & 0o022) === 0 || (dirMode & 0o1000) !== 0;
      if (!owner || !closed) {
        throw new SysError(
          "EUNSAFE",
          "chmod",
          `chmod '${this.#path}': others may replace files in the directory`,
        );
      }
      Deno.chmodSync(this.#path, mode);
    } catch (err) {
      throw sysError(err, "chmod", this.#path);
    }
  }

  closeFirstAtExit(): void {
    // Deno names no descriptor, and a Deno holder makes no inotify
    // instance (its watch would keep the process alive: see watchDir).
  }

  close(): void {
    try {
      this.#file.close();
    } catch {
      // Already closed: close is idempotent for callers.
    }
  }
}

/** Creates `path` (O_EXCL), mode 0644. */
export function createNew(path: string): Handle | "EEXIST" | "ENOENT" {
  const dir = parent(path);
  try {
    need("read", dir, "open");
    need("write", dir, "open");
    const file = Deno.openSync(path, {
      read: true,
      write: true,
      createNew: true,
      mode: 0o644,
    });
    return new DenoHandle(file, path);
  } catch (err) {
    if (err instanceof Deno.errors.AlreadyExists) return "EEXIST";
    if (err instanceof Deno.errors.NotFound) return "ENOENT";
    throw sysError(err, "open", path);
  }
}

/** {@linkcode Platform.openExisting}: through libc where `at()` serves. */
export function openExisting(given: string): Handle | "ENOENT" {
  const l = at();
  if (l !== null) return openAt(l, AT_FDCWD, "", given);
  const path = kernelPath(given);
  if (path === null) return "ENOENT";
  // Deno.open has neither O_NOFOLLOW nor O_NONBLOCK, so lstat first: a
  // symlink is refused without being followed, and a FIFO is never opened
  // (opening one read-only blocks until a writer comes). Then fstat the
  // descriptor: if the path was swapped between the two calls, report it
  // as gone and let the caller retry.
  need("read", parent(path), "open");
  const before = lstatChecked(path);
  if (before === null) return "ENOENT";
  if (before.kind === "symlink") {
    throw new SysError("ELOOP", "open", `open '${path}': is a symlink`);
  }
  if (before.kind !== "file") {
    throw new SysError(
      "EFTYPE",
      "open",
      `open '${path}': not a regular file`,
    );
  }
  let file: Deno.FsFile;
  try {
    file = Deno.openSync(path, { read: true });
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return "ENOENT";
    throw sysError(err, "open", path);
  }
  const handle = new DenoHandle(file, path);
  const after = handle.stat();
  if (after.dev !== before.dev || after.ino !== before.ino) {
    handle.close();
    throw new SysError("ERACE", "open", `open '${path}': replaced`);
  }
  return handle;
}

/** {@linkcode Platform.lstat}. */
export function lstat(given: string): FileInfo | null {
  const path = kernelPath(given);
  if (path === null) return null;
  need("read", parent(path), "lstat");
  return lstatChecked(path);
}

/**
 * `lstat(2)` once the read permission is checked: through libc where the
 * FFI may be used (a missing file is then no exception), else Deno's op.
 */
function lstatChecked(path: string): FileInfo | null {
  const fast = lstatLibc(path);
  if (typeof fast === "number") {
    // As Deno words the errors it does not name (sysError reads it back).
    if (ERRNO[fast] !== undefined) throw errnoError(fast, "lstat", path);
  } else if (fast !== undefined) {
    return fast;
  }
  try {
    return info(Deno.lstatSync(path));
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return null;
    throw sysError(err, "lstat", path);
  }
}

/**
 * Deno's ops for a directory pinned by its canonical path
 * ({@linkcode PathDir}): Deno has no `*at()` calls.
 */
export const denoPaths: PathCalls = {
  create: createNew,
  open: openExisting,
  lstat,
  link(from, to, dir) {
    try {
      need("write", dir, "link");
      Deno.linkSync(from, to);
      return undefined;
    } catch (err) {
      if (err instanceof Deno.errors.AlreadyExists) return "EEXIST";
      if (err instanceof Deno.errors.NotFound) return "ENOENT";
      throw sysError(err, "link", to);
    }
  },
  unlink(path, dir) {
    try {
      need("write", dir, "unlink");
      Deno.removeSync(path);
      return undefined;
    } catch (err) {
      if (err instanceof Deno.errors.NotFound) return "ENOENT";
      throw sysError(err, "unlink", path);
    }
  },
};
