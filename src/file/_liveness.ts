/**
 * Liveness: whether a recorded PID lives or means a process here, whether a
 * dead `runlock run`'s command holds on, and the inodes this process holds.
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
 * `kill(pid, 0)` as a second opinion. Never 0 or negative, which always say
 * "alive" (our process group, every process): the gate every caller passes.
 */
export function liveness(pid: number): Liveness {
  if (!Number.isInteger(pid) || pid < 1 || pid > MAX_PID) return "unknown";
  if (pid === p.pid) return "alive";
  return p.processAlive(pid);
}

const fdinfoDecoder = new TextDecoder();

/**
 * The record's `child=` when it holds the flock of inode `ino`, else 0
 * (PROTOCOL.md, "Handing the lock to a command").
 */
export function heir(record: Record, ino: number): number {
  return record.kind === "runlock" && childHolds(record.child, ino)
    ? record.child
    : 0;
}

/**
 * Whether `child` shows inode `ino`'s FLOCK WRITE lock in its
 * `/proc/<child>/fdinfo`. Where those may not be read (another user's, or
 * Deno without --allow-all), a live child is taken at its record's word.
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
 * Whether a foreign pidfile's PID may be alive. Our own PID means nothing (a
 * container's service is PID 1 on every boot, as was the run that left it).
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
 * Dates by inode, keyed by the inode number (a `dev:ino` string cost two
 * conversions and a hash per acquire); other devices' are chained.
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

/** The locks this process holds, by inode: a second acquire fails at once. */
export const heldHere = new HeldInodes();

/** Where a record's PID lives, if not here: `kill` cannot judge it. */
export function elsewhere(
  record: { host: string; boot: string; pidns: string },
): "host" | "boot" | "namespace" | undefined {
  const { boot, pidns } = p.identity();
  // Boot id and namespace decide when both sides know them (a container has
  // a host name of its own); else the host name.
  if (record.boot && boot && record.boot !== boot) return "boot";
  if (record.pidns && pidns && record.pidns !== pidns) return "namespace";
  if (record.boot && boot && record.pidns && pidns) return undefined;
  const host = p.hostname();
  if (record.host && host && record.host !== host) return "host";
  return undefined;
}
