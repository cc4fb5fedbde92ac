/**
 * {@linkcode watch}'s runs: what was last reported at each path, and each
 * change's decision (PROTOCOL.md, "Watching").
 *
 * @module
 */

import type { Probe } from "./_protocol.ts";
import { tempStem } from "./_temp_name.ts";
import { platform as p } from "../platform/current.ts";
import type { Handle } from "../platform/types.ts";
import { lookAgain, lstatOf } from "./_listing.ts";
import { type Inspection, toInspection } from "./probes.ts";
import {
  acquiring,
  fdBudget,
  flockFree,
  hold,
  keyOf,
  look,
  noneInspection,
  releasedByRun,
  type Seen,
  staleInspection,
} from "./_watch_run.ts";
import type { Change, ChangeKind, DirWatch } from "./_watch_types.ts";

/**
 * How long a held run's name may be gone while its flock is held before it
 * counts as `lost` (ms): a clean release unlinks and closes microseconds apart.
 */
const LOST_MS = 1000;
/** How long a stale file's removal waits for the acquire taking it over (ms). */
const TAKEOVER_MS = 1000;
/** Sleeps (ms) between looks at a held run's flock after its name went. */
const END_SLEEPS = [0, 1, 2, 4, 8, 16, 32, 64, 128, 250];
/** Looks again (ms) after a close: the kernel reports it before the flock goes. */
const CLOSE_SLEEPS = [0, 1, 2, 4, 8, 16, 32];
/** Descriptors given back when the kept ones ran the process out (`EMFILE`). */
const FD_MARGIN = 16;
/** A look that ran out of descriptors is tried again after this (ms). */
const UNKNOWN_MS = 250;

/** A run at a path, as last reported. */
export interface Run {
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
   * Seen dead at its holder's close: flock free, name still on its inode (a
   * release unlinks first), so that a quick takeover does not hide the crash.
   */
  died: boolean;
  /** Its last probe. */
  found: Probe;
}

/** What a path's settling loop is asked to do next. */
interface Busy {
  again: boolean;
  closed: boolean;
  /** The directory to look in next (a path's directory may be new). */
  dir: DirWatch;
}

/** A look at `path`, or nothing once its directory is dropped. */
const lookIn = (d: DirWatch, path: string): Seen =>
  d.dropped ? { kind: "none", other: false } : look(path);

export const sleep = (ms: number) =>
  new Promise<void>((resolve) => p.unrefLater(resolve, ms));

/** What the runs need from the watch they belong to. */
export interface Host {
  /** Whether the watch has ended (every look stops). */
  readonly done: boolean;
  /** Reports a change. */
  push(path: string, kind: ChangeKind, info: Inspection): void;
  /** Hands the changes found to a waiting `next()` now. */
  deliver(): void;
  /** Something cannot be watched (a held run's close): re-scan periodically. */
  poll(): void;
  /** A path's looks are over for now. */
  idle(): void;
}

/** The runs of one watch, by path. */
export class Paths {
  readonly runs = new Map<string, Run>();
  readonly #busy = new Map<string, Busy>();
  readonly #host: Host;
  /** The held runs' descriptors kept open, and how many may be. */
  #kept = 0;
  #cap: number | undefined;

  constructor(host: Host) {
    this.#host = host;
  }

  /** How many paths are being looked at. */
  get busy(): number {
    return this.#busy.size;
  }

  /** Whether `run`'s holder is dead now, its record still at its path. */
  diedNow(run: Run): void {
    if (run.died || run.fd === undefined || !flockFree(run.fd)) return;
    run.died = keyOf(lstatOf(run.path)) === run.ino;
  }

  /** A held run's holder closed a writable descriptor of its inode. */
  onClose(run: Run): void {
    if (this.runs.get(run.path) !== run || this.#host.done) return;
    this.diedNow(run);
    run.wake?.();
    this.settle(run.path, run.dir, true);
    this.#host.deliver();
  }

  /**
   * Looks at `path` and reports what changed, one look at a time per path
   * (its changes stay in order). `closed`: a holder's close is why.
   */
  settle(path: string, d: DirWatch, closed: boolean): void {
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
      } while (state.again && !this.#host.done);
    } finally {
      this.#busy.delete(path);
      this.#host.idle();
    }
  }

  #once(path: string, d: DirWatch, closed: boolean): Promise<void> | void {
    const rep = this.runs.get(path);
    // The flock first: free while the name is on its inode is a crash.
    const freeBefore = rep?.fd !== undefined && flockFree(rep.fd);
    const seen = lookIn(d, path);
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
    if (this.#host.done) return;
    if (seen.kind === "unknown") {
      // Out of descriptors: look again, never taking it for "not a lock".
      this.#host.poll();
      return sleep(UNKNOWN_MS).then(() => {
        if (!this.#host.done && !d.dropped) return this.#once(path, d, false);
      });
    }
    const same = rep !== undefined && seen.kind !== "none" &&
      seen.ino === rep.ino && seen.run === rep.run;
    if (rep?.state === "held") {
      if (!same) return this.#ended(path, d, rep, freeBefore);
      if (seen.kind === "racing") {
        // Its PID is dead and someone holds its flock: a taker.
        this.#toStale(rep);
        this.#host.push(path, "crashed", staleInspection(path, seen.found));
        return this.#racing(path, d, seen);
      }
      if (seen.found.state === "stale") {
        rep.found = seen.found;
        this.#toStale(rep);
        this.#host.push(path, "crashed", toInspection(path, seen.found));
        return;
      }
      if (closed) return this.#afterClose(path, d, rep);
      return;
    }
    if (rep?.state === "stale") {
      if (seen.kind === "racing") return this.#racing(path, d, seen);
      if (seen.kind === "run") {
        rep.vacated = undefined;
        if (same && seen.found.state === "stale") return;
        if (seen.found.state === "held") {
          this.untrack(rep);
          this.#host.push(path, "taken over", toInspection(path, seen.found));
          this.#track(path, d, seen);
          return;
        }
        // Another dead run's record in its place.
        rep.ino = seen.ino;
        rep.run = seen.run;
        this.#host.push(path, "crashed", toInspection(path, seen.found));
        return;
      }
      // Gone: a takeover unlinks, then links; wait while an acquire is on.
      const now = performance.now();
      rep.vacated ??= now;
      const name = path.slice(path.lastIndexOf("/") + 1);
      if (!d.dropped && now - rep.vacated < TAKEOVER_MS) {
        // The acquire first: a taker that linked since has no temp file.
        const under = acquiring(d.path, tempStem(name));
        const again = look(path);
        if (again.kind !== "none") {
          return this.#decide(path, d, rep, false, again, false);
        }
        if (under) return sleep(5).then(() => this.#once(path, d, false));
      }
      this.untrack(rep);
      this.#host.push(path, "released", noneInspection(path, seen));
      return;
    }
    if (seen.kind === "racing") return this.#racing(path, d, seen);
    if (seen.kind === "run") {
      const held = seen.found.state === "held";
      this.#host.push(
        path,
        held ? "started" : "crashed",
        toInspection(path, seen.found),
      );
      this.#track(path, d, seen);
      return;
    }
    if (seen.other) d.others.add(path.slice(path.lastIndexOf("/") + 1));
  }

  /** A takeover is under way at `path`: look again until it is done. */
  async #racing(path: string, d: DirWatch, first: Seen): Promise<void> {
    const gone = () => this.#host.done || d.dropped;
    let seen = await lookAgain(
      () => look(path),
      (seen) => seen.kind === "racing",
      async (ms) => {
        await sleep(ms);
        return !gone();
      },
      first,
    );
    if (gone()) return;
    // Still racing (flock(1)?): held, as inspect() answers.
    if (seen.kind === "racing") seen = { ...seen, kind: "run" };
    return this.#decide(path, d, this.runs.get(path), false, seen, false);
  }

  /** After a close, the flock may still show held a moment: look again. */
  async #afterClose(path: string, d: DirWatch, rep: Run): Promise<void> {
    for (const ms of CLOSE_SLEEPS) {
      await sleep(ms);
      if (this.runs.get(path) !== rep || this.#host.done) return;
      this.diedNow(rep);
      const freeBefore = rep.fd !== undefined && flockFree(rep.fd);
      const seen = look(path);
      if (seen.kind === "unknown") continue;
      const same = seen.kind !== "none" && seen.ino === rep.ino &&
        seen.run === rep.run;
      if (!same || seen.kind === "racing" || seen.found.state !== "held") {
        return this.#decide(path, d, rep, freeBefore, seen, false);
      }
    }
    // Held still: a close of another writer's descriptor, not the holder's.
  }

  /**
   * A held run's name no longer names its record: released, or lost (its
   * holder still holds the unlinked inode after {@linkcode LOST_MS}).
   */
  #ended(
    path: string,
    d: DirWatch,
    rep: Run,
    freeBefore: boolean,
  ): Promise<void> | void {
    const finish = (kind: ChangeKind) => {
      if (this.runs.get(path) !== rep || this.#host.done) return;
      this.untrack(rep);
      const seen = lookIn(d, path);
      this.#host.push(path, kind, noneInspection(path, seen));
      return this.#decide(path, d, undefined, false, seen, false);
    };
    const fd = rep.fd;
    if (
      fd === undefined || freeBefore || flockFree(fd) || releasedByRun(fd)
    ) {
      // Flock and name both gone: a crash only if seen dead at its close
      // (the events' order cannot be had: Bun delivered its two watches'
      // out of order 7 times in 30; Deno's drops events in bursts).
      if (rep.died && !d.dropped) {
        this.#toStale(rep);
        this.#host.push(path, "crashed", staleInspection(path, rep.found));
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
        if (this.runs.get(path) !== rep || this.#host.done) return;
        if (flockFree(fd) || releasedByRun(fd)) return finish("released");
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
    this.runs.set(path, run);
    d.runs.add(path);
    if (held) this.#watchRun(run);
  }

  /** The first batch's runs: tracked, reported as present. */
  adopt(
    path: string,
    d: DirWatch,
    seen: Seen & { kind: "run" | "racing" },
  ): Change {
    this.#track(path, d, seen);
    return {
      path,
      kind: "present",
      inspection: toInspection(path, seen.found),
    };
  }

  /** A held run's read-only descriptor and close watch. */
  #watchRun(run: Run): void {
    this.#cap ??= fdBudget(FD_MARGIN);
    const fd = this.#kept < this.#cap ? hold(run.path, run.ino) : undefined;
    if (fd === "EMFILE") {
      // Keep fewer from now on, and give some back at once. A run without
      // one is re-scanned every second.
      this.#cap = Math.max(0, this.#kept - FD_MARGIN);
      for (const other of this.runs.values()) {
        if (this.#kept <= this.#cap) break;
        if (other.fd !== undefined) this.#unkeep(other);
      }
      this.#host.poll();
      return;
    }
    if (fd === undefined) {
      if (this.#kept < this.#cap) {
        // Replaced since the look, or out of descriptors: look again.
        const busy = this.#busy.get(run.path);
        if (busy !== undefined) busy.again = true;
        else p.unrefLater(() => this.settle(run.path, run.dir, false), 0);
      }
      this.#host.poll();
      return;
    }
    run.fd = fd;
    this.#kept++;
    run.unclose = p.watchClose(run.path, () => this.onClose(run));
    // No watch sees the close: only the re-scan finds a crash.
    if (run.unclose === undefined && !p.watchSeesClose) this.#host.poll();
  }

  /** A held run whose holder is gone: its record stays, stale. */
  #toStale(run: Run): void {
    run.state = "stale";
    run.wake = undefined;
    this.#unkeep(run);
  }

  /** Closes a run's descriptor and close watch (it is re-scanned instead). */
  #unkeep(run: Run): void {
    run.unclose?.();
    run.unclose = undefined;
    if (run.fd !== undefined) {
      run.fd.close();
      run.fd = undefined;
      this.#kept--;
    }
  }

  untrack(run: Run): void {
    this.#toStale(run);
    if (this.runs.get(run.path) === run) this.runs.delete(run.path);
    run.dir.runs.delete(run.path);
  }
}
