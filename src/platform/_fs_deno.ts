/**
 * The Deno platform's files and directories through Deno's ops, where
 * libc is not to be had: a directory pinned by its canonical path, each
 * permission checked before an op would prompt (`_perm_deno.ts`).
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
    return undefined; // a resource id, not a descriptor
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
    // A second open file: a seek would move the offset this one shares
    // with the command's fd 9 (`runlock run`), whose writes would land in
    // the record.
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
      // One read: a regular file reads short only at its end.
      return buf.subarray(0, this.#file.readSync(buf.subarray(0, max)) ?? 0);
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
    // No fchmod, and chmod(2) follows a symlink another user could swap
    // in: only where the directory is ours or root's, and not writable by
    // others or sticky. Elsewhere the umask's mode stays.
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
    // No descriptor, and no inotify instance (see watchDir).
  }

  close(): void {
    try {
      this.#file.close();
    } catch {
      // Already closed.
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
  // No O_NOFOLLOW or O_NONBLOCK: lstat first (a FIFO's open blocks until
  // a writer comes), then fstat: a swap between the two is ERACE.
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

/** `lstat(2)` once the read permission is checked: libc, else Deno's op. */
function lstatChecked(path: string): FileInfo | null {
  const fast = lstatLibc(path);
  if (typeof fast === "number") {
    // Worded as Deno words the errors it does not name.
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

/** Deno's ops for a directory pinned by its canonical path. */
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
