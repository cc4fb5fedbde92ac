// Deadlines of session statements and heartbeats.
import { clearTimeout, setTimeout } from "node:timers";

// An expired deadline decides only after one more event-loop turn: a
// process that was stopped (SIGSTOP, a blocked loop) wakes with timers
// overdue, and timers run before pending I/O is read; deciding at once
// would drop a session whose answer (a lock granted meanwhile) sits in the
// socket's buffer. The wall clock, not run time: a busy holder must still
// learn of a loss within heartbeatInterval + heartbeatTimeout, as the
// server counts.
/** The event-loop turn an expired deadline gives pending I/O. */
export const GRACE_MS = 25;

/** The longest delay a timer takes (a longer one fires at once). */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * Calls `expire` once `ms` milliseconds have passed and a turn of the
 * event loop has let pending I/O be read, unless the returned function is
 * called first. Its timers are unreferenced.
 */
export function deadline(ms: number, expire: () => void): () => void {
  const end = performance.now() + ms;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let over = false;
  const arm = (delay: number, step: () => void) => {
    // A deadline longer than MAX_TIMER_MS re-arms.
    timer = setTimeout(step, Math.min(Math.max(delay, 0), MAX_TIMER_MS));
    timer.unref();
  };
  const grace = () =>
    arm(GRACE_MS, () => {
      if (over) return;
      over = true;
      expire();
    });
  const check = () => {
    if (over) return;
    const left = end - performance.now();
    if (left > 0) arm(left, check);
    else grace();
  };
  arm(ms, check);
  return () => {
    over = true;
    clearTimeout(timer);
  };
}

/**
 * Resolves after `ms` milliseconds or when `first` settles, whichever
 * comes first (an unreferenced timer, cleared then).
 */
export function pause(ms: number, first: Promise<unknown>): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    timer.unref();
    first.then(() => {
      clearTimeout(timer);
      resolve();
    });
  });
}

/** Resolves after `ms` milliseconds. */
export function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
