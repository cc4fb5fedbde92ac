/**
 * The types {@linkcode watch}'s modules share: the public change types
 * (`src/file/watch.ts` re-exports them) and a watched directory. Types
 * only, so that every implementation module imports them and none
 * imports another back for a type.
 *
 * @module
 */

import type { Inspection } from "./probes.ts";

/**
 * What happened at a lock path:
 * - `present`: the lock was there when the watch began (first batch only);
 * - `started`: a run's record appeared, held;
 * - `released`: the run ended cleanly (its holder unlinked its file and
 *   let go), or a crashed run's file was removed;
 * - `crashed`: the holder died and left its record: the file is now stale;
 * - `taken over`: the file is a new live holder's, where a stale one was;
 * - `lost`: the run's file was deleted or replaced while its holder still
 *   holds it (that holder's `lock.signal` says so too).
 *
 * @example Counting the runs that ended badly
 * ```ts
 * import type { ChangeKind } from "@runlock/runlock";
 *
 * const bad = new Set<ChangeKind>(["crashed", "lost"]);
 * console.log(bad.has("released")); // false
 * ```
 */
export type ChangeKind =
  | "present"
  | "started"
  | "released"
  | "crashed"
  | "taken over"
  | "lost";

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
export interface Change {
  /** The lock file. */
  path: string;
  /** What happened; `present` only in the first batch. */
  kind: ChangeKind;
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
