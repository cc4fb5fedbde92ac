/**
 * {@linkcode watch}'s runs: what was last reported at each path, and the
 * decision of each change when a path is looked at again (see PROTOCOL.md,
 * "Watching", for why each kind is decided the way it is). One look at a
 * time per path, so that a path's changes stay in order.
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
 * How long a held run's name may be gone while its holder still holds the
 * inode's flock before the run counts as `lost` (ms). A clean release
 * unlinks and closes in one go (microseconds apart); a holder whose file
 * someone else deleted holds on until it notices and lets go.
 */
const LOST_MS = 1000;
/** How long a stale file's removal waits for the acquire taking it over (ms). */
const TAKEOVER_MS = 1000;
/** Sleeps (ms) between looks at a held run's flock after its name went. */
const END_SLEEPS = [0, 1, 2, 4, 8, 16, 32, 64, 128, 250];
/**
 * Looks again (ms) after a holder's close while its flock still shows held:
 * the kernel reports the close a moment before it drops the flock.
 */
const CLOSE_SLEEPS = [0, 1, 2, 4, 8, 16, 32];
/**
 * Descriptors given back when the kept ones ran the process out of them
 * (`EMFILE`): the runtime and the looks need some.
 */
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
   * Seen dead: its flock found free, and then its name found still naming
   * its inode (a clean release unlinks before it lets go). Looked at on
   * its holder's close, so that a waiter that takes the file over before
   * the watch looks again does not hide the crash.
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
   * Looks at `path` and reports what changed since the last report, one
   * look at a time per path (a path's changes stay in order). `closed`: a
   * holder's close is why.
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
    if (this.#host.done) return;
    if (seen.kind === "unknown") {
      // Out of descriptors: nothing is known of the path; look again (and
      // the re-scan looks too), never taking it for "not a lock".
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
    // Still a dead PID under a held flock (flock(1) on a crashed run's
    // file?): as held, as inspect() answers after its looks.
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
      if (this.runs.get(path) !== rep || this.#host.done) return;
      this.untrack(rep);
      const seen = d.dropped
        ? { kind: "none", other: false } as Seen
        : look(path);
      this.#host.push(path, kind, noneInspection(path, seen));
      return this.#decide(path, d, undefined, false, seen, false);
    };
    const fd = rep.fd;
    if (
      fd === undefined || freeBefore || flockFree(fd) || releasedByRun(fd)
    ) {
      // Its flock and its name both gone: which went first is not known
      // from what is there now, unless it was seen dead at its close (a
      // waiter took the file over since). Otherwise released: never a
      // crash that was not seen (the order of the two events cannot be
      // had: on Node and Bun they come through two watches, which Bun
      // delivered out of the kernel's order 7 times in 30; Deno's watch
      // drops events in bursts).
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
      // The kept descriptors ran the process out of them: keep fewer from
      // now on, and give some back at once, so that the runtime and the
      // looks have some. A run without one is re-scanned every second.
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
        // Replaced since the look, or out of descriptors: look again now,
        // and in every re-scan while it has none.
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
    // Without a close watch, and a directory watch that sees the close,
    // only the re-scan finds a crash.
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
