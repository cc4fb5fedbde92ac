/**
 * `runlock run` hands the lock's descriptor on to its command, as
 * flock(1) does: the command (and what it starts, unless it closes the
 * descriptor) holds the flock too, so that if runlock's own process dies
 * (SIGKILL, the OOM killer) the lock lives on until the command ends.
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
 * undefined when there is none to hand on (a PostgreSQL lock, whose
 * session cannot be handed on); null when there is one but its number
 * cannot be found (Deno without FFI, where the helper that reads /proc
 * cannot run: no `sh`, no /proc).
 *
 * @param lock A held lock of either backend.
 * @returns The descriptor number, undefined, or null.
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

/** Where the command gets the lock's descriptor, and what else it keeps. */
export interface Numbers {
  /** The lock's descriptor number in the command. */
  at: number;
  /**
   * Descriptors runlock was given holding a flock (a run inside a run, a
   * flock(1) script's `exec 9>`), passed on at their own numbers: Bun
   * marks every descriptor it was given close-on-exec as it starts.
   */
  keep: number[];
}

/**
 * Where to hand the lock on: at `wanted` (9, as flock(1) users expect),
 * unless runlock was itself given a descriptor there that its command
 * would keep too (open and not close-on-exec, or holding a flock: a run
 * inside a run has the outer lock at 9), then at the first number above
 * it that is free so. Where this process's descriptors cannot be listed
 * (no /proc, no `sh`), at `wanted`, keeping nothing more than the runtime
 * passes on.
 *
 * @param wanted The number to hand the lock on at if it is free.
 * @param own The lock's descriptor in this process, which is not kept.
 * @returns The number, and the flocked descriptors to pass on.
 */
export function handNumbers(wanted: number, own: number): Numbers {
  const taken = new Set<number>();
  const keep: number[] = [];
  for (const [n, text] of descriptors()) {
    if (n < 3 || n === own) continue;
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
  return { at, keep: keep.sort((a, b) => a - b) };
}

/**
 * This process's descriptors and their /proc/<pid>/fdinfo text: read
 * here, or, where this runtime may not read /proc (Deno without
 * --allow-all), by a helper `sh`, as {@linkcode lockDescriptor} finds its
 * number. None where neither can.
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
 * Writes the command's PID into the lock's record (its `child=` line), so
 * that readers name the command if runlock itself dies while it runs.
 * Returns why it could not, or `""`; a lock without the line (PostgreSQL)
 * is no failure.
 *
 * @param lock A held lock of either backend.
 * @param pid The command's PID.
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
 * number: the number is found in /proc/<pid>/fdinfo, where only the
 * descriptor that owns the flock shows it ("lock: 1: FLOCK ADVISORY WRITE
 * <pid> <major>:<minor>:<inode> 0 EOF"; the device's numbers there are
 * the superblock's, which can differ from stat's, so only the inode and
 * the pid are matched). A helper process reads it, since Deno's own file
 * APIs may not read /proc without --allow-read for it; exactly one match
 * counts.
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
