/**
 * The Deno {@linkcode Platform}: libc (`_at.ts`) with every permission,
 * else Deno's ops (`_fs_deno.ts`) under `_perm_deno.ts`'s checks.
 *
 * @module
 */

import { FdDir, pinDir } from "./_at.ts";
import { denoPaths, kindOf, lstat, openExisting } from "./_fs_deno.ts";
import { PathDir } from "./_path_dir.ts";
import {
  at,
  existingPath,
  hasAllAccess,
  kernelPath,
  LINUX,
  mayRun,
  need,
  sysError,
} from "./_perm_deno.ts";
import type { Dir, Liveness, Platform } from "./types.ts";
import { checkPlatform } from "./_supported.ts";
import { killLiveness, linkedDir, procIdentity } from "./_proc.ts";
import { watchPath } from "./_watch_deno.ts";
import { inotifyWatch } from "./_inotify_deno.ts";

checkPlatform(Deno.build.os, Deno.build.arch);

// A watch went through Deno.watchFs: its failings hold.
let viaWatchFs = false;
let hostnameCache: string | undefined;
let identityCache: { boot: string; pidns: string } | undefined;

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
  // Deno.watchFs reports IN_CLOSE_WRITE as "access"; libc's asks for it.
  watchSeesClose: true,
  // Deno.open has no O_NONBLOCK; libc's open is given it.
  get openMayBlock(): boolean {
    return at() === null;
  },

  realDir(given: string): string {
    try {
      // One readlink of /proc/self/fd/N, not a walk of every component;
      // libc's: Deno refuses /proc without every permission.
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
      // /proc/sys/kernel/hostname needs every permission (Deno 2.9).
      const sys = Deno.permissions.querySync({ name: "sys", kind: "hostname" });
      if (sys.state === "granted") hostnameCache = Deno.hostname();
    } catch {
      // The record omits it.
    }
    hostnameCache = hostnameCache.replace(/[\r\n]/g, "");
    return hostnameCache;
  },

  identity(): { boot: string; pidns: string } {
    // Deno refuses (or prompts for) /proc without every permission.
    identityCache ??= LINUX && hasAllAccess()
      ? procIdentity(Deno.readTextFileSync, Deno.readLinkSync)
      : { boot: "", pidns: "" };
    return identityCache;
  },

  unrefLater(fn: () => void, ms = 0): () => void {
    const timer = setTimeout(fn, ms);
    Deno.unrefTimer(timer);
    return () => clearTimeout(timer);
  },

  turn(): Promise<void> {
    // A timer (2.1 ms, measured): Deno's setImmediate (0.05 ms) serves no
    // I/O between turns.
    return new Promise((resolve) => setTimeout(resolve, 0));
  },

  openExisting,

  openDir(given: string): Dir {
    // Without libc, only node:fs could open a directory (its start-up costs
    // every program): the canonical path, resolved once, which an exchange
    // of real directories could move (PROTOCOL.md, "Pinning the directory").
    const l = at();
    if (l !== null) {
      // Named by its canonical path, not /proc/self/fd/N: Deno's watches
      // count paths, so a directory is always named alike. Found lazily,
      // never throwing (a message may be what asks).
      return new FdDir(l, pinDir(l, given), given, (fd) => {
        const dir = linkedDir(
          (fd < 0 ? undefined : l.readlink(`/proc/self/fd/${fd}`)) ?? "",
        );
        if (dir !== "") return dir;
        try {
          return Deno.realPathSync(given);
        } catch {
          return undefined;
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
    // A file there: ENOTDIR at the first create.
    return new PathDir(denoPaths, real);
  },

  lstat,

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
        kind: kindOf(entry),
      }));
    } catch (err) {
      throw sysError(err, "readdir", given);
    }
  },

  processAlive(pid: number): Liveness {
    // Through libc where it is bound: Deno.kill asks getpid() each call.
    const l = at();
    if (l) return killLiveness(l.kill(pid, 0), () => l.errno());
    if (!mayRun()) return "unknown";
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
    // Deno.watchFs, and node:fs.watch even unpersistent, keep the process
    // alive (2.9.6).
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
    return undefined; // watchDir of the lock file reports the close itself
  },
};
