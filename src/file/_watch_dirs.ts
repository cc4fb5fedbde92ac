/**
 * {@linkcode watch}'s tree of directory watches, and the re-scan.
 *
 * @module
 */

import { dirError } from "./_error_map.ts";
import { within } from "./_protocol.ts";
import {
  lockEntries,
  lstatOf,
  type Skipped,
  walk,
  type Walked,
} from "./_listing.ts";
import { platform as p } from "../platform/current.ts";
import { type FileInfo, SysError } from "../platform/types.ts";
import { flockFree, keyOf } from "./_watch_run.ts";
import type { Paths } from "./_watch_paths.ts";
import type { Rescans } from "./_watch_rescan.ts";
import type { DirWatch } from "./_watch_types.ts";

/** What the directory watches tell the watch they belong to. */
export interface DirsHost {
  /** An event of `d`'s watch (see `Platform.watchDir`). */
  onEvent(d: DirWatch, name: string, moved: boolean): void;
  /** The top directory is gone (its runs' ends are being looked for). */
  topGone(): void;
}

/** The directories one watch watches. */
export class Dirs {
  top: DirWatch | undefined;
  readonly #all = new Set<DirWatch>();
  #closed = false;
  /** What was reported to onSkip: each once per watch (at most 4,096). */
  readonly #skipped = new Set<string>();

  constructor(
    readonly recursive: boolean,
    readonly onSkip: ((skipped: Skipped) => void) | undefined,
    readonly paths: Paths,
    readonly rescans: Rescans,
    readonly host: DirsHost,
  ) {}

  /**
   * Tells onSkip, once per watch. Its throw is rethrown on its own, as an
   * event listener's is: the watch goes on.
   */
  readonly #skip = (skipped: Skipped): void => {
    if (this.onSkip === undefined) return;
    const key = `${skipped.reason}\0${skipped.path}`;
    if (this.#skipped.has(key) || this.#skipped.size >= 4096) return;
    this.#skipped.add(key);
    try {
      this.onSkip({ ...skipped });
    } catch (err) {
      queueMicrotask(() => {
        throw err;
      });
    }
  };

  /** Checks and watches the top directory `dir` (the first next()). */
  openTop(dir: string): void {
    let key: string;
    let real: string;
    try {
      const self = pinnedSelf(dir);
      // Deno's ops pin a file as well (its first create would fail).
      if (self !== null && self.kind !== "directory") {
        throw new SysError("ENOTDIR", "open", "not a directory");
      }
      key = keyOf(self);
      real = p.realDir(dir) || dir;
    } catch (err) {
      throw dirError(err, dir, "watch");
    }
    this.top = this.#watch(dir, key, real);
  }

  /** The entries under the top directory; subdirectories watched first. */
  walkTop(): Generator<Walked<DirWatch>> {
    const top = this.top!;
    return walk(
      top,
      this.recursive ? (d, name) => this.#child(d, name) : undefined,
      this.#skip,
      (err) => dirError(err, top.path, "watch"),
    );
  }

  /** Frees every watch; none is made after. */
  close(): void {
    this.#closed = true;
    for (const d of this.#all) {
      d.dropped = true;
      d.close?.();
      d.close = undefined;
    }
    this.#all.clear();
  }

  /** Watches `path` (before it is listed, so nothing falls in between). */
  #watch(path: string, key: string, real: string): DirWatch {
    const d: DirWatch = {
      path,
      key,
      real,
      close: undefined,
      children: new Map(),
      runs: new Set(),
      others: new Set(),
      dropped: false,
    };
    this.#arm(d);
    this.rescans.watched();
    this.#all.add(d);
    return d;
  }

  #arm(d: DirWatch): void {
    const onEvent = (name: string, moved: boolean) =>
      this.host.onEvent(d, name, moved);
    d.close = p.watchDir(d.path, onEvent, false) ??
      p.watchDir(d.path, onEvent, true);
    if (d.close === undefined) this.rescans.poll(false);
  }

  /** Watches subdirectory `name` of `d`; `undefined` if it cannot. */
  #child(d: DirWatch, name: string): DirWatch | undefined {
    // An onSkip may end the watch in the middle of a listing.
    if (this.#closed) return undefined;
    const path = within(d.path, name);
    const info = lstatOf(path);
    if (info === null || info.kind !== "directory") return undefined;
    const child = this.#watch(path, keyOf(info), path);
    // Gone, or another directory, since the lstat: the next event says.
    if (keyOf(lstatOf(path)) !== child.key) {
      this.#drop(child);
      return undefined;
    }
    d.children.set(name, child);
    return child;
  }

  /** A subdirectory that appeared (or came back): its runs are new. */
  #add(d: DirWatch, name: string): void {
    const child = this.#child(d, name);
    if (child === undefined) return;
    const walked = walk(
      child,
      (c, sub) => this.#child(c, sub),
      this.#skip,
      () => undefined,
    );
    for (const { dir, path, kind } of walked) {
      if (kind === "file") this.paths.settle(path, dir, false);
    }
  }

  /**
   * Watches `d` anew after its name moved while its identity stayed: the
   * old watch went deaf (a directory made again with its inode number, on
   * every runtime; renamed away and back, Deno 2.9.6). The re-scan finds
   * what came in between.
   */
  #rearm(d: DirWatch): void {
    // Its subdirectories' watches go deaf with it.
    for (const child of d.children.values()) this.#rearm(child);
    if (d.close === undefined) return;
    const close = d.close;
    d.close = undefined;
    close();
    // A timer's turn after the close, which Deno processes after this one.
    p.unrefLater(() => {
      if (!d.dropped && d.close === undefined) this.#arm(d);
    }, 5);
  }

  /** A directory gone from its path: its runs' ends are looked for. */
  #drop(d: DirWatch): void {
    if (d.dropped) return;
    d.dropped = true;
    d.close?.();
    d.close = undefined;
    this.#all.delete(d);
    for (const child of d.children.values()) this.#drop(child);
    d.children.clear();
    for (const path of [...d.runs]) this.paths.settle(path, d, false);
    if (d === this.top) this.host.topGone();
  }

  /** Whether `d` is still the directory at its path; drops it if not. */
  check(d: DirWatch): boolean {
    if (d.dropped) return false;
    if (dirKeyOf(d.real) === d.key) return true;
    this.#drop(d);
    return false;
  }

  /** Checks every directory watched. */
  checkAll(): void {
    for (const d of [...this.#all]) this.check(d);
  }

  /** An event named `path` in `d` (`closed`: maybe a holder's close). */
  changed(path: string, d: DirWatch, closed: boolean): void {
    if (d.dropped) return;
    const name = path.slice(path.lastIndexOf("/") + 1);
    d.others.delete(name);
    if (this.recursive) {
      const info = lstatOf(path);
      const child = d.children.get(name);
      if (info?.kind === "directory") {
        if (child === undefined || child.key !== keyOf(info)) {
          if (child !== undefined) this.#drop(child);
          d.children.delete(name);
          this.#add(d, name);
        } else if (!closed) this.#rearm(child);
        if (!this.paths.runs.has(path)) return;
      } else if (child !== undefined) {
        d.children.delete(name);
        this.#drop(child);
      }
    }
    this.paths.settle(path, d, closed);
  }

  /**
   * Lists every watched directory and looks again at each name that differs
   * from what was reported, and at each held run whose flock is free.
   */
  rescan(): void {
    for (const d of [...this.#all]) {
      if (!this.check(d)) continue;
      let entries;
      try {
        entries = p.readDirKinds(d.path);
      } catch {
        continue;
      }
      const names = new Set<string>();
      for (const { name } of entries) names.add(name);
      for (
        const { name, kind } of lockEntries(d.path, entries, this.#skip)
      ) {
        const path = within(d.path, name);
        if (kind === "directory") {
          if (!this.recursive) continue;
          const child = d.children.get(name);
          // Another directory at the name: its check dropped the old one.
          if (child !== undefined && this.check(child)) continue;
          d.children.delete(name);
          this.#add(d, name);
          continue;
        }
        const run = this.paths.runs.get(path);
        if (run === undefined) {
          if (!d.others.has(name)) this.paths.settle(path, d, false);
        } else if (run.fd !== undefined && flockFree(run.fd)) {
          this.paths.settle(path, d, true);
        } else if (run.fd === undefined && run.state === "held") {
          this.paths.settle(path, d, false);
        }
      }
      for (const name of d.others) if (!names.has(name)) d.others.delete(name);
      for (const path of [...d.runs]) {
        if (!names.has(path.slice(path.lastIndexOf("/") + 1))) {
          this.paths.settle(path, d, false);
        }
      }
      for (const [name, child] of d.children) {
        if (!names.has(name)) {
          d.children.delete(name);
          this.#drop(child);
        }
      }
    }
  }
}

/**
 * The identity of the directory at `real` (`""`: none; a file in its place
 * may get its inode number). By lstat, else (Deno allowed to read the
 * directory only) by opening it.
 */
function dirKeyOf(real: string): string {
  const dir = (info: FileInfo | null) =>
    info?.kind === "directory" ? keyOf(info) : "";
  try {
    return dir(p.lstat(real));
  } catch {
    try {
      return dir(pinnedSelf(real));
    } catch {
      return "";
    }
  }
}

/** The directory at `path` as it sees itself: pinned, then `lstat(".")`. */
function pinnedSelf(path: string): FileInfo | null {
  const pinned = p.openDir(path);
  try {
    return pinned.lstat(".");
  } finally {
    pinned.close();
  }
}
