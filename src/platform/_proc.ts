/**
 * Linux answers every platform reads the same way: where an open
 * directory's /proc/self/fd/N link points, and what `kill(pid, 0)` says
 * of a pid.
 *
 * @module
 */

import type { Liveness } from "./types.ts";

const EPERM = 1;
const ESRCH = 3;

/**
 * The directory an open descriptor's /proc/self/fd/N link names, or `""`
 * when it names none: empty, not absolute, or removed (the kernel adds
 * " (deleted)"; a live directory may be named so too, and is then named
 * another way).
 */
export function linkedDir(target: string): string {
  return target.startsWith("/") && !target.endsWith(" (deleted)") ? target : "";
}

/**
 * A pid's liveness from libc's `kill(pid, 0)`: its result, and errno when
 * it failed (EPERM: alive, another user's; ESRCH: dead).
 */
export function killLiveness(result: number, errno: () => number): Liveness {
  if (result === 0) return "alive";
  const e = errno();
  return e === ESRCH ? "dead" : e === EPERM ? "alive" : "unknown";
}
