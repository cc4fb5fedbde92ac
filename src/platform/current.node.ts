/**
 * The platform of the npm build: `scripts/build_npm.ts` puts this file in
 * place of `current.ts`, so no `Deno` code ships to npm.
 *
 * @module
 */

export { platform } from "./node.ts";
