// What `runlock run` needs of a held file lock to hand it to its command,
// as flock(1) does: the descriptor that holds the flock, and the file's
// identity (to find that descriptor under Deno, whose files have none).
// A symbol from the global registry, not a module's own: the CLI and the
// library are separate bundles in the npm package, each with its own copy
// of this module.

/** The key of a held file lock's method that describes its descriptor. */
export const DESCRIPTOR: unique symbol = Symbol.for("runlock.descriptor.v1");

/** What a held file lock says of the descriptor that holds its flock. */
export interface Descriptor {
  /** Its number in this process, where the runtime has one. */
  fd: number | undefined;
  /** The lock file's device and inode. */
  dev: number;
  ino: number;
}

/**
 * The key of acquire's option (`true`) that reserves the record's `child=`
 * line (`CHILD_LINE` in src/file/record.ts) for the command's PID.
 */
export const CHILD_OPTION: unique symbol = Symbol.for("runlock.child.v1");

/** The key of a held file lock's method that fills in `child=`. */
export const NAME_CHILD: unique symbol = Symbol.for("runlock.nameChild.v1");

/** A lock that can describe its descriptor (a held file lock). */
export interface Inheritable {
  [DESCRIPTOR](): Descriptor | undefined;
  /**
   * Writes `pid` into the `child=` line the lock's record reserved (see
   * {@linkcode CHILD_OPTION}), or 0 just before the release (the command
   * ended); false when it has none or is not held.
   */
  [NAME_CHILD](pid: number): boolean;
}
