/**
 * The Node.js and Bun fallback through `node:fs`, where the `*at()` calls
 * are not to be had (a Node worker, a libc without them): entries named
 * `${prefix}/${name}`; flock still through the FFI.
 *
 * @module
 */

import type { Dirent, Stats } from "node:fs";
import { fs } from "./_node.ts";
import { libc, noFfi } from "./_libc_node.ts";
import { flock, scratch } from "./_at.ts";
import type { PathCalls } from "./_path_dir.ts";
import { type FileInfo, type Handle, SysError } from "./types.ts";

const {
  closeSync,
  constants: fsc,
  fchmodSync,
  fstatSync,
  linkSync,
  lstatSync,
  openSync,
  readSync,
  unlinkSync,
  writeSync,
} = fs;

/** A `node:fs` error as a {@linkcode SysError}. */
export function sysError(
  err: unknown,
  syscall: string,
  path: string,
): SysError {
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
    kind: kindOf(s),
  };
}

/** The kind of file that a `Stats` or `Dirent` tells. */
export function kindOf(s: Stats | Dirent): FileInfo["kind"] {
  if (s.isFile()) return "file";
  if (s.isDirectory()) return "directory";
  return s.isSymbolicLink() ? "symlink" : "other";
}

class FsHandle implements Handle {
  #fd: number | undefined;
  #path: string;

  constructor(fd: number, path: string) {
    this.#fd = fd;
    this.#path = path;
  }

  fd(): number | undefined {
    return this.#fd;
  }

  tryLock(exclusive: boolean): boolean {
    return flock(libc() ?? noFfi(), this.#fd!, exclusive, "", this.#path);
  }

  unlock(): void {
    flock(libc() ?? noFfi(), this.#fd!, null, "", this.#path);
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

  writeAt(data: Uint8Array, offset: number): void {
    try {
      let done = 0;
      while (done < data.length) {
        done += writeSync(
          this.#fd!,
          data,
          done,
          data.length - done,
          offset + done,
        );
      }
    } catch (err) {
      throw sysError(err, "write", this.#path);
    }
  }

  readAll(max: number): Uint8Array {
    try {
      const buf = max <= scratch.length ? scratch : new Uint8Array(max);
      // One read: a regular file reads short only at its end.
      return buf.subarray(0, readSync(this.#fd!, buf, 0, max, 0));
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

  closeFirstAtExit(): void {
    // node:fs has no F_DUPFD.
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

// libuv adds O_CLOEXEC. The flags are Libc.flags' (see there).
const CREATE = fsc.O_RDWR | fsc.O_CREAT | fsc.O_EXCL;
const OPEN_EXISTING = fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK |
  (fsc.O_NOCTTY ?? 0);

function createNew(path: string): Handle | "EEXIST" | "ENOENT" {
  try {
    return new FsHandle(openSync(path, CREATE, 0o644), path);
  } catch (err) {
    const code = (err as { code?: string }).code;
    if (code === "EEXIST" || code === "ENOENT") return code;
    throw sysError(err, "open", path);
  }
}

/** {@linkcode Platform.openExisting} through `node:fs`. */
export function fsOpenExisting(path: string): Handle | "ENOENT" {
  let fd: number;
  try {
    fd = openSync(path, OPEN_EXISTING);
  } catch (err) {
    const code = (err as { code?: string }).code;
    if (code === "ENOENT") return code;
    if (code === "ENXIO") { // a UNIX socket
      throw new SysError(
        "EFTYPE",
        "open",
        `open '${path}': a socket, or a device without a driver`,
      );
    }
    throw sysError(err, "open", path);
  }
  const handle = new FsHandle(fd, path);
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

/** {@linkcode Platform.lstat} through `node:fs`. */
export function fsLstat(path: string): FileInfo | null {
  try {
    const s = lstatSync(path, { throwIfNoEntry: false });
    return s ? info(s) : null;
  } catch (err) {
    throw sysError(err, "lstat", path);
  }
}

/** `node:fs` for a directory pinned by a path ({@linkcode PathDir}). */
export const nodePaths: PathCalls = {
  create: createNew,
  open: fsOpenExisting,
  lstat: fsLstat,
  link(from, to) {
    try {
      linkSync(from, to);
      return undefined;
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (code === "EEXIST" || code === "ENOENT") return code;
      throw sysError(err, "link", to);
    }
  },
  unlink(path) {
    try {
      unlinkSync(path);
      return undefined;
    } catch (err) {
      if ((err as { code?: string }).code === "ENOENT") return "ENOENT";
      throw sysError(err, "unlink", path);
    }
  },
  close(fd) {
    try {
      closeSync(fd);
    } catch {
      // Gone either way.
    }
  },
};
