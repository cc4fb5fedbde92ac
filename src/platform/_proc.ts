/**
 * Linux answers every platform reads the same way: where an open
 * directory's /proc/self/fd/N link points, what `kill(pid, 0)` says of a
 * pid, and the process's identity in /proc.
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
 * The Linux boot id and the inode of this process's PID namespace, read
 * with the runtime's calls (`""` each where /proc cannot tell).
 */
export function procIdentity(
  readText: (path: string) => string,
  readLink: (path: string) => string,
): { boot: string; pidns: string } {
  let boot = "";
  let pidns = "";
  try {
    boot = readText("/proc/sys/kernel/random/boot_id").trim();
  } catch {
    // Not Linux, or no /proc.
  }
  try {
    pidns = /^pid:\[(\d+)\]$/.exec(readLink("/proc/self/ns/pid"))?.[1] ?? "";
  } catch {
    // Not Linux, or no /proc.
  }
  return { boot, pidns };
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
