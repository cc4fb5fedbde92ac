/**
 * {@linkcode Platform.watchClose} for Node and Bun, whose `fs.watch` masks
 * leave out `IN_CLOSE_WRITE`: a holder's last close (the kernel's, when it
 * dies) comes microseconds before its flock goes.
 *
 * One inotify descriptor per process, one watch per inode, refcounted by
 * its listeners, waited for off the event loop: under koffi by a bounded
 * `poll(2)` on a libuv pool thread, ended by an eventfd when the last
 * listener goes and at exit; under Bun (no async calls) by a stream of it.
 *
 * @module
 */

import { process } from "../_process.ts";
import { type Inotify, libc } from "./_libc_node.ts";
import { inNodeWorker } from "./_node.ts";
import {
  eachEvent,
  IN_ATTRIB,
  IN_CLOSE_WRITE,
  IN_DONT_FOLLOW,
  IN_IGNORED,
  IN_MOVE_SELF,
  IN_Q_OVERFLOW,
  ONE,
  POLL_MS,
  PollFds,
  tell,
} from "./_inotify.ts";

/** What every watch asks for: each listener picks its part. */
const WATCHED = IN_CLOSE_WRITE | IN_ATTRIB | IN_MOVE_SELF;

/** Waits for the inotify descriptor to be readable, off the event loop. */
interface Waiter {
  /** The first listener came: start waiting. */
  start(): void;
  /** The last listener went: end the wait now. */
  stop(): void;
}

/** A listener and the events it is called for. */
interface Listener {
  readonly call: () => void;
  readonly mask: number;
}

interface Entry {
  readonly wd: number;
  readonly listeners: Set<Listener>;
}

interface State {
  readonly calls: Inotify;
  readonly fd: number;
  readonly waiter: Waiter;
  readonly byWd: Map<number, Entry>;
  count: number;
}

const buf = new Uint8Array(4096 + 16 + 256);

let state: State | null | undefined;

/** {@linkcode Platform.watchClose}. */
export function watchClose(
  path: string,
  onClose: () => void,
  ends = false,
): (() => void) | undefined {
  const s = state === undefined ? (state = setUp()) : state;
  if (s === null) return undefined;
  // Every listener's events: a second inotify_add_watch replaces the mask.
  const wd = s.calls.addWatch(s.fd, path, WATCHED | IN_DONT_FOLLOW);
  if (wd < 0) return undefined;
  let entry = s.byWd.get(wd);
  if (entry === undefined) {
    entry = { wd, listeners: new Set() };
    s.byWd.set(wd, entry);
  }
  const own = entry;
  // Its own object: one callback passed twice is two listeners.
  const listener: Listener = {
    call: onClose,
    mask: ends ? WATCHED : IN_CLOSE_WRITE,
  };
  own.listeners.add(listener);
  if (++s.count === 1) s.waiter.start();
  let stopped = false;
  return () => {
    if (stopped) return;
    stopped = true;
    own.listeners.delete(listener);
    if (own.listeners.size === 0 && s.byWd.get(own.wd) === own) {
      s.byWd.delete(own.wd);
      s.calls.rmWatch(s.fd, own.wd);
    }
    if (--s.count === 0) s.waiter.stop();
  };
}

/** Reads every queued event and calls the listeners of each closed file. */
function drain(s: State): void {
  const due = new Set<() => void>();
  for (;;) {
    const n = s.calls.read(s.fd, buf);
    if (n <= 0) break;
    parse(s, buf, n, due);
  }
  for (const l of due) tell(l);
}

/** Calls the listeners of each closed file named in events read already. */
function deliver(s: State, events: Uint8Array): void {
  const due = new Set<() => void>();
  parse(s, events, events.length, due);
  for (const l of due) tell(l);
}

/** Adds to `due` the listeners of each file closed in `n` bytes of events. */
function parse(
  s: State,
  bytes: Uint8Array,
  n: number,
  due: Set<() => void>,
): void {
  eachEvent(bytes, n, (wd, mask) => {
    if (mask & IN_Q_OVERFLOW) {
      // Events were lost: any file may have been closed.
      for (const e of s.byWd.values()) {
        for (const l of e.listeners) due.add(l.call);
      }
      return;
    }
    const entry = s.byWd.get(wd);
    if (entry === undefined) return;
    for (const l of entry.listeners) {
      if (mask & l.mask) due.add(l.call);
    }
    // The file is gone (its last link and descriptor): the kernel
    // removed the watch; its listeners stay until they stop.
    if (mask & IN_IGNORED) s.byWd.delete(wd);
  });
}

function setUp(): State | null {
  // A worker's wait would hold one of libuv's 4 pool threads in poll(2),
  // starving the process's file reads: its waiters look on their timer.
  if (inNodeWorker()) return null;
  try {
    const calls = libc()?.inotify();
    const fd = calls ? calls.init() : -1;
    if (calls === undefined || fd < 0) return null;
    const s: State = {
      calls,
      fd,
      waiter: undefined as unknown as Waiter,
      byWd: new Map(),
      count: 0,
    };
    const waiter = calls.wait
      ? pollWaiter(calls, calls.wait, fd, () => drain(s))
      : streamWaiter(fd, (events) => deliver(s, events));
    if (waiter === null) return null;
    (s as { waiter: Waiter }).waiter = waiter;
    return s;
  } catch {
    return null;
  }
}

/**
 * Node's wait: an async `poll(2)` of the descriptor and an eventfd on a
 * libuv pool thread, `onReadable` when the descriptor has events to read.
 */
function pollWaiter(
  calls: Inotify,
  wait: NonNullable<Inotify["wait"]>,
  fd: number,
  onReadable: () => void,
): Waiter | null {
  const wake = wait.eventfd();
  if (wake < 0) return null;
  const fds = new PollFds(fd, wake);
  const scratch = new Uint8Array(8);
  let armed = false;
  let wanted = false;
  // A pool thread blocked in poll would hold up the exit.
  process.on("exit", () => {
    if (armed) wait.write(wake, ONE);
  });
  const arm = () => {
    armed = true;
    fds.clear();
    wait.poll(fds.bytes, 2, POLL_MS, (err, res) => {
      armed = false;
      if (!err && res > 0) {
        if (fds.woken) calls.read(wake, scratch);
        if (fds.ready) onReadable();
      }
      if (wanted && !armed) arm();
    });
  };
  return {
    start() {
      wanted = true;
      if (!armed) arm();
    },
    stop() {
      wanted = false;
      if (armed) wait.write(wake, ONE);
    },
  };
}

/** The part of Bun's global this module uses. */
interface BunFile {
  file(fd: number): { stream(): ReadableStream<Uint8Array> };
}

/**
 * Bun's wait: its event loop reads the descriptor through a stream and
 * hands the events to `onEvents`. Cancelling the stream leaves the
 * descriptor open and frees the process to exit.
 */
function streamWaiter(
  fd: number,
  onEvents: (events: Uint8Array) => void,
): Waiter {
  const bun = (globalThis as unknown as { Bun: BunFile }).Bun;
  let reader: ReadableStreamDefaultReader<Uint8Array> | undefined;
  const next = (r: ReadableStreamDefaultReader<Uint8Array>) => {
    r.read().then(({ done, value }) => {
      if (done || reader !== r) return;
      if (value !== undefined) onEvents(value);
      next(r);
    }, () => {
      if (reader === r) reader = undefined;
    });
  };
  return {
    start() {
      if (reader !== undefined) return;
      reader = bun.file(fd).stream().getReader();
      next(reader);
    },
    stop() {
      const was = reader;
      reader = undefined;
      was?.cancel().catch(() => {});
    },
  };
}
