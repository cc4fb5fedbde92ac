// The PostgreSQL backend's only look at Deno: permission queries, so that a
// missing grant becomes a clear error naming the flag, never a prompt
// (as the file backend promises). Undefined outside Deno: everything is
// allowed there.

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

/** Whether Deno grants this (always true under Node and Bun). */
export function granted(descriptor: PermissionDescriptor): boolean {
  return deno === undefined ||
    deno.permissions.querySync(descriptor).state === "granted";
}
