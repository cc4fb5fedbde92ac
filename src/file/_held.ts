/**
 * The held lock: release, and loss found while held (PROTOCOL.md, "Release"
 * and "Loss while held").
 *
 * @module
 */

import { mapError } from "./_error_map.ts";
import { heldHere } from "./_liveness.ts";
import {
  type Acquired,
  errnoOf,
  sameFile,
  type Target,
  within,
} from "./_protocol.ts";
import { tempName } from "./_temp_name.ts";
import { DESCRIPTOR, type Descriptor, NAME_CHILD } from "./_inherit.ts";
import { probe } from "./_probe.ts";
import { every, type Tick } from "./_timer.ts";
import { listen, type Listener } from "./_events.ts";
import { CHILD_LINE, childDigits, MAX_RECORD_BYTES } from "./record.ts";
import type { Lock } from "./types.ts";
import { LockLostError } from "../errors.ts";
import type { Meta } from "../meta.ts";
import { platform as p } from "../platform/current.ts";
import type { FileInfo, Handle } from "../platform/types.ts";

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

/** A held lock; it keeps the pinned directory open until release. */
export class RunLock implements Lock {
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
  /** Until the watch reports it, events are of what came before (`#mark`). */
  #marker: Listener | undefined;

  /** The descriptor that holds the flock, for `runlock run` (`_inherit.ts`). */
  [DESCRIPTOR](): Descriptor | undefined {
    if (this.#handle === undefined) return undefined;
    return { fd: this.#handle.fd(), dev: this.#id.dev, ino: this.#id.ino };
  }

  /** Writes `pid` into the record's reserved `child=` line (`CHILD_LINE`). */
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
    // A path no chdir or re-pointed symlink changes: release() finds a
    // directory moved away before any check.
    if (acquired.dir) this.#named = within(acquired.dir, target.name);
    if (checkInterval === 0) return; // only release() finds a loss
    // The first tick starts the watch once the event loop turns: a lock
    // taken and released synchronously pays for no watch and no timer.
    this.#tick = every(checkInterval, () => this.#onTick());
  }

  /**
   * Remembers, once, where the file is now, by a path that names the pinned
   * directory itself (one read after a re-pointed symlink or a chdir would
   * report a false loss).
   */
  #nameIt(): void {
    const pinned = this.#target.pinned;
    if (this.#named !== undefined || !pinned.byDescriptor) return;
    const dir = p.realDir(pinned.prefix);
    if (dir === "") return;
    try {
      const here = pinned.lstat(".");
      const there = p.lstat(dir);
      if (here === null || !sameFile(there, here)) {
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
        // After the marker, an event on our name is a loss even if the file
        // is back by the time we look.
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
   * Makes and removes a temp-named marker beside the lock: a watch reports
   * events in order, so every event on our name after the marker's is news.
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
      done(); // no marker: every (re)move event counts
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
    // The name first: a file replaced between the reads shows as replaced.
    const named = this.#readNamed();
    const now = this.#target.pinned.lstat(this.#target.name);
    if (sameFile(now, this.#id)) {
      if (this.#moved) {
        return new LockLostError(
          this.path,
          this.pid,
          "was moved away and back (another run may have held the lock meanwhile)",
        );
      }
      if (named === undefined || sameFile(named, this.#id)) return undefined;
      return new LockLostError(this.path, this.pid, MOVED_AWAY);
    }
    if (now === null) {
      return new LockLostError(this.path, this.pid, "was deleted");
    }
    let holder: { pid: number; host: string } | undefined;
    // Who holds it now is a courtesy, not worth a probe that could block (a
    // FIFO swapped in, where open has no O_NONBLOCK).
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

  /**
   * Reports a loss to the signal. Whether the file is still ours: false also
   * after a failed `lstat`, which proves nothing (the next check looks again).
   */
  #check(): boolean {
    if (this.#handle === undefined || this.#reason !== undefined) return false;
    let loss: LockLostError | undefined;
    try {
      loss = this.#loss();
    } catch {
      return false;
    }
    if (loss === undefined) return true;
    this.#stopWatching();
    this.#lose(loss);
    return false;
  }

  get released(): boolean {
    return this.#handle === undefined;
  }

  isOwned(): boolean {
    if (this.#handle === undefined || this.#reason !== undefined) return false;
    try {
      this.#nameIt(); // before the first check, the first call names it
    } catch {
      return false;
    }
    return this.#check();
  }

  /** `lstat` of `#named`; undefined when none or failed (proves nothing). */
  #readNamed(): FileInfo | null | undefined {
    if (!this.#named) return undefined;
    try {
      return p.lstat(this.#named);
    } catch {
      return undefined;
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
      // Unlink first, unlock second (PROTOCOL.md, "Release").
      const now = target.pinned.lstat(target.name);
      if (now === null) {
        lost = "was deleted";
      } else if (!sameFile(now, this.#id)) {
        lost = "was replaced by another file";
      } else {
        // Ours, but its directory moved away from where it was linked.
        const named = this.#readNamed();
        const away = named !== undefined && !sameFile(named, this.#id);
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
      // A loss no check had reported: the signal reports it too.
      const error = new LockLostError(this.path, this.pid, lost);
      this.#lose(error);
      throw error;
    }
    // A loss that left our file in place still broke exclusion.
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
