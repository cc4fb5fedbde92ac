/**
 * How a waiter waits (see "Waiting" in PROTOCOL.md): the sleeps between its
 * looks, and the whole acquire as steps that yield each sleep, which the
 * async and sync forms of `acquire` drive.
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
 * An async waiter's sleeps while its watches do not see the holder's death
 * (see `Woken.watched`). Its looks only cover a missed event, and each costs
 * a wake-up (0.3 ms of CPU or more: 50 waiters polling every 5 ms burnt both
 * cores). Where the watch sees a close, that is only while a watch is
 * refused: 1 s. Elsewhere, without the close watch, a look is what finds a
 * dead holder: 250 ms.
 */
export const ASYNC_SLEEPS: Sleeps = {
  max: p.watchSeesClose ? 1000 : 250,
  growth: 4,
};
/**
 * The cap while the watches tell of the holder's end, its release and its
 * death (see `Woken.watched`). At one look a second, 50 waiters burnt
 * 0.75-1.2 CPU-s in 6 s, most of it in the wake-ups.
 */
const WATCHED_MAX = 5000;
/**
 * The cap while no event tells of the holder's end: a plain pidfile, an
 * empty file under `flock(1)` (read-only: no IN_CLOSE_WRITE), a holder on
 * another host.
 */
const UNWATCHED_MAX = 250;
/** The longest a waiter goes on quick looks before a whole probe. */
const WHOLE_LOOK_MS = 10_000;
/** A synchronous waiter cannot watch: it looks more often. */
export const SYNC_SLEEPS: Sleeps = { max: 50, growth: 2 };

/** Tells the steps that a sleep was cut short by an event. */
export interface Woken {
  woken: boolean;
  /**
   * The event says the holder's file went or its holder closed it, so the
   * next step is the attempt, not a look: `false` where it may be a new
   * holder's file coming (Deno's watch of the directory).
   */
  ended?: boolean;
  /**
   * The watches see both the file's end and its holder's close (Node and
   * Bun on Linux: the close watch; Deno: the file's own watch): with a
   * runlock holder on this host, the cap is then `WATCHED_MAX`.
   */
  watched?: boolean;
}

/**
 * The whole acquire: attempt loops and, while the lock is held and time
 * remains, read-only looks between them until it looks free. Yields each
 * sleep, none past the deadline (so a timeout fires on time). `onSleep`,
 * called before each sleep, watches the file that is there now and answers
 * its identity (`fileKey`, read after the watches were armed), `""` when
 * there is none, or `undefined` when it does not watch. Closes the pinned
 * directory unless it returns.
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
    // A sleep to the deadline that ran out ends the wait: timers fire up to
    // 1.6 ms before performance.now() says the time is up.
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
          // Just taken by another waiter of this process, woken by the same
          // event: still held. Only before the wait does that fail at once.
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
      // What the last whole probe saw held, for the quick looks; at first,
      // what the attempt saw where it saw what a probe would (then the first
      // look asks the flock of the attempt's own descriptor, opening nothing).
      let seen: Pick<Probe, "pid"> | undefined;
      let seenKey = "";
      let seenAt = 0;
      if (kept !== undefined && !(held instanceof ContendedError)) {
        seen = { pid: held.pid };
        seenKey = held.key!;
        seenAt = performance.now();
      }
      // After an event the looks ramp up from 1 ms (a holder's close comes
      // microseconds before its flock goes); otherwise they go to the cap.
      let ramp = evented;
      evented = false;
      /**
       * The first look at a holder the attempt saw: the shared flock of the
       * attempt's own descriptor, which it then closes. Whether it is free.
       */
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
      /**
       * A whole look (the read-only probe): whether the lock is no longer
       * held. Notes what it saw held for the quick looks.
       */
      const lookWhole = (): boolean => {
        const found = probe(target, target.pinned);
        if (found.state !== "held") return true;
        seen = found;
        seenAt = performance.now();
        // Whether an event will tell of this holder's end: a runlock record
        // of this host, its writer holding the flock (not `racing`: a
        // read-only holder's close is no IN_CLOSE_WRITE).
        seenKey = found.marker && !found.far && !found.racing && found.pid > 0
          ? fileKey(target.pinned, target.name)
          : "";
        if (seenKey === "") seen = undefined;
        return false;
      };
      // The watches (their key) under which the last look was made:
      // none for the attempt, made before they were armed.
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
        // No file to watch, or the watches are on another file than the one
        // last seen held (its event may have come and gone): look at once.
        const now = armed === "" ||
          (armed !== undefined && seen !== undefined && armed !== seenKey);
        if (kept !== undefined && armed !== undefined) {
          // The first look, at once now that the watches are armed: a
          // holder that ended before told no event, and a zombie's PID still
          // answers kill, so its flock says. Where no watch is armed, it
          // comes after the first sleep.
          if (lookKept()) break;
          if (!now && seen !== undefined && !ramp) interval = capOf(armed);
        } else if (
          armed !== undefined && armed !== lookedUnder && !now &&
          seen !== undefined && capOf(armed) === WATCHED_MAX
        ) {
          // The watches are armed only now (a Deno watch refused until a
          // turn later) over a holder seen before them: as after the
          // attempt, look at once, by a whole probe this time.
          if (lookWhole()) break;
          if (seen !== undefined && !ramp) interval = capOf(armed);
        }
        // While the watches tell of the holder's end, a look due less than
        // half a sleep before the deadline is left to the attempt at the
        // deadline, which sees all a look sees: one wake-up fewer.
        const left = remaining();
        const sleep = now ? 0 : interval >= left ||
            (capOf(armed) === WATCHED_MAX && left - interval < interval / 2)
          ? Math.max(0, left)
          : interval;
        yield sleep;
        due = !now && sleep >= left && !wake.woken;
        // The holder's file went or was closed: attempt at once. A look
        // first would only find what the attempt finds, and cost the
        // hand-off a cold probe.
        if (wake.woken && wake.ended) {
          evented = true;
          break;
        }
        // The deadline: its attempt sees what a look would.
        if (due) break;
        if (kept !== undefined && lookKept()) break;
        // A quick look (lstat and kill(pid, 0), no open) where the watches
        // tell of this holder's end; otherwise a whole look, since a zombie
        // or an exec'd holder still answers kill. A look that opens the file
        // is an event for every other waiter's watch on Deno (IN_OPEN: 50
        // waiters' looks were 2,500 thread wake-ups each time round). A whole
        // look every `WHOLE_LOOK_MS` catches a PID reused after a missed
        // event.

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
