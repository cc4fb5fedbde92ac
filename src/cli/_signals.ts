/**
 * The signals `runlock run` listens to and forwards to its command's
 * process group, the ones it leaves alone, and the job-control stops.
 *
 * @module
 */

import { constants } from "node:os";
import { process } from "../_process.ts";

/**
 * Signals `run` leaves alone, each on purpose (README, "Signals"):
 *
 * - SIGKILL and SIGSTOP cannot be caught.
 * - SIGCHLD reports runlock's own child; it is not meant for the command.
 * - SIGSEGV, SIGBUS, SIGFPE and SIGILL report a fault in runlock itself
 *   (native code, the FFI): a process in that state must not go on holding
 *   the lock, and Node's documentation warns that a listener for a real
 *   fault can hang the process. Deno does not let a program catch three of
 *   them at all.
 * - SIGPIPE is ignored by every runtime (a write to a closed pipe fails with
 *   EPIPE instead), and runlock keeps it ignored: listening would turn
 *   runlock's own EPIPE into a signal for the command, and removing the
 *   listener afterwards would leave SIGPIPE fatal.
 */
const NOT_HANDLED = new Set([
  "SIGKILL",
  "SIGSTOP",
  "SIGCHLD",
  "SIGSEGV",
  "SIGBUS",
  "SIGFPE",
  "SIGILL",
  "SIGPIPE",
]);

/**
 * Job-control stops. The command runs in its own session (see `run`), where
 * the kernel discards a stop signal whose action is the default one (its
 * process group is orphaned), so runlock stops the command's group with
 * SIGSTOP and then itself, and continues it on SIGCONT: what dumb-init does
 * in its setsid mode.
 */
export const STOPS: ReadonlySet<string> = new Set([
  "SIGTSTP",
  "SIGTTIN",
  "SIGTTOU",
]);

/** Signals whose default action is to do nothing: they never end a wait. */
export const HARMLESS: ReadonlySet<string> = new Set([
  "SIGCONT",
  "SIGURG",
  "SIGWINCH",
  "SIGINFO",
]);

/**
 * Every signal `run` listens to: one name per signal number (SIGIOT is
 * SIGABRT, SIGPOLL is SIGIO, SIGUNUSED is SIGSYS), so that no signal is
 * forwarded twice. Bun's JavaScriptCore takes SIGPWR to suspend threads: a
 * listener would never run, so runlock does not ask for one there.
 */
export const HANDLED: readonly NodeJS.Signals[] = (() => {
  const seen = new Set<number>();
  const names: NodeJS.Signals[] = [];
  const bun = "Bun" in globalThis;
  for (const [name, number] of Object.entries(constants.signals)) {
    if (seen.has(number)) continue;
    seen.add(number);
    if (NOT_HANDLED.has(name) || (bun && name === "SIGPWR")) continue;
    names.push(name as NodeJS.Signals);
  }
  return names;
})();

/** `kill(-pgid, signal)`; a group that is gone already is not an error. */
export function signalGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch (err) {
    if ((err as { code?: string }).code !== "ESRCH") throw err;
  }
}

/** A signal's number (SIGTERM: 15), or 0 for a name this platform lacks. */
export function signalNumber(name: string): number {
  return (constants.signals as Record<string, number>)[name] ?? 0;
}
