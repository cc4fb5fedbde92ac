/**
 * `node:fs`, `node:util` and the FFI modules, loaded by `require`: an ES
 * `import`'s facade reads every export, loading Node's streams and
 * argument parser (about 3 ms of a Node start, measured).
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
 * Whether this is a Node worker thread. Never under Bun: its Workers close
 * neither kind of descriptor at their end, and wait without libuv's pool.
 */
export function inNodeWorker(): boolean {
  return typeof (globalThis as { Bun?: unknown }).Bun === "undefined" &&
    !(load("node:worker_threads") as typeof import("node:worker_threads"))
      .isMainThread;
}
