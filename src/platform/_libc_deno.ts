/**
 * libc's `fstatat(2)` for the Deno platform, through `Deno.dlopen`, where
 * the process may use the FFI and read files without a scope
 * (`--allow-ffi --allow-read`, `-A`) on Linux x86-64 or arm64.
 *
 * Why: Deno reports a missing file only by throwing, and an exception
 * costs more than the system call (an lstat of a missing file: 11 µs
 * through `Deno.lstatSync`, against 3 µs for one that exists and 0.7 µs
 * through libc), so `held()` of a free lock was 9.6× a failed open in C
 * (issue 17). Here the call returns -1 and errno says ENOENT.
 *
 * A path that is no C string (a NUL in it, or too long to encode) and a
 * process without the grant go through `Deno.lstatSync` as before.
 *
 * Loaded on the first probe, never at import.
 *
 * @module
 */

import {
  decodeStat,
  STAT_BYTES,
  STAT_LAYOUT,
  STAT_VER,
  type StatLayout,
} from "./_stat.ts";
import type { FileInfo } from "./types.ts";

const AT_FDCWD = -100;
const AT_SYMLINK_NOFOLLOW = 0x100;
const ENOENT = 2;

const CPU: Record<string, string> = { x86_64: "x64", aarch64: "arm64" };
const cpu = CPU[Deno.build.arch] ?? "";

const statBuf = new Uint8Array(STAT_BYTES);
const statView = new DataView(statBuf.buffer);
const encoder = new TextEncoder();
// PATH_MAX (4096) bytes and its NUL; a longer path fails in the kernel.
const pathBuf = new Uint8Array(4097);

interface Bound {
  fstatat(path: Uint8Array): number;
  errno(): number;
  layout: StatLayout;
}

let bound: Bound | undefined;
let tried = false;

/** libc's fstatat, bound on first use, or `undefined` where it cannot be. */
function bind(): Bound | undefined {
  if (tried) return bound;
  tried = true;
  const layout = Deno.build.os === "linux" ? STAT_LAYOUT[cpu] : undefined;
  if (!layout) return undefined;
  try {
    // The FFI, and reading without a scope or a --deny-read: then Deno's
    // op would never refuse a path that libc answers for. Asked once per
    // process, as the platform's other permission answers are.
    for (const name of ["ffi", "read"] as const) {
      const { state, partial } = Deno.permissions.querySync({ name });
      if (state !== "granted" || partial) return undefined;
    }
    const i32 = "i32";
    const { symbols: s } = Deno.dlopen(
      "libc.so.6",
      {
        // glibc 2.33 and later, musl.
        fstatat: {
          parameters: [i32, "buffer", "buffer", i32],
          result: i32,
          optional: true,
        },
        // glibc before 2.33 (see STAT_VER).
        __fxstatat64: {
          parameters: [i32, i32, "buffer", "buffer", i32],
          result: i32,
          optional: true,
        },
        __errno_location: { parameters: [], result: "pointer" },
      } as const,
    );
    const at = s.fstatat;
    const xat = s.__fxstatat64;
    const ver = STAT_VER[cpu];
    const where = s.__errno_location();
    if ((!at && !xat) || where === null) return undefined;
    // The main thread's errno lives at one address for the thread's life
    // (a Worker loads its own copy of this module, on its own thread).
    const errno = new Deno.UnsafePointerView(where);
    const candidate: Bound = {
      fstatat: at
        ? (path) => at(AT_FDCWD, path, statBuf, AT_SYMLINK_NOFOLLOW)
        : (path) => xat!(ver, AT_FDCWD, path, statBuf, AT_SYMLINK_NOFOLLOW),
      errno: () => errno.getInt32(),
      layout,
    };
    if (agrees(candidate)) bound = candidate;
  } catch {
    // No libc.so.6 (a static or non-glibc build), or a refusal: Deno's ops.
  }
  return bound;
}

/** Whether the decoded `fstatat` of `/` reads as `Deno.lstatSync`'s. */
function agrees(b: Bound): boolean {
  const path = cString("/");
  if (path === undefined || b.fstatat(path) !== 0) return false;
  const ours = decodeStat(statView, b.layout);
  const theirs = Deno.lstatSync("/");
  return ours.dev === theirs.dev && ours.ino === theirs.ino &&
    ours.kind === "directory" && ours.mode === ((theirs.mode ?? 0) & 0o7777) &&
    ours.uid === theirs.uid && ours.size === theirs.size;
}

/** `s` as a C string, or `undefined` when it cannot be one. */
function cString(s: string): Uint8Array | undefined {
  if (s.includes("\0")) return undefined;
  const { read, written } = encoder.encodeInto(s, pathBuf);
  if (read !== s.length || written >= pathBuf.length) return undefined;
  pathBuf[written] = 0;
  return pathBuf;
}

/**
 * `lstat(2)` of `path` through libc: its struct, `null` when it does not
 * exist (ENOENT), the errno of any other failure, or `undefined` when
 * libc cannot be asked here (then ask `Deno.lstatSync`).
 */
export function lstatLibc(path: string): FileInfo | null | number | undefined {
  const b = bound ?? bind();
  if (b === undefined) return undefined;
  const c = cString(path);
  if (c === undefined) return undefined;
  if (b.fstatat(c) === 0) return decodeStat(statView, b.layout);
  const errno = b.errno();
  return errno === ENOENT ? null : errno;
}
