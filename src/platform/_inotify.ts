/**
 * inotify's events and the `struct pollfd`s that wait for them, as bytes,
 * for `_inotify_deno.ts` and `_close_node.ts`. No runtime API here.
 *
 * @module
 */

export const IN_MODIFY = 0x2;
export const IN_ATTRIB = 0x4;
export const IN_CLOSE_WRITE = 0x8;
export const IN_MOVED_FROM = 0x40;
export const IN_MOVED_TO = 0x80;
export const IN_CREATE = 0x100;
export const IN_DELETE = 0x200;
export const IN_DELETE_SELF = 0x400;
export const IN_MOVE_SELF = 0x800;
export const IN_Q_OVERFLOW = 0x4000;
export const IN_IGNORED = 0x8000;
export const IN_DONT_FOLLOW = 0x2000000;

/**
 * How long one wait lasts (ms), a bound: the eventfd ends it when the last
 * listener goes, and each wait wakes the process (~1 ms of CPU a second
 * per waiting process at 1 s).
 */
export const POLL_MS = 30_000;

/** 1 as a `uint64_t`, to write to an eventfd. */
export const ONE = new Uint8Array(new BigUint64Array([1n]).buffer);

/**
 * Two `struct pollfd` (`int fd; short events, revents`), each waiting for
 * POLLIN: an inotify descriptor, and the eventfd that ends a wait.
 */
export class PollFds {
  /** The structs, for `poll(fds, 2, ms)`. */
  readonly bytes: Uint8Array = new Uint8Array(16);
  #dv = new DataView(this.bytes.buffer);

  constructor(fd: number, wake: number) {
    this.#dv.setInt32(0, fd, true);
    this.#dv.setInt16(4, 1, true); // POLLIN
    this.#dv.setInt32(8, wake, true);
    this.#dv.setInt16(12, 1, true);
  }

  /** Clears what the last poll returned, before the next one. */
  clear(): void {
    this.#dv.setInt16(6, 0, true);
    this.#dv.setInt16(14, 0, true);
  }

  /** Whether the last poll found the inotify descriptor ready. */
  get ready(): boolean {
    return this.#dv.getInt16(6, true) !== 0;
  }

  /** Whether the last poll found the eventfd written. */
  get woken(): boolean {
    return this.#dv.getInt16(14, true) !== 0;
  }
}

/**
 * Calls `fn` for each event in `n` bytes read from an inotify descriptor,
 * with its name (NUL-padded; empty for the watched inode itself).
 */
export function eachEvent(
  bytes: Uint8Array,
  n: number,
  fn: (wd: number, mask: number, name: Uint8Array) => void,
): void {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, n);
  for (let at = 0; at + 16 <= n;) {
    const len = dv.getUint32(at + 12, true);
    const name = bytes.subarray(at + 16, at + 16 + len);
    fn(dv.getInt32(at, true), dv.getUint32(at + 4, true), name);
    at += 16 + len;
  }
}

/** Calls `fn`; one listener's failure is not another's. */
export function tell<A extends unknown[]>(
  fn: (...args: A) => void,
  ...args: A
): void {
  try {
    fn(...args);
  } catch {
    // Not the caller's.
  }
}
