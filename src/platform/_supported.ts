/**
 * The one platform runlock's file locks run on: Linux on x86_64, where its
 * tests run (the FFI's struct layouts, flock's and /proc's behaviour).
 *
 * @module
 */

import { UnsupportedPlatformError } from "../errors.ts";

/**
 * Throws {@linkcode UnsupportedPlatformError} unless `os` is Linux and
 * `arch` is x86_64 (`x64` in Node's words, `x86_64` in Deno's).
 */
export function checkPlatform(os: string, arch: string): void {
  if (os === "linux" && (arch === "x64" || arch === "x86_64")) return;
  throw new UnsupportedPlatformError(os, arch);
}
