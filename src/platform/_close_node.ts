/**
 * The close of a lock file's writable descriptor, as an event, for Node and
 * Bun on Linux, where `fs.watch` reports none (libuv's inotify mask): the
 * holder's descriptor is open read-write, so its last close (the kernel's,
 * when the holder dies) is inotify's `IN_CLOSE_WRITE`, microseconds before
 * the flock goes. A waiter's watch is also told of the file's unlink or a
 * rename over it (`IN_ATTRIB`) and its renames (`IN_MOVE_SELF`), every end
 * of a holder's file, so that it needs no `fs.watch` of it; a `watch()`
 * session is told of the close alone.
 *
 * One inotify descriptor per process, one watch per inode, refcounted by
 * its listeners. The descriptor is waited for off the event loop: under
 * koffi by `poll(2)` on a libuv pool thread, bounded, with an eventfd
 * written when the last listener goes and at exit, so that a wait never
 * keeps the process alive; under Bun (no async calls) through a stream of
 * it, which Bun's own event loop reads.
 *
 * Bound on the first wait; elsewhere (not Linux, big-endian, no FFI)
 * {@linkcode watchClose} returns `undefined`.
 *
 * @module
 */

import { endianness } from "node:os";
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

/**
 * Calls `onClose` when a descriptor opened for writing on the file at
 * `path` is closed (including by the kernel when its holder dies), until
 * the returned function is called; with `ends`, also when the file loses
 * or gains a name (its unlink, a rename over it: inotify's `IN_ATTRIB`,
 * which a change of its mode or times also is) or is renamed
 * (`IN_MOVE_SELF`). Never keeps the process alive. Returns `undefined`
 * where it cannot watch (the caller polls).
 */
export function watchClose(
  path: string,
  onClose: () => void,
  ends = false,
): (() => void) | undefined {
  const s = state === undefined ? (state = setUp()) : state;
  if (s === null) return undefined;
  // One watch per inode, whoever asks: always the events of every kind of
  // listener (a second inotify_add_watch replaces the mask).
  const wd = s.calls.addWatch(s.fd, path, WATCHED | IN_DONT_FOLLOW);
  if (wd < 0) return undefined;
  let entry = s.byWd.get(wd);
  if (entry === undefined) {
    entry = { wd, listeners: new Set() };
    s.byWd.set(wd, entry);
  }
  const own = entry;
  // A listener is its own object: two waiters passing one callback are
  // still two listeners.
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

/** How many files the inotify descriptor watches now (for tests). */
export function closeWatches(): number {
  return state ? state.byWd.size : 0;
}

/** Reads every queued event and calls the listeners of each closed file. */
function drain(s: State): void {
  const due = new Set<() => void>();
  for (;;) {
    const n = s.calls.read(s.fd, buf);
    if (n <= 0) break;
    parse(s, buf, n, due);
  }
  call(due);
}

/** Calls the listeners of each closed file named in events read already. */
function deliver(s: State, events: Uint8Array): void {
  const due = new Set<() => void>();
  parse(s, events, events.length, due);
  call(due);
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

function call(due: Set<() => void>): void {
  for (const listener of due) {
    try {
      listener();
    } catch {
      // One listener's failure is not another's.
    }
  }
}

function setUp(): State | null {
  if (process.platform !== "linux" || endianness() !== "LE") return null;
  // A Node worker thread's wait would keep one of libuv's few pool threads
  // (4 by default, shared by the whole process) in poll(2): waiters in a
  // few workers would starve the process's file reads. A worker's waiters
  // look again on their timer instead; the main thread keeps its one.
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
 * Bun's wait (`bun:ffi` has no async calls): Bun's own event loop waits
 * for the descriptor (epoll) and reads it, through a stream of it, and
 * hands the events it read to `onEvents`: no thread, no worker. Cancelling
 * the stream leaves the descriptor open, and frees the process to exit.
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
