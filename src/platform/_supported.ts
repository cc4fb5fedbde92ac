/**
 * The one platform the file locks run on, where the tests run (the FFI's
 * struct layouts, flock's and /proc's behaviour): Linux on x86_64.
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
