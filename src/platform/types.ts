/**
 * The small platform interface that the protocol core talks to.
 *
 * The core (`src/file/_protocol.ts` and friends) never touches `Deno.*`,
 * `node:fs` or FFI: every system call goes through a {@linkcode Platform}.
 * One file per runtime implements it; the build swaps `current.ts`.
 *
 * Every method is synchronous: each maps to one or two non-blocking system
 * calls, so there is nothing to gain from a thread pool, and a sync core can
 * serve both `acquire` and `acquireSync`.
 *
 * @module
 */

/** What `stat`/`lstat` tell the core about a file. */
export interface FileInfo {
  /** Device number. */
  dev: number;
  /** Inode number. */
  ino: number;
  /** Size in bytes. */
  size: number;
  /** Permission bits (`st_mode & 0o7777`). */
  mode: number;
  /** Owner's user id. */
  uid: number;
  /** What kind of file this is; `lstat` never follows a symlink. */
  kind: "file" | "directory" | "symlink" | "other";
}

/** An open descriptor (close-on-exec) on a regular file. */
export interface Handle {
  /**
   * `flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB)`.
   * Returns `false` when it would block; throws {@linkcode SysError} otherwise.
   */
  tryLock(exclusive: boolean): boolean;
  /** `flock(fd, LOCK_UN)`. */
  unlock(): void;
  /** Writes all of `data` at the current offset. */
  write(data: Uint8Array): void;
  /**
   * Writes all of `data` at `offset` (`pwrite`), never moving this open
   * file's offset, which other descriptors of it share. Where the runtime
   * has no positional write, through a second open file of `path` (the
   * file's name now), written only if it is this inode.
   */
  writeAt(data: Uint8Array, offset: number, path: string): void;
  /**
   * Reads up to `max` bytes from offset 0. The answer is a view on a buffer
   * that the next read of any handle reuses (a copy cost 0.6 µs per record
   * on Node, more than the read itself): use it before reading again.
   */
  readAll(max: number): Uint8Array;
  /** `fstat(fd)`. */
  stat(): FileInfo;
  /** `fchmod(fd, mode)` (or the runtime's nearest equivalent). */
  chmod(mode: number): void;
  /**
   * Renumbers the descriptor above the process's others where the runtime
   * can (`F_DUPFD_CLOEXEC` to 1024 or more), so that if the process dies
   * the kernel drops the flock before it closes the process's other files:
   * it closes a dying process's files from the highest descriptor down,
   * and the close of an inotify instance with watches waits for an RCU
   * grace period. A C holder let go of the flock 0.4-0.6 ms after SIGKILL
   * with its lock above its inotify descriptor, 0.6-21 ms at random with
   * it below (Linux 6.18). Never throws; where it cannot, nothing changes.
   */
  closeFirstAtExit(): void;
  /**
   * The descriptor's number in this process, where the runtime has one
   * (undefined under Deno without FFI, whose files have none): `runlock
   * run` hands it to its command, as flock(1) does, so that the lock lives
   * as long as the command does.
   */
  fd(): number | undefined;
  /** `close(fd)`; drops the flock. Never throws. */
  close(): void;
}

/**
 * A directory resolved once and pinned: every later call of a lock names
 * its entries relative to it (through the open descriptor with the `*at()`
 * system calls where the runtime can make them, otherwise as
 * `${prefix}/${name}`), so re-pointed symlinks, `..` and `chdir` cannot
 * make a later call land in another directory.
 *
 * The failures the protocol expects on its hot path (`ENOENT`, `EEXIST`)
 * are returned as values, never thrown: a free lock or a lost race costs
 * no exception. Every other failure throws {@linkcode SysError}.
 */
export interface Dir {
  /**
   * The path that names the pinned directory: `/proc/self/fd/N` where the
   * runtime can name an open directory descriptor (Linux), otherwise the
   * directory's canonical path (symlinks and `..` resolved at pin time).
   */
  readonly prefix: string;
  /** Whether the directory is held by an open descriptor (true pinning). */
  readonly byDescriptor: boolean;
  /**
   * Creates `name` with `O_CREAT|O_EXCL|O_RDWR|O_CLOEXEC`, mode 0644.
   * Never follows a symlink (O_EXCL refuses one). `"EEXIST"` or `"ENOENT"`
   * (the directory refuses new files, or is gone) as values.
   */
  create(name: string): Handle | "EEXIST" | "ENOENT";
  /**
   * Opens the existing regular file `name` as
   * {@linkcode Platform.openExisting} does; `"ENOENT"` as a value.
   */
  open(name: string): Handle | "ENOENT";
  /**
   * `linkat(2)` of `existing` to `created`, both in this directory:
   * `undefined` when linked, `"EEXIST"` or `"ENOENT"` as values.
   */
  link(existing: string, created: string): "EEXIST" | "ENOENT" | undefined;
  /** `unlinkat(2)`: `undefined` when removed, `"ENOENT"` as a value. */
  unlink(name: string): "ENOENT" | undefined;
  /** `fstatat(2)` without following a symlink, or `null` when missing. */
  lstat(name: string): FileInfo | null;
  /** Closes the descriptor, if any. Never throws. */
  close(): void;
}

/** What a liveness question about a PID can answer. */
export type Liveness = "alive" | "dead" | "unknown";

/** One runtime's implementation of the system calls the protocol needs. */
export interface Platform {
  /** Short runtime name written into the record (`deno`, `node`, `bun`). */
  readonly runtime: string;
  /** This process's PID. */
  readonly pid: number;
  /**
   * Whether {@linkcode Platform.watchDir} may lose events without saying
   * so other than in a burst (whose events it delivers first): then a
   * watch's only safety is a periodic look of its own.
   */
  readonly watchLosesQuietly: boolean;
  /**
   * Whether the watch of a directory that is removed may report nothing
   * at all (neither the directory's end nor its entries'): then a watch
   * looks at its directories periodically.
   */
  readonly watchMissesRemoval: boolean;
  /**
   * Whether {@linkcode Platform.watchDir} reports the close of a file
   * opened for writing (inotify's `IN_CLOSE_WRITE`, a change not `moved`),
   * the kernel's close of a dead holder's descriptor included, under the
   * name the descriptor was opened by (an acquire's temp file, unlinked
   * since, where the holder died after its link). Then a watch of a lock
   * file or of its directory sees the holder's death: no
   * {@linkcode Platform.watchClose} is needed beside it, and a waiter's
   * looks can be rare. Deno: true (its watch reports the close as
   * "access"); Node and Bun: false (libuv's and Bun's masks leave it out).
   */
  readonly watchSeesClose: boolean;
  /** This host's name, or `""` when it cannot be had without asking. */
  hostname(): string;
  /**
   * Opens an existing regular file read-only, close-on-exec, without
   * following a symlink and without blocking on a FIFO.
   * Throws `SysError` `ELOOP` for a symlink, `EFTYPE` for anything that is
   * not a regular file (a socket, FIFO, device or directory), and `ERACE`
   * when the path was replaced while it was being opened (look again).
   * A missing file is `"ENOENT"`, returned, not thrown.
   */
  openExisting(path: string): Handle | "ENOENT";
  /**
   * Resolves the directory `path` once and pins it (see {@linkcode Dir}).
   * Throws `SysError` `ENOENT` when it does not exist, `ENOTDIR` when it is
   * not a directory.
   */
  openDir(path: string): Dir;
  /** `lstat(2)`, or `null` when the path does not exist. */
  lstat(path: string): FileInfo | null;
  /** `mkdir -p`. */
  mkdirp(path: string): void;
  /** Names in a directory. */
  readDir(path: string): string[];
  /**
   * Entries of a directory with their kind as the directory reports it
   * (never following a symlink); `other` where it does not say.
   */
  readDirKinds(path: string): { name: string; kind: FileInfo["kind"] }[];
  /**
   * This process's identity beyond its PID, read without a prompt where the
   * runtime may: the Linux boot id and the inode of its PID namespace
   * (`""` each when they cannot be read).
   */
  identity(): { boot: string; pidns: string };
  /**
   * Calls `fn` every `ms` milliseconds on a timer that never keeps the
   * process alive, until the returned function is called.
   */
  unrefInterval(fn: () => void, ms: number): () => void;
  /**
   * Calls `fn` once after `ms` milliseconds (0 by default: once the event
   * loop turns), on a timer that never keeps the process alive, unless the
   * returned function is called first.
   */
  unrefLater(fn: () => void, ms?: number): () => void;
  /**
   * A turn of the event loop, for a long synchronous task to let the rest
   * of the program run: the timers that are due fire and the I/O that is
   * ready is served before it resolves.
   */
  turn(): Promise<void>;
  /**
   * `kill(pid, 0)`, answered without ever prompting for a permission. The
   * core only asks about valid PIDs (1 to 2^31-1) of other processes.
   */
  processAlive(pid: number): Liveness;
  /**
   * Calls `onChange` with an entry's name when an entry of `dir` changes
   * (`moved`: it was created, removed or renamed, not just modified),
   * until the returned function is called; with `""` (not `moved`) when
   * the watch lost events and says so (any entry may have changed). Returns `undefined`
   * when watching is not possible; callers then poll. With `keepAlive:
   * false` the watch must not keep the process alive, or is not made.
   */
  watchDir(
    dir: string,
    onChange: (name: string, moved: boolean) => void,
    keepAlive?: boolean,
  ): (() => void) | undefined;
  /**
   * Calls `onClose` when a descriptor opened for writing on the file at
   * `path` is closed, including by the kernel when its holder dies, until
   * the returned function is called. Never keeps the process alive.
   * With `ends`, also when the file is unlinked, renamed, or replaced by a
   * rename over it (and when it gains a hard link, or its mode, owner or
   * times change: inotify's `IN_ATTRIB` covers all of these): the events that
   * end a holder's file, so that a waiter needs no other watch of it.
   * Returns `undefined` where the runtime cannot (or need not: see
   * {@linkcode Platform.watchSeesClose}); callers then rely on their other
   * wake-ups and their poll.
   */
  watchClose(
    path: string,
    onClose: () => void,
    ends?: boolean,
  ): (() => void) | undefined;
  /**
   * Whether opening a file can block (no `O_NONBLOCK`: a FIFO swapped in
   * between the `lstat` and the `open` would hang it). Deno: true, except
   * with every permission (libc's open, given `O_NONBLOCK`).
   */
  readonly openMayBlock: boolean;
  /** The canonical path of a directory (`realpath`), or `""` if unknown. */
  realDir(path: string): string;
}

/**
 * A failed system call, with the errno name (`ENOENT`, `EEXIST`, ...) every
 * runtime agrees on. `NOTCAPABLE` is a Deno permission refusal.
 */
export class SysError extends Error {
  /** The errno name. */
  readonly code: string;
  /** The system call. */
  readonly syscall: string;
  /** For `NOTCAPABLE`: the Deno flag that would grant it. */
  readonly grant: string | undefined;

  /** Builds the error. */
  constructor(
    code: string,
    syscall: string,
    message: string,
    options?: ErrorOptions & { grant?: string },
  ) {
    super(message, options);
    this.name = "SysError";
    this.code = code;
    this.syscall = syscall;
    this.grant = options?.grant;
  }
}
