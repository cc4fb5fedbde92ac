/**
 * One watch per directory (or file) per process, keyed by its identity,
 * refcounted, dispatching each event by name to that name's listeners:
 * 5,000 locks in one directory are one watcher. Where a watch cannot leave
 * the process free to exit (Deno), held locks get events only while a
 * waiter, which keeps it alive anyway, has the watch open.
 *
 * @module
 */

import { platform as p } from "../platform/current.ts";
import type { Dir, FileInfo } from "../platform/types.ts";
import { inodeKey, within } from "./_protocol.ts";

/** What an event tells a listener: whether its name was (re)moved or created. */
export type OnEvent = (moved: boolean) => void;

/** A registered listener; {@linkcode Listener.stop} removes it. */
export class Listener {
  entry: Entry | undefined;

  constructor(
    readonly name: string,
    readonly onEvent: OnEvent,
    readonly keepAlive: boolean,
    /** The watched path, through the pinned directory (valid while pinned). */
    readonly path: string,
    /** The watched file's or directory's identity (`dev:ino`). */
    readonly key: string,
  ) {}

  /** Whether the watch this listener is on is open (events will come). */
  watching(): boolean {
    return this.entry?.close !== undefined;
  }

  /** Removes the listener, closing the watch if it was the last. */
  stop(): void {
    const entry = this.entry;
    if (entry === undefined) return;
    this.entry = undefined;
    entry.remove(this);
  }
}

/** The watch of one directory. */
class Entry {
  readonly byName = new Map<string, Set<Listener>>();
  count = 0;
  /** Listeners that let the watch keep the process alive. */
  alive = 0;
  /** The open watch, and whether it keeps the process alive. */
  close: (() => void) | undefined;
  closeKeepsAlive = false;
  /** An unref'd watch was refused here (Deno): do not ask again. */
  unrefRefused = false;

  constructor(readonly key: string) {}

  add(listener: Listener): void {
    let set = this.byName.get(listener.name);
    if (set === undefined) {
      set = new Set();
      this.byName.set(listener.name, set);
    }
    set.add(listener);
    listener.entry = this;
    this.count++;
    if (listener.keepAlive) this.alive++;
    this.open(listener.path);
  }

  remove(listener: Listener): void {
    const set = this.byName.get(listener.name);
    if (set === undefined || !set.delete(listener)) return;
    if (set.size === 0) this.byName.delete(listener.name);
    this.count--;
    if (listener.keepAlive) this.alive--;
    if (this.count === 0) {
      this.shut();
      if (entries.get(this.key) === this) entries.delete(this.key);
    } else if (this.alive === 0 && this.closeKeepsAlive) {
      // Only listeners that must not keep the process alive are left.
      this.shut();
      const [some] = this.byName.values();
      const [left] = some;
      this.open(left.path);
    }
  }

  /**
   * Opens the watch if none is open, through a live listener's `prefix` (a
   * `/proc/self/fd/N` names the directory only while that descriptor is open).
   */
  open(prefix: string): void {
    if (this.close !== undefined) return;
    const dispatch = (name: string, moved: boolean) => {
      // "": the watch lost events: every listener looks again (not moved).
      const sets = name === "" ? [...this.byName.values()] : [
        this.byName.get(name),
      ];
      for (const set of sets) {
        for (const listener of set ?? []) {
          try {
            listener.onEvent(moved);
          } catch {
            // One listener's failure is not another's.
          }
        }
      }
    };
    if (!this.unrefRefused) {
      this.close = p.watchDir(prefix, dispatch, false);
      if (this.close !== undefined) return;
      this.unrefRefused = true;
    }
    if (this.alive > 0) {
      this.close = p.watchDir(prefix, dispatch, true);
      this.closeKeepsAlive = this.close !== undefined;
    }
  }

  shut(): void {
    const close = this.close;
    this.close = undefined;
    this.closeKeepsAlive = false;
    close?.();
  }
}

const entries = new Map<string, Entry>();

/**
 * Calls `onEvent` on each event of `dir`'s watch on `name`, until stopped.
 * `keepAlive`: a watch that keeps the process alive may serve the caller.
 * `undefined` when the directory's identity cannot be read (the caller polls).
 */
export function listen(
  dir: Dir,
  name: string,
  onEvent: OnEvent,
  keepAlive: boolean,
): Listener | undefined {
  let self;
  try {
    self = dir.lstat(".");
  } catch {
    return undefined;
  }
  if (self === null) return undefined;
  return join(inodeKey(self), dir.prefix, name, onEvent, keepAlive);
}

/**
 * Calls `onEvent` on each event of the file `name` (its inode now): unlink,
 * rename, last close and (Deno) a writer's close. A waiter watches the file,
 * not the directory, whose events include every waiter's temp files.
 * `"ENOENT"`: no file there; `undefined`: cannot watch (the caller polls).
 */
export function listenFile(
  dir: Dir,
  name: string,
  onEvent: OnEvent,
): Listener | "ENOENT" | undefined {
  let file;
  try {
    file = dir.lstat(name);
  } catch {
    return undefined;
  }
  if (file === null) return "ENOENT";
  return join(
    fileWatchKey(file),
    within(dir.prefix, name),
    name,
    onEvent,
    true,
  );
}

/** The key of a file's watch: its identity, apart from directories'. */
export function fileWatchKey(file: FileInfo): string {
  return "f" + inodeKey(file);
}

/** The identity `listenFile` would watch for `name` now, or `""`. */
export function fileKey(dir: Dir, name: string): string {
  try {
    const file = dir.lstat(name);
    return file === null ? "" : fileWatchKey(file);
  } catch {
    return "";
  }
}

function join(
  key: string,
  path: string,
  name: string,
  onEvent: OnEvent,
  keepAlive: boolean,
): Listener {
  let entry = entries.get(key);
  if (entry === undefined) {
    entry = new Entry(key);
    entries.set(key, entry);
  }
  const listener = new Listener(name, onEvent, keepAlive, path, key);
  entry.add(listener);
  return listener;
}
