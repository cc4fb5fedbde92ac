/**
 * Deno's watches over `Deno.watchFs`, where libc's inotify cannot serve.
 * Facts of Deno 2.9.6:
 *
 * - Each event goes to every `FsWatcher`, dropped where its queue of 16 is
 *   full: over 73 directories, 8 runs at a time, one watcher each reached
 *   `watch()` for 48-56 runs of 300, one for all 300. So directories share
 *   one watcher; a file has its own (a path leaves only with its watcher).
 * - A path is armed only while its count of watchers is 0, and a closed
 *   watcher's counts drop a turn later (a re-watch in the same turn of a
 *   replaced file saw 0 events of 3). So a new watcher opens before the
 *   old closes; a path naming another directory now is re-armed a turn
 *   after the close, its listeners told of a lapse; and a file's watch is
 *   refused while one on another identity is open, and for a turn after
 *   (ext4 reuses a freed inode number).
 *
 * @module
 */

import { tell } from "./_inotify.ts";

/** Told an entry's name when it changes; `""`: events may have been lost. */
export type Listener = (name: string, moved: boolean) => void;

/**
 * Calls `listener` with the name of each entry of directory `dir` that
 * changes, or with the file's own name for a file, until the returned
 * function is called; `undefined` where no watch can be armed now.
 */
export function watchPath(
  dir: string,
  listener: Listener,
): (() => void) | undefined {
  let path = dir;
  let key = identityOf(dir);
  if (key.startsWith("l") || key.startsWith("d")) {
    // By its real path: Deno keeps one inotify watch per inode and counts
    // paths, so closing a symlink's watch silenced every other for good.
    try {
      const real = Deno.realPathSync(dir);
      const k = identityOf(real);
      if (k.startsWith("d")) [path, key] = [real, k];
    } catch {
      // Watched as given.
    }
  }
  return key.startsWith("d")
    ? dirs.watch(path, key, listener)
    : watchFile(path, key, listener);
}

interface DirEntry {
  /** The identity (`d` and `dev:ino`) the path was armed on; `""`: gone. */
  key: string;
  readonly listeners: Set<Listener>;
}

class Directories {
  /**
   * Every path in the current watcher, with its listeners (none: the path
   * stays until a re-arm, as a path cannot leave a watcher alone).
   */
  readonly #entries = new Map<string, DirEntry>();
  /** How many entries have listeners. */
  #live = 0;
  #current: Deno.FsWatcher | undefined;
  /** A re-arm is waiting for its timer's turn. */
  #rearming = false;
  /** The paths of a watcher closed in this turn, and their identities. */
  readonly #closed = new Map<string, string>();

  watch(
    path: string,
    key: string,
    listener: Listener,
  ): (() => void) | undefined {
    let entry = this.#entries.get(path);
    if (entry === undefined) {
      entry = { key, listeners: new Set() };
      this.#entries.set(path, entry);
      if (this.#rearming) {
        // Armed with the rest, and told of the lapse.
      } else if (
        (this.#closed.get(path) ?? key) !== key ||
        this.#entries.size - this.#live > Math.max(16, this.#live)
      ) {
        // The path names another directory than the one whose watch has
        // yet to drop; or paths without listeners outnumber those with.
        this.#rearm();
      } else {
        try {
          this.#open();
        } catch {
          this.#entries.delete(path);
          return undefined;
        }
      }
    } else if (entry.key !== key || this.#current === undefined) {
      // Another directory now (the inotify watch is the old one's), or no
      // watcher after a failed re-arm.
      entry.key = key;
      this.#rearm();
    }
    if (entry.listeners.size === 0) this.#live++;
    entry.listeners.add(listener);
    const own = entry;
    let closed = false;
    return () => {
      if (closed) return;
      closed = true;
      own.listeners.delete(listener);
      if (own.listeners.size > 0 || this.#entries.get(path) !== own) return;
      if (--this.#live > 0) return;
      // No listener is left: nothing may keep the process alive.
      for (const [p, e] of this.#entries) this.#closed.set(p, e.key);
      Deno.unrefTimer(setTimeout(() => this.#closed.clear(), 0));
      this.#entries.clear();
      this.#shut();
    };
  }

  /** Opens a watcher over every path, then closes the one it replaces. */
  #open(): void {
    const paths = [...this.#entries.keys()];
    const watcher = Deno.watchFs(paths, { recursive: false });
    const old = this.#current;
    this.#current = watcher;
    this.#read(watcher);
    // The old one's queued events are read in the meantime.
    if (old !== undefined) setTimeout(() => close(old), 0);
  }

  /**
   * Re-arms the paths with listeners from nothing, after a timer's turn,
   * and tells their listeners that events may have been lost.
   */
  #rearm(): void {
    if (this.#rearming) return;
    this.#rearming = true;
    this.#shut();
    setTimeout(() => {
      this.#rearming = false;
      this.#live = 0;
      for (const [path, entry] of this.#entries) {
        entry.key = identityOf(path);
        if (entry.listeners.size === 0 || !entry.key.startsWith("d")) {
          // Gone: its listeners learn of it from its parent's watch.
          this.#entries.delete(path);
        } else this.#live++;
      }
      if (this.#entries.size > 0) {
        try {
          this.#open();
        } catch {
          // A path went meanwhile: the next watch asked for re-arms.
        }
      }
      this.#lapse();
    }, 0);
  }

  #shut(): void {
    const old = this.#current;
    this.#current = undefined;
    if (old !== undefined) close(old);
  }

  /** Tells every listener that events may have been lost. */
  #lapse(): void {
    for (const entry of this.#entries.values()) {
      for (const listener of entry.listeners) tell(listener, "", false);
    }
  }

  /** Hands `watcher`'s events to their listeners until it ends. */
  #read(watcher: Deno.FsWatcher): void {
    (async () => {
      try {
        for await (const event of watcher) {
          if (event.flag === "rescan") {
            this.#lapse();
            continue;
          }
          for (const path of event.paths) this.#dispatch(path, event.kind);
        }
      } catch {
        // Closed, or failed.
      }
      // Ended, not by a close of ours.
      if (watcher === this.#current) {
        this.#current = undefined;
        this.#rearm();
      }
    })();
  }

  /**
   * Hands an event at `path` to the listeners of its directory, and to
   * those of `path` itself (a watched directory's own removal or rename).
   */
  #dispatch(path: string, kind: Deno.FsEvent["kind"]): void {
    const moved = kind !== "modify" && kind !== "access";
    const slash = path.lastIndexOf("/");
    const name = path.slice(slash + 1);
    const self = this.#entries.get(path);
    if (self !== undefined) {
      for (const listener of self.listeners) tell(listener, name, moved);
      // Removed (a directory made at once at the path may get its inode
      // number), or renamed (a subdirectory renamed away and back was deaf
      // after, on 2.9.6): the next watch of the path re-arms it.
      if (kind === "rename" || kind === "remove") self.key = "";
    }
    const dir = this.#entries.get(slash === 0 ? "/" : path.slice(0, slash));
    if (dir === undefined) return;
    for (const listener of dir.listeners) tell(listener, name, moved);
  }
}

const dirs = new Directories();

const watchedFiles = new Map<string, { key: string; open: number }>();
const closedThisTurn = new Map<string, string>();
let clearing = false;

function watchFile(
  path: string,
  key: string,
  listener: Listener,
): (() => void) | undefined {
  const armedKey = watchedFiles.get(path)?.key;
  if (armedKey !== undefined && armedKey !== key) return undefined;
  if (closedThisTurn.has(path)) return undefined;
  let watcher: Deno.FsWatcher;
  try {
    watcher = Deno.watchFs(path, { recursive: false });
  } catch {
    return undefined;
  }
  const entry = watchedFiles.get(path);
  if (entry === undefined) watchedFiles.set(path, { key, open: 1 });
  else entry.open++;
  (async () => {
    try {
      for await (const event of watcher) {
        if (event.flag === "rescan") {
          tell(listener, "", false);
          continue;
        }
        const moved = event.kind !== "modify" && event.kind !== "access";
        for (const p of event.paths) {
          tell(listener, p.slice(p.lastIndexOf("/") + 1), moved);
        }
      }
    } catch {
      // Closed or failed: the caller keeps looking.
    }
  })();
  let closed = false;
  return () => {
    if (closed) return;
    closed = true;
    const entry = watchedFiles.get(path);
    if (entry !== undefined && --entry.open === 0) {
      watchedFiles.delete(path);
      closedThisTurn.set(path, entry.key);
    }
    if (!clearing) {
      clearing = true;
      Deno.unrefTimer(setTimeout(() => {
        clearing = false;
        closedThisTurn.clear();
      }, 0));
    }
    close(watcher);
  };
}

function close(watcher: Deno.FsWatcher): void {
  try {
    watcher.close();
  } catch {
    // Already closed.
  }
}

/**
 * The identity of the directory at `path` now (`d` and `dev:ino`), of a
 * symlink (`l`...), of another file (`f`...), or `""`.
 */
function identityOf(path: string): string {
  try {
    const s = Deno.lstatSync(path);
    const kind = s.isDirectory ? "d" : s.isSymlink ? "l" : "f";
    return `${kind}${s.dev}:${s.ino}`;
  } catch {
    return "";
  }
}
