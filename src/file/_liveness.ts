/**
 * Liveness: whether a recorded PID lives (as a second opinion to the
 * flock), whether it means the same process here, whether a dead
 * `runlock run`'s command holds on, and the inodes this process holds.
 *
 * @module
 */

import { platform as p } from "../platform/current.ts";
import {
  type FileInfo,
  type Handle,
  type Liveness,
  SysError,
} from "../platform/types.ts";
import { MAX_PID, MAX_RECORD_BYTES, type Record } from "./record.ts";

/**
 * `kill(pid, 0)` as a second opinion. Never with 0 or a negative number:
 * `kill(0, 0)` probes our own process group and `kill(-1, 0)` every
 * process, so both always say "alive". (The record's readers already read
 * anything else as no PID; this is the one gate every caller passes.)
 */
export function liveness(pid: number): Liveness {
  if (!Number.isInteger(pid) || pid < 1 || pid > MAX_PID) return "unknown";
  if (pid === p.pid) return "alive";
  return p.processAlive(pid);
}

const fdinfoDecoder = new TextDecoder();

/**
 * The command a dead `runlock run` handed the lock to, when it holds the
 * lock on (PROTOCOL.md, "Handing the lock to a command"): the record's
 * `child=`, if that process holds the flock of the lock file, inode `ino`;
 * else 0.
 */
export function heir(record: Record, ino: number): number {
  return record.kind === "runlock" && childHolds(record.child, ino)
    ? record.child
    : 0;
}

/**
 * Whether the command `runlock run` handed a lock to (the record's
 * `child=`) holds the flock of the lock file, inode `ino`: one of its
 * descriptors shows that inode's FLOCK WRITE lock in
 * `/proc/<child>/fdinfo`. Then a held flock under a dead runlock is that
 * command's, not a takeover in progress. A PID that lives but holds no
 * such lock (reused, or a command that closed fd 9 while what it started
 * keeps it) is not named. Where its descriptors may not be read (another
 * user's command, or Deno without --allow-all, which guards /proc), a
 * live command is taken at its record's word. False without /proc.
 */
function childHolds(child: number, ino: number): boolean {
  if (liveness(child) !== "alive" || child === p.pid) return false;
  const dir = `/proc/${child}/fdinfo`;
  let names: string[];
  try {
    names = p.readDir(dir);
  } catch (err) {
    return !(err instanceof SysError && err.code === "ENOENT");
  }
  // The device in these lines is the superblock's, which can differ from
  // stat's: the inode alone is matched, with the lock's kind.
  const lock = new RegExp(
    `FLOCK +ADVISORY +WRITE +[0-9]+ +[0-9a-f]+:[0-9a-f]+:${ino} `,
  );
  let unread = false;
  for (const name of names) {
    let h: Handle | "ENOENT";
    try {
      h = p.openExisting(`${dir}/${name}`);
    } catch {
      unread = true;
      continue;
    }
    if (h === "ENOENT") continue;
    try {
      if (lock.test(fdinfoDecoder.decode(h.readAll(MAX_RECORD_BYTES)))) {
        return true;
      }
    } catch {
      // Closed meanwhile: not this one.
    } finally {
      h.close();
    }
  }
  return unread;
}

/**
 * Whether a foreign pidfile (no runlock marker) names a run that may be
 * alive. Its PID being our own means nothing: this process cannot hold a
 * lock it has not taken (a container's service is PID 1 on every boot, and
 * so was the run that left the file).
 */
export function foreignAlive(pid: number): boolean {
  if (pid === p.pid) return false;
  return liveness(pid) !== "dead";
}

/** One held inode of {@linkcode HeldInodes}, chained by inode number. */
interface HeldInode {
  readonly dev: number;
  readonly started: Date;
  next: HeldInode | undefined;
}

/**
 * Dates by inode (device and inode number), keyed by the inode number: a
 * number key, where a `dev:ino` string cost two number-to-string
 * conversions and a string hash per acquire and per release. Inodes of
 * the same number on other devices are chained.
 */
export class HeldInodes {
  #byIno = new Map<number, HeldInode>();

  /** When the inode `id` was taken, or `undefined` if it is not held. */
  get(id: FileInfo): Date | undefined {
    for (let e = this.#byIno.get(id.ino); e !== undefined; e = e.next) {
      if (e.dev === id.dev) return e.started;
    }
    return undefined;
  }

  /** Notes the inode `id` as held since `started`. */
  set(id: FileInfo, started: Date): void {
    this.delete(id);
    this.#byIno.set(id.ino, {
      dev: id.dev,
      started,
      next: this.#byIno.get(id.ino),
    });
  }

  /** Forgets the inode `id`. */
  delete(id: FileInfo): void {
    const first = this.#byIno.get(id.ino);
    if (first === undefined) return;
    if (first.dev === id.dev) {
      if (first.next === undefined) this.#byIno.delete(id.ino);
      else this.#byIno.set(id.ino, first.next);
      return;
    }
    for (let e = first; e.next !== undefined; e = e.next) {
      if (e.next.dev === id.dev) {
        e.next = e.next.next;
        return;
      }
    }
  }
}

/**
 * The locks this process holds, by inode, with when each was taken. A
 * second acquire of one of them (through any path: the same, a relative
 * one, a symlinked directory, a hard link) fails at once with HeldError
 * instead of waiting on our own flock: locks are not reentrant.
 */
export const heldHere = new HeldInodes();

/**
 * Whether a record's PID lives where it cannot mean a process of ours: it
 * names another host, boot or PID namespace than this process's (each only
 * when both sides know it). Such a PID cannot be checked with `kill` here.
 */
export function elsewhere(
  record: { host: string; boot: string; pidns: string },
): "host" | "boot" | "namespace" | undefined {
  const { boot, pidns } = p.identity();
  // The boot id and the PID namespace decide when both sides know them: the
  // same kernel boot and namespace mean the same PID, whatever the host
  // name says (a container has a name of its own). Else the host name.
  if (record.boot && boot && record.boot !== boot) return "boot";
  if (record.pidns && pidns && record.pidns !== pidns) return "namespace";
  if (record.boot && boot && record.pidns && pidns) return undefined;
  const host = p.hostname();
  if (record.host && host && record.host !== host) return "host";
  return undefined;
}
