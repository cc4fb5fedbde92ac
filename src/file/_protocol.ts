/**
 * What the steps of the runlock protocol (see PROTOCOL.md) share: lock
 * paths, what an attempt and a probe find, and a file's identity. The steps
 * live beside it: `acquire` and its steps (`lock.ts`, `_wait.ts`), the held
 * lock (`_held.ts`), the attempt loop (`_attempt.ts`), contention and takeover
 * (`_contend.ts`), the litter sweep (`_sweep.ts`), the read-only probe
 * (`_probe.ts`), liveness (`_liveness.ts`), the errors of failed system
 * calls (`_error_map.ts`), what this process writes (`_record_here.ts`)
 * and its temp files' names (`_temp_name.ts`). Everything goes through the
 * platform interface, never a runtime directly.
 *
 * @module
 */

import type { Dir, FileInfo, Handle } from "../platform/types.ts";
import { SysError } from "../platform/types.ts";

/** Attempts in one acquire loop before giving up as contended. */
export const MAX_ATTEMPTS = 16;

/** The lock file's mode unless the caller asks for another. */
export const DEFAULT_MODE = 0o644;

/**
 * A lock path, split once. `dir` and `name` are what the kernel sees: the
 * path's directory part (as given, resolved only when pinned) and its last
 * component.
 */
export interface LockPath {
  /** The path as the caller gave it, for messages. */
  path: string;
  /** The directory part (`"."` for a bare name). */
  dir: string;
  /** The last component. */
  name: string;
}

/**
 * The lock's directory, resolved once and pinned at acquire: every later
 * system call of that acquire and of the lock it returns names `file` (or a
 * temp file beside it), never the caller's path again.
 */
export interface Target extends LockPath {
  /** The pinned directory. */
  pinned: Dir;
}

/** The lock was taken: our descriptor (holding LOCK_EX) and its inode. */
export interface Acquired {
  handle: Handle;
  id: FileInfo;
  started: Date;
  /**
   * The pinned directory's canonical path when the file was linked there,
   * or `""` where it cannot be told (see `placed` in `_attempt.ts`).
   */
  dir?: string;
}

/** A live run holds the lock. */
export interface HeldBy {
  pid: number;
  host: string;
  started: Date | undefined;
  /**
   * The live command `runlock run` handed the lock to, when `pid` (that
   * runlock) is gone; otherwise 0 or absent.
   */
  child?: number;
  /**
   * The identity of the file (`fileKey`'s form) when the attempt saw it
   * held by a live runlock holder of this host, as a whole look would.
   */
  key?: string;
  /**
   * With `key`: the attempt's read-only descriptor of that file, open and
   * unlocked, for the caller's first look (its flock), which the caller
   * closes.
   */
  kept?: Handle;
}

/** The three answers a probe gives, plus `invalid`. */
export type State = "free" | "held" | "stale" | "invalid";

/** What a probe found. */
export interface Probe {
  state: State;
  pid: number;
  host: string;
  started: Date | undefined;
  foreign: boolean;
  reason: string | undefined;
  /** Whether the file holds a runlock record (the marker on line 2). */
  marker: boolean;
  /** The record's `runtime=`, or `""`. */
  runtime: string;
  /** The record's boot id and PID namespace, or `""`. */
  boot: string;
  pidns: string;
  /** The record's user fields. */
  meta: { [key: string]: string };
  /** The record's `child=`: the command `runlock run` handed it to, or 0. */
  child: number;
  /** With `racing`: the PID lives elsewhere, so `kill` could not judge it. */
  far: boolean;
  /**
   * `held`, but by a PID that is provably dead: a peer in the microseconds
   * of a takeover (or a tool such as flock(1) on a crashed run's file); or
   * a garbage file under a flock, which may be a lock taken only to read it
   * that lives on in a child forked meanwhile, until its exec (or flock(1)
   * holding a file it wrote). Callers look again before answering.
   */
  racing: boolean;
}

export function errnoOf(err: unknown): string | undefined {
  return err instanceof SysError ? err.code : undefined;
}

/**
 * Splits and checks a lock path: one rule for every entry point, before
 * anything touches the disk. The last component must name a file.
 */
export function lockPath(path: unknown, action: string): LockPath {
  if (typeof path !== "string" || path === "" || path.includes("\0")) {
    throw new TypeError(
      `Cannot ${action} as 'path' must be a non-empty string without NUL: current value is ${
        typeof path === "string" ? JSON.stringify(path) : String(path)
      }`,
    );
  }
  const slash = path.lastIndexOf("/");
  const name = path.slice(slash + 1);
  if (name === "" || name === "." || name === "..") {
    throw new TypeError(
      `Cannot ${action} as 'path' must name a file, not a directory: current value is ${
        JSON.stringify(path)
      }`,
    );
  }
  const dir = slash < 0 ? "." : slash === 0 ? "/" : path.slice(0, slash);
  return { path, dir, name };
}

/** `dir + "/" + name` without doubling the slash after "/". */
export function within(dir: string, name: string): string {
  return dir.endsWith("/") ? dir + name : `${dir}/${name}`;
}

/** Whether `a` is the file `b` (same device and inode). */
export function sameFile(a: FileInfo | null, b: FileInfo): boolean {
  return a !== null && a.dev === b.dev && a.ino === b.ino;
}

/** A file's identity, `dev:ino`: one spelling for every map keyed by it. */
export function inodeKey(info: { dev: number; ino: number }): string {
  return `${info.dev}:${info.ino}`;
}
