/**
 * The Node.js and Bun {@linkcode Platform}: flock and the `*at()` calls
 * through koffi or `bun:ffi` (`_libc_node.ts`, `_at.ts`), else `node:fs`
 * (`_fs_node.ts`) with flock through the FFI. Not `fs-native-extensions`
 * or `os-lock`: their fcntl/OFD locks do not conflict with flock. Only
 * `LOCK_NB`: a blocking flock holds the event loop or a libuv pool thread
 * (fs-ext's deadlock).
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
 * `mkdir -p`. Not `mkdirSync(path, { recursive: true })`: where mkdir says
 * ENOENT under an existing parent (`/proc/x`), Node 20's loops forever at
 * 100% CPU, deaf to SIGTERM. Here the second ENOENT is the answer.
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
    // Made meanwhile by another mkdir -p.
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

let procFd: boolean | undefined;

/** Whether /proc/self/fd/N names the open directory N (asked once). */
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
  // libuv drops inotify's overflow, but only in a burst it delivers; Bun
  // reports it (a null name).
  watchLosesQuietly: false,
  watchMissesRemoval: false,
  // libuv's inotify mask and Bun's leave out IN_CLOSE_WRITE.
  watchSeesClose: false,
  openMayBlock: false,

  realDir(path: string): string {
    try {
      // One readlink, where realpath walks every component.
      if (path.startsWith(FD_PREFIX)) {
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
    // 0.02-0.09 ms, where setTimeout(0) waits for the timers' next tick,
    // 1.0-1.2 ms (Node, Bun; measured).
    return new Promise((resolve) => setImmediate(resolve));
  },

  processAlive(pid: number): Liveness {
    // process.kill throws per dead PID and costs ~0.2 µs more.
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

  watchClose,
};
