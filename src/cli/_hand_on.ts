/**
 * `runlock run` hands the lock's descriptor on to its command, as flock(1)
 * does: if runlock dies (SIGKILL, the OOM killer), the command, and what it
 * started with the descriptor open, still holds the flock.
 *
 * @module
 */

import { spawnSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { process } from "../_process.ts";
import {
  DESCRIPTOR,
  type Descriptor,
  type Inheritable,
  NAME_CHILD,
} from "../file/_inherit.ts";

/**
 * The descriptor number that holds `lock`'s flock in this process;
 * undefined when there is none (a PostgreSQL session cannot be handed on);
 * null when its number cannot be found (Deno without FFI, and no `sh` or
 * no /proc for the helper).
 */
export function lockDescriptor(lock: object): number | null | undefined {
  const method = (lock as Partial<Inheritable>)[DESCRIPTOR];
  if (typeof method !== "function") return undefined;
  const d = method.call(lock);
  if (d === undefined) return null;
  return d.fd ?? findDescriptor(d) ?? null;
}

/** O_CLOEXEC, as /proc/<pid>/fdinfo's octal `flags:` line shows it. */
const O_CLOEXEC = 0o2000000;

/**
 * The command's stdio: runlock's own, then the lock's descriptor `fd` at
 * `wanted` (9, as flock(1) users expect), or at the first number above it
 * that the command would not keep anyway (open without close-on-exec, or
 * flocked: a run inside a run has the outer lock at 9). Descriptors
 * runlock was given holding a flock are passed on at their own numbers:
 * Bun marks every inherited descriptor close-on-exec. Where this process's
 * descriptors cannot be listed, at `wanted`.
 */
export function handedOn(
  fd: number,
  wanted: number,
): ("inherit" | "ignore" | number)[] {
  const taken = new Set<number>();
  const keep: number[] = [];
  for (const [n, text] of descriptors()) {
    if (n < 3 || n === fd) continue;
    const flags = /^flags:\s+([0-7]+)$/m.exec(text);
    if (/^lock:\s+\d+: FLOCK /m.test(text)) {
      keep.push(n);
      taken.add(n);
    } else if (flags && (parseInt(flags[1], 8) & O_CLOEXEC) === 0) {
      taken.add(n);
    }
  }
  let at = wanted;
  while (taken.has(at)) at++;
  const stdio = Array.from(
    { length: Math.max(3, at + 1, ...keep.map((n) => n + 1)) },
    (_, i): "inherit" | "ignore" | number => i < 3 ? "inherit" : "ignore",
  );
  for (const n of keep) stdio[n] = n;
  stdio[at] = fd;
  return stdio;
}

/**
 * This process's descriptors and their /proc/<pid>/fdinfo text, read by a
 * helper `sh` where this runtime may not (Deno without --allow-read).
 */
function descriptors(): [number, string][] {
  const dir = `/proc/${process.pid}/fdinfo`;
  try {
    const out: [number, string][] = [];
    for (const name of readdirSync(dir)) {
      try {
        out.push([Number(name), readFileSync(`${dir}/${name}`, "utf8")]);
      } catch {
        // Closed meanwhile.
      }
    }
    return out;
  } catch {
    // Not readable here: the helper.
  }
  try {
    const found = spawnSync("sh", [
      "-c",
      'cd /proc/"$1"/fdinfo 2>/dev/null || exit 0; for f in *; do ' +
      'printf "%s\\n" "$f"; cat "$f" 2>/dev/null; printf "\\036\\n"; done',
      "sh",
      String(process.pid),
    ], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] });
    return String(found.stdout ?? "").split("\x1e\n").flatMap((entry) => {
      const at = entry.indexOf("\n");
      const n = Number(entry.slice(0, at));
      return at > 0 && Number.isInteger(n) ? [[n, entry.slice(at + 1)]] : [];
    }) as [number, string][];
  } catch {
    return [];
  }
}

/**
 * Writes the command's PID into the record's `child=` line, so that readers
 * name the command if runlock dies while it runs. Returns why it could
 * not, or `""` (also for a PostgreSQL lock, which has no such line).
 */
export function nameChild(lock: object, pid: number): string {
  const method = (lock as Partial<Inheritable>)[NAME_CHILD];
  if (typeof method !== "function") return "";
  try {
    method.call(lock, pid);
    return "";
  } catch (err) {
    return err instanceof Error ? err.message : String(err);
  }
}

/**
 * Under Deno without FFI a file has a resource id, not a descriptor
 * number: the one fdinfo that shows the flock names it ("lock: 1: FLOCK
 * ADVISORY WRITE <pid> <major>:<minor>:<inode> 0 EOF"; only the inode and
 * pid are matched, as the device there is the superblock's, not stat's).
 * A helper `sh` reads it, as Deno may not read /proc.
 */
function findDescriptor(d: Descriptor): number | undefined {
  if (process.platform !== "linux") return undefined;
  const pattern =
    `FLOCK +ADVISORY +WRITE +${process.pid} +[0-9a-f]+:[0-9a-f]+:${d.ino} `;
  try {
    const found = spawnSync("sh", [
      "-c",
      'grep -l -E -e "$1" /proc/"$2"/fdinfo/* 2>/dev/null; true',
      "sh",
      pattern,
      String(process.pid),
    ], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] });
    const hits = String(found.stdout ?? "").split("\n").filter((l) => l !== "");
    if (hits.length !== 1) return undefined;
    const fd = Number(hits[0].slice(hits[0].lastIndexOf("/") + 1));
    return Number.isInteger(fd) && fd >= 3 ? fd : undefined;
  } catch {
    return undefined;
  }
}
