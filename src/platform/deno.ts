/**
 * The Deno implementation of {@linkcode Platform}. Every call of a lock
 * goes through libc where every permission is granted on Linux (`_at.ts`),
 * otherwise through Deno's ops (`_fs_deno.ts`), under the permissions
 * `_perm_deno.ts` asks about without a prompt.
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

// Here, before anything else runs: the only platform the tests run on.
checkPlatform(Deno.build.os, Deno.build.arch);

// Whether a watch of this process went through Deno.watchFs (no libc, or
// no inotify descriptor to be had): the flags of its failings hold.
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
  // Deno.watchFs reports IN_CLOSE_WRITE as "access"; libc's watch asks
  // for it.
  watchSeesClose: true,
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
    // Deno lets a program read /proc only with all permissions; asking
    // otherwise would be refused (or prompt), so without them it is omitted.
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

  openExisting,

  openDir(given: string): Dir {
    // With every permission, libc pins it by a descriptor, as on Node and
    // Bun. Otherwise Deno can name a directory descriptor only through
    // node:fs (which costs every program the start-up of Deno's Node
    // layer): so the canonical path, resolved once. Re-pointed symlinks,
    // `..` and chdir cannot move the lock; an exchange of real directories
    // between two calls could (PROTOCOL.md, "Pinning the directory").
    const l = at();
    if (l !== null) {
      // Named by its canonical path (Deno's watches are counted by path, so
      // one directory must always be named alike: not /proc/self/fd/N,
      // which differs per lock), found when first asked for: from the
      // descriptor, one readlink; by realpath where /proc cannot tell (not
      // mounted, the directory removed, the descriptor closed); else as
      // given. Never an error of its own: a message may be what asks.
      return new FdDir(l, pinDir(l, given), given, (fd) => {
        // A removed directory's link ends in " (deleted)"; so may a live
        // one's, named the other way (the lock checks that a name names
        // its directory).
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
    // A file there makes the first create fail with ENOTDIR.
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
    return undefined; // watchDir of the lock file reports the close itself
  },
};
