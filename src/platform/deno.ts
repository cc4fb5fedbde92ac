/**
 * The Deno implementation of {@linkcode Platform}: the only file that
 * touches `Deno.*`.
 *
 * Permissions are queried, never requested: a missing grant becomes a
 * `NOTCAPABLE` {@linkcode SysError} instead of a prompt. Answers that are
 * "granted" are cached per directory, so the hot path asks once per process.
 *
 * @module
 */

import { openAt, openDirAt } from "./_at_deno.ts";
import {
  AT_FDCWD,
  ERRNO,
  forgetReadGrant,
  type Libc,
  libc,
  lstatLibc,
} from "./_libc_deno.ts";
import {
  type Dir,
  type FileInfo,
  type Handle,
  type Liveness,
  type Platform,
  SysError,
} from "./types.ts";
import { checkPlatform } from "./_supported.ts";
import { killLiveness, linkedDir } from "./_proc.ts";
import { watchPath } from "./_watch_deno.ts";
import { inotifyWatch } from "./_inotify_deno.ts";

// Here, before anything else runs: the only platform the tests run on.
checkPlatform(Deno.build.os, Deno.build.arch);

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

function sysError(err: unknown, syscall: string, path: string): SysError {
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

// No node: imports in this file: the first one makes Deno load its Node
// compatibility layer, which adds about 15 ms to every program's start.

/** The directory part of a path; node:path's dirname is slow on the hot path. */
function parent(path: string): string {
  const slash = path.lastIndexOf("/");
  return slash < 0 ? "." : slash === 0 ? "/" : path.slice(0, slash);
}

// Whether every permission is granted without scope and without a --deny
// (`--allow-all`, or every flag): permission checks can then be skipped,
// and /proc may be read (Deno refuses /proc paths with anything less:
// "Requires all access"). Asked once, and asked again after any change of a
// permission (`Deno.permissions.revoke` or `request`): every answer cached
// here is forgotten then, so a revoked grant holds for every later call.
let allAccess: boolean | undefined;
const ALL = ["read", "write", "net", "env", "sys", "run", "ffi", "import"];
let listening = false;

function hasAllAccess(): boolean {
  if (allAccess === undefined) {
    // Each name is asked (no short cut): Deno tells of a change only
    // through a status it has handed out.
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
  runGranted = undefined;
  granted.clear();
  forgetReadGrant();
}

// Permission answers that were "granted", per "read:/abs/dir". Only grants
// are cached, and only by absolute path: a relative directory means another
// one after a chdir, and calling an op on a path we have no grant for is
// what would prompt. A refusal is asked again, since a grant may follow.
// Bounded: a server that locks a new directory per job must not grow
// without end (forgetting costs one more query).
const granted = new Set<string>();
const MAX_GRANTED = 4096;

function need(name: "read" | "write", dir: string, syscall: string): void {
  if (hasAllAccess()) return;
  // Deno.cwd() needs no permission and never prompts.
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

// Deno closes a Worker's own files when it ends (terminate() included),
// and so drops their flocks; a descriptor opened through the FFI stays
// open for the life of the process, holding its lock. In a Worker, Deno's
// ops serve. A node:worker_threads worker is a Deno Worker too, whose
// global scope hides the WorkerGlobalScope name but not its class.
const IN_WORKER =
  typeof (globalThis as { WorkerGlobalScope?: unknown }).WorkerGlobalScope !==
    "undefined" ||
  Object.getPrototypeOf(globalThis)?.constructor?.name ===
    "DedicatedWorkerGlobalScope";

// Whether a watch of this process went through Deno.watchFs (no libc, or
// no inotify descriptor to be had): the flags of its failings hold.
let viaWatchFs = false;

// libc's *at() calls (`_at_deno.ts`), or null where Deno's ops serve:
// only with every permission granted, on Linux x86-64 and arm64, outside
// Workers.
let atLibc: Libc | null | undefined;
function at(): Libc | null {
  if (atLibc === undefined) {
    atLibc = LINUX && !IN_WORKER && hasAllAccess() ? libc() ?? null : null;
  }
  return atLibc;
}

/** Whether a path has a `..` component. */
function hasDotDot(path: string): boolean {
  return path === ".." || path.startsWith("../") || path.endsWith("/..") ||
    path.includes("/../");
}

/**
 * `path` with each `..` resolved as the kernel resolves it: after the
 * symlinks before it. Deno's file ops resolve `..` by the text unless every
 * permission is granted (they use the path their permission check
 * normalised), so `link/../run.lock` would be another file than the one
 * the kernel, Node, Bun, flock(1) and a Deno program run with `-A` name
 * (two holders of one lock). The real path of what comes before each `..`
 * has no `..` left, so there the text is the truth. `null` where a
 * directory before a `..` is missing: nothing there, as for the kernel.
 * With `create`, such directories are made (for `mkdirp`).
 */
function kernelPath(path: string, create = false): string | null {
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
function existingPath(given: string, syscall: string, create = false): string {
  const path = kernelPath(given, create);
  if (path !== null) return path;
  throw new SysError(
    "ENOENT",
    syscall,
    `${syscall} '${given}': No such file or directory`,
  );
}

function info(s: Deno.FileInfo): FileInfo {
  return {
    dev: s.dev,
    ino: s.ino ?? 0,
    size: s.size,
    mode: (s.mode ?? 0) & 0o7777,
    uid: s.uid ?? 0,
    kind: s.isFile
      ? "file"
      : s.isDirectory
      ? "directory"
      : s.isSymlink
      ? "symlink"
      : "other",
  };
}

const LINUX = Deno.build.os === "linux";

// One buffer for every read (records are at most 4 KiB): allocating and
// zeroing 4 KiB per probe showed up next to the system calls.
const scratch = new Uint8Array(4097);

class DenoHandle implements Handle {
  #file: Deno.FsFile;
  #path: string;
  #fresh = true;

  constructor(file: Deno.FsFile, path: string) {
    this.#file = file;
    this.#path = path;
  }

  fd(): number | undefined {
    return undefined; // Deno's files have resource ids, not descriptors
  }

  tryLock(exclusive: boolean): boolean {
    try {
      return this.#file.tryLockSync(exclusive);
    } catch (err) {
      throw sysError(err, "flock", this.#path);
    }
  }

  unlock(): void {
    try {
      this.#file.unlockSync();
    } catch (err) {
      throw sysError(err, "flock", this.#path);
    }
  }

  write(data: Uint8Array): void {
    this.#fresh = false;
    try {
      let done = 0;
      while (done < data.length) {
        done += this.#file.writeSync(data.subarray(done));
      }
    } catch (err) {
      throw sysError(err, "write", this.#path);
    }
  }

  writeAt(data: Uint8Array, offset: number, path: string): void {
    // Through a second open file of the same inode: a seek of our own
    // would move the offset that every descriptor of this open file
    // shares, such as the command's fd 9 (`runlock run`), whose writes
    // would then land in the record. The name may lead to another file
    // by now: only our inode is written.
    let other: Deno.FsFile | undefined;
    try {
      other = Deno.openSync(path, { write: true });
      const ours = this.#file.statSync();
      const theirs = other.statSync();
      if (ours.dev !== theirs.dev || ours.ino !== theirs.ino) {
        throw new SysError(
          "ESTALE",
          "write",
          `write '${path}': the name leads to another file now`,
        );
      }
      other.seekSync(offset, Deno.SeekMode.Start);
      let done = 0;
      while (done < data.length) {
        done += other.writeSync(data.subarray(done));
      }
    } catch (err) {
      if (err instanceof SysError) throw err;
      throw sysError(err, "write", path);
    } finally {
      other?.close();
    }
  }

  readAll(max: number): Uint8Array {
    try {
      // A fresh descriptor is at offset 0: no seek.
      if (!this.#fresh) this.#file.seekSync(0, Deno.SeekMode.Start);
      this.#fresh = false;
      const buf = max <= scratch.length ? scratch : new Uint8Array(max);
      let len = 0;
      while (len < max) {
        const n = this.#file.readSync(buf.subarray(len, max));
        if (n === null || n === 0) break;
        len += n;
        // A regular file reads short only at its end: no second read.
        if (len < max) break;
      }
      return buf.subarray(0, len); // a view: see Handle.readAll
    } catch (err) {
      throw sysError(err, "read", this.#path);
    }
  }

  stat(): FileInfo {
    try {
      return info(this.#file.statSync());
    } catch (err) {
      throw sysError(err, "fstat", this.#path);
    }
  }

  chmod(mode: number): void {
    // Deno.FsFile has no fchmod, and chmod(2) by path follows a symlink: if
    // someone else could replace our fresh temp file with a symlink to, say,
    // /etc/shadow, we would change that file's mode. So only where nobody
    // but us (and root) can replace entries of the directory: it is ours or
    // root's, and not writable by others, or sticky (where only a file's
    // owner may rename or remove it). Elsewhere the umask's mode stays.
    try {
      const me = this.#file.statSync().uid;
      const dir = Deno.statSync(parent(this.#path));
      const dirMode = dir.mode ?? 0;
      const owner = dir.uid === me || dir.uid === 0;
      const closed = (dirMode & 0o022) === 0 || (dirMode & 0o1000) !== 0;
      if (!owner || !closed) {
        throw new SysError(
          "EUNSAFE",
          "chmod",
          `chmod '${this.#path}': others may replace files in the directory`,
        );
      }
      Deno.chmodSync(this.#path, mode);
    } catch (err) {
      throw sysError(err, "chmod", this.#path);
    }
  }

  closeFirstAtExit(): void {
    // Deno names no descriptor, and a Deno holder makes no inotify
    // instance (its watch would keep the process alive: see watchDir).
  }

  close(): void {
    try {
      this.#file.close();
    } catch {
      // Already closed: close is idempotent for callers.
    }
  }
}

let hostnameCache: string | undefined;
let identityCache: { boot: string; pidns: string } | undefined;
let runGranted: boolean | undefined;

function createNew(path: string): Handle | "EEXIST" | "ENOENT" {
  const dir = parent(path);
  try {
    need("read", dir, "open");
    need("write", dir, "open");
    const file = Deno.openSync(path, {
      read: true,
      write: true,
      createNew: true,
      mode: 0o644,
    });
    return new DenoHandle(file, path);
  } catch (err) {
    if (err instanceof Deno.errors.AlreadyExists) return "EEXIST";
    if (err instanceof Deno.errors.NotFound) return "ENOENT";
    throw sysError(err, "open", path);
  }
}

function openExisting(given: string): Handle | "ENOENT" {
  const l = at();
  if (l !== null) return openAt(l, AT_FDCWD, "", given);
  const path = kernelPath(given);
  if (path === null) return "ENOENT";
  // Deno.open has neither O_NOFOLLOW nor O_NONBLOCK, so lstat first: a
  // symlink is refused without being followed, and a FIFO is never opened
  // (opening one read-only blocks until a writer comes). Then fstat the
  // descriptor: if the path was swapped between the two calls, report it
  // as gone and let the caller retry.
  need("read", parent(path), "open");
  const before = lstatChecked(path);
  if (before === null) return "ENOENT";
  if (before.kind === "symlink") {
    throw new SysError("ELOOP", "open", `open '${path}': is a symlink`);
  }
  if (before.kind !== "file") {
    throw new SysError(
      "EFTYPE",
      "open",
      `open '${path}': not a regular file`,
    );
  }
  let file: Deno.FsFile;
  try {
    file = Deno.openSync(path, { read: true });
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return "ENOENT";
    throw sysError(err, "open", path);
  }
  const handle = new DenoHandle(file, path);
  const after = handle.stat();
  if (after.dev !== before.dev || after.ino !== before.ino) {
    handle.close();
    throw new SysError("ERACE", "open", `open '${path}': replaced`);
  }
  return handle;
}

function lstat(given: string): FileInfo | null {
  const path = kernelPath(given);
  if (path === null) return null;
  need("read", parent(path), "lstat");
  return lstatChecked(path);
}

/**
 * `lstat(2)` once the read permission is checked: through libc where the
 * FFI may be used (a missing file is then no exception), else Deno's op.
 */
function lstatChecked(path: string): FileInfo | null {
  const fast = lstatLibc(path);
  if (typeof fast === "number") {
    // As Deno words the errors it does not name (sysError reads it back).
    const name = ERRNO[fast];
    if (name !== undefined) {
      throw new SysError(
        name,
        "lstat",
        `lstat '${path}': ${name} (os error ${fast})`,
      );
    }
  } else if (fast !== undefined) {
    return fast;
  }
  try {
    return info(Deno.lstatSync(path));
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return null;
    throw sysError(err, "lstat", path);
  }
}

/**
 * A directory pinned by its canonical path: Deno has no `*at()` calls, so
 * each entry is named `${prefix}/${name}`.
 */
class DenoDir implements Dir {
  readonly prefix: string;
  readonly byDescriptor = false;

  constructor(prefix: string) {
    this.prefix = prefix;
  }

  create(name: string): Handle | "EEXIST" | "ENOENT" {
    return createNew(`${this.prefix}/${name}`);
  }

  open(name: string): Handle | "ENOENT" {
    return openExisting(`${this.prefix}/${name}`);
  }

  link(existing: string, created: string): "EEXIST" | "ENOENT" | undefined {
    const to = `${this.prefix}/${created}`;
    try {
      need("write", this.prefix, "link");
      Deno.linkSync(`${this.prefix}/${existing}`, to);
      return undefined;
    } catch (err) {
      if (err instanceof Deno.errors.AlreadyExists) return "EEXIST";
      if (err instanceof Deno.errors.NotFound) return "ENOENT";
      throw sysError(err, "link", to);
    }
  }

  unlink(name: string): "ENOENT" | undefined {
    const path = `${this.prefix}/${name}`;
    try {
      need("write", this.prefix, "unlink");
      Deno.removeSync(path);
      return undefined;
    } catch (err) {
      if (err instanceof Deno.errors.NotFound) return "ENOENT";
      throw sysError(err, "unlink", path);
    }
  }

  lstat(name: string): FileInfo | null {
    return lstat(`${this.prefix}/${name}`);
  }

  close(): void {}
}

/** Whether this Deno is older than `major.minor`. */
function olderThan(major: number, minor: number): boolean {
  const [a, b] = Deno.version.deno.split(".").map(Number);
  return a < major || (a === major && b < minor);
}

/** The Deno platform. */
export const platform: Platform = {
  runtime: "deno",
  pid: Deno.pid,
  // Before 2.9.0, Deno.watchFs dropped what did not fit its queue of 16
  // events without a word (denoland/deno#35122); since, a lapse is an
  // event of its own (flag "rescan"). With libc, inotify is read directly.
  get watchLosesQuietly(): boolean {
    return viaWatchFs && olderThan(2, 9);
  },
  // 2.9.6: after a `rm -r` of a watched directory holding two files, one
  // Deno.watchFs in six reported no event at all.
  get watchMissesRemoval(): boolean {
    return viaWatchFs;
  },
  // Deno.open has no O_NONBLOCK; libc's open is given it.
  get openMayBlock(): boolean {
    return at() === null;
  },

  realDir(given: string): string {
    try {
      // An open directory's /proc/self/fd/N names it in one readlink
      // (Deno's realPath walks every component); a removed one reads
      // "... (deleted)", which is no path. libc's, with every permission:
      // Deno's refuses /proc without it.
      const l = given.startsWith("/proc/self/fd/") ? at() : null;
      if (l) return linkedDir(l.readlink(given) ?? "");
      const path = kernelPath(given);
      if (path === null) return "";
      need("read", path, "realpath");
      return Deno.realPathSync(path);
    } catch {
      return "";
    }
  },

  hostname(): string {
    if (hostnameCache !== undefined) return hostnameCache;
    hostnameCache = "";
    try {
      // --allow-sys=hostname. (Reading /proc/sys/kernel/hostname instead
      // needs all permissions on Deno 2.9, so it is no fallback.)
      const sys = Deno.permissions.querySync({ name: "sys", kind: "hostname" });
      if (sys.state === "granted") hostnameCache = Deno.hostname();
    } catch {
      // No hostname: the record simply omits it.
    }
    hostnameCache = hostnameCache.replace(/[\r\n]/g, "");
    return hostnameCache;
  },

  identity(): { boot: string; pidns: string } {
    if (identityCache !== undefined) return identityCache;
    identityCache = { boot: "", pidns: "" };
    // Deno lets a program read /proc only with all permissions; asking
    // otherwise would be refused (or prompt), so without them it is omitted.
    if (!LINUX || !hasAllAccess()) return identityCache;
    try {
      identityCache.boot = Deno.readTextFileSync(
        "/proc/sys/kernel/random/boot_id",
      ).trim();
    } catch {
      // No /proc.
    }
    try {
      identityCache.pidns =
        /^pid:\[(\d+)\]$/.exec(Deno.readLinkSync("/proc/self/ns/pid"))?.[1] ??
          "";
    } catch {
      // No /proc.
    }
    return identityCache;
  },

  unrefLater(fn: () => void, ms = 0): () => void {
    const timer = setTimeout(fn, ms);
    Deno.unrefTimer(timer);
    return () => clearTimeout(timer);
  },

  turn(): Promise<void> {
    // A timer, though it waits for the timers' next tick (2.1 ms, measured):
    // Deno's setImmediate (0.05 ms) lets the due timers fire but serves no
    // I/O (no socket, pipe or file operation completed between turns).
    return new Promise((resolve) => setTimeout(resolve, 0));
  },

  unrefInterval(fn: () => void, ms: number): () => void {
    const timer = setInterval(fn, ms);
    Deno.unrefTimer(timer);
    return () => clearInterval(timer);
  },

  openExisting(path: string): Handle | "ENOENT" {
    return openExisting(path);
  },

  openDir(given: string): Dir {
    // With every permission, libc pins it by a descriptor, as on Node and
    // Bun. Otherwise Deno can name a directory descriptor only through
    // node:fs (which costs every program the start-up of Deno's Node
    // layer): so the canonical path, resolved once. Re-pointed symlinks,
    // `..` and chdir cannot move the lock; an exchange of real directories
    // between two calls could (PROTOCOL.md, "Pinning the directory").
    const l = at();
    if (l !== null) {
      return openDirAt(l, given, (path) => {
        try {
          return Deno.realPathSync(path);
        } catch (err) {
          throw sysError(err, "realpath", path);
        }
      });
    }
    const path = existingPath(given, "realpath");
    need("read", path, "realpath");
    let real: string;
    try {
      real = Deno.realPathSync(path);
    } catch (err) {
      throw sysError(err, "realpath", path);
    }
    // A file there makes the first create fail with ENOTDIR.
    return new DenoDir(real);
  },

  lstat(path: string): FileInfo | null {
    return lstat(path);
  },

  mkdirp(given: string): void {
    try {
      const path = existingPath(given, "mkdir", true);
      need("write", path, "mkdir");
      Deno.mkdirSync(path, { recursive: true });
    } catch (err) {
      throw sysError(err, "mkdir", given);
    }
  },

  readDir(given: string): string[] {
    try {
      const path = existingPath(given, "readdir");
      need("read", path, "readdir");
      return Array.from(Deno.readDirSync(path), (entry) => entry.name);
    } catch (err) {
      throw sysError(err, "readdir", given);
    }
  },

  readDirKinds(given: string) {
    try {
      const path = existingPath(given, "readdir");
      need("read", path, "readdir");
      return Array.from(Deno.readDirSync(path), (entry) => ({
        name: entry.name,
        kind: entry.isFile
          ? "file" as const
          : entry.isDirectory
          ? "directory" as const
          : entry.isSymlink
          ? "symlink" as const
          : "other" as const,
      }));
    } catch (err) {
      throw sysError(err, "readdir", given);
    }
  },

  processAlive(pid: number): Liveness {
    // Through libc where it is bound: Deno.kill asks getpid() each call.
    const l = at();
    if (l) return killLiveness(l.kill(pid, 0), () => l.errno());
    if (runGranted === undefined || !runGranted) {
      runGranted = Deno.permissions.querySync({ name: "run" }).state ===
        "granted";
      if (!runGranted) return "unknown";
    }
    try {
      Deno.kill(pid, 0 as unknown as Deno.Signal);
      return "alive";
    } catch (err) {
      if (err instanceof Deno.errors.NotFound) return "dead"; // ESRCH
      if (err instanceof Deno.errors.PermissionDenied) return "alive"; // EPERM
      return "unknown";
    }
  },

  watchDir(
    dir: string,
    onChange: (name: string, moved: boolean) => void,
    keepAlive = true,
  ): (() => void) | undefined {
    // A Deno watcher (Deno.watchFs, or node:fs.watch even with
    // persistent: false) keeps the process alive: measured on 2.9.6.
    if (!keepAlive) return undefined;
    try {
      need("read", dir, "watch");
      const l = at();
      const own = l === null ? null : inotifyWatch(l, dir, onChange);
      if (own !== null) return own;
      viaWatchFs = true;
      return watchPath(dir, onChange);
    } catch {
      return undefined;
    }
  },

  watchClose(): undefined {
    // Deno.watchFs of the lock file reports the close itself ("access").
    return undefined;
  },
};
