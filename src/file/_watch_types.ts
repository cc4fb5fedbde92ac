/**
 * The types {@linkcode watch}'s modules share: the public change types
 * (`src/file/watch.ts` re-exports them) and a watched directory. Types
 * only, so that every implementation module imports them and none
 * imports another back for a type.
 *
 * @module
 */

import type { ChangeKind, LockChange } from "../contract.ts";
import type { Inspection } from "./probes.ts";

export type { ChangeKind };

/**
 * One change at a lock path, with what a probe found after it.
 *
 * @example A change as a log line
 * ```ts
 * import type { Change } from "@runlock/runlock";
 *
 * const line = (c: Change) =>
 *   `${c.kind} ${c.path} pid=${c.inspection.pid} (${c.inspection.state})`;
 * ```
 */
export interface Change extends LockChange<Inspection> {
  /** The lock file. */
  path: string;
  /**
   * The path's state after the change, as {@linkcode inspect} gives it:
   * `held` after `started`, `present` and `taken over`; `stale` after
   * `crashed`; after `released` and `lost`, `free` (or what is there now
   * if it is not a run's lock: a foreign pidfile, an invalid file).
   */
  inspection: Inspection;
}

/** One watched directory. */
export interface DirWatch {
  readonly path: string;
  readonly key: string;
  /** The path that names it for the identity check (the top: its real path). */
  readonly real: string;
  close: (() => void) | undefined;
  readonly children: Map<string, DirWatch>;
  /** The paths of the runs reported in it. */
  readonly runs: Set<string>;
  /** Names looked at that are not locks (not looked at again until an event). */
  readonly others: Set<string>;
  dropped: boolean;
}
