// Deadlines of session statements and heartbeats.
import { clearTimeout, setTimeout } from "node:timers";

// A deadline of `ms` on the wall clock, decided only after one more turn
// of the event loop.
//
// A process that was not running (SIGSTOP, Ctrl-Z, a blocked event loop)
// wakes with its deadline timers overdue, and timers run before pending
// I/O is read: deciding at once would call a session dead whose answer
// (a lock granted while stopped) already sits in the socket's buffer, and
// closing it would drop that lock. So an expired deadline first lets the
// event loop read what arrived (one turn, GRACE_MS), and decides then.
//
// The wall clock, not the time the process ran: a holder whose event loop
// is busy (synchronous work in chunks) must still learn of a lost session
// within heartbeatInterval + heartbeatTimeout (plus its longest chunk),
// before the server can hand the lock to anyone else; time a busy loop
// spent is time the server counted too.
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
