/**
 * How a waiter waits (PROTOCOL.md, "Waiting"): the whole acquire as steps
 * that yield each sleep, for the async and sync forms of `acquire`.
 *
 * @module
 */

import { liveness } from "./_liveness.ts";
import type { Acquired, HeldBy, Probe, Target } from "./_protocol.ts";
import { attemptLoop } from "./_attempt.ts";
import { probe } from "./_probe.ts";
import { fileKey } from "./_events.ts";
import type { Checked } from "./_options.ts";
import { ContendedError, HeldError } from "../errors.ts";
import { platform as p } from "../platform/current.ts";
import type { Handle } from "../platform/types.ts";

/** How a waiter's sleeps between two looks grow, and up to what. */
export interface Sleeps {
  /** The longest sleep, in milliseconds. */
  max: number;
  /** The factor from one sleep to the next. */
  growth: number;
}

/**
 * An async waiter's sleeps while its watches do not see the holder's death.
 * A look costs a wake-up (0.3 ms of CPU or more: 50 waiters polling every
 * 5 ms burnt both cores). Where watches see closes, that is only while a
 * watch is refused: 1 s; elsewhere a look finds a dead holder: 250 ms.
 */
export const ASYNC_SLEEPS: Sleeps = {
  max: p.watchSeesClose ? 1000 : 250,
  growth: 4,
};
/**
 * The cap while the watches tell of the holder's end: at one look a second,
 * 50 waiters burnt 0.75-1.2 CPU-s in 6 s.
 */
const WATCHED_MAX = 5000;
/** The cap while no event tells of the holder's end (a pidfile, flock(1)). */
const UNWATCHED_MAX = 250;
/** The longest a waiter goes on quick looks before a whole probe. */
const WHOLE_LOOK_MS = 10_000;
/** A synchronous waiter cannot watch: it looks more often. */
export const SYNC_SLEEPS: Sleeps = { max: 50, growth: 2 };

/** Tells the steps that a sleep was cut short by an event. */
export interface Woken {
  woken: boolean;
  /** The event says the holder's file went or was closed: attempt next. */
  ended?: boolean;
  /**
   * The watches see the file's end and its holder's close (Node and Bun: the
   * close watch; Deno: the file's watch): the cap is `WATCHED_MAX`.
   */
  watched?: boolean;
}

/**
 * The whole acquire: attempt loops and, while held and time remains,
 * read-only looks until it looks free. Yields each sleep, none past the
 * deadline. `onSleep` watches the file there now and answers its `fileKey`
 * (read after arming), `""` for none, `undefined` when it does not watch.
 * Closes the pinned directory unless it returns.
 */
export function* acquireSteps(
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
    // A sleep to the deadline ends the wait: timers fire up to 1.6 ms before
    // performance.now() says the time is up.
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
          // Taken by another waiter of this process woken by the same event:
          // still held (only before the wait does that fail at once).
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
      // What the last whole probe (at first, the attempt) saw held.
      let seen: Pick<Probe, "pid"> | undefined;
      let seenKey = "";
      let seenAt = 0;
      if (kept !== undefined && !(held instanceof ContendedError)) {
        seen = { pid: held.pid };
        seenKey = held.key!;
        seenAt = performance.now();
      }
      // After an event the looks ramp up from 1 ms (a close comes before its
      // flock goes); otherwise they go to the cap.
      let ramp = evented;
      evented = false;
      /** Whether the flock of the attempt's descriptor is free; closes it. */
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
      /** A probe: whether no longer held; notes what it saw held. */
      const lookWhole = (): boolean => {
        const found = probe(target, target.pinned);
        if (found.state !== "held") return true;
        seen = found;
        seenAt = performance.now();
        // Whether an event will tell of this holder's end (not `racing`: a
        // read-only holder's close is no IN_CLOSE_WRITE).
        seenKey = found.marker && !found.far && !found.racing && found.pid > 0
          ? fileKey(target.pinned, target.name)
          : "";
        if (seenKey === "") seen = undefined;
        return false;
      };
      // The watches' key at the last look (none for the attempt).
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
        // No file, or another file than the one seen held: look at once.
        const now = armed === "" ||
          (armed !== undefined && seen !== undefined && armed !== seenKey);
        if (kept !== undefined && armed !== undefined) {
          // Now that the watches are armed: a holder that ended before told
          // no event, and a zombie's PID still answers kill.
          if (lookKept()) break;
          if (!now && seen !== undefined && !ramp) interval = capOf(armed);
        } else if (
          armed !== undefined && armed !== lookedUnder && !now &&
          seen !== undefined && capOf(armed) === WATCHED_MAX
        ) {
          // Armed only now (Deno refused a watch until a turn later) over a
          // holder seen before them: look at once.
          if (lookWhole()) break;
          if (seen !== undefined && !ramp) interval = capOf(armed);
        }
        // A look due less than half a sleep before the deadline is left to
        // the deadline's attempt: one wake-up fewer.
        const left = remaining();
        const sleep = now ? 0 : interval >= left ||
            (capOf(armed) === WATCHED_MAX && left - interval < interval / 2)
          ? Math.max(0, left)
          : interval;
        yield sleep;
        due = !now && sleep >= left && !wake.woken;
        // Attempt at once: a look first would cost the hand-off a probe.
        if (wake.woken && wake.ended) {
          evented = true;
          break;
        }
        // The deadline: its attempt sees what a look would.
        if (due) break;
        if (kept !== undefined && lookKept()) break;
        // A quick look (lstat, kill; no open) where the watches tell of this
        // holder's end, else a probe (a zombie still answers kill). An open
        // is an event for every waiter's watch on Deno (IN_OPEN: 50 waiters
        // made 2,500 wake-ups a round). A probe every `WHOLE_LOOK_MS` catches
        // a PID reused after a missed event.
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
