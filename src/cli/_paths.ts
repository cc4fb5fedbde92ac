/**
 * Lock paths the CLI refuses before the library sees them: a directory,
 * and anything on /proc.
 *
 * @module
 */

import { lstatSync, realpathSync, statfsSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { granted } from "../platform/runtime.ts";

/** statfs(2)'s f_type of procfs (PROC_SUPER_MAGIC, linux/magic.h). */
const PROC_SUPER_MAGIC = 0x9fa0;

/**
 * Throws when `path` cannot be a lock file: a directory, or on /proc.
 * Where it cannot tell (Deno without read access), the library answers.
 */
export function checkLockPath(path: string): void {
  const shown = path.length > 1 ? path.replace(/\/+$/, "") || "/" : path;
  const proc = onProc(shown);
  if (proc !== undefined) {
    throw new Error(
      `${shown}: is on /proc${
        proc === "" ? "" : `, as ${proc}`
      }, a virtual filesystem that holds no lock files: choose a lock path on a real filesystem`,
    );
  }
  let directory = false;
  try {
    // Asked first: Deno would prompt on a terminal.
    directory = granted({ name: "read", path: shown }) &&
      lstatSync(shown).isDirectory();
  } catch {
    // Missing, or not ours to look at: the library says which.
  }
  if (directory) {
    throw new Error(
      `${shown}: is a directory, not a lock file; runlock leaves it as it is. ` +
        `Choose another path for the lock, such as ${shown}/run.lock`,
    );
  }
}

/**
 * Whether `path` is on /proc: `""` when its name says so, the real path
 * of its nearest existing directory when a symlink leads there (/dev/fd),
 * undefined when not (or unknown). Refused because Node's recursive
 * mkdirSync of a missing directory there loops at 100% CPU, deaf to
 * SIGTERM (procfs answers ENOENT to mkdir although the parent exists).
 */
function onProc(path: string): string | undefined {
  let abs: string;
  try {
    abs = resolve(path);
  } catch {
    return undefined;
  }
  if (isProc(abs)) return "";
  for (let dir = dirname(abs);; dir = dirname(dir)) {
    let real: string;
    try {
      if (!granted({ name: "read", path: dir })) return undefined;
      real = realpathSync(dir);
    } catch (err) {
      const code = (err as { code?: string }).code;
      if ((code === "ENOENT" || code === "ENOTDIR") && dir !== "/") continue;
      return undefined;
    }
    if (isProc(real)) return real;
    // procfs mounted elsewhere (a container's /host/proc). Not asked under
    // Deno, which fails there at once and would want --allow-sys=statfs.
    if ("Deno" in globalThis) return undefined;
    try {
      if (statfsSync(real).type === PROC_SUPER_MAGIC) return real;
    } catch {
      // Unknown: not refused.
    }
    return undefined;
  }
}

function isProc(path: string): boolean {
  return path === "/proc" || path.startsWith("/proc/");
}
