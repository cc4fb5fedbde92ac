/**
 * One shared, unref'd timer for every held lock's periodic check, armed for
 * the earliest due {@linkcode Tick}. Ticks of one period are kept in one list
 * in the order they fall due, so a firing looks at each list's head.
 *
 * @module
 */

import { platform as p } from "../platform/current.ts";

/** A registered periodic call; {@linkcode Tick.stop} removes it. */
export class Tick {
  /** When it falls due (`performance.now()` time). */
  due = 0;
  prev: Tick | undefined = undefined;
  next: Tick | undefined = undefined;
  list: Queue | undefined = undefined;

  constructor(readonly period: number, readonly run: () => void) {}

  /** Removes the tick; it never runs again. Idempotent. */
  stop(): void {
    this.list?.remove(this);
  }
}

/** A doubly linked list of ticks in the order they fall due. */
class Queue {
  head: Tick | undefined = undefined;
  tail: Tick | undefined = undefined;

  push(tick: Tick): void {
    tick.list = this;
    tick.prev = this.tail;
    tick.next = undefined;
    if (this.tail) this.tail.next = tick;
    else this.head = tick;
    this.tail = tick;
  }

  remove(tick: Tick): void {
    if (tick.prev) tick.prev.next = tick.next;
    else this.head = tick.next;
    if (tick.next) tick.next.prev = tick.prev;
    else this.tail = tick.prev;
    tick.prev = tick.next = tick.list = undefined;
  }
}

/** Ticks due at once (their first run), then one queue per period. */
const soon = new Queue();
const byPeriod = new Map<number, Queue>();

/** When the armed timer fires, and how to cancel it. */
let armedFor = Infinity;
let disarm: (() => void) | undefined;

/**
 * Calls `run` once the event loop turns, then every `period` ms (> 0), until
 * the tick is stopped. A call may come up to a quarter of its period (at
 * most 10 ms) early: due ticks run together.
 */
export function every(period: number, run: () => void): Tick {
  const tick = new Tick(period, run);
  const now = performance.now();
  tick.due = now;
  soon.push(tick);
  // A tight loop of acquire and release arms the timer once.
  if (armedFor > now) arm(now, now);
  return tick;
}

function arm(at: number, now: number): void {
  disarm?.();
  armedFor = at;
  disarm = p.unrefLater(fire, Math.max(0, Math.ceil(at - now)));
}

function fire(): void {
  armedFor = Infinity;
  disarm = undefined;
  let now = performance.now();
  for (let tick = soon.head; tick !== undefined; tick = soon.head) {
    soon.remove(tick);
    queueOf(tick.period).push(tick);
    tick.due = now + tick.period;
    call(tick);
  }
  let earliest = Infinity;
  for (const [period, queue] of byPeriod) {
    now = performance.now();
    const limit = now + Math.min(period / 4, 10);
    for (
      let tick = queue.head;
      tick !== undefined && tick.due <= limit;
      tick = queue.head
    ) {
      queue.remove(tick);
      queue.push(tick);
      tick.due = now + period;
      call(tick);
    }
    if (queue.head === undefined) byPeriod.delete(period);
    else earliest = Math.min(earliest, queue.head.due);
  }
  if (soon.head !== undefined) earliest = 0; // registered by a call
  if (earliest !== Infinity) arm(earliest, performance.now());
}

function queueOf(period: number): Queue {
  let queue = byPeriod.get(period);
  if (queue === undefined) {
    queue = new Queue();
    byPeriod.set(period, queue);
  }
  return queue;
}

function call(tick: Tick): void {
  try {
    tick.run();
  } catch {
    // A check that throws is retried at its next period.
  }
}
