/**
 * One {@linkcode watch} iteration: the directory watches, the runs last
 * reported, the decision of each change, and the async iterator protocol.
 * See `src/watch.ts` for the contract and PROTOCOL.md for why each kind
 * is decided the way it is.
 *
 * @module
 */

import { errnoOf, tempStem, within } from "./_protocol.ts";
import { RACING_SLEEPS } from "./_probe.ts";
import { LockPermissionError, RunlockError } from "./errors.ts";
import { platform as p } from "./platform/current.ts";
import type { Handle } from "./platform/types.ts";
import type { Probe } from "./_protocol.ts";
import type { Inspection } from "./probes.ts";
import {
  acquiring,
  flockFree,
  freeInspection,
  hold,
  inspection,
  keyOf,
  look,
  lstatOf,
  type Seen,
  staleInspection,
  TEMP_NAME,
} from "./_watch_run.ts";
import type { Change, ChangeKind } from "./watch.ts";

/**
 * How long a held run's name may be gone while its holder still holds the
 * inode's flock before the run counts as `lost` (ms). A clean release
 * unlinks and closes in one go (microseconds apart); a holder whose file
 * someone else deleted holds on until it notices and lets go.
 */
export const LOST_MS = 1000;
/** How long a stale file's removal waits for the acquire taking it over (ms). */
const TAKEOVER_MS = 1000;
/** Sleeps (ms) between looks at a held run's flock after its name went. */
const END_SLEEPS = [0, 1, 2, 4, 8, 16, 32, 64, 128, 250];
/**
 * Looks again (ms) after a holder's close while its flock still shows held:
 * the kernel reports the close a moment before it drops the flock.
 */
const CLOSE_SLEEPS = [0, 1, 2, 4, 8, 16, 32];
/** After events, a re-scan (ms) to catch what the watch may have dropped. */
const RECHECK_FIRST_MS = 250;
const RECHECK_MS = 1000;
/** The re-scan's period where there is no watch to wait for (ms). */
const POLL_MS = 1000;
/**
 * Deno's re-scan period once its watch has been quiet for
 * {@linkcode QUIET_MS} (ms): every second while events come.
 */
const DENO_QUIET_POLL_MS = 5000;
const QUIET_MS = 10_000;

/** A run at a path, as last reported. */
interface Run {
  readonly path: string;
  readonly dir: DirWatch;
  state: "held" | "stale";
  ino: string;
  run: string;
  /** Read-only, on the held run's inode. */
  fd: Handle | undefined;
  unclose: (() => void) | undefined;
  /** Ends a wait for this run's end early (its holder's close). */
  wake: (() => void) | undefined;
  /** When a stale run's name was first seen gone (a takeover may follow). */
  vacated: number | undefined;
  /**
   * Seen dead: its flock found free, and then its name found still naming
   * its inode (a clean release unlinks before it lets go). Looked at on
   * its holder's close, so that a waiter that takes the file over before
   * the watch looks again does not hide the crash.
   */
  died: boolean;
  /** Its last probe. */
  found: Probe;
}

/** One watched directory. */
interface DirWatch {
  readonly path: string;
  readonly key: string;
  /** The path that names it for the identity check (the top: its real path). */
  readonly real: string;
  close: (() => void) | undefined;
  readonly children: Map<string, DirWatch>;
  /** The paths of the runs reported in it. */
  readonly runs: Set<string>;
  /** Names looked at that are not locks (not looked at again until an event). */
  readonly others: Set<string>;
  dropped: boolean;
}

/** What a path's settling loop is asked to do next. */
interface Busy {
  again: boolean;
  closed: boolean;
  /** The directory to look in next (a path's directory may be new). */
  dir: DirWatch;
}

const sleep = (ms: number) =>
  new Promise<void>((resolve) => p.unrefLater(resolve, ms));

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
  readonly #runs = new Map<string, Run>();
  /** Paths named by events, with their directory and whether to expect a close. */
  readonly #dirty = new Map<string, { d: DirWatch; closed: boolean }>();
  readonly #dirtyDirs = new Set<DirWatch>();
  readonly #busy = new Map<string, Busy>();
  #flushing: (() => void) | undefined;
  #delivering: (() => void) | undefined;
  #recheck: (() => void) | undefined;
  #eventsSince = false;
  /** Something cannot be watched (a directory, or a holder's close): poll. */
  #poll = false;
  /** Deno: its watch may drop events, so poll too (see #watchDir). */
  #safety = false;
  #lastEvent = 0;
  #last: Promise<unknown> = Promise.resolve();
  readonly #onAbort = () => this.#shutdown();

  constructor(
    dir: string,
    recursive: boolean,
    signal: AbortSignal | undefined,
  ) {
    this.#dir = dir;
    this.#recursive = recursive;
    this.#signal = signal;
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
    for (const run of this.#runs.values()) this.#untrack(run);
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
        key = keyOf(pinned.lstat("."));
      } finally {
        pinned.close();
      }
      real = p.realDir(this.#dir) || this.#dir;
    } catch (err) {
      throw topError(err, this.#dir);
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
    // Deno's watch has been seen to drop events (after a burst, a fresh
    // watch in the same process reported none of a directory's removal;
    // Deno 2.9.6): there, the re-scan runs every second as well.
    if (d.close === undefined) this.#poll = true;
    if (p.runtime === "deno") this.#safety = true;
    this.#dirs.add(d);
    return d;
  }

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
        if (d === this.#top) throw topError(err, d.path);
        continue;
      }
      for (const { name, kind } of entries) {
        const path = within(d.path, name);
        if (kind === "directory") {
          if (this.#recursive) {
            const child = this.#child(d, name);
            if (child !== undefined) dirs.push(child);
          }
          continue;
        }
        if (kind !== "file" || TEMP_NAME.test(name)) continue;
        const seen = look(path);
        if (seen.kind === "racing") racing.push([path, d]);
        else if (seen.kind === "run") present.push(this.#adopt(path, d, seen));
        else if (seen.other) d.others.add(name);
      }
    }
    // Files seen in the middle of a takeover: look again, as scan() does.
    for (const [path, d] of racing) {
      let seen = look(path);
      for (const ms of RACING_SLEEPS) {
        if (seen.kind !== "racing" || this.#phase === "done") break;
        await sleep(ms);
        seen = look(path);
      }
      if (this.#phase !== "starting") return;
      if (seen.kind !== "none") present.push(this.#adopt(path, d, seen));
    }
    if (this.#phase !== "starting") return;
    present.sort((a, b) => a.path < b.path ? -1 : a.path > b.path ? 1 : 0);
    this.#phase = "open";
    const resolve = this.#waiter!;
    this.#settleWaiter();
    resolve({ value: present, done: false });
    if (this.#poll || this.#safety) this.#scheduleRecheck(this.#period());
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
      for (const e of entries) {
        if (e.kind === "directory") {
          const grand = this.#child(c, e.name);
          if (grand !== undefined) dirs.push(grand);
        } else if (e.kind === "file" && !TEMP_NAME.test(e.name)) {
          this.#settle(within(c.path, e.name), c, false);
        }
      }
    }
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
    for (const path of [...d.runs]) this.#settle(path, d, false);
    if (d === this.#top && this.#phase === "open") {
      this.#phase = "ending";
      this.#maybeEnd();
    }
  }

  /** Whether `d` is still the directory at its path; drops it if not. */
  #check(d: DirWatch): boolean {
    if (d.dropped) return false;
    if (keyOf(lstatOf(d.real)) === d.key) return true;
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
    this.#eventsSince = true;
    this.#lastEvent = performance.now();
    this.#dirtyDirs.add(d);
    if (TEMP_NAME.test(name)) {
      this.#onTemp(d, name);
    } else if (name !== "") {
      const path = within(d.path, name);
      const was = this.#dirty.get(path);
      this.#dirty.set(path, { d, closed: !moved || (was?.closed ?? false) });
    }
    // Events of one turn of the event loop are handled together.
    this.#flushing ??= p.unrefLater(() => this.#flush(), 0);
    if (this.#recheck === undefined) this.#scheduleRecheck(RECHECK_FIRST_MS);
  }

  /**
   * An event on a temp file's name. Deno's watch reports a holder's close
   * under the name its descriptor was opened by: the acquire's temp file,
   * unlinked since. So a temp name that is gone, of a held run's name, may
   * be that holder's death.
   */
  #onTemp(d: DirWatch, name: string): void {
    if (p.runtime !== "deno") return;
    const stem = name.slice(1, name.length - 21);
    const path = within(d.path, stem);
    const run = this.#runs.get(path);
    if (run?.state !== "held") return;
    if (lstatOf(within(d.path, name)) !== null) return;
    this.#diedNow(run);
    this.#dirty.set(path, { d, closed: true });
  }

  /** Whether `run`'s holder is dead now, its record still at its path. */
  #diedNow(run: Run): void {
    if (run.died || run.fd === undefined || !flockFree(run.fd)) return;
    run.died = keyOf(lstatOf(run.path)) === run.ino;
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
          }
          if (!this.#runs.has(path)) continue;
        } else if (child !== undefined) {
          d.children.delete(name);
          this.#drop(child);
        }
      }
      this.#settle(path, d, closed);
    }
    this.#deliver();
  }

  /** A held run's holder closed a writable descriptor of its inode. */
  #onClose(run: Run): void {
    if (this.#runs.get(run.path) !== run || this.#phase === "done") return;
    this.#diedNow(run);
    run.wake?.();
    this.#settle(run.path, run.dir, true);
    this.#deliver();
  }

  #scheduleRecheck(ms: number): void {
    this.#recheck?.();
    this.#recheck = p.unrefLater(() => {
      this.#recheck = undefined;
      if (this.#phase !== "open") return;
      const again = this.#eventsSince;
      this.#eventsSince = false;
      this.#rescan();
      if (this.#poll || this.#safety) this.#scheduleRecheck(this.#period());
      else if (again) this.#scheduleRecheck(RECHECK_MS);
    }, ms);
  }

  /** How long until the next re-scan, when re-scans are periodic (ms). */
  #period(): number {
    if (this.#poll) return POLL_MS;
    return performance.now() - this.#lastEvent < QUIET_MS
      ? POLL_MS
      : DENO_QUIET_POLL_MS;
  }

  /**
   * The fallback: lists every watched directory and looks again at each
   * name that differs from what was reported (and at each held run whose
   * flock is free), as if an event had named it. Bounded: one listing per
   * directory and one flock test per held run; files already known not to
   * be locks are not opened again.
   */
  #rescan(): void {
    for (const d of [...this.#dirs]) {
      if (!this.#check(d)) continue;
      let entries;
      try {
        entries = p.readDirKinds(d.path);
      } catch {
        continue;
      }
      const names = new Set<string>();
      for (const { name, kind } of entries) {
        names.add(name);
        const path = within(d.path, name);
        if (kind === "directory") {
          if (this.#recursive && !d.children.has(name)) this.#addChild(d, name);
          continue;
        }
        if (kind !== "file" || TEMP_NAME.test(name)) continue;
        const run = this.#runs.get(path);
        if (run === undefined) {
          if (!d.others.has(name)) this.#settle(path, d, false);
        } else if (run.fd !== undefined && flockFree(run.fd)) {
          this.#settle(path, d, true);
        } else if (run.fd === undefined && run.state === "held") {
          this.#settle(path, d, false);
        }
      }
      for (const name of d.others) if (!names.has(name)) d.others.delete(name);
      for (const path of [...d.runs]) {
        if (!names.has(path.slice(path.lastIndexOf("/") + 1))) {
          this.#settle(path, d, false);
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

  // --- one path ----------------------------------------------------------

  /**
   * Looks at `path` and reports what changed since the last report, one
   * look at a time per path (a path's changes stay in order). `closed`: a
   * holder's close is why.
   */
  #settle(path: string, d: DirWatch, closed: boolean): void {
    const busy = this.#busy.get(path);
    if (busy !== undefined) {
      busy.again = true;
      busy.closed ||= closed;
      if (!d.dropped) busy.dir = d;
      return;
    }
    const state: Busy = { again: false, closed, dir: d };
    this.#busy.set(path, state);
    this.#loop(path, state).catch(() => {});
  }

  async #loop(path: string, state: Busy): Promise<void> {
    try {
      do {
        const closed = state.closed;
        state.again = state.closed = false;
        const waiting = this.#once(path, state.dir, closed);
        if (waiting !== undefined) await waiting;
      } while (state.again && this.#phase !== "done");
    } finally {
      this.#busy.delete(path);
      this.#maybeEnd();
    }
  }

  #maybeEnd(): void {
    if (this.#phase !== "ending" || this.#busy.size > 0) return;
    this.#shutdown();
  }

  #once(path: string, d: DirWatch, closed: boolean): Promise<void> | void {
    const rep = this.#runs.get(path);
    // The flock first, the name second: a flock found free while the name
    // still names its inode is a holder that ended without unlinking.
    const freeBefore = rep?.fd !== undefined && flockFree(rep.fd);
    const seen = d.dropped
      ? { kind: "none", other: false } as Seen
      : look(path);
    return this.#decide(path, d, rep, freeBefore, seen, closed);
  }

  #decide(
    path: string,
    d: DirWatch,
    rep: Run | undefined,
    freeBefore: boolean,
    seen: Seen,
    closed: boolean,
  ): Promise<void> | void {
    if (this.#phase === "done") return;
    const same = rep !== undefined && seen.kind !== "none" &&
      seen.ino === rep.ino && seen.run === rep.run;
    if (rep?.state === "held") {
      if (!same) return this.#ended(path, d, rep, freeBefore);
      if (seen.kind === "racing") {
        // Its PID is dead and someone holds its flock: a taker.
        this.#toStale(rep);
        this.#push(path, "crashed", staleInspection(path, seen.found));
        return this.#racing(path, d);
      }
      if (seen.found.state === "stale") {
        rep.found = seen.found;
        this.#toStale(rep);
        this.#push(path, "crashed", inspection(path, seen.found));
        return;
      }
      if (closed) return this.#afterClose(path, d, rep);
      return;
    }
    if (rep?.state === "stale") {
      if (seen.kind === "racing") return this.#racing(path, d);
      if (seen.kind === "run") {
        rep.vacated = undefined;
        if (same && seen.found.state === "stale") return;
        if (seen.found.state === "held") {
          this.#untrack(rep);
          this.#push(path, "taken over", inspection(path, seen.found));
          this.#track(path, d, seen);
          return;
        }
        // Another dead run's record in its place.
        rep.ino = seen.ino;
        rep.run = seen.run;
        this.#push(path, "crashed", inspection(path, seen.found));
        return;
      }
      // Gone. A takeover unlinks the stale file, then links its own: wait
      // for it while an acquire of this name is under way.
      const now = performance.now();
      rep.vacated ??= now;
      const name = path.slice(path.lastIndexOf("/") + 1);
      if (!d.dropped && now - rep.vacated < TAKEOVER_MS) {
        // The acquire first, the name second: a taker that linked its
        // file since the look has removed its temp file by now.
        const under = acquiring(d.path, tempStem(name));
        const again = look(path);
        if (again.kind !== "none") {
          return this.#decide(path, d, rep, false, again, false);
        }
        if (under) return sleep(5).then(() => this.#again(path, d));
      }
      this.#untrack(rep);
      this.#push(path, "released", noneInspection(path, seen));
      return;
    }
    if (seen.kind === "racing") return this.#racing(path, d);
    if (seen.kind === "run") {
      const held = seen.found.state === "held";
      this.#push(
        path,
        held ? "started" : "crashed",
        inspection(path, seen.found),
      );
      this.#track(path, d, seen);
      return;
    }
    if (seen.other) d.others.add(path.slice(path.lastIndexOf("/") + 1));
  }

  /** Looks at `path` again, now, and decides. */
  #again(path: string, d: DirWatch, closed = false): Promise<void> | void {
    return this.#once(path, d, closed);
  }

  /** A takeover is under way at `path`: look again until it is done. */
  async #racing(path: string, d: DirWatch): Promise<void> {
    let seen: Seen = { kind: "none", other: false };
    for (const ms of RACING_SLEEPS) {
      await sleep(ms);
      if (this.#phase === "done" || d.dropped) return;
      seen = look(path);
      if (seen.kind !== "racing") break;
    }
    // Still a dead PID under a held flock (flock(1) on a crashed run's
    // file?): as held, as inspect() answers after its looks.
    if (seen.kind === "racing") seen = { ...seen, kind: "run" };
    return this.#decide(path, d, this.#runs.get(path), false, seen, false);
  }

  /** After a close, the flock may still show held a moment: look again. */
  async #afterClose(path: string, d: DirWatch, rep: Run): Promise<void> {
    for (const ms of CLOSE_SLEEPS) {
      await sleep(ms);
      if (this.#runs.get(path) !== rep || this.#phase === "done") return;
      this.#diedNow(rep);
      const freeBefore = rep.fd !== undefined && flockFree(rep.fd);
      const seen = look(path);
      const same = seen.kind !== "none" && seen.ino === rep.ino &&
        seen.run === rep.run;
      if (!same || seen.kind === "racing" || seen.found.state !== "held") {
        return this.#decide(path, d, rep, freeBefore, seen, false);
      }
    }
    // Held still: a close of another writer's descriptor, not the holder's.
  }

  /**
   * A held run's name no longer names its record: released, or lost. A
   * clean release unlinks, then closes; a deletion by someone else leaves
   * the holder holding the unlinked inode. So: wait (at most
   * {@linkcode LOST_MS}) for the flock of the inode to go.
   */
  #ended(
    path: string,
    d: DirWatch,
    rep: Run,
    freeBefore: boolean,
  ): Promise<void> | void {
    const finish = (kind: ChangeKind) => {
      if (this.#runs.get(path) !== rep || this.#phase === "done") return;
      this.#untrack(rep);
      const seen = d.dropped
        ? { kind: "none", other: false } as Seen
        : look(path);
      this.#push(path, kind, noneInspection(path, seen));
      if (seen.kind !== "none") {
        return this.#decide(path, d, undefined, false, seen, false);
      }
      if (seen.other) d.others.add(path.slice(path.lastIndexOf("/") + 1));
    };
    const fd = rep.fd;
    if (fd === undefined || freeBefore || flockFree(fd)) {
      // Its flock and its name both gone: which went first is not known
      // from what is there now, unless it was seen dead at its close (a
      // waiter took the file over since). Otherwise released: never a
      // crash that was not seen (the order of the two events cannot be
      // had: on Node and Bun they come through two watches, which Bun
      // delivered out of the kernel's order 7 times in 30; Deno's watch
      // drops events in bursts).
      if (rep.died && !d.dropped) {
        this.#toStale(rep);
        this.#push(path, "crashed", staleInspection(path, rep.found));
        return this.#once(path, d, false);
      }
      return finish("released");
    }
    return (async () => {
      const deadline = performance.now() + LOST_MS;
      for (let i = 0;; i++) {
        const left = deadline - performance.now();
        if (left <= 0) return finish("lost");
        const ms = Math.min(
          END_SLEEPS[Math.min(i, END_SLEEPS.length - 1)],
          left,
        );
        await new Promise<void>((resolve) => {
          const cancel = p.unrefLater(() => {
            rep.wake = undefined;
            resolve();
          }, ms);
          rep.wake = () => {
            cancel();
            rep.wake = undefined;
            resolve();
          };
        });
        if (this.#runs.get(path) !== rep || this.#phase === "done") return;
        if (flockFree(fd)) return finish("released");
      }
    })();
  }

  /** Reports `seen` from now on: a held run gets its descriptor and watch. */
  #track(
    path: string,
    d: DirWatch,
    seen: Seen & { kind: "run" | "racing" },
  ): void {
    const held = seen.found.state === "held";
    const run: Run = {
      path,
      dir: d,
      state: held ? "held" : "stale",
      ino: seen.ino,
      run: seen.run,
      fd: undefined,
      unclose: undefined,
      wake: undefined,
      vacated: undefined,
      died: false,
      found: seen.found,
    };
    this.#runs.set(path, run);
    d.runs.add(path);
    if (held) this.#watchRun(run);
  }

  /** The first batch's runs: tracked, reported as present. */
  #adopt(
    path: string,
    d: DirWatch,
    seen: Seen & { kind: "run" | "racing" },
  ): Change {
    this.#track(path, d, seen);
    return { path, kind: "present", inspection: inspection(path, seen.found) };
  }

  /** A held run's read-only descriptor and close watch. */
  #watchRun(run: Run): void {
    run.fd = hold(run.path, run.ino);
    if (run.fd === undefined) {
      // Replaced since the look, or out of descriptors: look again now,
      // and in every re-scan while it has none.
      const busy = this.#busy.get(run.path);
      if (busy !== undefined) busy.again = true;
      else p.unrefLater(() => this.#settle(run.path, run.dir, false), 0);
      if (!this.#poll) {
        this.#poll = true;
        if (this.#phase === "open") this.#scheduleRecheck(POLL_MS);
      }
      return;
    }
    run.unclose = p.watchClose(run.path, () => this.#onClose(run));
    // Deno's directory watch reports the close itself; elsewhere, without
    // a close watch, only the re-scan finds a crash.
    if (run.unclose === undefined && p.runtime !== "deno" && !this.#poll) {
      this.#poll = true;
      if (this.#phase === "open") this.#scheduleRecheck(POLL_MS);
    }
  }

  /** A held run whose holder is gone: its record stays, stale. */
  #toStale(run: Run): void {
    run.state = "stale";
    run.wake = undefined;
    run.unclose?.();
    run.unclose = undefined;
    run.fd?.close();
    run.fd = undefined;
  }

  #untrack(run: Run): void {
    this.#toStale(run);
    if (this.#runs.get(run.path) === run) this.#runs.delete(run.path);
    run.dir.runs.delete(run.path);
  }
}

/** A path's state once a run there ended: its probe, or free. */
function noneInspection(path: string, seen: Seen): Inspection {
  return seen.kind === "none" && seen.found !== undefined
    ? inspection(path, seen.found)
    : freeInspection(path);
}

/** The error for a top directory that cannot be watched. */
function topError(err: unknown, dir: string): Error {
  if (err instanceof RunlockError) return err;
  const code = errnoOf(err);
  if (code === "NOTCAPABLE") {
    return new LockPermissionError(
      dir,
      "cannot watch the directory",
      `run Deno with --allow-read=${dir} (runlock never prompts)`,
      { cause: err },
    );
  }
  if (code === "EACCES" || code === "EPERM") {
    return new LockPermissionError(
      dir,
      "cannot watch the directory",
      "this user may not read it",
      { cause: err },
    );
  }
  if (code === "ENOTDIR") {
    return new RunlockError(dir, `${dir}: cannot watch: not a directory`, {
      cause: err,
    });
  }
  if (code === "ENOENT") {
    return new RunlockError(dir, `${dir}: cannot watch: no such directory`, {
      cause: err,
    });
  }
  return new RunlockError(
    dir,
    `${dir}: cannot watch the directory: ${(err as Error).message}`,
    { cause: err },
  );
}
