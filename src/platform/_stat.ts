/**
 * Linux's `struct stat`, decoded from the bytes `fstatat(2)`/`fstat(2)`
 * write: shared by the platforms that call libc through an FFI (Node's
 * koffi, `bun:ffi`, Deno's `Deno.dlopen`). No runtime API here.
 *
 * @module
 */

import type { FileInfo } from "./types.ts";

/** Where st_mode, st_uid and st_size are (st_dev and st_ino: 0 and 8). */
export interface StatLayout {
  /** Offset of st_mode (32 bits). */
  mode: number;
  /** Offset of st_uid (32 bits). */
  uid: number;
  /** Offset of st_size (64 bits). */
  size: number;
}

/**
 * `struct stat` as Linux returns it (glibc, musl: the kernel's layout), by
 * CPU as Node names it, for the architectures whose layout is written here.
 * Elsewhere (macOS, the BSDs, other CPUs) the FFI's stat stays off.
 */
export const STAT_LAYOUT: Record<string, StatLayout> = {
  x64: { mode: 24, uid: 28, size: 48 }, // arch/x86/include/uapi/asm/stat.h
  arm64: { mode: 16, uid: 24, size: 48 }, // include/uapi/asm-generic/stat.h
};

/**
 * glibc's `_STAT_VER` for `__fxstatat64`/`__fxstat64`, which stand for
 * `fstatat`/`fstat` before glibc 2.33 (it had no such symbols: Debian 11,
 * Ubuntu 20.04, RHEL 8). The same struct either way.
 */
export const STAT_VER: Record<string, number> = { x64: 1, arm64: 0 };

/** Bytes enough for the kernel's struct stat (144 on x86-64, 128 on arm64). */
export const STAT_BYTES = 256;

const S_IFMT = 0o170000;

/** Whether the struct in `view` is a regular file's. */
export function statIsFile(view: DataView, l: StatLayout): boolean {
  return (view.getUint32(l.mode, true) & S_IFMT) === 0o100000;
}

/** The struct in `view`, decoded. */
export function decodeStat(view: DataView, l: StatLayout): FileInfo {
  const mode = view.getUint32(l.mode, true);
  const type = mode & S_IFMT;
  return {
    // Two 32-bit halves: as exact as node:fs's numbers (a double each).
    dev: view.getUint32(0, true) + view.getUint32(4, true) * 2 ** 32,
    ino: view.getUint32(8, true) + view.getUint32(12, true) * 2 ** 32,
    size: view.getUint32(l.size, true) +
      view.getInt32(l.size + 4, true) * 2 ** 32,
    mode: mode & 0o7777,
    uid: view.getUint32(l.uid, true),
    kind: type === 0o100000
      ? "file"
      : type === 0o040000
      ? "directory"
      : type === 0o120000
      ? "symlink"
      : "other",
  };
}
