// The cost of watch(): how soon a SIGKILLed holder's `crashed`
// change comes, beside the physical floor of that (a C process waiting in
// flock(LOCK_EX) on the holder's file: the kernel's teardown of the dying
// holder, then its wake-up), measured in interleaved samples; and the CPU
// an idle watch of 1,000 held runs costs, beside the same process idle
// without it.
//
//   deno run -A bench/bench_watch.ts
//       runs the Deno worker from the sources and, with RUNLOCK_BENCH_PACKAGE
//       (a built npm package whose node_modules, or RUNLOCK_BENCH_DEPS's,
//       holds koffi), the Node and Bun ones (Bun: RUNLOCK_BENCH_BUN, or
//       `bun` on the PATH, unless RUNLOCK_SKIP_BUN=1); prints one JSON
//       document on stdout (progress on stderr).
//   bench_watch worker          one runtime's measurements, as JSON
//   bench_watch hold <path>     a holder: acquire, print "held", sleep
//   bench_watch hold-many <dir> <n>
//
// Knobs: RUNLOCK_BENCH_WATCH_SAMPLES (15), RUNLOCK_BENCH_WATCH_LOCKS
// (1000), RUNLOCK_BENCH_WATCH_IDLE_MS (5000), RUNLOCK_BENCH_WATCH_SETTLE_MS
// (30000), RUNLOCK_BENCH_WATCH_LONG_MS (65000 on Deno, else 0).
//
// bench/bench.ts can call `watchSection(workers, floorBinary)` with its own
// worker commands (each the transpiled copy of this file: transpileWorker
// (out, "bench_watch.ts")).
import { type ChildProcess, spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { createInterface } from "node:readline";

type Runlock = typeof import("../mod.ts");

const SAMPLES = Number(process.env.RUNLOCK_BENCH_WATCH_SAMPLES ?? 15);
const LOCKS = Number(process.env.RUNLOCK_BENCH_WATCH_LOCKS ?? 1000);
const IDLE_MS = Number(process.env.RUNLOCK_BENCH_WATCH_IDLE_MS ?? 5000);
/**
 * How long the idle watch runs before its windows (ms): the runtime's own
 * one-time work after the SIGKILL samples and the first batch is over by
 * then. Bun's collector works for some 15 s after them: by hand, 3 s after
 * the first batch a watching Bun process spent 13.7-14.8 ms in its second
 * window of 5 s and 3.5-4.4 ms in the others; after 30 s, 0.25-1.6 ms,
 * as after the watch ended (0.2-2.0). In the runs with 3 s, Bun's idle
 * watch read as 1.2-1.3 ms/s added.
 */
const SETTLE_MS = Number(
  process.env.RUNLOCK_BENCH_WATCH_SETTLE_MS ?? 30_000,
);
/**
 * Idle windows of `IDLE_MS` each, watching and then after the watch ended;
 * each side's median is kept. V8's memory reducer compacts the heap some
 * 8 s after a burst of allocations (here the first batch's, or the end of
 * the watch's), once: watching 1,000 held runs on Node, `--trace-gc` showed
 * two "Mark-Compact (reduce)" 8.1 and 8.7 s in, and the 2 s holding them
 * cost 27 ms of CPU against 0.3 ms for each 2 s around them, with no system
 * call of the watch (strace). In one window of 5 s it read as 6 ms/s
 * "added". The median of three leaves out such a one-time cost, and keeps
 * a periodic one (Deno's re-scan every 5 s is in every window).
 */
const WINDOWS = 3;
/**
 * One more window, watching, as long as the longest period of the watch's
 * own work, so that a periodic cost the short windows' median leaves out
 * is in the figure: on Deno a re-scan at least every 60 s (BACKSTOP_MS in
 * src/file/_watch_rescan.ts: at the last of its passes, 10 s apart when quiet,
 * before 60 s are up; 65 s hold one).
 * Node and Bun have no periodic work while idle: no such window (0).
 */
const LONG_MS = Number(
  process.env.RUNLOCK_BENCH_WATCH_LONG_MS ??
    (runtimeNameOf() === "deno" ? 65_000 : 0),
);

declare const Deno: { execPath(): string } | undefined;
function runtimeNameOf(): string {
  return typeof Deno !== "undefined"
    ? "deno"
    : "Bun" in globalThis
    ? "bun"
    : "node";
}
const runtimeName = runtimeNameOf();

/** One runtime's worker: the command that runs this file there. */
export interface WatchWorker {
  name: string;
  command: string[];
  env?: Record<string, string>;
}

/** What one worker measured. */
export interface WatchResult {
  runtime: string;
  /** SIGKILL of a holder → its `crashed` change in the watching process (ms). */
  crashed: Stats;
  /** SIGKILL of a holder → a C waiter in flock(LOCK_EX) on its file wakes (ms). */
  floor: Stats | undefined;
  idle: {
    locks: number;
    ms: number;
    /**
     * CPU (user + system) of the watching process over `ms`, watching (ms):
     * the median of `windows`.
     */
    cpuMs: number;
    /** The same process after the watch ended: the median of `baselineWindows`. */
    baselineCpuMs: number;
    /** Each window's CPU, watching (ms). */
    windows: number[];
    /** Each window's CPU after the watch ended (ms). */
    baselineWindows: number[];
    /** What the idle watch adds, per second (ms of CPU per s). */
    addedMsPerS: number;
    /**
     * The long window (`LONG_MS`), where the runtime has one: its CPU
     * (ms), and what the watch adds over it per second, against the
     * baseline median's rate.
     */
    long?: { ms: number; cpuMs: number; addedMsPerS: number };
  };
}

interface Stats {
  samples: number[];
  best: number;
  median: number;
  max: number;
}

function stats(samples: number[]): Stats {
  const s = [...samples].sort((a, b) => a - b);
  const r = (x: number) => Math.round(x * 1000) / 1000;
  return {
    samples: samples.map(r),
    best: r(s[0]),
    median: r(s[Math.floor(s.length / 2)]),
    max: r(s[s.length - 1]),
  };
}

// ---------------------------------------------------------------------------
// The worker side (every runtime)

async function library(): Promise<Runlock> {
  const entry = process.env.RUNLOCK_BENCH_ENTRY;
  if (runtimeName === "deno" || !entry) return await import("../mod.ts");
  return await import(entry) as Runlock;
}

function self(): string[] {
  return JSON.parse(process.env.RUNLOCK_BENCH_SELF ?? "[]");
}

/** A child process with a queue of its stdout lines. */
class Lines {
  readonly proc: ChildProcess;
  #lines: string[] = [];
  #waiters: ((line: string) => void)[] = [];

  constructor(command: string[]) {
    this.proc = spawn(command[0], command.slice(1), {
      stdio: ["pipe", "pipe", "inherit"],
    });
    createInterface({ input: this.proc.stdout! }).on("line", (line) => {
      const w = this.#waiters.shift();
      if (w) w(line);
      else this.#lines.push(line);
    });
  }

  next(): Promise<string> {
    const line = this.#lines.shift();
    if (line !== undefined) return Promise.resolve(line);
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  async expect(want: string): Promise<void> {
    const line = await this.next();
    if (line !== want) throw new Error(`expected ${want}, got ${line}`);
  }

  kill(): Promise<void> {
    return new Promise((resolve) => {
      if (this.proc.exitCode !== null || this.proc.signalCode !== null) {
        return resolve();
      }
      this.proc.on("exit", () => resolve());
      this.proc.kill("SIGKILL");
    });
  }
}

const cpuMs = () => {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
};

async function worker(): Promise<void> {
  const { watch } = await library();
  const base = mkdtempSync(
    join(process.env.RUNLOCK_BENCH_DIR ?? tmpdir(), "runlock-bench-watch-"),
  );
  try {
    // --- SIGKILL → crashed, beside SIGKILL → a C waiter's wake-up
    const watched = join(base, "watched");
    const apart = join(base, "apart");
    mkdirSync(watched);
    mkdirSync(apart);
    const it = watch(watched)[Symbol.asyncIterator]();
    await it.next();
    const pending: { path: string; kind: string; resolve: () => void }[] = [];
    let reading = true;
    const reader = (async () => {
      while (reading) {
        const r = await it.next();
        if (r.done) break;
        for (const c of r.value) {
          const i = pending.findIndex((p) =>
            p.path === c.path && p.kind === c.kind
          );
          if (i >= 0) pending.splice(i, 1)[0].resolve();
        }
      }
    })();
    const seen = (path: string, kind: string) =>
      new Promise<void>((resolve) => pending.push({ path, kind, resolve }));
    const floorBin = process.env.RUNLOCK_BENCH_FLOOR;
    const crashed: number[] = [];
    const floor: number[] = [];
    for (let i = 0; i < SAMPLES; i++) {
      const path = join(watched, `job-${i}.lock`);
      const started = seen(path, "started");
      const holder = new Lines([...self(), "hold", path]);
      await holder.expect("held");
      await started;
      // Let the holder settle (its own watch and timer) before the kill.
      await new Promise((r) => setTimeout(r, 20));
      const done = seen(path, "crashed");
      const t0 = performance.now();
      holder.proc.kill("SIGKILL");
      await done;
      crashed.push(performance.now() - t0);
      await holder.kill();
      if (floorBin) {
        const p2 = join(apart, `job-${i}.lock`);
        const h2 = new Lines([...self(), "hold", p2]);
        await h2.expect("held");
        const waiter = new Lines([floorBin, "waitlock", p2]);
        await waiter.expect("waiting");
        await new Promise((r) => setTimeout(r, 20));
        const t1 = performance.now();
        h2.proc.kill("SIGKILL");
        await waiter.expect("woke");
        floor.push(performance.now() - t1);
        waiter.proc.stdin!.end();
        await waiter.kill();
        await h2.kill();
      }
    }
    reading = false;
    await it.return!();
    await reader;

    // --- idle: 1,000 held runs, no change
    const many = join(base, "many");
    mkdirSync(many);
    const holderMany = new Lines([...self(), "hold-many", many, String(LOCKS)]);
    await holderMany.expect("held");
    const idle = watch(many)[Symbol.asyncIterator]();
    const first = await idle.next();
    if (first.value?.length !== LOCKS) {
      throw new Error(
        `the first batch has ${first.value?.length} locks, not ${LOCKS}`,
      );
    }
    // Whatever follows the first batch (a re-scan after the events of the
    // listing, if any) is done in well under SETTLE_MS.
    let more = 0;
    const tail = (async () => {
      for (;;) {
        const r = await idle.next();
        if (r.done) break;
        more += r.value.length;
      }
    })();
    await new Promise((r) => setTimeout(r, SETTLE_MS));
    const windows = async () => {
      const cpu: number[] = [];
      for (let i = 0; i < WINDOWS; i++) {
        const c0 = cpuMs();
        await new Promise((r) => setTimeout(r, IDLE_MS));
        cpu.push(Math.round((cpuMs() - c0) * 1000) / 1000);
      }
      return cpu;
    };
    const watchWindows = await windows();
    let longCpuMs: number | undefined;
    if (LONG_MS > 0) {
      const c0 = cpuMs();
      await new Promise((r) => setTimeout(r, LONG_MS));
      longCpuMs = Math.round((cpuMs() - c0) * 1000) / 1000;
    }
    await idle.return!();
    await tail;
    // The baseline: the same process, the same holders, no watch.
    await new Promise((r) => setTimeout(r, 1000));
    const baselineWindows = await windows();
    const watchCpu = stats(watchWindows).median;
    const baselineCpuMs = stats(baselineWindows).median;
    await holderMany.kill();
    if (more !== 0) throw new Error(`${more} changes while idle`);
    const result: WatchResult = {
      runtime: runtimeName,
      crashed: stats(crashed),
      floor: floor.length ? stats(floor) : undefined,
      idle: {
        locks: LOCKS,
        ms: IDLE_MS,
        cpuMs: watchCpu,
        baselineCpuMs,
        windows: watchWindows,
        baselineWindows,
        addedMsPerS:
          Math.round((watchCpu - baselineCpuMs) / (IDLE_MS / 1000) * 1000) /
          1000,
        long: longCpuMs === undefined ? undefined : {
          ms: LONG_MS,
          cpuMs: longCpuMs,
          addedMsPerS: Math.round(
            (longCpuMs / LONG_MS - baselineCpuMs / IDLE_MS) * 1000 * 1000,
          ) / 1000,
        },
      },
    };
    process.stdout.write(JSON.stringify(result) + "\n");
  } finally {
    rmSync(base, { recursive: true, force: true });
  }
}

async function hold(path: string): Promise<void> {
  const { acquire } = await library();
  const lock = await acquire(path);
  process.stdout.write("held\n");
  setInterval(() => lock.isOwned(), 1 << 30);
}

async function holdMany(dir: string, n: number): Promise<void> {
  const { acquire } = await library();
  const locks = [];
  for (let i = 0; i < n; i++) {
    locks.push(await acquire(join(dir, `run-${i}.lock`)));
  }
  process.stdout.write("held\n");
  setInterval(() => locks.length, 1 << 30);
}

// ---------------------------------------------------------------------------
// The driver side (Deno)

/** Runs each worker in turn; their results. */
export async function watchSection(
  workers: WatchWorker[],
  floorBinary: string | undefined,
  log: (line: string) => void = (l) => process.stderr.write(l + "\n"),
): Promise<WatchResult[]> {
  const results: WatchResult[] = [];
  for (const w of workers) {
    log(
      `watch: ${w.name}: ${SAMPLES} SIGKILLs, then ${LOCKS} runs idle for ${IDLE_MS} ms`,
    );
    const env: Record<string, string> = {
      ...process.env as Record<string, string>,
      ...w.env,
      RUNLOCK_BENCH_SELF: JSON.stringify(w.command),
    };
    if (floorBinary) env.RUNLOCK_BENCH_FLOOR = floorBinary;
    const child = spawn(w.command[0], [...w.command.slice(1), "worker"], {
      stdio: ["ignore", "pipe", "inherit"],
      env,
    });
    let out = "";
    child.stdout!.on("data", (d) => out += String(d));
    const code = await new Promise<number | null>((r) => child.on("close", r));
    if (code !== 0) {
      throw new Error(`watch worker ${w.name} exited with ${code}`);
    }
    results.push(JSON.parse(out.trim().split("\n").at(-1)!));
  }
  return results;
}

async function main(): Promise<void> {
  const { compileFloor, root } = await import("./bench_setup.ts");
  const scratch = mkdtempSync(join(tmpdir(), "runlock-bench-watch-build-"));
  try {
    const floor = compileFloor(scratch);
    if (floor.note) process.stderr.write(floor.note + "\n");
    const here = join(root, "bench", "bench_watch.ts");
    const workers: WatchWorker[] = [{
      name: "deno",
      command: [Deno!.execPath(), "run", "--allow-all", "--quiet", here],
    }];
    const pkg = process.env.RUNLOCK_BENCH_PACKAGE;
    if (pkg) {
      const { transpileWorker } = await import("./bench_setup.ts");
      // Beside the package, so that its node_modules (koffi) resolve.
      const js = transpileWorker(
        join(pkg, "..", ".bench_watch.mjs"),
        "bench_watch.ts",
      );
      const env = { RUNLOCK_BENCH_ENTRY: join(pkg, "esm", "mod.js") };
      workers.push({
        name: "node",
        command: [process.env.RUNLOCK_BENCH_NODE ?? "node", js],
        env,
      });
      if (!process.env.RUNLOCK_SKIP_BUN) {
        workers.push({
          name: "bun",
          command: [process.env.RUNLOCK_BENCH_BUN ?? "bun", js],
          env,
        });
      }
    }
    const results = await watchSection(workers, floor.binary);
    const goals = results.filter((r) => r.runtime !== "deno").map((r) => ({
      runtime: r.runtime,
      "crashed ≤ 10 ms (median)": r.crashed.median <= 10 ? "PASS" : "MISS",
      "over the C floor (median, ms)": r.floor
        ? Math.round((r.crashed.median - r.floor.median) * 1000) / 1000
        : null,
    }));
    process.stdout.write(JSON.stringify({ results, goals }, null, 2) + "\n");
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

// Run, not imported (bench/bench.ts imports watchSection): Node and Bun only
// ever run this file.
if (runtimeName !== "deno" || (import.meta as { main?: boolean }).main) {
  const [mode, ...args] = process.argv.slice(2);
  if (mode === "worker") await worker();
  else if (mode === "hold") await hold(args[0]);
  else if (mode === "hold-many") await holdMany(args[0], Number(args[1]));
  else if (mode === undefined) await main();
  else {
    process.stderr.write(`unknown mode ${mode}\n`);
    process.exit(2);
  }
}
