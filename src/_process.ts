/**
 * The running process, as the global `process` of Node, Bun and Deno.
 *
 * Not `import process from "node:process"`: on Node that module's ES module
 * facade reads every property of `process` at import, `process.report`
 * among them, which loads Node's diagnostic report code (about 7 ms of a
 * Node start on the benchmark's machine). The global is the same object.
 *
 * @module
 */

import type NodeProcess from "node:process";

/** The global `process`: the same object that `node:process` exports. */
export const process: typeof NodeProcess =
  (globalThis as unknown as { process: typeof NodeProcess }).process;
