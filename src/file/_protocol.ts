/**
 * What the steps of the protocol (PROTOCOL.md) share: lock paths, what an
 * attempt and a probe find, and a file's identity.
 *
 * @module
 */

import type { Dir, FileInfo, Handle } from "../platform/types.ts";
import { SysError } from "../platform/types.ts";

/** Attempts in one acquire loop before giving up as contended. */
export const MAX_ATTEMPTS = 16;

/** The lock file's mode unless the caller asks for another. */
export const DEFAULT_MODE = 0o644;

/** A lock path, split once, as the kernel sees it. */
export interface LockPath {
  /** The path as the caller gave it, for messages. */
  path: string;
  /** The directory part (`"."` for a bare name). */
  dir: string;
  /** The last component. */
  name: string;
}

/**
 * The lock's directory, pinned at acquire: every later call of that acquire
 * and of its lock goes through it, never the caller's path again.
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
  /** The live command `runlock run` handed the lock to, once `pid` died. */
  child?: number;
  /** The file's `fileKey`, when a live runlock holder of this host holds it. */
  key?: string;
  /** With `key`: the attempt's descriptor of it, for the caller to look at and close. */
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
   * `held` by a dead PID (a takeover under way, or flock(1) on a crashed
   * run's file) or garbage under a flock (a reader's flock inherited by a
   * child forked meanwhile, until its exec). Callers look again.
   */
  racing: boolean;
}

export function errnoOf(err: unknown): string | undefined {
  return err instanceof SysError ? err.code : undefined;
}

/** Splits and checks a lock path, before anything touches the disk. */
export function lockPath(path: unknown, action: string): LockPath {
  checkPath(path, "path", action);
  const name = path.slice(path.lastIndexOf("/") + 1);
  if (name === "" || name === "." || name === "..") {
    throw new TypeError(
      `Cannot ${action} as 'path' must name a file, not a directory: current value is ${
        JSON.stringify(path)
      }`,
    );
  }
  return { path, dir: dirOf(path), name };
}

/** Throws the `TypeError` of a `what` that is not a non-empty string without NUL. */
export function checkPath(
  value: unknown,
  what: "path" | "dir",
  action: string,
): asserts value is string {
  if (typeof value !== "string" || value === "" || value.includes("\0")) {
    throw new TypeError(
      `Cannot ${action} as '${what}' must be a non-empty string without NUL: current value is ${
        typeof value === "string" ? JSON.stringify(value) : String(value)
      }`,
    );
  }
}

/** The directory part of `path`: `"."` for a bare name. */
export function dirOf(path: string): string {
  const slash = path.lastIndexOf("/");
  return slash < 0 ? "." : slash === 0 ? "/" : path.slice(0, slash);
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
