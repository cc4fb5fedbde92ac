/**
 * Taking and releasing the lock: {@linkcode acquire}, {@linkcode acquireSync}
 * and the {@linkcode Lock} they return.
 *
 * @module
 */

import { mapError } from "./_error_map.ts";
import { heldHere, liveness } from "./_liveness.ts";
import {
  type Acquired,
  DEFAULT_MODE,
  errnoOf,
  type HeldBy,
  lockPath,
  type Probe,
  type Target,
  within,
} from "./_protocol.ts";
import {
  identityHere,
  type RecordTemplate,
  recordTemplate,
} from "./_record_here.ts";
import { tempName } from "./_temp_name.ts";
import { attemptLoop, pin, runSync } from "./_attempt.ts";
import {
  CHILD_OPTION,
  DESCRIPTOR,
  type Descriptor,
  NAME_CHILD,
} from "./_inherit.ts";
import { probe } from "./_probe.ts";
import { every, type Tick } from "./_timer.ts";
import { fileKey, listen, type Listener, listenFile } from "./_events.ts";
import { ContendedError, HeldError, LockLostError } from "../errors.ts";
import { checkMeta, type Meta } from "../meta.ts";
import {
  CHILD_LINE,
  childDigits,
  MAX_RECORD_BYTES,
  metaLines,
} from "./record.ts";
import { platform as p } from "../platform/current.ts";
import type { FileInfo, Handle } from "../platform/types.ts";

/**
 * Options for {@linkcode acquireSync}; {@linkcode acquire} also takes a
 * `signal` ({@linkcode AcquireOptions}).
 *
 * @example A private lock, waiting up to 2 seconds
 * ```ts
 * import { acquireSync, type AcquireSyncOptions } from "@runlock/runlock";
 *
 * const dir = Deno.makeTempDirSync();
 * const options: AcquireSyncOptions = { timeout: 2_000, mode: 0o600 };
 * using _lock = acquireSync(`${dir}/run.lock`, options);
 * ```
 */
export interface AcquireSyncOptions {
  /**
   * How long to keep trying while another run holds the lock, in
   * milliseconds. `0` (the default) fails at once with {@linkcode HeldError};
   * `Infinity` waits for as long as it takes.
   */
  timeout?: number;
  /**
   * The lock file's permission bits, whatever the umask: `0o644` by default,
   * so that other users' status commands can read it (probes need read
   * access to the file). `0o600` keeps it private to the owner. The owner
   * must be able to read it.
   */
  mode?: number;
  /**
   * User fields written into the record, where every prober can read them
   * (`inspect(path).meta`, `runlock status`): what this run is. Keys match
   * `[a-z0-9_.-]{1,64}`; values are one line of text; the whole record stays
   * within 4 KiB. The file is world-readable by default: do not put secrets
   * here.
   */
  meta?: Meta;
  /**
   * How often, in milliseconds, the held lock checks (one `lstat`) that its
   * file is still its own, besides watching its directory where the
   * runtime can without keeping the process alive (not under Deno). Default
   * 1000; `0` turns both off: the lock then never looks at its file on its
   * own, and only {@linkcode Lock.release} finds a loss. See
   * {@linkcode Lock.signal}.
   */
  checkInterval?: number;
}

/**
 * Options for {@linkcode acquire}.
 *
 * @example Waiting up to 5 seconds, or until shutdown
 * ```ts
 * import { acquire, type AcquireOptions } from "@runlock/runlock";
 *
 * const dir = await Deno.makeTempDir();
 * const options: AcquireOptions = {
 *   timeout: 5_000,
 *   signal: AbortSignal.timeout(10_000),
 * };
 * await using _lock = await acquire(`${dir}/run.lock`, options);
 * ```
 */
export interface AcquireOptions extends AcquireSyncOptions {
  /** Stops waiting: the promise rejects with the signal's reason. */
  signal?: AbortSignal;
}

/**
 * A held run lock. Release it exactly once, best with `using`/`await using`;
 * if the process dies instead, the kernel drops the flock and the next
 * {@linkcode acquire} takes the file over.
 *
 * @example Checking that nobody removed the file during a long run
 * ```ts
 * import { acquire, LockLostError } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * const lock = await acquire(`${dir}/run.lock`);
 * assert.equal(lock.isOwned(), true);
 * await Deno.remove(lock.path); // a careless cleanup job
 * assert.equal(lock.isOwned(), false);
 * await assert.rejects(lock.release(), LockLostError);
 * assert.equal(lock.released, true);
 * ```
 */
export interface Lock extends Disposable, AsyncDisposable {
  /** The lock file, as passed to {@linkcode acquire}. */
  readonly path: string;
  /** The PID written into the file: this process. */
  readonly pid: number;
  /** When the lock was taken. */
  readonly acquiredAt: Date;
  /** Whether {@linkcode Lock.release} has run. */
  readonly released: boolean;
  /** The user fields written into the record (`{}` when none). */
  readonly meta: Readonly<Meta>;
  /**
   * Aborted, with a {@linkcode LockLostError} as its reason, as soon as the
   * lock is found lost while held: its file deleted or replaced (the reason
   * says which, and who holds it now if the new file names a holder). Found
   * by a watch on the lock's directory (Node, Bun) and by the periodic check
   * (`checkInterval`). Never aborted by a clean release. Pass it to work
   * that must stop when exclusion is gone.
   */
  readonly signal: AbortSignal;
  /**
   * Whether the file at {@linkcode Lock.path} is still the one this lock
   * created. `false` when someone deleted or replaced it behind our back,
   * or renamed its directory and made another in its place (so another run
   * may be active), or once released. A loss it finds aborts
   * {@linkcode Lock.signal}, as the periodic check would. Two `lstat`s: the
   * path as it was found, and the name in the pinned directory. That path
   * is read at the lock's first check or first `isOwned()`, whichever comes
   * first: a directory renamed before that (within the first turn of the
   * event loop, or with `checkInterval: 0` before the first call) is not
   * seen this way; the file itself deleted or replaced always is.
   */
  isOwned(): boolean;
  /**
   * Removes the file, then drops the flock. Idempotent.
   *
   * @throws {LockLostError} once, if the file had been deleted or replaced
   * by someone else (their file is left alone), or if a loss that left it
   * in place was found while held (its directory renamed and another made
   * in its place, or the file moved away and back; it is removed).
   */
  release(): Promise<void>;
  /** The synchronous form of {@linkcode Lock.release}. */
  releaseSync(): void;
}

/** "1 byte", "2 bytes". */
const bytesOf = (n: number) => `${n} byte${n === 1 ? "" : "s"}`;

/** The loss of a file whose directory moved away from the lock's path. */
const MOVED_AWAY =
  "was moved away from its path (its directory was renamed or replaced)";

const encoder = new TextEncoder();
const CHILD_LINE_BYTES = encoder.encode("\n" + CHILD_LINE);

/** Where `needle` first occurs in `bytes`, or -1. */
function findBytes(bytes: Uint8Array, needle: Uint8Array): number {
  const last = bytes.length - needle.length;
  outer: for (let i = 0; i <= last; i++) {
    for (let k = 0; k < needle.length; k++) {
      if (bytes[i + k] !== needle[k]) continue outer;
    }
    return i;
  }
  return -1;
}

class RunLock implements Lock {
  readonly path: string;
  readonly pid: number = p.pid;
  readonly acquiredAt: Date;
  readonly meta: Readonly<Meta>;
  #target: Target;
  #handle: Handle | undefined;
  #id: FileInfo;
  /** The loss, once found; the signal is made only when read. */
  #reason: LockLostError | undefined;
  #signal: AbortSignal | undefined;
  #controller: AbortController | undefined;
  /** The lock's place on the shared timer and in the shared watch. */
  #tick: Tick | undefined;
  #listener: Listener | undefined;
  #watching = false;
  /** The lock file's path as first seen, when pinned by a descriptor. */
  #named: string | undefined;
  /** A watch saw our name created, removed or renamed. */
  #moved = false;
  /**
   * Until the watch reports the marker: events of what came before the
   * watch began (this lock's own link, the release of the name's last
   * lock) may still reach it, even a watch opened now (a runtime shares one
   * inotify watch among a directory's watchers), and they are no move.
   */
  #marker: Listener | undefined;

  /**
   * The descriptor that holds the flock, while held: `runlock run` hands it
   * to its command (src/file/_inherit.ts). Not part of the public API.
   */
  [DESCRIPTOR](): Descriptor | undefined {
    if (this.#handle === undefined) return undefined;
    return { fd: this.#handle.fd(), dev: this.#id.dev, ino: this.#id.ino };
  }

  /**
   * Names the command `runlock run` handed the lock to in the record's
   * reserved `child=` line: ten digits written in place, in one write (see
   * `CHILD_LINE`). Not part of the public API.
   */
  [NAME_CHILD](pid: number): boolean {
    const handle = this.#handle;
    if (
      handle === undefined || !Number.isInteger(pid) || pid < 0 || pid === 1
    ) {
      return false;
    }
    if (this.#childAt === undefined) {
      const bytes = handle.readAll(MAX_RECORD_BYTES + 1);
      const at = findBytes(bytes, CHILD_LINE_BYTES);
      if (at < 0) return false;
      this.#childAt = at + CHILD_LINE_BYTES.length - 11;
    }
    handle.writeAt(
      encoder.encode(childDigits(pid)),
      this.#childAt,
      within(this.#target.pinned.prefix, this.#target.name),
    );
    return true;
  }
  /** Where the `child=` value is in the record, once found. */
  #childAt: number | undefined;

  constructor(
    target: Target,
    acquired: Acquired,
    meta: Meta,
    checkInterval: number,
  ) {
    this.path = target.path;
    this.acquiredAt = acquired.started;
    this.meta = Object.freeze(meta);
    this.#target = target;
    this.#handle = acquired.handle;
    this.#id = acquired.id;
    heldHere.set(acquired.id, acquired.started);
    // Where the file was linked, by a path that no chdir or re-pointed
    // symlink changes: release() finds a directory moved away from it
    // before the first check (a run shorter than checkInterval, or
    // checkInterval 0).
    if (acquired.dir) this.#named = within(acquired.dir, target.name);
    // checkInterval 0: the lock never looks at its file on its own (no
    // check, no watch); only release() finds a loss.
    if (checkInterval === 0) return;
    // Loss is an event: the shared watch of the directory, where it keeps
    // nothing alive, and checks on the shared unref'd timer. Its first
    // call comes once the event loop turns, not here: a lock taken and
    // released in one synchronous stretch (a CLI, a tight loop) pays for
    // no watch and no timer, only a place in a list.
    this.#tick = every(checkInterval, () => this.#onTick());
  }

  /**
   * Where the directory is pinned by a descriptor, its path can move away
   * from the lock (the directory renamed, another made in its place, where
   * a new run may start): remembers, once, where the file is now. Only a
   * path that names the pinned directory itself now is remembered (a name
   * read some other way, after a symlink on the way was re-pointed or a
   * chdir, would name another directory: a false loss).
   */
  #nameIt(): void {
    const pinned = this.#target.pinned;
    if (this.#named !== undefined || !pinned.byDescriptor) return;
    const dir = p.realDir(pinned.prefix);
    if (dir === "") return;
    try {
      const here = pinned.lstat(".");
      const there = p.lstat(dir);
      if (
        here === null || there === null || here.dev !== there.dev ||
        here.ino !== there.ino
      ) {
        this.#named = ""; // unnamed: the pinned directory alone decides
        return;
      }
    } catch {
      return;
    }
    this.#named = within(dir, this.#target.name);
  }

  #onTick(): void {
    if (this.#handle === undefined) return;
    if (!this.#watching) {
      this.#watching = true;
      // Before the watch: its inotify descriptor must come below ours.
      this.#handle.closeFirstAtExit();
      const target = this.#target;
      this.#nameIt();
      this.#listener = listen(target.pinned, target.name, (moved) => {
        // Nobody else creates, removes or renames our name while we hold
        // it: such an event is a loss even if the file is back by the time
        // we look (moved aside, another run in and out, moved back). Not
        // before the marker's: those are of what came before.
        if (moved && this.#marker === undefined) this.#moved = true;
        this.#check();
      }, false);
      if (this.#listener?.watching()) this.#mark();
    }
    this.#check(); // at the first call: anything before the watch began
  }

  get signal(): AbortSignal {
    if (this.#signal === undefined) {
      if (this.#reason !== undefined) {
        this.#signal = AbortSignal.abort(this.#reason);
      } else {
        this.#controller = new AbortController();
        this.#signal = this.#controller.signal;
      }
    }
    return this.#signal;
  }

  /** Reports the loss, once, to the signal (now or when first read). */
  #lose(reason: LockLostError): void {
    if (this.#reason !== undefined) return;
    this.#reason = reason;
    this.#controller?.abort(reason);
  }

  /**
   * Makes and removes a marker file beside the lock (a temp name, litter
   * for the sweep if we die in between): a watch reports events in order,
   * so once the marker's comes, every later event on our name is news.
   */
  #mark(): void {
    const pinned = this.#target.pinned;
    const name = tempName(this.#target.name);
    const done = () => {
      this.#marker?.stop();
      this.#marker = undefined;
    };
    this.#marker = listen(pinned, name, done, false);
    if (this.#marker === undefined) return;
    try {
      const made = pinned.create(name);
      if (typeof made === "string") return done();
      made.close();
      pinned.unlink(name);
    } catch {
      // No marker: every (re)move event counts, as before it.
      done();
    }
  }

  #stopWatching(): void {
    this.#marker?.stop();
    this.#marker = undefined;
    this.#tick?.stop();
    this.#tick = undefined;
    this.#listener?.stop();
    this.#listener = undefined;
  }

  /** What happened to our file, or undefined while it is ours. */
  #loss(): LockLostError | undefined {
    const ours = (info: FileInfo | null) =>
      info !== null && info.dev === this.#id.dev && info.ino === this.#id.ino;
    // The path as it was named is read before the pinned one: a file
    // replaced between the two reads then shows as replaced (the pinned read
    // sees the new file), never as a directory moved away (the order the
    // other way round read our file through the pin, then the replacement
    // through the name, and said the directory had moved).
    // A failed read of the name proves nothing (the pinned read decides).
    let named: FileInfo | null | undefined;
    try {
      if (this.#named) named = p.lstat(this.#named);
    } catch {
      named = undefined;
    }
    const now = this.#target.pinned.lstat(this.#target.name);
    if (ours(now)) {
      if (this.#moved) {
        return new LockLostError(
          this.path,
          this.pid,
          "was moved away and back (another run may have held the lock meanwhile)",
        );
      }
      if (named === undefined || ours(named)) return undefined;
      return new LockLostError(this.path, this.pid, MOVED_AWAY);
    }
    if (now === null) {
      return new LockLostError(this.path, this.pid, "was deleted");
    }
    let holder: { pid: number; host: string } | undefined;
    // Who holds it now is a courtesy, not worth a probe that could block
    // (a FIFO swapped in, where open has no O_NONBLOCK): the loss is the news.
    if (!p.openMayBlock) {
      try {
        const found = probe(this.#target, this.#target.pinned);
        if (found.state === "held" && found.pid > 0) {
          holder = { pid: found.pid, host: found.host };
        }
      } catch {
        // The loss is the news.
      }
    }
    return new LockLostError(
      this.path,
      this.pid,
      "was replaced by another file",
      { holder },
    );
  }

  #check(): void {
    if (this.#handle === undefined || this.#reason !== undefined) return;
    let loss: LockLostError | undefined;
    try {
      loss = this.#loss();
    } catch {
      return; // A failed lstat proves nothing; look again next time.
    }
    if (loss === undefined) return;
    this.#stopWatching();
    this.#lose(loss);
  }

  get released(): boolean {
    return this.#handle === undefined;
  }

  isOwned(): boolean {
    if (this.#handle === undefined || this.#reason !== undefined) return false;
    // The periodic check's question, asked now: the name as it was found
    // and the pinned directory both still name our file. A loss found here
    // is reported to the signal as the check would.
    let loss: LockLostError | undefined;
    try {
      this.#nameIt(); // before the first check, the first call names it
      loss = this.#loss();
    } catch {
      return false;
    }
    if (loss === undefined) return true;
    this.#stopWatching();
    this.#lose(loss);
    return false;
  }

  /**
   * Whether the path where the file was linked no longer names it (read
   * after the pinned directory showed it ours). A failed read proves
   * nothing.
   */
  #movedAway(): boolean {
    if (!this.#named) return false;
    try {
      const named = p.lstat(this.#named);
      return named === null || named.dev !== this.#id.dev ||
        named.ino !== this.#id.ino;
    } catch {
      return false;
    }
  }

  releaseSync(): void {
    const handle = this.#handle;
    if (handle === undefined) return;
    this.#stopWatching();
    this.#handle = undefined;
    heldHere.delete(this.#id);
    const target = this.#target;
    let lost: string | undefined;
    try {
      // Unlink first, unlock second: while we hold LOCK_EX on the inode that
      // the name names, no other participant can unlink or replace it. Both
      // calls go through the directory pinned at acquire, so a symlink
      // re-pointed in between cannot make them look at two directories.
      const now = target.pinned.lstat(target.name);
      if (now === null) {
        lost = "was deleted";
      } else if (now.dev !== this.#id.dev || now.ino !== this.#id.ino) {
        lost = "was replaced by another file";
      } else {
        // Our file, in the pinned directory. Not at the path where it was
        // linked (its directory moved away, maybe with another made in its
        // place where another run took the lock) is a loss all the same.
        const away = this.#movedAway();
        if (target.pinned.unlink(target.name) === "ENOENT") {
          lost = "was deleted";
        } else if (away) {
          lost = MOVED_AWAY;
        }
      }
    } catch (err) {
      if (errnoOf(err) === "ENOENT") {
        lost = "was deleted";
      } else {
        handle.close();
        target.pinned.close();
        throw mapError(err, this.path, "cannot remove the lock file");
      }
    }
    handle.close();
    target.pinned.close();
    if (lost !== undefined) {
      // Say what release finds now; a loss the watch had not reported yet
      // happened while held, so the signal reports it too.
      const error = new LockLostError(this.path, this.pid, lost);
      this.#lose(error);
      throw error;
    }
    // Our own file, removed, after a loss that left it in place (its
    // directory renamed and replaced, or moved away and back): exclusion
    // was broken all the same, so release says so.
    if (this.#reason !== undefined) throw this.#reason;
  }

  release(): Promise<void> {
    try {
      this.releaseSync();
      return Promise.resolve();
    } catch (err) {
      return Promise.reject(err);
    }
  }

  [Symbol.dispose](): void {
    this.releaseSync();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.release();
  }
}

interface Checked {
  timeout: number;
  mode: number;
  meta: Meta;
  record: RecordTemplate;
  checkInterval: number;
}

// The options of an acquire that passes none: checked once.
let defaults: Checked | undefined;

function checkOptions(
  options: AcquireSyncOptions | undefined,
): Checked {
  if (options === undefined) return defaults ??= check(undefined);
  return check(options);
}

function check(options: AcquireSyncOptions | undefined): Checked {
  const timeout = options?.timeout ?? 0;
  if (typeof timeout !== "number" || Number.isNaN(timeout) || timeout < 0) {
    throw new RangeError(
      `Cannot acquire the lock as 'timeout' must be a non-negative number of milliseconds: current value is ${
        String(timeout)
      }`,
    );
  }
  const mode = options?.mode ?? DEFAULT_MODE;
  if (
    typeof mode !== "number" || !Number.isInteger(mode) || mode < 0 ||
    mode > 0o777 || (mode & 0o400) === 0
  ) {
    throw new RangeError(
      `Cannot acquire the lock as 'mode' must be permission bits from 0o400 to 0o777 that let the owner read: current value is ${
        typeof mode === "number" ? `0o${mode.toString(8)}` : String(mode)
      }`,
    );
  }
  const checkInterval = options?.checkInterval ?? 1000;
  if (
    typeof checkInterval !== "number" || !Number.isFinite(checkInterval) ||
    checkInterval < 0 || checkInterval > 0x7fffffff
  ) {
    throw new RangeError(
      `Cannot acquire the lock as 'checkInterval' must be a finite number of milliseconds from 0 (never): current value is ${
        String(checkInterval)
      }`,
    );
  }
  const meta = checkMeta(options?.meta);
  // runlock run's own option (src/file/_inherit.ts): a `child=` line to fill in.
  const child =
    (options as { [CHILD_OPTION]?: unknown } | undefined)?.[CHILD_OPTION] ===
        true
      ? CHILD_LINE
      : "";
  const record = recordTemplate(identityHere() + child + metaLines(meta));
  const size = record.bytes.length;
  if (size > MAX_RECORD_BYTES) {
    const bytes = (text: string) => encoder.encode(text).length;
    const [longest, value] = Object.entries(meta).sort((a, b) =>
      bytes(b[1]) - bytes(a[1])
    )[0] ?? ["", ""];
    // The budget is the whole record's: runlock's own lines (pid, host,
    // start, and the child line of `runlock run`) count in it.
    const own = recordTemplate(identityHere() + child).bytes.length;
    const over = size - MAX_RECORD_BYTES;
    throw new RangeError(
      `Cannot acquire the lock as the record would be ${size} bytes, over ${MAX_RECORD_BYTES} (runlock's own lines take ${own}): ${
        over <= bytes(value)
          ? `shorten meta.${longest} by ${bytesOf(over)}`
          : `shorten the meta by ${
            bytesOf(over)
          } (meta.${longest} is the longest)`
      }`,
    );
  }
  return { timeout, mode, meta, record, checkInterval };
}

/** How a waiter's sleeps between two looks grow, and up to what. */
interface Sleeps {
  /** The longest sleep, in milliseconds. */
  max: number;
  /** The factor from one sleep to the next. */
  growth: number;
}

/**
 * An async waiter sleeps on the watch; its looks are the fallback for an
 * event the watch missed (so a missed event costs latency, not the
 * hand-off), and each costs a wake-up of the process (0.3 ms of CPU or
 * more on a loaded machine: 50 waiters polling every 5 ms burnt both
 * cores). Deno's watch reports a holder's close (a SIGKILLed holder's
 * descriptor closed by the kernel: IN_CLOSE_WRITE, as "access"), so there
 * the looks can be rare (`WATCHED_MAX`; `max` while no watch is armed).
 * Node's and Bun's (libuv's inotify mask, Bun's) report no close: there a
 * close watch of the file (inotify's IN_CLOSE_WRITE, IN_ATTRIB and
 * IN_MOVE_SELF, see `platform/_close_node.ts`) reports its close, unlink
 * and renames, on Linux, and the looks can be as rare; elsewhere they are
 * what finds a dead holder, and come at least every 250 ms.
 */
const ASYNC_SLEEPS: Sleeps = {
  max: p.runtime === "deno" ? 1000 : 250,
  growth: 4,
};
/**
 * Deno's watch of the lock file reports its holder's close itself (the
 * kernel's close of a dying holder's descriptor: IN_CLOSE_WRITE, as
 * "access"), so no close watch is made beside it.
 */
const FILE_WATCH_SEES_CLOSE = p.runtime === "deno";
/**
 * The longest sleep of a waiter whose watches see both a release and the
 * death of its holder (a runlock holder on this host; on Node and Bun on
 * Linux the file's close watch, on Deno the file's watch). Each
 * look costs its process 0.3-1.3 ms of CPU, most of it the wake-up itself
 * (a bare timer's costs 0.3-1.4 ms here): at one look a second, 50 waiters
 * burnt 0.75-1.2 CPU-s in 6 s, most of it in looks. The watches are checked
 * after they are armed (the file they are on is the one seen held), so the
 * first look, at once, goes straight to it; after an event the looks ramp
 * up from 1 ms again.
 */
const WATCHED_MAX = 5000;
/**
 * The longest sleep while the holder is one whose end no event reports: a
 * plain pidfile (no descriptor), an empty file under `flock(1)` (read-only:
 * no IN_CLOSE_WRITE), a holder on another host.
 */
const UNWATCHED_MAX = 250;
/**
 * The longest a waiter goes on quick looks (see `acquireSteps`) before a
 * whole probe of the file.
 */
const WHOLE_LOOK_MS = 10_000;
/** A synchronous waiter cannot watch: it looks more often. */
const SYNC_SLEEPS: Sleeps = { max: 50, growth: 2 };

/** Tells the steps that a sleep was cut short by an event. */
interface Woken {
  woken: boolean;
  /**
   * The event says the holder's file went or its holder closed it (a
   * release or a death), so the next step is the attempt itself, not a
   * look first: `false` where the event may be a new holder's file coming
   * (Deno's watch of the directory).
   */
  ended?: boolean;
  /**
   * The watches see both the file's end and its holder's close: on Node
   * and Bun on Linux, the file's close watch through inotify; on Deno, the
   * file's own (not the directory's). With a runlock holder on
   * this host, the looks then grow to `WATCHED_MAX`: they only catch what
   * the watches miss.
   */
  watched?: boolean;
}

/**
 * The whole acquire: attempt loops, and between them, while the lock is
 * held and time remains, looks of the read-only probe (no temp files, no
 * writes) until the lock looks free. Yields sleeps, each at most up to the
 * deadline (so a timeout fires on time): a first look after 1 ms (at once,
 * on the attempt's own descriptor, where the attempt saw a live runlock
 * holder of this host), then at the cap, except after a sleep that an
 * event cut short (`woken`), when they grow again from 1 ms (a holder's
 * close comes microseconds before its flock goes). `onSleep` is called
 * before each sleep to watch the file that is there now: it answers the
 * identity (`fileKey`) of the file it watches, checked after the watches
 * were armed, `""` when there is none, or `undefined` when it does not
 * watch. Closes the pinned directory unless it returns.
 */
function* acquireSteps(
  target: Target,
  { timeout, mode, record }: Checked,
  onSleep: () => string | undefined,
  sleeps: Sleeps,
  wake: Woken,
): Generator<number, Acquired, void> {
  let done = false;
  // The last look loop ended on an event (see `Woken.ended`).
  let evented = false;
  // The last attempt's descriptor of the file it saw held (see `HeldBy`).
  let kept: Handle | undefined;
  try {
    const deadline = performance.now() + timeout;
    const remaining = () => deadline - performance.now();
    // A sleep to the deadline that ran out ends the wait: timers fire up
    // to 1.6 ms before performance.now() says the time is up (Node: 124 of
    // 200 timers early, Bun 151, Deno 7), and a sleep for what was left
    // of it was one more wake-up, or two.
    let due = false;
    const expired = () => due || remaining() <= 0;
    for (;;) {
      let held: HeldBy | ContendedError;
      try {
        const outcome = yield* attemptLoop(target, mode, record);
        if ("handle" in outcome) {
          done = true;
          return outcome;
        }
        held = outcome;
      } catch (err) {
        if (
          evented && err instanceof HeldError && err.byThisProcess &&
          !expired()
        ) {
          // An attempt at once after an event met the lock just taken by
          // another waiter of this process (woken by the same event): still
          // held, as a look would have found it. Only an acquire that finds
          // this process holding the lock before it waits fails at once.
          held = { pid: err.pid, host: err.host, started: err.started };
        } else if (err instanceof ContendedError) {
          held = err;
        } else {
          throw err;
        }
      }
      kept?.close();
      kept = held instanceof ContendedError ? undefined : held.kept;
      if (expired()) {
        if (held instanceof ContendedError) throw held;
        throw new HeldError(target.path, held.pid, held.host, {
          started: held.started,
          child: held.child,
        });
      }
      // What the last whole probe saw held, for the quick looks: at first,
      // what the attempt saw, where it saw what a whole look would (a live
      // runlock holder of this host), so that the first look opens nothing
      // (on Deno an open is an event for every other waiter's watch): it
      // asks the flock of the attempt's own descriptor instead.
      let seen: Pick<Probe, "pid"> | undefined;
      let seenKey = "";
      let seenAt = 0;
      if (kept !== undefined && !(held instanceof ContendedError)) {
        seen = { pid: held.pid };
        seenKey = held.key!;
        seenAt = performance.now();
      }
      // The looks ramp up from 1 ms after an event (a holder's close comes
      // microseconds before its flock goes, so an attempt at once may still
      // find it held); otherwise, once a look has seen the holder, they go
      // straight to the cap.
      let ramp = evented;
      evented = false;
      /**
       * The first look at a holder the attempt saw: the shared flock of the
       * attempt's own descriptor, which it then closes. Whether it is free.
       */
      const lookKept = (): boolean => {
        const k = kept!;
        kept = undefined;
        try {
          return k.tryLock(false);
        } catch {
          seen = undefined; // a whole look, then
          return false;
        } finally {
          k.close();
        }
      };
      /**
       * A whole look (the read-only probe): whether the lock is no longer
       * held. Notes what it saw held for the quick looks.
       */
      const lookWhole = (): boolean => {
        const found = probe(target, target.pinned);
        if (found.state !== "held") return true;
        seen = found;
        seenAt = performance.now();
        // Whether an event will tell of this holder's end: a runlock
        // record of this host, whose holder has the file open for writing.
        // Not a dead PID under a held flock (`racing`): whoever holds the
        // flock is not the record's writer (flock(1) on a crashed run's
        // file, a taker's read-only descriptor), and its close is no
        // IN_CLOSE_WRITE.
        seenKey = found.marker && !found.far && !found.racing && found.pid > 0
          ? fileKey(target.pinned, target.name)
          : "";
        if (seenKey === "") seen = undefined;
        return false;
      };
      // The watches (their key) under which the last look was made:
      // none for the attempt, made before they were armed.
      let lookedUnder: string | undefined;
      /** The longest sleep before the next look, after one that saw `seen`. */
      const capOf = (armed: string | undefined) =>
        seen === undefined
          ? Math.min(UNWATCHED_MAX, sleeps.max)
          : armed !== undefined && wake.watched
          ? WATCHED_MAX
          : sleeps.max;
      for (let interval = 1; !expired();) {
        wake.woken = false;
        wake.ended = false;
        const armed = onSleep();
        // No file to watch (it went since the probe), or the watches are on
        // a file other than the one the last look saw held (it changed
        // before they were armed, so its event may have come and gone):
        // look again at once.
        const now = armed === "" ||
          (armed !== undefined && seen !== undefined && armed !== seenKey);
        if (kept !== undefined && armed !== undefined) {
          // The first look, now that the watches are armed (any later end
          // of the holder is an event): a holder that ended before they
          // were told no event, and its PID may still answer kill (a
          // zombie, an exec): its flock says. The attempt has just seen the
          // file at the name and its holder's PID alive, so the flock is all
          // this look asks, and the next comes at the cap: no sleep of 1 ms
          // first (each wake-up costs a process 0.3 ms of CPU or more).
          // Where no watch is armed (a Deno watch refused until a turn
          // later, or `acquireSync`), it comes after the first sleep, and
          // the watch is asked for again before the next.
          if (lookKept()) break;
          if (!now && seen !== undefined && !ramp) interval = capOf(armed);
        } else if (
          armed !== undefined && armed !== lookedUnder && !now &&
          seen !== undefined && capOf(armed) === WATCHED_MAX
        ) {
          // The watches are armed only now (a Deno watch refused until a
          // turn later), over a holder last seen by a look made before
          // them: a holder that ended in between told no event, and a
          // zombie's PID still answers kill, so the quick looks would miss
          // its end until a whole look 10 s later. As after the attempt,
          // the first look under the watches comes at once, and looks at
          // the flock: a whole look here, the attempt's descriptor being
          // closed by then.
          if (lookWhole()) break;
          if (seen !== undefined && !ramp) interval = capOf(armed);
        }
        // While the watches tell of this holder's end, the looks only cover
        // a missed event: one due less than half a sleep before the
        // deadline is left to the attempt at the deadline, which sees all a
        // look sees. One wake-up fewer (on Deno a timer of seconds is two
        // or three wake-ups, its timer wheel's steps). Where no event tells
        // (a look is what finds the holder's end), they keep their cap.
        const left = remaining();
        const sleep = now ? 0 : interval >= left ||
            (capOf(armed) === WATCHED_MAX && left - interval < interval / 2)
          ? Math.max(0, left)
          : interval;
        yield sleep;
        due = !now && sleep >= left && !wake.woken;
        // The holder's file went or was closed by its holder: attempt at
        // once. A look first would only find what the attempt finds (gone:
        // it links; stale: it takes over; still held: it says so), and it
        // costs the hand-off a cold probe (on Deno a missing file's lstat
        // throws: 0.2-0.3 ms right after a wake-up).
        if (wake.woken && wake.ended) {
          evented = true;
          break;
        }
        // The deadline: its attempt sees what a look would.
        if (due) break;
        if (kept !== undefined && lookKept()) break;
        // A quick look (lstat and kill(pid, 0), no open) while nothing woke
        // us, the file is the one seen held, under watches that tell of its
        // release and its death, and its runlock holder of this host lives:
        // the look only covers a missed event. Without such watches (none
        // armed, or one that sees no death) a holder that died a zombie,
        // or exec'd, still answers kill: only its flock tells. A
        // look that opens the file is an event for every other waiter's
        // watch on Deno (its inotify mask has IN_OPEN, which it drops only
        // after waking its watcher thread): 50 Deno waiters' looks were
        // 2,500 thread wake-ups each time round. A whole probe at least
        // every `WHOLE_LOOK_MS` still catches a PID reused after a missed
        // event.
        if (
          seen === undefined || now || wake.woken ||
          capOf(armed) !== WATCHED_MAX ||
          performance.now() - seenAt > WHOLE_LOOK_MS ||
          fileKey(target.pinned, target.name) !== seenKey ||
          liveness(seen.pid) !== "alive"
        ) {
          if (lookWhole()) break;
        }
        lookedUnder = armed;
        const cap = capOf(armed);
        if (wake.woken || now) {
          interval = 1;
          ramp = true;
        } else {
          interval = ramp ? Math.min(interval * sleeps.growth, cap) : cap;
        }
      }
    }
  } finally {
    kept?.close();
    if (!done) target.pinned.close();
  }
}

/**
 * Takes the run lock at `path`, creating missing parent directories.
 *
 * Fails at once with {@linkcode HeldError} when another live run holds it,
 * unless `timeout` says to wait, and at once when this process holds it
 * already (locks are not reentrant). A file left by a crashed run is taken
 * over silently. Never blocks a thread in `flock(2)`: waiting retries the
 * non-blocking attempt, and wakes early when the file goes away.
 *
 * The lock's directory is resolved once, here, and pinned: the lock means
 * the file it took, whatever later happens to the path (a re-pointed
 * symlink, a `chdir` after a relative path). The file lands where the
 * kernel resolves `path`, `..` and symlinked directories included.
 *
 * Permissions (Deno): `--allow-read` and `--allow-write` for the lock's
 * directory. Optional: `--allow-sys=hostname` to record the host name, and
 * `--allow-run` to judge foreign pidfiles. Never prompts.
 *
 * @param path The lock file, for example `.state/run.lock`.
 * @param options `timeout` (ms), `signal` and `mode`.
 * @returns The held {@linkcode Lock}.
 * @throws {TypeError} `path` is empty, holds a NUL, or names a directory.
 * @throws {RangeError} `timeout` or `mode` is out of range.
 * @throws {HeldError} another live run holds it (after `timeout`), or this
 * process does; also for a user who may not write the lock's directory, or
 * who finds it on a read-only mount (such a waiter waits like any other).
 * @throws {InvalidLockFileError} the file is not a lock runlock can use; it is left untouched.
 * @throws {LockPermissionError} the OS or Deno refuses access: where this
 * user may not create files in the lock's directory (or its filesystem is
 * read-only), when the lock is free, stale or unreadable, not while a live
 * run holds it.
 * @throws {UnsupportedFilesystemError} no hard links or no flock there.
 * @throws {ContendedError} every attempt lost a race; try again.
 *
 * @example Holding the lock for a block
 * ```ts
 * import { acquire, held } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const dir = await Deno.makeTempDir();
 * {
 *   await using lock = await acquire(`${dir}/.state/run.lock`);
 *   assert.equal(lock.pid, Deno.pid);
 *   assert.equal(await held(lock.path), true);
 * }
 * assert.equal(await held(`${dir}/.state/run.lock`), false);
 * await Deno.remove(dir, { recursive: true });
 * ```
 */
export async function acquire(
  path: string,
  options?: AcquireOptions,
): Promise<Lock> {
  const lp = lockPath(path, "acquire the lock");
  const checked = checkOptions(options);
  const signal = options?.signal;
  signal?.throwIfAborted();
  const target = pin(lp);
  let wake: (() => void) | undefined;
  let listener: Listener | undefined;
  const woken: Woken = { woken: false };
  // A waiter sleeps on the watch of the lock file (shared by the waiters of
  // it in this process): woken by its unlink or rename (a release unlinks
  // it) and, where the runtime reports it, by the holder's close (a dying
  // holder's descriptor is closed by the kernel). The file at the name
  // changes with each holder: the watch follows it.
  // Node and Bun on Linux: the file's own inotify watch (the close watch)
  // reports its holder's close (its death included), its unlink and its
  // renames, so no fs.watch of the file is made beside it (Bun's first
  // fs.watch costs its process 2 ms of CPU and a thread).
  let unclose: (() => void) | undefined;
  let closeKey = "";
  // Set by every event: the file may be gone, and the next holder's file
  // may have the same inode number (ext4 reuses them at once), which a
  // watch of the old one would never report. Watch anew at the next sleep.
  // (Deno refuses a watch made too soon after the last of its path closed:
  // see `Platform.watchDir`; it is asked for again at each sleep.)
  let stale = false;
  const onEvent = () => {
    stale = true;
    woken.ended = true;
    wake?.();
  };
  const watch = (): string | undefined => {
    const key = fileKey(target.pinned, target.name);
    if (key === "") return "";
    if (stale) {
      stale = false;
      closeKey = "";
      unclose?.();
      unclose = undefined;
      listener?.stop();
      listener = undefined;
    }
    if (closeKey !== key) {
      unclose?.();
      closeKey = key;
      const prefix = target.pinned.prefix;
      unclose = p.watchClose(within(prefix, target.name), onEvent, true);
    }
    if (unclose !== undefined) {
      // The close watch sees every end of this file (armed by path: it is
      // on the file there now, checked below).
      listener?.stop();
      listener = undefined;
      woken.watched = true;
      return fileKey(target.pinned, target.name) === key ? key : "";
    }
    // A watch that could not be made (Deno refuses one for a while, see
    // `Platform.watchDir`) is asked for again at each sleep.
    if (listener?.key !== key || !listener.watching()) {
      listener?.stop();
      const made = listenFile(target.pinned, target.name, onEvent);
      listener = typeof made === "object" ? made : undefined;
      if (made === "ENOENT") return "";
    }
    const watching = listener?.watching() === true;
    woken.watched = watching && FILE_WATCH_SEES_CLOSE;
    if (!watching) return undefined;
    // The watches are armed by path: on the file that is there now, which
    // may no longer be the one `key` named (or none: then no watch was
    // made, and no event will come). Checked after arming, so that any
    // later change is an event.
    return fileKey(target.pinned, target.name) === key && listener!.key === key
      ? key
      : "";
  };
  const steps = acquireSteps(
    target,
    checked,
    watch,
    ASYNC_SLEEPS,
    woken,
  );
  try {
    let step = steps.next();
    while (!step.done) {
      await new Promise<void>((resolve, reject) => {
        const done = () => {
          clearTimeout(timer);
          signal?.removeEventListener("abort", abort);
          wake = undefined;
          resolve();
        };
        const woke = () => {
          woken.woken = true;
          done();
        };
        const abort = () => {
          clearTimeout(timer);
          wake = undefined;
          reject(signal?.reason);
        };
        const timer = setTimeout(done, step.value as number);
        wake = woke;
        signal?.addEventListener("abort", abort, { once: true });
      });
      step = steps.next();
    }
    return new RunLock(target, step.value, checked.meta, checked.checkInterval);
  } finally {
    steps.return(undefined as never); // discards a temp file on abort
    listener?.stop();
    unclose?.();
  }
}

/**
 * The synchronous form of {@linkcode acquire}: same protocol, same errors.
 * With a `timeout` it blocks the thread between attempts (it never blocks
 * in `flock(2)` itself), so prefer {@linkcode acquire} where you can.
 *
 * Permissions (Deno): as for {@linkcode acquire}.
 *
 * @param path The lock file.
 * @param options `timeout` (ms) and `mode`.
 * @returns The held {@linkcode Lock}.
 * @throws {TypeError} `path` is empty, holds a NUL, or names a directory.
 * @throws {RangeError} `timeout` or `mode` is out of range.
 * @throws {HeldError} another live run holds it (after `timeout`), or this
 * process does; also for a user who may not write the lock's directory, or
 * who finds it on a read-only mount (such a waiter waits like any other).
 * @throws {InvalidLockFileError} the file is not a lock runlock can use; it is left untouched.
 * @throws {LockPermissionError} the OS or Deno refuses access: where this
 * user may not create files in the lock's directory (or its filesystem is
 * read-only), when the lock is free, stale or unreadable, not while a live
 * run holds it.
 * @throws {UnsupportedFilesystemError} no hard links or no flock there.
 * @throws {ContendedError} every attempt lost a race; try again.
 *
 * @example A second acquire in the same process is refused at once
 * ```ts
 * import { acquireSync, HeldError } from "@runlock/runlock";
 * import assert from "node:assert/strict";
 *
 * const dir = Deno.makeTempDirSync();
 * using lock = acquireSync(`${dir}/run.lock`);
 * assert.throws(
 *   () => acquireSync(lock.path, { timeout: 60_000 }),
 *   (err) => err instanceof HeldError && err.byThisProcess,
 * );
 * ```
 */
export function acquireSync(path: string, options?: AcquireSyncOptions): Lock {
  const lp = lockPath(path, "acquire the lock");
  const checked = checkOptions(options);
  const target = pin(lp);
  return new RunLock(
    target,
    runSync(
      acquireSteps(target, checked, () => undefined, SYNC_SLEEPS, {
        woken: false,
      }),
    ),
    checked.meta,
    checked.checkInterval,
  );
}
