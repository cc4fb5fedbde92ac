/**
 * The errors of failed system calls: each becomes one of runlock's typed
 * errors, with what to grant or fix.
 *
 * @module
 */

import {
  InvalidLockFileError,
  LockPermissionError,
  RunlockError,
  UnsupportedFilesystemError,
} from "../errors.ts";
import { platform as p } from "../platform/current.ts";
import { type FileInfo, SysError } from "../platform/types.ts";
import { dirOf, errnoOf, type LockPath } from "./_protocol.ts";

const LINK_UNSUPPORTED = new Set(["EPERM", "ENOTSUP", "EOPNOTSUPP", "ENOSYS"]);
const LOCK_UNSUPPORTED = new Set([
  "ENOLCK",
  "ENOTSUP",
  "EOPNOTSUPP",
  "ENOSYS",
  "EINVAL",
]);

// What probes do: they need read access only.
const PROBE_ACTIONS = new Set([
  "cannot read the lock file",
  "cannot list the directory",
]);

/**
 * What Deno's NOTCAPABLE `err` on `dir` asks to grant: `real`, the resolved
 * directory, and `read`, which names `dir` too (resolving a symlink needs it).
 */
export function grants(
  err: SysError,
  dir: string,
): { read: string; real: string } {
  const real = err.grant?.replace(/^--allow-\w+=/, "") ?? dir;
  return { read: real === dir ? dir : `${dir},${real}`, real };
}

/**
 * Maps a failed system call to a typed error. `where`: the directory the call
 * needed, when not the path's own.
 */
export function mapError(
  err: unknown,
  path: string,
  action: string,
  where?: string,
): Error {
  if (err instanceof RunlockError) return err;
  const failed = (what: unknown) =>
    new RunlockError(path, `${path}: ${action}: ${what}`, { cause: err });
  const denied = (hint: string) =>
    new LockPermissionError(path, action, hint, { cause: err });
  if (!(err instanceof SysError)) return failed(err);
  const dir = where ?? dirOf(path);
  const { code, syscall } = err;
  if (code === "NOTCAPABLE") {
    const { read, real } = grants(err, dir);
    const grant = PROBE_ACTIONS.has(action)
      ? `--allow-read=${read}`
      : `--allow-read=${read} --allow-write=${real}`;
    return denied(`run Deno with ${grant} (runlock never prompts)`);
  }
  if (syscall === "link" && LINK_UNSUPPORTED.has(code)) {
    return new UnsupportedFilesystemError(path, "hard links", { cause: err });
  }
  if (syscall === "flock" && LOCK_UNSUPPORTED.has(code)) {
    return new UnsupportedFilesystemError(path, "flock", { cause: err });
  }
  if (code === "EACCES" || code === "EPERM") {
    return denied(`this user needs read and write access to ${dir}`);
  }
  if (code === "EROFS") return denied(`${dir} is on a read-only filesystem`);
  if (code === "ENOTDIR") {
    return failed("a parent of the path is not a directory");
  }
  if (code === "ENAMETOOLONG") {
    return failed(
      "the name or the path is longer than the filesystem allows",
    );
  }
  return failed(err.message);
}

/** The error for a lock file this user may not open: its mode, or its directory's. */
export function unreadable(err: SysError, lp: LockPath, file: string): Error {
  let info: FileInfo | null = null;
  try {
    info = p.lstat(file);
  } catch (lstatErr) {
    if (errnoOf(lstatErr) === "EACCES") {
      return new LockPermissionError(
        lp.path,
        "cannot read the lock file",
        `this user cannot enter ${lp.dir} (probes need search (x) ` +
          `permission on the lock's directory and read permission on the file)`,
        { cause: err },
      );
    }
  }
  if (info === null || (err.code !== "EACCES" && err.code !== "EPERM")) {
    return mapError(err, lp.path, "cannot read the lock file");
  }
  return new LockPermissionError(
    lp.path,
    "cannot read the lock file",
    `the file is not readable by this user (mode ${
      info.mode.toString(8).padStart(4, "0")
    }, owner uid ${info.uid}); probes need read access to the file`,
    { cause: err },
  );
}

export function invalidOpen(err: SysError, lp: LockPath, file: string): Error {
  if (err.code === "ELOOP") {
    return new InvalidLockFileError(
      lp.path,
      "is a symbolic link (runlock never follows one)",
      { cause: err },
    );
  }
  let kind: FileInfo["kind"] | undefined;
  try {
    kind = p.lstat(file)?.kind;
  } catch {
    kind = undefined;
  }
  return new InvalidLockFileError(
    lp.path,
    kind === "directory"
      ? "is a directory"
      : "is not a regular file (a FIFO, socket or device)",
    { cause: err },
  );
}

/** The error for a directory that `verb` cannot list or watch. */
export function dirError(
  err: unknown,
  dir: string,
  verb: "scan" | "watch",
): Error {
  if (err instanceof RunlockError) return err;
  const action = verb === "scan"
    ? "cannot list the directory"
    : "cannot watch the directory";
  const code = errnoOf(err);
  if (code === "NOTCAPABLE") {
    return new LockPermissionError(
      dir,
      action,
      `run Deno with --allow-read=${
        grants(err as SysError, dir).read
      } (runlock never prompts)`,
      { cause: err },
    );
  }
  if (code === "EACCES" || code === "EPERM") {
    return new LockPermissionError(dir, action, "this user may not read it", {
      cause: err,
    });
  }
  if (code === "ENOTDIR" || code === "ENOENT") {
    const what = code === "ENOTDIR" ? "not a directory" : "no such directory";
    return new RunlockError(dir, `${dir}: cannot ${verb}: ${what}`, {
      cause: err,
    });
  }
  return new RunlockError(dir, `${dir}: ${action}: ${(err as Error).message}`, {
    cause: err,
  });
}
