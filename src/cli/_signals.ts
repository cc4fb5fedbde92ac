/**
 * The signals `runlock run` forwards to its command's process group.
 *
 * @module
 */

import { constants } from "node:os";
import { process } from "../_process.ts";

/**
 * Signals `run` leaves alone (README, "Signals"): SIGKILL and SIGSTOP
 * cannot be caught; SIGCHLD is runlock's own child's; a fault (SIGSEGV,
 * SIGBUS, SIGFPE, SIGILL) must not go on holding the lock, and Node warns
 * that its listener can hang the process; SIGPIPE stays ignored, as every
 * runtime has it: a listener, once removed, would leave it fatal.
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
 * Job-control stops: in the command's own session the kernel discards them
 * (an orphaned process group), so runlock sends SIGSTOP to the group and
 * then itself, as dumb-init does in its setsid mode.
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
 * Every signal `run` listens to, one name per number (SIGIOT is SIGABRT),
 * so that none is forwarded twice. Not SIGPWR under Bun, whose
 * JavaScriptCore takes it to suspend threads.
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
