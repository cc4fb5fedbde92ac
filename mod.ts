/**
 * **runlock**: one orchestrator per state directory, and everyone can see
 * who it is.
 *
 * A PID lockfile and a flock run-liveness lock in one file. The holder's
 * record (PID first, so `pgrep -F` works) is hard-linked into place whole;
 * the holder keeps an exclusive `flock(2)` on it for its life, which the
 * kernel drops on any exit. The file says **who**; the flock says
 * **whether**. A crashed run's file is taken over without a cleanup daemon.
 *
 * ```ts
 * import { acquire, activePid, HeldError } from "@runlock/runlock";
 *
 * const dir = await Deno.makeTempDir();
 * const path = `${dir}/.state/run.lock`;
 *
 * // The long-running mode:
 * try {
 *   await using _lock = await acquire(path);
 *   // ... the work loop; the lock is released at the end of the block
 * } catch (err) {
 *   if (!(err instanceof HeldError)) throw err;
 *   console.error(err.message); // "...: another run is active as pid 4242 on build-7; ..."
 * }
 *
 * // A status command, without taking the lock:
 * const { pid, alive } = await activePid(path);
 * console.log(alive ? `running as pid ${pid}` : "not running");
 * ```
 *
 * @module
 */

export {
  acquire,
  type AcquireOptions,
  acquireSync,
  type AcquireSyncOptions,
  type Lock,
} from "./src/file/lock.ts";
export {
  activePid,
  held,
  inspect,
  type Inspection,
} from "./src/file/probes.ts";
export { scan, type ScanOptions } from "./src/file/scan.ts";
export type { Skipped } from "./src/file/_listing.ts";
export {
  type Change,
  type ChangeKind,
  watch,
  type WatchOptions,
} from "./src/file/watch.ts";
export type { Meta } from "./src/meta.ts";
export type {
  HeldLock,
  LockChange,
  LockInspection,
  Locks,
} from "./src/contract.ts";
export {
  ContendedError,
  HeldError,
  type HeldErrorOptions,
  InvalidLockFileError,
  LockLostError,
  type LockLostErrorOptions,
  LockPermissionError,
  RunlockError,
  UnsupportedFilesystemError,
  UnsupportedPlatformError,
} from "./src/errors.ts";
