/**
 * The platform interface the protocol core talks to: the core never
 * touches `Deno.*`, `node:fs` or FFI. One file per runtime implements it;
 * the build swaps `current.ts`. Every method is synchronous (one or two
 * non-blocking system calls each), so one core serves `acquire` and
 * `acquireSync`.
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
   * Writes all of `data` at `offset` (`pwrite`), never moving the offset
   * other descriptors share. Without a positional write, through a second
   * open of `path`, written only if it is this inode.
   */
  writeAt(data: Uint8Array, offset: number, path: string): void;
  /**
   * Reads up to `max` bytes from offset 0, as a view on a buffer the next
   * read of any handle reuses (a copy cost 0.6 µs per record on Node, more
   * than the read): use it before reading again.
   */
  readAll(max: number): Uint8Array;
  /** `fstat(fd)`. */
  stat(): FileInfo;
  /** `fchmod(fd, mode)` (or the runtime's nearest equivalent). */
  chmod(mode: number): void;
  /**
   * Renumbers the descriptor above the process's others where it can
   * (`F_DUPFD_CLOEXEC` to 1024+): the kernel closes a dying process's files
   * from the highest down, and closing an inotify instance with watches
   * waits for an RCU grace period. A C holder's flock went 0.4-0.6 ms after
   * SIGKILL with the lock above its inotify descriptor, 0.6-21 ms below it
   * (Linux 6.18). Never throws; where it cannot, a no-op.
   */
  closeFirstAtExit(): void;
  /**
   * The descriptor's number (undefined under Deno without FFI): `runlock
   * run` hands it to its command, as flock(1) does.
   */
  fd(): number | undefined;
  /** `close(fd)`; drops the flock. Never throws. */
  close(): void;
}

/**
 * A directory resolved once and pinned: later calls name entries relative
 * to it (its descriptor with the `*at()` calls, else `${prefix}/${name}`),
 * so re-pointed symlinks, `..` and `chdir` cannot move them. `ENOENT` and
 * `EEXIST` are returned as values (a free lock or a lost race costs no
 * exception); every other failure throws {@linkcode SysError}.
 */
export interface Dir {
  /**
   * The path naming the directory: `/proc/self/fd/N` where the runtime can
   * name its descriptor, else its canonical path at pin time.
   */
  readonly prefix: string;
  /** Whether the directory is held by an open descriptor (true pinning). */
  readonly byDescriptor: boolean;
  /**
   * Creates `name` with `O_CREAT|O_EXCL|O_RDWR|O_CLOEXEC`, mode 0644 (O_EXCL
   * refuses a symlink). `"ENOENT"`: the directory is gone.
   */
  create(name: string): Handle | "EEXIST" | "ENOENT";
  /** Opens `name` as {@linkcode Platform.openExisting} does. */
  open(name: string): Handle | "ENOENT";
  /** `linkat(2)` of `existing` to `created`; `undefined` when linked. */
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
   * Whether {@linkcode Platform.watchDir} may lose events without saying so
   * (other than in a burst it delivers): then a watch also looks periodically.
   */
  readonly watchLosesQuietly: boolean;
  /**
   * Whether a watched directory's removal may report nothing at all: then a
   * watch looks at its directories periodically.
   */
  readonly watchMissesRemoval: boolean;
  /**
   * Whether {@linkcode Platform.watchDir} reports the close of a file opened
   * for writing (`IN_CLOSE_WRITE`, not `moved`; a dead holder's included,
   * under the name it was opened by): then it sees a holder's death and no
   * {@linkcode Platform.watchClose} is needed. Deno: true ("access"); Node
   * and Bun: false (libuv's and Bun's masks leave it out).
   */
  readonly watchSeesClose: boolean;
  /** This host's name, or `""` when it cannot be had without asking. */
  hostname(): string;
  /**
   * Opens an existing regular file read-only, close-on-exec, without
   * following a symlink or blocking on a FIFO. Throws `SysError` `ELOOP`
   * for a symlink, `EFTYPE` for any other non-regular file, `ERACE` when
   * the path was replaced meanwhile (look again); returns `"ENOENT"`.
   */
  openExisting(path: string): Handle | "ENOENT";
  /**
   * Resolves the directory `path` once and pins it (see {@linkcode Dir}).
   * Throws `SysError` `ENOENT` or `ENOTDIR`.
   */
  openDir(path: string): Dir;
  /** `lstat(2)`, or `null` when the path does not exist. */
  lstat(path: string): FileInfo | null;
  /** `mkdir -p`. */
  mkdirp(path: string): void;
  /** Names in a directory. */
  readDir(path: string): string[];
  /** Entries with their kind as the directory reports it (`other` if not). */
  readDirKinds(path: string): { name: string; kind: FileInfo["kind"] }[];
  /**
   * The Linux boot id and the inode of this process's PID namespace, read
   * without a prompt (`""` each when they cannot be).
   */
  identity(): { boot: string; pidns: string };
  /**
   * Calls `fn` after `ms` (default 0) milliseconds, on a timer that never
   * keeps the process alive, unless the returned function is called first.
   */
  unrefLater(fn: () => void, ms?: number): () => void;
  /** A turn of the event loop: due timers fire and ready I/O is served. */
  turn(): Promise<void>;
  /**
   * `kill(pid, 0)`, never prompting; `pid` is another process's, 1 to
   * 2^31-1.
   */
  processAlive(pid: number): Liveness;
  /**
   * Calls `onChange` with an entry's name when an entry of `dir` changes
   * (`moved`: created, removed or renamed), or with `""` when events were
   * lost, until the returned function is called. `undefined` when it cannot
   * watch (callers poll). With `keepAlive: false` the watch must not keep
   * the process alive, or is not made.
   */
  watchDir(
    dir: string,
    onChange: (name: string, moved: boolean) => void,
    keepAlive?: boolean,
  ): (() => void) | undefined;
  /**
   * Calls `onClose` when a descriptor opened for writing on `path` is
   * closed (by the kernel too, when its holder dies), until the returned
   * function is called; never keeps the process alive. With `ends`, also
   * when the file is unlinked, renamed or renamed over (`IN_ATTRIB`, which
   * a new link or a mode, owner or times change also is). `undefined`
   * where it cannot or need not ({@linkcode Platform.watchSeesClose}).
   */
  watchClose(
    path: string,
    onClose: () => void,
    ends?: boolean,
  ): (() => void) | undefined;
  /**
   * Whether opening a file can block (no `O_NONBLOCK`: a FIFO swapped in
   * after the `lstat` would hang it). Deno without every permission.
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
