/**
 * What a Deno process may do, queried, never requested (a missing grant is
 * a `NOTCAPABLE` {@linkcode SysError}); paths resolved as the kernel does;
 * Deno's errors as {@linkcode SysError}s.
 *
 * No node: imports in the Deno platform's files: the first loads Deno's
 * Node layer, about 15 ms of every program's start.
 *
 * @module
 */

import { ERRNO, forgetReadGrant, type Libc, libc } from "./_libc_deno.ts";
import { SysError } from "./types.ts";

/** Whether this is Linux, where libc and /proc may serve. */
export const LINUX = Deno.build.os === "linux";

const BY_CLASS: [new (...args: never[]) => Error, string][] = [
  [Deno.errors.NotFound, "ENOENT"],
  [Deno.errors.AlreadyExists, "EEXIST"],
  [Deno.errors.PermissionDenied, "EACCES"],
  [Deno.errors.NotCapable, "NOTCAPABLE"],
  [Deno.errors.IsADirectory, "EISDIR"],
  [Deno.errors.NotADirectory, "ENOTDIR"],
  [Deno.errors.FilesystemLoop, "ELOOP"],
  [Deno.errors.NotSupported, "ENOTSUP"],
];

/** A Deno error (its code, or the errno in its message) as a SysError. */
export function sysError(
  err: unknown,
  syscall: string,
  path: string,
): SysError {
  if (err instanceof SysError) return err;
  let code = "EUNKNOWN";
  const errno = (err as { code?: unknown } | null)?.code;
  const osError = /\(os error (\d+)\)/.exec(
    err instanceof Error ? err.message : "",
  );
  if (err instanceof Deno.errors.NotCapable) {
    code = "NOTCAPABLE";
  } else if (typeof errno === "string") {
    code = errno;
  } else if (LINUX && osError && ERRNO[Number(osError[1])]) {
    code = ERRNO[Number(osError[1])];
  } else {
    for (const [cls, name] of BY_CLASS) {
      if (err instanceof cls) {
        code = name;
        break;
      }
    }
  }
  const message = err instanceof Error ? err.message : String(err);
  return new SysError(code, syscall, `${syscall} '${path}': ${message}`, {
    cause: err,
  });
}

/** The directory part of a path; node:path's dirname is slow on the hot path. */
export function parent(path: string): string {
  const slash = path.lastIndexOf("/");
  return slash < 0 ? "." : slash === 0 ? "/" : path.slice(0, slash);
}

let allAccess: boolean | undefined;
const ALL = ["read", "write", "net", "env", "sys", "run", "ffi", "import"];
let listening = false;

/**
 * Whether every permission is granted without scope or --deny: checks are
 * skipped, and /proc may be read (else "Requires all access"). Every
 * answer cached here is forgotten when a permission changes.
 */
export function hasAllAccess(): boolean {
  if (allAccess === undefined) {
    // Each name is asked: Deno tells of a change only through a status.
    let all = true;
    for (const name of ALL) {
      try {
        const status = Deno.permissions.querySync(
          { name } as Deno.PermissionDescriptor,
        );
        if (!listening) status.addEventListener("change", forgetGrants);
        if (status.state !== "granted" || status.partial) all = false;
      } catch {
        all = false;
      }
    }
    listening = true;
    allAccess = all;
  }
  return allAccess;
}

/** Forgets every cached permission answer (a permission changed). */
function forgetGrants(): void {
  allAccess = undefined;
  atLibc = undefined;
  runOk = undefined;
  granted.clear();
  forgetReadGrant();
}

// Grants only (a refusal may turn into one), per "read:/abs/dir" (a
// relative one is another after a chdir). Bounded: a server may lock a
// new directory per job.
const granted = new Set<string>();
const MAX_GRANTED = 4096;

/**
 * Throws `NOTCAPABLE` unless `name` (read or write) is granted for `dir`.
 */
export function need(
  name: "read" | "write",
  dir: string,
  syscall: string,
): void {
  if (hasAllAccess()) return;
  const abs = dir.startsWith("/") ? dir : `${Deno.cwd()}/${dir}`;
  const key = `${name}:${abs}`;
  if (granted.has(key)) return;
  const { state } = Deno.permissions.querySync({ name, path: abs });
  if (state !== "granted") {
    throw new SysError(
      "NOTCAPABLE",
      syscall,
      `${syscall} '${abs}': requires --allow-${name}=${abs}`,
      { grant: `--allow-${name}=${abs}` },
    );
  }
  if (granted.size >= MAX_GRANTED) granted.clear();
  granted.add(key);
}

// A Worker's end closes its Deno files (dropping their flocks), never an
// FFI descriptor: there, Deno's ops serve. A node:worker_threads worker's
// scope hides the WorkerGlobalScope name but not its class.
const IN_WORKER =
  typeof (globalThis as { WorkerGlobalScope?: unknown }).WorkerGlobalScope !==
    "undefined" ||
  Object.getPrototypeOf(globalThis)?.constructor?.name ===
    "DedicatedWorkerGlobalScope";

let atLibc: Libc | null | undefined;
/**
 * libc for every call of a lock (`_at.ts`), or `null` where Deno's ops
 * serve: only with every permission granted, on Linux, outside Workers.
 */
export function at(): Libc | null {
  if (atLibc === undefined) {
    atLibc = LINUX && !IN_WORKER && hasAllAccess() ? libc() ?? null : null;
  }
  return atLibc;
}

let runOk: boolean | undefined;
/** Whether `--allow-run` is granted (needed by `Deno.kill`). */
export function mayRun(): boolean {
  if (runOk !== true) {
    runOk = Deno.permissions.querySync({ name: "run" }).state === "granted";
  }
  return runOk;
}

/** Whether a path has a `..` component. */
function hasDotDot(path: string): boolean {
  return path === ".." || path.startsWith("../") || path.endsWith("/..") ||
    path.includes("/../");
}

/**
 * `path` with each `..` resolved as the kernel does, after the symlinks
 * before it. Without every permission Deno's ops resolve `..` by the text,
 * so `link/../run.lock` would be another file than flock(1), Node or
 * `deno -A` lock (two holders). `null` where a directory before a `..` is
 * missing; with `create`, it is made (for `mkdirp`).
 */
export function kernelPath(path: string, create = false): string | null {
  if (!hasDotDot(path) || hasAllAccess()) return path;
  let out = path.startsWith("/") ? "/" : "";
  for (const part of path.split("/")) {
    if (part === "" || part === ".") continue;
    if (part !== "..") {
      out = out === ""
        ? part
        : out.endsWith("/")
        ? out + part
        : `${out}/${part}`;
      continue;
    }
    const base = out === "" ? "." : out;
    let real: string;
    try {
      if (create) {
        need("write", base, "mkdir");
        Deno.mkdirSync(base, { recursive: true });
      }
      need("read", base, "realpath");
      real = Deno.realPathSync(base);
      // The kernel walks `..` only out of a directory.
      need("read", real, "stat");
      if (!Deno.statSync(real).isDirectory) {
        throw new SysError(
          "ENOTDIR",
          "realpath",
          `realpath '${base}/..': Not a directory`,
        );
      }
    } catch (err) {
      const mapped = sysError(err, "realpath", base);
      if (mapped.code === "ENOENT") return null;
      throw mapped;
    }
    const slash = real.lastIndexOf("/");
    out = slash <= 0 ? "/" : real.slice(0, slash);
  }
  return out === "" ? "." : out;
}

/** `kernelPath`, where a missing directory before a `..` is ENOENT. */
export function existingPath(
  given: string,
  syscall: string,
  create = false,
): string {
  const path = kernelPath(given, create);
  if (path !== null) return path;
  throw new SysError(
    "ENOENT",
    syscall,
    `${syscall} '${given}': No such file or directory`,
  );
}
