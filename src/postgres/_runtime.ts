// The runtime, the host name and Deno's permission queries. Not
// src/platform/current.ts, whose import refuses every platform but Linux
// x86_64 and loads FFI: this entry point loads anywhere.
import { hostname } from "node:os";

interface PermissionDescriptor {
  name: "env" | "net" | "sys";
  host?: string;
  kind?: "hostname";
}

const deno = (globalThis as {
  Deno?: {
    permissions: {
      querySync(descriptor: PermissionDescriptor): { state: string };
    };
  };
}).Deno;

/** The runtime this copy runs on, as the record names it. */
export const runtime: "deno" | "bun" | "node" = "Deno" in globalThis
  ? "deno"
  : "Bun" in globalThis
  ? "bun"
  : "node";

/** Whether Deno grants this (always true under Node and Bun). */
export function granted(descriptor: PermissionDescriptor): boolean {
  return deno === undefined ||
    deno.permissions.querySync(descriptor).state === "granted";
}

let cachedHost: string | undefined;
/** This host's name, or "" when Deno may not read it. */
export function hostName(): string {
  if (cachedHost === undefined) {
    try {
      // Deno without --allow-sys=hostname records no host (no prompt).
      cachedHost = granted({ name: "sys", kind: "hostname" }) ? hostname() : "";
    } catch {
      cachedHost = "";
    }
  }
  return cachedHost;
}
