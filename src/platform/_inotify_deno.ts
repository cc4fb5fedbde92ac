/**
 * Deno's watches read from inotify, where libc serves. `Deno.watchFs`
 * matches each event against every watched path (two canonicalizations
 * apiece): beside a CPU hog, over 73 directories, 8 runs of 10 ms at a
 * time, `watch()` reached 91 to 265 runs of 300 (2.9.6). Here an event
 * costs a lookup of its watch descriptor.
 *
 * One inotify descriptor per process, one watch per inode, refcounted,
 * waited for by `poll(2)` on Deno's blocking pool, with an eventfd written
 * when the last listener goes; read, non-blocking, on the main thread.
 *
 * @module
 */

import type { Libc } from "./_libc_deno.ts";
import type { Listener } from "./_watch_deno.ts";
import {
  eachEvent,
  IN_ATTRIB,
  IN_CLOSE_WRITE,
  IN_CREATE,
  IN_DELETE,
  IN_DELETE_SELF,
  IN_IGNORED,
  IN_MODIFY,
  IN_MOVE_SELF,
  IN_MOVED_FROM,
  IN_MOVED_TO,
  IN_Q_OVERFLOW,
  ONE,
  POLL_MS,
  PollFds,
  tell,
} from "./_inotify.ts";

/** What `Deno.watchFs` asks for (notify's mask). */
const MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM |
  IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF;
/** Events that change what a name leads to (Deno's create, remove, rename). */
const MOVED = IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE |
  IN_DELETE_SELF | IN_MOVE_SELF;
/**
 * Reads per wake-up: writers that outpace the reader would hold the event
 * loop in one drain for seconds. The next poll returns at once.
 */
const READS = 4;

/** A listener, the path it asked for, and that path's last part. */
interface Watcher {
  readonly call: Listener;
  readonly path: string;
  readonly base: string;
}

interface State {
  readonly libc: Libc;
  readonly fd: number;
  readonly wake: number;
  readonly fds: PollFds;
  readonly byWd: Map<number, Set<Watcher>>;
  readonly wdOf: Map<Watcher, number>;
  count: number;
  polling: boolean;
}

const decoder = new TextDecoder();
const buf = new Uint8Array(16 * 1024);

let state: State | null | undefined;

/**
 * As `watchPath` (`_watch_deno.ts`), and the directory's own name when it
 * is removed or renamed. `null` where inotify cannot be used.
 */
export function inotifyWatch(
  libc: Libc,
  path: string,
  listener: Listener,
): (() => void) | undefined | null {
  const s = state === undefined ? (state = setUp(libc)) : state;
  if (s === null) return null;
  const wd = s.libc.inotifyAddWatch(s.fd, path, MASK);
  if (wd < 0) return undefined;
  // Its own object: one callback passed twice is two listeners.
  const trimmed = path.replace(/\/+$/, "") || "/";
  const watcher: Watcher = {
    call: listener,
    path,
    base: trimmed.slice(trimmed.lastIndexOf("/") + 1) || trimmed,
  };
  add(s, watcher, wd);
  if (++s.count === 1 && !s.polling) poll(s);
  let stopped = false;
  return () => {
    if (stopped) return;
    stopped = true;
    forget(s, watcher);
    if (--s.count === 0 && s.polling) s.libc.write(s.wake, ONE, ONE.length);
  };
}

/** Takes `watcher` off its watch, removing the watch with its last one. */
function forget(s: State, watcher: Watcher): void {
  const wd = s.wdOf.get(watcher);
  if (wd === undefined) return;
  s.wdOf.delete(watcher);
  const watchers = s.byWd.get(wd);
  if (watchers === undefined || !watchers.delete(watcher)) return;
  if (watchers.size === 0) {
    s.byWd.delete(wd);
    s.libc.inotifyRmWatch(s.fd, wd);
  }
}

/**
 * After an overflow, which may have lost a watch's end (and a directory
 * made again may reuse the inode number): every watch is asked for again
 * by its path, moving a watcher whose path leads elsewhere now.
 */
function rearm(s: State): void {
  for (const [watcher, wd] of [...s.wdOf]) {
    const now = s.libc.inotifyAddWatch(s.fd, watcher.path, MASK);
    if (now < 0 || now === wd) continue;
    forget(s, watcher);
    add(s, watcher, now);
  }
}

function add(s: State, watcher: Watcher, wd: number): void {
  let watchers = s.byWd.get(wd);
  if (watchers === undefined) s.byWd.set(wd, watchers = new Set());
  watchers.add(watcher);
  s.wdOf.set(watcher, wd);
}

function setUp(libc: Libc): State | null {
  const fd = libc.inotifyInit();
  if (fd < 0) return null;
  const wake = libc.eventfd();
  if (wake < 0) {
    libc.close(fd);
    return null;
  }
  return {
    libc,
    fd,
    wake,
    fds: new PollFds(fd, wake),
    byWd: new Map(),
    wdOf: new Map(),
    count: 0,
    polling: false,
  };
}

/** Waits for events while anyone listens, and hands them out. */
function poll(s: State): void {
  s.polling = true;
  s.fds.clear();
  s.libc.poll(s.fds.bytes, 2, POLL_MS).then((n) => {
    s.polling = false;
    if (n > 0 && s.fds.woken) s.libc.read(s.wake, buf);
    drain(s);
    if (s.count > 0) poll(s);
  }, () => {
    s.polling = false;
  });
}

/** Reads queued events (a bounded amount) and calls their listeners. */
function drain(s: State): void {
  for (let i = 0; i < READS; i++) {
    const n = s.libc.read(s.fd, buf);
    if (n <= 0) return;
    eachEvent(buf, n, (wd, mask, raw) => {
      if (mask & IN_Q_OVERFLOW) {
        rearm(s);
        for (const w of [...s.wdOf.keys()]) tell(w.call, "", false);
        return;
      }
      const watchers = s.byWd.get(wd);
      if (watchers === undefined) return;
      if (mask & IN_IGNORED) {
        // The kernel dropped the watch: its listeners learn of it from the
        // event before, or their parent's watch.
        s.byWd.delete(wd);
        for (const w of watchers) s.wdOf.delete(w);
        return;
      }
      const moved = (mask & MOVED) !== 0;
      const end = raw.indexOf(0);
      const name = raw.length === 0 ? undefined : decoder.decode(
        end < 0 ? raw : raw.subarray(0, end),
      );
      for (const w of [...watchers]) tell(w.call, name ?? w.base, moved);
    });
  }
}
