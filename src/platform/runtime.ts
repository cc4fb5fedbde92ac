/**
 * What any part of runlock may ask of the runtime without loading the
 * platform (whose import refuses all but Linux x86_64, and loads FFI): its
 * name, Deno's permissions (asked without a prompt) and the host name.
 *
 * @module
 */

import { hostname } from "node:os";
import { process } from "../_process.ts";

/** A permission Deno may grant. */
export type Permission =
  | { name: "env"; variable?: string }
  | { name: "sys"; kind: "hostname" }
  | { name: "run" }
  | { name: "read"; path: string }
  | { name: "net"; host?: string };

const deno = (globalThis as {
  Deno?: { permissions: { querySync(d: Permission): { state: string } } };
}).Deno;

/** The runtime this copy runs on, as a record names it. */
export const runtime: "deno" | "bun" | "node" = deno !== undefined
  ? "deno"
  : "Bun" in globalThis
  ? "bun"
  : "node";

/** Whether the runtime downloads `npm:` packages on first use (Deno). */
export const fetchesNpm: boolean = runtime === "deno";

/** Whether Deno grants this (always true under Node and Bun). */
export function granted(permission: Permission): boolean {
  return deno === undefined ||
    deno.permissions.querySync(permission).state === "granted";
}

/** A variable's value; under Deno without --allow-env, none (no prompt). */
export function envValue(variable: string): string | undefined {
  if (!granted({ name: "env", variable })) return undefined;
  return process.env[variable];
}

let cachedHost: string | undefined;
/** This host's name, or `""` where Deno may not read it (no prompt). */
export function hostName(): string {
  if (cachedHost === undefined) {
    try {
      cachedHost = granted({ name: "sys", kind: "hostname" }) ? hostname() : "";
    } catch {
      cachedHost = "";
    }
  }
  return cachedHost;
}
