/**
 * When {@linkcode watch} looks again without an event: a re-scan after a
 * burst of events (some may be dropped), and periodic passes where the
 * runtime's watch cannot be relied on alone.
 *
 * @module
 */

import { platform as p } from "../platform/current.ts";

/** After events, a re-scan (ms) to catch what the watch may have dropped. */
const RECHECK_FIRST_MS = 250;
const RECHECK_MS = 1000;
/** The re-scan's period where there is no watch to wait for (ms). */
const POLL_MS = 1000;
/** The passes' period once quiet for {@linkcode QUIET_MS} (ms); 1 s before. */
const QUIET_POLL_MS = 5000;
const QUIET_MS = 10_000;
/**
 * The period of the looks at each directory where they are the only pass
 * (Deno), once quiet (ms). A wake-up costs Deno 0.3-0.4 ms of CPU: every
 * 5 s, an idle watch of 1,000 runs added 0.09 ms a second.
 */
const QUIET_LOOK_MS = 10_000;
/**
 * A re-scan at least this often (ms) where a watch may go deaf unsaid (Deno:
 * one inotify watch per inode, so a directory renamed away and back, or under
 * two paths, reports nothing more).
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
   * @param open Whether the watch is open (first batch out, not ending).
   * @param pass A re-scan, or only a check of each directory's path.
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

  /** Something cannot be watched: re-scan every second (`now`: from now). */
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
   * An event (`lapse`: the watch lost events). A burst's first event, or a
   * lapse, gets a re-scan soon, not at the next periodic pass.
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

  /** Whether passes run periodically. */
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
