/**
 * The Node.js (and Bun) implementation of {@linkcode Platform}. Node has
 * neither flock nor the `*at()` calls: they are libc's, through koffi
 * (under Bun, `bun:ffi`), bound on the first lock operation
 * (`_libc_node.ts`). On Linux x86-64 and arm64 every call of a lock goes
 * through `_at.ts`; elsewhere `node:fs` serves (`_fs_node.ts`), with flock
 * through the FFI.
 *
 * Not `fs-native-extensions` or `os-lock`: those take fcntl/OFD locks, which
 * do not conflict with flock, so they would not exclude a Deno process,
 * `flock(1)` or Python. Only `LOCK_NB` is ever used: a blocking flock would
 * hold the event loop, or a libuv pool thread (fs-ext's known deadlock).
 *
 * @module
 */

import { hostname } from "node:os";
import { dirname } from "node:path";
import { process } from "../_process.ts";
import { fs } from "./_node.ts";
import { ffi, OPEN_DIR } from "./_libc_node.ts";
import { watchClose } from "./_close_node.ts";
import { checkPlatform } from "./_supported.ts";
import { killLiveness, linkedDir, procIdentity } from "./_proc.ts";
import { AT_FDCWD, FdDir, lstatAt, openAt, pinDir } from "./_at.ts";
import {
  fsLstat,
  fsOpenExisting,
  kindOf,
  nodePaths,
  sysError,
} from "./_fs_node.ts";
import { PathDir } from "./_path_dir.ts";
import type { Dir, FileInfo, Handle, Liveness, Platform } from "./types.ts";

// Here, before anything else runs: the only platform the tests run on.
checkPlatform(process.platform, process.arch);

const {
  closeSync,
  fstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  realpathSync,
  statSync,
  watch,
} = fs;

const FD_PREFIX = "/proc/self/fd/";
const isBun = typeof (globalThis as { Bun?: unknown }).Bun !== "undefined";

let hostnameCache: string | undefined;
let identityCache: { boot: string; pidns: string } | undefined;

/**
 * `mkdir -p`, one directory at a time. Not `mkdirSync(path, { recursive:
 * true })`: where mkdir answers ENOENT although the parent exists (procfs:
 * `/proc/x`, `/dev/fd/x`), Node's goes back to the parent, finds it, and
 * tries the child again, forever, at 100% CPU and deaf to SIGTERM (seen on
 * Node 20). Here the second ENOENT is the answer.
 */
function mkdirParents(path: string): void {
  try {
    mkdirSync(path);
    return;
  } catch (err) {
    const code = (err as { code?: string }).code;
    if (code === "EEXIST" && isDirectory(path)) return;
    if (code !== "ENOENT" || dirname(path) === path) throw err;
  }
  mkdirParents(dirname(path));
  try {
    mkdirSync(path);
  } catch (err) {
    // Made meanwhile by another mkdir -p: as good.
    const code = (err as { code?: string }).code;
    if (code !== "EEXIST" || !isDirectory(path)) throw err;
  }
}

/** Whether `path` is a directory (following symlinks, as mkdir -p does). */
function isDirectory(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}

// Whether /proc/self/fd/N names the open directory N (Linux with /proc
// mounted). Asked once per process.
let procFd: boolean | undefined;

/** Whether /proc/self/fd/N names the open directory N. */
function procWorks(fd: number): boolean {
  if (procFd === undefined) {
    try {
      procFd = statSync(`${FD_PREFIX}${fd}`).ino === fstatSync(fd).ino;
    } catch {
      procFd = false;
    }
  }
  return procFd;
}

/** The Node.js and Bun platform. */
export const platform: Platform = {
  runtime: isBun ? "bun" : "node",
  pid: process.pid,
  // libuv drops the kernel's queue overflow on Linux, but only in a burst,
  // whose queued events it delivers; Bun reports it (a null name).
  watchLosesQuietly: false,
  watchMissesRemoval: false,
  // libuv's inotify mask and Bun's leave out IN_CLOSE_WRITE.
  watchSeesClose: false,
  openMayBlock: false,

  realDir(path: string): string {
    try {
      // An open directory's /proc/self/fd/N names it in one readlink
      // (realpath walks every component); a removed one reads
      // "... (deleted)", which is no path.
      if (path.startsWith(FD_PREFIX)) {
        // A live directory whose own name ends in " (deleted)": realpath.
        return linkedDir(readlinkSync(path)) || realpathSync.native(path);
      }
      return realpathSync.native(path);
    } catch {
      return "";
    }
  },

  hostname(): string {
    hostnameCache ??= hostname().replace(/[\r\n]/g, "");
    return hostnameCache;
  },

  openExisting(path: string): Handle | "ENOENT" {
    const l = ffi();
    return l ? openAt(l, AT_FDCWD, "", path) : fsOpenExisting(path);
  },

  openDir(path: string): Dir {
    const l = ffi();
    if (l) {
      const fd = pinDir(l, path);
      if (procWorks(fd)) return new FdDir(l, fd, path, `${FD_PREFIX}${fd}`);
      // No /proc: still pinned by the descriptor; the canonical path names it.
      try {
        return new FdDir(l, fd, path, realpathSync.native(path));
      } catch (err) {
        l.close(fd);
        throw sysError(err, "realpath", path);
      }
    }
    let fd: number;
    try {
      fd = openSync(path, OPEN_DIR);
    } catch (err) {
      throw sysError(err, "open", path);
    }
    if (procWorks(fd)) return new PathDir(nodePaths, `${FD_PREFIX}${fd}`, fd);
    // No /proc: the canonical path, resolved once.
    try {
      return new PathDir(nodePaths, realpathSync.native(path));
    } catch (err) {
      throw sysError(err, "realpath", path);
    } finally {
      closeSync(fd);
    }
  },

  lstat(path: string): FileInfo | null {
    const l = ffi();
    return l ? lstatAt(l, AT_FDCWD, "", path) : fsLstat(path);
  },

  mkdirp(path: string): void {
    try {
      mkdirParents(path);
    } catch (err) {
      throw sysError(err, "mkdir", path);
    }
  },

  readDir(path: string): string[] {
    try {
      return readdirSync(path);
    } catch (err) {
      throw sysError(err, "readdir", path);
    }
  },

  readDirKinds(path: string) {
    try {
      return readdirSync(path, { withFileTypes: true }).map((d) => ({
        name: d.name,
        kind: kindOf(d),
      }));
    } catch (err) {
      throw sysError(err, "readdir", path);
    }
  },

  identity() {
    identityCache ??= procIdentity(
      (path) => readFileSync(path, "utf8"),
      (path) => readlinkSync(path),
    );
    return identityCache;
  },

  unrefLater(fn: () => void, ms = 0): () => void {
    const timer = setTimeout(fn, ms);
    timer.unref();
    return () => clearTimeout(timer);
  },

  turn(): Promise<void> {
    // After the poll for I/O and the due timers, where a setTimeout(0)
    // waits for the timers' next tick: 0.02-0.09 ms against 1.0-1.2 ms
    // (Node, Bun; measured).
    return new Promise((resolve) => setImmediate(resolve));
  },

  unrefInterval(fn: () => void, ms: number): () => void {
    const timer = setInterval(fn, ms);
    timer.unref();
    return () => clearInterval(timer);
  },

  processAlive(pid: number): Liveness {
    // Through libc where the *at() path is bound: process.kill throws an
    // exception per dead PID, and costs ~0.2 µs more a call.
    const l = ffi();
    if (l) return killLiveness(l.kill(pid, 0), () => l.errno());
    try {
      process.kill(pid, 0);
      return "alive";
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (code === "ESRCH") return "dead";
      if (code === "EPERM") return "alive";
      return "unknown";
    }
  },

  watchDir(
    dir: string,
    onChange: (name: string, moved: boolean) => void,
    _keepAlive?: boolean,
  ): (() => void) | undefined {
    try {
      const watcher = watch(dir, { persistent: false }, (event, name) => {
        onChange(name ? String(name) : "", event === "rename" && !!name);
      });
      watcher.on("error", () => watcher.close());
      return () => watcher.close();
    } catch {
      return undefined;
    }
  },

  watchClose(
    path: string,
    onClose: () => void,
    ends?: boolean,
  ): (() => void) | undefined {
    return watchClose(path, onClose, ends);
  },
};
