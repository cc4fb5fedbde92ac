/**
 * What every platform reads of Linux alike: /proc and `kill(pid, 0)`.
 *
 * @module
 */

import type { Liveness } from "./types.ts";

const EPERM = 1;
const ESRCH = 3;

/**
 * The directory a /proc/self/fd/N link names, or `""`: empty, or removed
 * (" (deleted)"; a live one so named is then found another way).
 */
export function linkedDir(target: string): string {
  return target.startsWith("/") && !target.endsWith(" (deleted)") ? target : "";
}

/** {@linkcode Platform.identity}, read with the runtime's calls. */
export function procIdentity(
  readText: (path: string) => string,
  readLink: (path: string) => string,
): { boot: string; pidns: string } {
  let boot = "";
  let pidns = "";
  try {
    boot = readText("/proc/sys/kernel/random/boot_id").trim();
  } catch {
    // No /proc.
  }
  try {
    pidns = /^pid:\[(\d+)\]$/.exec(readLink("/proc/self/ns/pid"))?.[1] ?? "";
  } catch {
    // No /proc.
  }
  return { boot, pidns };
}

/** Liveness from `kill(pid, 0)`'s result and errno (EPERM: another user's). */
export function killLiveness(result: number, errno: () => number): Liveness {
  if (result === 0) return "alive";
  const e = errno();
  return e === ESRCH ? "dead" : e === EPERM ? "alive" : "unknown";
}
