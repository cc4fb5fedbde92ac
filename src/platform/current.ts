/**
 * The platform this build runs on. The npm build replaces this file with one
 * that exports the Node/Bun platform, so no `Deno` code ships to npm.
 *
 * @module
 */

export { platform } from "./deno.ts";
