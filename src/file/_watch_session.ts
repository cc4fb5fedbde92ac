/**
 * One {@linkcode watch} iteration: the async iterator protocol, the
 * directory watches and their events, and the re-scan. The runs and the
 * decision of each change are `src/file/_watch_paths.ts`'s; `src/file/watch.ts` has
 * the contract.
 *
 * @module
 */

import { dirError } from "./_error_map.ts";
import { within } from "./_protocol.ts";
import {
  isTempName,
  stemMayBeCut,
  stemOfTemp,
  tempStem,
} from "./_temp_name.ts";
import { lockEntries, type Skipped } from "./_listing.ts";
import { RACING_SLEEPS } from "./_probe.ts";
import { platform as p } from "../platform/current.ts";
import { type FileInfo, SysError } from "../platform/types.ts";
import type { Inspection } from "./probes.ts";
import { flockFree, keyOf, look, lstatOf } from "./_watch_run.ts";
import { type Host, Paths, sleep } from "./_watch_paths.ts";
import type { Change, ChangeKind, DirWatch } from "./_watch_types.ts";

/** After events, a re-scan (ms) to catch what the watch may have dropped. */
const RECHECK_FIRST_MS = 250;
const RECHECK_MS = 1000;
/** The re-scan's period where there is no watch to wait for (ms). */
const POLL_MS = 1000;
/**
 * The period of the periodic passes where every directory is watched
 * (Deno's) once the watch has been quiet for {@linkcode QUIET_MS} (ms):
 * every second while events come.
 */
const QUIET_POLL_MS = 5000;
const QUIET_MS = 10_000;
/**
 * The period of the looks at each directory (one `lstat`) where they are
 * the only periodic pass (Deno 2.9 and later), once quiet (ms). Each pass
 * is a wake-up of the process, which costs Deno 0.3-0.4 ms of CPU: every
 * 5 s, an idle watch of 1,000 held runs added 0.09 ms a second (0.11 with
 * the 60 s re-scan).
 */
const QUIET_LOOK_MS = 10_000;
/**
 * Where the directory watch may go deaf unsaid (Deno: one inotify watch per
 * inode for the process; a watch of a directory renamed away and back, or
 * of one inode under two paths, reports nothing more), a re-scan at least
 * this often (ms), so that such a watch costs latency, not a change.
 */
const BACKSTOP_MS = 60_000;

/** One iteration of a watch. */
export class Session implements AsyncIterableIterator<Change[]> {
  readonly #dir: string;
  readonly #recursive: boolean;
  readonly #signal: AbortSignal | undefined;
  #phase: "new" | "starting" | "open" | "ending" | "done" = "new";
  #queue: Change[] = [];
  #waiter: ((r: IteratorResult<Change[]>) => void) | undefined;
  #failure: ((err: unknown) => void) | undefined;
  #keep: ReturnType<typeof setInterval> | undefined;
  #top: DirWatch | undefined;
  readonly #dirs = new Set<DirWatch>();
  /** Paths named by events, with their directory and whether to expect a close. */
  readonly #dirty = new Map<string, { d: DirWatch; closed: boolean }>();
  readonly #dirtyDirs = new Set<DirWatch>();
  #flushing: (() => void) | undefined;
  #delivering: (() => void) | undefined;
  #recheck: (() => void) | undefined;
  /** When the pending re-scan or look is due (performance.now()). */
  #recheckAt = 0;
  #eventsSince = false;
  /** Something cannot be watched (a directory, or a holder's close): poll. */
  #poll = false;
  /** The watch may lose events unsaid: re-scan periodically too. */
  #safety = false;
  /** The watch may miss its directory's removal: look at it periodically. */
  #blind = false;
  /** A re-scan has seen no new events since the last event. */
  #scanned = true;
  /** When the last re-scan ran (performance.now()). */
  #lastScan = performance.now();
  /** The last event's time; the watch's start before any (quiet after). */
  #lastEvent = performance.now();
  #last: Promise<unknown> = Promise.resolve();
  readonly #onAbort = () => this.#shutdown();
  readonly #paths: Paths;

  readonly #onSkip: ((skipped: Skipped) => void) | undefined;
  /** What was reported to onSkip: each once per watch (at most 4,096). */
  readonly #skipped = new Set<string>();

  constructor(
    dir: string,
    recursive: boolean,
    signal: AbortSignal | undefined,
    onSkip?: (skipped: Skipped) => void,
  ) {
    this.#onSkip = onSkip;
    this.#dir = dir;
    this.#recursive = recursive;
    this.#signal = signal;
    const phase = () => this.#phase;
    const host: Host = {
      get done() {
        return phase() === "done";
      },
      push: (path, kind, info) => this.#push(path, kind, info),
      deliver: () => this.#deliver(),
      poll: () => {
        if (this.#poll) return;
        this.#poll = true;
        if (this.#phase === "open") this.#scheduleRecheck(POLL_MS);
      },
      idle: () => this.#maybeEnd(),
    };
    this.#paths = new Paths(host);
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  next(): Promise<IteratorResult<Change[]>> {
    // One next() at a time: a second waits for the first.
    const result = this.#last.then(() => this.#next(), () => this.#next());
    this.#last = result.catch(() => {});
    return result;
  }

  return(): Promise<IteratorResult<Change[]>> {
    // Left by its consumer: nothing more, not even what was found already.
    this.#queue.length = 0;
    this.#shutdown();
    return Promise.resolve({ value: undefined, done: true });
  }

  #next(): Promise<IteratorResult<Change[]>> {
    if (this.#phase === "new") {
      this.#phase = "starting";
      if (this.#signal?.aborted) {
        this.#shutdown();
      } else {
        this.#signal?.addEventListener("abort", this.#onAbort, { once: true });
        try {
          this.#openTop();
        } catch (err) {
          this.#shutdown();
          return Promise.reject(err);
        }
      }
    }
    if (this.#queue.length > 0 && this.#phase !== "starting") {
      return Promise.resolve({ value: this.#queue.splice(0), done: false });
    }
    if (this.#phase === "done") {
      return Promise.resolve({ value: undefined, done: true });
    }
    return new Promise((resolve, reject) => {
      this.#waiter = resolve;
      this.#failure = reject;
      // An awaited watch keeps the process alive, as an awaited read does;
      // the watches themselves never do (where the runtime lets them not).
      this.#keep ??= setInterval(() => {}, 1 << 30);
      if (this.#phase === "starting" && this.#top !== undefined) {
        this.#begin().catch((err) => this.#fail(err));
      } else {
        this.#deliver();
      }
    });
  }

  /** Resolves the waiting next() with the changes queued, or the end. */
  #deliver(): void {
    const resolve = this.#waiter;
    if (resolve === undefined || this.#phase === "starting") return;
    if (this.#queue.length > 0) {
      this.#settleWaiter();
      resolve({ value: this.#queue.splice(0), done: false });
    } else if (this.#phase === "done") {
      this.#settleWaiter();
      resolve({ value: undefined, done: true });
    }
  }

  #fail(err: unknown): void {
    const reject = this.#failure;
    this.#shutdown();
    this.#settleWaiter();
    reject?.(err);
  }

  #settleWaiter(): void {
    this.#waiter = undefined;
    this.#failure = undefined;
    if (this.#keep !== undefined) clearInterval(this.#keep);
    this.#keep = undefined;
  }

  #push(path: string, kind: ChangeKind, info: Inspection): void {
    this.#queue.push({ path, kind, inspection: info });
    // Changes found after a wait go out once the event loop turns, with
    // whatever else was found meanwhile.
    this.#delivering ??= p.unrefLater(() => {
      this.#delivering = undefined;
      this.#deliver();
    }, 0);
  }

  /** Frees every watch, descriptor and timer; the iteration ends. */
  #shutdown(): void {
    if (this.#phase === "done") return;
    this.#phase = "done";
    this.#signal?.removeEventListener("abort", this.#onAbort);
    for (const d of this.#dirs) {
      d.dropped = true;
      d.close?.();
      d.close = undefined;
    }
    this.#dirs.clear();
    for (const run of this.#paths.runs.values()) this.#paths.untrack(run);
    this.#flushing?.();
    this.#delivering?.();
    this.#recheck?.();
    this.#flushing = this.#delivering = this.#recheck = undefined;
    this.#dirty.clear();
    this.#dirtyDirs.clear();
    // The queue stays: next() hands out what was found, then the end.
    this.#deliver();
    if (this.#waiter !== undefined) {
      const resolve = this.#waiter;
      this.#settleWaiter();
      resolve({ value: undefined, done: true });
    }
  }

  // --- directories -------------------------------------------------------

  /** Checks and watches the top directory (the first next()). */
  #openTop(): void {
    let key: string;
    let real: string;
    try {
      const pinned = p.openDir(this.#dir);
      try {
        const self = pinned.lstat(".");
        // Deno's ops pin a file as well (its first create would fail).
        if (self !== null && self.kind !== "directory") {
          throw new SysError("ENOTDIR", "open", "not a directory");
        }
        key = keyOf(self);
      } finally {
        pinned.close();
      }
      real = p.realDir(this.#dir) || this.#dir;
    } catch (err) {
      throw dirError(err, this.#dir, "watch");
    }
    this.#top = this.#watchDir(this.#dir, key, real);
  }

  /** Watches `path` (before it is listed, so nothing falls in between). */
  #watchDir(path: string, key: string, real: string): DirWatch {
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
    const onEvent = (name: string, moved: boolean) =>
      this.#onEvent(d, name, moved);
    d.close = p.watchDir(path, onEvent, false) ??
      p.watchDir(path, onEvent, true);
    if (d.close === undefined) this.#poll = true;
    if (p.watchLosesQuietly) this.#safety = true;
    if (p.watchMissesRemoval) this.#blind = true;
    this.#dirs.add(d);
    return d;
  }

  /**
   * Tells onSkip of an entry left out unread, once per watch. A throw of
   * onSkip is thrown again on its own, as an event listener's is: the
   * watch goes on.
   */
  readonly #skip = (skipped: Skipped): void => {
    if (this.#onSkip === undefined) return;
    const key = `${skipped.reason}\0${skipped.path}`;
    if (this.#skipped.has(key) || this.#skipped.size >= 4096) return;
    this.#skipped.add(key);
    try {
      this.#onSkip({ ...skipped });
    } catch (err) {
      queueMicrotask(() => {
        throw err;
      });
    }
  };

  /** The first batch: every lock there is now, as scan() lists it. */
  async #begin(): Promise<void> {
    const present: Change[] = [];
    const racing: [string, DirWatch][] = [];
    const dirs = [this.#top!];
    for (let d = dirs.pop(); d !== undefined; d = dirs.pop()) {
      let entries;
      try {
        entries = p.readDirKinds(d.path);
      } catch (err) {
        if (d === this.#top) throw dirError(err, d.path, "watch");
        continue;
      }
      for (const { name, kind } of lockEntries(d.path, entries, this.#skip)) {
        const path = within(d.path, name);
        if (kind === "directory") {
          if (this.#recursive) {
            const child = this.#child(d, name);
            if (child !== undefined) dirs.push(child);
          }
          continue;
        }
        const seen = look(path);
        // In a takeover, or out of descriptors: look again below.
        if (seen.kind === "racing" || seen.kind === "unknown") {
          racing.push([path, d]);
        } else if (seen.kind === "run") {
          present.push(this.#paths.adopt(path, d, seen));
        } else if (seen.other) d.others.add(name);
      }
    }
    // Files seen in the middle of a takeover: look again, as scan() does.
    for (const [path, d] of racing) {
      let seen = look(path);
      for (const ms of RACING_SLEEPS) {
        if (seen.kind !== "racing" && seen.kind !== "unknown") break;
        if (this.#phase === "done") break;
        await sleep(ms);
        seen = look(path);
      }
      if (this.#phase !== "starting") return;
      if (seen.kind === "run" || seen.kind === "racing") {
        present.push(this.#paths.adopt(path, d, seen));
      } else if (seen.kind === "unknown") this.#poll = true;
    }
    if (this.#phase !== "starting") return;
    present.sort((a, b) => a.path < b.path ? -1 : a.path > b.path ? 1 : 0);
    this.#phase = "open";
    const resolve = this.#waiter!;
    this.#settleWaiter();
    resolve({ value: present, done: false });
    if (this.#periodic()) this.#scheduleRecheck(this.#period());
    // Events that came during the listing.
    if (this.#dirty.size > 0 || this.#dirtyDirs.size > 0) this.#flush();
  }

  /** Watches subdirectory `name` of `d`; `undefined` if it cannot. */
  #child(d: DirWatch, name: string): DirWatch | undefined {
    const path = within(d.path, name);
    const info = lstatOf(path);
    if (info === null || info.kind !== "directory") return undefined;
    const child = this.#watchDir(path, keyOf(info), path);
    // Gone, or another directory, since the lstat: the next event says.
    if (keyOf(lstatOf(path)) !== child.key) {
      this.#drop(child);
      return undefined;
    }
    d.children.set(name, child);
    return child;
  }

  /** A subdirectory that appeared (or came back): its runs are new. */
  #addChild(d: DirWatch, name: string): void {
    const dirs = [this.#child(d, name)];
    for (let c = dirs.pop(); c !== undefined; c = dirs.pop()) {
      let entries;
      try {
        entries = p.readDirKinds(c.path);
      } catch {
        continue;
      }
      for (const e of lockEntries(c.path, entries, this.#skip)) {
        if (e.kind === "directory") {
          const grand = this.#child(c, e.name);
          if (grand !== undefined) dirs.push(grand);
        } else {
          this.#paths.settle(within(c.path, e.name), c, false);
        }
      }
    }
  }

  /**
   * Watches `d` anew, its name having moved while its identity stayed:
   * removed and made again at once (the new directory got the old one's
   * inode number: the old watch reported nothing after, on every
   * runtime), renamed away and back (Deno 2.9.6 reported nothing after),
   * or another directory moved over it and away. A fresh watch, made after
   * the old one's close has gone through, reports (the same for each
   * subdirectory below it). The re-scan the event scheduled finds what
   * came in between.
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
      if (d.dropped || this.#phase === "done" || d.close !== undefined) {
        return;
      }
      const onEvent = (name: string, moved: boolean) =>
        this.#onEvent(d, name, moved);
      d.close = p.watchDir(d.path, onEvent, false) ??
        p.watchDir(d.path, onEvent, true);
      if (d.close === undefined) this.#poll = true;
    }, 5);
  }

  /**
   * A directory that is gone (removed, or moved away from its path): its
   * runs' ends are looked for, and it is watched no more. The top one
   * ends the iteration once those are reported.
   */
  #drop(d: DirWatch): void {
    if (d.dropped) return;
    d.dropped = true;
    d.close?.();
    d.close = undefined;
    this.#dirs.delete(d);
    for (const child of d.children.values()) this.#drop(child);
    d.children.clear();
    for (const path of [...d.runs]) this.#paths.settle(path, d, false);
    if (d === this.#top && this.#phase === "open") {
      this.#phase = "ending";
      this.#maybeEnd();
    }
  }

  /** Whether `d` is still the directory at its path; drops it if not. */
  #check(d: DirWatch): boolean {
    if (d.dropped) return false;
    if (dirKeyOf(d.real) === d.key) return true;
    this.#drop(d);
    return false;
  }

  // --- events ------------------------------------------------------------

  /**
   * An event on `name` in `d`. Not `moved` (modified, or on Deno a
   * writable descriptor's close): maybe a holder's close, whose flock the
   * kernel drops a moment after it reports the close.
   */
  #onEvent(d: DirWatch, name: string, moved: boolean): void {
    if (this.#phase === "done" || d.dropped) return;
    // The first event of a burst (the last re-scan saw none new), or a
    // lapse (the watch lost events): a re-scan soon, not at the next of
    // the periodic passes, which may be seconds away.
    const soon = this.#scanned || name === "";
    this.#eventsSince = true;
    this.#scanned = false;
    this.#lastEvent = performance.now();
    this.#dirtyDirs.add(d);
    if (isTempName(name)) {
      this.#onTemp(d, name);
    } else if (name !== "") {
      const path = within(d.path, name);
      const was = this.#dirty.get(path);
      this.#dirty.set(path, { d, closed: !moved || (was?.closed ?? false) });
    }
    // Events of one turn of the event loop are handled together.
    this.#flushing ??= p.unrefLater(() => this.#flush(), 0);
    if (
      this.#recheck === undefined ||
      (soon && this.#recheckAt > this.#lastEvent + RECHECK_FIRST_MS)
    ) this.#scheduleRecheck(RECHECK_FIRST_MS);
  }

  /**
   * An event on a temp file's name. Deno's watch reports a holder's close
   * under the name its descriptor was opened by: the acquire's temp file,
   * unlinked since. So a temp name that is gone, of a held run's name, may
   * be that holder's death.
   */
  #onTemp(d: DirWatch, name: string): void {
    if (p.runtime !== "deno") return;
    const stem = stemOfTemp(name)!;
    let path = within(d.path, stem);
    if (!d.runs.has(path) && stemMayBeCut(stem)) {
      for (const run of d.runs) {
        if (tempStem(run.slice(run.lastIndexOf("/") + 1)) === stem) path = run;
      }
    }
    const run = this.#paths.runs.get(path);
    if (run?.state !== "held") return;
    // Still there, a holder that died between its link and its unlink: the
    // temp name is then a second name of the run's inode.
    const temp = lstatOf(within(d.path, name));
    if (temp !== null && keyOf(temp) !== run.ino) return;
    this.#paths.diedNow(run);
    this.#dirty.set(path, { d, closed: true });
  }

  #flush(): void {
    this.#flushing?.();
    this.#flushing = undefined;
    if (this.#phase !== "open") return;
    for (const d of [...this.#dirtyDirs]) this.#check(d);
    this.#dirtyDirs.clear();
    const dirty = [...this.#dirty];
    this.#dirty.clear();
    for (const [path, { d, closed }] of dirty) {
      if (d.dropped) continue;
      const name = path.slice(path.lastIndexOf("/") + 1);
      d.others.delete(name);
      if (this.#recursive) {
        const info = lstatOf(path);
        const child = d.children.get(name);
        if (info?.kind === "directory") {
          if (child === undefined || child.key !== keyOf(info)) {
            if (child !== undefined) this.#drop(child);
            d.children.delete(name);
            this.#addChild(d, name);
          } else if (!closed) this.#rearm(child);
          if (!this.#paths.runs.has(path)) continue;
        } else if (child !== undefined) {
          d.children.delete(name);
          this.#drop(child);
        }
      }
      this.#paths.settle(path, d, closed);
    }
    this.#deliver();
  }

  #scheduleRecheck(ms: number): void {
    this.#recheck?.();
    this.#recheckAt = performance.now() + ms;
    this.#recheck = p.unrefLater(() => {
      this.#recheck = undefined;
      if (this.#phase !== "open") return;
      const again = this.#eventsSince;
      this.#eventsSince = false;
      // Due before the next pass would be late: at most BACKSTOP_MS apart.
      const due = performance.now() - this.#lastScan +
          (this.#periodic() ? this.#period() : 0) > BACKSTOP_MS;
      if (this.#poll || this.#safety || !this.#scanned || due) {
        this.#rescan();
        if (!again) this.#scanned = true;
      } else {
        for (const d of [...this.#dirs]) this.#check(d);
        this.#deliver();
      }
      if (this.#periodic()) this.#scheduleRecheck(this.#period());
      else if (again) this.#scheduleRecheck(RECHECK_MS);
    }, ms);
  }

  /**
   * Whether passes run periodically: a re-scan where something cannot be
   * watched or the watch may lose events unsaid, a look at each directory
   * where its removal may go unreported (Deno) once a re-scan has seen no
   * new events.
   */
  #periodic(): boolean {
    return this.#poll || this.#safety || this.#blind;
  }

  /** How long until the next pass, when passes are periodic (ms). */
  #period(): number {
    if (this.#poll) return POLL_MS;
    return performance.now() - this.#lastEvent < QUIET_MS
      ? POLL_MS
      : this.#safety
      ? QUIET_POLL_MS
      : QUIET_LOOK_MS;
  }

  /**
   * The fallback: lists every watched directory and looks again at each
   * name that differs from what was reported (and at each held run whose
   * flock is free), as if an event had named it. Bounded: one listing per
   * directory and one flock test per held run; files already known not to
   * be locks are not opened again.
   */
  #rescan(): void {
    this.#lastScan = performance.now();
    for (const d of [...this.#dirs]) {
      if (!this.#check(d)) continue;
      let entries;
      try {
        entries = p.readDirKinds(d.path);
      } catch {
        continue;
      }
      const names = new Set<string>();
      for (const { name } of entries) names.add(name);
      for (const { name, kind } of lockEntries(d.path, entries, this.#skip)) {
        const path = within(d.path, name);
        if (kind === "directory") {
          if (!this.#recursive) continue;
          const child = d.children.get(name);
          // Another directory at the name (made while events were lost):
          // its watch is dropped by its check; watch the new one.
          if (child !== undefined && this.#check(child)) continue;
          d.children.delete(name);
          this.#addChild(d, name);
          continue;
        }
        const run = this.#paths.runs.get(path);
        if (run === undefined) {
          if (!d.others.has(name)) this.#paths.settle(path, d, false);
        } else if (run.fd !== undefined && flockFree(run.fd)) {
          this.#paths.settle(path, d, true);
        } else if (run.fd === undefined && run.state === "held") {
          this.#paths.settle(path, d, false);
        }
      }
      for (const name of d.others) if (!names.has(name)) d.others.delete(name);
      for (const path of [...d.runs]) {
        if (!names.has(path.slice(path.lastIndexOf("/") + 1))) {
          this.#paths.settle(path, d, false);
        }
      }
      for (const [name, child] of d.children) {
        if (!names.has(name)) {
          d.children.delete(name);
          this.#drop(child);
        }
      }
    }
    this.#deliver();
  }

  #maybeEnd(): void {
    if (this.#phase !== "ending" || this.#paths.busy > 0) return;
    this.#shutdown();
  }
}

/**
 * The identity (`dev:ino`) of the directory at `real`, or `""` when no
 * directory is there (a file or a symlink made in its place may get its
 * inode number). Through its parent first (an lstat: a symlink put in its
 * place is not it); where the parent may not be read (Deno with
 * `--allow-read` for the directory only), by opening the directory itself.
 */
function dirKeyOf(real: string): string {
  const dir = (info: FileInfo | null) =>
    info?.kind === "directory" ? keyOf(info) : "";
  try {
    return dir(p.lstat(real));
  } catch {
    try {
      const pinned = p.openDir(real);
      try {
        return dir(pinned.lstat("."));
      } finally {
        pinned.close();
      }
    } catch {
      return "";
    }
  }
}
