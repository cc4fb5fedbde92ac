// The scale section of `deno task bench`: costs that appear only
// with many files, many locks, many waiters or many cycles, each measured
// against a baseline of the same run, in processes of its own
// (bench_scale_worker.ts, bench_rss_worker.ts):
//
//   new name     a new lock name acquired and released in a directory of
//                100,000 files, against the same in an empty directory
//   many locks   one process taking 5,000 locks in one directory and holding
//                them (default options: loss detection on): the last 500
//                acquisitions against the first 500, beside the C floor
//                taking as many just before (what the disk makes of it)
//   waiters      50 processes waiting on a held lock, each with a 6 s
//                timeout: their CPU time in all, and how late each timeout
//                fired
//   memory       resident memory after 400,000 acquire/release cycles in one
//                process, against a bare control making the same calls
//
// Sizes shrink under RUNLOCK_BENCH_QUICK=1; RUNLOCK_BENCH_SCALE (a comma
// list of newname, many, waiters, rss) picks parts; RUNLOCK_BENCH_CYCLES
// sets the memory part's cycles. The new-name and many-locks parts stop
// early on a time budget (a slow build must not take the run hostage): a
// many-locks run that stopped short counts as a miss.
import { spawn, spawnSync } from "node:child_process";
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import process from "node:process";
import { createInterface } from "node:readline";

export interface ScaleContext {
  benchDir: string;
  /** Where the memory part's locks go: tmpfs when there is one (faster,
   * and memory does not depend on the file system). */
  memoryDir?: string;
  /** Runtimes to measure: deno, node, and bun when present. */
  runtimes: string[];
  /** The command that runs one of the bench/ scripts on a runtime. */
  command: (runtime: string, script: string) => string[];
  env: (cmd: string[]) => Record<string, string | undefined>;
  cwd: string;
  /** The C floor (bench/floor.c), when it compiled. */
  floor?: string;
  /** Takes a lock in this (the orchestrating) process; returns release. */
  hold: (path: string) => () => void;
  quick: boolean;
  log: (text: string) => void;
  note: (text: string) => void;
}

/** One runtime's figures for each part (absent where not measured). */
export interface ScaleSection {
  sizes: {
    files: number;
    locks: number;
    block: number;
    waiters: number;
    waitMs: number;
    cycles: number;
  };
  newName: Record<string, {
    emptyMedianUs: number;
    fullMedianUs: number;
    ratio: number;
    emptyP90Us: number;
    fullP90Us: number;
    /** The C floor's acquire+release, full directory against empty. */
    floorRatio?: number;
    samples: number;
  }>;
  manyLocks: Record<string, {
    blocksUs: number[];
    firstUs: number;
    lastUs: number;
    ratio: number;
    /** Locks held at the end: fewer than `locks` if the budget ran out. */
    reached: number;
    /** The C floor taking as many locks just before, in a directory of its
     * own on the same file system: what the disk makes of the same calls. */
    floorBlocksUs?: number[];
    floorRatio?: number;
  }>;
  waiters: Record<string, {
    cpuSeconds: number;
    cpuMsEach: { median: number; max: number };
    /** The control's CPU: as many processes asleep on a timer as long. */
    idleCpuSeconds: number;
    /**
     * The same waiters' CPU when each process has waited once before (for
     * 50 ms): what `cpuSeconds` has more is what a process's first wait
     * costs beyond its later ones.
     */
    warmCpuSeconds?: number;
    /**
     * Of `cpuSeconds`, the first 0.5 s of each wait (read from
     * /proc/<pid>/task/<tid>/schedstat, Linux): the per-process set-up
     * (FFI, inotify, the watch's first use), the first attempt, the
     * watches and the first looks. The rest is waiting.
     */
    startCpuSeconds?: number;
    idleStartCpuSeconds?: number;
    overshootMs: { median: number; p90: number; worst: number };
    outcomes: Record<string, number>;
  }>;
  rss: Record<string, {
    runlockMb: number;
    bareMb: number;
    ratio: number;
    runlock: { cycles: number; rssMb: number; heapMb: number }[];
    bare: { cycles: number; rssMb: number; heapMb: number }[];
    seconds: { runlock: number; bare: number };
  }>;
}

const median = (xs: number[]) => quantile(xs, 0.5);
function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const i = q * (s.length - 1);
  const lo = Math.floor(i);
  return s[lo] + (s[Math.min(s.length - 1, lo + 1)] - s[lo]) * (i - lo);
}
const r2 = (x: number) => Math.round(x * 100) / 100;
const r1 = (x: number) => Math.round(x * 10) / 10;

/** Runs a worker to its end; its stdout's last line, parsed. */
function runWorker(
  ctx: ScaleContext,
  cmd: string[],
  // deno-lint-ignore no-explicit-any
): Promise<any> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd[0], cmd.slice(1), {
      stdio: ["ignore", "pipe", "inherit"],
      env: ctx.env(cmd),
      cwd: ctx.cwd,
    });
    let out = "";
    child.stdout!.on("data", (d) => out += d);
    child.on("exit", (code, signal) => {
      const last = out.trim().split("\n").pop() ?? "";
      if (code === 0 && last) resolve(JSON.parse(last));
      else reject(new Error(`${cmd.join(" ")} exited with ${code ?? signal}`));
    });
  });
}

const json = (x: unknown) => JSON.stringify(x);

/** How far apart the waiters start (so that their timeouts fire apart). */
const STAGGER_MS = 20;
/** The first part of a wait whose CPU is reported apart (start-up). */
const START_MS = 500;

/** CPU ms of every thread of `pid` so far, or NaN (not Linux, gone). */
function threadsCpuMs(pid: number | undefined): number {
  try {
    let ns = 0;
    for (const tid of readdirSync(`/proc/${pid}/task`)) {
      ns += Number(
        readFileSync(`/proc/${pid}/task/${tid}/schedstat`, "utf8").split(
          " ",
        )[0],
      );
    }
    return ns / 1e6;
  } catch {
    return NaN;
  }
}

async function newName(ctx: ScaleContext, s: ScaleSection): Promise<void> {
  const full = join(ctx.benchDir, "scale-full");
  const empty = join(ctx.benchDir, "scale-empty");
  mkdirSync(full);
  mkdirSync(empty);
  ctx.log(`scale: ${s.sizes.files.toLocaleString("en")} files`);
  const none = new Uint8Array(0);
  for (let i = 0; i < s.sizes.files; i++) {
    writeFileSync(join(full, `run-${String(i).padStart(6, "0")}.log`), none);
  }
  // Written back before any timing: the journal's commit and the writeback
  // of 100,000 new inodes and their directory blocks fall within the next
  // 30 s or so, and an acquire that changes a directory block while it is
  // being committed waits for the copy (in a full run the C floor itself
  // measured 16x there, 1.5x in a run of this section alone). What is
  // measured is a big directory's cost to a new name, not the writeback of
  // the files just made for it.
  const synced = spawnSync("sync", ["-f", full]);
  if (synced.status !== 0) spawnSync("sync");
  // The kernel's part: the C floor's acquire+release (one name) in each
  // directory, best of alternating batches: what a big directory costs the
  // system calls themselves (ext4's hashed directories are not free).
  let floorRatio: number | undefined;
  if (ctx.floor) {
    const best = [Infinity, Infinity];
    for (let r = 0; r < 6; r++) {
      for (const [k, dir] of [empty, full].entries()) {
        const ns = Number(
          spawnSync(ctx.floor, ["serve"], {
            input: `acquire 200 ${join(dir, "c-floor.lock")}\n`,
            encoding: "utf8",
          }).stdout.trim(),
        );
        if (ns > 0) best[k] = Math.min(best[k], ns);
      }
    }
    if (Number.isFinite(best[0] + best[1])) floorRatio = r2(best[1] / best[0]);
  }
  const rounds = ctx.quick ? 3 : 6;
  const perRound = ctx.quick ? 10 : 15;
  for (const rt of ctx.runtimes) {
    ctx.log(`scale: new names, ${rt}`);
    const cmd = ctx.command(rt, "bench_scale_worker");
    const req = {
      dirs: [empty, full],
      perRound,
      rounds,
      warm: 3,
      budgetMs: ctx.quick ? 5_000 : 15_000,
    };
    const got = await runWorker(ctx, [...cmd, "newname", json(req)]);
    const e = median(got.empty), f = median(got.full);
    s.newName[rt] = {
      emptyMedianUs: r1(e),
      fullMedianUs: r1(f),
      ratio: r2(f / e),
      emptyP90Us: r1(quantile(got.empty, 0.9)),
      fullP90Us: r1(quantile(got.full, 0.9)),
      samples: got.full.length,
      floorRatio,
    };
  }
}

async function manyLocks(ctx: ScaleContext, s: ScaleSection): Promise<void> {
  for (const rt of ctx.runtimes) {
    ctx.log(`scale: ${s.sizes.locks.toLocaleString("en")} locks held, ${rt}`);
    const dir = join(ctx.benchDir, `scale-many-${rt}`);
    mkdirSync(dir);
    let floorBlocksUs: number[] | undefined;
    if (ctx.floor) {
      const floorDir = join(ctx.benchDir, `scale-many-c-${rt}`);
      mkdirSync(floorDir);
      const got = spawnSync(ctx.floor, [
        "many",
        floorDir,
        String(s.sizes.locks),
        String(s.sizes.block),
      ], { encoding: "utf8" });
      const blocks = got.stdout.trim().split(" ").map(Number);
      if (got.status === 0 && blocks.every((v) => v > 0)) {
        floorBlocksUs = blocks;
      }
    }
    const req = {
      dir,
      count: s.sizes.locks,
      block: s.sizes.block,
      budgetMs: ctx.quick ? 10_000 : 30_000,
    };
    const cmd = ctx.command(rt, "bench_scale_worker");
    const got = await runWorker(ctx, [...cmd, "many", json(req)]);
    const blocks: number[] = got.blocks;
    const first = blocks[0], last = blocks[blocks.length - 1];
    s.manyLocks[rt] = {
      blocksUs: blocks,
      firstUs: first,
      lastUs: last,
      ratio: r2(last / first),
      reached: got.held,
      floorBlocksUs,
      floorRatio: floorBlocksUs &&
        r2(floorBlocksUs[floorBlocksUs.length - 1] / floorBlocksUs[0]),
    };
    if (got.held < s.sizes.locks) {
      ctx.note(
        `scale: ${rt} reached ${got.held} of ${s.sizes.locks} locks within the ${
          req.budgetMs / 1000
        } s budget`,
      );
    }
  }
}

/**
 * `count` worker processes in "wait" mode: all started and warm before any
 * waits, then told to go 20 ms apart, so that their deadlines do not
 * coincide (50 processes woken in the same millisecond on a few cores
 * would measure the scheduler's queue, not how a timeout fires; all of
 * them wait together for all but the first second). Their answers.
 */
async function crowd(
  ctx: ScaleContext,
  rt: string,
  count: number,
  arg: string,
  // deno-lint-ignore no-explicit-any
): Promise<any[]> {
  const cmd = ctx.command(rt, "bench_scale_worker");
  const children = Array.from({ length: count }, () => {
    const child = spawn(cmd[0], [...cmd.slice(1), "wait", arg], {
      stdio: ["pipe", "pipe", "inherit"],
      env: ctx.env(cmd),
      cwd: ctx.cwd,
    });
    const lines = createInterface({ input: child.stdout! })[
      Symbol.asyncIterator
    ]();
    const next = async () => {
      const { value, done } = await lines.next();
      if (done) throw new Error(`a ${rt} waiter exited early`);
      return JSON.parse(value as string);
    };
    return { child, next };
  });
  for (const c of children) await c.next();
  // Each waiter's CPU in its first START_MS, read from outside (no wake-up
  // of the waiter), reported apart from the rest.
  const starts: Promise<number>[] = [];
  for (const c of children) {
    const before = threadsCpuMs(c.child.pid);
    c.child.stdin!.write("go\n");
    starts.push(
      new Promise((resolve) =>
        setTimeout(
          () => resolve(threadsCpuMs(c.child.pid) - before),
          START_MS,
        )
      ),
    );
    await new Promise((resolve) => setTimeout(resolve, STAGGER_MS));
  }
  const results = await Promise.all(children.map((c) => c.next()));
  const start = await Promise.all(starts);
  for (const c of children) c.child.stdin!.end();
  return results.map((r, i) => ({ ...r, startMs: start[i] }));
}

/** The waiters' CPU in their first START_MS, in all (s), if read. */
// deno-lint-ignore no-explicit-any
function sumStart(results: any[]): number | undefined {
  const ms = results.reduce((a, r) => a + (r.startMs as number), 0);
  return Number.isFinite(ms) ? r2(ms / 1000) : undefined;
}

async function waiters(ctx: ScaleContext, s: ScaleSection): Promise<void> {
  const { waiters: count, waitMs } = s.sizes;
  for (const rt of ctx.runtimes) {
    const dir = join(ctx.benchDir, `scale-wait-${rt}`);
    mkdirSync(dir);
    const path = join(dir, "run.lock");
    const release = ctx.hold(path);
    ctx.log(
      `scale: ${count} waiters × ${waitMs} ms, ${rt}, later waits and the control`,
    );
    try {
      const results = await crowd(
        ctx,
        rt,
        count,
        json({ path, timeout: waitMs }),
      );
      // As many waiters whose process has waited once before.
      const warm = await crowd(
        ctx,
        rt,
        count,
        json({ path, timeout: waitMs, warm: true }),
      );
      // The control: as many processes of the runtime, warmed the same way,
      // asleep on one timer for as long: the runtime's own idle cost.
      const idle = await crowd(
        ctx,
        rt,
        count,
        json({ path, timeout: waitMs, idle: true }),
      );
      const cpu = results.map((r) => r.cpuMs as number);
      const over = results.map((r) => r.overshootMs as number);
      const outcomes: Record<string, number> = {};
      for (const r of results) {
        outcomes[r.outcome] = (outcomes[r.outcome] ?? 0) + 1;
      }
      s.waiters[rt] = {
        cpuSeconds: r2(cpu.reduce((a, b) => a + b, 0) / 1000),
        cpuMsEach: { median: r1(median(cpu)), max: r1(Math.max(...cpu)) },
        idleCpuSeconds: r2(
          idle.reduce((a, r) => a + (r.cpuMs as number), 0) / 1000,
        ),
        warmCpuSeconds: r2(
          warm.reduce((a, r) => a + (r.cpuMs as number), 0) / 1000,
        ),
        startCpuSeconds: sumStart(results),
        idleStartCpuSeconds: sumStart(idle),
        overshootMs: {
          median: r1(median(over)),
          p90: r1(quantile(over, 0.9)),
          worst: r1(Math.max(...over)),
        },
        outcomes,
      };
      if (!outcomes.HeldError || outcomes.HeldError !== count) {
        ctx.note(
          `scale: ${rt} waiters ended ${
            json(outcomes)
          }, not ${count} × HeldError`,
        );
      }
    } finally {
      release();
    }
  }
}

async function memory(ctx: ScaleContext, s: ScaleSection): Promise<void> {
  const rts = ctx.runtimes.filter((rt) => rt === "deno" || rt === "node");
  ctx.log(
    `scale: ${s.sizes.cycles.toLocaleString("en")} cycles, runlock and bare, ${
      rts.join(", ")
    } (all at once: memory does not mind the load)`,
  );
  const runs = rts.flatMap((rt) =>
    [false, true].map(async (bare) => {
      const dir = join(
        ctx.memoryDir ?? ctx.benchDir,
        `scale-rss-${rt}-${bare ? "bare" : "lib"}`,
      );
      mkdirSync(dir);
      const req = { dir, cycles: s.sizes.cycles, bare, turnEvery: 1000 };
      const cmd = ctx.command(rt, "bench_rss_worker");
      return { rt, bare, got: await runWorker(ctx, [...cmd, json(req)]) };
    })
  );
  const done = await Promise.all(runs);
  for (const rt of rts) {
    const lib = done.find((d) => d.rt === rt && !d.bare)!.got;
    const bare = done.find((d) => d.rt === rt && d.bare)!.got;
    const end = (g: typeof lib) => g.points[g.points.length - 1].rssMb;
    s.rss[rt] = {
      runlockMb: end(lib),
      bareMb: end(bare),
      ratio: r2(end(lib) / end(bare)),
      runlock: lib.points,
      bare: bare.points,
      seconds: { runlock: lib.seconds, bare: bare.seconds },
    };
  }
}

/** Runs the scale section's parts, in order. */
export async function scaleSection(ctx: ScaleContext): Promise<ScaleSection> {
  const parts = new Set(
    (process.env.RUNLOCK_BENCH_SCALE ?? "newname,many,waiters,rss").split(","),
  );
  const s: ScaleSection = {
    sizes: ctx.quick
      ? {
        files: 20_000,
        locks: 1_000,
        block: 100,
        waiters: 10,
        waitMs: 2_000,
        cycles: Number(process.env.RUNLOCK_BENCH_CYCLES ?? 50_000),
      }
      : {
        files: 100_000,
        locks: 5_000,
        block: 500,
        waiters: 50,
        waitMs: 6_000,
        cycles: Number(process.env.RUNLOCK_BENCH_CYCLES ?? 400_000),
      },
    newName: {},
    manyLocks: {},
    waiters: {},
    rss: {},
  };
  if (parts.has("newname")) await newName(ctx, s);
  if (parts.has("many")) await manyLocks(ctx, s);
  if (parts.has("waiters")) await waiters(ctx, s);
  if (parts.has("rss")) await memory(ctx, s);
  return s;
}

/** The section as text for the benchmark's report. */
export function scaleTables(s: ScaleSection): string {
  const out: string[] = [];
  const z = s.sizes;
  const rows = (head: string[], body: string[][]) => {
    const w = head.map((h, i) =>
      Math.max(h.length, ...body.map((r) => r[i].length))
    );
    const line = (c: string[]) =>
      c.map((x, i) => (i === 0 ? x.padEnd(w[i]) : x.padStart(w[i]))).join("  ");
    out.push(
      line(head),
      w.map((n) => "-".repeat(n)).join("  "),
      ...body.map(line),
    );
  };
  if (Object.keys(s.newName).length) {
    out.push(
      "",
      `## a new lock name, acquireSync+releaseSync: empty directory vs ${
        z.files.toLocaleString("en")
      } files`,
    );
    rows(
      [
        "runtime",
        "empty µs",
        "full µs",
        "full ÷ empty",
        "p90 empty",
        "p90 full",
        "names each",
        "C floor full ÷ empty",
      ],
      Object.entries(s.newName).map(([rt, v]) => [
        rt,
        String(v.emptyMedianUs),
        String(v.fullMedianUs),
        `${v.ratio}×`,
        String(v.emptyP90Us),
        String(v.fullP90Us),
        String(v.samples),
        v.floorRatio === undefined ? "" : `${v.floorRatio}×`,
      ]),
    );
    out.push(
      "(medians over new names in each directory, the two directories alternating by round; fewer rounds when a round is slow)",
    );
  }
  if (Object.keys(s.manyLocks).length) {
    out.push(
      "",
      `## one process taking ${
        z.locks.toLocaleString("en")
      } locks in one directory and holding them (default options)`,
    );
    rows(
      [
        "runtime",
        `first ${z.block} µs`,
        `last ${z.block} µs`,
        "last ÷ first",
        `µs per acquisition, by block of ${z.block}`,
        "C floor, last ÷ first",
      ],
      Object.entries(s.manyLocks).map(([rt, v]) => [
        rt,
        String(v.firstUs),
        String(v.lastUs),
        `${v.ratio}×`,
        v.blocksUs.join(" "),
        v.floorRatio === undefined ? "" : `${v.floorRatio}×`,
      ]),
    );
    out.push(
      "(each acquisition is followed by one event-loop turn, counted: work that the held locks cause lands there)",
    );
  }
  if (Object.keys(s.waiters).length) {
    out.push(
      "",
      `## ${z.waiters} processes waiting on a held lock, each with a ${
        z.waitMs / 1000
      } s timeout`,
    );
    rows(
      [
        "runtime",
        "CPU s, all",
        "later wait CPU s",
        "control CPU s",
        `of which first ${START_MS / 1000} s (control)`,
        "CPU ms each (median/max)",
        "overshoot median ms",
        "p90 ms",
        "worst ms",
      ],
      Object.entries(s.waiters).map(([rt, v]) => [
        rt,
        String(v.cpuSeconds),
        v.warmCpuSeconds === undefined ? "" : String(v.warmCpuSeconds),
        String(v.idleCpuSeconds),
        v.startCpuSeconds === undefined
          ? ""
          : `${v.startCpuSeconds} (${v.idleStartCpuSeconds})`,
        `${v.cpuMsEach.median}/${v.cpuMsEach.max}`,
        String(v.overshootMs.median),
        String(v.overshootMs.p90),
        String(v.overshootMs.worst),
      ]),
    );
    out.push(
      "(each waiter first makes one acquire, refused, to warm up, then waits when told; they start 20 ms apart so that their timeouts fire apart. Later wait: as many processes that each waited 50 ms once before. Control: as many processes, warmed the same way, asleep on a timer as long. CPU: getrusage of each waiter from the moment it starts waiting to its HeldError, and of that, its first 0.5 s (its threads' schedstat, read from outside: the process's one-time set-up, the first attempt, the watches, the first looks); overshoot: how long after the timeout the HeldError came)",
    );
  }
  if (Object.keys(s.rss).length) {
    out.push(
      "",
      `## resident memory after ${
        z.cycles.toLocaleString("en")
      } acquire/release cycles in one process`,
    );
    rows(
      [
        "runtime",
        "runlock MB",
        "bare MB",
        "runlock ÷ bare",
        "runlock RSS (heap) at checkpoints, MB",
      ],
      Object.entries(s.rss).map(([rt, v]) => [
        rt,
        String(v.runlockMb),
        String(v.bareMb),
        `${v.ratio}×`,
        v.runlock.map((p) => `${p.rssMb}(${p.heapMb})`).join(" "),
      ]),
    );
    out.push(
      "(acquireSync+releaseSync, a macrotask turn every 1,000 cycles, on tmpfs when there is one; bare: the same system calls without runlock, flock through koffi on Node, with the realpath on Deno)",
    );
  }
  return out.join("\n");
}
