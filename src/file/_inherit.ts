// What `runlock run` needs to hand a held file lock to its command. Symbols
// from the global registry: the CLI and the library are separate npm
// bundles, each with its own copy of this module.

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

/** The key of acquire's option (`true`) that reserves `CHILD_LINE`. */
export const CHILD_OPTION: unique symbol = Symbol.for("runlock.child.v1");

/** The key of a held file lock's method that fills in `child=`. */
export const NAME_CHILD: unique symbol = Symbol.for("runlock.nameChild.v1");

/** A lock that can describe its descriptor (a held file lock). */
export interface Inheritable {
  [DESCRIPTOR](): Descriptor | undefined;
  /** Writes `pid` (0 before the release) into `child=`; false if it cannot. */
  [NAME_CHILD](pid: number): boolean;
}
