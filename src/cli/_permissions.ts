/**
 * What Deno grants the CLI, asked without a prompt (under Node and Bun,
 * everything).
 *
 * @module
 */

import { process } from "../_process.ts";

/** Whether Deno grants this (always true under Node and Bun). */
export function granted(
  descriptor:
    | { name: "env"; variable: string }
    | { name: "sys"; kind: "hostname" }
    | { name: "run" }
    | { name: "read"; path: string },
): boolean {
  const deno = (globalThis as {
    Deno?: { permissions: { querySync(d: unknown): { state: string } } };
  }).Deno;
  return deno === undefined ||
    deno.permissions.querySync(descriptor).state === "granted";
}

/** A variable's value; under Deno without --allow-env, none (no prompt). */
export function envValue(variable: string): string | undefined {
  if (!granted({ name: "env", variable })) return undefined;
  return process.env[variable];
}
