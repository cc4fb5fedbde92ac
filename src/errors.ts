/**
 * The errors runlock throws. Every one extends {@linkcode RunlockError} and
 * names the lock file; the same classes are thrown on every runtime.
 *
 * @module
 */

/**
 * Base class of every error runlock throws; `path` is the lock file as the
 * caller named it.
 *
 * @example Telling runlock's errors apart from others
 * ```ts
 * import { RunlockError } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const err = new RunlockError("run.lock", "run.lock: something went wrong");
 * assert.ok(err instanceof Error);
 * assert.equal(err.path, "run.lock");
 * ```
 */
export class RunlockError extends Error {
  /** The lock file. */
  readonly path: string;

  /**
   * Creates the error.
   *
   * @param path The lock file.
   * @param message What went wrong and what to do.
   * @param options `cause`, when there is one.
   */
  constructor(path: string, message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "RunlockError";
    this.path = path;
  }
}

/**
 * Options of {@linkcode HeldError}, beyond `cause`.
 *
 * @example A lock this process already holds
 * ```ts
 * import { HeldError, type HeldErrorOptions } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const options: HeldErrorOptions = {
 *   started: new Date("2026-11-30T09:52:11Z"),
 *   byThisProcess: true,
 * };
 * const err = new HeldError("run.lock", 4242, "build-7", options);
 * assert.equal(err.byThisProcess, true);
 * assert.match(err.message, /this process \(pid 4242\) already holds it/);
 * ```
 */
export interface HeldErrorOptions extends ErrorOptions {
  /** When the holder took the lock, when known. */
  started?: Date;
  /**
   * The holder is the calling process itself: locks are not reentrant, so a
   * second acquire of a lock this process holds fails at once.
   */
  byThisProcess?: boolean;
  /**
   * The live command `runlock run` handed the lock to, when the run itself
   * (`pid`) is gone.
   */
  child?: number;
}

/**
 * Another live run holds the lock. `pid` is the holder's PID as its record
 * says (0 when the file is locked by a tool that wrote no PID, such as
 * `flock(1)`), `host` its host name (`""` when unknown). When the holder is
 * this very process (`byThisProcess`), the message says so: runlock locks
 * are not reentrant.
 *
 * @example Reporting the holder
 * ```ts
 * import { HeldError } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const err = new HeldError(".state/run.lock", 4242, "build-7");
 * assert.equal(
 *   err.message,
 *   ".state/run.lock: another run is active as pid 4242 on build-7; wait for it or stop it",
 * );
 * const noHost = new HeldError(".state/run.lock", 4242, "");
 * assert.equal(
 *   noHost.message,
 *   ".state/run.lock: another run is active as pid 4242; wait for it or stop it",
 * );
 * ```
 */
export class HeldError extends RunlockError {
  /** The holder's PID, or 0 when the file names none. */
  readonly pid: number;
  /** The holder's host name, or `""` when unknown. */
  readonly host: string;
  /** When the holder took the lock, when known. */
  readonly started: Date | undefined;
  /** Whether the holder is the calling process itself. */
  readonly byThisProcess: boolean;
  /**
   * The PID of the command `runlock run` handed the lock to, which holds
   * it while that run (`pid`) is gone; 0 otherwise.
   */
  readonly child: number;

  /**
   * Creates the error.
   *
   * @param path The lock file.
   * @param pid The holder's PID, or 0.
   * @param host The holder's host name, or `""`.
   * @param options `started`, `byThisProcess` and `cause`.
   */
  constructor(
    path: string,
    pid: number,
    host: string,
    options?: HeldErrorOptions,
  ) {
    const self = options?.byThisProcess === true;
    let message: string;
    if (self) {
      const since = options?.started
        ? ` since ${options.started.toISOString()}`
        : "";
      message =
        `${path}: this process (pid ${pid}) already holds it${since}; ` +
        `runlock locks are not reentrant: use the lock you hold, or release it first`;
    } else {
      const child = options?.child ?? 0;
      const who = child > 0
        ? `as pid ${child}, the command of runlock pid ${pid} (gone)`
        : pid > 0
        ? `as pid ${pid}`
        : "(the file names no pid)";
      const where = host ? ` on ${host}` : "";
      message =
        `${path}: another run is active ${who}${where}; wait for it or stop it`;
    }
    super(path, message, options);
    this.name = "HeldError";
    this.pid = pid;
    this.host = host;
    this.started = options?.started;
    this.byThisProcess = self;
    this.child = options?.child ?? 0;
  }
}

/**
 * The lock file is not something runlock may read or replace: a symlink, a
 * directory, a FIFO, more than 4 KiB, or text that is not a PID. The file is
 * left exactly as it was; `reason` says what is wrong with it.
 *
 * @example Catching an invalid lock file
 * ```ts
 * import { InvalidLockFileError } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const err = new InvalidLockFileError("run.lock", "is a directory");
 * assert.match(err.message, /run\.lock: is a directory/);
 * ```
 */
export class InvalidLockFileError extends RunlockError {
  /** What is wrong with the file. */
  readonly reason: string;

  /**
   * Creates the error.
   *
   * @param path The lock file.
   * @param reason What is wrong with it.
   * @param options `cause`, when there is one.
   */
  constructor(path: string, reason: string, options?: ErrorOptions) {
    super(
      path,
      `${path}: ${reason}; it is not a lock file runlock can use, and runlock ` +
        `left it exactly as it is (it did not create it). Choose another path for the lock`,
      options,
    );
    this.name = "InvalidLockFileError";
    this.reason = reason;
  }
}

/**
 * This process may not do what the lock needs: the OS refused (EACCES,
 * EPERM, EROFS), or Deno lacks `--allow-read`/`--allow-write` for the lock's
 * directory. runlock never triggers a permission prompt.
 *
 * @example The message names the grant
 * ```ts
 * import { LockPermissionError } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const err = new LockPermissionError("run.lock", "cannot create the lock", "grant --allow-write=.");
 * assert.match(err.message, /permission denied/);
 * ```
 */
export class LockPermissionError extends RunlockError {
  /**
   * Creates the error.
   *
   * @param path The lock file.
   * @param action What was being done.
   * @param hint What to grant or change.
   * @param options `cause`, when there is one.
   */
  constructor(
    path: string,
    action: string,
    hint: string,
    options?: ErrorOptions,
  ) {
    super(path, `${path}: ${action}: permission denied; ${hint}`, options);
    this.name = "LockPermissionError";
  }
}

/**
 * The lock's filesystem (or OS) cannot carry the protocol: no hard links
 * (FAT, some FUSE filesystems) or no `flock(2)` (Windows). runlock refuses
 * rather than downgrade silently.
 *
 * @example The message names what is missing
 * ```ts
 * import { UnsupportedFilesystemError } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const err = new UnsupportedFilesystemError("/mnt/usb/run.lock", "hard links");
 * assert.match(err.message, /does not support hard links/);
 * ```
 */
export class UnsupportedFilesystemError extends RunlockError {
  /**
   * Creates the error.
   *
   * @param path The lock file.
   * @param feature `"hard links"` or `"flock"`.
   * @param options `cause`, when there is one.
   */
  constructor(path: string, feature: string, options?: ErrorOptions) {
    super(
      path,
      `${path}: the filesystem or OS does not support ${feature}, which runlock needs; ` +
        `put the lock on a local filesystem (ext4, xfs, btrfs, tmpfs)`,
      options,
    );
    this.name = "UnsupportedFilesystemError";
  }
}

/**
 * Every attempt of one acquire lost a race (holders coming and going, peers
 * taking over a stale file). The lock may be free a moment later: this is
 * not a statement that it is held.
 *
 * @example The message says "contended", not "held"
 * ```ts
 * import { ContendedError } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const err = new ContendedError("run.lock", 16);
 * assert.match(err.message, /too contended/);
 * ```
 */
export class ContendedError extends RunlockError {
  /**
   * Creates the error.
   *
   * @param path The lock file.
   * @param attempts How many attempts were made.
   * @param options `cause`, when there is one.
   */
  constructor(path: string, attempts: number, options?: ErrorOptions) {
    super(
      path,
      `${path}: the lock was too contended to take in ${attempts} attempts ` +
        `(others kept taking and releasing it); try again`,
      options,
    );
    this.name = "ContendedError";
  }
}

/**
 * Options of {@linkcode LockLostError}, beyond `cause`.
 *
 * @example Naming who holds the lock now
 * ```ts
 * import { LockLostError, type LockLostErrorOptions } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const options: LockLostErrorOptions = { holder: { pid: 77, host: "build-8" } };
 * const err = new LockLostError("run.lock", 4242, "was replaced by another file", options);
 * assert.match(err.message, /replaced by another file \(now held by pid 77 on build-8\)/);
 * ```
 */
export interface LockLostErrorOptions extends ErrorOptions {
  /** Who the file names now, when it was replaced by another run's lock. */
  holder?: { pid: number; host: string };
}

/**
 * The lock was lost while held: its file was deleted or replaced behind the
 * holder's back (by `rm`, a cleanup job, or another tool), or, for a
 * database lock, its session ended. Mutual exclusion was not guaranteed from
 * then on. It is the reason of an aborted `lock.signal`, and `release()`
 * throws it once; a successor's file is always left alone.
 *
 * @example What the message says
 * ```ts
 * import { LockLostError } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const err = new LockLostError("run.lock", 4242, "was deleted");
 * assert.match(err.message, /was deleted while pid 4242 held it/);
 * ```
 */
export class LockLostError extends RunlockError {
  /** The PID that held the lock (this process). */
  readonly pid: number;
  /** What happened: `"was deleted"`, `"was replaced by another file"`, ... */
  readonly what: string;
  /** Who the file names now, when another run's lock replaced it. */
  readonly holder: { pid: number; host: string } | undefined;

  /**
   * Creates the error.
   *
   * @param path The lock file.
   * @param pid The PID that held the lock.
   * @param what `"was deleted"`, `"was replaced by another file"`, or what
   * else happened to the lock.
   * @param options `holder` and `cause`.
   */
  constructor(
    path: string,
    pid: number,
    what: string,
    options?: LockLostErrorOptions,
  ) {
    const holder = options?.holder;
    const now = holder && holder.pid > 0
      ? ` (now held by pid ${holder.pid}${
        holder.host ? ` on ${holder.host}` : ""
      })`
      : "";
    const file = what.startsWith("was ");
    super(
      path,
      `${path}: the lock ${
        file ? "file " : ""
      }${what}${now} while pid ${pid} held it; ` +
        `another process may have run at the same time` +
        (file ? ". Find what removes it" : ""),
      options,
    );
    this.name = "LockLostError";
    this.pid = pid;
    this.what = what;
    this.holder = holder;
  }
}

/**
 * runlock's file locks run on Linux on x86_64, the platform its tests run
 * on; importing them elsewhere throws this at import. From JSR the
 * PostgreSQL backend (`@runlock/runlock/postgres`) still loads there; the
 * npm package, which installs on Linux x86_64 only, loads its error classes
 * from the library and throws the same. `path` is `""`.
 *
 * @example What the error says
 * ```ts
 * import { UnsupportedPlatformError } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const err = new UnsupportedPlatformError("darwin", "arm64");
 * assert.equal(err.os, "darwin");
 * assert.match(err.message, /Linux on x86_64/);
 * ```
 */
export class UnsupportedPlatformError extends RunlockError {
  /** The operating system found (`process.platform`, `Deno.build.os`). */
  readonly os: string;
  /** The processor found (`process.arch`, `Deno.build.arch`). */
  readonly arch: string;

  /**
   * Creates the error.
   *
   * @param os The operating system found.
   * @param arch The processor found.
   */
  constructor(os: string, arch: string) {
    super(
      "",
      `runlock's file locks run on Linux on x86_64 (flock, /proc and the libc ` +
        `calls they make are tested there only): this is ${os} on ${arch}`,
    );
    this.name = "UnsupportedPlatformError";
    this.os = os;
    this.arch = arch;
  }
}
