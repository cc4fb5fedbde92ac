/**
 * One {@linkcode watch} iteration: the async iterator, the first batch, and
 * the batching of the directory watches' events.
 *
 * @module
 */

import { within } from "./_protocol.ts";
import {
  isTempName,
  stemMayBeCut,
  stemOfTemp,
  tempStem,
} from "./_temp_name.ts";
import { lookAgain, lstatOf, type Skipped } from "./_listing.ts";
import { platform as p } from "../platform/current.ts";
import type { Inspection } from "./probes.ts";
import { keyOf, look } from "./_watch_run.ts";
import { Paths, sleep } from "./_watch_paths.ts";
import { Dirs } from "./_watch_dirs.ts";
import { Rescans } from "./_watch_rescan.ts";
import type { Change, ChangeKind, DirWatch } from "./_watch_types.ts";

/** One iteration of a watch. */
export class Session implements AsyncIterableIterator<Change[]> {
  readonly #dir: string;
  readonly #signal: AbortSignal | undefined;
  #phase: "new" | "starting" | "open" | "ending" | "done" = "new";
  #queue: Change[] = [];
  #waiter: ((r: IteratorResult<Change[]>) => void) | undefined;
  #failure: ((err: unknown) => void) | undefined;
  #keep: ReturnType<typeof setInterval> | undefined;
  /** Paths named by events, with their directory and whether to expect a close. */
  readonly #dirty = new Map<string, { d: DirWatch; closed: boolean }>();
  readonly #dirtyDirs = new Set<DirWatch>();
  #flushing: (() => void) | undefined;
  #delivering: (() => void) | undefined;
  #last: Promise<unknown> = Promise.resolve();
  readonly #onAbort = () => this.#shutdown();
  readonly #paths: Paths;
  readonly #rescans: Rescans;
  readonly #dirs: Dirs;

  constructor(
    dir: string,
    recursive: boolean,
    signal: AbortSignal | undefined,
    onSkip?: (skipped: Skipped) => void,
  ) {
    this.#dir = dir;
    this.#signal = signal;
    const phase = () => this.#phase;
    this.#rescans = new Rescans(() => phase() === "open", (rescan) => {
      if (rescan) this.#dirs.rescan();
      else this.#dirs.checkAll();
      this.#deliver();
    });
    this.#paths = new Paths({
      get done() {
        return phase() === "done";
      },
      push: (path, kind, info) => this.#push(path, kind, info),
      deliver: () => this.#deliver(),
      poll: () => this.#rescans.poll(true),
      idle: () => this.#maybeEnd(),
    });
    this.#dirs = new Dirs(recursive, onSkip, this.#paths, this.#rescans, {
      onEvent: (d, name, moved) => this.#onEvent(d, name, moved),
      topGone: () => {
        if (this.#phase !== "open") return;
        this.#phase = "ending";
        this.#maybeEnd();
      },
    });
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
          this.#dirs.openTop(this.#dir);
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
      // An awaited watch keeps the process alive; the watches never do.
      this.#keep ??= setInterval(() => {}, 1 << 30);
      if (this.#phase === "starting" && this.#dirs.top !== undefined) {
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
    // Out once the event loop turns, with whatever else was found.
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
    this.#dirs.close();
    for (const run of this.#paths.runs.values()) this.#paths.untrack(run);
    this.#flushing?.();
    this.#delivering?.();
    this.#rescans.stop();
    this.#flushing = this.#delivering = undefined;
    this.#dirty.clear();
    this.#dirtyDirs.clear();
    // The queue stays: next() hands out what was found, then the end.
    this.#deliver();
  }

  #maybeEnd(): void {
    if (this.#phase !== "ending" || this.#paths.busy > 0) return;
    this.#shutdown();
  }

  /** The first batch: every lock there is now, as scan() lists it. */
  async #begin(): Promise<void> {
    const present: Change[] = [];
    const racing: [string, DirWatch][] = [];
    for (const { dir: d, path, name, kind } of this.#dirs.walkTop()) {
      if (this.#phase !== "starting") return;
      if (kind === "directory") continue;
      const seen = look(path);
      // In a takeover, or out of descriptors: look again below.
      if (seen.kind === "racing" || seen.kind === "unknown") {
        racing.push([path, d]);
      } else if (seen.kind === "run") {
        present.push(this.#paths.adopt(path, d, seen));
      } else if (seen.other) d.others.add(name);
    }
    for (const [path, d] of racing) {
      const seen = await lookAgain(
        () => look(path),
        (seen) => seen.kind === "racing" || seen.kind === "unknown",
        async (ms) => {
          if (this.#phase === "done") return false;
          await sleep(ms);
          return true;
        },
      );
      if (this.#phase !== "starting") return;
      if (seen.kind === "run" || seen.kind === "racing") {
        present.push(this.#paths.adopt(path, d, seen));
      } else if (seen.kind === "unknown") this.#rescans.poll(false);
    }
    if (this.#phase !== "starting") return;
    present.sort((a, b) => a.path < b.path ? -1 : a.path > b.path ? 1 : 0);
    this.#phase = "open";
    const resolve = this.#waiter!;
    this.#settleWaiter();
    resolve({ value: present, done: false });
    this.#rescans.start();
    // Events that came during the listing.
    if (this.#dirty.size > 0 || this.#dirtyDirs.size > 0) this.#flush();
  }

  /**
   * An event on `name` in `d`; not `moved`: maybe a holder's close. `""`:
   * the watch lost events.
   */
  #onEvent(d: DirWatch, name: string, moved: boolean): void {
    if (this.#phase === "done" || d.dropped) return;
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
    this.#rescans.event(name === "");
  }

  /**
   * An event on a temp name: a watch that sees closes reports a holder's
   * under the name it opened (its temp file), so it may be that death.
   */
  #onTemp(d: DirWatch, name: string): void {
    if (!p.watchSeesClose) return;
    const stem = stemOfTemp(name)!;
    let path = within(d.path, stem);
    if (!d.runs.has(path) && stemMayBeCut(stem)) {
      for (const run of d.runs) {
        if (tempStem(run.slice(run.lastIndexOf("/") + 1)) === stem) path = run;
      }
    }
    const run = this.#paths.runs.get(path);
    if (run?.state !== "held") return;
    // Still there: a second name of the run's inode (died before unlink).
    const temp = lstatOf(within(d.path, name));
    if (temp !== null && keyOf(temp) !== run.ino) return;
    this.#paths.diedNow(run);
    this.#dirty.set(path, { d, closed: true });
  }

  #flush(): void {
    this.#flushing?.();
    this.#flushing = undefined;
    if (this.#phase !== "open") return;
    for (const d of [...this.#dirtyDirs]) this.#dirs.check(d);
    this.#dirtyDirs.clear();
    const dirty = [...this.#dirty];
    this.#dirty.clear();
    for (const [path, { d, closed }] of dirty) {
      this.#dirs.changed(path, d, closed);
    }
    this.#deliver();
  }
}
