/**
 * Linux x86-64's `struct stat` (arch/x86/include/uapi/asm/stat.h), decoded
 * from the bytes `fstatat(2)`/`fstat(2)` write through an FFI.
 *
 * @module
 */

import type { FileInfo } from "./types.ts";

/**
 * glibc's `_STAT_VER` for `__fxstatat64`/`__fxstat64`, which stand for
 * `fstatat`/`fstat` before glibc 2.33 (Debian 11, Ubuntu 20.04, RHEL 8).
 */
export const STAT_VER = 1;

/** Bytes enough for the kernel's struct stat (144). */
export const STAT_BYTES = 256;

const S_IFMT = 0o170000;
const MODE = 24;

/** Whether the struct in `view` is a regular file's. */
export function statIsFile(view: DataView): boolean {
  return (view.getUint32(MODE, true) & S_IFMT) === 0o100000;
}

/** The struct in `view`, decoded. */
export function decodeStat(view: DataView): FileInfo {
  const mode = view.getUint32(MODE, true);
  const type = mode & S_IFMT;
  return {
    // Two 32-bit halves: as exact as node:fs's numbers (a double each).
    dev: view.getUint32(0, true) + view.getUint32(4, true) * 2 ** 32,
    ino: view.getUint32(8, true) + view.getUint32(12, true) * 2 ** 32,
    size: view.getUint32(48, true) + view.getInt32(52, true) * 2 ** 32,
    mode: mode & 0o7777,
    uid: view.getUint32(28, true),
    kind: type === 0o100000
      ? "file"
      : type === 0o040000
      ? "directory"
      : type === 0o120000
      ? "symlink"
      : "other",
  };
}
