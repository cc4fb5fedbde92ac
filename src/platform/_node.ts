/**
 * Node's `fs` and `util` for the Node and Bun platform, loaded by `require`,
 * and that `require` for the FFI modules (koffi, `bun:ffi`).
 * An `import` of `node:fs` or `node:util` builds an ES module facade that
 * reads every export, which loads Node's streams and its argument parser,
 * code that runlock never runs (about 3 ms of a Node start on the
 * benchmark's machine). `require` returns the module as it is.
 *
 * @module
 */

import { createRequire } from "node:module";

/** `require`, resolving from this package. */
export const load: NodeJS.Require = createRequire(import.meta.url);

/** `node:fs`. */
export const fs: typeof import("node:fs") = load("node:fs");
/** `node:util`. */
export const util: typeof import("node:util") = load("node:util");

/**
 * Whether this code runs in a Node worker thread (`worker_threads`), not
 * the main thread. Under Bun, always false: Bun's Workers close neither
 * kind of descriptor when they end, and wait without libuv's pool.
 */
export function inNodeWorker(): boolean {
  return typeof (globalThis as { Bun?: unknown }).Bun === "undefined" &&
    !(load("node:worker_threads") as typeof import("node:worker_threads"))
      .isMainThread;
}
