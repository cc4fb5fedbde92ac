/**
 * When {@linkcode watch} looks again without an event to say what changed:
 * a re-scan soon after a burst of events (the watch may have dropped
 * some), and periodic passes where the runtime's watch cannot be relied on
 * alone. A pass is a re-scan, or only a look at each directory.
 *
 * @module
 */

import { platform as p } from "../platform/current.ts";

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

/** The timer of one watch's passes, and what decides when they run. */
export class Rescans {
  #timer: (() => void) | undefined;
  /** When the pending pass is due (performance.now()). */
  #at = 0;
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

  /**
   * @param open Whether the watch is open: its first batch out, its end
   * not begun.
   * @param pass A pass: a re-scan (every directory listed, what differs
   * looked at), or only a check that each directory is still at its path.
   */
  constructor(
    readonly open: () => boolean,
    readonly pass: (rescan: boolean) => void,
  ) {}

  /** A directory watch was made: what the runtime's watch may miss. */
  watched(): void {
    if (p.watchLosesQuietly) this.#safety = true;
    if (p.watchMissesRemoval) this.#blind = true;
  }

  /**
   * Something cannot be watched: re-scan every second, from the next pass
   * on, or with `now` the first now (once open).
   */
  poll(now: boolean): void {
    if (this.#poll) return;
    this.#poll = true;
    if (now && this.open()) this.#schedule(POLL_MS);
  }

  /** The first batch is out: the periodic passes begin. */
  start(): void {
    if (this.#periodic()) this.#schedule(this.#period());
  }

  /** Cancels the pending pass. */
  stop(): void {
    this.#timer?.();
    this.#timer = undefined;
  }

  /**
   * An event; `lapse`: the watch lost events and says so. The first event
   * of a burst (the last re-scan saw none new), or a lapse, gets a re-scan
   * soon, not at the next of the periodic passes, which may be seconds
   * away.
   */
  event(lapse: boolean): void {
    const soon = this.#scanned || lapse;
    this.#eventsSince = true;
    this.#scanned = false;
    this.#lastEvent = performance.now();
    if (
      this.#timer === undefined ||
      (soon && this.#at > this.#lastEvent + RECHECK_FIRST_MS)
    ) this.#schedule(RECHECK_FIRST_MS);
  }

  #schedule(ms: number): void {
    this.#timer?.();
    this.#at = performance.now() + ms;
    this.#timer = p.unrefLater(() => this.#pass(), ms);
  }

  #pass(): void {
    this.#timer = undefined;
    if (!this.open()) return;
    const again = this.#eventsSince;
    this.#eventsSince = false;
    // Due before the next pass would be late: at most BACKSTOP_MS apart.
    const due = performance.now() - this.#lastScan +
        (this.#periodic() ? this.#period() : 0) > BACKSTOP_MS;
    if (this.#poll || this.#safety || !this.#scanned || due) {
      this.#lastScan = performance.now();
      this.pass(true);
      if (!again) this.#scanned = true;
    } else {
      this.pass(false);
    }
    if (this.#periodic()) this.#schedule(this.#period());
    else if (again) this.#schedule(RECHECK_MS);
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
}
