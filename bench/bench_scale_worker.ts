// The runtime side of the benchmark's scale section (bench/bench_scale.ts).
// Like bench_worker.ts, it runs on Deno from the sources and, transpiled, on
// Node and Bun against the built npm package. One figure per process, so
// that no figure inherits another's watchers, timers or heap:
//
//   bench_scale_worker newname <json>  new lock names, acquired and released,
//                                      in an empty directory and in a full
//                                      one, interleaved: µs per name
//   bench_scale_worker many <json>     one process taking N locks in one
//                                      directory and holding them all: µs
//                                      per acquisition, in blocks
//   bench_scale_worker wait <json>     a waiter: prints "ready", waits for a
//                                      line on stdin, then acquires a held
//                                      lock with a timeout; prints its CPU
//                                      time and the timeout's overshoot
//
// The memory figure has its own worker without node: imports
// (bench_rss_worker.ts), since on Deno they load the Node layer.
// Environment: RUNLOCK_BENCH_ENTRY, as for bench_worker.ts.
import { setImmediate } from "node:timers";
import process from "node:process";
import { createInterface } from "node:readline";

type Runlock = typeof import("../mod.ts");
type Lock = Awaited<ReturnType<Runlock["acquire"]>>;

const isDeno = "Deno" in globalThis;
const lib: Runlock = isDeno
  ? await import("../mod.ts")
  : await import(process.env.RUNLOCK_BENCH_ENTRY!);

function say(value: unknown): void {
  process.stdout.write(JSON.stringify(value) + "\n");
}

/** One turn of the event loop: timers, watch events and I/O get theirs. */
const turn = () => new Promise<void>((resolve) => setImmediate(resolve));

const round1 = (x: number) => Math.round(x * 10) / 10;

interface NewNameRequest {
  /** An empty directory, and one of many files. */
  dirs: [string, string];
  /** Names per directory per round, and rounds. */
  perRound: number;
  rounds: number;
  /** Names per directory before timing (the first pin, caches). */
  warm: number;
  /** No new round after this many ms (a slow build: a few rounds do). */
  budgetMs: number;
}

/**
 * A new lock name each time (never used before by this process), acquired
 * and released with acquireSync/releaseSync: the cost of a directory's size
 * on the hot path. The two directories alternate by round, so that load on
 * the machine falls on both alike.
 */
async function newName(req: NewNameRequest): Promise<void> {
  let serial = 0;
  const one = (dir: string) => {
    const path = `${dir}/new-${process.pid}-${serial++}.lock`;
    const t0 = performance.now();
    lib.acquireSync(path).releaseSync();
    return (performance.now() - t0) * 1000;
  };
  for (const dir of req.dirs) {
    for (let i = 0; i < req.warm; i++) one(dir);
  }
  const us: [number[], number[]] = [[], []];
  const end = performance.now() + req.budgetMs;
  for (let r = 0; r < req.rounds; r++) {
    if (r >= 2 && performance.now() > end) break;
    for (let d = 0; d < 2; d++) {
      const k = (r + d) % 2; // empty first on even rounds, full first on odd
      for (let i = 0; i < req.perRound; i++) {
        us[k].push(round1(one(req.dirs[k])));
      }
      await turn();
    }
  }
  say({ empty: us[0], full: us[1] });
}

interface ManyRequest {
  dir: string;
  count: number;
  /** Acquisitions per block reported. */
  block: number;
  /** Stop after the block that ends past this many ms (a slow build). */
  budgetMs: number;
}

/**
 * One process taking `count` locks in one directory with the default
 * options (so each held lock's loss detection is on) and holding them all.
 * Each acquisition is followed by one event-loop turn, as in a program that
 * takes its locks over time, and the turn is counted: work that the held
 * locks cause (watch events, timers) lands in it. Reports the mean µs per
 * acquisition of each block, and how many locks it reached within the
 * budget.
 */
async function many(req: ManyRequest): Promise<void> {
  const held: Lock[] = [];
  const blocks: number[] = [];
  const end = performance.now() + req.budgetMs;
  try {
    for (let b = 0; b < req.count / req.block; b++) {
      if (b > 1 && performance.now() > end) break;
      const t0 = performance.now();
      for (let i = 0; i < req.block; i++) {
        const name = `lock-${String(held.length).padStart(6, "0")}.lock`;
        held.push(await lib.acquire(`${req.dir}/${name}`));
        await turn();
      }
      blocks.push(round1(((performance.now() - t0) * 1000) / req.block));
    }
  } finally {
    for (const lock of held) lock.releaseSync();
  }
  say({ blocks, held: held.length });
}

interface WaitRequest {
  path: string;
  timeout: number;
  /** The control: sleep on a timer instead of waiting for the lock. */
  idle?: boolean;
  /** Wait once (`WARM_WAIT_MS`) before saying ready. */
  warm?: boolean;
}

/** The warm-up wait of a `warm` waiter. */
const WARM_WAIT_MS = 50;

/**
 * A waiter on a lock that another process holds for longer than the
 * timeout: CPU time spent waiting (getrusage, this process, every thread)
 * and how late the HeldError came.
 */
async function wait(req: WaitRequest): Promise<void> {
  const lines = createInterface({ input: process.stdin })[
    Symbol.asyncIterator
  ]();
  // Warm: the first acquire of a process compiles and loads what the attempt
  // and the HeldError need; that is start-up, not waiting, and 50 processes
  // doing it at once would delay their deadlines by the time it takes.
  try {
    lib.acquireSync(req.path).releaseSync();
  } catch {
    // HeldError, as expected.
  }
  if (req.warm) {
    // A process's later wait: its first has run the wait's code once (the
    // attempt loop, the watches, the looks, the timeout's HeldError).
    try {
      (await lib.acquire(req.path, { timeout: WARM_WAIT_MS })).releaseSync();
    } catch {
      // HeldError, as expected.
    }
  }
  say({ ready: true });
  await lines.next();
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  let outcome = "acquired";
  if (req.idle) {
    // The control: the same process, asleep on a timer for as long.
    await new Promise((resolve) => setTimeout(resolve, req.timeout));
    outcome = "slept";
  } else {
    try {
      (await lib.acquire(req.path, { timeout: req.timeout })).releaseSync();
    } catch (err) {
      outcome = (err as Error).name;
    }
  }
  const elapsed = performance.now() - t0;
  const cpu = process.cpuUsage(cpu0);
  say({
    outcome,
    overshootMs: round1(elapsed - req.timeout),
    cpuMs: round1((cpu.user + cpu.system) / 1000),
  });
  process.exit(0); // stdin stays open: do not wait for it
}

const [mode, arg] = process.argv.slice(2);
const req = JSON.parse(arg ?? "{}");
if (mode === "newname") await newName(req);
else if (mode === "many") await many(req);
else if (mode === "wait") await wait(req);
else {
  console.error(`bench_scale_worker: unknown mode ${mode}`);
  process.exit(2);
}
