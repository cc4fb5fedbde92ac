// Deadlines of session statements and heartbeats, on this process's
// running time.
import {
  clearInterval,
  clearTimeout,
  setInterval,
  setTimeout,
} from "node:timers";

// Deadlines count the time this process ran, not the wall clock's.
//
// A process that was not running (SIGSTOP, Ctrl-Z, a blocked event loop)
// wakes with its deadline timers overdue, and timers run before pending
// I/O is read: a deadline measured on the wall clock calls a session dead
// whose answer is already in the socket's buffer (a
// waiter stopped in the server's queue was granted the lock while stopped,
// and on `fg` said "did not answer a statement within 10000 ms", closed
// its session and so dropped the lock it had just been given). While it
// was not running, nothing it sent may have left (a write still queued in
// the runtime), so the time it was stopped proves nothing about the
// server either. So:
//
// - a shared ticker (one per process, only while a deadline is armed)
//   adds up the time between its ticks, each gap counted up to
//   CREDIT_MS: a gap longer than that is time the process did not run;
// - a deadline expires when `ms` of that running time have passed since
//   it was armed (a timer that fires early re-arms for what is left);
// - and then only after one more event-loop turn (GRACE_MS) in which
//   pending I/O is read, a turn that itself ran on time: if the process
//   was stopped during it, it takes another.
// A server that truly stopped answering (a frozen link) is still declared
// lost: without a stop, running time is wall time, and after a stop it is
// declared lost within `ms` of the resume, at the latest.
const TICK_MS = 100;
const CREDIT_MS = 300;
/** The last event-loop turn before a deadline decides (HEARTBEAT_GRACE_MS). */
const GRACE_MS = 25;
let ran = 0;
let lastTick = 0;
let armed = 0;
let ticker: ReturnType<typeof setInterval> | undefined;

/** Milliseconds this process ran while the clock was on (see above). */
function running(): number {
  const now = performance.now();
  ran += Math.min(now - lastTick, CREDIT_MS);
  lastTick = now;
  return ran;
}

function clockOn(): void {
  if (armed++ > 0) return;
  lastTick = performance.now();
  ticker = setInterval(running, TICK_MS);
  ticker.unref();
}

function clockOff(): void {
  if (--armed > 0) return;
  clearInterval(ticker);
  ticker = undefined;
}

/**
 * Calls `expire` once `ms` of this process's running time have passed
 * and a turn of the event loop has let pending I/O be read, unless the
 * returned function is called first. Its timers are unreferenced.
 */
export function deadline(ms: number, expire: () => void): () => void {
  clockOn();
  const start = running();
  let timer: ReturnType<typeof setTimeout> | undefined;
  let over = false;
  const end = () => {
    if (over) return false;
    over = true;
    clearTimeout(timer);
    clockOff();
    return true;
  };
  const arm = (delay: number, step: () => void) => {
    // (Timers take at most 2^31 - 1 ms; a longer deadline re-arms.)
    timer = setTimeout(step, Math.min(delay, 2 ** 31 - 1));
    timer.unref();
  };
  const grace = () => {
    const since = performance.now();
    arm(GRACE_MS, () => {
      // Not running during the turn (stopped again): its I/O is unread.
      if (performance.now() - since > GRACE_MS + CREDIT_MS) grace();
      else if (end()) expire();
    });
  };
  const check = () => {
    const left = ms - (running() - start);
    if (left > 0) arm(left, check);
    else grace();
  };
  arm(ms, check);
  return () => void end();
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
