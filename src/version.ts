/**
 * The package version, kept in code so that a compiled binary needs no file
 * at run time. tests/cli/commands_test.ts checks it against deno.json.
 *
 * @module
 */

/** This version of runlock. */
export const VERSION = "0.1.0";
